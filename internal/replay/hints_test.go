package replay

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/evict"
)

// The oracle's hints, true, bring the adaptive policy within 5% of
// Belady (the dead-block oracle keeps every block that comes back); less accurate
// hints recover less, in order; a policy that reads no hint is unchanged
// by them; a bad accuracy is refused by value.
func TestHintsOracle(t *testing.T) {
	tr := prefix(conversation(t), 2000)
	if raceEnabled {
		tr = prefix(tr, 300)
	}
	capacity := max(tr.DistinctBlocks/10, tr.MinPoolPages())
	bel := Belady(TraceStream(tr), capacity)
	hits := func(policy string, acc float64) int64 {
		res, err := Run(tr, Config{CapacityPages: capacity, Eviction: policy, PageTokens: 4, Hints: Hints{Accuracy: acc, Seed: 1}})
		require.NoError(t, err)
		require.Equal(t, acc, res.HintAccuracy)
		return res.HitBlocks
	}
	none, perfect, h90, h70 := hits(evict.Adaptive, 0), hits(evict.Adaptive, 1), hits(evict.Adaptive, 0.9), hits(evict.Adaptive, 0.7)
	if !raceEnabled { // 400 requests are too few for the bound
		require.GreaterOrEqual(t, float64(perfect), 0.95*float64(bel), "perfect hints at 10%")
	}
	require.GreaterOrEqual(t, perfect, h90)
	require.Greater(t, h90, h70)
	require.Greater(t, h70, none)
	require.Equal(t, hits(evict.LRU, 0), hits(evict.LRU, 0.9), "lru reads no hint")
	_, err := Run(tr, Config{CapacityPages: capacity, Eviction: evict.Adaptive, Hints: Hints{Accuracy: 1.5}})
	require.ErrorContains(t, err, "hint accuracy 1.5")
	_, err = Run(tr, Config{CapacityPages: capacity, Model: "gpt-oss-like", Hints: Hints{Accuracy: 1}})
	require.ErrorIs(t, err, ErrBadConfig)
}
