package pagedkv

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHybridSpecEqualsAcceptedOnly is TestSpecEqualsAcceptedOnly on the
// four hybrid configs: random workloads (adds over shared prompts, forks,
// releases, preemption, resume, truncation, eviction, speculative steps
// with random accept counts) on a HybridManager and, in lockstep, on a twin
// that reserves only each step's known tokens and accepted drafts (after
// evicting what the speculative Reserve evicted for its drafts, the one
// trace drafts may leave). After every operation, in every group: tokens,
// computed counts, the first held token, page tables up to one renaming of
// the pool's pages, which pages are cached, the prefix each request's
// tokens match in the group's cache, every group's fake K/V, Audit, and
// the HybridStats (pool, counters and every group's numbers) but for the
// draft counters. A leaked page shows as a Stats or Audit difference.
func TestHybridSpecEqualsAcceptedOnly(t *testing.T) {
	t.Parallel()
	runs, ops := 25, 400
	if testing.Short() || raceEnabled {
		runs = 5
	}
	for name, groups := range hybridConfigs() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var drafts, accepted, copies, released, evicted int64
			for run := range runs {
				tw := &hybridTwins{t: t, rng: rand.New(rand.NewPCG(uint64(run), 4242)),
					spec: newHybridHarness(t, groups, 0), twin: newHybridHarness(t, groups, 0)}
				for op := range ops {
					tw.op()
					tw.check(op)
				}
				s := tw.spec.h.Stats()
				drafts, accepted, copies = drafts+s.DraftTokens, accepted+s.AcceptedDraftTokens, copies+s.CopiedPages
				released, evicted = released+s.WindowReleasedPages, evicted+s.EvictedPages
			}
			require.Positive(t, accepted)
			require.Less(t, accepted, drafts)
			require.Positive(t, copies)
			require.Positive(t, evicted)
			if len(groups) > 1 {
				require.Positive(t, released)
			}
			t.Logf("%d runs of %d ops: %d drafts, %d accepted, %d copies, %d window/chunk released, %d evicted",
				runs, ops, drafts, accepted, copies, released, evicted)
		})
	}
}

// hybridTwins drives two hybrid harnesses: spec runs speculative steps,
// twin the accepted tokens only. Both harnesses' ids are kept equal.
type hybridTwins struct {
	t          *testing.T
	rng        *rand.Rand
	spec, twin *hybridHarness
	ids        []RequestID
	next       RequestID
}

func (tw *hybridTwins) both(op string, f func(h *HybridManager) error) {
	tw.t.Helper()
	e1, e2 := f(tw.spec.h), f(tw.twin.h)
	require.Equal(tw.t, e1 == nil, e2 == nil, "%s: %v vs %v", op, e1, e2)
}

func (tw *hybridTwins) pick(running bool) (RequestID, bool) {
	var c []RequestID
	for _, id := range tw.ids {
		if !running || tw.spec.h.Running(id) {
			c = append(c, id)
		}
	}
	if len(c) == 0 {
		return 0, false
	}
	return c[tw.rng.IntN(len(c))], true
}

func (tw *hybridTwins) setIDs() { tw.spec.ids, tw.twin.ids = tw.ids, tw.ids }

