package replay

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A host tier below a small pool serves hits the pool lost: the fleet of
// tiers recovers more than the pool alone and no more than the pool and
// host capacity together could (Belady over their sum), and the host
// tier's hits are pages copied up.
func TestHostTier(t *testing.T) {
	tr := prefix(conversation(t), 2000)
	pool := max(tr.DistinctBlocks/50, tr.MinPoolPages())
	host := tr.DistinctBlocks / 10
	if raceEnabled {
		tr = prefix(tr, 500)
	}
	alone, err := Run(tr, Config{CapacityPages: pool, PageTokens: 16})
	require.NoError(t, err)
	tiered, err := Run(tr, Config{CapacityPages: pool, HostPages: host, PageTokens: 16})
	require.NoError(t, err)
	require.Greater(t, tiered.HitBlocks, alone.HitBlocks)
	require.Positive(t, tiered.HostHitBlocks)
	require.Equal(t, tiered.HostHitBlocks, tiered.Onloaded)
	// One group, no resumes: the cache usage's host reads are the host
	// tier's hits, and every read is a hit at Add.
	require.Equal(t, tiered.HostHitBlocks*16, tiered.Usage.HostReadTokens)
	require.Equal(t, tiered.HitBlocks*16, tiered.Usage.ReadTokens())
	require.Positive(t, tiered.Usage.WriteTokens)
	require.Positive(t, tiered.Offloaded)
	require.LessOrEqual(t, tiered.HitBlocks, Belady(&tiered.Stream, pool+host))
	svc := DefaultService()
	res, err := Run(prefix(tr, 150), Config{CapacityPages: pool / 2, HostPages: host, Service: &svc})
	require.NoError(t, err)
	require.Positive(t, res.HostHitBlocks)
	_, err = Run(tr, Config{CapacityPages: pool, HostPages: -1})
	require.ErrorContains(t, err, "HostPages -1")
}

// A hybrid preset runs the HybridManager: with room for every block in
// every group, the hits are the trace's unlimited hits (every group keeps
// what a hit needs), and a tier or an unknown preset is refused by name.
func TestHybridModel(t *testing.T) {
	tr := prefix(conversation(t), 400)
	unl, blocks := Unlimited(TraceStream(tr))
	for model, groups := range map[string]int{"gpt-oss-like": 2, "gemma-3-like": 6} {
		res, err := Run(tr, Config{CapacityPages: 6*tr.DistinctBlocks + 8, PageTokens: 16, Model: model})
		require.NoError(t, err, model)
		require.Equal(t, [2]int64{unl, blocks}, [2]int64{res.HitBlocks, res.Blocks}, model)
		small, err := Run(tr, Config{CapacityPages: groups * max(tr.DistinctBlocks/20, tr.MinPoolPages()), PageTokens: 16, Model: model})
		require.NoError(t, err, model)
		require.Less(t, small.HitBlocks, res.HitBlocks, model)
		require.Positive(t, small.EvictedPages, model)
	}
	svc := DefaultService()
	res, err := Run(prefix(tr, 60), Config{CapacityPages: 4000, Model: "gpt-oss-like", Service: &svc})
	require.NoError(t, err)
	require.Positive(t, res.HitBlocks)
	_, err = Run(tr, Config{CapacityPages: 4000, Model: "gpt-oss-like", HostPages: 10, PageTokens: 16})
	require.ErrorContains(t, err, "with a host or remote tier")
	_, err = Run(tr, Config{CapacityPages: 4000, Model: "gpt-5"})
	require.ErrorContains(t, err, `"gpt-5"`)
	_, err = Run(tr, Config{CapacityPages: 4000, Model: "llama-4-like"})
	require.ErrorContains(t, err, "multiple of the page size 512")
}
