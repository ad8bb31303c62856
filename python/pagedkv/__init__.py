"""pagedkv from Python: the KV-cache Manager over libpagedkv's C ABI.

    import numpy as np, pagedkv

    m = pagedkv.Manager(num_pages=64, page_size=16, hash_seed=1)
    m.add(1, prompt)                       # -> tokens served from the prefix cache
    plan = m.reserve([1], [40])            # all-or-nothing; OutOfPages -> preempt, retry
    plan.kv_indptr, plan.kv_page_indices   # numpy int32 views of the Manager's buffers
    m.commit([7])
    plan = m.reserve_spec([1], [1], [[5, 6]])  # speculative: 2 draft tokens
    m.commit_spec([1], [9])                # 1 accepted, then the bonus token

Arrays. Every array of a Plan is a numpy int32 view (no copy) of a buffer
the Manager owns. The plan is current, and its arrays valid and unchanged,
until the next successful reserve() or close() of the same Manager; failed
calls and every other call (commit included) leave it alone. After that
every property of the Plan and plan.copy() raise StalePlan. A view taken
earlier (a = plan.kv_indptr) is not checked again: it may show the next
step's values or stale ones, so take plan.copy() (or np.array(a)) to keep
arrays longer. The memory of every view (plan arrays, tier_copies(),
host_pages()) stays allocated as long as the view: a view keeps its Manager
object alive, garbage collection never destroys a Manager whose arrays are
in use, and close() ends the Manager (stores, sockets, calls) but frees the
memory only when the Manager object and its last view are gone, so writing
a view after close() is harmless. close() raises Busy while another
thread's call is in flight. The views are writable so that torch.from_numpy
accepts them without a warning; the Manager never reads plan arrays back.

Errors. Every failure raises a subclass of PagedKVError named after the Go
sentinel error (OutOfPages, UnknownRequest, ...) whose message names the bad
value; a call that raised changed nothing.

Threads. Any thread may call a Manager, one call at a time: a call that
finds another thread's call in flight raises Busy at once and changes
nothing, or, with busy_timeout=seconds (Manager(..., busy_timeout=0.5), or
m.busy_timeout = None to wait as long as it takes), waits up to that long
for it first. Each call holds the Manager's lock from its checks to the return
of its results (the C call and the reads of the Manager's shared out
buffers), so a call returns its own results or raises, never another
call's. plan.copy() waits for a call in flight instead of raising, so it
copies one step whole. Lock-free (any thread, any time, never Busy):
stats(), tier_stats(), group_stats(), num_groups, kinds, host_pages(),
events_endpoint(), busy_timeout and repr(); every other call reads or
changes state the step's thread owns and takes the lock. ctypes releases
the GIL during calls.

Logging. The logger "pagedkv" (logging.getLogger("pagedkv")) warns when
drain_events() finds the KV event stream dropped steps (the engine drains
too rarely: raise Events(queue_batches=)) and when tier_copies() finds new
dropped host pages, remote store errors or timeouts (tier_stats() has the
counters).

Versions. pagedkv.__version__ is the package's version, pagedkv.ABI_VERSION
the C ABI version (pagedkv.h's PAGEDKV_ABI_VERSION) it needs.

Hybrid models. HybridManager(num_pages, page_size, groups) is Go's
HybridManager: layer groups (LayerGroup("full"), LayerGroup("sliding",
window_tokens=W), LayerGroup("chunked", chunk_tokens=C), LayerGroup("mla"),
and LayerGroup("state", ...), LayerGroup("indexer", ...),
LayerGroup("shared_kv", ...)) on one page pool. Its reserve() returns a
HybridPlan: the pool-wide copies and one Plan per group (with
cascade_window_left, for a chunked group the attn_* arrays, for a state
group state_indices), current and thread-safe exactly like a Manager's Plan.

Tiers and KV events. Manager(..., tiers=Tiers(host_pages, format=PageFormat(...),
redis=RedisTier(addr, namespace), disk=DiskTier(dir, namespace, pages)),
events=Events()) is a Manager with a host tier (and stores below it) and
vLLM-format KV cache events. Each step, the engine runs the tier copies
m.tier_copies() lists (numpy views: device page <-> host page, the host
pages' bytes in m.host_pages(), a numpy [host_pages, page_bytes] uint8 view),
reports them with m.complete_tier_copies(ids), and forwards
m.drain_events() (msgpack payloads of vLLM's KVEventBatch) to its ZMQ
publisher. m.cached_hashes("GPU"/"CPU") lists the cached pages' hashes.
HybridManager takes the same options, together (events of host pages
carry medium "CPU" and each group's group_idx).

pagedkv.flashinfer turns a Plan into the keyword arguments of FlashInfer's
wrappers' plan() calls and of append_paged_kv_cache (hybrid_plan_kwargs:
every group of a HybridPlan).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar, Union

import numpy as np
import numpy.typing as npt

from . import _ffi
from ._version import __version__
from .usage import CacheUsage

ABI_VERSION: int = _ffi.ABI_VERSION
"""The C ABI version this package needs (pagedkv.h's PAGEDKV_ABI_VERSION); import fails on a library of another."""

logger = logging.getLogger("pagedkv")
"""Warnings about tiers and KV events (see the module doc, "Logging")."""

Int32Array = npt.NDArray[np.int32]
"""An int32 numpy array: every plan array."""
UInt64Array = npt.NDArray[np.uint64]
"""A uint64 numpy array: request ids, tier copy ids, hashes."""
Ints = Union[Sequence[int], npt.NDArray[np.integer[Any]]]
"""A sequence of ints or a 1-D integer numpy array (checked: values that do not fit raise BadArgument)."""

__all__ = [
    "Manager", "HybridManager", "LayerGroup", "HybridPlan", "GroupStats", "Plan", "Level", "Stats", "RequestState", "NO_TOKEN",
    "PagedKVError", "OutOfPages", "UnknownRequest", "RequestExists", "Preempted", "NotPreempted",
    "StepPending", "NoStep", "BadArgument", "BadConfig", "NotCached", "PinLimit", "UnknownPin",
    "BadHandle", "Busy", "AuditError", "InternalError", "StalePlan", "Loading",
    "Tiers", "PageFormat", "RedisTier", "DiskTier", "Events", "TierCopies", "TierStats", "EventsStats",
    "TO_HOST", "TO_DEVICE", "ABI_VERSION", "__version__", "logger", "Int32Array", "UInt64Array", "Ints",
    "RetentionRange", "SESSIONS",
]

NO_TOKEN: int = -1
"""In commit(sampled): no token sampled for this request."""

SESSIONS: Tuple[str, ...] = ("unknown", "continues", "ended")
"""RetentionRange.session values (Go: pagedkv.Session, C: PAGEDKV_SESSION_*)."""

_DAY_SECONDS = 86400.0


class RetentionRange:
    """A retention hint for the pages holding tokens [start, end) of a
    request (end 0: to the end, tokens to come included); Go:
    pagedkv.RetentionRange. priority is the eviction level (0 ..
    priorities-1; no page is evicted while a lower level has an evictable
    one); duration (seconds, at most a day; 0: none) is how long the pages
    may stay idle before they drop to level 0; ephemeral pages are never
    published (reasoning tokens); session is one of SESSIONS. Later ranges
    win where they overlap, except that ephemeral in any holds."""

    __slots__ = ("start", "end", "priority", "duration", "ephemeral", "session")

    def __init__(self, start: int = 0, end: int = 0, *, priority: int = 0, duration: float = 0.0,
                 ephemeral: bool = False, session: str = "unknown") -> None:
        self.start, self.end, self.priority = start, end, priority
        self.duration, self.ephemeral, self.session = duration, ephemeral, session

    def __repr__(self) -> str:
        return ("RetentionRange(%r, %r, priority=%r, duration=%r, ephemeral=%r, session=%r)"
                % (self.start, self.end, self.priority, self.duration, self.ephemeral, self.session))

    def _c(self, op: str, i: int) -> Any:
        name = "ranges[%d]" % i
        if self.session not in SESSIONS:
            raise BadArgument("pagedkv: bad argument: %s: %s.session = %r, want one of %s"
                              % (op, name, self.session, ", ".join(SESSIONS)))
        ms = _millis(self.duration, op, name + ".duration")
        return _ffi.RetentionRange(_scalar(self.start, _I64, op, name + ".start"),
                                   _scalar(self.end, _I64, op, name + ".end"), ms,
                                   _scalar(self.priority, _I32, op, name + ".priority"),
                                   1 if self.ephemeral else 0, SESSIONS.index(self.session), 0)


def _millis(seconds: Any, op: str, name: str, limit: Optional[float] = _DAY_SECONDS) -> int:
    """seconds (a real number >= 0, at most limit) in whole milliseconds,
    or BadArgument naming the value."""
    if isinstance(seconds, (bool, np.bool_)) or not isinstance(seconds, (int, float, np.integer, np.floating)) \
            or not (0 <= seconds <= (limit if limit is not None else float("inf"))):
        raise BadArgument("pagedkv: bad argument: %s: %s = %r, want seconds in [0, %s]"
                          % (op, name, seconds, limit if limit is not None else "inf"))
    return int(round(float(seconds) * 1000))


# ---- Errors ----


class PagedKVError(Exception):
    """A failed pagedkv call; code is the C error code."""

    code: Optional[int] = None


class OutOfPages(PagedKVError):
    """The step needs more pages than are free and evictable: preempt and retry."""
    code = 1


class UnknownRequest(PagedKVError, KeyError):
    """No request with that id (never added, or released)."""

    code = 2

    def __str__(self) -> str:  # KeyError would quote the message
        return Exception.__str__(self)


class RequestExists(PagedKVError):
    """add() or fork() of an id that is already in use."""
    code = 3


class Preempted(PagedKVError):
    """The request is preempted: resume() it before stepping it."""
    code = 4


class NotPreempted(PagedKVError):
    """resume() of a request that is running."""
    code = 5


class StepPending(PagedKVError):
    """A reserved step is not committed yet: commit() or abort() it first."""
    code = 6


class NoStep(PagedKVError):
    """commit() or abort() with no reserved step."""
    code = 7


class BadArgument(PagedKVError, ValueError):
    """An argument is out of range or of the wrong type; the message names it."""
    code = 8


class BadConfig(PagedKVError, ValueError):
    """The configuration is refused (the message names the field), or the
    call needs an option the Manager was made without (tiers, events)."""
    code = 9


class NotCached(PagedKVError):
    """pin() of tokens whose first page is not in the prefix cache."""
    code = 10


class PinLimit(PagedKVError):
    """pin() would pass max_pinned_pages."""
    code = 11


class UnknownPin(PagedKVError, KeyError):
    """unpin() of an id pin() never returned, or one already unpinned."""

    code = 12

    def __str__(self) -> str:
        return Exception.__str__(self)


class BadHandle(PagedKVError):
    """The Manager was closed (or the handle never existed)."""
    code = 13


class Busy(PagedKVError):
    """Another thread is inside a call on the same Manager."""
    code = 14


class AuditError(PagedKVError):
    """audit() found a broken invariant (a bug in pagedkv)."""
    code = 15


class InternalError(PagedKVError):
    """A recovered Go panic (a bug); the Manager is poisoned: close it."""
    code = 16


class Loading(PagedKVError):
    """The request waits for onload tier copies: complete them first."""
    code = 17


_ERRORS = {cls.code: cls for cls in (
    OutOfPages, UnknownRequest, RequestExists, Preempted, NotPreempted, StepPending, NoStep,
    BadArgument, BadConfig, NotCached, PinLimit, UnknownPin, BadHandle, Busy, AuditError, InternalError, Loading,
)}

# The library loads at import: a missing or incompatible libpagedkv fails
# here, with the paths tried, not at the first Manager().
try:
    _lib = _ffi.load()
except OSError as e:
    raise ImportError(str(e)) from e


def _load():
    return _lib


def _raise(lib, rc):
    msg = lib.pagedkv_last_error().decode("utf-8", "replace")
    raise _ERRORS.get(rc, PagedKVError)(msg)


# ---- Values ----


class Stats:
    """A consistent snapshot of the Manager (Go: pagedkv.Stats)."""

    __slots__ = _ffi.STATS_FIELDS
    if TYPE_CHECKING:
        total_pages: int
        free_pages: int
        used_pages: int
        evictable_pages: int
        pinned_idle_pages: int
        cached_pages: int
        pinned_pages: int
        shared_pages: int
        requests: int
        preempted_requests: int
        prompt_tokens: int
        prompt_hit_tokens: int
        computed_tokens: int
        resumed_tokens: int
        resume_hit_tokens: int
        steps: int
        preemptions: int
        copied_pages: int
        published_pages: int
        duplicate_pages: int
        evicted_pages: int
        eviction_freed_pages: int
        inner_victims: int
        window_released_pages: int
        chains_cut: int
        draft_tokens: int
        accepted_draft_tokens: int

    def __init__(self, raw: Any) -> None:
        for name in _ffi.STATS_FIELDS:
            setattr(self, name, getattr(raw, name))

    @property
    def hit_rate(self) -> float:
        """prompt_hit_tokens / prompt_tokens (0.0 before any prompt)."""
        return self.prompt_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def recomputed_tokens(self) -> int:
        """Tokens resumed requests computed again (resumed_tokens - resume_hit_tokens)."""
        return self.resumed_tokens - self.resume_hit_tokens

    def as_dict(self) -> Dict[str, int]:
        """The fields by name."""
        return {name: getattr(self, name) for name in _ffi.STATS_FIELDS}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stats) and self.as_dict() == other.as_dict()

    def __repr__(self):
        return "Stats(%s)" % ", ".join("%s=%d" % kv for kv in self.as_dict().items())


