package pagedkv

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/kvindex"
)

// TestHybridKVIndexMatchesAdmission: a HybridManager on a gpt-oss-like
// config (a sliding window group and a full group, shrunk to page size 4
// and a 12-token window) publishes its KV events through an
// events.Recorder; the encoded batches are decoded and applied to a
// kvindex.Index after every operation. Then, for random prompts, the
// index's Match equals the HybridManager's admission rule (the minimum over
// the groups of each group cache's contiguous match), each group's indexed
// set equals the group's cache, and every Add and Resume hits exactly what
// the index predicted (capped, as admission is, to leave a token to
// compute). The pool is small, so steps evict (the sliding group's pages
// that left the window go first) and some operations evict from one group
// alone: the groups come to hold different prefixes of one hash chain.
func TestHybridKVIndexMatchesAdmission(t *testing.T) {
	t.Parallel()
	testHybridKVIndex(t, 0)
}

// TestHybridKVIndexHostTier is TestHybridKVIndexMatchesAdmission with a
// write-through host tier whose pages the Recorder announces (medium
// "CPU", each in its group): after every operation each group's indexed
// set equals the group's device cache plus its servable host pages, the
// index's Match equals the minimum over the groups of each group's
// contiguous match over both media (computed from the HybridManager's
// state), and every Add and Resume hits at most what the index predicted:
// the index never over-reports. (Admission may serve less: onloads must
// fit the pool; or more for a sliding group that onloads only the pages
// its window reads.)
func TestHybridKVIndexHostTier(t *testing.T) {
	t.Parallel()
	testHybridKVIndex(t, 24)
}

