package mla

import (
	"errors"
	"fmt"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/pagetable"
)

// ErrPlanMismatch is returned by Run when the page table or inputs do not
// describe the step the plan was built for.
var ErrPlanMismatch = errors.New("mla: plan does not match the step")

// AppendPlan is one MLA append step's FlashInfer arrays in reused buffers.
// The zero value is an empty plan, ready for [AppendPlan.Build].
type AppendPlan struct {
	AppendIndptr []int32 // [B+1] rows per request, prefix summed
	SeqLens      []int32 // [B] tokens per request after the append
	BatchIndices []int32 // [nnz]
	Positions    []int32 // [nnz]

	params kernels.MLAAppendParams
}

// Build plans a step from appendIndptr [B+1] and seqLens [B] (lengths after
// the append): row i of request b gets position
// seqLens[b] - (appendIndptr[b+1] - i). On error the plan is unchanged.
func (p *AppendPlan) Build(appendIndptr, seqLens []int32) error {
	if len(appendIndptr) == 0 {
		return fmt.Errorf("mla: append_indptr is empty (want length batch+1): %w", pagetable.ErrBadCSR)
	}
	bi, pos, err := pagetable.GetBatchIndicesPositionsTo(p.BatchIndices, p.Positions, appendIndptr, seqLens, int(appendIndptr[len(appendIndptr)-1]))
	if err != nil {
		return fmt.Errorf("mla: plan append: %w", err)
	}
	p.BatchIndices, p.Positions = bi, pos
	p.AppendIndptr = append(p.AppendIndptr[:0], appendIndptr...)
	p.SeqLens = append(p.SeqLens[:0], seqLens...)
	return nil
}

// Nnz is the number of rows the plan appends.
func (p *AppendPlan) Nnz() int { return len(p.BatchIndices) }

// AppendInput is the data of one MLA append step.
type AppendInput struct {
	AppendCKV kernels.Tensor // [nnz, head_dim_ckv], the cache's dtype
	AppendKPE kernels.Tensor // [nnz, head_dim_kpe]
	Cache     *kernels.MLACache
	// The page table after the reservation for this step. KVLastPageLen is
	// optional (MLA kernels use kv_len instead); without it each request
	// must hold exactly ceil(seq_len / page_size) pages.
	KVIndptr, KVPageIndices, KVLastPageLen []int32
}

// Run appends the planned rows on backend b. It checks the page table
// against the plan's seq_lens; the backend validates the rest before it
// writes. On error nothing is written.
func (p *AppendPlan) Run(b kernels.Backend, in AppendInput) error {
	if in.Cache == nil {
		return fmt.Errorf("mla: append: nil cache: %w", ErrPlanMismatch)
	}
	N := in.Cache.Geometry.PageSize
	if len(in.KVIndptr) != len(p.SeqLens)+1 {
		return fmt.Errorf("mla: append: kv_indptr has length %d, plan has batch %d: %w", len(in.KVIndptr), len(p.SeqLens), ErrPlanMismatch)
	}
	if in.KVLastPageLen != nil && len(in.KVLastPageLen) != len(p.SeqLens) {
		return fmt.Errorf("mla: append: kv_last_page_len has length %d, plan has batch %d: %w", len(in.KVLastPageLen), len(p.SeqLens), ErrPlanMismatch)
	}
	t := kernels.PageTable{KVIndptr: in.KVIndptr, KVPageIndices: in.KVPageIndices, KVLastPageLen: in.KVLastPageLen}
	for b, n := range p.SeqLens {
		pages := int(in.KVIndptr[b+1]) - int(in.KVIndptr[b])
		switch {
		case in.KVLastPageLen != nil:
			if N > 0 && pages >= 0 && in.KVLastPageLen[b] >= 0 && int(in.KVLastPageLen[b]) <= N {
				if got := t.SeqLen(b, N); got != int(n) {
					return fmt.Errorf("mla: append: request %d has seq_len %d in the page table, %d in the plan: %w", b, got, n, ErrPlanMismatch)
				}
			} // else malformed: the backend's validation names it
		case N > 0 && pages != (int(n)+N-1)/N:
			return fmt.Errorf("mla: append: request %d holds %d pages, seq_len %d needs %d: %w", b, pages, n, (int(n)+N-1)/N, ErrPlanMismatch)
		}
	}
	p.params = kernels.MLAAppendParams{
		AppendCKV: in.AppendCKV, AppendKPE: in.AppendKPE,
		BatchIndices: p.BatchIndices, Positions: p.Positions,
		Cache: *in.Cache, KVIndptr: in.KVIndptr, KVPageIndices: in.KVPageIndices, KVLastPageLen: in.KVLastPageLen,
	}
	err := b.AppendPagedMLAKVCache(&p.params)
	p.params = kernels.MLAAppendParams{} // do not retain the caller's buffers
	if err != nil {
		return fmt.Errorf("mla: append on backend %s: %w", b.Name(), err)
	}
	return nil
}
