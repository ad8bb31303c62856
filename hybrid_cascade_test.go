package pagedkv

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/pagedkv/pagedkv/cascade"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layergroup"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/stretchr/testify/require"
)

// windowedCascade runs p.Cascade through cascade.Run on the CPU backend with
// the given window_left per level (nil: none), and returns the output in
// plan row order (queries as groupAttention's: queryOf(plan row)).
func (e *cpuEngine) windowedCascade(t testing.TB, p *Plan, windows []int) []float32 {
	lay := p.Cascade
	rows := lay.QueryRows()
	nnz := len(rows)
	q := make([]float32, 0, nnz*engHeads*engDim)
	for _, r := range rows {
		q = append(q, queryOf(int(r))...)
	}
	o := kernels.NewTensor(layout.F32, nnz, engHeads, engDim)
	require.NoError(t, cascade.Run(e.be, &cascade.Params{
		Levels: lay.Levels, Q: kernels.TensorFromF32(layout.F32, q, nnz, engHeads, engDim), Cache: e.cache,
		Causal: true, AttentionParams: kernels.AttentionParams{NumQOHeads: engHeads, WindowLeft: -1},
		LevelWindowLeft: windows, O: o,
	}))
	got := o.F32()
	out := make([]float32, len(got))
	w := engHeads * engDim
	for r, src := range rows {
		copy(out[int(src)*w:(int(src)+1)*w], got[r*w:(r+1)*w])
	}
	return out
}

// windowedCascadeCounts are what TestHybridWindowedCascadeEqualsFlat saw in
// the windowed group's plans.
type windowedCascadeCounts struct {
	plans, levels, sharedLevels int // cascade plans, their levels, their shared levels
	deep                        int // plans of three or more levels
	mixed                       int // cascade plans with a request that shares nothing it holds
	flat                        int // plans with two or more requests left flat
}

// TestHybridWindowedCascadeEqualsFlat drives sliding and chunked groups
// (each beside a full group) through random workloads built to share inside
// a window or chunk: a short system prompt computed once, then children
// hitting it and prefilling short suffixes, forks of the parent decoding
// with drafts, and "long" requests on the same prompt that outgrow the window
// or chunk (so some requests of a batch cannot share). Each step, for every
// group: flat attention over the plan's arrays with the group's window (or
// chunk entries) equals dense float64 attention, and when the plan has a
// cascade, cascade.Run with the plan's CascadeWindowLeft - and with the
// group's window_left on every level, as FlashInfer's
// MultiLevelCascadeAttentionWrapper would run it - equals both. Every shared
// level's requests hold at most W (C) keys. The windowed groups must produce
// cascades, shared levels, three-level plans and mixed plans, or the test
// fails: a run where every plan stayed flat proves nothing.
func TestHybridWindowedCascadeEqualsFlat(t *testing.T) {
	t.Parallel()
	runs := 24
	if raceEnabled {
		runs = 6
	}
	kinds := []layergroup.Kind{SlidingAttention, ChunkedAttention}
	for _, kind := range kinds {
		t.Run(kind.String(), func(t *testing.T) {
			var c windowedCascadeCounts
			for run := range runs {
				windowedCascadeRun(t, kind, uint64(run), &c)
			}
			t.Logf("%s: %d cascade plans (%d with 3+ levels, %d mixed), %d levels, %d shared levels; %d multi-request plans flat",
				kind, c.plans, c.deep, c.mixed, c.levels, c.sharedLevels, c.flat)
			require.Positive(t, c.plans, "no windowed cascade plan")
			require.GreaterOrEqual(t, c.sharedLevels, c.plans)
			require.Positive(t, c.deep, "no windowed cascade of three or more levels")
			require.Positive(t, c.mixed, "no windowed cascade with a request that cannot share")
			require.Positive(t, c.flat, "no multi-request windowed plan stayed flat")
		})
	}
}

