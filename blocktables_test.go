package pagedkv

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layergroup"
	"github.com/pagedkv/pagedkv/ragged"
)

// The padded block-table contract of trtllm-gen, XQA and cuDNN
// (Plan.BlockTables, Config.BlockTablesStride). The randomized harnesses
// check every plan with requireBlockTablesMatchCSR: mgrHarness.checkPlan
// (TestManagerMatchesModel: full, windows, colliding hashes, speculative
// steps and truncation, preemption and eviction) and hybridHarness.engine
// (TestHybridMatchesModel, TestHybridSpecEqualsAcceptedOnly, the hybrid
// fuzz targets: sliding, chunked, full and MLA groups).

// requireBlockTablesMatchCSR checks that p's padded table names the pages
// of its CSR arrays in the same order, pads with BlockTablesPad, and that
// SeqLens covers exactly a row's pages; and that FlashInfer's reading of
// block_tables and seq_lens (ragged.BlockTables.ToPagedKV) gives back the
// CSR. stride is the Config's.
func requireBlockTablesMatchCSR(t testing.TB, p *Plan, stride, pageSize int) {
	t.Helper()
	if p.BlockTablesStride != stride {
		t.Fatalf("plan BlockTablesStride = %d, config %d", p.BlockTablesStride, stride)
	}
	if stride == 0 {
		if p.BlockTables != nil {
			t.Fatalf("BlockTables of %d entries without a stride", len(p.BlockTables))
		}
		return
	}
	b := len(p.KVIndptr) - 1
	if len(p.BlockTables) != b*stride || len(p.SeqLens) != b {
		t.Fatalf("BlockTables has %d entries and SeqLens %d, want %d×%d and %d", len(p.BlockTables), len(p.SeqLens), b, stride, b)
	}
	for i := range b {
		row := p.BlockTables[i*stride : (i+1)*stride]
		pages := p.KVPageIndices[p.KVIndptr[i]:p.KVIndptr[i+1]]
		if len(pages) > stride || !slices.Equal(row[:len(pages)], pages) {
			t.Fatalf("request %d: block_tables row %v, CSR pages %v", i, row, pages)
		}
		for l := len(pages); l < stride; l++ {
			if row[l] != BlockTablesPad {
				t.Fatalf("request %d: block_tables[%d][%d] = %d past its %d pages, want the pad %d (row %v)", i, i, l, row[l], len(pages), BlockTablesPad, row)
			}
		}
		if n := (int(p.SeqLens[i]) + pageSize - 1) / pageSize; n != len(pages) {
			t.Fatalf("request %d: seq_lens %d covers %d pages of %d tokens, the CSR has %d", i, p.SeqLens[i], n, pageSize, len(pages))
		}
	}
	indptr, indices, last, err := padded(p).ToPagedKV(p.SeqLens, pageSize)
	if err != nil {
		t.Fatalf("block_tables and seq_lens: %v", err)
	}
	if !slices.Equal(indptr, p.KVIndptr) || !slices.Equal(indices, p.KVPageIndices[:p.KVIndptr[b]]) || !slices.Equal(last, p.KVLastPageLen) {
		t.Fatalf("block_tables and seq_lens read as kv_indptr %v kv_indices %v kv_last_page_len %v; the plan has %v %v %v",
			indptr, indices, last, p.KVIndptr, p.KVPageIndices, p.KVLastPageLen)
	}
}

// padded views p's BlockTables as a ragged.BlockTables.
func padded(p *Plan) ragged.BlockTables {
	return ragged.BlockTables{Rows: len(p.SeqLens), Cols: p.BlockTablesStride, Data: p.BlockTables}
}

// paddedTable is the CSR page table an engine holding only block_tables and
// seq_lens would give FlashInfer's CSR kernels.
func paddedTable(t testing.TB, p *Plan, pageSize int) kernels.PageTable {
	indptr, indices, last, err := padded(p).ToPagedKV(p.SeqLens, pageSize)
	require.NoError(t, err)
	return kernels.PageTable{KVIndptr: indptr, KVPageIndices: indices, KVLastPageLen: last}
}

