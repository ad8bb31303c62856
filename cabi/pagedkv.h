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
 *    a concurrent call gets PAGEDKV_ERR_BUSY, at once or after waiting up
 *    to pagedkv_set_busy_timeout for the call in flight. Lock-free (any
 *    thread, any time): the stats calls (get_stats, get_tier_stats,
 *    hybrid_get_group_stats), hybrid_num_groups, host_memory,
 *    events_endpoint and set_busy_timeout. Different handles are
 *    independent.
 *  - The arrays of a pagedkv_plan point into buffers the manager owns
 *    (zero copy). They stay valid and unchanged until the next successful
 *    reserve (pagedkv_reserve, _reserve_spec, or their pagedkv_hybrid_
 *    forms) or pagedkv_destroy of the handle; every other call,
 *    failed reserves included, leaves them alone. Never free or write them.
 *    Every buffer ever handed out stays allocated until pagedkv_destroy
 *    (or pagedkv_free_memory after pagedkv_destroy_keep_memory), so a
 *    stale pointer reads old values, never freed memory.
 *  - The library keeps no pointer the caller passes in after the call
 *    returns (inputs are copied where they are kept), except the memory
 *    bound with pagedkv_bind_step_buffers (see there).
 */
#ifndef PAGEDKV_H
#define PAGEDKV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any incompatible change of this header. */
#define PAGEDKV_ABI_VERSION 3

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
	PAGEDKV_ERR_INTERNAL = 16,        /* a recovered Go panic (a bug); the handle is poisoned; the message is one line, then the Go stack where it was recovered (cut at the buffer) */
	PAGEDKV_ERR_LOADING = 17          /* ErrLoading: the request waits for onload tier copies */
};

/* Config of pagedkv_create (Go: pagedkv.Config). Zero means the Go default
 * wherever Go has one. Fields are only ever appended: cfg_size may be
 * sizeof(pagedkv_config) or the size of an earlier version of it (up to
 * and including cascade_min_saved_pages: offsetof(pagedkv_config,
 * memory_limit); up to and including memory_limit:
 * offsetof(pagedkv_config, block_tables_stride); up to and including
 * block_tables_stride: offsetof(pagedkv_config, pin_budget); up to and
 * including pin_budget: offsetof(pagedkv_config, state_checkpoint_every));
 * the fields it leaves out take their defaults. */
typedef struct {
	int64_t num_pages;               /* pages in the pool, >= 1 */
	int64_t page_size;               /* tokens per page, >= 1 */
	int64_t window_tokens;           /* sliding window W; 0 = full attention */
	int64_t priorities;              /* eviction priority levels 1..16; 0 = 4 */
	int64_t max_pinned_pages;        /* 0 = no cap */
	uint64_t hash_seed;              /* 0 = random */
	int64_t cascade_min_saved_pages; /* 0 = 16; negative disables cascade plans */
	int64_t memory_limit;            /* bytes the configuration may ask for (Go: Config.MemoryLimit);
	                                    0 = this machine's physical memory; above it create fails
	                                    with PAGEDKV_ERR_BAD_CONFIG naming the bytes needed */
	int64_t block_tables_stride;     /* 0..num_pages: columns of the padded block_tables of every
	                                    plan (Go: Config.BlockTablesStride; pagedkv_get_block_tables);
	                                    0 = none. A step giving a request more pages fails
	                                    with PAGEDKV_ERR_BAD_ARGUMENT */
	double pin_budget;               /* share of num_pages pins may hold at once, 0..1 (Go:
	                                    Config.PinBudget); 0 = no budget. A pin past it fails with
	                                    PAGEDKV_ERR_PIN_LIMIT naming the figures */
	int64_t state_checkpoint_every;  /* hybrid with state groups: also checkpoint a prompt's state every
	                                    this many tokens, a multiple of page_size (Go:
	                                    HybridConfig.StateCheckpointEvery); 0 = prompt ends only.
	                                    Must be 0 without state groups */
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

/* The attention a plan's step runs (Go: kernels.AttentionKind, the same
 * numbers), the library's one decision (Go: pagedkv.Plan.AttentionKind):
 * cascade when the plan has levels, chunked for a chunked group's plan
 * (run batch prefill over its attn_* arrays), decode when every request
 * has exactly one query row (an empty batch included), else prefill. */
enum {
	PAGEDKV_ATTENTION_DECODE = 1,  /* batch decode */
	PAGEDKV_ATTENTION_PREFILL = 2, /* batch prefill over qo_indptr, causal */
	PAGEDKV_ATTENTION_CASCADE = 3, /* multi-level cascade over levels */
	PAGEDKV_ATTENTION_CHUNKED = 4  /* batch prefill over a group plan's attn_* arrays */
};

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
	int64_t attention_kind;         /* PAGEDKV_ATTENTION_*: the attention to run (ABI version 3) */
} pagedkv_plan;

