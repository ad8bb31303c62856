package pagedkv

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/reference"
)

// TestHybridMatchesModel runs random workloads (adds over shared prompts,
// chunked prefill, decode, speculative steps with random accept counts,
// forks, truncation, preemption, resume, aborts) on the four hybrid configs
// and, in lockstep, on reference.HybridModel (one reference.ManagerModel
// per group with the group's rule written from the attention definitions,
// admission on the minimum every group's cache serves). After every
// operation: the same errors and hits, tokens and computed counts, in every
// group each request's first held token, its page table up to a renaming
// of pages, which of its pages are cached, and the group's counters
// (cached, published, window/chunk released and copied pages); the pool's
// token and step counters; plus TestHybridMatchesRules' checks (Audit, the
// keep rule, every group's fake K/V). Some operations evict every idle
// cached page of one group, so groups come to serve different prefixes and
// the hit is their minimum. The model's groups have separate pools, so the
// pool is large enough that a step never evicts (each group's evicted
// pages are compared with the model's).
func TestHybridMatchesModel(t *testing.T) {
	t.Parallel()
	runs, ops := 12, 600
	if testing.Short() || raceEnabled { // .ci/run runs the full count without -race
		runs = 2
	}
	for name, groups := range hybridConfigs() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var hits, released, accepted, copies, evicted int64
			var pinned, partial, capped int
			differ := false
			for run := range runs {
				// A third of the runs publish KV events: after every
				// operation each group's reconstructed set must equal the
				// group's cache.
				x := newHybridModelHarness(t, groups, uint64(run), run%3 == 0)
				for op := range ops {
					x.op()
					x.compare(op)
					x.checkEvents(op)
				}
				x.checkEventsSeen()
				pinned, partial, capped = pinned+x.pinned, partial+x.partial, capped+x.capped
				s := x.hh.h.Stats()
				hits, released, accepted, copies = hits+s.PromptHitTokens, released+s.WindowReleasedPages,
					accepted+s.AcceptedDraftTokens, copies+s.CopiedPages
				evicted += s.EvictedPages
				for g := range s.Groups {
					if g > 0 && s.Groups[g].ServableTokens != s.Groups[0].ServableTokens {
						differ = true
					}
				}
			}
			require.Positive(t, hits)
			require.Positive(t, accepted)
			require.Positive(t, copies)
			require.Positive(t, evicted)
			require.Positive(t, pinned)
			require.Positive(t, capped, "no pin reached MaxPinnedPages")
			if len(groups) > 1 {
				require.Positive(t, released)
				require.Positive(t, partial, "no pin covered less than group 0 holds")
				require.True(t, differ, "no group's cache ever served another prefix than group 0's")
			}
			t.Logf("%d runs of %d ops: %d hit tokens, %d window/chunk released, %d accepted drafts, %d copies, %d evicted; pins: %d made (%d partial), %d capped",
				runs, ops, hits, released, accepted, copies, evicted, pinned, partial, capped)
		})
	}
}

// hmStride bounds a request's pages in a step (its padded table's row):
// the workload's requests stay far below it, the pool never runs out.
const hmPages, hmMaxPinned, hmStride = 4096, 4, 128

type hybridModelHarness struct {
	t     *testing.T
	rng   *rand.Rand
	hh    *hybridHarness
	model *reference.HybridModel
	next  RequestID
	ev    *hybridEvents // nil: no KV events
	pins  []PinID       // live pins (the model numbers them alike)
	// outcomes of pins: made, partial (covering less than group 0
	// alone holds), refused at the cap
	pinned, partial, capped int
}