class GroupStats:
    """One layer group's numbers of a HybridManager (Go: pagedkv.GroupStats):
    kind ("full", "sliding", "chunked" or "mla"), cached_pages,
    evictable_pages, servable_tokens (prompt tokens the group's cache alone
    could have served), published_pages, evicted_pages, copied_pages,
    window_released_pages, pinned_pages (of cached_pages, under a pin),
    and the group's part of the tier counters (tier_stats() has the pool's):
    host_hit_tokens, remote_hit_tokens, offloaded_pages, onloaded_pages."""

    __slots__ = _ffi.GROUP_STATS_FIELDS
    if TYPE_CHECKING:
        kind: str
        cached_pages: int
        evictable_pages: int
        servable_tokens: int
        published_pages: int
        evicted_pages: int
        copied_pages: int
        window_released_pages: int
        pinned_pages: int
        host_hit_tokens: int
        remote_hit_tokens: int
        offloaded_pages: int
        onloaded_pages: int

    def __init__(self, raw: Any) -> None:
        for name in _ffi.GROUP_STATS_FIELDS:
            setattr(self, name, getattr(raw, name))
        self.kind = _ffi.GROUP_KINDS[raw.kind]

    def as_dict(self) -> Dict[str, Any]:
        """The fields by name."""
        return {name: getattr(self, name) for name in _ffi.GROUP_STATS_FIELDS}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GroupStats) and self.as_dict() == other.as_dict()

    def __repr__(self):
        return "GroupStats(%s)" % ", ".join("%s=%r" % kv for kv in self.as_dict().items())


class RequestState:
    """One request's state (Go: RequestState): running (holds pages) or
    preempted; computed tokens (KV written), num_tokens known, start (the
    first held page's token index: a window released the pages before it)
    and num_pages held."""

    __slots__ = ("running", "computed", "num_tokens", "start", "num_pages")
    if TYPE_CHECKING:
        running: bool
        computed: int
        num_tokens: int
        start: int
        num_pages: int

    def __init__(self, raw: Any) -> None:
        self.running = bool(raw.running)
        self.computed, self.num_tokens = raw.computed, raw.num_tokens
        self.start, self.num_pages = raw.start, raw.num_pages

    def _key(self):
        return (self.running, self.computed, self.num_tokens, self.start, self.num_pages)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RequestState) and self._key() == other._key()

    def __repr__(self):
        return "RequestState(running=%s, computed=%d, num_tokens=%d, start=%d, num_pages=%d)" % self._key()


class Level:
    """One cascade level: FlashInfer's MultiLevelCascadeAttentionWrapper
    plan() takes one of each per level."""

    __slots__ = ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len")
    if TYPE_CHECKING:
        qo_indptr: Int32Array
        kv_indptr: Int32Array
        kv_indices: Int32Array
        kv_last_page_len: Int32Array

    def __init__(self, qo_indptr: Int32Array, kv_indptr: Int32Array, kv_indices: Int32Array,
                 kv_last_page_len: Int32Array) -> None:
        self.qo_indptr, self.kv_indptr = qo_indptr, kv_indptr
        self.kv_indices, self.kv_last_page_len = kv_indices, kv_last_page_len

    def __repr__(self) -> str:
        return "Level(qo_indptr=%s, kv_indptr=%s, kv_indices=%s, kv_last_page_len=%s)" % tuple(
            getattr(self, f).tolist() for f in self.__slots__)


class StalePlan(PagedKVError):
    """A Plan was used after its step passed: a later successful reserve()
    or close() of its Manager reused or freed the buffers its arrays view.
    Python-only (no C code): the C ABI cannot tell a stale pointer."""


# The fields of a Plan, in the order _make_plan stores them.
_PLAN_FIELDS = ("request_ids", "batch_size", "nnz", "window_left", "copies", "drafts", "qo_indptr", "batch_indices",
                "positions", "token_ids", "token_positions", "kv_indptr", "kv_page_indices", "kv_last_page_len",
                "seq_lens", "cascade", "query_rows", "block_tables", "max_seq_len", "attention_kind") + _ffi.GROUP_PLAN_ARRAYS + (
                "state_indices",)


# Each field's type and meaning (the docstring of its property; the class
# docs say more).
_FIELD_DOCS = {
    "request_ids": ("UInt64Array", "The ids the step was reserved for (an owned copy)."),
    "batch_size": ("int", "B, the number of requests in the step."),
    "nnz": ("int", "The number of query rows (tokens) the step appends."),
    "window_left": ("int", "FlashInfer's window_left (-1: no sliding window)."),
    "copies": ("Int32Array", "[n, 3] (src, dst, entries) page copies to do before appending."),
    "drafts": ("Int32Array", "[B] how many of request b's rows (its last ones) are draft tokens."),
    "qo_indptr": ("Int32Array", "[B+1] each request's query rows."),
    "batch_indices": ("Int32Array", "[nnz] each row's request (append_paged_kv_cache)."),
    "positions": ("Int32Array", "[nnz] each row's position in its request's held pages (append_paged_kv_cache)."),
    "token_ids": ("Int32Array", "[nnz] each row's token id."),
    "token_positions": ("Int32Array", "[nnz] each row's absolute position (RoPE)."),
    "kv_indptr": ("Int32Array", "[B+1] each request's entries of kv_page_indices."),
    "kv_page_indices": ("Int32Array", "[kv_indptr[-1]] the pages of the paged table after the append."),
    "kv_last_page_len": ("Int32Array", "[B] the entries of each request's last page."),
    "seq_lens": ("Int32Array", "[B] each request's KV length after the append."),
    "cascade": ("Optional[List[Level]]", "None (run flat) or the cascade levels, most shared first."),
    "query_rows": ("Optional[Int32Array]", "[nnz] cascade row r holds plan row query_rows[r] (None when flat)."),
    "cascade_window_left": ("Optional[Int32Array]", "A hybrid group's window_left per cascade level (None when flat "
                                                    "or dense)."),
    "attn_qo_indptr": ("Optional[Int32Array]", "A chunked group's [A+1] attention query rows (None elsewhere)."),
    "attn_kv_indptr": ("Optional[Int32Array]", "A chunked group's [A+1] attention kv_indptr (None elsewhere)."),
    "attn_kv_page_indices": ("Optional[Int32Array]", "A chunked group's attention pages (None elsewhere)."),
    "attn_kv_last_page_len": ("Optional[Int32Array]", "A chunked group's [A] attention kv_last_page_len (None "
                                                      "elsewhere)."),
    "attn_requests": ("Optional[Int32Array]", "A chunked group's [A] request of each attention entry (None "
                                              "elsewhere)."),
    "block_tables": ("Optional[np.ndarray]", "[B, block_tables_stride] the page table padded for trtllm-gen, XQA and "
                                             "cuDNN decode (None unless the Manager has block_tables_stride)."),
    "max_seq_len": ("Optional[int]", "block_tables_stride * page_size, fixed for CUDA graphs (None without "
                                     "block tables)."),
    "attention_kind": ("str", "The attention to run, the library's decision (pagedkv_plan.attention_kind): "
                              "\"cascade\", \"chunked\", \"decode\" or \"prefill\"."),
    "groups": ("List[Plan]", "One Plan per layer group, in the HybridManager's group order."),
    "state_indices": ("Optional[Int32Array]", "A state group's [B] state slot (a page) of each request: Mamba-2's "
                                              "and Gated DeltaNet's state_indices; its copies (whole pages) run "
                                              "first (None elsewhere)."),
}


def _plan_field(index, name):
    def get(self):
        if self._manager is not None and self._manager._generation != self._generation:
            raise StalePlan("pagedkv: plan.%s: the plan of step %d was read after %s"
                            % (name, self._generation, self._manager._passed()))
        return self._values[index]
    typ, doc = _FIELD_DOCS.get(name, ("Any", "The step's %s." % name))
    get.__name__, get.__qualname__ = name, name
    get.__doc__ = doc + " Raises StalePlan once the step has passed."
    get.__annotations__ = {"return": typ}
    return property(get, doc=get.__doc__)


_P = TypeVar("_P", bound="_Stepped")


class _Stepped:
    """What Plan and HybridPlan share: the values of one step of one
    Manager, current until its next successful reserve() or close()."""

    # _manager is None for an owned copy (current forever); _generation is
    # the Manager's step generation the plan belongs to.
    __slots__ = ("_values", "_manager", "_generation")

    _values: Tuple[Any, ...]
    _manager: Optional[_Core]
    _generation: int

    @property
    def valid(self) -> bool:
        """Whether the plan is current: no later successful reserve(), not closed."""
        return self._manager is None or self._manager._generation == self._generation

    def copy(self: _P) -> _P:
        """A plan whose arrays are owned copies, current forever. Raises
        StalePlan if the plan is not current. Safe against a reserve() on
        another thread: the copy is taken while no call runs on the Manager."""
        m = self._manager
        if m is None:
            return self._copy_values()
        with m._lock:  # waits for a call in flight; a reserve cannot start while we copy
            if m._generation != self._generation:
                raise StalePlan("pagedkv: copy of the plan of step %d after %s"
                                % (self._generation, m._passed()))
            return self._copy_values()

    def _copy_values(self: _P) -> _P:
        raise NotImplementedError

    def _step(self) -> str:
        return "owned copy" if self._manager is None else "step %d%s" % (
            self._generation, "" if self.valid else ", stale")

    def _owned(self, values):
        p = type(self).__new__(type(self))
        p._values, p._manager, p._generation = tuple(values), None, 0
        return p


def _copy_array(v):
    return v.copy() if isinstance(v, np.ndarray) else v


