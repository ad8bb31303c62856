package pagedkv

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/stepbuf"
)

// stepBufTwins drives two managers with the same operations: bound has
// step buffers bound, twin returns plans over its own buffers. After every
// reserve the bound memory must be byte for byte what a slow packer
// (refPack, written from the layout's rows alone) makes of the twin's plan,
// and the bound plan must equal the twin's.
type stepBufTwins struct {
	t                             testing.TB
	rng                           *rand.Rand
	bound, twin                   KVManager
	mem, ref                      []byte
	lay                           *StepBufferLayout
	live                          []RequestID
	next                          RequestID
	prompts                       [][]int32
	steps, cascades, copies, attn int
	step                          int32 // the pool header's step counter
}

func stepBufCaps() StepBufferCapacities {
	return StepBufferCapacities{MaxRequests: 12, MaxTokens: 12 * 24, MaxPages: 12 * 20, MaxCascadeLevels: stepbuf.MaxLevels}
}

// alignedBytes returns n zero bytes whose address is a multiple of
// stepbuf.Align.
func alignedBytes(n int) []byte {
	b := make([]byte, n+stepbuf.Align)
	off := int(uintptr(unsafe.Pointer(&b[0])) % stepbuf.Align)
	if off != 0 {
		off = stepbuf.Align - off
	}
	return b[off : off+n : off+n]
}

func newStepBufTwins(t testing.TB, seed uint64, groups []LayerGroup) *stepBufTwins {
	// Padded block tables on: every request's pages fit 24 columns.
	cfg := Config{NumPages: 96, PageSize: 4, HashSeed: 7, CascadeMinSavedPages: 1, BlockTablesStride: 24}
	x := &stepBufTwins{t: t, rng: rand.New(rand.NewPCG(seed, 40))}
	var bind func(mem []byte) (*StepBufferLayout, error)
	if groups == nil {
		b, tw := mustNew(t, cfg), mustNew(t, cfg)
		x.bound, x.twin, bind = b, tw, func(mem []byte) (*StepBufferLayout, error) { return b.BindStepBuffers(mem, stepBufCaps()) }
	} else {
		hc := HybridConfig{Config: cfg, Groups: groups}
		b, err := NewHybrid(hc)
		require.NoError(t, err)
		tw, err := NewHybrid(hc)
		require.NoError(t, err)
		x.bound, x.twin, bind = b, tw, func(mem []byte) (*StepBufferLayout, error) { return b.BindStepBuffers(mem, stepBufCaps()) }
	}
	lay, err := StepBufferLayoutFor(stepBufCaps(), layerGroupsOf(x.bound), cfg.BlockTablesStride)
	require.NoError(t, err)
	x.mem, x.ref = alignedBytes(lay.Size), make([]byte, lay.Size)
	for i := range x.mem {
		x.mem[i] = 0xee // Bind clears it
	}
	x.lay, err = bind(x.mem)
	require.NoError(t, err)
	require.Equal(t, lay.Rows, x.lay.Rows)
	binary.LittleEndian.PutUint32(x.ref[4*stepbuf.PoolNumGroups:], uint32(len(lay.Groups)))
	for p := range 4 {
		x.prompts = append(x.prompts, seqTokens(1000*p, 9+4*p))
	}
	return x
}

func layerGroupsOf(m KVManager) []LayerGroup {
	gs := make([]LayerGroup, m.NumGroups())
	for g := range gs {
		gs[g] = m.Group(g)
	}
	return gs
}

// same fails unless both managers answered alike.
func (x *stepBufTwins) same(what string, e1, e2 error) bool {
	x.t.Helper()
	if (e1 == nil) != (e2 == nil) || e1 != nil && e1.Error() != e2.Error() {
		x.t.Fatalf("%s: bound %v, twin %v", what, e1, e2)
	}
	return e1 == nil
}

