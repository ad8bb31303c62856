package pagedkv

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/reference"
)

// This file runs random workloads (adds with shared prompts, chunked
// prefill and decode steps, forks, preemptions and resumes, evictions under
// memory pressure, pins, aborted steps) on the Manager and on its slow model
// in internal/reference, and after every operation checks:
//
//   - Audit (every package's invariants, reference counts equal holders, no
//     page both free and referenced);
//   - Stats and every request's tokens, computed count and start equal the
//     model's, and the requests' page lists equal the model's up to a
//     renaming of pages (the same sharing);
//   - a fake K/V store: the engine writes kv[page][entry] = f(token,
//     position) for every appended row (after the plan's copies), and every
//     running request's pages must reproduce f over its computed tokens.
//     A page served from the cache with the wrong tokens, a copy-on-write
//     that was not planned, or a page freed while still in use shows up
//     here as a wrong value.

// fakeKV is the fake K/V of token tok at position pos; 0 means "never
// written".
func fakeKV(tok int32, pos int) uint64 { return uint64(tok)<<32 | uint64(pos) + 1 }

type mgrHarness struct {
	t      testing.TB
	m      *Manager
	ref    *reference.ManagerModel
	ps     int
	kv     []uint64 // [page*ps + entry]
	spaces []Namespace
	spec   bool
	ids    []RequestID // live requests, in creation order
	nextID RequestID
	pins   [][2]uint64 // real PinID, model pin
	unread []RequestID // released requests whose CacheUsage is still to read
}

// checkUsage compares request id's CacheUsage (live, or released and
// kept until this read) with the model's: all reads come from the device
// (no tiers here). A released request's is gone once read.
func (h *mgrHarness) checkUsage(id RequestID) {
	h.t.Helper()
	u, ok := h.m.CacheUsage(id)
	read, write, mok := h.ref.Usage(uint64(id))
	want := CacheUsage{DeviceReadTokens: read, WriteTokens: write}
	if ok != mok || u != want {
		require.Failf(h.t, "cache usage differs", "request %d: %+v (%v), model %+v (%v)", id, u, ok, want, mok)
	}
	if !h.m.Has(id) {
		_, again := h.m.CacheUsage(id)
		require.False(h.t, again, "request %d: its usage was read twice after release", id)
	}
}

type mgrHarnessConfig struct {
	window int
	hash   func(uint64, []int32) uint64
	// spec turns some steps into speculative steps (ReserveSpec/CommitSpec
	// with random drafts and accept counts) and some extends into Truncate.
	spec bool
}

const (
	mhNumPages  = 24
	mhPageSize  = 4
	mhPrios     = 3
	mhMaxPinned = 6
)

func newMgrHarness(t testing.TB, hc mgrHarnessConfig) *mgrHarness {
	m, err := New(Config{NumPages: mhNumPages, PageSize: mhPageSize, WindowTokens: hc.window, Priorities: mhPrios,
		MaxPinnedPages: mhMaxPinned, HashSeed: 9, Hash: hc.hash, CascadeMinSavedPages: 1, BlockTablesStride: mhNumPages})
	require.NoError(t, err)
	return &mgrHarness{
		t: t, m: m, ps: mhPageSize, kv: make([]uint64, mhNumPages*mhPageSize),
		ref: reference.NewManagerModel(reference.ManagerModelConfig{NumPages: mhNumPages, PageSize: mhPageSize,
			WindowTokens: hc.window, Priorities: mhPrios, MaxPinnedPages: mhMaxPinned}),
		spaces: []Namespace{{}, {Tenant: "a"}, {Tenant: "a", LoRA: "x"}},
		spec:   hc.spec,
	}
}

func nsName(ns Namespace) string { return fmt.Sprintf("%q/%q/%q", ns.Tenant, ns.LoRA, ns.Salt) }

// promptOf returns n tokens of family f: families share their first tokens
// in a tree (all share 4, pairs share 8, ...), so prompts hit each other's
// cached pages at several depths.
func promptOf(f, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		g := f >> max(0, 3-i/4)
		out[i] = int32(g*50+i) % 97
	}
	return out
}

// sampleOf is the token request id "samples" at position pos.
func sampleOf(id RequestID, pos int) int32 { return int32(uint64(id)*7+uint64(pos)*13) % 89 }