func windowedCascadeRun(t *testing.T, kind layergroup.Kind, seed uint64, c *windowedCascadeCounts) {
	rng := rand.New(rand.NewPCG(seed, 0xcafe))
	const ps = 4
	limit := []int{16, 24, 32}[rng.IntN(3)] // W or C, in tokens
	win := LayerGroup{Kind: kind, NumLayers: 1}
	if kind == SlidingAttention {
		win.WindowTokens = limit
	} else {
		win.ChunkTokens = limit
	}
	groups := []LayerGroup{win, {Kind: FullAttention, NumLayers: 1}}
	const numPages = 1024
	h, err := NewHybrid(HybridConfig{Config: Config{NumPages: numPages, PageSize: ps, HashSeed: 1, CascadeMinSavedPages: 1}, Groups: groups})
	require.NoError(t, err)
	e := newCPUEngine(t, numPages, ps)
	next := RequestID(1)
	tok := int32(1000 * (seed + 1))
	fresh := func(n int) []int32 {
		out := make([]int32, n)
		for i := range out {
			tok++
			out[i] = tok
		}
		return out
	}

	// step reserves the running requests (prompt chunks, decode, drafts),
	// checks every group's attention and commits.
	step := func(ids []RequestID, name string) {
		var nt []int32
		var drafts [][]int32
		for _, id := range ids {
			left := len(h.Tokens(id)) - h.Computed(id)
			n := min(left, 1+rng.IntN(6))
			var d []int32
			if n == left && rng.IntN(3) == 0 {
				d = fresh(1 + rng.IntN(3))
			}
			nt, drafts = append(nt, int32(n)), append(drafts, d)
		}
		p, err := h.ReserveSpec(ids, nt, drafts)
		require.NoError(t, err)
		e.copyPages(p.Copies)
		for _, gp := range p.Groups {
			noCopies := *gp
			noCopies.Copies = nil
			e.apply(t, &noCopies)
		}
		for g, gp := range p.Groups {
			spec := h.core.groups[g].layerGroup
			msg := fmt.Sprintf("seed %d %s group %d (%v, limit %d)", seed, name, g, spec.Kind, limit)
			flat := e.groupAttention(t, gp, spec)
			dense := denseGroupAttention(gp, spec, func(id RequestID) []int32 { return h.Tokens(id) })
			requireClose(t, dense, flat, 1e-5, msg+": flat vs dense")
			if spec.Kind == FullAttention {
				continue
			}
			if gp.Cascade == nil {
				require.Nil(t, gp.CascadeWindowLeft, msg)
				if len(gp.Requests) > 1 {
					c.flat++
				}
				continue
			}
			lv := gp.Cascade.Levels
			want := make([]int, len(lv))
			for l := range want {
				want[l] = -1
			}
			want[len(lv)-1] = spec.WindowLeft()
			require.Equal(t, want, gp.CascadeWindowLeft, msg)
			requireClose(t, flat, e.windowedCascade(t, gp, gp.CascadeWindowLeft), 1e-5, msg+": cascade vs flat")
			uniform := slices.Repeat([]int{gp.WindowLeft}, len(lv))
			requireClose(t, dense, e.windowedCascade(t, gp, uniform), 1e-5, msg+": cascade, one window_left, vs dense")
			// Every request on a shared level's group with pages holds at
			// most W (C) keys: all of them visible to each of its rows.
			lay := gp.Cascade
			rowReq := make([]int, 0, len(gp.Positions))
			for k, id := range lay.RequestOrder {
				for range lay.RequestQOIndptr[k+1] - lay.RequestQOIndptr[k] {
					rowReq = append(rowReq, id)
				}
			}
			for l := range len(lv) - 1 {
				for grp := range len(lv[l].QOIndptr) - 1 {
					if lv[l].KVIndptr[grp+1] == lv[l].KVIndptr[grp] {
						continue
					}
					for r := lv[l].QOIndptr[grp]; r < lv[l].QOIndptr[grp+1]; r++ {
						b := rowReq[r]
						require.LessOrEqual(t, int(gp.SeqLens[b]), limit, "%s: level %d shares pages with batch %d", msg, l, b)
					}
				}
			}
			c.plans++
			c.levels += len(lv)
			c.sharedLevels += len(lv) - 1
			if len(lv) >= 3 {
				c.deep++
			}
			for b := range gp.Requests {
				// Sliding: a request holding more than W keys shares
				// nothing. Chunked: a request past the first chunk holds
				// pages of its own chunk only.
				start := gp.TokenPositions[gp.QOIndptr[b]] - gp.Positions[gp.QOIndptr[b]]
				if int(gp.SeqLens[b]) > limit || start > 0 {
					c.mixed++
					break
				}
			}
		}
		accepted, sampled := make([]int32, len(ids)), make([]int32, len(ids))
		for b, id := range ids {
			accepted[b] = int32(rng.IntN(len(drafts[b]) + 1))
			sampled[b] = NoToken
			if h.Computed(id)+int(nt[b])+len(drafts[b]) == len(h.Tokens(id)) {
				sampled[b] = fresh(1)[0]
			}
		}
		require.NoError(t, h.CommitSpec(accepted, sampled))
		require.NoError(t, h.Audit())
	}

	// A short system prompt, computed once (it fits the window or chunk).
	sys := fresh(4 + rng.IntN(limit/2))
	parent := next
	next++
	prompt := append(slices.Clone(sys), fresh(1+rng.IntN(3))...)
	_, err = h.Add(parent, Request{Prompt: prompt})
	require.NoError(t, err)
	for h.Computed(parent) < len(prompt) {
		step([]RequestID{parent}, "parent prefill")
	}
	// Children hitting it with short suffixes, forks of the parent, and
	// long requests on the same prompt that outgrow the window or chunk.
	running := []RequestID{parent}
	for range 2 + rng.IntN(4) {
		_, err := h.Add(next, Request{Prompt: append(slices.Clone(sys), fresh(1+rng.IntN(6))...)})
		require.NoError(t, err)
		running = append(running, next)
		next++
	}
	for range rng.IntN(4) {
		require.NoError(t, h.Fork(parent, next))
		running = append(running, next)
		next++
	}
	for range rng.IntN(3) {
		_, err := h.Add(next, Request{Prompt: append(slices.Clone(sys), fresh(limit+rng.IntN(2*limit))...)})
		require.NoError(t, err)
		running = append(running, next)
		next++
	}
	for i := range 6 + rng.IntN(10) {
		step(running, fmt.Sprintf("step %d", i))
	}
}

