package appendkv

import (
	"slices"

	"errors"
	"fmt"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/pagetable"
)

// ErrPlanMismatch is returned by [Plan.Run] when the page table or the rows
// given do not describe the step the plan was built for.
var ErrPlanMismatch = errors.New("appendkv: plan does not match the step")

// Plan is one append step's FlashInfer arrays, in buffers reused from step
// to step. The zero value is an empty plan, ready for [Plan.Build].
type Plan struct {
	// AppendIndptr [B+1]: request b appends rows AppendIndptr[b]..AppendIndptr[b+1].
	AppendIndptr []int32
	// SeqLens [B]: tokens per request after the append (get_seq_lens).
	SeqLens []int32
	// BatchIndices [nnz] and Positions [nnz]: the request of each appended
	// row and its token index in that request (get_batch_indices_positions).
	BatchIndices, Positions []int32

	params     kernels.AppendParams // reused so that Run does not allocate
	seqScratch []int32              // get_seq_lens output of BuildFromTable
}

// Build plans a step from appendIndptr [B+1] (rows per request, prefix
// summed) and seqLens [B] (each request's length after the append). On error
// the plan is left as it was.
func (p *Plan) Build(appendIndptr, seqLens []int32) error {
	if len(appendIndptr) == 0 {
		return fmt.Errorf("appendkv: append_indptr is empty (want length batch+1): %w", pagetable.ErrBadCSR)
	}
	bi, pos, err := pagetable.GetBatchIndicesPositionsTo(p.BatchIndices, p.Positions, appendIndptr, seqLens, int(appendIndptr[len(appendIndptr)-1]))
	if err != nil {
		return fmt.Errorf("appendkv: plan: %w", err)
	}
	p.BatchIndices, p.Positions = bi, pos
	p.AppendIndptr = append(p.AppendIndptr[:0], appendIndptr...)
	p.SeqLens = append(p.SeqLens[:0], seqLens...)
	return nil
}

// BuildFromTable plans a step whose lengths come from the post-append page
// table: seq_lens = get_seq_lens(kv_indptr, kv_last_page_len, pageSize).
func (p *Plan) BuildFromTable(table *kernels.PageTable, pageSize int, appendIndptr []int32) error {
	seqLens, err := pagetable.GetSeqLensTo(p.seqScratch, table.KVIndptr, table.KVLastPageLen, pageSize)
	if err != nil {
		return fmt.Errorf("appendkv: plan from page table: %w", err)
	}
	p.seqScratch = seqLens
	return p.Build(appendIndptr, seqLens)
}

// FromAppendCSR adopts the arrays pagetable.Table.ExportAppendTo produced,
// with seqLens [B] from the matching pagetable.CSR export (copied).
func (p *Plan) FromAppendCSR(a *pagetable.AppendCSR, seqLens []int32) error {
	return p.Build(a.AppendIndptr, seqLens)
}

// Nnz is the number of rows the plan appends.
func (p *Plan) Nnz() int { return len(p.BatchIndices) }

// Input is the data of one append step.
type Input struct {
	// AppendKey and AppendValue are the new rows, [nnz, H, D], row i for
	// BatchIndices[i]. Their dtype is the cache's or, for an fp8 cache,
	// f32/f16/bf16 (converted with KScale/VScale; see kernels.AppendParams).
	AppendKey, AppendValue kernels.Tensor
	// Cache is written in place.
	Cache *kernels.PagedKVCache
	// Table is the page table after the reservation for this step.
	Table *kernels.PageTable
	// KScale and VScale: see kernels.AppendParams (0 means 1).
	KScale, VScale float64
}

// Run appends the planned rows on backend b: the module's one append
// runner (stepglue's CPU step runs its appends through it). It checks that
// in.Table has the plan's batch size and seq_lens; the backend then
// validates every input, the page table once, before writing. On error
// nothing is written.
func (p *Plan) Run(b kernels.Backend, in Input) error {
	if in.Cache == nil || in.Table == nil {
		return fmt.Errorf("appendkv: run: nil cache or page table: %w", ErrPlanMismatch)
	}
	if B := in.Table.BatchSize(); B != len(p.SeqLens) || len(in.Table.KVLastPageLen) != B {
		return fmt.Errorf("appendkv: run: page table has batch %d (kv_indptr %d, kv_last_page_len %d), plan has %d: %w",
			B, len(in.Table.KVIndptr), len(in.Table.KVLastPageLen), len(p.SeqLens), ErrPlanMismatch)
	}
	for i, n := range p.SeqLens {
		if got := in.Table.SeqLen(i, in.Cache.Geometry.PageSize); got != int(n) {
			return fmt.Errorf("appendkv: run: request %d has seq_len %d in the page table, %d in the plan: %w", i, got, n, ErrPlanMismatch)
		}
	}
	p.params = kernels.AppendParams{
		AppendKey: in.AppendKey, AppendValue: in.AppendValue,
		BatchIndices: p.BatchIndices, Positions: p.Positions,
		Cache: *in.Cache, Table: *in.Table,
		KScale: in.KScale, VScale: in.VScale,
	}
	err := b.AppendPagedKVCache(&p.params)
	p.params = kernels.AppendParams{} // do not retain the caller's buffers
	if err != nil {
		return fmt.Errorf("appendkv: run on backend %s: %w", b.Name(), err)
	}
	return nil
}

// Clone returns a deep copy of the plan's arrays (for tests and logging).
func (p *Plan) Clone() Plan {
	return Plan{AppendIndptr: slices.Clone(p.AppendIndptr), SeqLens: slices.Clone(p.SeqLens),
		BatchIndices: slices.Clone(p.BatchIndices), Positions: slices.Clone(p.Positions)}
}