class Plan(_Stepped):
    """A step's plan (Go: pagedkv.Plan). Arrays are int32 numpy views into
    the Manager's buffers. The plan is current from the successful reserve()
    that returned it until the next successful reserve() or close() of its
    Manager; after that every property and copy() raise StalePlan (valid
    says which). A view taken while the plan was current is not checked
    again: see the module doc.

    copies [n, 3]: (src, dst, entries) page copies to do before appending.
    qo_indptr [B+1], batch_indices [nnz], positions [nnz]: the append.
    token_ids [nnz], token_positions [nnz]: the rows' tokens and absolute
    positions (RoPE). kv_indptr [B+1], kv_page_indices [kv_indptr[-1]],
    kv_last_page_len [B], seq_lens [B]: the paged table after the append.
    window_left: FlashInfer's window_left. cascade: None (run flat) or a
    list of Level, most shared first, with query_rows [nnz]: cascade row r
    holds plan row query_rows[r]. drafts [B]: how many of request b's rows
    (its last ones) are draft tokens (reserve_spec; zeros otherwise).
    attention_kind: the attention to run, the library's decision
    (pagedkv_plan.attention_kind): "cascade", "chunked" (a chunked group:
    batch prefill over the attn_* arrays), "decode" (one query row per
    request) or "prefill". request_ids: the ids the step was reserved for
    (an owned copy).
    block_tables [B, block_tables_stride] (None unless the Manager was made
    with block_tables_stride > 0): the same page table padded for
    trtllm-gen, XQA and cuDNN decode, row b = request b's kv_page_indices
    then 0; with seq_lens and max_seq_len (block_tables_stride * page_size,
    fixed for CUDA graphs; None without tables). See
    pagedkv.flashinfer.trtllm_decode_kwargs.

    A group's plan of a HybridManager also has cascade_window_left
    [len(cascade)] (each level's window_left; None when flat) and, for a
    chunked group only, the attention arrays attn_qo_indptr [A+1],
    attn_kv_indptr [A+1], attn_kv_page_indices, attn_kv_last_page_len [A]
    and attn_requests [A] (one entry per run of a request's rows inside one
    chunk: run batch prefill on these; the append uses the plan's own).
    They are None in a dense plan and the attn arrays in other groups.
    """

    __slots__ = ()
    if TYPE_CHECKING:
        request_ids: UInt64Array
        batch_size: int
        nnz: int
        window_left: int
        copies: Int32Array
        drafts: Int32Array
        qo_indptr: Int32Array
        batch_indices: Int32Array
        positions: Int32Array
        token_ids: Int32Array
        token_positions: Int32Array
        kv_indptr: Int32Array
        kv_page_indices: Int32Array
        kv_last_page_len: Int32Array
        seq_lens: Int32Array
        cascade: Optional[List[Level]]
        query_rows: Optional[Int32Array]
        block_tables: Optional[np.ndarray]
        max_seq_len: Optional[int]
        attention_kind: str
        cascade_window_left: Optional[Int32Array]
        attn_qo_indptr: Optional[Int32Array]
        attn_kv_indptr: Optional[Int32Array]
        attn_kv_page_indices: Optional[Int32Array]
        attn_kv_last_page_len: Optional[Int32Array]
        attn_requests: Optional[Int32Array]
        state_indices: Optional[Int32Array]

    def __repr__(self) -> str:
        if not self.valid:
            return "<pagedkv.Plan of %s>" % self._step()
        v = dict(zip(_PLAN_FIELDS, self._values))
        levels = v["cascade"]
        return "<pagedkv.Plan of %s: batch_size=%d, nnz=%d, pages=%d, copies=%d, window_left=%d, cascade=%s>" % (
            self._step(), v["batch_size"], v["nnz"], len(v["kv_page_indices"]), len(v["copies"]), v["window_left"],
            "None" if levels is None else "%d levels" % len(levels))

    def _copy_values(self):
        values = [_copy_array(v) for v in self._values]
        cascade = _PLAN_FIELDS.index("cascade")
        if values[cascade] is not None:
            values[cascade] = [Level(*(a.copy() for a in (lv.qo_indptr, lv.kv_indptr, lv.kv_indices,
                                                         lv.kv_last_page_len))) for lv in values[cascade]]
        return self._owned(values)


class HybridPlan(_Stepped):
    """A HybridManager step's plan (Go: pagedkv.HybridPlan), current like a
    Plan. copies [n, 3]: the pool-wide page copies (every group's), to do
    first in every layer's tensor. groups: one Plan per layer group, in the
    order of the Manager's groups, each with that group's FlashInfer arrays
    (see Plan). request_ids: the step's ids (an owned copy)."""

    __slots__ = ()
    if TYPE_CHECKING:
        request_ids: UInt64Array
        copies: Int32Array
        groups: List[Plan]

    def __repr__(self) -> str:
        if not self.valid:
            return "<pagedkv.HybridPlan of %s>" % self._step()
        ids, copies, groups = self._values
        return "<pagedkv.HybridPlan of %s: batch_size=%d, copies=%d, groups=[%s]>" % (
            self._step(), len(ids), len(copies), ", ".join(
                "nnz=%d pages=%d" % (g._values[2], len(g._values[_PLAN_FIELDS.index("kv_page_indices")]))
                for g in groups))

    def _copy_values(self):
        ids, copies, groups = self._values
        return self._owned((ids, copies.copy(), [g._copy_values() for g in groups]))


for _i, _name in enumerate(_PLAN_FIELDS):
    setattr(Plan, _name, _plan_field(_i, _name))
for _i, _name in enumerate(("request_ids", "copies", "groups")):
    setattr(HybridPlan, _name, _plan_field(_i, _name))
del _i, _name


_EMPTY = np.zeros(0, dtype=np.int32)


def _addr(a):
    return a.__array_interface__["data"][0]


def _ptr(a):
    """a's address for a C call; None (NULL) for None or an empty array."""
    return None if a is None or not a.size else _addr(a)


_F = TypeVar("_F", bound=Callable[..., Any])
_M = TypeVar("_M", bound="_Core")


def _exclusive(method: _F) -> _F:
    """Runs method holding its Manager's call lock, or raises Busy when
    another thread holds it: at once (as the C ABI does), or after waiting
    up to the Manager's busy_timeout. The lock covers the C call and every
    read of the Manager's shared out-buffers afterwards, so a call's results
    cannot mix with another thread's call. On a closed Manager (except
    close()) it raises BadHandle naming the Manager. functools.wraps keeps
    the method's name, docstring, annotations and signature."""
    op = method.__name__

    @functools.wraps(method)
    def call(self: _Core, *args: Any, **kwargs: Any) -> Any:
        t = self._busy_timeout  # inline _acquire: this runs on every call
        if not (self._lock.acquire(False) if t == 0 else self._lock.acquire(True, -1 if t is None else t)):
            raise Busy("pagedkv: %s: %s is in use by another thread%s" % (op, self._label(), self._waited()))
        try:
            if not self._handle and op != "close":
                raise BadHandle("pagedkv: %s: %s is closed" % (op, self._label()))
            return method(self, *args, **kwargs)
        finally:
            self._lock.release()
    return call  # type: ignore[return-value]