func (x *stepBufTwins) op() {
	r := x.rng
	switch k := r.IntN(20); {
	case k < 3 && len(x.live) < 14:
		id := x.next
		x.next++
		prompt := append(slices.Clone(x.prompts[r.IntN(len(x.prompts))]), seqTokens(int(id)*31, r.IntN(6))...)
		req := Request{Prompt: prompt, CapacityTokens: 80}
		_, e1 := x.bound.Add(id, req)
		_, e2 := x.twin.Add(id, req)
		if x.same("add", e1, e2) {
			x.live = append(x.live, id)
		}
	case k < 4 && len(x.live) > 0 && len(x.live) < 14:
		p, id := x.live[r.IntN(len(x.live))], x.next
		x.next++
		if x.same("fork", x.bound.Fork(p, id), x.twin.Fork(p, id)) {
			x.live = append(x.live, id)
		}
	case k < 5 && len(x.live) > 0:
		i := r.IntN(len(x.live))
		id := x.live[i]
		if x.same("release", x.bound.Release(id), x.twin.Release(id)) {
			x.live = slices.Delete(x.live, i, i+1)
		}
	case k < 6 && len(x.live) > 0:
		id := x.live[r.IntN(len(x.live))]
		if x.bound.Running(id) {
			x.same("preempt", x.bound.Preempt(id), x.twin.Preempt(id))
		} else {
			_, e1 := x.bound.Resume(id)
			_, e2 := x.twin.Resume(id)
			x.same("resume", e1, e2)
		}
	default:
		x.reserveStep()
	}
}

func (x *stepBufTwins) reserveStep() {
	r := x.rng
	var ids []RequestID
	var nt []int32
	var drafts [][]int32
	spec := r.IntN(4) == 0
	for _, id := range x.live {
		if !x.bound.Running(id) || r.IntN(3) == 0 || len(ids) == 12 {
			continue
		}
		left := len(x.bound.Tokens(id)) - x.bound.Computed(id)
		n := min(left, 1+r.IntN(8))
		ids, nt = append(ids, id), append(nt, int32(n))
		var d []int32
		if spec && n == left && r.IntN(2) == 0 {
			d = seqTokens(int(id)*7+x.steps, 1+r.IntN(3))
		}
		drafts = append(drafts, d)
	}
	if !spec {
		drafts = nil
	}
	p1, e1 := x.bound.ReserveStep(ids, nt, drafts)
	p2, e2 := x.twin.ReserveStep(ids, nt, drafts)
	if !x.same("reserve", e1, e2) {
		return
	}
	x.steps++
	x.check(p1, p2)
	if r.IntN(10) == 0 {
		x.same("abort", x.bound.Abort(), x.twin.Abort())
		return
	}
	sampled := make([]int32, len(ids))
	for b, id := range ids {
		sampled[b] = NoToken
		if x.bound.Computed(id)+int(nt[b]) == len(x.bound.Tokens(id)) && r.IntN(4) > 0 {
			sampled[b] = int32(x.steps % 5000)
		}
	}
	if spec {
		acc := make([]int32, len(ids))
		for b := range ids {
			acc[b] = int32(r.IntN(len(drafts[b]) + 1))
			if len(drafts[b]) > 0 && sampled[b] == NoToken {
				sampled[b] = 1
			}
		}
		x.same("commit_spec", x.bound.CommitSpec(acc, sampled), x.twin.CommitSpec(acc, sampled))
		return
	}
	x.same("commit", x.bound.Commit(sampled), x.twin.Commit(sampled))
}

