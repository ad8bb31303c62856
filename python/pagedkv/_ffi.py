"""ctypes declarations of pagedkv.h (cabi/pagedkv.h is the source of truth).

Loading order of the shared library: $PAGEDKV_LIB, then libpagedkv.so next
to this package (where pip install ./python bundles it), then
build/cabi/libpagedkv.so of the source tree this package sits in (where
scripts/cabi.sh puts it). The package loads it at import.
"""

import ctypes
import os

ABI_VERSION = 3

c_int32_p = ctypes.POINTER(ctypes.c_int32)


class Config(ctypes.Structure):
    _fields_ = [
        ("num_pages", ctypes.c_int64),
        ("page_size", ctypes.c_int64),
        ("window_tokens", ctypes.c_int64),
        ("priorities", ctypes.c_int64),
        ("max_pinned_pages", ctypes.c_int64),
        ("hash_seed", ctypes.c_uint64),
        ("cascade_min_saved_pages", ctypes.c_int64),
        ("memory_limit", ctypes.c_int64),
        ("block_tables_stride", ctypes.c_int64),
        ("pin_budget", ctypes.c_double),
        ("state_checkpoint_every", ctypes.c_int64),
    ]


def _byte_strings(*names):
    """The fields of byte strings with lengths: name, then name_len."""
    return [f for n in names for f in ((n, ctypes.c_char_p), (n + "_len", ctypes.c_int64))]


class Namespace(ctypes.Structure):
    _fields_ = _byte_strings("tenant", "lora", "salt")


class RetentionRange(ctypes.Structure):
    _fields_ = [
        ("start", ctypes.c_int64),
        ("end", ctypes.c_int64),
        ("duration_ms", ctypes.c_int64),
        ("priority", ctypes.c_int32),
        ("ephemeral", ctypes.c_int32),
        ("session", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
    ]


class Request(ctypes.Structure):
    _fields_ = [
        ("ns", Namespace),
        ("prompt", ctypes.c_void_p),
        ("prompt_len", ctypes.c_int64),
        ("priority", ctypes.c_int32),
        ("no_cache", ctypes.c_int32),
        ("capacity_tokens", ctypes.c_int64),
    ]


class Array(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("len", ctypes.c_int64), ("cap", ctypes.c_int64)]


class Level(ctypes.Structure):
    _fields_ = [
        ("qo_indptr", Array),
        ("kv_indptr", Array),
        ("kv_indices", Array),
        ("kv_last_page_len", Array),
    ]


# pagedkv_plan as 64-bit words: the binding reads it with one numpy tolist().
PLAN_SCALARS = ("batch_size", "nnz", "window_left")
PLAN_ARRAYS = (
    "copies",
    "qo_indptr",
    "batch_indices",
    "positions",
    "token_ids",
    "token_positions",
    "kv_indptr",
    "kv_page_indices",
    "kv_last_page_len",
    "seq_lens",
    "query_rows",
)
PLAN_WORDS = len(PLAN_SCALARS) + 3 * len(PLAN_ARRAYS) + 2 + 3 + 1  # + num_levels, levels, drafts, attention_kind
# pagedkv_plan.attention_kind (PAGEDKV_ATTENTION_*, Go: kernels.AttentionKind)
# by number: the library's decision of which attention a plan runs.
ATTENTION_KINDS = (None, "decode", "prefill", "cascade", "chunked")


class Plan(ctypes.Structure):
    _fields_ = (
        [(name, ctypes.c_int64) for name in PLAN_SCALARS]
        + [(name, Array) for name in PLAN_ARRAYS]
        + [("num_levels", ctypes.c_int64), ("levels", ctypes.POINTER(Level)), ("drafts", Array),
           ("attention_kind", ctypes.c_int64)]
    )


class BlockTables(ctypes.Structure):
    _fields_ = [("block_tables", Array), ("stride", ctypes.c_int64), ("max_seq_len", ctypes.c_int64)]


GROUP_KINDS = ("full", "sliding", "chunked", "mla", "state", "indexer", "shared_kv")  # PAGEDKV_GROUP_* in order
STATE_DTYPES = ("", "float32", "float16", "bfloat16")  # PAGEDKV_STATE_* (0: none)


class LayerGroup(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int64),
        ("window_tokens", ctypes.c_int64),
        ("chunk_tokens", ctypes.c_int64),
        ("num_layers", ctypes.c_int64),
        ("target", ctypes.c_int64),
        ("indexer_head_dim", ctypes.c_int64),
        ("indexer_quant_block", ctypes.c_int64),
        ("conv_shape", ctypes.c_int64 * 2),
        ("conv_dtype", ctypes.c_int64),
        ("ssm_shape", ctypes.c_int64 * 3),
        ("ssm_dtype", ctypes.c_int64),
        ("page_bytes", ctypes.c_int64),
    ]


