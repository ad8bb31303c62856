package replay

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReplayStateModel replays the head of the conversation trace through
// qwen3-next-like (3 state groups : 1 full group): prefill chunks end at
// state checkpoint boundaries, so checkpoints are published and later
// turns resume from them. At equal memory (the attention-only model keeps
// a block's K/V in all four layers: a quarter of the pages) it gets at
// least 90% of the attention-only model's hit blocks, and never none; a
// retention interval checkpoints inside long prompts too; the service
// model hits as well.
func TestReplayStateModel(t *testing.T) {
	n := 200
	if raceEnabled {
		n = 30 // the race detector slows the HybridManager about tenfold
	}
	tr := prefix(conversation(t), n)
	pages := max(tr.DistinctBlocks/10, 4*tr.MinPoolPages())
	dense, err := Run(tr, Config{CapacityPages: pages / 4, PageTokens: 16})
	require.NoError(t, err)
	require.Positive(t, dense.HitBlocks)
	hybrid, err := Run(tr, Config{CapacityPages: pages, PageTokens: 16, Model: "qwen3-next-like"})
	require.NoError(t, err)
	require.Positive(t, hybrid.HitBlocks)
	require.Positive(t, hybrid.PeakCheckpointPages)
	require.GreaterOrEqual(t, 10*hybrid.HitBlocks, 9*dense.HitBlocks, "hybrid %d hit blocks, attention-only at equal memory %d", hybrid.HitBlocks, dense.HitBlocks)

	short := tr
	every, err := Run(short, Config{CapacityPages: 6 * short.DistinctBlocks, PageTokens: 16, Model: "qwen3-next-like", StateCheckpointPages: 1})
	require.NoError(t, err)
	last, err := Run(short, Config{CapacityPages: 6 * short.DistinctBlocks, PageTokens: 16, Model: "qwen3-next-like"})
	require.NoError(t, err)
	require.Greater(t, every.HitBlocks, last.HitBlocks, "a checkpoint every page serves more than the prompts' ends and junctions")

	t.Logf("every page %d, ends and junctions %d hit blocks; %d pages: qwen3-next-like %d hit blocks (checkpoints peak %d pages), attention-only at %d pages %d", every.HitBlocks, last.HitBlocks, pages, hybrid.HitBlocks,
		hybrid.PeakCheckpointPages, pages/4, dense.HitBlocks)

	svc := DefaultService()
	res, err := Run(prefix(tr, 60), Config{CapacityPages: 4000, Model: "qwen3-next-like", Service: &svc})
	require.NoError(t, err)
	require.Positive(t, res.HitBlocks)

	_, err = Run(tr, Config{CapacityPages: pages, PageTokens: 16, Model: "qwen3-next-like", StateCheckpointPages: -1})
	require.ErrorIs(t, err, ErrBadConfig)
	require.ErrorContains(t, err, "StateCheckpointPages -1")
}

// TestReplayMLAIndexerModel replays the head of the conversation trace
// through deepseek-v3.2-like (an MLA group and its indexer group): the
// indexer owns no pages of the pool, so every figure is the dense
// Manager's at the same page count (block for block), under two policies.
func TestReplayMLAIndexerModel(t *testing.T) {
	n := 300
	if raceEnabled {
		n = 40
	}
	tr := prefix(conversation(t), n)
	pages := max(tr.DistinctBlocks/10, 4*tr.MinPoolPages())
	for _, policy := range []string{"lru", "arc"} {
		dense, err := Run(tr, Config{CapacityPages: pages, PageTokens: 16, Eviction: policy})
		require.NoError(t, err)
		require.Positive(t, dense.HitBlocks)
		mla, err := Run(tr, Config{CapacityPages: pages, PageTokens: 16, Eviction: policy, Model: "deepseek-v3.2-like"})
		require.NoError(t, err)
		require.Equal(t, dense.HitBlocks, mla.HitBlocks, policy)
		require.Equal(t, dense.EvictedPages, mla.EvictedPages, policy)
		require.Equal(t, dense.PrefillTokens, mla.PrefillTokens, policy)
		require.Zero(t, mla.PeakCheckpointPages)
	}
}