/* The padded page table of the last reserved plan (Go: Plan.BlockTables),
 * the block_tables of FlashInfer's trtllm_batch_decode_with_kv_cache
 * (trtllm-gen, XQA) and cudnn_batch_decode_with_kv_cache, with the plan's
 * seq_lens: row b (block_tables.data[b*stride .. (b+1)*stride)) holds
 * kv_page_indices[kv_indptr[b] .. kv_indptr[b+1]) then PAGEDKV_BLOCK_TABLES_PAD.
 * Same lifetime as the plan's arrays. */
#define PAGEDKV_BLOCK_TABLES_PAD 0
typedef struct {
	pagedkv_array block_tables; /* [batch_size * stride] int32, row-major; len 0 when stride is 0 */
	int64_t stride;             /* the config's block_tables_stride */
	int64_t max_seq_len;        /* stride * page_size: an upper bound of every seq_lens,
	                               fixed for CUDA graphs (max_seq_len / max_sequence_kv) */
} pagedkv_block_tables;

/* Hybrid attention models (Go: pagedkv.HybridManager): several layer
 * groups on one page pool. A group's kind: */
enum {
	PAGEDKV_GROUP_FULL = 0,    /* full attention */
	PAGEDKV_GROUP_SLIDING = 1, /* sliding window of window_tokens */
	PAGEDKV_GROUP_CHUNKED = 2, /* chunked local attention, chunks of chunk_tokens */
	PAGEDKV_GROUP_MLA = 3,     /* full attention on MLA storage */
	PAGEDKV_GROUP_STATE = 4,   /* recurrent layers (Mamba-2, Gated DeltaNet): a state per request (docs/state-groups.md) */
	PAGEDKV_GROUP_INDEXER = 5, /* DeepSeek sparse attention's indexer-K cache on MLA group target's pages */
	PAGEDKV_GROUP_SHARED_KV = 6 /* layers reading group target's KV cache; no pages of their own */
};

/* A state group's element types (Go: layergroup.StateDType). */
enum { PAGEDKV_STATE_F32 = 1, PAGEDKV_STATE_F16 = 2, PAGEDKV_STATE_BF16 = 3 };

/* One layer group (Go: pagedkv.LayerGroup). Every group that owns pages
 * (all but indexer and shared_kv) has the same num_layers (see package
 * layergroup); indexer and shared_kv groups come after all of them. Fields
 * are only ever appended: group_size may be sizeof(pagedkv_layer_group) or
 * offsetof(pagedkv_layer_group, target) (the first four fields; the rest
 * are then 0). A field that does not apply to the kind must be 0. */
typedef struct {
	int64_t kind;          /* PAGEDKV_GROUP_* */
	int64_t window_tokens; /* sliding: W >= 1; shared_kv: its target's; else 0 */
	int64_t chunk_tokens;  /* chunked: a positive multiple of page_size; shared_kv: its target's; else 0 */
	int64_t num_layers;    /* >= 1 */
	int64_t target;              /* indexer: its MLA group's index; shared_kv: the group it reads */
	int64_t indexer_head_dim;    /* indexer: the K head dimension (DeepSeek V3.2: 128) */
	int64_t indexer_quant_block; /* indexer: elements per float32 scale, a divisor of indexer_head_dim */
	int64_t conv_shape[2];       /* state: one layer's conv state, (conv_dim, conv_kernel - 1) */
	int64_t conv_dtype;          /* state: PAGEDKV_STATE_* */
	int64_t ssm_shape[3];        /* state: the recurrent state (Mamba-2: nheads, headdim, d_state) */
	int64_t ssm_dtype;           /* state: PAGEDKV_STATE_* */
	int64_t page_bytes;          /* state: one layer's page of the pool in bytes, >= the state's bytes */
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
	int64_t pinned_pages;          /* of cached_pages, under a pin (pagedkv_pin pins every group) */
	/* The group's part of the tier counters (pagedkv_get_tier_stats gives
	 * the pool's, over every group; zeros without tiers): prompt tokens
	 * onloaded from host pages and from the remote store, and its tier
	 * copies completed each way. */
	int64_t host_hit_tokens, remote_hit_tokens;
	int64_t offloaded_pages, onloaded_pages;
} pagedkv_group_stats;