# pagedkv_group_plan: a pagedkv_plan, then these arrays.
GROUP_PLAN_ARRAYS = (
    "cascade_window_left",
    "attn_qo_indptr",
    "attn_kv_indptr",
    "attn_kv_page_indices",
    "attn_kv_last_page_len",
    "attn_requests",
)
GROUP_PLAN_WORDS = PLAN_WORDS + 3 * len(GROUP_PLAN_ARRAYS)


class GroupPlan(ctypes.Structure):
    _fields_ = [("plan", Plan)] + [(name, Array) for name in GROUP_PLAN_ARRAYS]


STATS_FIELDS = (
    "total_pages", "free_pages", "used_pages", "evictable_pages", "pinned_idle_pages",
    "cached_pages", "pinned_pages", "shared_pages",
    "requests", "preempted_requests",
    "prompt_tokens", "prompt_hit_tokens", "computed_tokens", "resumed_tokens", "resume_hit_tokens",
    "steps", "preemptions", "copied_pages", "published_pages", "duplicate_pages",
    "evicted_pages", "eviction_freed_pages", "inner_victims", "window_released_pages", "chains_cut",
    "draft_tokens", "accepted_draft_tokens",
)


class Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in STATS_FIELDS]


GROUP_STATS_FIELDS = ("kind", "cached_pages", "evictable_pages", "servable_tokens", "published_pages",
                      "evicted_pages", "copied_pages", "window_released_pages", "pinned_pages",
                      "host_hit_tokens", "remote_hit_tokens", "offloaded_pages", "onloaded_pages")


class GroupStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in GROUP_STATS_FIELDS]


# ---- Tiers and KV events ----

KV_LAYOUTS = ("NHD", "HND")  # PAGEDKV_NHD, PAGEDKV_HND
DTYPES = {"f32": 1, "f16": 2, "bf16": 3, "e4m3": 4, "e5m2": 5}  # PAGEDKV_DTYPE_*


class PageFormat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in ("kv_layout", "dtype", "num_kv_heads", "head_dim", "num_layers")]


class RedisConfig(ctypes.Structure):
    _fields_ = _byte_strings("addr", "ns", "group") + [
        (name, ctypes.c_int64) for name in ("tag_by_chain", "queue_len", "batch", "expiry_ms", "write_timeout_ms",
                                            "dial_timeout_ms")]


class DiskConfig(ctypes.Structure):
    _fields_ = _byte_strings("dir", "ns", "group") + [
        (name, ctypes.c_int64) for name in ("pages", "segment_pages", "queue_len", "sync_every")]


class TierConfig(ctypes.Structure):
    _fields_ = [
        ("host_pages", ctypes.c_int64),
        ("format", PageFormat),
        ("host_memory", ctypes.c_void_p),
        ("host_memory_len", ctypes.c_int64),
        ("remote_deadline_us", ctypes.c_int64),
        ("offload_free_pages", ctypes.c_int64),
        ("write_through", ctypes.c_int64),
        ("disk", ctypes.POINTER(DiskConfig)),
        ("disk_size", ctypes.c_size_t),
        ("redis", ctypes.POINTER(RedisConfig)),
        ("redis_size", ctypes.c_size_t),
    ]


EVENTS_MODES = ("auto", "bind", "bind_or_connect", "connect")  # PAGEDKV_EVENTS_*


class EventsConfig(ctypes.Structure):
    _fields_ = [("queue_batches", ctypes.c_int64), ("data_parallel_rank", ctypes.c_int64)] + _byte_strings(
        "endpoint") + [("mode", ctypes.c_int64)] + _byte_strings("replay_endpoint", "topic")


class Options(ctypes.Structure):
    _fields_ = [
        ("tiers", ctypes.POINTER(TierConfig)),
        ("tiers_size", ctypes.c_size_t),
        ("events", ctypes.POINTER(EventsConfig)),
        ("events_size", ctypes.c_size_t),
    ]


class TierCopies(ctypes.Structure):
    _fields_ = [
        ("n", ctypes.c_int64),
        ("ids", ctypes.c_void_p),
        ("dirs", ctypes.c_void_p),
        ("device_pages", ctypes.c_void_p),
        ("host_pages", ctypes.c_void_p),
        ("num_offloads", ctypes.c_int64),
    ]