class _Core:
    """What Manager and HybridManager share: the handle, its call lock, the
    step generation, and the calls both kinds of handle take."""

    _lock: threading.Lock
    _handle: int
    _generation: int

    if TYPE_CHECKING:  # installed by usage.py (at the end of this module)
        def cache_usage(self, request_id: int) -> CacheUsage: ...
        def cache_usage_totals(self) -> CacheUsage: ...

    def _init(self, lib: Any, handle: int, num_pages: int, page_size: int, plan_words: int, views: List[int],
              busy_timeout: Optional[float]) -> None:
        self._lib = lib
        self._handle = handle
        self._id = handle  # the handle it was made with: errors name the Manager by it, even after close()
        self._busy_timeout: Optional[float] = _timeout(type(self).__name__, busy_timeout)
        self._kept = 0  # after close(): the handle whose memory the views may still use
        self.num_pages, self.page_size = num_pages, page_size
        self._lock = threading.Lock()  # held by the call in flight (see _exclusive)
        self._generation = 0  # step generation: +1 on every successful reserve and on close
        self._plan_words = np.zeros(plan_words, dtype=np.int64)
        self._plan_addr = _addr(self._plan_words)
        # Per plan (one, or one per group), per array: (data, cap, base view).
        self._views = [[None] * n for n in views]
        self._i64 = ctypes.c_int64(0)
        self._state = _ffi.RequestState()
        self._bt = _ffi.BlockTables()
        self._block_tables_stride = 0

    # -- the call lock --

    @property
    def busy_timeout(self) -> Optional[float]:
        """How long (seconds) a call waits for another thread's call in
        flight before raising Busy: 0 (the default) raises at once, None
        waits as long as it takes. Settable; lock-free."""
        return self._busy_timeout

    @busy_timeout.setter
    def busy_timeout(self, seconds: Optional[float]) -> None:
        self._busy_timeout = _timeout("busy_timeout", seconds)

    def _waited(self) -> str:
        t = self._busy_timeout
        return "" if not t else " (waited busy_timeout = %g s)" % t

    def _label(self) -> str:
        """How errors name this Manager: its kind and the handle it was made with."""
        return "%s %d" % (type(self).__name__, self._id)

    def _live(self, op: str) -> None:
        """For a lock-free call: BadHandle naming the Manager once it is closed."""
        if not self._handle:
            raise BadHandle("pagedkv: %s: %s is closed" % (op, self._label()))

    def __repr__(self) -> str:
        if "_id" not in vars(self):  # its constructor raised
            return "<pagedkv.%s, not created>" % type(self).__name__
        extra = ", groups=%r" % (list(self.kinds),) if isinstance(self, HybridManager) else ""
        if not self._handle:
            return "<pagedkv.%s %d: num_pages=%d, page_size=%d%s, closed>" % (
                type(self).__name__, self._id, self.num_pages, self.page_size, extra)
        raw = _ffi.Stats()
        self._lib.pagedkv_get_stats(self._handle, ctypes.byref(raw), ctypes.sizeof(raw))
        return "<pagedkv.%s %d: num_pages=%d, page_size=%d%s, requests=%d, free_pages=%d, step=%d>" % (
            type(self).__name__, self._id, self.num_pages, self.page_size, extra, raw.requests, raw.free_pages,
            self._generation)

    # -- lifetime --

    @_exclusive
    def close(self) -> None:
        """Destroy the Manager: its stores and sockets close now, every Plan
        becomes stale and every call raises BadHandle. The memory the numpy
        views point into (plan arrays, tier_copies(), host_pages()) stays
        allocated until this object and the last view are gone, so a view
        written after close() (a copy still in flight at shutdown) changes
        memory nobody reads, and never kills the process."""
        if self._handle:
            rc = self._lib.pagedkv_destroy_keep_memory(self._handle)
            if rc:
                _raise(self._lib, rc)
            self._kept, self._handle = self._handle, 0
            self._generation += 1
            self._views = [[None] * len(v) for v in self._views]

    def _passed(self):
        """Why a plan of an earlier step generation is no longer current."""
        if not self._handle:
            return "close() of its Manager"
        return "the successful reserve of step %d (a plan is current until the next one)" % self._generation

    def __enter__(self: _M) -> _M:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self):
        # Every view of the Manager's memory refers to this object (_base,
        # _c_view), so this runs only when none is left: the memory can go.
        try:
            if self._handle:
                self._lib.pagedkv_destroy(self._handle)
            elif self._kept:
                self._lib.pagedkv_free_memory(self._kept)
                self._kept = 0
        except Exception:
            pass

    def _check(self, rc):
        if rc:
            _raise(self._lib, rc)

    # -- per request --

    @_exclusive
    def add(self, request_id: int, prompt: Ints, *, tenant: Union[str, bytes] = "", lora: Union[str, bytes] = "",
            salt: Union[str, bytes] = "", priority: int = 0, no_cache: bool = False, capacity_tokens: int = 0) -> int:
        """Admit a request; returns how many prompt tokens the prefix cache served.

        prompt: its token ids (at least one). tenant, lora, salt: the
        namespace its prefix cache hits stay within. priority: 0 is served
        first (Config.priorities levels). no_cache: neither look up nor
        publish its pages. capacity_tokens: pages to keep for this many
        tokens (0: the prompt's)."""
        request_id = _scalar(request_id, _U64, "add", "request_id")
        p = _ints(prompt, np.int32, _I32, "add", "prompt")
        if not p.size:
            raise BadArgument("pagedkv: bad argument: add: request %d: prompt is empty; a request needs at least "
                              "one token" % request_id)
        req = _ffi.Request()
        _fill_ns(req.ns, tenant, lora, salt)
        req.prompt, req.prompt_len = _addr(p) if p.size else None, p.size
        req.priority = _scalar(priority, _I32, "add", "priority")
        req.no_cache = 1 if no_cache else 0
        req.capacity_tokens = _scalar(capacity_tokens, _I64, "add", "capacity_tokens")
        self._check(self._lib.pagedkv_add(self._handle, request_id, ctypes.byref(req), ctypes.byref(self._i64)))
        return self._i64.value

    @_exclusive
    def extend(self, request_id: int, tokens: Ints) -> None:
        """Append known tokens to the request (Go: Extend), computed by later steps."""
        request_id = _scalar(request_id, _U64, "extend", "request_id")
        t = _ints(tokens, np.int32, _I32, "extend", "tokens")
        self._check(self._lib.pagedkv_extend(self._handle, request_id, _addr(t) if t.size else None, t.size))

    @_exclusive
    def fork(self, parent: int, child: int) -> None:
        """Start request child as a copy of parent sharing its pages (Go: Fork; beam search, n > 1)."""
        self._check(self._lib.pagedkv_fork(self._handle, _scalar(parent, _U64, "fork", "parent"),
                                           _scalar(child, _U64, "fork", "child")))

    @_exclusive
    def preempt(self, request_id: int) -> None:
        """Free the request's pages, keeping its tokens (Go: Preempt); resume() brings it back."""
        self._check(self._lib.pagedkv_preempt(self._handle, _scalar(request_id, _U64, "preempt", "request_id")))

    @_exclusive
    def resume(self, request_id: int) -> int:
        """Bring a preempted request back (Go: Resume); returns the tokens the prefix cache served."""
        request_id = _scalar(request_id, _U64, "resume", "request_id")
        self._check(self._lib.pagedkv_resume(self._handle, request_id, ctypes.byref(self._i64)))
        return self._i64.value

    @_exclusive
    def release(self, request_id: int) -> None:
        """Finish the request: its pages go to the prefix cache or the free pool (Go: Release)."""
        self._check(self._lib.pagedkv_release(self._handle, _scalar(request_id, _U64, "release", "request_id")))


    # -- per step --

    @_exclusive
    def commit_spec(self, accepted: Ints, sampled: Optional[Ints] = None) -> None:
        """Record a speculative step (Go: CommitSpec): accepted[b] drafts of
        request b were accepted; sampled as for commit()."""
        a = _ints(accepted, np.int32, _I32, "commit_spec", "accepted")
        ap = _addr(a) if a.size else ctypes.addressof(self._i64)
        if sampled is None:
            self._check(self._lib.pagedkv_commit_spec(self._handle, ap, a.size, None, 0))
            return
        s = _ints(sampled, np.int32, _I32, "commit_spec", "sampled")
        sp = _addr(s) if s.size else ctypes.addressof(self._i64)
        self._check(self._lib.pagedkv_commit_spec(self._handle, ap, a.size, sp, s.size))

    @_exclusive
    def truncate(self, request_id: int, n: int) -> None:
        """Cut the request's tokens to its first n (Go: Truncate)."""
        self._check(self._lib.pagedkv_truncate(self._handle, _scalar(request_id, _U64, "truncate", "request_id"),
                                               _scalar(n, _I64, "truncate", "n")))

    @_exclusive
    def commit(self, sampled: Optional[Ints] = None) -> None:
        """Record the reserved step; sampled[b] (or NO_TOKEN) per request, or None."""
        if sampled is None:
            self._check(self._lib.pagedkv_commit(self._handle, None, 0))
            return
        s = _ints(sampled, np.int32, _I32, "commit", "sampled")
        # A non-NULL pointer even for an empty list: it is checked against the batch.
        ptr = _addr(s) if s.size else ctypes.addressof(self._i64)
        self._check(self._lib.pagedkv_commit(self._handle, ptr, s.size))

    @_exclusive
    def abort(self) -> None:
        """Drop the reserved step (Go: Abort): nothing of it is recorded."""
        self._check(self._lib.pagedkv_abort(self._handle))


    def _stepped(self, rc):
        """After a reserve's C call: raise its error, or start a step."""
        if rc:
            _raise(self._lib, rc)
        self._generation += 1

    def _array(self, w, k, views, i):
        """The array whose descriptor is at word k of w, through the view
        cache views[i]."""
        data, n, cap = w[k], w[k + 1], w[k + 2]
        if cap == 0:
            return _EMPTY
        v = views[i]
        if v is None or v[0] != data or v[1] != cap:
            v = views[i] = (data, cap, self._base(data, cap))
        return v[2][:n]

    def _read_plan(self, w, base, views, ids, extra, group=0):
        """The Plan of group (0 for a dense Manager) whose pagedkv_plan
        starts at word base of w (the words of the reserve that just
        succeeded; the caller holds the lock); extra are the values of the
        hybrid fields."""
        n_arrays = len(_ffi.PLAN_ARRAYS)
        k = base + 3 + 3 * n_arrays  # num_levels, levels, then drafts
        (copies, qo_indptr, batch_indices, positions, token_ids, token_positions, kv_indptr,
         kv_page_indices, kv_last_page_len, seq_lens, query_rows) = [
            self._array(w, base + 3 + 3 * i, views, i) for i in range(n_arrays)]
        drafts = self._array(w, k + 2, views, n_arrays)
        num_levels = w[k]
        if num_levels == 0:
            cascade = query_rows = None
        else:
            levels = ctypes.cast(w[k + 1], ctypes.POINTER(_ffi.Level))
            cascade = [Level(*(self._view(getattr(levels[i], f)) for f in Level.__slots__))
                       for i in range(num_levels)]
        p = Plan.__new__(Plan)
        p._manager, p._generation = self, self._generation
        # In _PLAN_FIELDS order.
        block_tables = max_seq_len = None
        if self._block_tables_stride:
            bt = self._bt
            self._check(self._lib.pagedkv_get_block_tables(self._handle, group, ctypes.byref(bt), ctypes.sizeof(bt)))
            block_tables = self._view(bt.block_tables).reshape(-1, bt.stride)
            max_seq_len = bt.max_seq_len
        p._values = (ids, w[base], w[base + 1], w[base + 2], copies.reshape(-1, 3), drafts, qo_indptr,
                     batch_indices, positions, token_ids, token_positions, kv_indptr, kv_page_indices,
                     kv_last_page_len, seq_lens, cascade, query_rows, block_tables, max_seq_len,
                     _ffi.ATTENTION_KINDS[w[k + 5]]) + extra

        return p

    def _base(self, data, cap):
        """A numpy view of [data, data+cap) that keeps this Manager alive, so
        that garbage collection never destroys a Manager, or frees the memory
        close() kept, while its arrays are still referenced."""
        buf = (ctypes.c_int32 * cap).from_address(data)
        buf._owner = self
        return np.frombuffer(buf, dtype=np.int32)

    def _view(self, arr):
        if arr.cap == 0:
            return _EMPTY
        return self._base(arr.data, arr.cap)[: arr.len]


    # -- operations --

    def stats(self) -> Stats:
        """A consistent Stats snapshot; safe from any thread at any time."""
        self._live("stats")
        raw = _ffi.Stats()
        self._check(self._lib.pagedkv_get_stats(self._handle, ctypes.byref(raw), ctypes.sizeof(raw)))
        return Stats(raw)

    @_exclusive
    def audit(self) -> None:
        """Check every invariant; raises AuditError naming the first violation."""
        self._check(self._lib.pagedkv_audit(self._handle))

    @_exclusive
    def evict(self, npages: int) -> int:
        """Evict up to npages cached, unused pages (Go: Evict); returns how many were freed."""
        freed = ctypes.c_int64(0)
        npages = _scalar(npages, _I64, "evict", "npages")
        self._check(self._lib.pagedkv_evict(self._handle, npages, ctypes.byref(freed)))
        return freed.value


    # -- inspection (copies) --

    def has(self, request_id: int) -> bool:
        """Whether the request is known (running or preempted)."""
        try:
            self.request_state(request_id)
        except UnknownRequest:
            return False
        return True

    @_exclusive
    def tokens(self, request_id: int) -> Int32Array:
        """Every known token of the request (a copy)."""
        return self._copy_out(self._lib.pagedkv_request_tokens, request_id, "tokens")


    @_exclusive
    def pin(self, tokens: Ints, *, tenant: Union[str, bytes] = "", lora: Union[str, bytes] = "",
            salt: Union[str, bytes] = "") -> Tuple[int, int]:
        """Pin the cached prefix of tokens (in every group of a
        HybridManager); returns (pin_id, pinned_tokens)."""
        t = _ints(tokens, np.int32, _I32, "pin", "tokens")
        ns = _ffi.Namespace()
        _fill_ns(ns, tenant, lora, salt)
        pin, n = ctypes.c_uint64(0), ctypes.c_int64(0)
        self._check(self._lib.pagedkv_pin(self._handle, ctypes.byref(ns), _addr(t) if t.size else None, t.size,
                                          ctypes.byref(pin), ctypes.byref(n)))
        return pin.value, n.value

    @_exclusive
    def pin_for(self, tokens: Ints, ttl: float, *, tenant: Union[str, bytes] = "", lora: Union[str, bytes] = "",
                salt: Union[str, bytes] = "") -> Tuple[int, int]:
        """pin() with a lifetime (Go: PinFor; Anthropic's cache_control ttl):
        the pin lapses by itself ttl seconds (at most a day; 0: never) after
        it was made or last refreshed on the manager's clock; every admission
        matching its whole prefix refreshes it. Pins count against
        pin_budget (PinLimit names the figures). Returns (pin_id,
        pinned_tokens)."""
        t = _ints(tokens, np.int32, _I32, "pin_for", "tokens")
        ms = _millis(ttl, "pin_for", "ttl")
        ns = _ffi.Namespace()
        _fill_ns(ns, tenant, lora, salt)
        pin, n = ctypes.c_uint64(0), ctypes.c_int64(0)
        self._check(self._lib.pagedkv_pin_for(self._handle, ctypes.byref(ns), _addr(t) if t.size else None, t.size,
                                              ms, ctypes.byref(pin), ctypes.byref(n)))
        return pin.value, n.value

    @_exclusive
    def set_retention(self, request_id: int, ranges: Sequence[RetentionRange]) -> None:
        """Replace request_id's retention ranges (Go: SetRetention; at most
        64, [] clears them) and apply them to its cached pages at once;
        pages it publishes later, or a resume matches, take them then. Call
        it right after add(), after a commit, before resume() or release()."""
        if isinstance(ranges, RetentionRange) or not hasattr(ranges, "__len__"):
            raise BadArgument("pagedkv: bad argument: set_retention: ranges = %r, want a list of RetentionRange"
                              % (ranges,))
        arr = (_ffi.RetentionRange * max(len(ranges), 1))()
        for i, r in enumerate(ranges):
            if not isinstance(r, RetentionRange):
                raise BadArgument("pagedkv: bad argument: set_retention: ranges[%d] = %r is not a RetentionRange"
                                  % (i, r))
            arr[i] = r._c("set_retention", i)
        self._check(self._lib.pagedkv_set_retention(self._handle, _scalar(request_id, _U64, "set_retention",
                                                                          "request_id"),
                                                    ctypes.cast(arr, ctypes.c_void_p), len(ranges),
                                                    ctypes.sizeof(_ffi.RetentionRange)))

    @_exclusive
    def set_clock(self, now: float) -> None:
        """From now on the manager's clock (durations and TTLs) is the
        caller's: now seconds (a value below the last one keeps the last
        one); before the first call it is monotonic from creation."""
        self._check(self._lib.pagedkv_set_clock(self._handle, _millis(now, "set_clock", "now", None)))

    @_exclusive
    def unpin(self, pin_id: int) -> None:
        """Undo pin() (Go: Unpin): the pages may be evicted again."""
        self._check(self._lib.pagedkv_unpin(self._handle, _scalar(pin_id, _U64, "unpin", "pin_id")))

    # -- KV events --

    @_exclusive
    def drain_events(self) -> List[bytes]:
        """Every KV event batch since the last drain, each the msgpack
        payload (bytes) of one vLLM KVEventBatch, oldest first; forward them
        to vLLM's ZMQ publisher unchanged. Commit ends a step's batch; the
        drain ends the current one. Raises BadConfig without events=."""
        out = []
        data, n = ctypes.c_void_p(0), ctypes.c_int64(0)
        while True:
            self._check(self._lib.pagedkv_drain_events(self._handle, ctypes.byref(data), ctypes.byref(n)))
            if not n.value:
                self._warn_events()
                return out
            out.append(ctypes.string_at(data.value, n.value))

    def events_endpoint(self, replay: bool = False) -> str:
        """The endpoint the KV event publisher bound or connected (replay:
        its replay socket's); BadConfig for a Manager that drains. Lock-free."""
        self._live("events_endpoint")
        n = ctypes.c_int64(0)
        fn = self._lib.pagedkv_events_endpoint
        self._check(fn(self._handle, 1 if replay else 0, None, 0, ctypes.byref(n)))
        buf = ctypes.create_string_buffer(max(n.value, 1))
        self._check(fn(self._handle, 1 if replay else 0, buf, n.value, ctypes.byref(n)))
        return buf.raw[: n.value].decode("utf-8", "replace")

    @_exclusive
    def events_stats(self) -> EventsStats:
        """The KV events' counters (Go: events.RecorderStats)."""
        raw = _ffi.EventsStats()
        self._check(self._lib.pagedkv_get_events_stats(self._handle, ctypes.byref(raw), ctypes.sizeof(raw)))
        return EventsStats(raw)

    def tier_stats(self) -> TierStats:
        """The tiers' counters (zeros without tiers); any thread, any time."""
        self._live("tier_stats")
        raw = _ffi.TierStats()
        self._check(self._lib.pagedkv_get_tier_stats(self._handle, ctypes.byref(raw), ctypes.sizeof(raw)))
        return TierStats(raw)

    def _warn_events(self) -> None:
        """Log a warning when the KV event stream dropped steps since the last drain."""
        raw = _ffi.EventsStats()
        if self._lib.pagedkv_get_events_stats(self._handle, ctypes.byref(raw), ctypes.sizeof(raw)):
            return
        seen = getattr(self, "_seen_dropped", 0)
        if raw.dropped_steps > seen:
            logger.warning("pagedkv: %s: the KV event stream dropped %d steps (%d events) since the last drain and "
                           "resynchronised: drain_events() more often or raise Events(queue_batches=)",
                           self._label(), raw.dropped_steps - seen, raw.dropped_events)
        self._seen_dropped = raw.dropped_steps

    def _warn_tiers(self) -> None:
        """Log a warning when the tiers dropped pages or a remote store failed since the last tier_copies()."""
        raw = _ffi.TierStats()
        self._lib.pagedkv_get_tier_stats(self._handle, ctypes.byref(raw), ctypes.sizeof(raw))
        now = (raw.dropped_pages, raw.remote_errors, raw.remote_timeouts, raw.remote_dropped)
        seen = getattr(self, "_seen_tiers", (0, 0, 0, 0))
        new = [a - b for a, b in zip(now, seen)]
        if any(new):
            logger.warning("pagedkv: %s: the tiers dropped %d host pages, the remote store had %d errors, %d "
                           "timeouts and dropped %d writes since the last tier_copies() (tier_stats() has the counters)",
                           self._label(), *new)
        self._seen_tiers = now

    def _copy_out(self, fn, request_id, op, *group):
        n = ctypes.c_int64(0)
        request_id = _scalar(request_id, _U64, op, "request_id")
        self._check(fn(self._handle, *group, request_id, None, 0, ctypes.byref(n)))
        out = np.empty(n.value, dtype=np.int32)
        if n.value:
            self._check(fn(self._handle, *group, request_id, _addr(out), n.value, ctypes.byref(n)))
        return out[: n.value]

    # -- tiers (either kind of manager) --

    @_exclusive
    def tier_copies(self) -> TierCopies:
        """The tier copies planned since the last call, as a TierCopies of
        numpy views (ids uint64, dirs, device_pages, host_pages int32), valid
        until the next tier_copies() or close() (their memory lives as long
        as the views). Run each (every layer's K
        and V of the device page to the host page, dir TO_HOST, or back) and
        report it with complete_tier_copies(). Raises BadConfig without tiers."""
        raw = _ffi.TierCopies()
        self._check(self._lib.pagedkv_tier_copies_take(self._handle, ctypes.byref(raw)))
        n = raw.n
        self._warn_tiers()
        if not n:
            return TierCopies(np.zeros(0, np.uint64), _EMPTY, _EMPTY, _EMPTY, 0)
        return TierCopies(self._c_view(raw.ids, ctypes.c_uint64, n, np.uint64),
                          *(self._c_view(p, ctypes.c_int32, n, np.int32) for p in (raw.dirs, raw.device_pages,
                                                                                   raw.host_pages)),
                          raw.num_offloads)

    def _c_view(self, addr, ctype, n, dtype):
        buf = (ctype * n).from_address(addr)
        buf._owner = self
        return np.frombuffer(buf, dtype=dtype)

    @_exclusive
    def complete_tier_copies(self, ids: Ints) -> None:
        """Report tier copies done (all-or-nothing: an unknown, repeated or
        not yet listed id raises BadArgument and changes nothing)."""
        a = _ints(ids, np.uint64, _U64, "complete_tier_copies", "ids")
        self._check(self._lib.pagedkv_complete_tier_copies(self._handle, _ptr(a), a.size))

    def host_pages(self) -> Optional[npt.NDArray[np.uint8]]:
        """The host pages' bytes as a writable numpy uint8 view [host_pages,
        page_bytes] (None without a page format). The library uses them
        until close(); the memory lives as long as the view (a write after
        close() is harmless). Lock-free."""
        self._live("host_pages")
        data, pb, n = ctypes.c_void_p(0), ctypes.c_int64(0), ctypes.c_int64(0)
        self._check(self._lib.pagedkv_host_memory(self._handle, ctypes.byref(data), ctypes.byref(pb), ctypes.byref(n)))
        if not data.value or not pb.value:
            return None
        return self._c_view(data.value, ctypes.c_uint8, pb.value * n.value, np.uint8).reshape(n.value, pb.value)

    @_exclusive
    def loading(self, request_id: int) -> bool:
        """Whether the request waits for onload copies (it cannot be stepped)."""
        v = ctypes.c_int32(0)
        self._check(self._lib.pagedkv_loading(self._handle, _scalar(request_id, _U64, "loading", "request_id"),
                                              ctypes.byref(v)))
        return bool(v.value)

    @_exclusive
    def tier_flush(self, timeout_ms: int = 10000) -> None:
        """Wait until the stores below the host tier wrote what is queued."""
        self._check(self._lib.pagedkv_tier_flush(self._handle, _scalar(timeout_ms, _I64, "tier_flush", "timeout_ms")))

    @_exclusive
    def cached_hashes(self, medium: str = "GPU") -> UInt64Array:
        """The chain hashes of the prefix cache's pages ("GPU", a Manager
        only: a HybridManager raises BadHandle) or of the servable host
        pages ("CPU"), as uint64 (a copy)."""
        if medium not in _MEDIA:
            raise BadArgument("pagedkv: bad argument: cached_hashes: medium = %r, want \"GPU\" or \"CPU\"" % (medium,))
        n = ctypes.c_int64(0)
        fn = self._lib.pagedkv_cached_hashes
        self._check(fn(self._handle, _MEDIA[medium], None, 0, ctypes.byref(n)))
        out = np.empty(n.value, dtype=np.uint64)
        if n.value:
            self._check(fn(self._handle, _MEDIA[medium], _addr(out), n.value, ctypes.byref(n)))
        return out[: n.value]