/* ---- Tiers below the device pool and KV cache events (docs/tiers.md,
 * docs/events.md). Both are options of pagedkv_create_ex and
 * pagedkv_hybrid_create_ex; every size field must be the sizeof of its
 * struct. */

/* FlashInfer's kv_layout and the page dtypes of a pagedkv_page_format. */
enum { PAGEDKV_NHD = 0, PAGEDKV_HND = 1 };
enum {
	PAGEDKV_DTYPE_F32 = 1,
	PAGEDKV_DTYPE_F16 = 2,
	PAGEDKV_DTYPE_BF16 = 3,
	PAGEDKV_DTYPE_E4M3 = 4, /* float8_e4m3fn */
	PAGEDKV_DTYPE_E5M2 = 5  /* float8_e5m2 */
};

/* The bytes of one page off the device (Go: tier.PageFormat with the
 * pool's page_size): every layer's K then V plane, each page_size x
 * num_kv_heads x head_dim (NHD) or num_kv_heads x page_size x head_dim
 * (HND) elements of dtype. All zero: no format (the host tier is then
 * bookkeeping only and the engine keeps the host pages' bytes itself). */
typedef struct {
	int64_t kv_layout;    /* PAGEDKV_NHD or PAGEDKV_HND */
	int64_t dtype;        /* PAGEDKV_DTYPE_* */
	int64_t num_kv_heads;
	int64_t head_dim;
	int64_t num_layers;
} pagedkv_page_format;

/* A Redis server below the host tier (Go: tier/redis.Config). Strings are
 * byte strings with lengths, not NUL-terminated. */
typedef struct {
	const char *addr;          /* host:port, required */
	int64_t addr_len;
	const char *ns;            /* the deployment (model and revision), required */
	int64_t ns_len;
	const char *group;         /* the layer group; empty = "all" */
	int64_t group_len;
	int64_t tag_by_chain;      /* nonzero: a chain's pages on one cluster shard */
	int64_t queue_len;         /* pages queued for writing; 0 = default */
	int64_t batch;             /* SETs per pipeline; 0 = default */
	int64_t expiry_ms;         /* TTL of written pages; 0 = none */
	int64_t write_timeout_ms;  /* 0 = 1 s */
	int64_t dial_timeout_ms;   /* 0 = 2 s */
} pagedkv_redis_config;

/* A local disk tier (Go: tier/disk.Config): segment files in dir. */
typedef struct {
	const char *dir;           /* created if missing; one store per dir at a time */
	int64_t dir_len;
	const char *ns;            /* the deployment, required */
	int64_t ns_len;
	const char *group;         /* empty = "all" */
	int64_t group_len;
	int64_t pages;             /* capacity in pages, >= 1 */
	int64_t segment_pages;     /* pages per segment file; 0 = default */
	int64_t queue_len;         /* 0 = default */
	int64_t sync_every;        /* fsync after this many pages; 0 = default, < 0 only at close */
} pagedkv_disk_config;

/* The tiers (Go: pagedkv.TierConfig). host_pages 0 means none (and then
 * nothing else may be set). With both disk and redis the order is host ->
 * disk -> Redis (Go: tier.Chain(disk, redis)). */
typedef struct {
	int64_t host_pages;
	pagedkv_page_format format;  /* required with disk or redis */
	void *host_memory;           /* the host pages' bytes, host_pages * page bytes (e.g. cudaHostAlloc'ed);
	                                NULL: the library allocates them (pagedkv_host_memory) */
	int64_t host_memory_len;
	int64_t remote_deadline_us;  /* bound of one lookup below the host tier; 0 = 20 ms */
	int64_t offload_free_pages;  /* evict ahead with offload after each commit; 0 = off */
	int64_t write_through;       /* nonzero: offload every published page (implied by disk or redis) */
	const pagedkv_disk_config *disk;   /* NULL: none */
	size_t disk_size;
	const pagedkv_redis_config *redis; /* NULL: none */
	size_t redis_size;
} pagedkv_tier_config;

/* KV cache events in vLLM's wire format (Go: events.Recorder): drained
 * with pagedkv_drain_events, or, with an endpoint, published by the
 * library on a ZeroMQ PUB socket exactly as vLLM's ZmqEventPublisher
 * does (Go: events.Publisher). */
