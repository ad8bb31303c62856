package fuzz

import (
	"fmt"
	"math"
	"testing"

	"github.com/pagedkv/pagedkv/cascade"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/kernelstest"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/pagetable"
	"github.com/pagedkv/pagedkv/ragged"
)

// FuzzValidators feeds raw, unstructured index arrays (any lengths, any
// int32 including MinInt32/MaxInt32, decreasing and wrapping; decoded by
// kernelstest.DecodeRaw) into every validator that guards an index array:
// kernels' PageTable, append, MLA append, decode, prefill and MLA decode
// Validate, cascade.Params.Validate, pagetable.ValidateCSR and
// ragged.ValidateIndptr. None may panic, and whatever one accepts is
// re-proved here in int64 from the raw values: every page, row and position
// a kernel will touch is in range.
func FuzzValidators(f *testing.F) {
	for _, s := range kernelstest.RawSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		g, ix := kernelstest.DecodeRaw(data)
		if err := checkValidators(g, ix); err != nil {
			t.Fatalf("%v\ngeometry %+v\narrays %+v", err, g, ix)
		}
	})
}

// tableProof re-checks a paged table in int64: indptr from 0, non-decreasing,
// within kv_indices, used page ids in the pool, last_page_len rules, seq_len
// <= MaxInt32 (needLast) or pages*page_size capacity returned per request.
func tableProof(indptr, indices, last []int32, needLast bool, pageSize, numPages int) ([]int64, error) {
	if len(indptr) == 0 || indptr[0] != 0 {
		return nil, fmt.Errorf("accepted kv_indptr %v", indptr)
	}
	lens := make([]int64, len(indptr)-1)
	for b := range lens {
		pages := int64(indptr[b+1]) - int64(indptr[b])
		if pages < 0 {
			return nil, fmt.Errorf("accepted decreasing kv_indptr at %d: %v", b, indptr)
		}
		lens[b] = pages * int64(pageSize)
		if needLast {
			if len(last) != len(lens) {
				return nil, fmt.Errorf("accepted kv_last_page_len of length %d for batch %d", len(last), len(lens))
			}
			l := int64(last[b])
			switch {
			case pages == 0 && l != 0, pages > 0 && (l < 1 || l > int64(pageSize)):
				return nil, fmt.Errorf("accepted kv_last_page_len[%d] = %d with %d pages of %d", b, l, pages, pageSize)
			case pages > 0:
				lens[b] = (pages-1)*int64(pageSize) + l
			}
			if lens[b] > math.MaxInt32 {
				return nil, fmt.Errorf("accepted seq_len %d of request %d", lens[b], b)
			}
		}
	}
	end := int64(indptr[len(indptr)-1])
	if end > int64(len(indices)) {
		return nil, fmt.Errorf("accepted kv_indptr end %d past %d indices", end, len(indices))
	}
	for i := int64(0); i < end; i++ {
		if p := int64(indices[i]); p < 0 || p >= int64(numPages) {
			return nil, fmt.Errorf("accepted page id kv_indices[%d] = %d outside [0, %d)", i, p, numPages)
		}
	}
	return lens, nil
}

func monotoneFromZero(indptr []int32) bool {
	if len(indptr) == 0 || indptr[0] != 0 {
		return false
	}
	for i := 1; i < len(indptr); i++ {
		if int64(indptr[i]) < int64(indptr[i-1]) {
			return false
		}
	}
	return true
}

func rowsProof(lens []int64, batch, pos []int32) error {
	if len(batch) != len(pos) {
		return fmt.Errorf("accepted %d batch_indices and %d positions", len(batch), len(pos))
	}
	for i, b := range batch {
		if b < 0 || int64(b) >= int64(len(lens)) {
			return fmt.Errorf("accepted batch_indices[%d] = %d for batch %d", i, b, len(lens))
		}
		if p := int64(pos[i]); p < 0 || p >= lens[b] {
			return fmt.Errorf("accepted positions[%d] = %d outside request %d's %d tokens", i, p, b, lens[b])
		}
	}
	return nil
}

