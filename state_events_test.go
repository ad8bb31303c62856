package pagedkv

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/internal/vllmwire"
	"github.com/pagedkv/pagedkv/kvindex"
	"github.com/pagedkv/pagedkv/layergroup"
)

// TestStateGroupEventsMatchModel runs TestStateGroupsMatchModel's random
// operations with KV events, on the 3 state : 1 full model and on models
// with indexer and shared-KV groups, and after every operation decodes the
// stream twice (internal/vllmwire, kvindex) and checks it against the
// slow reference: each state group's announced blocks are exactly the
// model's checkpoints (each named by the chain hash of its prefix, its
// token_ids the prefix's last page, its parent the chain hash before it),
// each attention group's are its cache's, every BlockStored carries its
// group's group_idx and kv_cache_spec_kind ("mamba" for a state group),
// no event names a group that owns no pages, and kvindex's Match of a
// prompt (all but its last token) is exactly the hit the next Add or
// Resume of it returns.
func TestStateGroupEventsMatchModel(t *testing.T) {
	t.Parallel()
	configs := []struct {
		name   string
		groups []LayerGroup
	}{{"state3-full", []LayerGroup{stateGroup(), {Kind: FullAttention, NumLayers: 1}, stateGroup(), stateGroup()}}}
	for _, c := range allKindsConfigs() {
		configs = append(configs, struct {
			name   string
			groups []LayerGroup
		}{c.name, c.groups})
	}
	runs, ops := 4, 500
	if testing.Short() || raceEnabled {
		runs, ops = 2, 300
	}
	for _, c := range configs {
		t.Run(c.name, func(t *testing.T) {
			var predicted, hits, stored, removed int
			for run := range runs {
				s := newStateEvents(t, c.groups)
				x := newStateModelWith(t, uint64(run), []int{0, 8, 12}[run%3], c.groups, s.rec)
				x.predict = func(ns string, tokens []int32) int {
					predicted++
					if len(tokens) <= 1 {
						return 0
					}
					m := s.ix.Match(nil, Namespace{Salt: ns}, tokens[:len(tokens)-1])[0]
					if m > 0 {
						hits++
					}
					return m
				}
				for op := range ops {
					x.op()
					x.compare(op)
					s.check(x, fmt.Sprintf("run %d op %d", run, op))
				}
				stored, removed = stored+s.stored, removed+s.removed
			}
			t.Logf("%d admissions predicted by kvindex, %d hits; %d checkpoint blocks stored, %d removed", predicted, hits, stored, removed)
			require.Positive(t, hits)
			require.Positive(t, stored)
			require.Positive(t, removed)
		})
	}
}

// stateEvents is a HybridManager's Recorder and what two subscribers
// rebuild from its stream.
type stateEvents struct {
	t               *testing.T
	groups          []LayerGroup // the groups that own pages: each has a group_idx
	rec             *events.Recorder
	q               *events.Queue
	enc             *events.Encoder
	sets            vllmwire.Groups
	ix              *kvindex.Index
	rep             int
	stored, removed int // state groups' checkpoint blocks
}

func newStateEvents(t *testing.T, groups []LayerGroup) *stateEvents {
	owners := groups[:layergroup.NumOwners(groups)]
	rec, q := newHybridRecorder(t, owners, stateModelPages, stateModelPageSize, 0)
	ix, err := kvindex.New(kvindex.Config{PageSize: stateModelPageSize, Seed: 7})
	require.NoError(t, err)
	return &stateEvents{t: t, groups: owners, rec: rec, q: q, enc: events.NewEncoder(), sets: vllmwire.Groups{}, ix: ix, rep: ix.AddReplica("r")}
}

func (s *stateEvents) check(x *stateModel, what string) {
	t := s.t
	require.True(t, s.rec.Flush(), "%s: the event queue is full", what)
	// The model's checkpoints by chain hash.
	ckpts := map[uint64]*stCkpt{}
	for _, c := range x.ckpts {
		chain := s.ix.Hashes(nil, Namespace{Salt: c.ns}, c.prefix)
		ckpts[chain[len(chain)-1]] = c
	}
	for b := s.q.TryNext(); b != nil; b = s.q.TryNext() {
		payload := s.enc.AppendBatch(nil, b, 0)
		s.q.Done(b)
		dec, err := vllmwire.Decode(payload)
		require.NoError(t, err, what)
		for _, ev := range dec.Events {
			if ev.Type == "AllBlocksCleared" {
				continue
			}
			require.NotNil(t, ev.GroupIdx, what)
			g := int(*ev.GroupIdx)
			require.Less(t, g, len(s.groups), "%s: group_idx %d of a group that owns no pages", what, g)
			if ev.Type == "BlockRemoved" {
				if s.groups[g].Kind == StateLayers {
					s.removed += len(ev.BlockHashes)
				}
				continue
			}
			wk, _ := KVEventSpec(s.groups[g])
			require.Equal(t, wk, *ev.SpecKind, "%s: group %d's kv_cache_spec_kind", what, g)
			if s.groups[g].Kind != StateLayers {
				continue
			}
			// A checkpoint block: its tokens and parent are its prefix's.
			require.Len(t, ev.TokenIDs, len(ev.BlockHashes)*x.ps, what)
			for i, hv := range ev.BlockHashes {
				c, ok := ckpts[hv]
				require.True(t, ok, "%s: group %d stored checkpoint %#x, which the model does not hold", what, g, hv)
				k := c.tokens / x.ps
				for j, tok := range ev.TokenIDs[i*x.ps : (i+1)*x.ps] {
					require.Equal(t, int64(c.prefix[(k-1)*x.ps+j]), tok, "%s: checkpoint %#x token_ids", what, hv)
				}
				if i == 0 {
					chain := s.ix.Hashes(nil, Namespace{Salt: c.ns}, c.prefix)
					if k == 1 {
						require.Nil(t, ev.ParentBlockHash, what)
					} else {
						require.NotNil(t, ev.ParentBlockHash, what)
						require.Equal(t, chain[k-2], *ev.ParentBlockHash, "%s: checkpoint %#x's parent", what, hv)
					}
				}
			}
			s.stored += len(ev.BlockHashes)
		}
		require.NoError(t, s.sets.Apply(dec), what)
		kb, err := kvindex.DecodeBatch(payload)
		require.NoError(t, err, what)
		require.NoError(t, s.ix.Apply(s.rep, &kb), what)
	}
	// Every group's announced set: a state group's the model's
	// checkpoints, an attention group's its cache.
	want := append([]uint64{}, slices.Sorted(maps.Keys(ckpts))...)
	for g, spec := range s.groups {
		if spec.Kind != StateLayers {
			want := s.cacheHashes(x.h, g)
			require.Equal(t, want, setHashes(s.sets[int64(g)]), "%s: group %d's announced pages", what, g)
			continue
		}
		require.Equal(t, want, setHashes(s.sets[int64(g)]), "%s: state group %d's announced checkpoints", what, g)
		got := s.ix.GroupBlocks(s.rep, g)
		if len(want) > 0 || len(got) > 0 {
			require.Equal(t, want, got, "%s: state group %d's indexed checkpoints", what, g)
		}
	}
}

// cacheHashes are attention group g's cached pages' hashes, sorted.
func (s *stateEvents) cacheHashes(h *HybridManager, g int) []uint64 {
	out := h.core.groups[h.core.attnIndex(g)].cache.AppendHashes([]uint64{})
	slices.Sort(out)
	return out
}

func setHashes(s vllmwire.Set) []uint64 {
	out := []uint64{}
	for hv := range s {
		out = append(out, hv)
	}
	slices.Sort(out)
	return out
}