func testHybridKVIndex(t *testing.T, hostPages int) {
	const numPages, ps, runs, ops = 48, 4, 6, 400
	groups := []LayerGroup{{Kind: SlidingAttention, WindowTokens: 12, NumLayers: 1}, {Kind: FullAttention, NumLayers: 1}}
	nss := []Namespace{{}, {Tenant: "b"}}
	var checks, hits, diverged, predicted, exact, hostIndexed int
	for run := range runs {
		rng := rand.New(rand.NewPCG(uint64(run), 77))
		rec, q := newHybridRecorder(t, groups, numPages, ps, hostPages)
		cfg := Config{NumPages: numPages, PageSize: ps, HashSeed: 13, CacheEvents: rec}
		if hostPages > 0 {
			cfg.Tiers = TierConfig{HostPages: hostPages, Format: tierFormat(ps), WriteThrough: true}
		}
		h, err := NewHybrid(HybridConfig{Config: cfg, Groups: groups})
		require.NoError(t, err)
		ix, err := kvindex.New(kvindex.Config{PageSize: ps, Seed: h.core.groups[0].cache.Seed()})
		require.NoError(t, err)
		rep := ix.AddReplica("hybrid")
		enc := events.NewEncoder()
		var ids []RequestID
		nsOf := map[RequestID]Namespace{}
		next := RequestID(1)

		// complete runs the engine's side of the tier copies: all done.
		var copies []TierCopy
		complete := func() {
			copies = h.TierCopies(copies[:0])
			done := make([]uint64, 0, len(copies))
			for _, c := range copies {
				done = append(done, c.ID)
			}
			require.NoError(t, h.CompleteTierCopies(done...))
		}
		// held is group g's blocks: its device cache and its servable host
		// pages (the host pool's ready pages of the group's digest chain).
		held := func(g int) map[uint64]bool {
			out := map[uint64]bool{}
			for _, hv := range h.core.groups[g].cache.AppendHashes(nil) {
				out[hv] = true
			}
			if tr := h.core.tiers; tr != nil {
				for p := range tr.host.NumPages() {
					if _, _, ready, _, ok := tr.host.Entry(HostPageID(p)); ok && ready && int(tr.hostName[p].group) == g {
						out[tr.hostName[p].hash] = true
					}
				}
			}
			return out
		}
		// index applies the operation's events to the index.
		index := func(op int) {
			complete()
			require.True(t, rec.Flush(), "op %d: the event queue is full", op)
			for b := q.TryNext(); b != nil; b = q.TryNext() {
				dec, err := kvindex.DecodeBatch(enc.AppendBatch(nil, b, 0))
				q.Done(b)
				require.NoError(t, err, "op %d", op)
				require.NoError(t, ix.Apply(rep, &dec), "op %d", op)
			}
		}
		// admitted is what the HybridManager would admit of tokens in ns:
		// every group's contiguous cached match, their minimum.
		admitted := func(ns Namespace, tokens []int32) (least int, differ bool) {
			least = -1
			chain := ix.Hashes(nil, ns, tokens)
			for g, m := range h.core.groups {
				pages, _ := m.cache.Match(nil, m.cache.Key(ns), tokens, len(tokens)/ps)
				if hostPages > 0 { // both media: the device's, then on
					set := held(g)
					k := len(pages)
					for k < len(chain) && set[chain[k]] {
						k++
					}
					pages = make([]PageID, k)
				}
				if least >= 0 && len(pages) != least {
					differ = true
				}
				if least < 0 || len(pages) < least {
					least = len(pages)
				}
			}
			return least * ps, differ
		}
		// expect is the hit Add or Resume must return for tokens, from the
		// index: its match, leaving at least one token to compute.
		expect := func(ns Namespace, tokens []int32) int {
			if len(tokens) <= 1 {
				return 0
			}
			return min(ix.Match(nil, ns, tokens)[0], (len(tokens)-1)/ps*ps)
		}
		check := func(op int) {
			for g := range h.core.groups {
				var want []uint64
				for hv := range held(g) {
					want = append(want, hv)
				}
				slices.Sort(want)
				hostIndexed += len(want) - len(h.core.groups[g].cache.AppendHashes(nil))
				got := ix.GroupBlocks(rep, g)
				if len(want) > 0 || len(got) > 0 {
					require.Equal(t, want, got, "op %d: group %d's indexed blocks", op, g)
				}
			}
			for range 6 {
				ns := nss[rng.IntN(len(nss))]
				var tokens []int32
				if len(ids) > 0 && rng.IntN(2) == 0 {
					id := ids[rng.IntN(len(ids))]
					ns, tokens = nsOf[id], h.Tokens(id)
				} else {
					tokens = promptOf(rng.IntN(8), rng.IntN(60))
				}
				want, differ := admitted(ns, tokens)
				got := ix.Match(nil, ns, tokens)[0]
				require.Equal(t, want, got, "op %d: %d tokens in %v: the index matched %d, the groups admit %d", op, len(tokens), ns, got, want)
				checks++
				if got > 0 {
					hits++
				}
				if differ {
					diverged++
				}
			}
		}

		for op := range ops {
			for _, id := range slices.Clone(ids) {
				if len(h.Tokens(id)) > 60 || len(ids) > 6 && rng.IntN(3) == 0 {
					require.NoError(t, h.Release(id))
					ids = slices.DeleteFunc(ids, func(x RequestID) bool { return x == id })
				}
			}
			switch k := rng.IntN(20); {
			case k < 5:
				id := next
				next++
				ns := nss[rng.IntN(len(nss))]
				prompt := promptOf(rng.IntN(8), 1+rng.IntN(40))
				want := expect(ns, prompt)
				got, err := h.Add(id, Request{Namespace: ns, Prompt: prompt})
				require.NoError(t, err)
				complete()
				if hostPages == 0 {
					require.Equal(t, want, got, "op %d: add %d tokens: the index predicted a hit of %d", op, len(prompt), want)
				}
				require.LessOrEqual(t, got, want, "op %d: add %d tokens: the index predicted a hit of %d", op, len(prompt), want)
				if got == want {
					exact++
				}
				predicted++
				ids = append(ids, id)
				nsOf[id] = ns
			case k < 6:
				if len(ids) > 0 {
					id := ids[rng.IntN(len(ids))]
					require.NoError(t, h.Release(id))
					ids = slices.DeleteFunc(ids, func(x RequestID) bool { return x == id })
				}
			case k < 7:
				if len(ids) > 0 {
					if id := ids[rng.IntN(len(ids))]; h.Running(id) {
						require.NoError(t, h.Preempt(id))
					}
				}
			case k < 8:
				if len(ids) > 0 {
					if id := ids[rng.IntN(len(ids))]; !h.Running(id) {
						want := expect(nsOf[id], h.Tokens(id))
						got, err := h.Resume(id)
						require.NoError(t, err)
						complete()
						if hostPages == 0 {
							require.Equal(t, want, got, "op %d: resume %d: the index predicted a hit of %d", op, id, want)
						}
						require.LessOrEqual(t, got, want, "op %d: resume %d: the index predicted a hit of %d", op, id, want)
						if got == want {
							exact++
						}
						predicted++
					}
				}
			case k < 9:
				// Evict idle cached pages of one group only.
				g := rng.IntN(len(h.core.groups))
				h.core.groups[g].cache.Evict(1 + rng.IntN(8))
				h.core.groups[g].afterChange()
			default:
				ids2, nt, drafts := stepDraw{minNew: 1, newSpan: 9, draftSpan: 4, spec: rng.IntN(3) == 0}.draw(rng, h, ids)
				if len(ids2) == 0 {
					break
				}
				if _, err := h.ReserveSpec(ids2, nt, drafts); err != nil {
					require.True(t, errors.Is(err, ErrOutOfPages), "op %d: %v", op, err)
					require.NoError(t, h.Preempt(ids2[rng.IntN(len(ids2))]))
					break
				}
				accepted, sampled := drawCommit(rng, h, ids2, nt, drafts)
				require.NoError(t, h.CommitSpec(accepted, sampled))
			}
			index(op)
			check(op)
		}
		require.NoError(t, h.Audit())
		st := ix.Stats(rep)
		require.Equal(t, 2, st.Groups, "the index knows both groups")
	}
	t.Logf("%d checks: %d hits, %d with the groups' matches differing; %d admissions predicted, %d exactly; %d host-only blocks indexed (summed over checks)",
		checks, hits, diverged, predicted, exact, hostIndexed)
	require.Positive(t, hits)
	if hostPages > 0 {
		require.Positive(t, hostIndexed, "no host page was ever indexed")
		require.Positive(t, exact)
	}
	require.Positive(t, diverged, "the groups never held different prefixes")
}
