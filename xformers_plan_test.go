package pagedkv_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/ragged"
)

// A Manager step as xFormers' paged mask: a sliding-window Manager (W = 4096,
// Mistral) prefills and decodes; each step's Plan converts exactly into
// PagedBlockDiagonalCausalLocalPaddedKeysMask (block_tables padded to the
// longest page list) whose FlashInfer form is the Plan's own: the same CSR
// page table and causal with the Plan's window_left.
func TestPlanAsXFormersPagedMask(t *testing.T) {
	const window, pageSize = 4096, 16
	m, err := pagedkv.New(pagedkv.Config{NumPages: 2048, PageSize: pageSize, HashSeed: 1, WindowTokens: window})
	require.NoError(t, err)
	ids := []pagedkv.RequestID{1, 2}
	prompts := [][]int32{make([]int32, 5000), make([]int32, 300)}
	for i, id := range ids {
		for k := range prompts[i] {
			prompts[i][k] = int32(1000*i + k%997)
		}
		_, err := m.Add(id, pagedkv.Request{Prompt: prompts[i]})
		require.NoError(t, err)
	}
	// Prefill in chunks, then decode; a request samples once its prompt is
	// done.
	steps := [][]int32{{2048, 300}, {2048, 1}, {904, 1}, {1, 1}, {1, 1}}
	sampled := [][]int32{{pagedkv.NoToken, 8}, {pagedkv.NoToken, 8}, {7, 8}, {7, 8}, {7, 8}}
	for s, n := range steps {
		plan, err := m.Reserve(ids, n)
		require.NoError(t, err)
		require.Equal(t, window-1, plan.WindowLeft)
		pkv := ragged.PagedKV{QOIndptr: plan.QOIndptr, KVIndptr: plan.KVIndptr, KVPageIndices: plan.KVPageIndices,
			KVLastPageLen: plan.KVLastPageLen, PageSize: pageSize}
		mask, err := ragged.MaskFromPagedKV(ragged.KindPagedBlockDiagonalCausalLocalPaddedKeys, pkv, nil, plan.WindowLeft+1, 0, 0)
		require.NoError(t, err, "step %d", s)
		assert.Equal(t, plan.SeqLens, mask.KVSeqLen(), "step %d", s)
		assert.Equal(t, ragged.FlashInferParams{Causal: true, WindowLeft: plan.WindowLeft, OK: true}, mask.FlashInferParams(), "step %d", s)
		back, err := mask.(ragged.PagedBlockDiagonalCausalLocalPaddedKeysMask).PagedKV()
		require.NoError(t, err)
		assert.Equal(t, pkv, back, "step %d", s)
		require.NoError(t, m.Commit(sampled[s]))
	}
}
