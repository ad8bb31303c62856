/*
 * pagedkv.h - the C ABI of the pagedkv KV-cache manager.
 *
 * Build the library with scripts/cabi.sh (or by hand):
 *   go build -buildmode=c-shared  -o libpagedkv.so ./cabi
 *   go build -buildmode=c-archive -o libpagedkv.a  ./cabi
 * and include this header (not the header go build writes next to the
 * library). docs/c-abi.md is the full contract; the rules in short:
 *
 *  - A manager is a handle (pagedkv_manager, never 0), not a pointer. A
 *    destroyed or never-created handle gets PAGEDKV_ERR_BAD_HANDLE.
 *  - Every call returns PAGEDKV_OK (0) or an error code; the calling
 *    thread's pagedkv_last_error() then names the bad value. A call that
 *    fails changes nothing (as in Go), except PAGEDKV_ERR_INTERNAL, which
 *    poisons the handle: only stats, last_error and destroy still work.
 *  - No Go panic crosses this boundary; the library recovers it and
 *    returns PAGEDKV_ERR_INTERNAL.
 *  - Threads: one thread at a time per handle (the scheduler thread);
 *    a concurrent call gets PAGEDKV_ERR_BUSY. pagedkv_get_stats may be called
 *    from any thread at any time. Different handles are independent.
 *  - The arrays of a pagedkv_plan point into buffers the manager owns
 *    (zero copy). They stay valid and unchanged until the next successful
 *    reserve (pagedkv_reserve, _reserve_spec, or their pagedkv_hybrid_
 *    forms) or pagedkv_destroy of the handle; every other call,
 *    failed reserves included, leaves them alone. Never free or write them.
 *  - The library keeps no pointer the caller passes in after the call
 *    returns (inputs are copied where they are kept).
 */
#ifndef PAGEDKV_H
#define PAGEDKV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any incompatible change of this header. */
#define PAGEDKV_ABI_VERSION 2

typedef uint64_t pagedkv_manager;

/* Error codes. Each maps one Go sentinel error of package pagedkv. */
enum {
	PAGEDKV_OK = 0,
	PAGEDKV_ERR_OUT_OF_PAGES = 1,     /* ErrOutOfPages: preempt and retry */
	PAGEDKV_ERR_UNKNOWN_REQUEST = 2,  /* ErrUnknownRequest */
	PAGEDKV_ERR_REQUEST_EXISTS = 3,   /* ErrRequestExists */
	PAGEDKV_ERR_PREEMPTED = 4,        /* ErrPreempted */
	PAGEDKV_ERR_NOT_PREEMPTED = 5,    /* ErrNotPreempted */
	PAGEDKV_ERR_STEP_PENDING = 6,     /* ErrStepPending */
	PAGEDKV_ERR_NO_STEP = 7,          /* ErrNoStep */
	PAGEDKV_ERR_BAD_ARGUMENT = 8,     /* ErrBadArgument, or a bad pointer/length */
	PAGEDKV_ERR_BAD_CONFIG = 9,       /* ErrBadConfig */
	PAGEDKV_ERR_NOT_CACHED = 10,      /* ErrNotCached */
	PAGEDKV_ERR_PIN_LIMIT = 11,       /* ErrPinLimit */
	PAGEDKV_ERR_UNKNOWN_PIN = 12,     /* ErrUnknownPin */
	PAGEDKV_ERR_BAD_HANDLE = 13,      /* no such manager */
	PAGEDKV_ERR_BUSY = 14,            /* another thread is inside a call on this handle */
	PAGEDKV_ERR_AUDIT = 15,           /* pagedkv_audit found a broken invariant */
	PAGEDKV_ERR_INTERNAL = 16         /* a recovered Go panic (a bug); the handle is poisoned */
};

/* Config of pagedkv_create (Go: pagedkv.Config). Zero means the Go default
 * wherever Go has one. */
typedef struct {
	int64_t num_pages;               /* pages in the pool, >= 1 */
	int64_t page_size;               /* tokens per page, >= 1 */
	int64_t window_tokens;           /* sliding window W; 0 = full attention */
	int64_t priorities;              /* eviction priority levels 1..16; 0 = 4 */
	int64_t max_pinned_pages;        /* 0 = no cap */
	uint64_t hash_seed;              /* 0 = random */
	int64_t cascade_min_saved_pages; /* 0 = 16; negative disables cascade plans */
} pagedkv_config;

/* A prefix-cache namespace: three byte strings (not NUL-terminated; a NULL
 * pointer needs length 0). */
typedef struct {
	const char *tenant;
	int64_t tenant_len;
	const char *lora;
	int64_t lora_len;
	const char *salt;
	int64_t salt_len;
} pagedkv_namespace;

