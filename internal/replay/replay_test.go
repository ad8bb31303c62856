package replay

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/evict"
)

const conversationTrace = "../../testdata/traces/mooncake_conversation_trace.jsonl.gz"

var (
	traceOnce sync.Once
	traceFull *Trace
	traceErr  error
)

// conversation returns the committed Mooncake trace (read once).
func conversation(t testing.TB) *Trace {
	traceOnce.Do(func() { traceFull, traceErr = OpenMooncake(conversationTrace, DefaultLimits()) })
	require.NoError(t, traceErr)
	return traceFull
}

// prefix returns the first n requests of t as a trace of its own.
func prefix(t *Trace, n int) *Trace { return t.Prefix(n) }

// testTrace is the whole trace, or under -race its first 1500 requests.
func testTrace(t testing.TB) *Trace {
	tr := conversation(t)
	if raceEnabled {
		return prefix(tr, 500)
	}
	return tr
}

// The file's own figures (its README): 12,031 requests, 288,500 block
// references, 182,790 distinct blocks, 36.6% unlimited-capacity hits.
func TestConversationTraceFigures(t *testing.T) {
	tr := conversation(t)
	require.Len(t, tr.Requests, 12031)
	require.Equal(t, 288500, tr.References)
	require.Equal(t, 182790, tr.DistinctBlocks)
	hits, blocks := Unlimited(TraceStream(tr))
	require.Equal(t, int64(288500), blocks)
	require.Equal(t, int64(105710), hits)
	require.Equal(t, "36.6%", pct(hits, blocks))
}

func pct(a, b int64) string { return formatPct(ratio(a, b)) }

// With room for every block, the Manager's verified prefix hits are the
// trace's unlimited-capacity hits, block for block: the synthesized tokens
// match exactly where the hash ids do.
func TestManagerUnlimitedEqualsTrace(t *testing.T) {
	tr := testTrace(t)
	res, err := Run(tr, Config{CapacityPages: tr.DistinctBlocks + 1})
	require.NoError(t, err)
	hits, blocks := Unlimited(TraceStream(tr))
	require.Equal(t, blocks, res.Blocks)
	require.Equal(t, hits, res.HitBlocks)
	require.Zero(t, res.EvictedPages)
	require.Equal(t, hits, Belady(&res.Stream, tr.DistinctBlocks), "Belady with room for everything")
	if !raceEnabled {
		require.Equal(t, "36.6%", pct(res.HitBlocks, res.Blocks))
	}
}

// blockLRU is the slow reference of a sequential LRU replay: a map from
// block to the time it became idle. A request's hit blocks are busy while
// it runs; it needs one page per missed block and one for its query token;
// eviction takes the block idle longest; on release the request's blocks
// become idle deepest first (the Manager's release order).
func blockLRU(tr *Trace, capacity int) (hits, evicted int64) {
	idle := map[int32]int64{}
	var tick int64
	for _, q := range tr.Requests {
		k := 0
		for k < len(q.Blocks) {
			if _, ok := idle[q.Blocks[k]]; !ok {
				break
			}
			k++
		}
		hits += int64(k)
		busy := q.Blocks[:k]
		free := capacity + 1 - len(idle)
		for need := len(q.Blocks) - k + 1 - free; need > 0; need-- {
			victim, oldest := int32(-1), int64(0)
			for id, at := range idle {
				if !slices.Contains(busy, id) && (victim < 0 || at < oldest) {
					victim, oldest = id, at
				}
			}
			delete(idle, victim)
			evicted++
		}
		for i := len(q.Blocks) - 1; i >= 0; i-- {
			tick++
			idle[q.Blocks[i]] = tick
		}
	}
	return hits, evicted
}

func TestSequentialLRUMatchesBlockReference(t *testing.T) {
	tr := prefix(conversation(t), 800)
	capacities := []int{300, 1000, 3000}
	if raceEnabled {
		tr, capacities = prefix(tr, 150), capacities[:2]
	}
	for _, capacity := range capacities {
		res, err := Run(tr, Config{CapacityPages: capacity, Eviction: evict.LRU})
		require.NoError(t, err)
		hits, evicted := blockLRU(tr, capacity)
		require.Equal(t, [2]int64{hits, evicted}, [2]int64{res.HitBlocks, res.EvictedPages}, "capacity %d: hits, evicted", capacity)
	}
}