REJECT_REASONS = ("corrupt", "size", "wrong_type", "foreign", "stale")
TIER_STATS_FIELDS = (
    "host_pages", "host_used_pages", "in_flight",
    "host_hit_tokens", "remote_hit_tokens", "offloaded_pages", "onloaded_pages",
    "bytes_to_host", "bytes_to_device", "dropped_pages", "host_full", "remote_fetched", "remote_stored",
    "remote_lookups", "remote_requested", "remote_hits", "remote_misses", "remote_rejected",
    "remote_errors", "remote_timeouts", "remote_stored_pages", "remote_dropped", "remote_bytes_in", "remote_bytes_out",
) + tuple("remote_rejected_" + r for r in REJECT_REASONS)


class TierStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in TIER_STATS_FIELDS]


EVENTS_STATS_FIELDS = ("batches", "events", "pages", "dropped_steps", "dropped_events", "resyncs",
                       "sent_batches", "sent_bytes", "last_seq", "replays", "replayed", "send_errors", "peer_errors")


class EventsStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in EVENTS_STATS_FIELDS]


class RequestState(ctypes.Structure):
    _fields_ = [
        ("running", ctypes.c_int64),
        ("computed", ctypes.c_int64),
        ("num_tokens", ctypes.c_int64),
        ("start", ctypes.c_int64),
        ("num_pages", ctypes.c_int64),
    ]


def _candidates():
    env = os.environ.get("PAGEDKV_LIB")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    return [
        os.path.join(here, "libpagedkv.so"),  # bundled by pip install ./python
        os.path.normpath(os.path.join(here, "..", "..", "build", "cabi", "libpagedkv.so")),  # a source tree
    ]


def load():
    """The library, declared; OSError naming every path tried, or the file
    that is not a usable libpagedkv."""
    tried = []
    for path in _candidates():
        if not os.path.exists(path):
            tried.append(path)
            continue
        path = os.path.abspath(path)
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise OSError("pagedkv: %s is not a loadable libpagedkv: %s" % (path, e)) from e
        try:
            return _declare(lib)
        except AttributeError as e:  # a missing symbol: another library, or an old one
            raise OSError("pagedkv: %s is not libpagedkv, or one older than this package: %s" % (path, e)) from e
    raise OSError(
        "pagedkv: libpagedkv.so not found (tried %s); pip install ./python bundles it, scripts/libpagedkv.sh "
        "builds it into build/cabi/, or set PAGEDKV_LIB to its path" % ", ".join(tried)
    )