func (tw *hybridTwins) op() {
	r := tw.rng
	defer tw.setIDs()
	switch k := r.IntN(20); {
	case k < 3:
		id := tw.next
		tw.next++
		prompt := promptOf(r.IntN(5), 1+r.IntN(22))
		var m1, m2 int
		tw.both("add", func(h *HybridManager) error {
			n, err := h.Add(id, Request{Prompt: prompt})
			m1, m2 = m2, n
			return err
		})
		require.Equal(tw.t, m1, m2, "add %d: hit", id)
		tw.ids = append(tw.ids, id)
	case k < 4:
		if p, ok := tw.pick(true); ok {
			id := tw.next
			tw.next++
			tw.both("fork", func(h *HybridManager) error { return h.Fork(p, id) })
			tw.ids = append(tw.ids, id)
		}
	case k < 5:
		if id, ok := tw.pick(false); ok {
			tw.both("release", func(h *HybridManager) error { return h.Release(id) })
			tw.ids = slices.DeleteFunc(slices.Clone(tw.ids), func(x RequestID) bool { return x == id })
		}
	case k < 6:
		if id, ok := tw.pick(true); ok {
			tw.both("preempt", func(h *HybridManager) error { return h.Preempt(id) })
		}
	case k < 7:
		if id, ok := tw.pick(false); ok && !tw.spec.h.Running(id) {
			var m1, m2 int
			tw.both("resume", func(h *HybridManager) error {
				n, err := h.Resume(id)
				m1, m2 = m2, n
				return err
			})
			require.Equal(tw.t, m1, m2, "resume %d: hit", id)
		}
	case k < 8:
		if id, ok := tw.pick(false); ok {
			n := max(0, len(tw.spec.h.Tokens(id))-r.IntN(7))
			tw.both("truncate", func(h *HybridManager) error { return h.Truncate(id, n) })
		}
	case k < 9:
		n := 1 + r.IntN(hhPages/2)
		require.Equal(tw.t, tw.spec.h.Evict(n), tw.twin.h.Evict(n), "evict %d", n)
	default:
		tw.step()
	}
}

// step runs a speculative step on spec and its accepted-only twin.
func (tw *hybridTwins) step() {
	r, t, spec, twin := tw.rng, tw.t, tw.spec.h, tw.twin.h
	ids, nt, drafts := stepDraw{minNew: 0, newSpan: 6, draftSpan: 5, spec: true}.draw(r, spec, tw.ids)
	if len(ids) == 0 {
		return
	}
	before := spec.Stats()
	p, err := spec.ReserveSpec(ids, nt, drafts)
	if err != nil {
		require.ErrorIs(t, err, ErrOutOfPages)
		require.Equal(t, before, spec.Stats(), "a failed ReserveSpec changed the HybridManager")
		victim := ids[r.IntN(len(ids))]
		tw.both("preempt", func(h *HybridManager) error { return h.Preempt(victim) })
		return
	}
	tw.spec.engine(p)
	accepted, sampled := make([]int32, len(ids)), make([]int32, len(ids))
	twinN := make([]int32, len(ids))
	for b, id := range ids {
		accepted[b] = int32(r.IntN(len(drafts[b]) + 1))
		sampled[b] = NoToken
		if spec.Computed(id)+int(nt[b]) == len(spec.Tokens(id)) {
			sampled[b] = int32(r.IntN(90))
		}
		twinN[b] = nt[b] + accepted[b]
	}
	require.NoError(t, spec.CommitSpec(accepted, sampled))

	if freed := spec.Stats().EvictionFreedPages - before.EvictionFreedPages; freed > 0 {
		// Evict(n) evicts until n pages are free: the twin's free count
		// (equal to spec's before the step) plus what spec's Reserve freed.
		require.Equal(t, int(freed), twin.Evict(twin.Stats().FreePages+int(freed)))
	}
	for b, id := range ids {
		require.NoError(t, twin.Extend(id, drafts[b][:accepted[b]]...))
	}
	tp, err := twin.Reserve(ids, twinN)
	require.NoError(t, err, "the accepted tokens alone did not fit")
	tw.twin.engine(tp)
	require.NoError(t, twin.Commit(sampled))
}