func TestBlockTablesStrideOutOfRange(t *testing.T) {
	for _, s := range []int{-1, 9} {
		_, err := New(Config{NumPages: 8, PageSize: 4, BlockTablesStride: s})
		require.ErrorIs(t, err, ErrBadConfig)
		require.ErrorContains(t, err, fmt.Sprintf("BlockTablesStride = %d, want 0..NumPages = 8", s))
		_, err = NewHybrid(HybridConfig{Config: Config{NumPages: 8, PageSize: 4, BlockTablesStride: s},
			Groups: []LayerGroup{{Kind: FullAttention, NumLayers: 1}}})
		require.ErrorIs(t, err, ErrBadConfig)
	}
}

// A step that would give a request more pages than the stride is refused,
// naming the request, its pages and the stride, and changes nothing; a
// sliding group's released pages leave its row, so the same request fits
// there.
func TestBlockTablesStrideRefusesLongRequests(t *testing.T) {
	m := mustNew(t, Config{NumPages: 16, PageSize: 4, HashSeed: 1, BlockTablesStride: 2})
	_, err := m.Add(1, Request{Prompt: seqTokens(0, 12)})
	require.NoError(t, err)
	before := m.Stats()
	_, err = m.Reserve([]RequestID{1}, []int32{9})
	require.ErrorIs(t, err, ErrBadArgument)
	require.ErrorContains(t, err, "ids[0] = 1 would hold 3 pages (9 tokens from its first held page, page size 4) in full, more than Config.BlockTablesStride = 2")
	require.Equal(t, before, m.Stats())
	require.False(t, m.Pending())
	p, err := m.Reserve([]RequestID{1}, []int32{8})
	require.NoError(t, err)
	require.Equal(t, []int32{0, 1}, p.BlockTables)
	require.Equal(t, []int32{8}, p.SeqLens)
	require.NoError(t, m.Commit(nil))

	// gpt-oss-like, W = 6, stride 3: 13 tokens need 4 pages in each group
	// and the first refuses; after 12 the sliding group's row starts past
	// its released page, so only the full group refuses the 13th.
	h, err := NewHybrid(HybridConfig{Config: Config{NumPages: 32, PageSize: 4, HashSeed: 1, BlockTablesStride: 3},
		Groups: []LayerGroup{{Kind: SlidingAttention, WindowTokens: 6, NumLayers: 1}, {Kind: FullAttention, NumLayers: 1}}})
	require.NoError(t, err)
	_, err = h.Add(1, Request{Prompt: seqTokens(0, 13)})
	require.NoError(t, err)
	hs := h.Stats()
	_, err = h.Reserve([]RequestID{1}, []int32{13})
	require.ErrorIs(t, err, ErrBadArgument)
	require.ErrorContains(t, err, "would hold 4 pages (13 tokens from its first held page, page size 4) in sliding, more than Config.BlockTablesStride = 3")
	require.Equal(t, hs, h.Stats())
	hp, err := h.Reserve([]RequestID{1}, []int32{12})
	require.NoError(t, err)
	for _, gp := range hp.Groups {
		requireBlockTablesMatchCSR(t, gp, 3, 4)
	}
	require.NoError(t, h.Commit(nil))
	// The sliding group released page 0 (the next query, at 12, reads 7..12).
	hp, err = h.Reserve([]RequestID{1}, []int32{1})
	require.ErrorIs(t, err, ErrBadArgument, "the full group's 13 tokens need 4 pages")
	require.ErrorContains(t, err, "in full")
	require.Nil(t, hp)
	pages, start := h.Pages(0, 1)
	require.Equal(t, 4, start)
	require.Len(t, pages, 2)
}