/* A request for pagedkv_add (Go: pagedkv.Request). */
typedef struct {
	pagedkv_namespace ns;
	const int32_t *prompt; /* [prompt_len] tokens, each >= 0; copied */
	int64_t prompt_len;
	int32_t priority;      /* 0 .. priorities-1 */
	int32_t no_cache;      /* nonzero: neither reuse nor publish pages */
	int64_t capacity_tokens;
} pagedkv_request;

/* An int32 array the manager owns: data[0 .. len) are the values;
 * cap >= len is the capacity of the same buffer (a binding may keep one view
 * of [0, cap) while data and cap stay the same). data is NULL when cap is 0. */
typedef struct {
	const int32_t *data;
	int64_t len;
	int64_t cap;
} pagedkv_array;

/* A copy-on-write page copy (Go: pagedkv.CopyOp): copy entries
 * [0, entries) of page src to page dst, every head, K and V. */
typedef struct {
	int32_t src;
	int32_t dst;
	int32_t entries;
} pagedkv_copy;

/* One level of a multi-level cascade (FlashInfer's
 * MultiLevelCascadeAttentionWrapper.plan, one entry of each *_arr list). */
typedef struct {
	pagedkv_array qo_indptr;        /* [groups+1] */
	pagedkv_array kv_indptr;        /* [groups+1] */
	pagedkv_array kv_indices;       /* [kv_indptr[groups]] */
	pagedkv_array kv_last_page_len; /* [groups] */
} pagedkv_level;

/* A step's plan (Go: pagedkv.Plan). B = batch_size requests, in the order of
 * reserve's ids; nnz rows (tokens appended). The caller owns this struct;
 * pagedkv_reserve fills it. */
typedef struct {
	int64_t batch_size;
	int64_t nnz;
	int64_t window_left;  /* FlashInfer window_left: W-1, or -1 */
	pagedkv_array copies; /* [3*num copies] int32: pagedkv_copy triples, do first */
	pagedkv_array qo_indptr;        /* [B+1] qo_indptr / append_indptr */
	pagedkv_array batch_indices;    /* [nnz] append_paged_kv_cache batch_indices */
	pagedkv_array positions;        /* [nnz] append_paged_kv_cache positions */
	pagedkv_array token_ids;        /* [nnz] the rows' tokens */
	pagedkv_array token_positions;  /* [nnz] absolute positions (RoPE) */
	pagedkv_array kv_indptr;        /* [B+1] */
	pagedkv_array kv_page_indices;  /* [kv_indptr[B]] */
	pagedkv_array kv_last_page_len; /* [B] */
	pagedkv_array seq_lens;         /* [B] */
	pagedkv_array query_rows;       /* [nnz] when num_levels > 0: cascade row r holds plan row query_rows[r] */
	int64_t num_levels;             /* 0: run flat; else a cascade of num_levels levels */
	const pagedkv_level *levels;    /* [num_levels], level 0 (most shared) first */
	pagedkv_array drafts;           /* [B] draft rows of request b (its last rows); all 0 unless reserve_spec */
} pagedkv_plan;

/* Hybrid attention models (Go: pagedkv.HybridManager): several layer
 * groups on one page pool. A group's kind: */
enum {
	PAGEDKV_GROUP_FULL = 0,    /* full attention */
	PAGEDKV_GROUP_SLIDING = 1, /* sliding window of window_tokens */
	PAGEDKV_GROUP_CHUNKED = 2, /* chunked local attention, chunks of chunk_tokens */
	PAGEDKV_GROUP_MLA = 3      /* full attention on MLA storage */
};

/* One layer group (Go: pagedkv.LayerGroup). Every group has the same
 * num_layers (see package layergroup). */
typedef struct {
	int64_t kind;          /* PAGEDKV_GROUP_* */
	int64_t window_tokens; /* sliding: W >= 1; else 0 */
	int64_t chunk_tokens;  /* chunked: a positive multiple of page_size; else 0 */
	int64_t num_layers;    /* >= 1 */
} pagedkv_layer_group;

/* One group's plan of a hybrid step (Go: the group's pagedkv.Plan). plan is
 * the group's dense plan: its page table, positions relative to the group's
 * first held page, window_left and cascade levels; plan.copies are this
 * group's copies (all of them are also in the pool-wide list). Every group
 * lists the same requests, rows and tokens. */