// The trace's published LRU figures at 5/10/25% of the distinct blocks
// (19.5/27.8/35.4%, one request at a time) and Belady's 36.6% at 5%.
func TestSequentialFiguresOfTheTrace(t *testing.T) {
	if raceEnabled {
		t.Skip("the full trace under -race takes minutes; TestSequentialLRUMatchesBlockReference checks the same code on a prefix")
	}
	tr := conversation(t)
	for f, want := range map[float64][2]float64{0.05: {0.195, 0.196}, 0.10: {0.278, 0.279}, 0.25: {0.353, 0.354}} {
		res, err := Run(tr, Config{CapacityPages: int(f * float64(tr.DistinctBlocks)), PageTokens: 16})
		require.NoError(t, err)
		require.GreaterOrEqual(t, res.HitRatio(), want[0], "LRU at %.0f%%", 100*f)
		require.Less(t, res.HitRatio(), want[1], "LRU at %.0f%%", 100*f)
		if f == 0.05 {
			require.Equal(t, "36.6%", pct(Belady(&res.Stream, res.CapacityPages), res.Blocks), "Belady at 5%")
		}
	}
}

// slowBelady is Belady's rule written the obvious way: after each
// reference, while over capacity, scan the cache for the block whose next
// reference (scanning the future) is farthest, never first.
func slowBelady(s *Stream, capacity int) (hits int64) {
	var refs []int32
	for _, a := range s.Admissions {
		refs = append(refs, a...)
	}
	nextUse := func(id int32, after int) int {
		for i := after + 1; i < len(refs); i++ {
			if refs[i] == id {
				return i
			}
		}
		return len(refs) + 1
	}
	cache := map[int32]bool{}
	pos := 0
	for _, a := range s.Admissions {
		k := 0
		for k < len(a) && cache[a[k]] {
			k++
		}
		hits += int64(k)
		for j, id := range a {
			cache[id] = true
			for len(cache) > capacity || nextUse(id, pos+j) > len(refs) && cache[id] {
				far, at := int32(-1), -1
				for c := range cache {
					if u := nextUse(c, pos+j); u > at {
						far, at = c, u
					}
				}
				if at <= len(refs) {
					if len(cache) <= capacity {
						break
					}
				}
				delete(cache, far)
			}
		}
		pos += len(a)
	}
	return hits
}

// randomStream makes admissions over a random prefix tree: each admission
// follows an existing path for a while, then branches into new blocks.
func randomStream(rng *rand.Rand, n int) *Stream {
	children := map[int32][]int32{}
	next := int32(1)
	s := &Stream{}
	for range n {
		var adm []int32
		parent := int32(0)
		for d := 0; d < 1+rng.IntN(6); d++ {
			kids := children[parent]
			var id int32
			if len(kids) > 0 && rng.IntN(3) > 0 {
				id = kids[rng.IntN(len(kids))]
			} else {
				id = next
				next++
				children[parent] = append(children[parent], id)
			}
			adm = append(adm, id)
			parent = id
		}
		s.Admissions = append(s.Admissions, adm)
	}
	return s
}

func TestBeladyMatchesSlowReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for run := range 300 {
		s := randomStream(rng, 5+rng.IntN(40))
		capacity := 1 + rng.IntN(12)
		want := slowBelady(s, capacity)
		got := Belady(s, capacity)
		require.Equal(t, want, got, "run %d, capacity %d, stream %v", run, capacity, s.Admissions)
		unl, _ := Unlimited(s)
		require.LessOrEqual(t, got, unl)
		require.Equal(t, unl, Belady(s, 1<<20))
	}
}

// Smaller synthesized pages change the token work, not the replay: the same
// hits, evictions and streams as full 512-token pages.
func TestPageTokensKeepTheReplay(t *testing.T) {
	tr := prefix(conversation(t), 3000)
	if raceEnabled {
		tr = prefix(tr, 120)
	}
	for _, policy := range evict.Names() {
		capacity := max(tr.DistinctBlocks/20, tr.MinPoolPages())
		full, err := Run(tr, Config{CapacityPages: capacity, Eviction: policy})
		require.NoError(t, err)
		small, err := Run(tr, Config{CapacityPages: capacity, Eviction: policy, PageTokens: 4})
		require.NoError(t, err)
		require.Equal(t, [3]int64{full.HitBlocks, full.EvictedPages, full.PrefillTokens},
			[3]int64{small.HitBlocks, small.EvictedPages, small.PrefillTokens}, policy)
		require.Positive(t, full.EvictedPages, policy)
	}
	_, err := Run(tr, Config{CapacityPages: 1000, PageTokens: 513})
	require.ErrorContains(t, err, "PageTokens 513, want 1..512")
	svc := DefaultService()
	_, err = Run(tr, Config{CapacityPages: 1000, PageTokens: 16, Service: &svc})
	require.ErrorContains(t, err, "PageTokens 16 with the service model")
}
