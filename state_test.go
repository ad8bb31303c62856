package pagedkv

import (
	"encoding/binary"
	"errors"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/layergroup"
	"github.com/pagedkv/pagedkv/prefixcache"
)

// testStateShape is a small Mamba-2-like layer state that fits a 4 KiB page.
var testStateShape = layergroup.StateShape{ConvShape: [2]int{8, 3}, ConvDType: layergroup.StateBF16,
	SSMShape: [3]int{2, 4, 8}, SSMDType: layergroup.StateF32, PageBytes: 4096}

func stateGroup() LayerGroup {
	return LayerGroup{Kind: StateLayers, NumLayers: 1, State: testStateShape}
}

// stateModel is the slow reference of the state groups' checkpoints: the
// checkpoints published (by prefix, in their namespace), their readers,
// recency and the eviction rule, written out obviously; and a fake engine
// that keeps every state page's content (the fold of the tokens it has
// seen), runs the plan's copies and checks that every step reads the state
// of exactly the request's computed tokens.
type stateModel struct {
	t     *testing.T
	rng   *rand.Rand
	h     *HybridManager
	ps    int
	every int
	full  int   // the full group's index
	st    []int // the state groups' indexes
	reqs  map[RequestID]*stReq
	ckpts map[string]*stCkpt
	tick  uint64
	seq   uint64
	pages map[PageID]uint64 // the fake engine's state pages
	// onPlan, when set, sees every reserved step's plan before the engine
	// runs it.
	onPlan func(*HybridPlan)
	// predict, when set, returns the hit an Add or Resume of tokens in ns
	// must return (a cached request's), checked against the manager's.
	predict func(ns string, tokens []int32) int
	next    RequestID
	bases   [][]int32

	servable                          int64
	junctions                         int
	evicted                           int64
	hits, restores, published, evicts int
	refused, outOfPages               int
}

type stReq struct {
	ns        string
	tokens    []int32
	computed  int
	running   bool
	noCache   bool
	promptEnd int
	junction  int // where the attention match of its admission ended, past its checkpoint hit (0: none)
	frozenOn  *stCkpt
}

type stCkpt struct {
	ns      string
	prefix  []int32 // the tokens whose state it holds
	tokens  int
	lastUse uint64
	seq     uint64
	readers int
}

func newStateModel(t *testing.T, seed uint64, every int) *stateModel {
	return newStateModelOf(t, seed, every, []LayerGroup{stateGroup(), {Kind: FullAttention, NumLayers: 1}, stateGroup(), stateGroup()})
}

// newStateModelOf is newStateModel on groups: x.full is the first group
// that owns pages and is not a state group, x.st the state groups.
func newStateModelOf(t *testing.T, seed uint64, every int, groups []LayerGroup) *stateModel {
	return newStateModelWith(t, seed, every, groups, nil)
}

// stateModelPages and stateModelPageSize are the pool of newStateModelOf.
const stateModelPages, stateModelPageSize = 100, 4

// newStateModelWith is newStateModelOf with KV events into ev (nil: none).
func newStateModelWith(t *testing.T, seed uint64, every int, groups []LayerGroup, ev prefixcache.Sink) *stateModel {
	ps := stateModelPageSize
	h, err := NewHybrid(HybridConfig{Config: Config{NumPages: stateModelPages, PageSize: ps, HashSeed: 7, CacheEvents: ev}, Groups: groups, StateCheckpointEvery: every})
	require.NoError(t, err)
	x := &stateModel{t: t, rng: rand.New(rand.NewPCG(seed, 99)), h: h, ps: ps, every: every, full: -1,
		reqs: map[RequestID]*stReq{}, ckpts: map[string]*stCkpt{}, pages: map[PageID]uint64{}}
	for g, s := range groups {
		switch {
		case s.Kind == StateLayers:
			x.st = append(x.st, g)
		case x.full < 0 && s.OwnsPages():
			x.full = g
		}
	}
	for i := range 3 {
		b := make([]int32, 40)
		for j := range b {
			b[j] = int32(x.rng.IntN(5) + 10*i)
		}
		x.bases = append(x.bases, b)
	}
	return x
}

func stKey(ns string, tokens []int32) string {
	b := []byte(ns + "|")
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint32(b, uint32(t))
	}
	return string(b)
}

