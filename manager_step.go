package pagedkv

import (
	"github.com/pagedkv/pagedkv/cascade"
	"github.com/pagedkv/pagedkv/kernels"
)

// Plan is what a step needs to run: the copies to make first, then
// FlashInfer's arrays for appending the step's tokens and attending over
// each request's pages. B is the number of requests in the step, nnz the
// number of tokens appended. Every slice is owned by the Manager and reused:
// a Plan is valid until the next Reserve.
type Plan struct {
	// Requests are the step's requests in batch order (the order given to
	// Reserve): batch index b is Requests[b].
	Requests []RequestID
	// Copies must be performed before any append: copy entries
	// [0, Entries) of page Src to page Dst, every head, K and V
	// (copy-on-write of a shared partial page).
	Copies []CopyOp

	// QOIndptr [B+1] (FlashInfer's qo_indptr and append_indptr): request b
	// appends and queries rows QOIndptr[b]:QOIndptr[b+1].
	QOIndptr []int32
	// BatchIndices [nnz] and Positions [nnz] are append_paged_kv_cache's
	// arguments: row i goes to token Positions[i] of request
	// BatchIndices[i], counted from the request's first held page.
	BatchIndices, Positions []int32
	// Drafts [B] is how many of request b's rows are draft tokens (the last
	// Drafts[b] of them; see [Manager.ReserveSpec]); all zero for Reserve.
	Drafts []int32
	// TokenIDs [nnz] are the tokens of the rows; TokenPositions [nnz] their
	// absolute positions in their requests (for RoPE). TokenPositions[i] ==
	// Positions[i] unless a sliding window released leading pages.
	TokenIDs, TokenPositions []int32

	// KVIndptr [B+1], KVPageIndices [KVIndptr[B]], KVLastPageLen [B] and
	// SeqLens [B] are the paged KV table after the append (see package
	// pagetable for the empty-request rule).
	KVIndptr, KVPageIndices, KVLastPageLen, SeqLens []int32

	// BlockTables [B*BlockTablesStride] (nil unless
	// [Config.BlockTablesStride] > 0) is the same page table in the padded
	// contract of FlashInfer's trtllm_batch_decode_with_kv_cache (trtllm-gen
	// and XQA) and cudnn_batch_decode_with_kv_cache: block_tables[B,
	// BlockTablesStride] int32, row-major; row b is
	// KVPageIndices[KVIndptr[b]:KVIndptr[b+1]] then [BlockTablesPad] up to
	// the stride, and SeqLens[b] is its seq_lens (the tokens on those
	// pages). Both forms name the same pages in the same order: a page a
	// sliding window released is in neither (the row starts at the first
	// held page, as the CSR does). BlockTablesStride is the stride (0 when
	// there are no tables).
	BlockTables       []int32
	BlockTablesStride int

	// WindowLeft is FlashInfer's window_left: WindowTokens-1, or -1 for full
	// attention. Attention over the kept pages with this window equals
	// attention over the whole sequence with it.
	WindowLeft int

	// Chunked local attention (a chunked group of a [HybridManager]) reads
	// only the current chunk, and a step's rows may span chunks, so its
	// attention is not the append table: FlashInfer's batch prefill runs on
	// these arrays instead, one attention entry per run of a request's rows
	// inside one chunk (AttnRequests[i] is its batch index), over the pages
	// from that chunk's start to its last row. Rows keep the append order,
	// so AttnQOIndptr splits QOIndptr. Causal, WindowLeft -1. Nil for every
	// other group, whose attention uses QOIndptr and the KV arrays above.
	AttnQOIndptr, AttnKVIndptr, AttnKVPageIndices, AttnKVLastPageLen, AttnRequests []int32

	// Cascade, when not nil, is a multi-level cascade layout of the same
	// attention: shared prefixes are read once per level. Full and MLA
	// groups share any common prefix; a sliding or chunked group of a
	// [HybridManager] only pages every sharing row sees in full (see
	// docs/manager.md, "Cascade with windows"), with CascadeWindowLeft
	// per level. Its request IDs are batch indices; use
	// [cascade.Layout.QueryRows] to order queries. Nil means run flat.
	// Like every slice of the Plan, the layout is the Manager's and is
	// reused: it is valid until the next Reserve, which overwrites it in
	// place; copy its slices to keep it longer.
	Cascade *cascade.Layout
	// CascadeWindowLeft [len(Cascade.Levels)] is each level's window_left
	// (nil when Cascade is nil): -1 on every shared level, WindowLeft on the
	// last (each request's own pages, the only causal level). Pass it as
	// [cascade.Params.LevelWindowLeft]. FlashInfer's
	// MultiLevelCascadeAttentionWrapper.plan takes one window_left for all
	// levels; W-1 on every level is exact as well here (every shared level
	// of a sliding group holds fewer than W keys, so the window masks
	// nothing on it), or run one BatchPrefillWithPagedKVCacheWrapper per
	// level with its window_left and merge_state_in_place.
	CascadeWindowLeft []int

	// StateIndices [B] is, in a state group's Plan (layergroup.State; nil
	// in every other group's), request b's state slot: the page whose
	// conv and recurrent state its layers read and update in place (the
	// state_indices / cache_indices of Mamba-2's and Gated DeltaNet's
	// kernels, int32). A state group's Plan has Requests, QOIndptr (their
	// query_start_loc), TokenIDs, TokenPositions and Drafts of the step,
	// its Copies (the frozen slots to copy into these first, whole pages)
	// and no KV arrays; see docs/state-groups.md.
	StateIndices []int32
	// Indexer is, in an indexer group's Plan ([IndexerAttention]), the
	// byte layout of its pages; nil in every other group's. The page
	// arrays of that Plan are its MLA group's (the same slices): indexer
	// page p is MLA page p, in the indexer's own tensors.
	Indexer *IndexerLayout
}

