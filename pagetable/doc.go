// Package pagetable owns the per-sequence page lists of a paged KV cache and
// exports them in FlashInfer's CSR form. It decides which page of the pool
// ([allocator.Allocator]) holds which token of which sequence; it never
// touches K/V data, but tells the engine which page copies copy-on-write
// requires ([CopyOp]).
//
// # Conventions
//
// A sequence holds Len tokens, of which tokens [Start, Len) are on pages
// (Start > 0 only after [Table.ReleaseWindow]; it is a multiple of the page
// size). Token t (Start <= t < Len) lives on page Pages[(t-Start)/pageSize],
// entry (t-Start)%pageSize. The kernels see only the held tokens, so the
// exported seq_len is Len-Start, and positions in [AppendCSR] are relative to
// Start.
//
// The exported CSR ([CSR], int32, FlashInfer names) for a batch of B
// sequences is:
//
//   - KVIndptr, length B+1: KVIndptr[0] == 0, KVIndptr[b+1]-KVIndptr[b] is
//     the number of pages of request b.
//   - KVPageIndices, length KVIndptr[B]: physical page IDs, request after
//     request, in token order.
//   - KVLastPageLen, length B: the empty-sequence rule is that a request with
//     0 pages has KVLastPageLen 0, and any other request has
//     1 <= KVLastPageLen <= pageSize (the entries used in its last page).
//   - SeqLens, length B: (pages-1)*pageSize + KVLastPageLen, or 0 for 0 pages
//     (flashinfer.page.get_seq_lens).
//
// # Copy-on-write and fork
//
// [Table.Fork] gives the child every page of the parent, each retained once
// more. Full pages are never written again, so sharing them is free. A page
// is written only while its reference count is 1: when a sequence is about to
// append into a partial last page that has other holders (after a fork, a
// [Table.Truncate] back into a shared page, or [Table.AddShared] from the
// prefix cache), [Table.Reserve] moves it to a fresh page and returns a
// [CopyOp]; the engine must copy entries [0, Entries) of Src to Dst (every
// head, K and V) before it writes the new tokens or releases any other holder
// of Src.
//
// # Failures
//
// Out of pages is predictable and wraps [allocator.ErrOutOfPages]. Unknown or
// existing sequence IDs wrap [ErrUnknownSeq] and [ErrSeqExists]; malformed
// arguments (length mismatch, negative counts, duplicate IDs in a batch,
// truncation outside [Start, Len], int32 overflow) wrap [ErrBadArgument]; a
// malformed CSR from outside wraps [ErrBadCSR] and names the request index and
// the value. Every operation validates all of its input and obtains every
// page it needs before it changes anything, so a failed call changes nothing:
// not the table, not the allocator, not the caller's buffers.
//
// # Invariants
//
//   - 0 <= Start <= Len <= MaxInt32, Start % pageSize == 0, and a sequence
//     holds exactly ceil((Len-Start)/pageSize) pages.
//   - Every held page has reference count >= the number of times the table
//     holds it (other holders, such as a prefix cache, account for the rest),
//     and no sequence holds a page twice.
//
// [Table.CheckInvariants] verifies these; in builds with the invariants tag or
// -race each mutation also checks the sequences it touched.
//
// # Allocation
//
// Reserve, ExportTo and ExportAppendTo reuse scratch and caller buffers: once
// capacities have grown to the working set, a decode step allocates nothing.
//
// # Concurrency
//
// A [Table] is not safe for concurrent use; it is owned by the engine's
// scheduler goroutine. Its allocator may be shared with other owners (it is
// safe for concurrent use). The standalone functions [GetSeqLensTo],
// [GetBatchIndicesPositionsTo] and [ValidateCSR] have no state and are safe
// for concurrent use.
//
// See docs/pagetable.md for a worked example.
package pagetable