_NO_HYBRID = (None,) * (len(_ffi.GROUP_PLAN_ARRAYS) + 1)  # and state_indices


class Manager(_Core):
    """The pagedkv KV-cache manager (Go: pagedkv.Manager) over libpagedkv.

    Keyword arguments are pagedkv.Config's fields: num_pages, page_size,
    window_tokens, priorities, max_pinned_pages, hash_seed,
    cascade_min_saved_pages, memory_limit, block_tables_stride, pin_budget
    (0 means the Go default wherever Go has one; pin_budget is the share of
    num_pages pins may hold at once, 0 = no budget; memory_limit bounds the bytes the
    configuration asks for, 0 = this machine's physical memory: above it the
    constructor raises BadConfig naming the bytes needed and the limit;
    block_tables_stride > 0 gives every plan block_tables, see Plan);
    tiers (a Tiers: Config.Tiers) and events (an Events, or True: KV cache
    events drained with drain_events()); busy_timeout (seconds, see the
    busy_timeout property: 0 raises Busy at once, None waits).
    """

    def __init__(self, num_pages: int, page_size: int, *, window_tokens: int = 0, priorities: int = 0,
                 max_pinned_pages: int = 0, hash_seed: int = 0, cascade_min_saved_pages: int = 0, memory_limit: int = 0,
                 block_tables_stride: int = 0, tiers: Optional[Tiers] = None, events: Union[Events, bool, None] = None,
                 busy_timeout: Optional[float] = 0, pin_budget: float = 0.0) -> None:
        lib = _load()
        busy_timeout = _timeout("Manager", busy_timeout)
        cfg = _config("Manager", num_pages, page_size, window_tokens, priorities, max_pinned_pages, hash_seed,
                      cascade_min_saved_pages, memory_limit, block_tables_stride, pin_budget)
        opts, keep = _options("Manager", tiers, events)
        h = ctypes.c_uint64(0)
        rc = lib.pagedkv_create_ex(ctypes.byref(cfg), ctypes.sizeof(cfg), opts, ctypes.sizeof(_ffi.Options),
                                   ctypes.byref(h))
        if rc:
            _raise(lib, rc)
        self._init(lib, h.value, num_pages, page_size, _ffi.PLAN_WORDS, [len(_ffi.PLAN_ARRAYS) + 1], busy_timeout)
        self._host_memory = keep  # the caller's host memory lives as long as the Manager
        self._block_tables_stride = cfg.block_tables_stride

    @_exclusive
    def reserve(self, request_ids: Ints, ntokens: Ints) -> Plan:
        """Start a step: reserve ntokens[i] tokens of request_ids[i]; returns the Plan.

        request_ids (uint64) and ntokens (int32) may be numpy arrays of those
        dtypes (used without conversion) or sequences of ints.
        """
        ids, nt = _reserve_args("reserve", request_ids, ntokens)
        self._stepped(self._lib.pagedkv_reserve(self._handle, _ptr(ids), _ptr(nt), ids.size, self._plan_addr))
        return self._read_plan(self._plan_words.tolist(), 0, self._views[0], ids.copy(), _NO_HYBRID)

    @_exclusive
    def reserve_spec(self, request_ids: Ints, ntokens: Ints, drafts: Optional[Sequence[Ints]]) -> Plan:
        """A speculative step (Go: ReserveSpec): request_ids[i] computes its
        next ntokens[i] known tokens, then the draft tokens drafts[i] (a
        sequence, possibly empty; drafts may be None for none at all). Commit
        it with commit_spec."""
        ids, nt = _reserve_args("reserve_spec", request_ids, ntokens)
        indptr, flat = _draft_args("reserve_spec", ids.size, drafts)
        self._stepped(self._lib.pagedkv_reserve_spec(self._handle, _ptr(ids), _ptr(nt), ids.size, _ptr(indptr),
                                                     _ptr(flat), self._plan_addr))
        return self._read_plan(self._plan_words.tolist(), 0, self._views[0], ids.copy(), _NO_HYBRID)

    @property
    @_exclusive
    def pending(self) -> bool:
        """Whether a reserved step waits for commit() or abort()."""
        v = ctypes.c_int32(0)
        self._check(self._lib.pagedkv_pending(self._handle, ctypes.byref(v)))
        return bool(v.value)



    @_exclusive
    def request_state(self, request_id: int) -> RequestState:
        """The request's state (UnknownRequest if there is none)."""
        request_id = _scalar(request_id, _U64, "request_state", "request_id")
        self._check(self._lib.pagedkv_get_request_state(self._handle, request_id, ctypes.byref(self._state)))
        return RequestState(self._state)

    @_exclusive
    def pages(self, request_id: int) -> Int32Array:
        """The pages the request holds, in token order (a copy; empty if preempted)."""
        return self._copy_out(self._lib.pagedkv_request_pages, request_id, "pages")