typedef struct {
	int64_t queue_batches;       /* batches held until drained (or sent); 0 = 64. Past it a step's
	                                batch is dropped, and the next one that fits starts with
	                                AllBlocksCleared and every cached page (the stream resynchronises) */
	int64_t data_parallel_rank;  /* the batches' data_parallel_rank */
	const char *endpoint;        /* empty: drain; else e.g. "tcp://0.0.0.0:5557" */
	int64_t endpoint_len;
	int64_t mode;                /* PAGEDKV_EVENTS_* below: bind or connect the PUB socket */
	const char *replay_endpoint; /* empty: no replay; else the ROUTER socket that serves replays */
	int64_t replay_endpoint_len;
	const char *topic;           /* the first frame of every message; empty is vLLM's default */
	int64_t topic_len;
} pagedkv_events_config;

/* pagedkv_events_config.mode (Go: events.BindMode). */
enum {
	PAGEDKV_EVENTS_AUTO = 0,            /* as vLLM: bind a wildcard, ipc:// or inproc:// endpoint, else connect */
	PAGEDKV_EVENTS_BIND = 1,            /* bind ("tcp://127.0.0.1:0": a free port, see pagedkv_events_endpoint) */
	PAGEDKV_EVENTS_BIND_OR_CONNECT = 2, /* bind, or connect when a subscriber bound the address first */
	PAGEDKV_EVENTS_CONNECT = 3          /* connect to a bound subscriber */
};

/* Options of pagedkv_create_ex and pagedkv_hybrid_create_ex. */
typedef struct {
	const pagedkv_tier_config *tiers;    /* NULL: no tiers */
	size_t tiers_size;
	const pagedkv_events_config *events; /* NULL: no KV events */
	size_t events_size;
} pagedkv_options;

/* Directions of a tier copy. */
enum { PAGEDKV_TO_HOST = 0, PAGEDKV_TO_DEVICE = 1 };

/* The tier copies planned since the last call (Go: Manager.TierCopies), as
 * flat arrays of n entries: copy i moves every layer's K and V of device
 * page device_pages[i] to host page host_pages[i] (dir PAGEDKV_TO_HOST,
 * offload) or back (PAGEDKV_TO_DEVICE, onload); report it done with its id.
 * The arrays are the handle's; valid until the next pagedkv_tier_copies_take or
 * pagedkv_destroy. */
typedef struct {
	int64_t n;
	const uint64_t *ids;
	const int32_t *dirs;
	const int32_t *device_pages;
	const int32_t *host_pages;
	int64_t num_offloads;        /* entries with dir PAGEDKV_TO_HOST */
} pagedkv_tier_copies;

/* The tiers' counters (Go: pagedkv.TierStats, then tier.RemoteStats), every
 * field int64, in this order. New fields are only ever appended. */
typedef struct {
	int64_t host_pages, host_used_pages, in_flight;
	int64_t host_hit_tokens, remote_hit_tokens, offloaded_pages, onloaded_pages;
	int64_t bytes_to_host, bytes_to_device, dropped_pages, host_full, remote_fetched, remote_stored;
	/* the stores below the host tier, summed */
	int64_t remote_lookups, remote_requested, remote_hits, remote_misses, remote_rejected;
	int64_t remote_errors, remote_timeouts, remote_stored_pages, remote_dropped, remote_bytes_in, remote_bytes_out;
	int64_t remote_rejected_by[5]; /* corrupt, size, wrong_type, foreign, stale */
} pagedkv_tier_stats;

/* The KV events' counters (Go: events.RecorderStats, then with an
 * endpoint events.PublisherStats; 0 without). */
typedef struct {
	int64_t batches, events, pages, dropped_steps, dropped_events, resyncs;
	int64_t sent_batches, sent_bytes, last_seq, replays, replayed, send_errors, peer_errors;
} pagedkv_events_stats;

/* Which cache pagedkv_cached_hashes lists. */
enum { PAGEDKV_MEDIUM_GPU = 0, PAGEDKV_MEDIUM_CPU = 1 };

/* One request's state (Go: Has, Running, Computed, Tokens, Pages). */
typedef struct {
	int64_t running;     /* 1 running (holds pages), 0 preempted */
	int64_t computed;    /* tokens with KV (excluding the pending step's) */
	int64_t num_tokens;  /* tokens known */
	int64_t start;       /* first token still on a page (sliding window) */
	int64_t num_pages;   /* pages held */
} pagedkv_request_state;

/* ---- Engine-owned step buffers (Go: Manager.BindStepBuffers; docs/c-abi.md,
 * "Step buffers"). The engine binds memory it owns (e.g. cudaHostAlloc'ed)
 * with fixed capacities; every later reserve writes the step's plan arrays
 * there, packed at the offsets of a layout (one row per array), so one
 * cudaMemcpyAsync of size bytes moves the whole step. */

