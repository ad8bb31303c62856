package pagedkv

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/layergroup"
)

// Every kind of group in one model: state groups live in the core (their
// slots are pages of the pool, group_state.go), indexer and shared-KV
// groups above it (group_indexer.go), mapped to a target in the core's
// configured-index space, where state groups sit between attention groups.

// allKindsConfigs are test-scale models that mix state groups with groups
// that own no pages.
func allKindsConfigs() []struct {
	name   string
	groups []LayerGroup
} {
	st := stateGroup()
	full := LayerGroup{Kind: FullAttention, NumLayers: 1}
	mla := LayerGroup{Kind: MLAAttention, NumLayers: 1}
	idx := func(target int) LayerGroup {
		return LayerGroup{Kind: IndexerAttention, Target: target, NumLayers: 1, IndexerHeadDim: 128, IndexerQuantBlock: 128}
	}
	shared := func(target int) LayerGroup { return LayerGroup{Kind: SharedKVAttention, Target: target, NumLayers: 2} }
	return []struct {
		name   string
		groups []LayerGroup
	}{
		// Qwen3-Next-like (3 Gated DeltaNet : 1 full) with layers that read
		// the full layers' KV.
		{"state3-full-sharedkv", []LayerGroup{st, st, st, full, shared(3)}},
		// Kimi-Linear-like (KDA state layers beside MLA layers), with a
		// DeepSeek V3.2 indexer on the MLA group.
		{"state3-mla-indexer", []LayerGroup{st, st, st, mla, idx(3)}},
		// Every kind at once, state groups between the attention groups,
		// so an alias target's index is not its place among the core's
		// attention groups.
		{"every-kind", []LayerGroup{st, full, st, mla, st, shared(1), idx(3), shared(3)}},
	}
}

// checkAllKindsPlan checks a reserved step's plan of a model of groups:
// one Plan per configured group, in config order; a state group's has a
// slot per request and no indexer layout, a shared-KV group's is its
// target's Plan, an indexer group's has its MLA group's page arrays and
// its layout, and an attention group's has neither slots nor a layout.
func checkAllKindsPlan(t *testing.T, groups []LayerGroup, p *HybridPlan) {
	t.Helper()
	require.Len(t, p.Groups, len(groups))
	for g, s := range groups {
		gp := p.Groups[g]
		switch s.Kind {
		case StateLayers:
			require.Len(t, gp.StateIndices, len(p.Requests), "state group %d", g)
			require.Nil(t, gp.Indexer, "state group %d", g)
		case SharedKVAttention:
			require.Same(t, p.Groups[s.Target], gp, "shared-KV group %d's Plan is not its target %d's", g, s.Target)
		case IndexerAttention:
			checkIndexerPlan(t, p, g, s.Target)
		default:
			require.Nil(t, gp.StateIndices, "attention group %d", g)
			require.Nil(t, gp.Indexer, "attention group %d", g)
		}
	}
}