// same requires the real call's error to match the model's (both nil, or
// the same class).
func (h *mgrHarness) same(op string, err, merr error) {
	h.t.Helper()
	classes := []struct{ real, model error }{
		{ErrOutOfPages, reference.ErrMgrOutOfPages},
		{ErrUnknownRequest, reference.ErrMgrUnknownRequest},
		{ErrRequestExists, reference.ErrMgrRequestExists},
		{ErrPreempted, reference.ErrMgrPreempted},
		{ErrNotPreempted, reference.ErrMgrNotPreempted},
		{ErrStepPending, reference.ErrMgrStepPending},
		{ErrNoStep, reference.ErrMgrNoStep},
		{ErrBadArgument, reference.ErrMgrBadArgument},
	}
	if merr == nil {
		require.NoError(h.t, err, op)
		return
	}
	for _, c := range classes {
		if errors.Is(merr, c.model) {
			require.ErrorIs(h.t, err, c.real, "%s: model says %v", op, merr)
			return
		}
	}
	require.Error(h.t, err, "%s: model says %v", op, merr)
}

func (h *mgrHarness) pick(a byte, want func(RequestID) bool) (RequestID, bool) {
	var c []RequestID
	for _, id := range h.ids {
		if want(id) {
			c = append(c, id)
		}
	}
	if len(c) == 0 {
		return 0, false
	}
	return c[int(a)%len(c)], true
}

func (h *mgrHarness) forget(id RequestID) {
	h.ids = slices.DeleteFunc(h.ids, func(x RequestID) bool { return x == id })
}

// Operations, one per 5-byte command: op, a, b, c, d. The op byte is taken
// modulo 16 and several values map to the common operations, so random
// input looks like traffic: mostly steps, some arrivals and departures.
const (
	mopAdd = iota
	mopStep
	mopFork
	mopRelease
	mopPreempt
	mopResume
	mopEvict
	mopPin
	mopUnpin
	mopExtend
	mopBadStep
)

var mopOf = [16]int{
	mopAdd, mopAdd, mopStep, mopStep, mopStep, mopStep, mopStep, mopFork,
	mopRelease, mopRelease, mopPreempt, mopResume, mopEvict, mopPin, mopUnpin, mopExtend,
}