class LayerGroup:
    """One layer group of a hybrid model (Go: pagedkv.LayerGroup): kind is
    "full", "sliding" (with window_tokens W), "chunked" (with chunk_tokens
    C, a multiple of the page size), "mla", "state" (recurrent layers:
    conv_shape (conv_dim, conv_kernel - 1), ssm_shape (3 dims), their
    dtypes "float32", "float16" or "bfloat16", and page_bytes, one layer's
    page of the pool; docs/state-groups.md), "indexer" (DeepSeek sparse
    attention's indexer-K cache on MLA group target, with indexer_head_dim
    and indexer_quant_block) or "shared_kv" (layers reading group target's
    KV cache; window_tokens or chunk_tokens its target's); see
    docs/indexer-shared-kv.md. Every group that owns pages (all but
    indexer and shared_kv, which come last) has the same num_layers (see
    Go's package layergroup)."""

    __slots__ = ("kind", "window_tokens", "chunk_tokens", "num_layers", "target", "indexer_head_dim",
                 "indexer_quant_block", "conv_shape", "conv_dtype", "ssm_shape", "ssm_dtype", "page_bytes")

    def __init__(self, kind: str, *, window_tokens: int = 0, chunk_tokens: int = 0, num_layers: int = 1,
                 target: int = 0, indexer_head_dim: int = 0, indexer_quant_block: int = 0,
                 conv_shape: Sequence[int] = (0, 0), conv_dtype: str = "", ssm_shape: Sequence[int] = (0, 0, 0),
                 ssm_dtype: str = "", page_bytes: int = 0) -> None:
        self.kind, self.window_tokens, self.chunk_tokens, self.num_layers = kind, window_tokens, chunk_tokens, num_layers
        self.target, self.indexer_head_dim, self.indexer_quant_block = target, indexer_head_dim, indexer_quant_block
        self.conv_shape, self.conv_dtype, self.ssm_shape, self.ssm_dtype = conv_shape, conv_dtype, ssm_shape, ssm_dtype
        self.page_bytes = page_bytes

    def __repr__(self) -> str:
        s = "LayerGroup(%r, window_tokens=%d, chunk_tokens=%d, num_layers=%d" % (
            self.kind, self.window_tokens, self.chunk_tokens, self.num_layers)
        if self.kind in ("indexer", "shared_kv"):
            s += ", target=%d" % self.target
        if self.kind == "indexer":
            s += ", indexer_head_dim=%d, indexer_quant_block=%d" % (self.indexer_head_dim, self.indexer_quant_block)
        if self.kind == "state":
            s += ", conv_shape=%r, conv_dtype=%r, ssm_shape=%r, ssm_dtype=%r, page_bytes=%d" % (
                tuple(self.conv_shape), self.conv_dtype, tuple(self.ssm_shape), self.ssm_dtype, self.page_bytes)
        return s + ")"

    def _c(self, where: str) -> "_ffi.LayerGroup":
        """The pagedkv_layer_group of this group (groups[i] is where); a
        value of the wrong type or range is refused, named."""
        op = "HybridManager"
        if self.kind not in _ffi.GROUP_KINDS:
            raise BadArgument("pagedkv: bad argument: %s: %s.kind = %r, want one of %s"
                              % (op, where, self.kind, ", ".join(_ffi.GROUP_KINDS)))
        c = _ffi.LayerGroup(_ffi.GROUP_KINDS.index(self.kind))
        for name in ("window_tokens", "chunk_tokens", "num_layers", "target", "indexer_head_dim",
                     "indexer_quant_block", "page_bytes"):
            setattr(c, name, _scalar(getattr(self, name), _I64, op, "%s.%s" % (where, name)))
        for name, n in (("conv_shape", 2), ("ssm_shape", 3)):
            v = getattr(self, name)
            if isinstance(v, (str, bytes)) or not hasattr(v, "__len__") or len(v) != n:
                raise BadArgument("pagedkv: bad argument: %s: %s.%s = %r, want %d integers" % (op, where, name, v, n))
            arr = getattr(c, name)
            for i, d in enumerate(v):
                arr[i] = _scalar(d, _I64, op, "%s.%s[%d]" % (where, name, i))
        for name in ("conv_dtype", "ssm_dtype"):
            v = getattr(self, name)
            if v not in _ffi.STATE_DTYPES:
                raise BadArgument("pagedkv: bad argument: %s: %s.%s = %r, want \"float32\", \"float16\" or "
                                  "\"bfloat16\" (\"\" for a group that is not a state group)" % (op, where, name, v))
            setattr(c, name, _ffi.STATE_DTYPES.index(v))
        return c


class HybridManager(_Core):
    """The KV-cache manager of a hybrid attention model (Go:
    pagedkv.HybridManager): one page pool, one page table and prefix cache
    per layer group. groups is a list of LayerGroup (or dicts of its
    fields); the other keyword arguments are Manager's (no window_tokens:
    windows are per group; max_pinned_pages caps each group's pins).
    Every Manager call with the same name does the same in every group
    (pin() pins the prefix in every group); reserve() returns a HybridPlan
    with one Plan per group, and request_state() and pages() take the
    group. events= gives KV events whose batches carry each group's
    group_idx; tiers= gives one host tier and remote store shared by the
    groups, with Manager's tier calls (tier_copies() name pool pages: copy
    each in every layer's tensor; the PageFormat's num_layers counts those
    tensors, see PageFormat); with both, the events announce each group's
    host pages too (medium "CPU", the group's group_idx). With "state"
    groups (see LayerGroup), state_checkpoint_every= checkpoints prompts
    every that many tokens too, each state group's plan has state_indices,
    and next_state_checkpoint() says where to end a prefill chunk; the
    events then announce the checkpoints (kv_cache_spec_kind "mamba").
    Threads, plan lifetime and busy_timeout are as for Manager.
    """

    def __init__(self, num_pages: int, page_size: int, groups: Sequence[Union[LayerGroup, Dict[str, Any]]], *,
                 priorities: int = 0, hash_seed: int = 0, cascade_min_saved_pages: int = 0, max_pinned_pages: int = 0,
                 memory_limit: int = 0, block_tables_stride: int = 0, tiers: Optional[Tiers] = None,
                 events: Union[Events, bool, None] = None, busy_timeout: Optional[float] = 0,
                 pin_budget: float = 0.0, state_checkpoint_every: int = 0) -> None:
        lib = _load()
        busy_timeout = _timeout("HybridManager", busy_timeout)
        cfg = _config("HybridManager", num_pages, page_size, 0, priorities, max_pinned_pages, hash_seed,
                      cascade_min_saved_pages, memory_limit, block_tables_stride, pin_budget)
        cfg.state_checkpoint_every = _scalar(state_checkpoint_every, _I64, "HybridManager", "state_checkpoint_every")
        if isinstance(groups, (str, bytes, dict, LayerGroup)) or not hasattr(groups, "__len__"):
            raise BadArgument("pagedkv: bad argument: HybridManager: groups = %r, want a list of LayerGroup" % (groups,))
        specs = (_ffi.LayerGroup * max(len(groups), 1))()
        kinds = []
        for i, g in enumerate(groups):
            if isinstance(g, dict):
                try:
                    g = LayerGroup(**g)
                except TypeError as e:
                    raise BadArgument("pagedkv: bad argument: HybridManager: groups[%d] = %r: %s" % (i, g, e)) from None
            if not isinstance(g, LayerGroup):
                raise BadArgument("pagedkv: bad argument: HybridManager: groups[%d] = %r, want a LayerGroup" % (i, g))
            specs[i] = g._c("groups[%d]" % i)
            kinds.append(g.kind)
        opts, keep = _options("HybridManager", tiers, events)
        h = ctypes.c_uint64(0)
        rc = lib.pagedkv_hybrid_create_ex(ctypes.byref(cfg), ctypes.sizeof(cfg), specs, len(groups),
                                          ctypes.sizeof(_ffi.LayerGroup), opts, ctypes.sizeof(_ffi.Options),
                                          ctypes.byref(h))
        if rc:
            _raise(lib, rc)
        n = len(kinds)
        # The words: the copies descriptor, then n pagedkv_group_plan, then
        # n state_indices descriptors (pagedkv_hybrid_state_indices).
        self._init(lib, h.value, num_pages, page_size, 3 + n * _ffi.GROUP_PLAN_WORDS + 3 * n,
                   [1] + [len(_ffi.PLAN_ARRAYS) + 2 + len(_ffi.GROUP_PLAN_ARRAYS)] * n, busy_timeout)
        self.kinds: Tuple[str, ...] = tuple(kinds)
        """The groups' kinds, in group order."""
        self._groups_addr = self._plan_addr + 8 * 3
        self._host_memory = keep
        self._block_tables_stride = cfg.block_tables_stride

    @property
    def num_groups(self) -> int:
        """How many layer groups (len(kinds)); lock-free."""
        return len(self.kinds)

    @_exclusive
    def reserve(self, request_ids: Ints, ntokens: Ints) -> HybridPlan:
        """Start a step in every group (all-or-nothing, one page budget);
        returns the HybridPlan."""
        ids, nt = _reserve_args("reserve", request_ids, ntokens)
        self._stepped(self._lib.pagedkv_hybrid_reserve(self._handle, _ptr(ids), _ptr(nt), ids.size, self._plan_addr,
                                                       self._groups_addr, len(self.kinds)))
        return self._hybrid_plan(ids)

    @_exclusive
    def reserve_spec(self, request_ids: Ints, ntokens: Ints, drafts: Optional[Sequence[Ints]]) -> HybridPlan:
        """A speculative step in every group (see Manager.reserve_spec)."""
        ids, nt = _reserve_args("reserve_spec", request_ids, ntokens)
        indptr, flat = _draft_args("reserve_spec", ids.size, drafts)
        self._stepped(self._lib.pagedkv_hybrid_reserve_spec(self._handle, _ptr(ids), _ptr(nt), ids.size, _ptr(indptr),
                                                            _ptr(flat), self._plan_addr, self._groups_addr,
                                                            len(self.kinds)))
        return self._hybrid_plan(ids)

    def _hybrid_plan(self, ids):
        n = len(self.kinds)
        states = 3 + n * _ffi.GROUP_PLAN_WORDS  # the state_indices descriptors
        for g, kind in enumerate(self.kinds):
            if kind == "state":
                self._check(self._lib.pagedkv_hybrid_state_indices(self._handle, g, self._plan_addr + 8 * (states + 3 * g)))
        w = self._plan_words.tolist()
        ids = ids.copy()
        groups = []
        n_plan = len(_ffi.PLAN_ARRAYS) + 1
        for g, kind in enumerate(self.kinds):
            base = 3 + g * _ffi.GROUP_PLAN_WORDS
            views = self._views[1 + g]
            extra = [self._array(w, base + _ffi.PLAN_WORDS + 3 * j, views, n_plan + j)
                     for j in range(len(_ffi.GROUP_PLAN_ARRAYS))]
            p = self._read_plan(w, base, views, ids, (), g)
            if p._values[_PLAN_FIELDS.index("cascade")] is None:
                extra[0] = None
            if kind != "chunked":
                extra[1:] = [None] * (len(extra) - 1)
            extra.append(self._array(w, states + 3 * g, views, n_plan + len(extra)) if kind == "state" else None)
            p._values += tuple(extra)
            groups.append(p)
        hp = HybridPlan.__new__(HybridPlan)
        hp._manager, hp._generation = self, self._generation
        hp._values = (ids, self._array(w, 0, self._views[0], 0).reshape(-1, 3), groups)
        return hp

    @_exclusive
    def next_state_checkpoint(self, request_id: int) -> int:
        """The token count at which the request's state is next
        checkpointed (Go: NextStateCheckpoint): end its prefill chunk there.
        0 when none is left, for an unknown request, or without state
        groups."""
        self._check(self._lib.pagedkv_hybrid_next_state_checkpoint(
            self._handle, _scalar(request_id, _U64, "next_state_checkpoint", "request_id"), ctypes.byref(self._i64)))
        return self._i64.value

    def group_stats(self) -> List[GroupStats]:
        """Every group's GroupStats, in group order; safe from any thread at
        any time, like stats() (whose pool-wide numbers cover every group)."""
        self._live("group_stats")
        out = []
        for g in range(len(self.kinds)):
            raw = _ffi.GroupStats()
            self._check(self._lib.pagedkv_hybrid_get_group_stats(self._handle, g, ctypes.byref(raw), ctypes.sizeof(raw)))
            out.append(GroupStats(raw))
        return out

    @_exclusive
    def request_state(self, request_id: int, group: int = 0) -> RequestState:
        """The request's state; start and num_pages are those of group."""
        request_id = _scalar(request_id, _U64, "request_state", "request_id")
        group = _scalar(group, _I64, "request_state", "group")
        self._check(self._lib.pagedkv_hybrid_request_state(self._handle, group, request_id,
                                                           ctypes.byref(self._state)))
        return RequestState(self._state)

    @_exclusive
    def pages(self, request_id: int, group: int) -> Int32Array:
        """The pages the request holds in group, in token order (a copy)."""
        group = _scalar(group, _I64, "pages", "group")
        return self._copy_out(self._lib.pagedkv_hybrid_request_pages, request_id, "pages", group)