// check compares the bound plan and memory with the twin's plan.
func (x *stepBufTwins) check(bp, tp *HybridPlan) {
	t := x.t
	t.Helper()
	if !slices.Equal(tp.Requests, bp.Requests) || !slices.Equal(tp.Copies, bp.Copies) {
		t.Fatalf("step %d: requests %v copies %v, twin %v %v", x.steps, bp.Requests, bp.Copies, tp.Requests, tp.Copies)
	}
	x.step++
	x.refPack(tp)
	if !bytes.Equal(x.mem, x.ref) {
		for _, row := range x.lay.Rows {
			end := row.Offset + 4*row.Cap
			if !bytes.Equal(x.mem[row.Offset:end], x.ref[row.Offset:end]) {
				t.Fatalf("step %d: row %v of group %d (level %d, offset %d) differs:\nbound %v\nwant  %v", x.steps, row.Array,
					row.Group, row.Level, row.Offset, int32sOf(x.mem[row.Offset:end]), int32sOf(x.ref[row.Offset:end]))
			}
		}
		t.Fatalf("step %d: the bound memory differs outside every row", x.steps)
	}
	x.copies += len(tp.Copies)
	for g, want := range tp.Groups {
		got := bp.Groups[g]
		for _, pair := range [][2][]int32{{want.QOIndptr, got.QOIndptr}, {want.BatchIndices, got.BatchIndices},
			{want.Positions, got.Positions}, {want.TokenIDs, got.TokenIDs}, {want.TokenPositions, got.TokenPositions},
			{want.Drafts, got.Drafts}, {want.KVIndptr, got.KVIndptr}, {want.KVPageIndices, got.KVPageIndices},
			{want.KVLastPageLen, got.KVLastPageLen}, {want.SeqLens, got.SeqLens}, {want.AttnQOIndptr, got.AttnQOIndptr},
			{want.AttnKVIndptr, got.AttnKVIndptr}, {want.AttnKVPageIndices, got.AttnKVPageIndices},
			{want.AttnKVLastPageLen, got.AttnKVLastPageLen}, {want.AttnRequests, got.AttnRequests},
			{want.BlockTables, got.BlockTables}} {
			if !slices.Equal(pair[0], pair[1]) || len(pair[1]) > 0 && !x.inMem(pair[1]) {
				t.Fatalf("step %d, group %d: twin %v, bound %v (or outside the bound memory)", x.steps, g, pair[0], pair[1])
			}
		}
		if len(want.BlockTables) != len(want.SeqLens)*want.BlockTablesStride || got.BlockTablesStride != want.BlockTablesStride {
			t.Fatalf("step %d, group %d: %d block_tables entries of stride %d, twin %d of stride %d for %d requests",
				x.steps, g, len(got.BlockTables), got.BlockTablesStride, len(want.BlockTables), want.BlockTablesStride, len(want.SeqLens))
		}
		if want.WindowLeft != got.WindowLeft || !slices.Equal(want.CascadeWindowLeft, got.CascadeWindowLeft) ||
			(want.Cascade == nil) != (got.Cascade == nil) {
			t.Fatalf("step %d, group %d: window_left %d %v, twin %d %v, cascade %v, twin %v", x.steps, g, got.WindowLeft,
				got.CascadeWindowLeft, want.WindowLeft, want.CascadeWindowLeft, got.Cascade != nil, want.Cascade != nil)
		}
		if want.Cascade != nil {
			x.cascades++
			for l, lv := range want.Cascade.Levels {
				gl := got.Cascade.Levels[l]
				if !slices.Equal(lv.QOIndptr, gl.QOIndptr) || !slices.Equal(lv.KVIndptr, gl.KVIndptr) ||
					!slices.Equal(lv.KVPageIndices, gl.KVPageIndices) || !slices.Equal(lv.KVLastPageLen, gl.KVLastPageLen) || !x.inMem(gl.KVIndptr) {
					t.Fatalf("step %d, group %d, level %d: %+v, twin %+v", x.steps, g, l, gl, lv)
				}
			}
		}
		x.attn += len(want.AttnRequests)
	}
}

func (x *stepBufTwins) inMem(s []int32) bool {
	p, lo := uintptr(unsafe.Pointer(&s[0])), uintptr(unsafe.Pointer(&x.mem[0]))
	return p >= lo && p < lo+uintptr(len(x.mem))
}