/* Capacities (Go: pagedkv.StepBufferCapacities). A reserve over
 * max_requests, max_tokens (rows, drafts included) or max_pages (each
 * group's kv_indptr[B]) fails with PAGEDKV_ERR_BAD_ARGUMENT before anything
 * changes; a cascade deeper than max_cascade_levels is planned flat. */
typedef struct {
	int64_t max_requests;       /* 1 .. 2^28-1 */
	int64_t max_tokens;         /* 1 .. 2^28-1 */
	int64_t max_pages;          /* 1 .. 2^28 */
	int64_t max_cascade_levels; /* 0 .. 64; 0 = no cascade rows, plans run flat */
} pagedkv_step_capacities;

/* The arrays of a layout's rows (Go: stepbuf.Array), int32 each. The pool's
 * rows (group -1): HEADER, COPIES. Each group's: GROUP_HEADER .. SEQ_LENS;
 * with the config's block_tables_stride > 0 also BLOCK_TABLES
 * [max_requests*stride] (block_tables [B, stride] of pagedkv_get_block_tables);
 * a chunked group's also the ATTN_ rows; with max_cascade_levels > 0 also
 * QUERY_ROWS, CASCADE_WINDOW_LEFT, LEVEL_BATCH_SIZE and, per level, the four
 * LEVEL_ rows. */
enum {
	PAGEDKV_STEP_HEADER = 0,            /* [8] batch_size, nnz, num_copies, num_groups, step counter, 0, 0, 0 */
	PAGEDKV_STEP_COPIES = 1,            /* [3*max_requests*groups] (src, dst, entries) */
	PAGEDKV_STEP_GROUP_HEADER = 2,      /* [8] num_pages, window_left, num_levels, num_attn, attn_pages, 0, 0, 0 */
	PAGEDKV_STEP_QO_INDPTR = 3,
	PAGEDKV_STEP_BATCH_INDICES = 4,
	PAGEDKV_STEP_POSITIONS = 5,
	PAGEDKV_STEP_TOKEN_IDS = 6,
	PAGEDKV_STEP_TOKEN_POSITIONS = 7,
	PAGEDKV_STEP_DRAFTS = 8,
	PAGEDKV_STEP_KV_INDPTR = 9,
	PAGEDKV_STEP_KV_PAGE_INDICES = 10,
	PAGEDKV_STEP_KV_LAST_PAGE_LEN = 11,
	PAGEDKV_STEP_SEQ_LENS = 12,
	PAGEDKV_STEP_ATTN_QO_INDPTR = 13,
	PAGEDKV_STEP_ATTN_KV_INDPTR = 14,
	PAGEDKV_STEP_ATTN_KV_PAGE_INDICES = 15,
	PAGEDKV_STEP_ATTN_KV_LAST_PAGE_LEN = 16,
	PAGEDKV_STEP_ATTN_REQUESTS = 17,
	PAGEDKV_STEP_QUERY_ROWS = 18,
	PAGEDKV_STEP_CASCADE_WINDOW_LEFT = 19,
	PAGEDKV_STEP_LEVEL_BATCH_SIZE = 20,
	PAGEDKV_STEP_LEVEL_QO_INDPTR = 21,
	PAGEDKV_STEP_LEVEL_KV_INDPTR = 22,
	PAGEDKV_STEP_LEVEL_KV_INDICES = 23,
	PAGEDKV_STEP_LEVEL_KV_LAST_PAGE_LEN = 24,
	PAGEDKV_STEP_BLOCK_TABLES = 25       /* [max_requests*block_tables_stride] row-major, padded */
};

/* Every offset, and the base address bind accepts, is a multiple of this. */
#define PAGEDKV_STEP_ALIGN 16

/* One row of a layout: array PAGEDKV_STEP_* of group (-1: the pool's) and,
 * for a LEVEL_ row, cascade level (else -1), at byte offset with room for
 * cap int32 values. */
typedef struct {
	int32_t array;
	int32_t group;
	int32_t level;
	int32_t reserved; /* 0 */
	int64_t offset;
	int64_t cap;
} pagedkv_step_row;

/* Retention hints and TTL pins (docs/manager.md, "Retention hints").
 * A range gives the pages holding any of a request's tokens [start, end)
 * (end 0: to the end, tokens to come included) an eviction priority
 * (0 .. priorities-1; no page is evicted while a page of a lower level is
 * evictable), a duration after which, idle, they drop to level 0
 * (duration_ms 0: none; at most a day, 86400000), ephemeral (nonzero: never published: reasoning
 * tokens) and a session (PAGEDKV_SESSION_*). Later ranges win where they
 * overlap, except that ephemeral in any holds. */
