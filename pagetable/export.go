package pagetable

import (
	"fmt"
	"math"
	"slices"
	"unsafe"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/ragged"
)

// pageIDsAsInt32 views page IDs as the int32 array FlashInfer takes, so the
// export of a page list is one memmove. allocator.PageID is defined as int32,
// so both types have the same size, alignment and representation; the view
// is read-only and does not outlive the call that copies it.
func pageIDsAsInt32(pages []allocator.PageID) []int32 {
	return unsafe.Slice((*int32)(unsafe.SliceData(pages)), len(pages))
}

// Fail to compile if PageID ever stops being a 4-byte integer.
var _ = [1]struct{}{}[unsafe.Sizeof(allocator.PageID(0))-4]

// CSR is a batch's page table in FlashInfer's layout (see the package doc).
// The kernels see only held pages, so SeqLens[b] == Len-Start of request b.
//
//   - KVIndptr      [B+1], KVIndptr[0] == 0, non-decreasing
//   - KVPageIndices [KVIndptr[B]], physical page IDs
//   - KVLastPageLen [B], 0 for a request with 0 pages, else 1..pageSize
//   - SeqLens       [B], tokens per request
type CSR struct {
	KVIndptr, KVPageIndices, KVLastPageLen, SeqLens []int32
}

// AppendCSR describes where the tokens of an append step land, in
// FlashInfer's layout (the arguments of append_paged_kv_cache):
//
//   - AppendIndptr [B+1], AppendIndptr[0] == 0, request b appends rows
//     [AppendIndptr[b], AppendIndptr[b+1])
//   - BatchIndices [nnz], the request of each appended row
//   - Positions    [nnz], the token index of each row in its request's held
//     tokens (relative to Start), after the append
type AppendCSR struct {
	AppendIndptr, BatchIndices, Positions []int32
}

// ExportTo writes the page table of the sequences ids, in that order, into
// dst, reusing the capacity of dst's slices (each is reset to [:0] and
// grown only if too small). An ID may appear more than once. If an ID is
// unknown, or the batch's pages times the page size reach 2^32 (FlashInfer's
// 32-bit token offsets, the bound [ValidateCSR] checks, so ExportTo never
// emits a table ValidateCSR rejects), ExportTo returns an error and leaves
// dst untouched.
func (t *Table) ExportTo(dst *CSR, ids []SeqID) error {
	hints, slotsIdx := t.scratchSlots, t.scratchSlots[:0]
	var npages int64
	for i, id := range ids {
		si, ok := t.slotOf(id, hints, i)
		if !ok {
			t.scratchSlots = slotsIdx
			return fmt.Errorf("%w: export: ids[%d] = %d", ErrUnknownSeq, i, id)
		}
		slotsIdx = append(slotsIdx, si)
		npages += int64(len(t.slots[si].pages))
	}
	t.scratchSlots = slotsIdx
	if npages > math.MaxInt32 || npages*int64(t.pageSize) >= maxTokenSlots {
		return fmt.Errorf("%w: export: %d sequences hold %d pages of %d tokens = %d token slots, want < 2^32 (32-bit token offsets)",
			ErrBadArgument, len(ids), npages, t.pageSize, npages*int64(t.pageSize))
	}

	b := len(ids)
	indptr := slices.Grow(dst.KVIndptr[:0], b+1)[:b+1]
	indices := slices.Grow(dst.KVPageIndices[:0], int(npages))[:npages]
	last := slices.Grow(dst.KVLastPageLen[:0], b)[:b]
	seqLens := slices.Grow(dst.SeqLens[:0], b)[:b]
	ps := t.pageSize
	off := 0
	indptr[0] = 0
	for i, si := range slotsIdx {
		s := &t.slots[si]
		off += copy(indices[off:], pageIDsAsInt32(s.pages))
		indptr[i+1] = int32(off)
		held := s.len - s.start
		seqLens[i] = int32(held)
		if held == 0 {
			last[i] = 0
		} else {
			last[i] = int32((held-1)%ps + 1)
		}
	}
	dst.KVIndptr, dst.KVPageIndices, dst.KVLastPageLen, dst.SeqLens = indptr, indices, last, seqLens
	return nil
}

// ExportAppendTo writes, for the last appendLens[i] tokens of each sequence
// ids[i] (normally the tokens just reserved), the append indptr and the
// batch index and position of every appended row, into dst's reused slices.
// Positions are relative to Start, as FlashInfer sees the held pages. Each
// appendLens[i] must be in 0..Len-Start and the total must fit int32;
// otherwise ExportAppendTo returns an error and leaves dst untouched.
func (t *Table) ExportAppendTo(dst *AppendCSR, ids []SeqID, appendLens []int32) error {
	if len(ids) != len(appendLens) {
		return fmt.Errorf("%w: export append: %d sequence IDs but %d append lengths", ErrBadArgument, len(ids), len(appendLens))
	}
	hints, slotsIdx := t.scratchSlots, t.scratchSlots[:0]
	var nnz int64
	for i, id := range ids {
		si, ok := t.slotOf(id, hints, i)
		if !ok {
			t.scratchSlots = slotsIdx
			return fmt.Errorf("%w: export append: ids[%d] = %d", ErrUnknownSeq, i, id)
		}
		s := &t.slots[si]
		if n := appendLens[i]; n < 0 || int(n) > s.len-s.start {
			t.scratchSlots = slotsIdx
			return fmt.Errorf("%w: export append: appendLens[%d] = %d, want 0..%d (held tokens of sequence %d)",
				ErrBadArgument, i, n, s.len-s.start, id)
		}
		slotsIdx = append(slotsIdx, si)
		nnz += int64(appendLens[i])
	}
	t.scratchSlots = slotsIdx
	if nnz > math.MaxInt32 {
		return fmt.Errorf("%w: export append: %d rows, more than int32 indexes", ErrBadArgument, nnz)
	}

	b := len(ids)
	indptr := slices.Grow(dst.AppendIndptr[:0], b+1)[:b+1]
	batch := slices.Grow(dst.BatchIndices[:0], int(nnz))[:nnz]
	pos := slices.Grow(dst.Positions[:0], int(nnz))[:nnz]
	indptr[0] = 0
	off := 0
	for i, si := range slotsIdx {
		s := &t.slots[si]
		n := int(appendLens[i])
		first := int32(s.len - s.start - n)
		for k := range n {
			batch[off+k] = int32(i)
			pos[off+k] = first + int32(k)
		}
		off += n
		indptr[i+1] = int32(off)
	}
	dst.AppendIndptr, dst.BatchIndices, dst.Positions = indptr, batch, pos
	return nil
}

// BlockTablesTo lays the table out as the padded block_tables [B, cols]
// of FlashInfer's trtllm-gen, XQA and cuDNN decode (and xFormers), into dst
// reset to [:0] and grown only if too small: row b is request b's
// KVPageIndices, then pad. With SeqLens it names the same pages in the
// same order as the CSR. Every request must hold at most cols pages (it
// panics otherwise: the caller bounds the rows before exporting).
func (c *CSR) BlockTablesTo(dst []int32, cols int, pad int32) []int32 {
	return ragged.FillBlockTables(dst, c.KVIndptr, c.KVPageIndices, cols, pad)
}