func int32sOf(b []byte) []int32 {
	out := make([]int32, len(b)/4)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// refPack writes plan p into x.ref the slow way: each array at its row's
// offset, element by element, little-endian (the only byte order this
// library runs on).
func (x *stepBufTwins) refPack(p *HybridPlan) {
	put := func(a stepbuf.Array, g, level int, vals ...int32) {
		i := x.lay.Find(a, g, level)
		if i < 0 || len(vals) > x.lay.Rows[i].Cap {
			x.t.Fatalf("%d values of %v of group %d level %d: no row, or one too small (row %d)", len(vals), a, g, level, i)
		}
		row := x.lay.Rows[i]
		for k, v := range vals {
			binary.LittleEndian.PutUint32(x.ref[row.Offset+4*k:], uint32(v))
		}
	}
	g0 := p.Groups[0]
	put(stepbuf.PoolHeader, -1, -1, int32(len(p.Requests)), int32(len(g0.TokenIDs)), int32(len(p.Copies)), int32(len(p.Groups)), x.step)
	var copies []int32
	for _, c := range p.Copies {
		copies = append(copies, int32(c.Src), int32(c.Dst), int32(c.Entries))
	}
	put(stepbuf.Copies, -1, -1, copies...)
	for g, gp := range p.Groups {
		levels := 0
		if gp.Cascade != nil {
			levels = len(gp.Cascade.Levels)
		}
		put(stepbuf.GroupHeader, g, -1, int32(gp.KVIndptr[len(gp.KVIndptr)-1]), int32(gp.WindowLeft), int32(levels),
			int32(len(gp.AttnRequests)), int32(len(gp.AttnKVPageIndices)))
		put(stepbuf.QOIndptr, g, -1, gp.QOIndptr...)
		put(stepbuf.BatchIndices, g, -1, gp.BatchIndices...)
		put(stepbuf.Positions, g, -1, gp.Positions...)
		put(stepbuf.TokenIDs, g, -1, gp.TokenIDs...)
		put(stepbuf.TokenPositions, g, -1, gp.TokenPositions...)
		put(stepbuf.Drafts, g, -1, gp.Drafts...)
		put(stepbuf.KVIndptr, g, -1, gp.KVIndptr...)
		put(stepbuf.KVPageIndices, g, -1, gp.KVPageIndices...)
		put(stepbuf.KVLastPageLen, g, -1, gp.KVLastPageLen...)
		put(stepbuf.SeqLens, g, -1, gp.SeqLens...)
		// block_tables [B, stride]: row b is request b's pages, then
		// BlockTablesPad.
		var bt []int32
		for b := range gp.SeqLens {
			pages := gp.KVPageIndices[gp.KVIndptr[b]:gp.KVIndptr[b+1]]
			bt = append(bt, pages...)
			for range gp.BlockTablesStride - len(pages) {
				bt = append(bt, BlockTablesPad)
			}
		}
		put(stepbuf.BlockTables, g, -1, bt...)
		if gp.AttnQOIndptr != nil {
			put(stepbuf.AttnQOIndptr, g, -1, gp.AttnQOIndptr...)
			put(stepbuf.AttnKVIndptr, g, -1, gp.AttnKVIndptr...)
			put(stepbuf.AttnKVPageIndices, g, -1, gp.AttnKVPageIndices...)
			put(stepbuf.AttnKVLastPageLen, g, -1, gp.AttnKVLastPageLen...)
			put(stepbuf.AttnRequests, g, -1, gp.AttnRequests...)
		}
		if c := gp.Cascade; c != nil {
			put(stepbuf.QueryRows, g, -1, c.QueryRows()...)
			var wl, sizes []int32
			for l, lv := range c.Levels {
				wl, sizes = append(wl, int32(gp.CascadeWindowLeft[l])), append(sizes, int32(len(lv.QOIndptr)-1))
				put(stepbuf.LevelQOIndptr, g, l, lv.QOIndptr...)
				put(stepbuf.LevelKVIndptr, g, l, lv.KVIndptr...)
				put(stepbuf.LevelKVPageIndices, g, l, lv.KVPageIndices...)
				put(stepbuf.LevelKVLastPageLen, g, l, lv.KVLastPageLen...)
			}
			put(stepbuf.CascadeWindowLeft, g, -1, wl...)
			put(stepbuf.LevelBatchSize, g, -1, sizes...)
		}
	}
}

// stepBufGroups are the hybrid groups of the tests: every kind with rows
// of its own (a chunked group has the attention rows).
func stepBufGroups() []LayerGroup {
	return []LayerGroup{{Kind: FullAttention, NumLayers: 2}, {Kind: SlidingAttention, WindowTokens: 10, NumLayers: 2},
		{Kind: ChunkedAttention, ChunkTokens: 8, NumLayers: 2}}
}

// TestStepBuffersEqualPlanViews runs 10^4 randomized steps of a dense Manager and of a HybridManager with bound step
// buffers (a hundredth under -race), each against a twin without: prefix hits, forks with
// copy-on-write, preemption, speculative steps, aborts and cascades.
func TestStepBuffersEqualPlanViews(t *testing.T) {
	steps := 10000
	if raceEnabled {
		// -race turns on the invariant checks after every call, about 7 ms
		// a step here: a hundredth keeps the test under 2 s.
		steps /= 100
	}
	for name, groups := range map[string][]LayerGroup{"dense": nil, "hybrid": stepBufGroups()} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			x := newStepBufTwins(t, 1, groups)
			for ops := 0; x.steps < steps; ops++ {
				x.op()
				if ops%500 == 0 {
					require.NoError(t, x.bound.Audit())
				}
			}
			require.NoError(t, x.bound.Audit())
			if !raceEnabled { // the full count covers every kind of row
				require.Positive(t, x.cascades)
				require.Positive(t, x.copies)
				if groups != nil {
					require.Positive(t, x.attn)
				}
			}
			t.Logf("%d steps: %d cascade plans, %d copies, %d chunked attention entries", x.steps, x.cascades, x.copies, x.attn)
		})
	}
}