enum {
	PAGEDKV_SESSION_UNKNOWN = 0,   /* leave the pages' continuation hint */
	PAGEDKV_SESSION_CONTINUES = 1, /* the chain will be sent again */
	PAGEDKV_SESSION_ENDED = 2      /* it will not */
};
typedef struct {
	int64_t start;
	int64_t end;
	int64_t duration_ms;
	int32_t priority;
	int32_t ephemeral;
	int32_t session;
	int32_t reserved; /* 0 */
} pagedkv_retention_range;

#ifndef PAGEDKV_NO_PROTOTYPES

/* Library information. */
int32_t pagedkv_abi_version(void);
/* The calling thread's message for its last failed call (never NULL; "" if
 * none). Valid until the thread's next pagedkv call. */
const char *pagedkv_last_error(void);

/* Create and destroy. cfg_size is sizeof(pagedkv_config) (or an earlier
 * version's size, see pagedkv_config). */
int32_t pagedkv_create(const pagedkv_config *cfg, size_t cfg_size, pagedkv_manager *out);
int32_t pagedkv_destroy(pagedkv_manager m);
/* Destroy m as pagedkv_destroy does (stores and sockets closed; every
 * call on m fails with PAGEDKV_ERR_BAD_HANDLE), but keep every buffer it
 * handed out (plan arrays of every step, the host memory the library
 * allocated, tier copy lists) allocated, its values frozen, until
 * pagedkv_free_memory(m): for a binding whose views of that memory may
 * outlive the manager (the Python package frees it when the last view is
 * gone). A write into kept memory is harmless; into freed memory it is
 * not. */
int32_t pagedkv_destroy_keep_memory(pagedkv_manager m);
int32_t pagedkv_free_memory(pagedkv_manager m);

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
/* Fills out with the padded table of the last successful reserve's plan:
 * group g of a hybrid manager's (0 for a dense manager). A handle without a
 * reserved plan yet gets an empty table (len, stride and max_seq_len 0).
 * size is sizeof(pagedkv_block_tables). */
int32_t pagedkv_get_block_tables(pagedkv_manager m, int64_t group, pagedkv_block_tables *out, size_t size);
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
/* How long a call on m that finds another thread's call in flight waits
 * for it before returning PAGEDKV_ERR_BUSY: 0 (the default) not at all,
 * 1..86400000 milliseconds, or -1 as long as it takes (a call waiting when
 * m is destroyed returns PAGEDKV_ERR_BAD_HANDLE). Any thread, any time. */
int32_t pagedkv_set_busy_timeout(pagedkv_manager m, int64_t timeout_ms);
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
 * commit_spec, abort, truncate, get_stats, audit, evict, pin, unpin,
 * request_tokens, destroy, and the KV event calls); reserve, reserve_spec,
 * pending, get_request_state, request_pages and cached_hashes of
 * PAGEDKV_MEDIUM_GPU on a hybrid handle (and the pagedkv_hybrid_ calls on a
 * dense one) fail with
 * PAGEDKV_ERR_BAD_HANDLE. A hybrid pin pins the prefix in every group.
 * cfg.window_tokens must be 0 (windows are per group). group_size must be
 * sizeof(pagedkv_layer_group). */
int32_t pagedkv_hybrid_create(const pagedkv_config *cfg, size_t cfg_size, const pagedkv_layer_group *groups,
                              int64_t num_groups, size_t group_size, pagedkv_manager *out);
/* Any thread, any time (fixed at creation). */
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
/* State groups (PAGEDKV_GROUP_STATE; docs/state-groups.md). The last
 * successful hybrid reserve's state slots of group g (Go: the group's
 * Plan.StateIndices): one page per request in batch order, the
 * state_indices of Mamba-2's and Gated DeltaNet's kernels; the step's state
 * copies (each a whole page, entries = page_size) are the group plan's
 * plan.copies, to run before the kernels. A zero-copy view with the plan's
 * lifetime; len 0 for a group of another kind or before any step. */
int32_t pagedkv_hybrid_state_indices(pagedkv_manager m, int64_t group, pagedkv_array *out);
/* The token count at which request id's state is next checkpointed (Go:
 * NextStateCheckpoint): end a prefill chunk there. 0 when none is left,
 * for an unknown request, or without state groups. */
int32_t pagedkv_hybrid_next_state_checkpoint(pagedkv_manager m, uint64_t id, int64_t *tokens);
/* As get_request_state and request_pages, with the pages of group g. */
int32_t pagedkv_hybrid_request_state(pagedkv_manager m, int64_t group, uint64_t id, pagedkv_request_state *out);
int32_t pagedkv_hybrid_request_pages(pagedkv_manager m, int64_t group, uint64_t id, int32_t *dst, int64_t cap,
                                     int64_t *n);