func (h *mgrHarness) step(op, a, b, c, d byte) {
	running := func(id RequestID) bool { return h.m.Running(id) }
	kind := mopOf[op%16]
	if op >= 0xf0 { // a rare refused step instead of the op
		kind = mopBadStep
	}
	switch kind {
	case mopAdd:
		id := h.nextID
		h.nextID++
		ns := h.spaces[int(a)%len(h.spaces)]
		prompt := promptOf(int(b)%8, 1+int(c)%20)
		prio, noCache := int(d)%mhPrios, d%16 == 15
		got, err := h.m.Add(id, Request{Namespace: ns, Prompt: prompt, Priority: Priority(prio), NoCache: noCache})
		want, merr := h.ref.Add(uint64(id), nsName(ns), prompt, prio, noCache)
		h.same("add", err, merr)
		require.Equal(h.t, want, got, "add %d: matched tokens", id)
		h.ids = append(h.ids, id)
	case mopStep:
		if h.spec && c%2 == 1 {
			h.runSpecStep(a, b, c, d)
			break
		}
		h.runStep(a, b, c, d)
	case mopFork:
		if p, ok := h.pick(a, running); ok {
			id := h.nextID
			h.nextID++
			h.same("fork", h.m.Fork(p, id), h.ref.Fork(uint64(p), uint64(id)))
			h.ids = append(h.ids, id)
		}
	case mopRelease:
		if id, ok := h.pick(a, func(RequestID) bool { return true }); ok {
			h.same("release", h.m.Release(id), h.ref.Release(uint64(id)))
			if h.m.Has(id) {
				break // refused (a step is pending)
			}
			h.forget(id)
			if b%2 == 0 {
				h.checkUsage(id) // read at once; else after the next operation
			} else {
				h.unread = append(h.unread, id)
			}
		}
	case mopPreempt:
		if id, ok := h.pick(a, running); ok {
			h.same("preempt", h.m.Preempt(id), h.ref.Preempt(uint64(id)))
		}
	case mopResume:
		if id, ok := h.pick(a, func(id RequestID) bool { return !h.m.Running(id) }); ok {
			got, err := h.m.Resume(id)
			want, merr := h.ref.Resume(uint64(id))
			h.same("resume", err, merr)
			require.Equal(h.t, want, got, "resume %d: matched tokens", id)
		}
	case mopEvict:
		n := 1 + int(a)%4
		require.Equal(h.t, h.ref.Evict(n), h.m.Evict(n), "evict %d", n)
	case mopPin:
		ns := h.spaces[int(a)%len(h.spaces)]
		tokens := promptOf(int(b)%8, 1+int(c)%20)
		id, n, err := h.m.Pin(ns, tokens)
		mid, mn, merr := h.ref.Pin(nsName(ns), tokens)
		switch {
		case errors.Is(merr, reference.ErrMgrNotCached):
			require.ErrorIs(h.t, err, ErrNotCached)
		case errors.Is(merr, reference.ErrMgrPinLimit):
			require.ErrorIs(h.t, err, ErrPinLimit)
		default:
			require.NoError(h.t, err)
			require.Equal(h.t, mn, n, "pinned tokens")
			h.pins = append(h.pins, [2]uint64{uint64(id), mid})
		}
	case mopUnpin:
		if len(h.pins) > 0 {
			i := int(a) % len(h.pins)
			require.NoError(h.t, h.m.Unpin(PinID(h.pins[i][0])))
			require.NoError(h.t, h.ref.Unpin(h.pins[i][1]))
			h.pins = slices.Delete(h.pins, i, i+1)
		}
	case mopExtend:
		if h.spec && b%3 == 0 {
			h.truncate(a, c)
			break
		}
		if id, ok := h.pick(a, func(RequestID) bool { return true }); ok {
			more := promptOf(int(b)%8, 2+int(c)%5)
			h.same("extend", h.m.Extend(id, more...), h.ref.Extend(uint64(id), more))
		}
	case mopBadStep:
		// A step the Manager must refuse without changing anything: too
		// many tokens for one request, or a request listed twice.
		if id, ok := h.pick(a, running); ok {
			ids, nt := []RequestID{id}, []int32{int32(len(h.m.Tokens(id)) - h.m.Computed(id) + 1)}
			if b%2 == 0 {
				ids, nt = []RequestID{id, id}, []int32{0, 0}
			}
			before := h.m.Stats()
			_, err := h.m.Reserve(ids, nt)
			_, merr := h.ref.Reserve(u64s(ids), nt)
			h.same("bad reserve", err, merr)
			require.Equal(h.t, before, h.m.Stats(), "a refused Reserve changed the Manager")
		}
	}
}

func u64s(ids []RequestID) []uint64 {
	out := make([]uint64, len(ids))
	for i, id := range ids {
		out[i] = uint64(id)
	}
	return out
}

// runStep schedules up to 1+b%4 running requests with tokens left to
// compute, starting at the a-th, chunk 1+c%7 tokens each, and runs the step
// on a fake engine; d chooses abort (d%8 == 7) and, when the pool is
// exhausted, which request the scheduler preempts.
func (h *mgrHarness) runStep(a, b, c, d byte) {
	var ids []RequestID
	var nt []int32
	for k := range h.ids {
		id := h.ids[(int(a)+k)%len(h.ids)]
		left := len(h.m.Tokens(id)) - h.m.Computed(id)
		if h.m.Running(id) && left > 0 && len(ids) <= int(b)%4 {
			ids = append(ids, id)
			nt = append(nt, int32(min(left, 1+int(c)%7)))
		}
	}
	if len(ids) == 0 {
		return
	}
	before := h.m.Stats()
	plan, err := h.m.Reserve(ids, nt)
	mcopies, merr := h.ref.Reserve(u64s(ids), nt)
	h.same("reserve", err, merr)
	if err != nil {
		require.Equal(h.t, before, h.m.Stats(), "a failed Reserve changed the Manager")
		// The scheduler's answer to an exhausted pool: preempt someone.
		victim := ids[int(d)%len(ids)]
		h.same("preempt", h.m.Preempt(victim), h.ref.Preempt(uint64(victim)))
		return
	}
	require.Len(h.t, plan.Copies, mcopies, "copy-on-write copies")
	h.checkPlan(plan, ids, nt)
	h.engine(plan)
	require.NoError(h.t, h.m.Audit(), "during the step")
	if d%8 == 7 {
		h.same("abort", h.m.Abort(), h.ref.Abort())
		return
	}
	sampled := make([]int32, len(ids))
	for i, id := range ids {
		sampled[i] = NoToken
		if n := len(h.m.Tokens(id)); h.m.Computed(id)+int(nt[i]) == n {
			sampled[i] = sampleOf(id, n)
		}
	}
	h.same("commit", h.m.Commit(sampled), h.ref.Commit(sampled))
}