// TestStepBuffersAllocateNothing pins the hot path with bound step
// buffers: a churning decode server's step allocates nothing.
func TestStepBuffersAllocateNothing(t *testing.T) {
	promptLen, maxLen, runs := 40, 104, 40
	if raceEnabled {
		promptLen, maxLen, runs = 24, 64, 8
	}
	c := newChurn(t, 64, promptLen, maxLen)
	// The churn has padded block tables on: the layout has their row.
	lay, err := c.m.StepBufferLayoutFor(StepBufferCapacities{MaxRequests: 64, MaxTokens: 64 * promptLen, MaxPages: 64 * (maxLen/16 + 1), MaxCascadeLevels: 8})
	require.NoError(t, err)
	require.Equal(t, 64*c.m.core.groups[0].cfg.BlockTablesStride, lay.Rows[lay.Find(stepbuf.BlockTables, 0, -1)].Cap)
	mem := alignedBytes(lay.Size)
	_, err = c.m.BindStepBuffers(mem, lay.Caps)
	require.NoError(t, err)
	for range 3 * maxLen {
		c.step(t)
	}
	require.Zero(t, testing.AllocsPerRun(runs, func() { c.step(t) }), "allocations per step")
	require.Equal(t, int32(len(c.ids)), int32(binary.LittleEndian.Uint32(mem[4*stepbuf.PoolBatchSize:])))
	p := c.m.core.bound.plan.Groups[0].BlockTables // the plan Reserve returned
	row := lay.Rows[lay.Find(stepbuf.BlockTables, 0, -1)]
	require.Len(t, p, len(c.ids)*c.m.core.groups[0].cfg.BlockTablesStride)
	require.Equal(t, unsafe.Pointer(&mem[row.Offset]), unsafe.Pointer(&p[0]), "the plan's block_tables alias the bound row")
	require.NoError(t, c.m.Audit())
}