# ---- Tiers and KV events: options of Manager and HybridManager ----

TO_HOST: int = 0
"""TierCopies.dirs: an offload, device page to host page."""
TO_DEVICE: int = 1
"""TierCopies.dirs: an onload, host page to device page."""
_MEDIA = {"GPU": 0, "CPU": 1}


class _Options:
    """Option records: a repr of every field."""

    __slots__: Tuple[str, ...] = ()

    def __repr__(self) -> str:
        return "%s(%s)" % (type(self).__name__, ", ".join("%s=%r" % (f, getattr(self, f)) for f in self.__slots__))


class PageFormat(_Options):
    """The bytes of one page off the device (Go: tier.PageFormat, with the
    Manager's page size): kv_layout "NHD" or "HND"; dtype the KV cache's
    element type, spelled as numpy or torch name it or short: np.float32,
    "float32" or "f32"; np.float16, "float16", "half" or "f16";
    "bfloat16" or "bf16"; "float8_e4m3fn" or "e4m3"; "float8_e5m2" or
    "e5m2" (torch.float16 and the like too); every layer's K then V plane.

    num_layers is the number of per-layer KV tensors a tier copy moves a
    page in. For a HybridManager that is either every group's num_layers
    (the groups share the tensors: layer j of every group lives in tensor
    j, docs/manager.md) or their sum (each group's layers have tensors of
    their own); the library refuses any other count (BadConfig)."""

    __slots__ = ("kv_layout", "dtype", "num_kv_heads", "head_dim", "num_layers")

    def __init__(self, *, kv_layout: str = "NHD", dtype: Any = "f16", num_kv_heads: int, head_dim: int,
                 num_layers: int) -> None:
        self.kv_layout, self.dtype = kv_layout, dtype
        self.num_kv_heads, self.head_dim, self.num_layers = num_kv_heads, head_dim, num_layers


class RedisTier(_Options):
    """A Redis server below the host tier (Go: tier/redis.Config); times in ms."""

    __slots__ = ("addr", "namespace", "group", "tag_by_chain", "queue_len", "batch", "expiry_ms", "write_timeout_ms",
                 "dial_timeout_ms")

    def __init__(self, addr: str, namespace: str, *, group: str = "", tag_by_chain: bool = False, queue_len: int = 0,
                 batch: int = 0, expiry_ms: int = 0, write_timeout_ms: int = 0, dial_timeout_ms: int = 0) -> None:
        self.addr, self.namespace, self.group, self.tag_by_chain = addr, namespace, group, tag_by_chain
        self.queue_len, self.batch, self.expiry_ms = queue_len, batch, expiry_ms
        self.write_timeout_ms, self.dial_timeout_ms = write_timeout_ms, dial_timeout_ms


class DiskTier(_Options):
    """A local disk tier (Go: tier/disk.Config): pages slots in segment files under dir."""

    __slots__ = ("dir", "namespace", "pages", "group", "segment_pages", "queue_len", "sync_every")

    def __init__(self, dir: str, namespace: str, pages: int, *, group: str = "", segment_pages: int = 0,
                 queue_len: int = 0, sync_every: int = 0) -> None:
        self.dir, self.namespace, self.pages, self.group = dir, namespace, pages, group
        self.segment_pages, self.queue_len, self.sync_every = segment_pages, queue_len, sync_every


class Tiers(_Options):
    """The tiers below the device pool (Go: pagedkv.TierConfig; docs/tiers.md).

    host_pages: host (CPU) pages, 0 for none. format: a PageFormat (needed
    by disk and redis; without it the host tier is bookkeeping only).
    host_memory: optional writable C-contiguous numpy uint8 array of
    host_pages * page_bytes (e.g. pinned memory); else the library
    allocates it (Manager.host_pages()). remote_deadline_ms bounds a lookup
    below the host tier (0: 20 ms). offload_free_pages, write_through: as
    in Go. disk, redis: a DiskTier and/or a RedisTier (host -> disk -> Redis).
    """

    __slots__ = ("host_pages", "format", "host_memory", "remote_deadline_ms", "offload_free_pages", "write_through",
                 "disk", "redis")

    def __init__(self, host_pages: int, *, format: Optional[PageFormat] = None,
                 host_memory: Optional[npt.NDArray[np.uint8]] = None, remote_deadline_ms: int = 0,
                 offload_free_pages: int = 0, write_through: bool = False, disk: Optional[DiskTier] = None,
                 redis: Optional[RedisTier] = None) -> None:
        self.host_pages, self.format, self.host_memory = host_pages, format, host_memory
        self.remote_deadline_ms, self.offload_free_pages = remote_deadline_ms, offload_free_pages
        self.write_through, self.disk, self.redis = write_through, disk, redis


class Events(_Options):
    """KV cache events in vLLM's format (Go: events.Recorder), drained with
    drain_events(), or, with an endpoint (e.g. "tcp://0.0.0.0:5557"),
    published by the library on a ZeroMQ PUB socket as vLLM's
    ZmqEventPublisher does (mode: "auto" as vLLM, bind a wildcard address
    and connect others; "bind" ("tcp://127.0.0.1:0": a free port, see
    events_endpoint()), "bind_or_connect", "connect"; replay_endpoint: its
    replay ROUTER socket; topic: the first frame). queue_batches (0: 64)
    batches are held until
    drained or sent (past it the stream drops a step and resynchronises);
    data_parallel_rank is the batches' data_parallel_rank."""

    __slots__ = ("queue_batches", "data_parallel_rank", "endpoint", "mode", "replay_endpoint", "topic")

    def __init__(self, *, queue_batches: int = 0, data_parallel_rank: int = 0, endpoint: str = "", mode: str = "auto",
                 replay_endpoint: str = "", topic: str = "") -> None:
        self.queue_batches, self.data_parallel_rank = queue_batches, data_parallel_rank
        self.endpoint, self.mode, self.replay_endpoint, self.topic = endpoint, mode, replay_endpoint, topic


class TierCopies:
    """A step's tier copies: ids (uint64), dirs (TO_HOST / TO_DEVICE),
    device_pages, host_pages (int32), num_offloads; numpy views valid until
    the next tier_copies() or close()."""

    __slots__ = ("ids", "dirs", "device_pages", "host_pages", "num_offloads")

    def __init__(self, ids: UInt64Array, dirs: Int32Array, device_pages: Int32Array, host_pages: Int32Array,
                 num_offloads: int) -> None:
        self.ids, self.dirs, self.device_pages, self.host_pages = ids, dirs, device_pages, host_pages
        self.num_offloads = num_offloads

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return "TierCopies(%d copies, %d offloads: ids=%s, dirs=%s, device_pages=%s, host_pages=%s)" % (
            len(self.ids), self.num_offloads, self.ids.tolist(), self.dirs.tolist(), self.device_pages.tolist(),
            self.host_pages.tolist())


class _Counters:
    """Named int64 counters read from a ctypes struct."""

    __slots__ = ()
    _FIELDS = ()

    def __init__(self, raw):
        for name in self._FIELDS:
            setattr(self, name, getattr(raw, name))

    def __getattr__(self, name: str) -> int:  # the counters, for type checkers (slots answer first)
        raise AttributeError(name)

    def as_dict(self) -> Dict[str, int]:
        """The counters by name."""
        return {name: getattr(self, name) for name in self._FIELDS}

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.as_dict() == other.as_dict()

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join("%s=%d" % kv for kv in self.as_dict().items()))


class TierStats(_Counters):
    """The tiers' counters (Go: pagedkv.TierStats; remote_*: tier.RemoteStats); as_dict() has them by name."""
    __slots__ = _ffi.TIER_STATS_FIELDS
    _FIELDS = _ffi.TIER_STATS_FIELDS


class EventsStats(_Counters):
    """The KV events' counters (Go: events.RecorderStats)."""
    __slots__ = _ffi.EVENTS_STATS_FIELDS
    _FIELDS = _ffi.EVENTS_STATS_FIELDS


def _bytes(value):
    b = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    return b, len(b)


def _store_fields(c, op, what, obj, strings, ints):
    for cname, attr in strings:
        v = getattr(obj, attr)
        if not isinstance(v, (str, bytes)):
            raise BadArgument("pagedkv: bad argument: %s: %s.%s = %r, want a string" % (op, what, attr, v))
        b, n = _bytes(v)
        setattr(c, cname, b)
        setattr(c, cname + "_len", n)
    for name in ints:
        v = getattr(obj, name)
        setattr(c, name, int(v) if isinstance(v, bool) else _scalar(v, _I64, op, "%s.%s" % (what, name)))