typedef struct {
	pagedkv_plan plan;
	pagedkv_array cascade_window_left;   /* [plan.num_levels] each level's window_left; len 0 when flat */
	/* A chunked group's attention (len 0 for every other kind): A entries,
	 * each a run of one request's rows inside one chunk, over that chunk's
	 * pages; run batch prefill on these (causal, window_left -1) instead of
	 * the plan's qo_indptr and kv arrays. The append still uses the plan's. */
	pagedkv_array attn_qo_indptr;        /* [A+1] splits qo_indptr */
	pagedkv_array attn_kv_indptr;        /* [A+1] */
	pagedkv_array attn_kv_page_indices;  /* [attn_kv_indptr[A]] */
	pagedkv_array attn_kv_last_page_len; /* [A] */
	pagedkv_array attn_requests;         /* [A] batch index of each entry */
} pagedkv_group_plan;

/* Stats (Go: pagedkv.Stats), every field int64, in this order. New fields
 * are only ever appended; pass sizeof(pagedkv_stats). */
typedef struct {
	int64_t total_pages, free_pages, used_pages, evictable_pages, pinned_idle_pages;
	int64_t cached_pages, pinned_pages, shared_pages;
	int64_t requests, preempted_requests;
	int64_t prompt_tokens, prompt_hit_tokens, computed_tokens, resumed_tokens, resume_hit_tokens;
	int64_t steps, preemptions, copied_pages, published_pages, duplicate_pages;
	int64_t evicted_pages, eviction_freed_pages, inner_victims, window_released_pages, chains_cut;
	int64_t draft_tokens, accepted_draft_tokens; /* speculative steps (ABI 2) */
} pagedkv_stats;

/* One group's numbers of a hybrid manager (Go: pagedkv.GroupStats), every
 * field int64, in this order. New fields are only ever appended; pass
 * sizeof(pagedkv_group_stats). */
typedef struct {
	int64_t kind;                  /* PAGEDKV_GROUP_* */
	int64_t cached_pages;          /* pages in the group's prefix cache */
	int64_t evictable_pages;       /* of those, idle and evictable */
	int64_t servable_tokens;       /* prompt tokens the group's cache alone could have served */
	int64_t published_pages, evicted_pages, copied_pages;
	int64_t window_released_pages; /* released: out of the window, or a finished chunk */
} pagedkv_group_stats;

/* One request's state (Go: Has, Running, Computed, Tokens, Pages). */
typedef struct {
	int64_t running;     /* 1 running (holds pages), 0 preempted */
	int64_t computed;    /* tokens with KV (excluding the pending step's) */
	int64_t num_tokens;  /* tokens known */
	int64_t start;       /* first token still on a page (sliding window) */
	int64_t num_pages;   /* pages held */
} pagedkv_request_state;

#ifndef PAGEDKV_NO_PROTOTYPES

/* Library information. */
int32_t pagedkv_abi_version(void);
/* The calling thread's message for its last failed call (never NULL; "" if
 * none). Valid until the thread's next pagedkv call. */
const char *pagedkv_last_error(void);

/* Create and destroy. cfg_size must be sizeof(pagedkv_config). */
int32_t pagedkv_create(const pagedkv_config *cfg, size_t cfg_size, pagedkv_manager *out);
int32_t pagedkv_destroy(pagedkv_manager m);

/* Per request. matched_tokens may be NULL. */
int32_t pagedkv_add(pagedkv_manager m, uint64_t id, const pagedkv_request *req, int64_t *matched_tokens);
int32_t pagedkv_extend(pagedkv_manager m, uint64_t id, const int32_t *tokens, int64_t n);
int32_t pagedkv_fork(pagedkv_manager m, uint64_t parent, uint64_t child);
int32_t pagedkv_preempt(pagedkv_manager m, uint64_t id);
int32_t pagedkv_resume(pagedkv_manager m, uint64_t id, int64_t *matched_tokens);
int32_t pagedkv_release(pagedkv_manager m, uint64_t id);

/* Per step. ids [n], ntokens [n]; sampled is NULL (nothing sampled) or
 * [n_sampled == batch size], -1 = no token. */
int32_t pagedkv_reserve(pagedkv_manager m, const uint64_t *ids, const int32_t *ntokens, int64_t n, pagedkv_plan *out);
int32_t pagedkv_commit(pagedkv_manager m, const int32_t *sampled, int64_t n_sampled);
int32_t pagedkv_abort(pagedkv_manager m);

/* Speculative decoding (Go: ReserveSpec, CommitSpec). Request ids[i]'s draft
 * tokens are drafts[draft_indptr[i] .. draft_indptr[i+1]); draft_indptr
 * [n+1] starts at 0 and never decreases (NULL: no drafts at all). A step
 * reserved with drafts is committed with pagedkv_commit_spec: accepted [n]
 * is how many of each request's drafts were accepted (NULL with n_accepted
 * 0 only for a batch of 0 requests), sampled as in pagedkv_commit. */