func checkValidators(g kernelstest.RawGeometry, ix kernelstest.RawIndices) error {
	pg := layout.Paged{Layout: g.Layout, Form: g.Form, DType: g.DType, NumPages: g.NumPages,
		PageSize: g.PageSize, NumKVHeads: g.NumKVHeads, HeadDim: g.HeadDim}
	cache, err := kernels.NewPagedKVCache(pg)
	if err != nil {
		return fmt.Errorf("small geometry rejected: %w", err)
	}
	table := kernels.PageTable{KVIndptr: ix.KVIndptr, KVPageIndices: ix.KVPageIndices, KVLastPageLen: ix.KVLastPageLen}
	tableErr := table.Validate(g.PageSize, g.NumPages)
	var lens []int64
	if tableErr == nil {
		if lens, err = tableProof(ix.KVIndptr, ix.KVPageIndices, ix.KVLastPageLen, true, g.PageSize, g.NumPages); err != nil {
			return fmt.Errorf("PageTable.Validate: %w", err)
		}
	}
	// pagetable.ValidateCSR is stricter (len(kv_indices) == kv_indptr[B],
	// 32-bit token offsets): what it accepts, kernels accept.
	if len(ix.KVIndptr) > 0 && pagetable.ValidateCSR(ix.KVIndptr, ix.KVPageIndices, ix.KVLastPageLen, g.PageSize, g.NumPages) == nil && tableErr != nil {
		return fmt.Errorf("pagetable.ValidateCSR accepts what PageTable.Validate rejects: %v", tableErr)
	}
	// ragged's indptr rule is the same non-decreasing-from-0 rule.
	if len(ix.QOIndptr) > 0 {
		rerr := ragged.ValidateIndptr(ix.QOIndptr, int(ix.QOIndptr[len(ix.QOIndptr)-1]))
		if (rerr == nil) != monotoneFromZero(ix.QOIndptr) {
			return fmt.Errorf("ragged.ValidateIndptr(%v) = %v disagrees with the int64 rule", ix.QOIndptr, rerr)
		}
	}

	nnz := len(ix.BatchIndices)
	ap := kernels.AppendParams{
		AppendKey: kernels.NewTensor(g.DType, nnz, g.NumKVHeads, g.HeadDim), AppendValue: kernels.NewTensor(g.DType, nnz, g.NumKVHeads, g.HeadDim),
		BatchIndices: ix.BatchIndices, Positions: ix.Positions, Cache: cache, Table: table,
	}
	if ap.Validate() == nil {
		if tableErr != nil {
			return fmt.Errorf("append accepted a table PageTable.Validate rejects: %v", tableErr)
		}
		if err := rowsProof(lens, ix.BatchIndices, ix.Positions); err != nil {
			return fmt.Errorf("append: %w", err)
		}
	}

	hq := g.NumKVHeads * g.Group
	B := max(len(ix.KVIndptr)-1, 0)
	dp := kernels.DecodeParams{Q: kernels.NewTensor(g.DType, B, hq, g.HeadDim), Cache: cache, Table: table,
		AttentionParams: kernels.AttentionParams{NumQOHeads: hq, WindowLeft: -1}, O: kernels.NewTensor(g.DType, B, hq, g.HeadDim)}
	if dp.Validate() == nil && tableErr != nil {
		return fmt.Errorf("decode accepted a table PageTable.Validate rejects: %v", tableErr)
	}

	nq := 0
	if len(ix.QOIndptr) > 0 {
		nq = int(min(max(ix.QOIndptr[len(ix.QOIndptr)-1], 0), 64))
	}
	pp := kernels.PrefillParams{Q: kernels.NewTensor(g.DType, nq, hq, g.HeadDim), QOIndptr: ix.QOIndptr, Cache: cache, Table: table,
		AttentionParams: kernels.AttentionParams{NumQOHeads: hq, WindowLeft: -1}, O: kernels.NewTensor(g.DType, nq, hq, g.HeadDim)}
	if pp.Validate() == nil {
		if tableErr != nil {
			return fmt.Errorf("prefill accepted a table PageTable.Validate rejects: %v", tableErr)
		}
		if !monotoneFromZero(ix.QOIndptr) || len(ix.QOIndptr) != len(ix.KVIndptr) || int64(ix.QOIndptr[len(ix.QOIndptr)-1]) != int64(nq) {
			return fmt.Errorf("prefill accepted qo_indptr %v for %d rows", ix.QOIndptr, nq)
		}
	}
	lv := cascade.Level{QOIndptr: ix.QOIndptr, KVIndptr: ix.KVIndptr, KVPageIndices: ix.KVPageIndices, KVLastPageLen: ix.KVLastPageLen}
	cp := cascade.Params{Levels: []cascade.Level{lv, lv}, Q: pp.Q, Cache: cache, AttentionParams: pp.AttentionParams, O: pp.O}
	if cp.Validate() == nil && pp.Validate() != nil {
		return fmt.Errorf("cascade accepted levels whose prefill is rejected")
	}

	mg := layout.MLA{Form: g.Form, DType: g.DType, NumPages: g.NumPages, PageSize: g.PageSize, HeadDimCKV: g.HeadDimCKV, HeadDimKPE: g.HeadDimKPE}
	mc, err := kernels.NewMLACache(mg)
	if err != nil {
		return fmt.Errorf("small MLA geometry rejected: %w", err)
	}
	last := ix.KVLastPageLen
	if ix.MLANoLastPageLen {
		last = nil
	}
	ma := kernels.MLAAppendParams{AppendCKV: kernels.NewTensor(g.DType, nnz, g.HeadDimCKV), AppendKPE: kernels.NewTensor(g.DType, nnz, g.HeadDimKPE),
		BatchIndices: ix.BatchIndices, Positions: ix.Positions, Cache: mc, KVIndptr: ix.KVIndptr, KVPageIndices: ix.KVPageIndices, KVLastPageLen: last}
	if ma.Validate() == nil {
		mlens, err := tableProof(ix.KVIndptr, ix.KVPageIndices, last, last != nil, g.PageSize, g.NumPages)
		if err != nil {
			return fmt.Errorf("mla append: %w", err)
		}
		if err := rowsProof(mlens, ix.BatchIndices, ix.Positions); err != nil {
			return fmt.Errorf("mla append: %w", err)
		}
	}
	md := kernels.MLADecodeParams{QNope: kernels.NewTensor(g.DType, B, g.Group, g.HeadDimCKV), QPE: kernels.NewTensor(g.DType, B, g.Group, g.HeadDimKPE),
		Cache: mc, KVIndptr: ix.KVIndptr, KVPageIndices: ix.KVPageIndices, KVLen: ix.KVLen, NumHeads: g.Group, SMScale: 1,
		O: kernels.NewTensor(g.DType, B, g.Group, g.HeadDimCKV)}
	if md.Validate() == nil {
		caps, err := tableProof(ix.KVIndptr, ix.KVPageIndices, nil, false, g.PageSize, g.NumPages)
		if err != nil {
			return fmt.Errorf("mla decode: %w", err)
		}
		if len(ix.KVLen) != len(caps) {
			return fmt.Errorf("mla decode accepted %d kv_len for batch %d", len(ix.KVLen), len(caps))
		}
		for b, n := range ix.KVLen {
			if n < 0 || int64(n) > caps[b] {
				return fmt.Errorf("mla decode accepted kv_len[%d] = %d for %d token slots", b, n, caps[b])
			}
		}
	}
	return nil
}