// checkPlan checks the plan's arrays against the page table they describe.
func (h *mgrHarness) checkPlan(p *Plan, ids []RequestID, nt []int32) {
	require.Equal(h.t, ids, p.Requests)
	for i, id := range ids {
		pages, start := h.m.Pages(id)
		got := p.KVPageIndices[p.KVIndptr[i]:p.KVIndptr[i+1]]
		require.Equal(h.t, len(pages), len(got), "request %d pages", id)
		for k := range got {
			require.Equal(h.t, int32(pages[k]), got[k], "request %d page %d", id, k)
		}
		held := h.m.Computed(id) + int(nt[i]) - start
		require.Equal(h.t, int32(held), p.SeqLens[i], "request %d seq_len", id)
		require.Equal(h.t, nt[i], p.QOIndptr[i+1]-p.QOIndptr[i], "request %d rows", id)
		for r := p.QOIndptr[i]; r < p.QOIndptr[i+1]; r++ {
			require.Equal(h.t, int32(i), p.BatchIndices[r])
			pos := int(p.TokenPositions[r])
			require.Equal(h.t, pos-start, int(p.Positions[r]))
			require.Equal(h.t, h.m.Tokens(id)[pos], p.TokenIDs[r])
		}
	}
	requireBlockTablesMatchCSR(h.t, p, mhNumPages, h.ps)
	if p.Cascade != nil {
		checkCascadeCoversPlan(h.t, p, h.ps)
	}
}

// engine plays the model runner: copies first, then the appends.
func (h *mgrHarness) engine(p *Plan) {
	for _, c := range p.Copies {
		copy(h.kv[int(c.Dst)*h.ps:int(c.Dst)*h.ps+int(c.Entries)], h.kv[int(c.Src)*h.ps:])
	}
	for r := range p.Positions {
		b := p.BatchIndices[r]
		pos := p.Positions[r]
		page := p.KVPageIndices[p.KVIndptr[b]+pos/int32(h.ps)]
		h.kv[int(page)*h.ps+int(pos)%h.ps] = fakeKV(p.TokenIDs[r], int(p.TokenPositions[r]))
	}
}