int32_t pagedkv_reserve_spec(pagedkv_manager m, const uint64_t *ids, const int32_t *ntokens, int64_t n,
                             const int32_t *draft_indptr, const int32_t *drafts, pagedkv_plan *out);
int32_t pagedkv_commit_spec(pagedkv_manager m, const int32_t *accepted, int64_t n_accepted,
                            const int32_t *sampled, int64_t n_sampled);
/* Cut request id's tokens to its first n (Go: Truncate). */
int32_t pagedkv_truncate(pagedkv_manager m, uint64_t id, int64_t n);

/* Operations. get_stats may be called from any thread. */
int32_t pagedkv_get_stats(pagedkv_manager m, pagedkv_stats *out, size_t out_size);
int32_t pagedkv_audit(pagedkv_manager m);
int32_t pagedkv_evict(pagedkv_manager m, int64_t npages, int64_t *freed);
int32_t pagedkv_pin(pagedkv_manager m, const pagedkv_namespace *ns, const int32_t *tokens, int64_t n,
                    uint64_t *pin, int64_t *pinned_tokens);
int32_t pagedkv_unpin(pagedkv_manager m, uint64_t pin);

/* Inspection. get_request_state fails with PAGEDKV_ERR_UNKNOWN_REQUEST for an
 * unknown id. request_tokens and request_pages copy into dst [cap] and set
 * *n to the full count; if cap < *n only the first cap values are written. */
int32_t pagedkv_get_request_state(pagedkv_manager m, uint64_t id, pagedkv_request_state *out);
int32_t pagedkv_request_tokens(pagedkv_manager m, uint64_t id, int32_t *dst, int64_t cap, int64_t *n);
int32_t pagedkv_request_pages(pagedkv_manager m, uint64_t id, int32_t *dst, int64_t cap, int64_t *n);
int32_t pagedkv_pending(pagedkv_manager m, int32_t *pending);

/* Hybrid managers. A hybrid handle takes every call above that has no
 * dense-only meaning (add, extend, fork, preempt, resume, release, commit,
 * commit_spec, abort, truncate, get_stats, audit, evict, request_tokens,
 * destroy); reserve, reserve_spec, pin, unpin, pending, get_request_state
 * and request_pages on a hybrid handle (and the pagedkv_hybrid_ calls on a
 * dense one) fail with PAGEDKV_ERR_BAD_HANDLE. A HybridManager has no pins.
 * cfg.window_tokens must be 0 (windows are per group). group_size must be
 * sizeof(pagedkv_layer_group). */
int32_t pagedkv_hybrid_create(const pagedkv_config *cfg, size_t cfg_size, const pagedkv_layer_group *groups,
                              int64_t num_groups, size_t group_size, pagedkv_manager *out);
int32_t pagedkv_hybrid_num_groups(pagedkv_manager m, int64_t *num_groups);
/* A hybrid step: copies receives the pool-wide copies ([3*num copies]
 * int32 pagedkv_copy triples, do first: a copy copies the page in every
 * layer's tensor), groups [num_groups] (num_groups must be the manager's)
 * each group's plan. Arrays stay valid as for pagedkv_reserve. */
int32_t pagedkv_hybrid_reserve(pagedkv_manager m, const uint64_t *ids, const int32_t *ntokens, int64_t n,
                               pagedkv_array *copies, pagedkv_group_plan *groups, int64_t num_groups);
int32_t pagedkv_hybrid_reserve_spec(pagedkv_manager m, const uint64_t *ids, const int32_t *ntokens, int64_t n,
                                    const int32_t *draft_indptr, const int32_t *drafts,
                                    pagedkv_array *copies, pagedkv_group_plan *groups, int64_t num_groups);
/* Group g's numbers; any thread, any time, like pagedkv_get_stats (whose
 * pool-wide numbers a hybrid handle also gives). */
int32_t pagedkv_hybrid_get_group_stats(pagedkv_manager m, int64_t group, pagedkv_group_stats *out, size_t out_size);
/* As get_request_state and request_pages, with the pages of group g. */
int32_t pagedkv_hybrid_request_state(pagedkv_manager m, int64_t group, uint64_t id, pagedkv_request_state *out);
int32_t pagedkv_hybrid_request_pages(pagedkv_manager m, int64_t group, uint64_t id, int32_t *dst, int64_t cap,
                                     int64_t *n);

#endif /* PAGEDKV_NO_PROTOTYPES */

#ifdef __cplusplus
}
#endif

#endif /* PAGEDKV_H */