// BlockTablesPad is the page ID in [Plan.BlockTables] past each request's
// pages. Kernels read only the ceil(seq_lens[b] / page_size) entries of a
// row; 0 is what FlashInfer's tests and vLLM put in unused entries, and it
// is a page of every pool, so a kernel that fetches a tile's page IDs
// ahead reads a valid page (masked) and never out-of-bounds memory.
const BlockTablesPad = 0

// AttentionKind is the attention the step runs, by the module's one
// decision ([kernels.AttentionKindOf]): Cascade with a cascade layout,
// Chunked with a chunked group's Attn arrays, Decode when every request
// has one row, Prefill otherwise. stepglue and the C ABI's
// pagedkv_plan.attention_kind (so the Python binding) take it from here.
func (p *Plan) AttentionKind() kernels.AttentionKind {
	return kernels.AttentionKindOf(p.QOIndptr, p.Cascade != nil, p.AttnQOIndptr != nil)
}

// ---- Per step ----

// Reserve starts a step: for each i it reserves ntokens[i] token slots in
// request ids[i] for the next ntokens[i] of its known tokens (prompt tokens
// not yet computed, or the last sampled token), evicting idle cached pages
// if the pool is short, and returns the step's [Plan]. It is all-or-nothing:
// on any error (an unknown, preempted or repeated request, a count that is
// negative or exceeds the request's uncomputed tokens, or fewer free plus
// evictable pages than the step needs, which wraps [ErrOutOfPages]) nothing
// changes, the cache included.
//
// After the engine has run the step, [Manager.Commit] records it;
// [Manager.Abort] undoes it.
func (m *Manager) Reserve(ids []RequestID, ntokens []int32) (*Plan, error) {
	return m.ReserveSpec(ids, ntokens, nil)
}

// Commit records that the engine ran the reserved step: the reserved tokens
// now have KV, pages they filled are published to the prefix cache, pages
// that left a sliding window are released, and sampled[b] (unless
// [NoToken]) is appended to request b's tokens. sampled is nil (nothing
// sampled) or has one entry per request of the step; a token may be
// sampled only by a request whose step reached the end of its known tokens.
// On error nothing changes and the step stays pending.
func (m *Manager) Commit(sampled []int32) error { return m.core.commit(nil, sampled) }

// Abort undoes the reserved step: every request gets back its length before
// Reserve (and loses its draft tokens) and the pages reserved for the step
// are released. Copy-on-write
// moves are kept, so the engine must have performed [Plan.Copies] (the first
// thing a step does); if it may not have, Preempt the step's requests
// after Abort instead of running them again.
func (m *Manager) Abort() error { return m.core.abort() }

// Pending reports whether a step is reserved and not yet committed or
// aborted.
func (m *Manager) Pending() bool { return m.core.pending() }