// TestStepBuffersRefuseOverCapacity checks each capacity: a step over it
// fails with ErrStepCapacity naming the capacity and the need, and
// changes nothing (the same step fits after a rebind with more room).
func TestStepBuffersRefuseOverCapacity(t *testing.T) {
	for _, tc := range []struct {
		name string
		caps StepBufferCapacities
		msg  string
	}{
		{"requests", StepBufferCapacities{MaxRequests: 2, MaxTokens: 100, MaxPages: 100}, "the step has 3 requests, MaxRequests = 2"},
		{"tokens", StepBufferCapacities{MaxRequests: 3, MaxTokens: 20, MaxPages: 100}, "the step appends 21 tokens (drafts included), MaxTokens = 20"},
		{"pages", StepBufferCapacities{MaxRequests: 3, MaxTokens: 100, MaxPages: 5}, "the step's page table holds 6 pages, MaxPages = 5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mustNew(t, Config{NumPages: 32, PageSize: 4})
			ids := []RequestID{1, 2, 3}
			for _, id := range ids {
				_, err := m.Add(id, Request{Prompt: seqTokens(int(id)*100, 7)})
				require.NoError(t, err)
			}
			_, err := m.BindStepBuffers(alignedBytes(mustLayout(t, tc.caps).Size), tc.caps)
			require.NoError(t, err)
			before := m.Stats()
			_, err = m.Reserve(ids, []int32{7, 7, 7})
			require.ErrorIs(t, err, ErrStepCapacity)
			require.ErrorIs(t, err, ErrBadArgument)
			require.ErrorContains(t, err, tc.msg)
			require.False(t, m.Pending())
			require.Equal(t, before, m.Stats())
			require.NoError(t, m.Audit())
			big := StepBufferCapacities{MaxRequests: 3, MaxTokens: 21, MaxPages: 6}
			_, err = m.BindStepBuffers(alignedBytes(mustLayout(t, big).Size), big)
			require.NoError(t, err)
			p, err := m.Reserve(ids, []int32{7, 7, 7})
			require.NoError(t, err)
			require.Len(t, p.KVPageIndices, 6)
		})
	}
}

func mustLayout(t testing.TB, caps StepBufferCapacities) *StepBufferLayout {
	l, err := StepBufferLayoutFor(caps, []LayerGroup{{Kind: FullAttention, NumLayers: 1}}, 0)
	require.NoError(t, err)
	return l
}

// TestStepBuffersHybridPagesNameGroup: a hybrid step over MaxPages names
// the group whose page table is too big.
func TestStepBuffersHybridPagesNameGroup(t *testing.T) {
	h, err := NewHybrid(HybridConfig{Config: Config{NumPages: 64, PageSize: 4}, Groups: stepBufGroups()})
	require.NoError(t, err)
	_, err = h.Add(1, Request{Prompt: seqTokens(0, 23)})
	require.NoError(t, err)
	caps := StepBufferCapacities{MaxRequests: 1, MaxTokens: 23, MaxPages: 5}
	lay, err := StepBufferLayoutFor(caps, stepBufGroups(), 0)
	require.NoError(t, err)
	_, err = h.BindStepBuffers(alignedBytes(lay.Size), caps)
	require.NoError(t, err)
	_, err = h.Reserve([]RequestID{1}, []int32{23})
	require.ErrorIs(t, err, ErrStepCapacity)
	require.ErrorContains(t, err, "group 0 (full) holds 6 pages, MaxPages = 5")
	h.UnbindStepBuffers()
	require.Nil(t, h.StepBufferLayout())
	p, err := h.Reserve([]RequestID{1}, []int32{23})
	require.NoError(t, err)
	require.Len(t, p.Groups[0].KVPageIndices, 6)
}