// verify compares the Manager with the model after an operation.
func (h *mgrHarness) verify(step int) {
	if err := h.m.Audit(); err != nil {
		require.NoError(h.t, err, "audit after step %d", step)
	}
	s, ms := h.m.Stats(), h.ref.Stats()
	got := reference.ManagerModelStats{
		TotalPages: s.TotalPages, FreePages: s.FreePages, UsedPages: s.UsedPages, EvictablePages: s.EvictablePages,
		PinnedIdlePages: s.PinnedIdlePages, CachedPages: s.CachedPages, PinnedPages: s.PinnedPages, SharedPages: s.SharedPages,
		Requests: s.Requests, PreemptedRequests: s.PreemptedRequests,
		PromptTokens: s.PromptTokens, PromptHitTokens: s.PromptHitTokens, ComputedTokens: s.ComputedTokens,
		ResumedTokens: s.ResumedTokens, ResumeHitTokens: s.ResumeHitTokens,
		Steps: s.Steps, Preemptions: s.Preemptions, CopiedPages: s.CopiedPages, PublishedPages: s.PublishedPages,
		DuplicatePages: s.DuplicatePages, EvictedPages: s.EvictedPages, EvictionFreedPages: s.EvictionFreedPages,
		InnerVictims: s.InnerVictims, WindowReleasedPages: s.WindowReleasedPages, ChainsCut: s.ChainsCut,
		DraftTokens: s.DraftTokens, AcceptedDraftTokens: s.AcceptedDraftTokens,
		CacheReadTokens: s.CacheUsage.ReadTokens(), CacheWriteTokens: s.CacheUsage.WriteTokens,
	}
	if got != ms {
		require.Equal(h.t, ms, got, "stats after step %d", step)
	}
	require.Equal(h.t, len(h.ref.RequestIDs()), len(h.ids))
	for _, id := range h.unread {
		h.checkUsage(id)
	}
	h.unread = h.unread[:0]
	for _, id := range h.ids {
		h.checkUsage(id)
	}
	m2r, r2m := map[int32]PageID{}, map[PageID]int32{}
	for _, id := range h.ids {
		r := h.ref.Request(uint64(id))
		require.NotNil(h.t, r, "request %d", id)
		tokens := h.m.Tokens(id)
		if !slices.Equal(r.Tokens, tokens) || r.Computed != h.m.Computed(id) || r.Running != h.m.Running(id) {
			require.Equal(h.t, fmt.Sprint(r.Tokens, r.Computed, r.Running),
				fmt.Sprint(tokens, h.m.Computed(id), h.m.Running(id)), "request %d: tokens, computed, running after step %d", id, step)
		}
		if !r.Running {
			continue
		}
		pages, start := h.m.Pages(id)
		require.Equal(h.t, r.Start, start, "request %d start", id)
		require.Len(h.t, pages, len(r.Pages), "request %d pages", id)
		for k, p := range pages {
			mp := r.Pages[k]
			if q, ok := m2r[mp]; ok && q != p || func() bool { q, ok := r2m[p]; return ok && q != mp }() {
				require.Failf(h.t, "page sharing differs", "after step %d: request %d page %d is %d here and %d in the model, "+
					"which already map to %d and %d", step, id, k, p, mp, m2r[mp], r2m[p])
			}
			m2r[mp], r2m[p] = p, mp
		}
		// The fake K/V of every computed token the request still holds.
		for t := start; t < h.m.Computed(id); t++ {
			page := pages[(t-start)/h.ps]
			if got, want := h.kv[int(page)*h.ps+(t-start)%h.ps], fakeKV(tokens[t], t); got != want {
				require.Failf(h.t, "wrong K/V", "after step %d: request %d token %d (%d) on page %d reads %#x, want %#x",
					step, id, t, tokens[t], page, got, want)
			}
		}
	}
}

func (h *mgrHarness) run(data []byte) {
	for i := 0; i+5 <= len(data); i += 5 {
		h.step(data[i], data[i+1], data[i+2], data[i+3], data[i+4])
		h.verify(i / 5)
	}
}

func mgrVariants() map[string]mgrHarnessConfig {
	return map[string]mgrHarnessConfig{
		"full":                {},
		"window-6":            {window: 6},
		"full-colliding-hash": {hash: func(_ uint64, t []int32) uint64 { return uint64(t[0] % 3) }},
		"window-9-colliding":  {window: 9, hash: func(uint64, []int32) uint64 { return 1 }},
		"full-spec":           {spec: true},
		"window-7-spec":       {window: 7, spec: true},
	}
}