func (tw *hybridTwins) check(op int) {
	t, spec, twin := tw.t, tw.spec.h, tw.twin.h
	tw.spec.check(op) // Audit, every group's keep rule and fake K/V
	tw.twin.check(op)
	s1, s2 := spec.Stats(), twin.Stats()
	s1.DraftTokens, s1.AcceptedDraftTokens = 0, 0
	if !equalHybridStats(s1, s2) {
		require.Equal(t, s2, s1, "stats after op %d", op)
	}
	rename, back := map[PageID]PageID{}, map[PageID]PageID{}
	for _, id := range tw.ids {
		tokens := spec.Tokens(id)
		if !slices.Equal(twin.Tokens(id), tokens) || twin.Computed(id) != spec.Computed(id) || twin.Running(id) != spec.Running(id) {
			require.Failf(t, "request differs", "op %d: request %d: spec %v computed %d running %v; twin %v computed %d running %v",
				op, id, tokens, spec.Computed(id), spec.Running(id), twin.Tokens(id), twin.Computed(id), twin.Running(id))
		}
		for g := range spec.NumGroups() {
			p1, st1 := spec.Pages(g, id)
			p2, st2 := twin.Pages(g, id)
			if st1 != st2 || len(p1) != len(p2) {
				require.Failf(t, "pages differ", "op %d: request %d group %d: spec start %d pages %v; twin start %d pages %v",
					op, id, g, st1, p1, st2, p2)
			}
			for k := range p1 {
				q, ok := rename[p1[k]]
				q2, ok2 := back[p2[k]]
				if ok && q != p2[k] || ok2 && q2 != p1[k] {
					require.Failf(t, "sharing differs", "op %d: request %d group %d page %d: %d vs %d", op, id, g, k, p1[k], p2[k])
				}
				rename[p1[k]], back[p2[k]] = p2[k], p1[k]
				if twin.core.groups[g].cache.Cached(p2[k]) != spec.core.groups[g].cache.Cached(p1[k]) {
					require.Failf(t, "cached differs", "op %d: request %d group %d page %d", op, id, g, k)
				}
			}
			if len(tokens) > 0 {
				c1, c2 := spec.core.groups[g].cache, twin.core.groups[g].cache
				m1, _ := c1.Match(nil, c1.Key(Namespace{}), tokens, len(tokens)/hhPageSize)
				m2, _ := c2.Match(nil, c2.Key(Namespace{}), tokens, len(tokens)/hhPageSize)
				if len(m1) != len(m2) {
					require.Failf(t, "cached prefix differs", "op %d: request %d group %d: %d vs %d pages", op, id, g, len(m1), len(m2))
				}
			}
		}
	}
}

func equalHybridStats(a, b HybridStats) bool {
	return a.Stats == b.Stats && slices.Equal(a.Groups, b.Groups)
}

// TestNewHybridBad: every bad hybrid config is refused with ErrBadConfig
// and a message naming the bad value.
func TestNewHybridBad(t *testing.T) {
	full := LayerGroup{Kind: FullAttention, NumLayers: 2}
	base := Config{NumPages: 16, PageSize: 4}
	for _, c := range []struct {
		cfg  HybridConfig
		want string
	}{
		{HybridConfig{Config: Config{NumPages: 16, PageSize: 4, WindowTokens: 64}, Groups: []LayerGroup{full}}, "WindowTokens = 64"},
		{HybridConfig{Config: base}, "no groups"},
		{HybridConfig{Config: base, Groups: []LayerGroup{full, {Kind: SlidingAttention, WindowTokens: 8, NumLayers: 1}}}, "groups[1] has 1 layers"},
		{HybridConfig{Config: base, Groups: []LayerGroup{full, {Kind: ChunkedAttention, ChunkTokens: 6, NumLayers: 2}}}, "ChunkTokens = 6"},
		{HybridConfig{Config: base, Groups: []LayerGroup{{Kind: SlidingAttention, NumLayers: 2}}}, "WindowTokens = 0"},
		{HybridConfig{Config: base, Groups: []LayerGroup{{Kind: 7, NumLayers: 2}}}, "Kind = 7"},
		{HybridConfig{Config: base, Groups: []LayerGroup{{Kind: FullAttention, WindowTokens: 5, NumLayers: 2}}}, "WindowTokens = 5"},
		{HybridConfig{Config: Config{NumPages: 0, PageSize: 4}, Groups: []LayerGroup{full}}, "NumPages = 0"},
		{HybridConfig{Config: Config{NumPages: 16}, Groups: []LayerGroup{{Kind: ChunkedAttention, ChunkTokens: 8, NumLayers: 2}}}, "page size 0"},
	} {
		h, err := NewHybrid(c.cfg)
		require.Nil(t, h)
		require.ErrorIs(t, err, ErrBadConfig, "%+v", c.cfg)
		require.Contains(t, err.Error(), c.want)
	}
}