// TestStepBuffersCascadeDeeperThanCapacityRunsFlat: a cascade with more
// levels than MaxCascadeLevels is planned flat (the step fits; only the
// cascade does not), and MaxCascadeLevels 0 plans every step flat.
func TestStepBuffersCascadeDeeperThanCapacityRunsFlat(t *testing.T) {
	for _, levels := range []int{0, 1, 2} {
		t.Run(fmt.Sprint(levels), func(t *testing.T) {
			cfg := Config{NumPages: 64, PageSize: 4, CascadeMinSavedPages: 1}
			m, twin := mustNew(t, cfg), mustNew(t, cfg)
			caps := StepBufferCapacities{MaxRequests: 4, MaxTokens: 64, MaxPages: 64, MaxCascadeLevels: levels}
			_, err := m.BindStepBuffers(alignedBytes(mustLayout(t, caps).Size), caps)
			require.NoError(t, err)
			var got, want *Plan
			for _, mm := range []*Manager{m, twin} {
				prefix := seqTokens(0, 16)
				for id := range RequestID(3) {
					_, err := mm.Add(id, Request{Prompt: append(slices.Clone(prefix), seqTokens(100+int(id)*10, 5)...)})
					require.NoError(t, err)
					n := int32(len(mm.Tokens(id)) - mm.Computed(id))
					_, err = mm.Reserve([]RequestID{id}, []int32{n})
					require.NoError(t, err)
					require.NoError(t, mm.Commit([]int32{1}))
				}
				p, err := mm.Reserve([]RequestID{0, 1, 2}, []int32{1, 1, 1})
				require.NoError(t, err)
				if mm == m {
					got = p
				} else {
					want = p
				}
			}
			require.NotNil(t, want.Cascade)
			if len(want.Cascade.Levels) <= levels {
				require.Equal(t, want.Cascade.Levels, got.Cascade.Levels)
			} else {
				require.Nil(t, got.Cascade)
				require.Nil(t, got.CascadeWindowLeft)
			}
			require.Equal(t, want.KVPageIndices, got.KVPageIndices)
		})
	}
}

// TestBindStepBuffersRefusesBadMemory: too small, misaligned and bad
// capacities are refused naming the values, and the binding before stays.
func TestBindStepBuffersRefusesBadMemory(t *testing.T) {
	m := mustNew(t, Config{NumPages: 16, PageSize: 4})
	caps := StepBufferCapacities{MaxRequests: 2, MaxTokens: 8, MaxPages: 8, MaxCascadeLevels: 1}
	lay := mustLayout(t, caps)
	good := alignedBytes(lay.Size)
	_, err := m.BindStepBuffers(good, caps)
	require.NoError(t, err)
	for _, tc := range []struct {
		mem  []byte
		caps StepBufferCapacities
		msg  string
	}{
		{alignedBytes(lay.Size - 1), caps, fmt.Sprintf("%d bytes, the layout needs %d", lay.Size-1, lay.Size)},
		{alignedBytes(lay.Size + 4)[4:], caps, "is not a multiple of 16"},
		{good, StepBufferCapacities{MaxRequests: 0, MaxTokens: 8, MaxPages: 8}, "MaxRequests = 0, want 1.."},
		{good, StepBufferCapacities{MaxRequests: 1, MaxTokens: 8, MaxPages: 8, MaxCascadeLevels: 65}, "MaxCascadeLevels = 65, want 0..64"},
		{good, StepBufferCapacities{MaxRequests: 1, MaxTokens: -1, MaxPages: 8}, "MaxTokens = -1"},
	} {
		_, err := m.BindStepBuffers(tc.mem, tc.caps)
		require.ErrorIs(t, err, ErrBadArgument)
		require.ErrorContains(t, err, tc.msg)
		require.Equal(t, lay.Rows, m.StepBufferLayout().Rows, "a refused bind keeps the binding")
	}
}