func TestManagerMatchesModel(t *testing.T) {
	runs, steps := 150, 250
	if testing.Short() || raceEnabled {
		runs = 20
	}
	for name, hc := range mgrVariants() {
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(11, uint64(len(name))))
			var stats Stats
			for range runs {
				data := make([]byte, 5*steps)
				for i := range data {
					data[i] = byte(rng.Uint32())
				}
				h := newMgrHarness(t, hc)
				h.run(data)
				s := h.m.Stats()
				stats.Steps += s.Steps
				stats.Preemptions += s.Preemptions
				stats.PromptHitTokens += s.PromptHitTokens
				stats.EvictedPages += s.EvictedPages
				stats.CopiedPages += s.CopiedPages
				stats.WindowReleasedPages += s.WindowReleasedPages
				stats.ChainsCut += s.ChainsCut
				stats.InnerVictims += s.InnerVictims
				stats.DraftTokens += s.DraftTokens
				stats.AcceptedDraftTokens += s.AcceptedDraftTokens
			}
			// The workload must exercise what it claims to.
			require.Positive(t, stats.Steps)
			require.Positive(t, stats.Preemptions, "no preemption under pressure")
			require.Positive(t, stats.PromptHitTokens, "no prefix hit")
			require.Positive(t, stats.EvictedPages, "no eviction")
			require.Positive(t, stats.CopiedPages, "no copy-on-write")
			if hc.window > 0 {
				require.Positive(t, stats.WindowReleasedPages, "no window release")
			}
			if hc.spec {
				require.Positive(t, stats.AcceptedDraftTokens, "no accepted draft")
				require.Less(t, stats.AcceptedDraftTokens, stats.DraftTokens, "no rejected draft")
			}
			t.Logf("%d runs: %d steps, %d preemptions, %d hit tokens, %d evicted, %d copies, %d window-released, %d chains cut, %d inner victims",
				runs, stats.Steps, stats.Preemptions, stats.PromptHitTokens, stats.EvictedPages, stats.CopiedPages,
				stats.WindowReleasedPages, stats.ChainsCut, stats.InnerVictims)
		})
	}
}

// FuzzManager decodes the input into 5-byte commands (op, a, b, c, d; see
// mgrHarness.step) run on the Manager and the model, with the full check
// after each. The first byte picks the configuration. Every command is
// valid, so the fuzzer explores workloads, not the codec.
func FuzzManager(f *testing.F) {
	// cmds encodes commands written with the op kinds (mopAdd, ...).
	cmds := func(cfg byte, cs ...[5]byte) []byte {
		out := []byte{cfg}
		for _, c := range cs {
			out = append(out, byte(slices.Index(mopOf[:], int(c[0]))), c[1], c[2], c[3], c[4])
		}
		return out
	}
	// Two requests on one prompt: the second reuses the first's pages.
	f.Add(cmds(0, [5]byte{mopAdd, 0, 1, 15, 0}, [5]byte{mopStep, 0, 3, 6, 0}, [5]byte{mopStep, 0, 3, 6, 0},
		[5]byte{mopStep, 0, 3, 6, 0}, [5]byte{mopAdd, 0, 1, 15, 0}, [5]byte{mopStep, 0, 3, 6, 0}))
	// Fork, then both append into the shared partial page.
	f.Add(cmds(0, [5]byte{mopAdd, 1, 2, 5, 1}, [5]byte{mopStep, 1, 0, 6, 0}, [5]byte{mopStep, 1, 0, 6, 0},
		[5]byte{mopFork, 0, 0, 0, 0}, [5]byte{mopStep, 3, 0, 1, 0}, [5]byte{mopStep, 3, 0, 1, 0}))
	// Memory pressure: many long prompts, preemption, resume.
	var pressure [][5]byte
	for i := range byte(8) {
		pressure = append(pressure, [5]byte{mopAdd, i, i, 19, i}, [5]byte{mopStep, 0, 3, 6, i})
	}
	pressure = append(pressure, [5]byte{mopResume, 0, 0, 0, 0}, [5]byte{mopStep, 0, 3, 6, 1})
	f.Add(cmds(1, pressure...))
	// Sliding window with pins and eviction.
	f.Add(cmds(1, [5]byte{mopAdd, 0, 3, 19, 2}, [5]byte{mopStep, 1, 0, 6, 0}, [5]byte{mopStep, 1, 0, 6, 0},
		[5]byte{mopStep, 1, 0, 6, 0}, [5]byte{mopStep, 1, 0, 6, 0}, [5]byte{mopPin, 0, 3, 19, 0},
		[5]byte{mopRelease, 0, 0, 0, 0}, [5]byte{mopEvict, 3, 0, 0, 0}, [5]byte{mopUnpin, 0, 0, 0, 0}))
	variants := []mgrHarnessConfig{{}, {window: 6}, {hash: func(uint64, []int32) uint64 { return 1 }},
		{spec: true}, {window: 7, spec: true}}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		if len(data) > 1+5*300 {
			data = data[:1+5*300]
		}
		newMgrHarness(t, variants[int(data[0])%len(variants)]).run(data[1:])
	})
}