// TestHybridWindowedCascadeIsAllocationFree: a sliding group (W = 1024)
// beside a full group, 32 requests decoding on a shared system prompt with
// two branches (the allocation test of the full cascade, in a hybrid
// model). Every request holds fewer than W keys, so the sliding group's
// plan is a three-level cascade with window_left [-1 -1 1023], and once a
// generation of requests has grown the buffers, Reserve + Commit allocate
// nothing.
func TestHybridWindowedCascadeIsAllocationFree(t *testing.T) {
	const ps, nreq = 16, 32
	h, err := NewHybrid(HybridConfig{Config: Config{NumPages: 4096, PageSize: ps, HashSeed: 1, BlockTablesStride: 128},
		Groups: []LayerGroup{{Kind: SlidingAttention, WindowTokens: 1024, NumLayers: 1}, {Kind: FullAttention, NumLayers: 1}}})
	require.NoError(t, err)
	ids := make([]RequestID, nreq)
	ones := make([]int32, nreq)
	sampled := make([]int32, nreq)
	var plan *HybridPlan
	decode := func() {
		p, err := h.Reserve(ids, ones)
		if err != nil {
			panic(err)
		}
		plan = p
		if err := h.Commit(sampled); err != nil {
			panic(err)
		}
	}
	for gen := range 2 {
		for i := range ids {
			if gen > 0 {
				require.NoError(t, h.Release(ids[i]))
			}
			ids[i], ones[i], sampled[i] = RequestID(gen*nreq+i), 1, 3
			prompt := concat(seqTokens(0, 4*ps), seqTokens(100000*(1+i%2), 2*ps), seqTokens(i*1000+gen, 8))
			_, err := h.Add(ids[i], Request{Prompt: prompt, CapacityTokens: 1024})
			require.NoError(t, err)
			for h.Computed(ids[i]) < len(h.Tokens(ids[i])) {
				_, err := h.Reserve(ids[i:i+1], []int32{int32(min(16, len(h.Tokens(ids[i]))-h.Computed(ids[i])))})
				require.NoError(t, err)
				require.NoError(t, h.Commit(nil))
			}
			require.NoError(t, h.Extend(ids[i], 1))
		}
		for range 300 {
			decode()
		}
	}
	sl := plan.Groups[0]
	require.NotNil(t, sl.Cascade)
	require.Len(t, sl.Cascade.Levels, 3)
	require.Equal(t, []int{-1, -1, 1023}, sl.CascadeWindowLeft)
	require.Equal(t, []int{-1, -1, -1}, plan.Groups[1].CascadeWindowLeft)
	require.Zero(t, testing.AllocsPerRun(200, decode))
	require.Less(t, int(plan.Groups[0].SeqLens[0]), 1024)
	require.Len(t, sl.BlockTables, nreq*128, "padded tables were built in the measured steps")
	require.NoError(t, h.Audit())
}