// fold is state group j's state after tokens: what a recurrent layer
// computes, reduced to a hash of everything it has read.
func fold(j int, tokens []int32) uint64 {
	f := fnv.New64a()
	f.Write([]byte{byte(j)})
	for _, t := range tokens {
		f.Write(binary.LittleEndian.AppendUint32(nil, uint32(t)))
	}
	return f.Sum64()
}

// boundary is the checkpoint policy, written out: a page boundary in the
// prompt that is a multiple of the interval, the prompt's last whole
// page, the page before the prompt's end when it ends on a page, or the
// junction where the request's attention match ended beyond its hit.
func (x *stateModel) boundary(r *stReq, b int) bool {
	promptEnd := r.promptEnd
	if b <= 0 || b%x.ps != 0 || b > promptEnd {
		return false
	}
	if b == r.junction {
		return true
	}
	last := promptEnd / x.ps * x.ps
	return x.every > 0 && b%x.every == 0 || b == last || promptEnd%x.ps == 0 && b == last-x.ps
}

func (x *stateModel) read(c *stCkpt, d int) {
	if c != nil {
		c.readers += d
		require.GreaterOrEqual(x.t, c.readers, 0)
	}
}

// admitted checks an Add or Resume's hit: the attention group's own match
// (its ServableTokens grew by it) cut to the deepest checkpoint at or
// below it; the request then reads that checkpoint.
func (x *stateModel) admitted(id RequestID, matched int) {
	r := x.reqs[id]
	x.tick++
	s := x.h.Stats().Groups[x.full].ServableTokens
	attn := int(s - x.servable)
	x.servable = s
	want := 0
	var best *stCkpt
	if !r.noCache && len(r.tokens) > 1 {
		for k := x.ps; k <= attn; k += x.ps {
			if c, ok := x.ckpts[stKey(r.ns, r.tokens[:k])]; ok {
				want, best = k, c
			}
		}
	}
	require.Equal(x.t, want, matched, "request %d: the attention group serves %d tokens; the deepest checkpoint at or below is at %d", id, attn, want)
	r.computed, r.running, r.junction = matched, true, 0
	if !r.noCache && len(r.tokens) > 1 && attn > want {
		r.junction = attn
		x.junctions++
	}
	if best != nil {
		best.lastUse = x.tick
		x.read(best, +1)
		r.frozenOn = best
		x.hits++
	}
}

// evictions applies the state group's evictions since the last look: the
// model evicts as many by its rule and must end with the same count.
func (x *stateModel) evictions() {
	e := x.h.Stats().Groups[x.st[0]].EvictedPages
	for ; x.evicted < e; x.evicted++ {
		var vk string
		var v *stCkpt
		var vu float64
		for k, c := range x.ckpts {
			if c.readers > 0 {
				continue
			}
			u := float64(c.tokens) / float64(1+x.tick-c.lastUse)
			if v == nil || u < vu || u == vu && (c.tokens < v.tokens || c.tokens == v.tokens && c.seq < v.seq) {
				vk, v, vu = k, c, u
			}
		}
		require.NotNil(x.t, v, "the manager evicted a checkpoint, the model has no idle one")
		delete(x.ckpts, vk)
		x.evicts++
	}
}