func newHybridModelHarness(t *testing.T, groups []LayerGroup, seed uint64, withEvents bool) *hybridModelHarness {
	cfg := HybridConfig{Config: Config{NumPages: hmPages, PageSize: hhPageSize, HashSeed: 5, MaxPinnedPages: hmMaxPinned,
		BlockTablesStride: hmStride}, Groups: groups}
	var ev *hybridEvents
	if withEvents {
		ev = newHybridEvents(t, groups, hmPages, hhPageSize, 0)
		cfg.CacheEvents = ev.rec
	}
	h, err := NewHybrid(cfg)
	require.NoError(t, err)
	var specs []reference.GroupModelSpec
	for _, g := range groups {
		specs = append(specs, reference.GroupModelSpec{Kind: reference.GroupModelKind(g.Kind), Window: g.WindowTokens, Chunk: g.ChunkTokens})
	}
	return &hybridModelHarness{t: t, rng: rand.New(rand.NewPCG(seed, 31)), ev: ev,
		hh:    &hybridHarness{t: t, h: h, kv: make([]uint64, hmPages*hhPageSize)},
		model: reference.NewHybridModel(hmPages, hhPageSize, hmMaxPinned, specs)}
}

func (x *hybridModelHarness) same(what string, err, merr error) {
	x.t.Helper()
	if (err == nil) != (merr == nil) || err != nil && errors.Is(err, ErrBadArgument) != errors.Is(merr, reference.ErrMgrBadArgument) {
		require.Failf(x.t, "errors differ", "%s: %v, model %v", what, err, merr)
	}
}

func (x *hybridModelHarness) pick(running bool) (RequestID, bool) {
	var c []RequestID
	for _, id := range x.hh.ids {
		if !running || x.hh.h.Running(id) {
			c = append(c, id)
		}
	}
	if len(c) == 0 {
		return 0, false
	}
	return c[x.rng.IntN(len(c))], true
}

func (x *hybridModelHarness) release(id RequestID) {
	x.same("release", x.hh.h.Release(id), x.model.Release(uint64(id)))
	if !x.hh.h.Has(id) {
		x.checkUsage(id) // kept after Release until read
	}
	x.hh.ids = slices.DeleteFunc(x.hh.ids, func(y RequestID) bool { return y == id })
}

func (x *hybridModelHarness) op() {
	r, h, m, t := x.rng, x.hh.h, x.model, x.t
	// Keep the pool far from full: few requests, none very long.
	for _, id := range slices.Clone(x.hh.ids) {
		if len(h.Tokens(id)) > 90 {
			x.release(id)
		}
	}
	if len(x.hh.ids) > 10 {
		id, _ := x.pick(false)
		x.release(id)
	}
	switch k := r.IntN(22); {
	case k < 4:
		id := x.next
		x.next++
		prompt := promptOf(r.IntN(6), 1+r.IntN(30))
		got, err := h.Add(id, Request{Prompt: prompt})
		want, merr := m.Add(uint64(id), "", prompt, 0, false)
		x.same("add", err, merr)
		require.Equal(t, want, got, "add %d: hit", id)
		x.hh.ids = append(x.hh.ids, id)
	case k < 5:
		if p, ok := x.pick(true); ok {
			id := x.next
			x.next++
			x.same("fork", h.Fork(p, id), m.Fork(uint64(p), uint64(id)))
			x.hh.ids = append(x.hh.ids, id)
		}
	case k < 6:
		if id, ok := x.pick(false); ok {
			x.release(id)
		}
	case k < 7:
		if id, ok := x.pick(true); ok {
			x.same("preempt", h.Preempt(id), m.Preempt(uint64(id)))
		}
	case k < 8:
		if id, ok := x.pick(false); ok && !h.Running(id) {
			got, err := h.Resume(id)
			want, merr := m.Resume(uint64(id))
			x.same("resume", err, merr)
			require.Equal(t, want, got, "resume %d: hit", id)
		}
	case k < 9:
		if id, ok := x.pick(false); ok {
			n := max(0, len(h.Tokens(id))-r.IntN(10))
			x.same("truncate", h.Truncate(id, n), m.Truncate(uint64(id), n))
		}
	case k < 10:
		if id, ok := x.pick(false); ok {
			tokens := promptOf(r.IntN(6), 1+r.IntN(4))
			x.same("extend", h.Extend(id, tokens...), m.Extend(uint64(id), tokens))
		}
	case k < 11:
		// Evict every idle cached page of one group (the others' stay):
		// the same pages in the model whatever its eviction order, and
		// from then on the groups serve different prefixes.
		g := r.IntN(h.NumGroups())
		got := h.core.groups[g].cache.Evict(hmPages)
		h.core.groups[g].afterChange()
		require.Equal(t, m.Group(g).Evict(hmPages), got, "evict group %d", g)
	case k < 12:
		x.pin()
	case k < 13:
		if len(x.pins) > 0 {
			i := r.IntN(len(x.pins))
			x.same("unpin", h.Unpin(x.pins[i]), m.Unpin(uint64(x.pins[i])))
			x.pins = slices.Delete(x.pins, i, i+1)
		}
	default:
		x.step()
	}
}