def _options(op, tiers, events):
    """The pagedkv_options of tiers and events (None: NULL), and what must
    live as long as the Manager (the caller's host memory)."""
    if tiers is None and events is None:
        return None, None
    opts = _ffi.Options()
    keep = None
    if tiers is not None:
        if not isinstance(tiers, Tiers):
            raise BadArgument("pagedkv: bad argument: %s: tiers = %r, want a pagedkv.Tiers" % (op, tiers))
        t = _ffi.TierConfig()
        t.host_pages = _scalar(tiers.host_pages, _I64, op, "tiers.host_pages")
        ms = _scalar(tiers.remote_deadline_ms, _I64, op, "tiers.remote_deadline_ms")
        if not 0 <= ms <= 24 * 3600 * 1000:
            raise BadArgument("pagedkv: bad argument: %s: tiers.remote_deadline_ms = %d, want 0..86400000 (a day)"
                              % (op, ms))
        t.remote_deadline_us = ms * 1000
        t.offload_free_pages = _scalar(tiers.offload_free_pages, _I64, op, "tiers.offload_free_pages")
        t.write_through = 1 if tiers.write_through else 0
        f = tiers.format
        if f is not None:
            if not isinstance(f, PageFormat):
                raise BadArgument("pagedkv: bad argument: %s: tiers.format = %r, want a pagedkv.PageFormat" % (op, f))
            if f.kv_layout not in _ffi.KV_LAYOUTS:
                raise BadArgument("pagedkv: bad argument: %s: tiers.format.kv_layout = %r, want \"NHD\" or \"HND\""
                                  % (op, f.kv_layout))
            dtype = _dtype_code(f.dtype)
            if dtype is None:
                raise BadArgument("pagedkv: bad argument: %s: tiers.format.dtype = %r, want one of %s (or the "
                                  "numpy or torch dtype)" % (op, f.dtype, ", ".join(sorted(_DTYPE_NAMES))))
            t.format = _ffi.PageFormat(_ffi.KV_LAYOUTS.index(f.kv_layout), dtype,
                                       *(_scalar(getattr(f, n), _I64, op, "tiers.format." + n)
                                         for n in ("num_kv_heads", "head_dim", "num_layers")))
        mem = tiers.host_memory
        if mem is not None:
            if not (type(mem) is np.ndarray and mem.dtype == np.uint8 and mem.flags.c_contiguous
                    and mem.flags.writeable):
                raise BadArgument("pagedkv: bad argument: %s: tiers.host_memory must be a writable C-contiguous "
                                  "numpy uint8 array, got %r" % (op, type(mem)))
            t.host_memory, t.host_memory_len = (_addr(mem) if mem.size else None), mem.size
            keep = mem
        if tiers.disk is not None:
            if not isinstance(tiers.disk, DiskTier):
                raise BadArgument("pagedkv: bad argument: %s: tiers.disk = %r, want a pagedkv.DiskTier" % (op, tiers.disk))
            d = _ffi.DiskConfig()
            _store_fields(d, op, "tiers.disk", tiers.disk, (("dir", "dir"), ("ns", "namespace"), ("group", "group")),
                          ("pages", "segment_pages", "queue_len", "sync_every"))
            t.disk, t.disk_size = ctypes.pointer(d), ctypes.sizeof(d)
        if tiers.redis is not None:
            if not isinstance(tiers.redis, RedisTier):
                raise BadArgument("pagedkv: bad argument: %s: tiers.redis = %r, want a pagedkv.RedisTier"
                                  % (op, tiers.redis))
            r = _ffi.RedisConfig()
            _store_fields(r, op, "tiers.redis", tiers.redis,
                          (("addr", "addr"), ("ns", "namespace"), ("group", "group")),
                          ("tag_by_chain", "queue_len", "batch", "expiry_ms", "write_timeout_ms", "dial_timeout_ms"))
            t.redis, t.redis_size = ctypes.pointer(r), ctypes.sizeof(r)
        opts.tiers, opts.tiers_size = ctypes.pointer(t), ctypes.sizeof(t)
    if events is not None and events is not False:
        if events is True:
            events = Events()
        if not isinstance(events, Events):
            raise BadArgument("pagedkv: bad argument: %s: events = %r, want a pagedkv.Events or True" % (op, events))
        e = _ffi.EventsConfig()
        _store_fields(e, op, "events", events, (("endpoint", "endpoint"), ("replay_endpoint", "replay_endpoint"),
                                                ("topic", "topic")), ("queue_batches", "data_parallel_rank"))
        if events.mode not in _ffi.EVENTS_MODES:
            raise BadArgument("pagedkv: bad argument: %s: events.mode = %r, want one of %s"
                              % (op, events.mode, ", ".join(_ffi.EVENTS_MODES)))
        e.mode = _ffi.EVENTS_MODES.index(events.mode)
        opts.events, opts.events_size = ctypes.pointer(e), ctypes.sizeof(e)
    return ctypes.pointer(opts), keep


_DTYPE_NAMES = {
    "f32": "f32", "float32": "f32", "float": "f32",
    "f16": "f16", "float16": "f16", "half": "f16",
    "bf16": "bf16", "bfloat16": "bf16",
    "e4m3": "e4m3", "float8_e4m3fn": "e4m3", "float8_e4m3": "e4m3",
    "e5m2": "e5m2", "float8_e5m2": "e5m2",
}


def _dtype_code(dtype: Any) -> Optional[int]:
    """The PAGEDKV_DTYPE_* of a dtype spelled as a string ("f16", "float16"),
    a numpy dtype or scalar type (np.float16), or a torch dtype
    (torch.float16, whose str is "torch.float16"); None if none fits."""
    if isinstance(dtype, str):
        name = dtype
    elif isinstance(dtype, np.dtype) or (isinstance(dtype, type) and issubclass(dtype, np.generic)):
        name = np.dtype(dtype).name
    else:
        name = str(dtype)
        if not name.startswith("torch."):
            return None
        name = name[len("torch."):]
    short = _DTYPE_NAMES.get(name)
    return None if short is None else _ffi.DTYPES[short]


def _timeout(op: str, seconds: Any) -> Optional[float]:
    """A checked busy_timeout: None (wait), or seconds >= 0."""
    if seconds is None:
        return None
    if isinstance(seconds, (bool, np.bool_)) or not isinstance(seconds, (int, float, np.integer, np.floating)) \
            or not 0 <= seconds < threading.TIMEOUT_MAX:
        raise BadArgument("pagedkv: bad argument: %s: busy_timeout = %r, want seconds >= 0 (0: raise Busy at once) "
                          "or None (wait as long as it takes)" % (op, seconds))
    return float(seconds)


def _config(op, num_pages, page_size, window_tokens, priorities, max_pinned_pages, hash_seed,
            cascade_min_saved_pages, memory_limit, block_tables_stride, pin_budget=0.0):
    """A checked pagedkv_config."""
    vals = dict(num_pages=num_pages, page_size=page_size, window_tokens=window_tokens, priorities=priorities,
                max_pinned_pages=max_pinned_pages, cascade_min_saved_pages=cascade_min_saved_pages,
                memory_limit=memory_limit, block_tables_stride=block_tables_stride)
    for name, v in vals.items():
        _scalar(v, _I64, op, name)
    if isinstance(pin_budget, (bool, np.bool_)) or not isinstance(pin_budget, (int, float, np.integer, np.floating)):
        raise BadArgument("pagedkv: bad argument: %s: pin_budget = %r is not a number" % (op, pin_budget))
    return _ffi.Config(num_pages, page_size, window_tokens, priorities, max_pinned_pages,
                       _scalar(hash_seed, _U64, op, "hash_seed"), cascade_min_saved_pages, memory_limit,
                       block_tables_stride, float(pin_budget))


def _reserve_args(op, request_ids, ntokens):
    ids = _ints(request_ids, np.uint64, _U64, op, "request_ids")
    nt = _ints(ntokens, np.int32, _I32, op, "ntokens")
    if ids.size != nt.size:
        raise BadArgument("pagedkv: bad argument: %s: %d requests but %d token counts" % (op, ids.size, nt.size))
    return ids, nt


def _draft_args(op, n, drafts):
    """reserve_spec's draft_indptr and drafts as arrays the caller keeps
    alive during the C call (the library copies them), or None, None."""
    if drafts is None:
        return None, None
    if len(drafts) != n:
        raise BadArgument("pagedkv: bad argument: %s: %d requests but %d draft lists" % (op, n, len(drafts)))
    lists = [_ints(d, np.int32, _I32, op, "drafts[%d]" % i) for i, d in enumerate(drafts)]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(d) for d in lists], out=indptr[1:])
    if indptr[-1] > _I32[1]:
        raise BadArgument("pagedkv: bad argument: %s: %d draft tokens in all" % (op, indptr[-1]))
    indptr = indptr.astype(np.int32)
    flat = np.concatenate(lists) if indptr[-1] else np.zeros(1, dtype=np.int32)
    return indptr, flat

_I32 = (-(1 << 31), (1 << 31) - 1)
_U64 = (0, (1 << 64) - 1)
_I64 = (-(1 << 63), (1 << 63) - 1)


def _ints(x, dtype, bounds, op, name):
    """x as a C-contiguous 1-D array of dtype, or BadArgument naming the bad
    value (numpy would wrap out-of-range values silently)."""
    if _is_c(x, dtype) and x.ndim == 1:
        return x
    a = np.asarray(x)
    if a.ndim != 1:
        raise BadArgument("pagedkv: bad argument: %s: %s must be 1-D, got shape %s" % (op, name, a.shape))
    if a.size == 0:
        return np.zeros(0, dtype=dtype)
    if a.dtype.kind not in "iu":
        if a.dtype == object and all(isinstance(v, int) for v in a.tolist()):
            vals = a.tolist()
            lo, hi = min(vals), max(vals)
        else:
            raise BadArgument("pagedkv: bad argument: %s: %s must hold integers, got dtype %s" % (op, name, a.dtype))
    else:
        lo, hi = int(a.min()), int(a.max())
    for v in (lo, hi):
        if not bounds[0] <= v <= bounds[1]:
            i = a.tolist().index(v)
            raise BadArgument("pagedkv: bad argument: %s: %s[%d] = %d does not fit %s"
                              % (op, name, i, v, np.dtype(dtype).name))
    return np.ascontiguousarray(a, dtype=dtype)


def _scalar(x, bounds, op, name):
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise BadArgument("pagedkv: bad argument: %s: %s = %r is not an integer" % (op, name, x))
    if not bounds[0] <= int(x) <= bounds[1]:
        raise BadArgument("pagedkv: bad argument: %s: %s = %d is out of range" % (op, name, x))
    return int(x)


def _is_c(a, dtype):
    return type(a) is np.ndarray and a.dtype == dtype and a.flags.c_contiguous


def _fill_ns(ns, tenant, lora, salt):
    for name, value in (("tenant", tenant), ("lora", lora), ("salt", salt)):
        b = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        setattr(ns, name, b)
        setattr(ns, name + "_len", len(b))


# Engine-owned step buffers (stepbuffers.py): bind_step_buffers,
# unbind_step_buffers, step_buffers_layout and step_buffers on both kinds.
from . import stepbuffers as _stepbuffers  # noqa: E402

for _cls in (Manager, HybridManager):
    _stepbuffers.install(_cls, _exclusive)
del _cls
StepBuffers = _stepbuffers.StepBuffers
__all__.append("StepBuffers")

# Cache reads and writes (usage.py): cache_usage and cache_usage_totals on
# both kinds.
from . import usage as _usage  # noqa: E402

for _cls in (Manager, HybridManager):
    _usage.install(_cls, _exclusive, _scalar, _U64, _lib)
del _cls
__all__.append("CacheUsage")