/* Create with tiers and/or KV events. opts may be NULL (= pagedkv_create);
 * opts_size must be sizeof(pagedkv_options). A HybridManager's tiers are
 * one host tier and one remote store shared by its groups (tier copies
 * name pool pages and move them in every layer's tensor); its events carry
 * each group's group_idx and kv_cache_spec_kind, its host pages' events
 * (medium "CPU") included, each under the group whose page it holds. */
int32_t pagedkv_create_ex(const pagedkv_config *cfg, size_t cfg_size, const pagedkv_options *opts, size_t opts_size,
                          pagedkv_manager *out);
int32_t pagedkv_hybrid_create_ex(const pagedkv_config *cfg, size_t cfg_size, const pagedkv_layer_group *groups,
                                 int64_t num_groups, size_t group_size, const pagedkv_options *opts,
                                 size_t opts_size, pagedkv_manager *out);

/* Tiers (a manager of either kind made with tiers; else
 * PAGEDKV_ERR_BAD_CONFIG). */
int32_t pagedkv_tier_copies_take(pagedkv_manager m, pagedkv_tier_copies *out);
/* All-or-nothing: an unknown, repeated or not yet taken id changes nothing. */
int32_t pagedkv_complete_tier_copies(pagedkv_manager m, const uint64_t *ids, int64_t n);
/* The host pages' bytes: page h at data + h * page_bytes (NULL and 0 without
 * a format). The memory lives until pagedkv_destroy. Any thread, any time
 * (fixed at creation). */
int32_t pagedkv_host_memory(pagedkv_manager m, uint8_t **data, int64_t *page_bytes, int64_t *num_pages);
/* Whether request id waits for onload copies (it may not be stepped). */
int32_t pagedkv_loading(pagedkv_manager m, uint64_t id, int32_t *loading);
/* Wait up to timeout_ms for the stores below the host tier to write what
 * is queued (a no-op without them). */
int32_t pagedkv_tier_flush(pagedkv_manager m, int64_t timeout_ms);
/* Any thread, any time, like pagedkv_get_stats (zeros without tiers). */
int32_t pagedkv_get_tier_stats(pagedkv_manager m, pagedkv_tier_stats *out, size_t out_size);

/* KV events (a manager made with events; else PAGEDKV_ERR_BAD_CONFIG).
 * Without an endpoint, each drain hands out the next batch as the msgpack
 * payload of vLLM's KVEventBatch ([ts, events, data_parallel_rank],
 * exactly what package events publishes: forward it to vLLM's ZMQ
 * publisher unchanged), or *len = 0 when none is left (with an endpoint
 * the library publishes them itself, and drain fails). Commit and commit_spec end a step's batch;
 * a drain that finds no batch ends the current one. *data is the handle's
 * buffer, valid until the next drain or destroy. */
int32_t pagedkv_drain_events(pagedkv_manager m, const uint8_t **data, int64_t *len);
/* The endpoint a publishing manager bound or connected (replay 0: the PUB
 * socket's, e.g. the port chosen for ":0"; 1: the replay socket's), copied
 * into dst [cap] (not NUL-terminated), *n = its length. Any thread, any
 * time (fixed at creation). */
int32_t pagedkv_events_endpoint(pagedkv_manager m, int32_t replay, char *dst, int64_t cap, int64_t *n);
/* The owner's thread (like every call but the stats ones above). */
int32_t pagedkv_get_events_stats(pagedkv_manager m, pagedkv_events_stats *out, size_t out_size);

/* The chain hash of every page in the prefix cache (medium
 * PAGEDKV_MEDIUM_GPU) or of every servable host page (PAGEDKV_MEDIUM_CPU):
 * the page sets KV events describe. Copies into dst [cap], *n = count.
 * PAGEDKV_MEDIUM_GPU needs a dense manager (a hybrid one has a cache per
 * group); PAGEDKV_MEDIUM_CPU takes either kind. */
int32_t pagedkv_cached_hashes(pagedkv_manager m, int32_t medium, uint64_t *dst, int64_t cap, int64_t *n);