// pin pins a prompt the adds draw (often cached, in some groups only after
// an eviction op) in both, or unpins a pin already gone: the same errors,
// the same pin and covered tokens.
func (x *hybridModelHarness) pin() {
	r, h, m, t := x.rng, x.hh.h, x.model, x.t
	if len(x.pins) > 0 && r.IntN(8) == 0 {
		gone := x.pins[0] + 1000
		err := h.Unpin(gone)
		require.ErrorIs(t, err, ErrUnknownPin)
		x.same("unpin unknown", err, m.Unpin(uint64(gone)))
		return
	}
	tokens := promptOf(r.IntN(6), 1+r.IntN(30))
	id, n, err := h.Pin(Namespace{}, tokens)
	mid, mn, merr := m.Pin("", tokens)
	x.same("pin", err, merr)
	switch {
	case errors.Is(merr, reference.ErrMgrNotCached):
		require.ErrorIs(t, err, ErrNotCached)
	case errors.Is(merr, reference.ErrMgrPinLimit):
		require.ErrorIs(t, err, ErrPinLimit)
		x.capped++
	case merr == nil:
		x.pinned++
		if g0, _ := h.core.groups[0].cache.Match(nil, h.core.groups[0].cache.Key(Namespace{}), tokens, len(tokens)/hhPageSize); len(g0)*hhPageSize > n {
			x.partial++
		}
		require.Equal(t, [2]uint64{mid, uint64(mn)}, [2]uint64{uint64(id), uint64(n)}, "pin %v", tokens)
		x.pins = append(x.pins, id)
	}
}

func (x *hybridModelHarness) step() {
	r, h, m, t := x.rng, x.hh.h, x.model, x.t
	ids, nt, drafts := stepDraw{minNew: 1, newSpan: 9, draftSpan: 5, spec: r.IntN(2) == 0}.draw(r, h, x.hh.ids)
	if len(ids) == 0 {
		return
	}
	u := make([]uint64, len(ids))
	for i, id := range ids {
		u[i] = uint64(id)
	}
	p, err := h.ReserveSpec(ids, nt, drafts)
	mcopies, merr := m.ReserveSpec(u, nt, drafts)
	x.same("reserve", err, merr)
	require.NoError(t, err, "the pool is sized never to run out")
	require.Len(t, p.Copies, mcopies, "copy-on-write copies over every group")
	x.hh.engine(p)
	if r.IntN(10) == 0 {
		x.same("abort", h.Abort(), m.Abort())
		return
	}
	accepted, sampled := drawCommit(r, h, ids, nt, drafts)
	x.same("commit", h.CommitSpec(accepted, sampled), m.CommitSpec(accepted, sampled))
}

// checkUsage compares request id's CacheUsage with the model's: reads of
// the prefix every group serves (from the device: no tiers here), writes
// of the group that wrote the most.
func (x *hybridModelHarness) checkUsage(id RequestID) {
	x.t.Helper()
	u, ok := x.hh.h.CacheUsage(id)
	read, write, mok := x.model.Usage(uint64(id))
	if want := (CacheUsage{DeviceReadTokens: read, WriteTokens: write}); ok != mok || u != want {
		require.Failf(x.t, "cache usage differs", "request %d: %+v (%v), model %+v (%v)", id, u, ok, want, mok)
	}
}

