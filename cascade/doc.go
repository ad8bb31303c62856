// Package cascade owns multi-level cascade attention (FlashInfer's
// MultiLevelCascadeAttentionWrapper): the per-level arrays that let a
// prefix shared by many requests be attended once per level instead of once
// per request, the builder that derives them from a tree of shared
// prefixes, and the run that computes the attention on a kernels.Backend.
//
// # Layout
//
// All levels index one paged KV cache and one ragged query tensor
// q [nnz_qo, Hq, D]. Level l is a [Level]: QOIndptr (length groups+1,
// QOIndptr[0] == 0, QOIndptr[groups] == nnz_qo) splits the query rows into
// that level's groups, and the CSR page table KVIndptr (groups+1),
// KVPageIndices (KVIndptr[groups]) and KVLastPageLen (groups) gives each group
// its own KV segment at that level, not the cumulative KV. A group without
// pages has KVLastPageLen 0. Level 0 is the most shared. Query row r sees
// the segments of the groups that contain r on every level.
//
// [Build] makes the levels from a tree of [Node]s: each node is a run of
// pages shared by every request below it, the root is level 0, and a
// node's depth is its level, except that a depth whose groups hold no pages
// at all (for example an empty root above unrelated prefixes) is dropped
// unless it is the last level: it would cost a launch and a merge for
// nothing. The queries are ordered by a depth-first walk
// (each child's subtree in order, then the node's own requests), so every
// group is a contiguous run of rows; [Layout.QueryRows] maps the cascade's
// rows back to the caller's request order. docs/attention.md walks through
// FlashInfer's 3-level, 8-request figure.
//
// [Run] computes cascade attention: each level is one batch prefill with
// LSE (causal, bottom-right aligned within the group's segment, only on the
// last level, and only when [Params.Causal]), and the levels' states are
// merged with merge_state (base-2 LSE; an empty group's state (0, -inf) is
// the identity). The result equals attention over the concatenation of the
// request's segments, whatever the order of the merge.
//
// # Invariants
//
//   - Every level of a [Layout] has the same nnz_qo rows, and each request's
//     rows [Layout.RequestQOIndptr] lie inside one group of every level.
//   - For each request, the pages of its groups, level 0 first, are its
//     prefix path's pages in order; only the last level's group is per
//     request, so the causal mask (last level only) never mixes requests.
//   - KVLastPageLen is 0 exactly for groups without pages, else
//     1..page_size.
//
// # Concurrency
//
// Build and the Layout it returns are plain values: a Layout may be read by
// several goroutines at once. Run is safe for concurrent use with distinct
// outputs, to the extent the backend is.
package cascade