// TestStateAndAliasGroupsMatchModel runs TestStateGroupsMatchModel's random
// operations and slow reference (checkpoints published, hit, restored and
// evicted; every step reads the state of exactly the request's computed
// tokens; Audit after every operation) on models that hold state groups
// and indexer or shared-KV groups together, in lockstep with the same
// model without the groups that own no pages: the pool, every owning
// group's numbers, the fake engine's state pages, the step's page and
// slot arrays and its copies are equal after every operation; each alias
// group's pages are its target's, its numbers zero but its kind, and its
// Plan its target's (checkAllKindsPlan).
func TestStateAndAliasGroupsMatchModel(t *testing.T) {
	t.Parallel()
	runs, ops := 2, 500
	if testing.Short() || raceEnabled {
		runs, ops = 2, 80
	}
	var hits, restores, published, evicts int
	for _, c := range allKindsConfigs() {
		groups := c.groups
		owners := groups[:layergroup.NumOwners(groups)]
		require.Equal(t, HybridConfig{Groups: owners}.AllocBytes(), HybridConfig{Groups: groups}.AllocBytes(), c.name)
		for run := range runs {
			every := []int{0, 8}[run%2]
			x := newStateModelOf(t, uint64(run), every, groups)
			y := newStateModelOf(t, uint64(run), every, owners)
			require.Equal(t, len(groups), x.h.NumGroups(), c.name)
			for g := range groups {
				require.Equal(t, groups[g], x.h.Group(g), "%s: group %d", c.name, g)
			}
			var xp, yp *HybridPlan
			x.onPlan = func(p *HybridPlan) { checkAllKindsPlan(t, groups, p); xp = p }
			y.onPlan = func(p *HybridPlan) { yp = p }
			for op := range ops {
				xp, yp = nil, nil
				x.op()
				y.op()
				x.compare(op)
				y.compare(op)
				require.Equal(t, yp == nil, xp == nil, "%s op %d: a step reserved in one model only", c.name, op)
				if xp != nil {
					require.Equal(t, yp.Copies, xp.Copies, "%s op %d: copies", c.name, op)
					for g := range owners {
						a, b := xp.Groups[g], yp.Groups[g]
						require.True(t, slices.Equal(a.KVPageIndices, b.KVPageIndices) && slices.Equal(a.KVIndptr, b.KVIndptr) &&
							slices.Equal(a.StateIndices, b.StateIndices), "%s op %d: group %d's arrays differ", c.name, op, g)
					}
				}
				sx, sy := x.h.Stats(), y.h.Stats()
				require.Equal(t, sy.Stats, sx.Stats, "%s op %d: the pool differs", c.name, op)
				require.Equal(t, sy.Groups, sx.Groups[:len(owners)], "%s op %d", c.name, op)
				for g := len(owners); g < len(groups); g++ {
					require.Equal(t, GroupStats{Kind: groups[g].Kind}, sx.Groups[g], "%s op %d: group %d owns nothing", c.name, op, g)
				}
				require.Equal(t, y.pages, x.pages, "%s op %d: the state pages differ", c.name, op)
				for id := range x.reqs {
					for g := range groups {
						pa, sa := x.h.Pages(g, id)
						pb, sb := y.h.Pages(layergroup.Owner(groups, g), id)
						if !slices.Equal(pa, pb) || sa != sb {
							t.Fatalf("%s op %d: request %d group %d: pages %v from %d, without aliases %v from %d", c.name, op, id, g, pa, sa, pb, sb)
						}
					}
				}
			}
			hits, restores, published, evicts = hits+x.hits, restores+x.restores, published+x.published, evicts+x.evicts
		}
	}
	require.Positive(t, hits)
	require.Positive(t, restores)
	require.Positive(t, published)
	require.Positive(t, evicts)
	t.Logf("%d configs x %d runs x %d ops: %d checkpoint hits, %d restored steps, %d published, %d evicted",
		len(allKindsConfigs()), runs, ops, hits, restores, published, evicts)
}

// TestStateAndAliasGroupsRefused: a state group is no alias target, every alias
// follows the state groups too, and a model with state groups refuses
// tiers whether or not an indexer's pages would travel in them; each
// refusal is ErrBadConfig naming the value.
func TestStateAndAliasGroupsRefused(t *testing.T) {
	st, full, mla := stateGroup(), LayerGroup{Kind: FullAttention, NumLayers: 1}, LayerGroup{Kind: MLAAttention, NumLayers: 1}
	idx := LayerGroup{Kind: IndexerAttention, Target: 1, NumLayers: 1, IndexerHeadDim: 128, IndexerQuantBlock: 128}
	cfg := Config{NumPages: 32, PageSize: 4}
	tiered := Config{NumPages: 32, PageSize: 4, Tiers: TierConfig{HostPages: 8}}
	tiered.Tiers.Format = tierFormat(4)
	tiered.Tiers.Format.IndexerLayers, tiered.Tiers.Format.IndexerTokenBytes = 1, idx.IndexerLayout(4).TokenBytes()
	tiered.Tiers.Format.Layers = 5 // the owners' layers: 1 each (shared) or 2 (their own)
	for _, c := range []struct {
		name string
		cfg  HybridConfig
		want string
	}{
		{"shared state", HybridConfig{Config: cfg, Groups: []LayerGroup{st, full, {Kind: SharedKVAttention, Target: 0, NumLayers: 1}}},
			"groups[2] (shared_kv) has Target = 0, a state group"},
		{"indexer of a state", HybridConfig{Config: cfg, Groups: []LayerGroup{st, mla, {Kind: IndexerAttention, Target: 0, NumLayers: 1, IndexerHeadDim: 128, IndexerQuantBlock: 128}}},
			"groups[2] (indexer) has Target = 0, a state group"},
		{"state after an alias", HybridConfig{Config: cfg, Groups: []LayerGroup{mla, {Kind: IndexerAttention, Target: 0, NumLayers: 1, IndexerHeadDim: 128, IndexerQuantBlock: 128}, st}},
			"groups[2] (state) follows groups[1] (indexer)"},
		{"alias with a state shape", HybridConfig{Config: cfg, Groups: []LayerGroup{st, full, {Kind: SharedKVAttention, Target: 1, NumLayers: 1, State: testStateShape}}},
			"shared_kv group with a State shape"},
		{"tiers layers", HybridConfig{Config: tiered, Groups: []LayerGroup{st, mla, idx}}, "Tiers.Format.Layers = 5, want 1"},
	} {
		_, err := NewHybrid(c.cfg)
		require.ErrorIs(t, err, ErrBadConfig, c.name)
		require.ErrorContains(t, err, c.want, c.name)
	}
}