func (x *stateModel) pick(running bool) (RequestID, *stReq) {
	var ids []RequestID
	for id, r := range x.reqs {
		if r.running == running {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return 0, nil
	}
	// Map order is random: sort for a reproducible run.
	for i := 1; i < len(ids); i++ {
		for j := i; j > 0 && ids[j] < ids[j-1]; j-- {
			ids[j], ids[j-1] = ids[j-1], ids[j]
		}
	}
	id := ids[x.rng.IntN(len(ids))]
	return id, x.reqs[id]
}

func (x *stateModel) op() {
	t, rng, h := x.t, x.rng, x.h
	switch k := rng.IntN(100); {
	case k < 22 && len(x.reqs) < 12: // add
		base := x.bases[rng.IntN(len(x.bases))]
		prompt := append([]int32(nil), base[:1+rng.IntN(len(base))]...)
		for range rng.IntN(6) {
			prompt = append(prompt, int32(rng.IntN(50)))
		}
		ns := []string{"", "b"}[rng.IntN(2)]
		r := &stReq{ns: ns, tokens: prompt, noCache: rng.IntN(10) == 0, promptEnd: len(prompt)}
		id := x.next
		x.next++
		x.reqs[id] = r
		want := x.predicted(r)
		matched, err := h.Add(id, Request{Namespace: Namespace{Salt: ns}, Prompt: prompt, NoCache: r.noCache})
		require.NoError(t, err)
		x.checkPredicted(id, want, matched)
		x.admitted(id, matched)
	case k < 60: // a step
		x.step()
	case k < 65: // fork
		id, p := x.pick(true)
		if p == nil {
			return
		}
		child := x.next
		x.next++
		require.NoError(t, h.Fork(id, child))
		c := *p
		c.tokens = append([]int32(nil), p.tokens...)
		x.read(c.frozenOn, +1)
		x.reqs[child] = &c
	case k < 73: // release
		id, r := x.pick(rng.IntN(4) > 0)
		if r == nil {
			return
		}
		require.NoError(t, h.Release(id))
		x.read(r.frozenOn, -1)
		delete(x.reqs, id)
	case k < 79: // preempt
		id, r := x.pick(true)
		if r == nil {
			return
		}
		require.NoError(t, h.Preempt(id))
		x.read(r.frozenOn, -1)
		r.frozenOn, r.running, r.computed = nil, false, 0
	case k < 86: // resume
		id, r := x.pick(false)
		if r == nil {
			return
		}
		want := x.predicted(r)
		matched, err := h.Resume(id)
		require.NoError(t, err)
		x.checkPredicted(id, want, matched)
		x.admitted(id, matched)
	case k < 91: // extend: the next turn's known tokens
		id, r := x.pick(rng.IntN(3) > 0)
		if r == nil {
			return
		}
		more := make([]int32, 1+rng.IntN(8))
		for i := range more {
			more[i] = int32(rng.IntN(50))
		}
		require.NoError(t, h.Extend(id, more...))
		r.tokens = append(r.tokens, more...)
		r.promptEnd = len(r.tokens)
	case k < 95: // evict
		h.Evict(rng.IntN(24))
		x.evictions()
	default: // truncate
		id, r := x.pick(rng.IntN(3) > 0)
		if r == nil {
			return
		}
		n := rng.IntN(len(r.tokens) + 1)
		err := h.Truncate(id, n)
		if r.running && n < r.computed {
			require.ErrorIs(t, err, ErrBadArgument)
			x.refused++
			return
		}
		require.NoError(t, err)
		r.tokens = r.tokens[:n]
		r.promptEnd = min(r.promptEnd, n)
		if r.junction > n {
			r.junction = 0
		}
	}
}

// step reserves a step of up to four running requests, each ending at its
// next checkpoint boundary most of the time, runs the fake engine on the
// plan and commits (or aborts one step in ten).
func (x *stateModel) step() {
	t, rng, h := x.t, x.rng, x.h
	var ids []RequestID
	var nt []int32
	seen := map[RequestID]bool{}
	for range 1 + rng.IntN(4) {
		id, r := x.pick(true)
		if r == nil || seen[id] {
			continue
		}
		seen[id] = true
		// The model's next boundary against the manager's.
		want := 0
		for b := (r.computed/x.ps + 1) * x.ps; b <= r.promptEnd && !r.noCache; b += x.ps {
			if x.boundary(r, b) {
				want = b
				break
			}
		}
		require.Equal(t, want, h.NextStateCheckpoint(id), "request %d's next checkpoint", id)
		n := rng.IntN(len(r.tokens) - r.computed + 1)
		if want > 0 && rng.IntN(5) > 0 {
			n = min(n+x.ps, want-r.computed)
		}
		ids, nt = append(ids, id), append(nt, int32(n))
	}
	p, err := h.Reserve(ids, nt)
	if errors.Is(err, ErrOutOfPages) {
		x.outOfPages++
		return
	}
	require.NoError(t, err)
	if x.onPlan != nil {
		x.onPlan(p)
	}
	x.evictions()
	require.NoError(t, h.Audit(), "during the step")
	// Slots: distinct over the batch and the groups, never a page of the
	// attention group's tables.
	attn := map[PageID]bool{}
	for _, pg := range p.Groups[x.full].KVPageIndices {
		attn[PageID(pg)] = true
	}
	slots := map[int32]bool{}
	for _, g := range x.st {
		sp := p.Groups[g]
		require.Len(t, sp.StateIndices, len(ids))
		require.Equal(t, p.Requests, sp.Requests)
		for _, s := range sp.StateIndices {
			require.False(t, slots[s], "state slot %d given twice in one step", s)
			require.False(t, attn[PageID(s)], "state slot %d is an attention page", s)
			slots[s] = true
		}
	}
	if rng.IntN(10) == 0 {
		require.NoError(t, h.Abort())
		return
	}
	// The fake engine: the copies first, then every state group's layer
	// reads its slot (which must hold exactly the request's computed
	// tokens) and writes the state after the step's tokens.
	for _, c := range p.Copies {
		if v, ok := x.pages[c.Src]; ok {
			x.pages[c.Dst] = v
		} else {
			delete(x.pages, c.Dst)
		}
	}
	for b, id := range ids {
		r := x.reqs[id]
		for j, g := range x.st {
			slot := PageID(p.Groups[g].StateIndices[b])
			if r.computed > 0 {
				got, ok := x.pages[slot]
				require.True(t, ok && got == fold(j, r.tokens[:r.computed]),
					"request %d (group %d, slot %d) resumes from a state that is not that of its %d computed tokens", id, g, slot, r.computed)
				if r.frozenOn != nil {
					x.restores++
				}
			}
			x.pages[slot] = fold(j, r.tokens[:r.computed+int(nt[b])])
		}
	}
	sampled := make([]int32, len(ids))
	for b, id := range ids {
		r := x.reqs[id]
		sampled[b] = NoToken
		if r.computed+int(nt[b]) == len(r.tokens) && rng.IntN(2) == 0 {
			sampled[b] = int32(rng.IntN(50))
		}
	}
	require.NoError(t, h.Commit(sampled))
	for b, id := range ids {
		r := x.reqs[id]
		x.read(r.frozenOn, -1)
		r.frozenOn = nil
		r.computed += int(nt[b])
		if sampled[b] != NoToken {
			r.tokens = append(r.tokens, sampled[b])
		}
		if !r.noCache && x.boundary(r, r.computed) {
			key := stKey(r.ns, r.tokens[:r.computed])
			if c, ok := x.ckpts[key]; ok {
				c.lastUse = x.tick
				continue
			}
			x.seq++
			c := &stCkpt{ns: r.ns, prefix: slices.Clone(r.tokens[:r.computed]), tokens: r.computed, lastUse: x.tick, seq: x.seq, readers: 1}
			x.ckpts[key] = c
			r.frozenOn = c
			x.published++
		}
	}
}

// predicted is x.predict's hit for r's admission (-1: not predicted).
func (x *stateModel) predicted(r *stReq) int {
	if x.predict == nil || r.noCache {
		return -1
	}
	return x.predict(r.ns, r.tokens)
}

func (x *stateModel) checkPredicted(id RequestID, want, matched int) {
	if want >= 0 {
		require.Equal(x.t, want, matched, "request %d: admitted on %d tokens, predicted %d", id, matched, want)
	}
}

// compare checks the manager against the model after an operation.
func (x *stateModel) compare(op int) {
	require.NoError(x.t, x.h.Audit(), "op %d", op)
	idle := 0
	for _, c := range x.ckpts {
		if c.readers == 0 {
			idle++
		}
	}
	s := x.h.Stats()
	for _, g := range x.st {
		require.Equal(x.t, len(x.ckpts), s.Groups[g].CachedPages, "op %d: checkpoints", op)
		require.Equal(x.t, idle, s.Groups[g].EvictablePages, "op %d: idle checkpoints", op)
	}
	for id, r := range x.reqs {
		require.Equal(x.t, r.computed, x.h.Computed(id), "op %d: request %d computed", op, id)
		require.True(x.t, slices.Equal(r.tokens, x.h.Tokens(id)), "op %d: request %d tokens %v, the model's %v", op, id, x.h.Tokens(id), r.tokens)
	}
}

// TestStateGroupsMatchModel runs random operations on a 3 state : 1 full
// hybrid with a small pool (checkpoints are published, restored and
// evicted under pressure) against stateModel: every hit is the deepest
// checkpoint at or below the attention group's match, every restored
// request reads the state of exactly its hit (the fake engine's pages),
// the checkpoints, their idle count and the victims of eviction are the
// model's, slots are never shared by two live owners nor leaked (Audit).
func TestStateGroupsMatchModel(t *testing.T) {
	t.Parallel()
	runs, ops := 8, 500
	if testing.Short() || raceEnabled {
		runs, ops = 2, 200
	}
	var hits, restores, published, evicts, refused, oop, junctions int
	for run := range runs {
		x := newStateModel(t, uint64(run), []int{0, 8, 12}[run%3])
		for op := range ops {
			x.op()
			x.compare(op)
		}
		hits, restores, published, evicts = hits+x.hits, restores+x.restores, published+x.published, evicts+x.evicts
		refused, oop, junctions = refused+x.refused, oop+x.outOfPages, junctions+x.junctions
	}
	require.Positive(t, hits)
	require.Positive(t, restores)
	require.Positive(t, published)
	require.Positive(t, evicts)
	require.Positive(t, refused)
	require.Positive(t, junctions)
	t.Logf("%d runs of %d ops: %d checkpoint hits, %d restored steps, %d published, %d evicted, %d junctions, %d truncations refused, %d steps out of pages",
		runs, ops, hits, restores, published, evicts, junctions, refused, oop)
}

// TestStateStepAllocatesNothing pins a 3 state : 1 full hybrid's hot path:
// after a warm-up, a step in which requests finish, are admitted again on
// their prompt's checkpoint (restore copies), prefill to the next
// checkpoint (publish, and eviction of old checkpoints) and decode
// allocates nothing; with KV events too (the checkpoints' events
// recorded, flushed and drained).
func TestStateStepAllocatesNothing(t *testing.T) {
	for _, ev := range []bool{false, true} {
		t.Run(map[bool]string{false: "no-events", true: "events"}[ev], func(t *testing.T) { testStateStepAllocs(t, ev) })
	}
}

func testStateStepAllocs(t *testing.T, withEvents bool) {
	const ps, nreq, promptLen, maxLen = 4, 16, 24, 40
	groups := []LayerGroup{stateGroup(), stateGroup(), stateGroup(), {Kind: FullAttention, NumLayers: 1}}
	numPages := nreq * (maxLen/ps + 6)
	cfg := Config{NumPages: numPages, PageSize: ps, HashSeed: 1}
	var rec *events.Recorder
	var q *events.Queue
	if withEvents {
		rec, q = newHybridRecorder(t, groups, numPages, ps, 0)
		cfg.CacheEvents = rec
	}
	h, err := NewHybrid(HybridConfig{Config: cfg, Groups: groups, StateCheckpointEvery: 2 * ps})
	require.NoError(t, err)
	ids, nt, sampled := make([]RequestID, nreq), make([]int32, nreq), make([]int32, nreq)
	life := make([]int, nreq)
	next := RequestID(0)
	admit := func(i int) {
		ids[i] = next
		next++
		life[i]++
		// Four prompts with a shared start, new suffixes each lifetime: hits
		// on the shared checkpoints, new ones published, old ones evicted.
		prompt := seqTokens(i%4*1000, promptLen)
		copy(prompt[promptLen-ps:], seqTokens(life[i]*7+i, ps))
		if _, err := h.Add(ids[i], Request{Prompt: prompt, CapacityTokens: maxLen + 1}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range ids {
		admit(i)
	}
	step := func() {
		for i, id := range ids {
			if len(h.Tokens(id)) >= maxLen {
				if err := h.Release(id); err != nil {
					t.Fatal(err)
				}
				admit(i)
				id = ids[i]
			}
			c := h.Computed(id)
			n := len(h.Tokens(id)) - c
			if b := h.NextStateCheckpoint(id); b > 0 {
				n = min(n, b-c)
			}
			nt[i], sampled[i] = int32(n), NoToken
			if c+n == len(h.Tokens(id)) {
				sampled[i] = int32(i)
			}
		}
		if _, err := h.Reserve(ids, nt); err != nil {
			t.Fatal(err)
		}
		if err := h.Commit(sampled); err != nil {
			t.Fatal(err)
		}
		if rec != nil {
			if !rec.Flush() {
				t.Fatal("the event queue is full")
			}
			for b := q.TryNext(); b != nil; b = q.TryNext() {
				q.Done(b)
			}
		}
	}
	for range 3 * maxLen {
		step()
	}
	before := h.Stats().Groups[0]
	const runs = 60 // a request lives about 25 steps: publishes and evictions happen in any 60
	allocs := testing.AllocsPerRun(runs, step)
	require.Zero(t, allocs, "allocations per step")
	after := h.Stats().Groups[0]
	require.Greater(t, after.PublishedPages, before.PublishedPages, "the steps measured publish checkpoints")
	require.Greater(t, after.EvictedPages, before.EvictedPages, "the steps measured evict checkpoints")
	require.Greater(t, after.CopiedPages, before.CopiedPages, "the steps measured copy frozen slots")
	t.Logf("%d steps: %d checkpoints published, %d evicted, %d slot copies per group", runs,
		after.PublishedPages-before.PublishedPages, after.EvictedPages-before.EvictedPages, after.CopiedPages-before.CopiedPages)
	if rec != nil {
		gs := rec.GroupStats(0)
		require.Positive(t, gs.StoredPages, "no checkpoint was announced")
		require.Positive(t, gs.RemovedPages, "no checkpoint eviction was announced")
	}
	require.NoError(t, h.Audit())
}

// TestStateGroupsRefuse pins what a model with state groups refuses, by
// name, changing nothing: configurations it does not support yet, a
// truncation into the computed tokens, drafts, and bound step buffers.
func TestStateGroupsRefuse(t *testing.T) {
	full := LayerGroup{Kind: FullAttention, NumLayers: 1}
	groups := []LayerGroup{stateGroup(), full}
	cfg := Config{NumPages: 32, PageSize: 4}
	for _, c := range []struct {
		name string
		cfg  HybridConfig
		want string
	}{
		{"interval", HybridConfig{Config: cfg, Groups: groups, StateCheckpointEvery: 6}, "StateCheckpointEvery = 6"},
		{"interval without state", HybridConfig{Config: cfg, Groups: []LayerGroup{full}, StateCheckpointEvery: 8}, "StateCheckpointEvery = 8 without state groups"},
		{"state only", HybridConfig{Config: cfg, Groups: []LayerGroup{stateGroup()}}, "all of kind state"},
		{"tiers layers", HybridConfig{Config: Config{NumPages: 32, PageSize: 4, Tiers: TierConfig{HostPages: 8, Format: tierFormatLayers(4, 3)}}, Groups: groups},
			"Tiers.Format.Layers = 3, want 1"},
		{"state on a full group", HybridConfig{Config: cfg, Groups: []LayerGroup{{Kind: FullAttention, NumLayers: 1, State: testStateShape}}}, "full group with a State shape"},
	} {
		_, err := NewHybrid(c.cfg)
		require.ErrorIs(t, err, ErrBadConfig, c.name)
		require.ErrorContains(t, err, c.want, c.name)
	}
	h, err := NewHybrid(HybridConfig{Config: cfg, Groups: groups})
	require.NoError(t, err)
	_, err = h.Add(1, Request{Prompt: seqTokens(0, 10)})
	require.NoError(t, err)
	_, err = h.Reserve([]RequestID{1}, []int32{8})
	require.NoError(t, err)
	require.NoError(t, h.Commit(nil))
	before := h.Stats()
	err = h.Truncate(1, 5)
	require.ErrorIs(t, err, ErrBadArgument)
	require.ErrorContains(t, err, "cannot return before its 8 computed tokens")
	_, err = h.ReserveSpec([]RequestID{1}, []int32{2}, [][]int32{{3}})
	require.ErrorIs(t, err, ErrBadArgument)
	require.ErrorContains(t, err, "drafts[0] has 1 tokens")
	_, err = h.BindStepBuffers(make([]byte, 1<<20), StepBufferCapacities{MaxRequests: 4, MaxTokens: 64, MaxPages: 32})
	require.ErrorIs(t, err, ErrBadArgument)
	require.Equal(t, before, h.Stats())
	require.Equal(t, 8, h.Computed(1))
	require.NoError(t, h.Audit())
}