// BenchmarkStepBuffers compares a decode step of 256 running requests
// (Reserve of one token each, Commit) with plan views (the Manager's own
// buffers) and with bound step buffers, in the same run: the difference
// is the copy of the plan into the bound memory.
func BenchmarkStepBuffers(b *testing.B) {
	const nreq, promptLen, steps = 256, 64, 4096
	for _, bound := range []bool{false, true} {
		name := "views"
		if bound {
			name = "bound"
		}
		b.Run(name, func(b *testing.B) {
			ps := 16
			m := mustNew(b, Config{NumPages: nreq * ((promptLen+steps)/ps + 2), PageSize: ps, HashSeed: 1})
			ids, ones, sampled, prefill := make([]RequestID, nreq), make([]int32, nreq), make([]int32, nreq), make([]int32, nreq)
			for i := range nreq {
				ids[i], ones[i], sampled[i], prefill[i] = RequestID(i), 1, 7, promptLen
				_, err := m.Add(ids[i], Request{Prompt: seqTokens(i*promptLen, promptLen), CapacityTokens: promptLen + steps + 1})
				require.NoError(b, err)
			}
			_, err := m.Reserve(ids, prefill)
			require.NoError(b, err)
			require.NoError(b, m.Commit(sampled))
			if bound {
				caps := StepBufferCapacities{MaxRequests: nreq, MaxTokens: nreq, MaxPages: nreq * ((promptLen+steps)/ps + 2)}
				_, err := m.BindStepBuffers(alignedBytes(mustLayout(b, caps).Size), caps)
				require.NoError(b, err)
			}
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				if n == steps {
					b.StopTimer()
					for _, id := range ids {
						require.NoError(b, m.Truncate(id, promptLen+1))
					}
					n = 0
					b.StartTimer()
				}
				if _, err := m.Reserve(ids, ones); err != nil {
					b.Fatal(err)
				}
				if err := m.Commit(sampled); err != nil {
					b.Fatal(err)
				}
				n++
			}
		})
	}
}

// TestStepBuffersUnbindWithStepPending: after unbind the Manager never
// reads the memory it was bound to: garbage written there with a step
// pending changes neither the commit nor the next step (against a twin).
func TestStepBuffersUnbindWithStepPending(t *testing.T) {
	m, twin := mustNew(t, Config{NumPages: 32, PageSize: 4}), mustNew(t, Config{NumPages: 32, PageSize: 4})
	caps := StepBufferCapacities{MaxRequests: 2, MaxTokens: 16, MaxPages: 8, MaxCascadeLevels: 1}
	mem := alignedBytes(mustLayout(t, caps).Size)
	_, err := m.BindStepBuffers(mem, caps)
	require.NoError(t, err)
	for _, mm := range []*Manager{m, twin} {
		for id := range RequestID(2) {
			_, err := mm.Add(id, Request{Prompt: seqTokens(int(id)*50, 6)})
			require.NoError(t, err)
		}
		_, err := mm.Reserve([]RequestID{0, 1}, []int32{6, 6})
		require.NoError(t, err)
	}
	m.UnbindStepBuffers()
	for i := range mem {
		mem[i] = 0xff
	}
	for _, mm := range []*Manager{m, twin} {
		require.NoError(t, mm.Commit([]int32{1, 2}))
	}
	p, err := m.Reserve([]RequestID{0, 1}, []int32{1, 1})
	require.NoError(t, err)
	want, err := twin.Reserve([]RequestID{0, 1}, []int32{1, 1})
	require.NoError(t, err)
	require.Equal(t, want.KVPageIndices, p.KVPageIndices)
	require.Equal(t, want.Positions, p.Positions)
	require.Equal(t, want.TokenIDs, p.TokenIDs)
	require.False(t, bytes.Contains(mem, []byte{0, 0, 0, 0}), "the unbound memory was written")
	require.NoError(t, m.Audit())
}