// TestScenarioBlockTablesWithWindow is docs/manager.md's worked example of
// the padded table of a sliding group: the CSR and the row hold the same
// pages from the first held page, seq_lens counts from there.
func TestScenarioBlockTablesWithWindow(t *testing.T) {
	h, err := NewHybrid(HybridConfig{Config: Config{NumPages: 32, PageSize: 4, HashSeed: 1, BlockTablesStride: 5},
		Groups: []LayerGroup{{Kind: SlidingAttention, WindowTokens: 6, NumLayers: 1}, {Kind: FullAttention, NumLayers: 1}}})
	require.NoError(t, err)
	_, err = h.Add(1, Request{Prompt: seqTokens(0, 13)})
	require.NoError(t, err)
	_, err = h.Reserve([]RequestID{1}, []int32{13})
	require.NoError(t, err)
	require.NoError(t, h.Commit([]int32{7}))
	p, err := h.Reserve([]RequestID{1}, []int32{1})
	require.NoError(t, err)
	sl, full := p.Groups[0], p.Groups[1]
	require.Equal(t, []int32{1, 2, 3}, sl.KVPageIndices)
	require.Equal(t, []int32{1, 2, 3, 0, 0}, sl.BlockTables)
	require.Equal(t, []int32{10}, sl.SeqLens)
	require.Equal(t, 5, sl.WindowLeft)
	require.Equal(t, []int32{4, 5, 6, 7}, full.KVPageIndices)
	require.Equal(t, []int32{4, 5, 6, 7, 0}, full.BlockTables)
	require.Equal(t, []int32{14}, full.SeqLens)
	for _, gp := range p.Groups {
		requireBlockTablesMatchCSR(t, gp, 5, 4)
	}
}

// TestBlockTablesAttentionEqualsCSR runs real attention (the CPU backend)
// from both forms of every step's table over a randomized hybrid workload
// (sliding, chunked and full groups; speculative steps, preemption, copy-
// on-write, eviction) and requires the outputs bit for bit equal: prefill
// over every row, and decode when each request has one row. The padded
// form reaches the kernel as an engine holding only block_tables and
// seq_lens would pass it (FlashInfer's reading, ragged ToPagedKV).
func TestBlockTablesAttentionEqualsCSR(t *testing.T) {
	ops := 400
	if raceEnabled {
		ops = 40
	}
	for _, name := range []string{"gpt-oss-like", "gemma-3-like", "llama-4-like"} {
		t.Run(name, func(t *testing.T) {
			groups := hybridConfigs()[name]
			hh := newHybridHarness(t, groups, 7)
			engines := make([]*cpuEngine, len(groups))
			for g := range engines {
				engines[g] = newCPUEngine(t, hhPages, hhPageSize)
			}
			var prefills, decodes int
			hh.onPlan = func(p *HybridPlan) {
				for g, gp := range p.Groups {
					e := engines[g]
					e.apply(t, gp)
					if hh.h.core.groups[g].layerGroup.Kind == layergroup.Chunked {
						continue // attention runs on the Attn arrays
					}
					tab := paddedTable(t, gp, hhPageSize)
					requireBitsEqual(t, e.prefill(t, gp), e.prefillOn(t, gp, tab), "prefill")
					prefills++
					if len(gp.Positions) == len(gp.Requests) && !slices.Contains(gp.SeqLens, 0) {
						requireBitsEqual(t, e.decode(t, gp), e.decodeOn(t, gp, tab), "decode")
						decodes++
					}
				}
			}
			for range ops {
				hh.op()
			}
			require.Positive(t, prefills)
			require.Positive(t, decodes)
			t.Logf("%d prefills and %d decodes equal from both tables", prefills, decodes)
		})
	}
}

func requireBitsEqual(t testing.TB, want, got []float32, what string) {
	t.Helper()
	require.Len(t, got, len(want), what)
	for i := range want {
		if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
			t.Fatalf("%s: element %d is %v from block_tables, %v from the CSR", what, i, got[i], want[i])
		}
	}
}