def _declare(lib):
    i32, i64, u64, vp = ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64, ctypes.c_void_p
    sz = ctypes.c_size_t
    sigs = {
        "pagedkv_abi_version": (i32, []),
        "pagedkv_last_error": (ctypes.c_char_p, []),
        "pagedkv_create": (i32, [ctypes.POINTER(Config), sz, ctypes.POINTER(u64)]),
        "pagedkv_destroy": (i32, [u64]),
        "pagedkv_destroy_keep_memory": (i32, [u64]),
        "pagedkv_free_memory": (i32, [u64]),
        "pagedkv_add": (i32, [u64, u64, ctypes.POINTER(Request), ctypes.POINTER(i64)]),
        "pagedkv_extend": (i32, [u64, u64, vp, i64]),
        "pagedkv_fork": (i32, [u64, u64, u64]),
        "pagedkv_preempt": (i32, [u64, u64]),
        "pagedkv_resume": (i32, [u64, u64, ctypes.POINTER(i64)]),
        "pagedkv_release": (i32, [u64, u64]),
        "pagedkv_reserve": (i32, [u64, vp, vp, i64, vp]),
        "pagedkv_commit": (i32, [u64, vp, i64]),
        "pagedkv_reserve_spec": (i32, [u64, vp, vp, i64, vp, vp, vp]),
        "pagedkv_commit_spec": (i32, [u64, vp, i64, vp, i64]),
        "pagedkv_truncate": (i32, [u64, u64, i64]),
        "pagedkv_abort": (i32, [u64]),
        "pagedkv_get_stats": (i32, [u64, ctypes.POINTER(Stats), sz]),
        "pagedkv_get_block_tables": (i32, [u64, i64, ctypes.POINTER(BlockTables), sz]),
        "pagedkv_audit": (i32, [u64]),
        "pagedkv_evict": (i32, [u64, i64, ctypes.POINTER(i64)]),
        "pagedkv_pin": (i32, [u64, ctypes.POINTER(Namespace), vp, i64, ctypes.POINTER(u64), ctypes.POINTER(i64)]),
        "pagedkv_unpin": (i32, [u64, u64]),
        "pagedkv_set_retention": (i32, [u64, u64, vp, i64, sz]),
        "pagedkv_pin_for": (i32, [u64, ctypes.POINTER(Namespace), vp, i64, i64, ctypes.POINTER(u64),
                                  ctypes.POINTER(i64)]),
        "pagedkv_set_clock": (i32, [u64, i64]),
        "pagedkv_get_request_state": (i32, [u64, u64, ctypes.POINTER(RequestState)]),
        "pagedkv_request_tokens": (i32, [u64, u64, vp, i64, ctypes.POINTER(i64)]),
        "pagedkv_request_pages": (i32, [u64, u64, vp, i64, ctypes.POINTER(i64)]),
        "pagedkv_pending": (i32, [u64, ctypes.POINTER(i32)]),
        "pagedkv_debug_panic": (i32, [u64]),
        "pagedkv_hybrid_create": (i32, [ctypes.POINTER(Config), sz, ctypes.POINTER(LayerGroup), i64, sz,
                                        ctypes.POINTER(u64)]),
        "pagedkv_hybrid_num_groups": (i32, [u64, ctypes.POINTER(i64)]),
        "pagedkv_hybrid_reserve": (i32, [u64, vp, vp, i64, vp, vp, i64]),
        "pagedkv_hybrid_reserve_spec": (i32, [u64, vp, vp, i64, vp, vp, vp, vp, i64]),
        "pagedkv_hybrid_get_group_stats": (i32, [u64, i64, ctypes.POINTER(GroupStats), sz]),
        "pagedkv_hybrid_request_state": (i32, [u64, i64, u64, ctypes.POINTER(RequestState)]),
        "pagedkv_hybrid_request_pages": (i32, [u64, i64, u64, vp, i64, ctypes.POINTER(i64)]),
        "pagedkv_hybrid_state_indices": (i32, [u64, i64, vp]),
        "pagedkv_hybrid_next_state_checkpoint": (i32, [u64, u64, ctypes.POINTER(i64)]),
        "pagedkv_create_ex": (i32, [ctypes.POINTER(Config), sz, ctypes.POINTER(Options), sz, ctypes.POINTER(u64)]),
        "pagedkv_hybrid_create_ex": (i32, [ctypes.POINTER(Config), sz, ctypes.POINTER(LayerGroup), i64, sz,
                                           ctypes.POINTER(Options), sz, ctypes.POINTER(u64)]),
        "pagedkv_tier_copies_take": (i32, [u64, ctypes.POINTER(TierCopies)]),
        "pagedkv_complete_tier_copies": (i32, [u64, vp, i64]),
        "pagedkv_host_memory": (i32, [u64, ctypes.POINTER(vp), ctypes.POINTER(i64), ctypes.POINTER(i64)]),
        "pagedkv_loading": (i32, [u64, u64, ctypes.POINTER(i32)]),
        "pagedkv_tier_flush": (i32, [u64, i64]),
        "pagedkv_get_tier_stats": (i32, [u64, ctypes.POINTER(TierStats), sz]),
        "pagedkv_drain_events": (i32, [u64, ctypes.POINTER(vp), ctypes.POINTER(i64)]),
        "pagedkv_get_events_stats": (i32, [u64, ctypes.POINTER(EventsStats), sz]),
        "pagedkv_events_endpoint": (i32, [u64, i32, ctypes.c_char_p, i64, ctypes.POINTER(i64)]),
        "pagedkv_cached_hashes": (i32, [u64, i32, vp, i64, ctypes.POINTER(i64)]),
        "pagedkv_set_busy_timeout": (i32, [u64, i64]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    if (ctypes.sizeof(ctypes.c_void_p) != 8 or ctypes.sizeof(Plan) != 8 * PLAN_WORDS
            or ctypes.sizeof(GroupPlan) != 8 * GROUP_PLAN_WORDS):
        raise OSError("pagedkv: the Python binding needs 64-bit pointers")
    got = lib.pagedkv_abi_version()
    if got != ABI_VERSION:
        raise OSError("pagedkv: libpagedkv has ABI version %d, this package needs %d" % (got, ABI_VERSION))
    return lib