/* Step buffers (dense and hybrid handles alike). step_layout writes the
 * layout of caps for m's groups: *size the bytes the memory needs, *n the
 * rows, of which the first min(cap, *n) go to rows (rows may be NULL with
 * cap 0); it binds nothing. bind_step_buffers binds mem [size bytes, from an
 * address that is a multiple of PAGEDKV_STEP_ALIGN; zeroed by the call] from
 * the next reserve on: the library writes into mem during reserve calls
 * only, and the pagedkv_plan's arrays then point into mem. mem must stay
 * allocated, and is the library's to write, until unbind_step_buffers, the
 * next bind, or pagedkv_destroy (or _destroy_keep_memory) returns; the
 * plan of the last reserve keeps pointing into it. A failed bind changes
 * nothing. caps_size is sizeof(pagedkv_step_capacities). */
int32_t pagedkv_step_layout(pagedkv_manager m, const pagedkv_step_capacities *caps, size_t caps_size,
                            pagedkv_step_row *rows, int64_t cap, int64_t *n, int64_t *size);
int32_t pagedkv_bind_step_buffers(pagedkv_manager m, void *mem, int64_t size,
                                  const pagedkv_step_capacities *caps, size_t caps_size);
int32_t pagedkv_unbind_step_buffers(pagedkv_manager m);

/* Retention hints and TTL pins (pagedkv_retention_range above).
 * Replaces request id's ranges (at most 64; n 0 clears them) and applies
 * them to the pages it holds in the cache at once; pages it publishes
 * later, and pages a resume matches, take them then. Call it right after
 * pagedkv_add (for the prompt's matched pages), after a commit, before a
 * resume or before a release. range_size is
 * sizeof(pagedkv_retention_range). Dense and hybrid handles. */
int32_t pagedkv_set_retention(pagedkv_manager m, uint64_t id, const pagedkv_retention_range *ranges, int64_t n,
                              size_t range_size);
/* pagedkv_pin with a lifetime: with ttl_ms > 0 the pin lapses by itself
 * once ttl_ms (at most a day) have passed on the manager's clock since it was made or last
 * refreshed; every admission matching its whole prefix refreshes it.
 * Lapsed pins go at the start of the next call that changes the manager
 * (unpin of one: PAGEDKV_ERR_UNKNOWN_PIN). ttl_ms 0 is pagedkv_pin.
 * Dense and hybrid handles. */
int32_t pagedkv_pin_for(pagedkv_manager m, const pagedkv_namespace *ns, const int32_t *tokens, int64_t n,
                        int64_t ttl_ms, uint64_t *pin, int64_t *pinned_tokens);
/* The manager's clock, for durations and TTLs, is monotonic from its
 * creation until this call; from it on it is the caller's: now_ms
 * milliseconds (a value below the last one set keeps the last one), for an
 * engine with its own clock and for tests. */
int32_t pagedkv_set_clock(pagedkv_manager m, int64_t now_ms);

#endif /* PAGEDKV_NO_PROTOTYPES */

/* ---- Cache reads and writes (Go: CacheUsage; docs/c-abi.md, "Cache
 * usage"), as a provider bills them: tokens read from the cache at
 * admission by the medium that served them (their sum is Anthropic's
 * cache_read_input_tokens), and tokens of pages the request computed and
 * added to the prefix cache (cache_creation_input_tokens). Every field
 * int64, in this order; new fields are only ever appended: pass
 * sizeof(pagedkv_cache_usage). */
typedef struct {
	int64_t read_tokens;        /* device + host + disk + remote */
	int64_t device_read_tokens; /* the device prefix cache */
	int64_t host_read_tokens;   /* the host tier */
	int64_t disk_read_tokens;   /* a disk store */
	int64_t remote_read_tokens; /* a remote store: Redis, a handoff */
	int64_t write_tokens;
	int64_t dropped; /* totals only: released requests' usage forgotten unread; 0 for one request */
} pagedkv_cache_usage;

#ifndef PAGEDKV_NO_PROTOTYPES
/* Request id's reads and writes so far (running or preempted), or, once,
 * a released request's (the last 1024 released are kept until read:
 * PAGEDKV_CACHE_USAGE_KEPT). PAGEDKV_ERR_UNKNOWN_REQUEST otherwise. The
 * owner's thread; dense and hybrid handles alike. */
int32_t pagedkv_get_cache_usage(pagedkv_manager m, uint64_t id, pagedkv_cache_usage *out, size_t out_size);
/* Every request's summed, released ones included (Go: Stats.CacheUsage).
 * Any thread, any time, like pagedkv_get_stats. */
int32_t pagedkv_get_cache_usage_totals(pagedkv_manager m, pagedkv_cache_usage *out, size_t out_size);
#endif /* PAGEDKV_NO_PROTOTYPES */

/* How many released requests' usage a manager keeps until read. */
#define PAGEDKV_CACHE_USAGE_KEPT 1024

#ifdef __cplusplus
}
#endif

#endif /* PAGEDKV_H */