func (x *hybridModelHarness) compare(op int) {
	t, h, m := x.t, x.hh.h, x.model
	x.hh.check(op) // Audit, keep rule, every group's fake K/V
	s := h.Stats()
	ms := m.Group(0).Stats()
	for _, id := range x.hh.ids {
		x.checkUsage(id)
	}
	pool := [][2]int64{{s.PromptHitTokens, ms.PromptHitTokens}, {s.ComputedTokens, ms.ComputedTokens}, {s.Steps, ms.Steps},
		{s.CacheUsage.ReadTokens(), ms.CacheReadTokens},
		{s.DraftTokens, ms.DraftTokens}, {s.AcceptedDraftTokens, ms.AcceptedDraftTokens}, {s.Preemptions, ms.Preemptions},
		{s.ResumeHitTokens, ms.ResumeHitTokens}}
	for i, c := range pool {
		if c[0] != c[1] {
			require.Failf(t, "pool counter differs", "op %d: counter %d: %d, model %d", op, i, c[0], c[1])
		}
	}
	for g := range h.NumGroups() {
		mg := m.Group(g)
		gs, mgs := s.Groups[g], mg.Stats()
		if int64(gs.CachedPages) != int64(mgs.CachedPages) || gs.PublishedPages != mgs.PublishedPages ||
			gs.WindowReleasedPages != mgs.WindowReleasedPages || gs.CopiedPages != mgs.CopiedPages || gs.EvictedPages != mgs.EvictedPages ||
			int64(gs.PinnedPages) != int64(mgs.PinnedPages) {
			require.Failf(t, "group counters differ", "op %d group %d: cached %d published %d released %d copied %d pinned %d; model %d %d %d %d %d (%d pages evicted)",
				op, g, gs.CachedPages, gs.PublishedPages, gs.WindowReleasedPages, gs.CopiedPages, gs.PinnedPages,
				mgs.CachedPages, mgs.PublishedPages, mgs.WindowReleasedPages, mgs.CopiedPages, mgs.PinnedPages, s.EvictedPages)
		}
		rename, back := map[PageID]int32{}, map[int32]PageID{}
		for _, id := range x.hh.ids {
			mr := mg.Request(uint64(id))
			require.NotNil(t, mr, "op %d: model lost request %d", op, id)
			if !slices.Equal(h.Tokens(id), mr.Tokens) || h.Computed(id) != mr.Computed || h.Running(id) != mr.Running {
				require.Failf(t, "request differs", "op %d group %d request %d: %v computed %d running %v; model %v %d %v",
					op, g, id, h.Tokens(id), h.Computed(id), h.Running(id), mr.Tokens, mr.Computed, mr.Running)
			}
			if !mr.Running {
				continue
			}
			pages, start := h.Pages(g, id)
			if start != mr.Start || len(pages) != len(mr.Pages) {
				require.Failf(t, "pages differ", "op %d group %d request %d: start %d pages %v; model start %d pages %v",
					op, g, id, start, pages, mr.Start, mr.Pages)
			}
			for k, p := range pages {
				q, ok := rename[p]
				q2, ok2 := back[mr.Pages[k]]
				if ok && q != mr.Pages[k] || ok2 && q2 != p {
					require.Failf(t, "sharing differs", "op %d group %d request %d page %d: %d vs model %d", op, g, id, k, p, mr.Pages[k])
				}
				rename[p], back[mr.Pages[k]] = mr.Pages[k], p
				if h.core.groups[g].cache.Cached(p) != mg.CachedPage(mr.Pages[k]) {
					require.Failf(t, "cached differs", "op %d group %d request %d page %d", op, g, id, k)
				}
			}
		}
	}
}
