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
earlier (a = plan.kv_indptr) is not checked again: its memory may hold the
next step's values or be freed, so take plan.copy() (or np.array(a)) to keep
arrays longer. A view keeps its Manager alive, so garbage collection never
destroys a Manager whose arrays are in use (close() does, explicitly),
and close() raises Busy while another thread's call is in flight. The views are
writable so that torch.from_numpy accepts them without a warning; the
Manager never reads them back, but writing them is pointless.

Errors. Every failure raises a subclass of PagedKVError named after the Go
sentinel error (OutOfPages, UnknownRequest, ...) whose message names the bad
value; a call that raised changed nothing.

Threads. Any thread may call a Manager, one call at a time: a call that
finds another thread's call in flight raises Busy at once and changes
nothing. Each call holds the Manager's lock from its checks to the return
of its results (the C call and the reads of the Manager's shared out
buffers), so a call returns its own results or raises, never another
call's. plan.copy() waits for a call in flight instead of raising, so it
copies one step whole. stats() may be called from any thread at any time.
ctypes releases the GIL during calls.

pagedkv.flashinfer turns a Plan into the keyword arguments of FlashInfer's
wrappers' plan() calls and of append_paged_kv_cache.
"""

import ctypes
import threading

import numpy as np

from . import _ffi

__all__ = [
    "Manager", "Plan", "Level", "Stats", "RequestState", "NO_TOKEN",
    "PagedKVError", "OutOfPages", "UnknownRequest", "RequestExists", "Preempted", "NotPreempted",
    "StepPending", "NoStep", "BadArgument", "BadConfig", "NotCached", "PinLimit", "UnknownPin",
    "BadHandle", "Busy", "AuditError", "InternalError", "StalePlan",
]

NO_TOKEN = -1  # in commit(sampled): no token sampled for this request


# ---- Errors ----


class PagedKVError(Exception):
    """A failed pagedkv call; code is the C error code."""

    code = None


class OutOfPages(PagedKVError):
    """The step needs more pages than are free and evictable: preempt and retry."""
    code = 1


class UnknownRequest(PagedKVError, KeyError):
    code = 2

    def __str__(self):  # KeyError would quote the message
        return Exception.__str__(self)


class RequestExists(PagedKVError):
    code = 3


class Preempted(PagedKVError):
    code = 4


class NotPreempted(PagedKVError):
    code = 5


class StepPending(PagedKVError):
    code = 6


class NoStep(PagedKVError):
    code = 7


class BadArgument(PagedKVError, ValueError):
    code = 8


class BadConfig(PagedKVError, ValueError):
    code = 9


class NotCached(PagedKVError):
    code = 10


class PinLimit(PagedKVError):
    code = 11


class UnknownPin(PagedKVError, KeyError):
    code = 12

    def __str__(self):
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


_ERRORS = {cls.code: cls for cls in (
    OutOfPages, UnknownRequest, RequestExists, Preempted, NotPreempted, StepPending, NoStep,
    BadArgument, BadConfig, NotCached, PinLimit, UnknownPin, BadHandle, Busy, AuditError, InternalError,
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

    def __init__(self, raw):
        for name in _ffi.STATS_FIELDS:
            setattr(self, name, getattr(raw, name))

    @property
    def hit_rate(self):
        return self.prompt_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def recomputed_tokens(self):
        return self.resumed_tokens - self.resume_hit_tokens

    def as_dict(self):
        return {name: getattr(self, name) for name in _ffi.STATS_FIELDS}

    def __eq__(self, other):
        return isinstance(other, Stats) and self.as_dict() == other.as_dict()

    def __repr__(self):
        return "Stats(%s)" % ", ".join("%s=%d" % kv for kv in self.as_dict().items())


class RequestState:
    """One request's state: running (holds pages) or preempted."""

    __slots__ = ("running", "computed", "num_tokens", "start", "num_pages")

    def __init__(self, raw):
        self.running = bool(raw.running)
        self.computed, self.num_tokens = raw.computed, raw.num_tokens
        self.start, self.num_pages = raw.start, raw.num_pages

    def _key(self):
        return (self.running, self.computed, self.num_tokens, self.start, self.num_pages)

    def __eq__(self, other):
        return isinstance(other, RequestState) and self._key() == other._key()

    def __repr__(self):
        return "RequestState(running=%s, computed=%d, num_tokens=%d, start=%d, num_pages=%d)" % self._key()


class Level:
    """One cascade level: FlashInfer's MultiLevelCascadeAttentionWrapper
    plan() takes one of each per level."""

    __slots__ = ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len")

    def __init__(self, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
        self.qo_indptr, self.kv_indptr = qo_indptr, kv_indptr
        self.kv_indices, self.kv_last_page_len = kv_indices, kv_last_page_len


class StalePlan(PagedKVError):
    """A Plan was used after its step passed: a later successful reserve()
    or close() of its Manager reused or freed the buffers its arrays view.
    Python-only (no C code): the C ABI cannot tell a stale pointer."""


# The fields of a Plan, in the order _make_plan stores them.
_PLAN_FIELDS = ("request_ids", "batch_size", "nnz", "window_left", "copies", "drafts", "qo_indptr", "batch_indices",
                "positions", "token_ids", "token_positions", "kv_indptr", "kv_page_indices", "kv_last_page_len",
                "seq_lens", "cascade", "query_rows")


def _plan_field(index, name):
    def get(self):
        if self._manager is not None and self._manager._generation != self._generation:
            raise StalePlan("pagedkv: plan.%s: the plan of step %d was read after %s"
                            % (name, self._generation, self._manager._passed()))
        return self._values[index]
    get.__name__ = name
    return property(get, doc="The step's %s; raises StalePlan once the step has passed." % name)


class Plan:
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
    request_ids: the ids the step was reserved for (an owned copy).
    """

    # _manager is None for an owned copy (current forever); _generation is
    # the Manager's step generation the plan belongs to.
    __slots__ = ("_values", "_manager", "_generation")

    @property
    def valid(self):
        """Whether the plan is current: no later successful reserve(), not closed."""
        return self._manager is None or self._manager._generation == self._generation

    def copy(self):
        """A Plan whose arrays are owned copies, current forever. Raises
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

    def _copy_values(self):
        values = list(self._values)
        for i, v in enumerate(values):
            if isinstance(v, np.ndarray):
                values[i] = v.copy()
        cascade = _PLAN_FIELDS.index("cascade")
        if values[cascade] is not None:
            values[cascade] = [Level(*(a.copy() for a in (lv.qo_indptr, lv.kv_indptr, lv.kv_indices,
                                                         lv.kv_last_page_len))) for lv in values[cascade]]
        p = Plan.__new__(Plan)
        p._values, p._manager, p._generation = tuple(values), None, 0
        return p


for _i, _name in enumerate(_PLAN_FIELDS):
    setattr(Plan, _name, _plan_field(_i, _name))
del _i, _name


_EMPTY = np.zeros(0, dtype=np.int32)


def _addr(a):
    return a.__array_interface__["data"][0]


def _exclusive(method):
    """Runs method holding its Manager's call lock, or raises Busy at once
    when another thread holds it (as the C ABI does). The lock covers the C
    call and every read of the Manager's shared out-buffers afterwards, so
    a call's results cannot mix with another thread's call."""
    op = method.__name__

    def call(self, *args, **kwargs):
        if not self._lock.acquire(False):
            raise Busy("pagedkv: %s: manager %d is in use by another thread" % (op, self._handle))
        try:
            return method(self, *args, **kwargs)
        finally:
            self._lock.release()
    call.__name__, call.__qualname__, call.__doc__ = op, method.__qualname__, method.__doc__
    return call


class Manager:
    """The pagedkv KV-cache manager (Go: pagedkv.Manager) over libpagedkv.

    Keyword arguments are pagedkv.Config's fields: num_pages, page_size,
    window_tokens, priorities, max_pinned_pages, hash_seed,
    cascade_min_saved_pages (0 means the Go default wherever Go has one).
    """

    def __init__(self, num_pages, page_size, *, window_tokens=0, priorities=0, max_pinned_pages=0,
                 hash_seed=0, cascade_min_saved_pages=0):
        lib = _load()
        vals = dict(num_pages=num_pages, page_size=page_size, window_tokens=window_tokens, priorities=priorities,
                    max_pinned_pages=max_pinned_pages, cascade_min_saved_pages=cascade_min_saved_pages)
        for name, v in vals.items():
            _scalar(v, _I64, "Manager", name)
        cfg = _ffi.Config(num_pages, page_size, window_tokens, priorities, max_pinned_pages,
                          _scalar(hash_seed, _U64, "Manager", "hash_seed"), cascade_min_saved_pages)
        h = ctypes.c_uint64(0)
        rc = lib.pagedkv_create(ctypes.byref(cfg), ctypes.sizeof(cfg), ctypes.byref(h))
        if rc:
            _raise(lib, rc)
        self._lib = lib
        self._handle = h.value
        self.num_pages, self.page_size = num_pages, page_size
        self._lock = threading.Lock()  # held by the call in flight (see _exclusive)
        self._generation = 0  # step generation: +1 on every successful reserve and on close
        self._plan_words = np.zeros(_ffi.PLAN_WORDS, dtype=np.int64)
        self._plan_addr = _addr(self._plan_words)
        self._views = [None] * (len(_ffi.PLAN_ARRAYS) + 1)  # per array (drafts last): (data, cap, base view)
        self._i64 = ctypes.c_int64(0)
        self._state = _ffi.RequestState()

    # -- lifetime --

    @_exclusive
    def close(self):
        """Destroy the Manager; every Plan's arrays become invalid."""
        if self._handle:
            rc = self._lib.pagedkv_destroy(self._handle)
            if rc:
                _raise(self._lib, rc)
            self._handle = 0
            self._generation += 1
            self._views = [None] * (len(_ffi.PLAN_ARRAYS) + 1)

    def _passed(self):
        """Why a plan of an earlier step generation is no longer current."""
        if not self._handle:
            return "close() of its Manager"
        return "the successful reserve of step %d (a plan is current until the next one)" % self._generation

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if self._handle:
                self._lib.pagedkv_destroy(self._handle)
        except Exception:
            pass

    def _check(self, rc):
        if rc:
            _raise(self._lib, rc)

    # -- per request --

    @_exclusive
    def add(self, request_id, prompt, *, tenant="", lora="", salt="", priority=0, no_cache=False,
            capacity_tokens=0):
        """Admit a request; returns how many prompt tokens the prefix cache served."""
        request_id = _scalar(request_id, _U64, "add", "request_id")
        p = _ints(prompt, np.int32, _I32, "add", "prompt")
        req = _ffi.Request()
        _fill_ns(req.ns, tenant, lora, salt)
        req.prompt, req.prompt_len = _addr(p) if p.size else None, p.size
        req.priority = _scalar(priority, _I32, "add", "priority")
        req.no_cache = 1 if no_cache else 0
        req.capacity_tokens = _scalar(capacity_tokens, _I64, "add", "capacity_tokens")
        self._check(self._lib.pagedkv_add(self._handle, request_id, ctypes.byref(req), ctypes.byref(self._i64)))
        return self._i64.value

    @_exclusive
    def extend(self, request_id, tokens):
        request_id = _scalar(request_id, _U64, "extend", "request_id")
        t = _ints(tokens, np.int32, _I32, "extend", "tokens")
        self._check(self._lib.pagedkv_extend(self._handle, request_id, _addr(t) if t.size else None, t.size))

    @_exclusive
    def fork(self, parent, child):
        self._check(self._lib.pagedkv_fork(self._handle, _scalar(parent, _U64, "fork", "parent"),
                                           _scalar(child, _U64, "fork", "child")))

    @_exclusive
    def preempt(self, request_id):
        self._check(self._lib.pagedkv_preempt(self._handle, _scalar(request_id, _U64, "preempt", "request_id")))

    @_exclusive
    def resume(self, request_id):
        request_id = _scalar(request_id, _U64, "resume", "request_id")
        self._check(self._lib.pagedkv_resume(self._handle, request_id, ctypes.byref(self._i64)))
        return self._i64.value

    @_exclusive
    def release(self, request_id):
        self._check(self._lib.pagedkv_release(self._handle, _scalar(request_id, _U64, "release", "request_id")))

    # -- per step --

    @_exclusive
    def reserve(self, request_ids, ntokens):
        """Start a step: reserve ntokens[i] tokens of request_ids[i]; returns the Plan.

        request_ids (uint64) and ntokens (int32) may be numpy arrays of those
        dtypes (used without conversion) or sequences of ints.
        """
        ids = _ints(request_ids, np.uint64, _U64, "reserve", "request_ids")
        nt = _ints(ntokens, np.int32, _I32, "reserve", "ntokens")
        if ids.size != nt.size:
            raise BadArgument("pagedkv: bad argument: reserve: %d requests but %d token counts" % (ids.size, nt.size))
        rc = self._lib.pagedkv_reserve(self._handle, _addr(ids) if ids.size else None,
                                       _addr(nt) if nt.size else None, ids.size, self._plan_addr)
        if rc:
            _raise(self._lib, rc)
        self._generation += 1
        return self._make_plan(ids)

    def _make_plan(self, ids):
        """The Plan of the reserve that just succeeded; the caller holds the lock."""
        w = self._plan_words.tolist()
        views = self._views
        arrays = []
        n_arrays = len(_ffi.PLAN_ARRAYS)
        for i in range(n_arrays + 1):
            k = 3 + 3 * i if i < n_arrays else 3 + 3 * n_arrays + 2  # drafts come after num_levels, levels
            data, n, cap = w[k], w[k + 1], w[k + 2]
            if cap == 0:
                arrays.append(_EMPTY)
                continue
            v = views[i]
            if v is None or v[0] != data or v[1] != cap:
                v = views[i] = (data, cap, self._base(data, cap))
            arrays.append(v[2][:n])
        (copies, qo_indptr, batch_indices, positions, token_ids, token_positions, kv_indptr,
         kv_page_indices, kv_last_page_len, seq_lens, query_rows, drafts) = arrays
        k = 3 + 3 * n_arrays
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
        p._values = (ids.copy(), w[0], w[1], w[2], copies.reshape(-1, 3), drafts, qo_indptr, batch_indices,
                     positions, token_ids, token_positions, kv_indptr, kv_page_indices, kv_last_page_len,
                     seq_lens, cascade, query_rows)
        return p

    def _base(self, data, cap):
        """A numpy view of [data, data+cap) that keeps this Manager alive, so
        that garbage collection never destroys a Manager whose arrays are
        still referenced (close() still ends them, as documented)."""
        buf = (ctypes.c_int32 * cap).from_address(data)
        buf._owner = self
        return np.frombuffer(buf, dtype=np.int32)

    def _view(self, arr):
        if arr.cap == 0:
            return _EMPTY
        return self._base(arr.data, arr.cap)[: arr.len]

    @_exclusive
    def reserve_spec(self, request_ids, ntokens, drafts):
        """A speculative step (Go: ReserveSpec): request_ids[i] computes its
        next ntokens[i] known tokens, then the draft tokens drafts[i] (a
        sequence, possibly empty; drafts may be None for none at all). Commit
        it with commit_spec."""
        ids = _ints(request_ids, np.uint64, _U64, "reserve_spec", "request_ids")
        nt = _ints(ntokens, np.int32, _I32, "reserve_spec", "ntokens")
        if ids.size != nt.size:
            raise BadArgument("pagedkv: bad argument: reserve_spec: %d requests but %d token counts"
                              % (ids.size, nt.size))
        indptr = flat = None
        if drafts is not None:
            if len(drafts) != ids.size:
                raise BadArgument("pagedkv: bad argument: reserve_spec: %d requests but %d draft lists"
                                  % (ids.size, len(drafts)))
            lists = [_ints(d, np.int32, _I32, "reserve_spec", "drafts[%d]" % i) for i, d in enumerate(drafts)]
            indptr = np.zeros(ids.size + 1, dtype=np.int64)
            np.cumsum([len(d) for d in lists], out=indptr[1:])
            if indptr[-1] > _I32[1]:
                raise BadArgument("pagedkv: bad argument: reserve_spec: %d draft tokens in all" % indptr[-1])
            indptr = indptr.astype(np.int32)
            flat = np.concatenate(lists) if indptr[-1] else np.zeros(1, dtype=np.int32)
        rc = self._lib.pagedkv_reserve_spec(self._handle, _addr(ids) if ids.size else None,
                                            _addr(nt) if nt.size else None, ids.size,
                                            None if indptr is None else _addr(indptr),
                                            None if flat is None else _addr(flat), self._plan_addr)
        if rc:
            _raise(self._lib, rc)
        self._generation += 1
        return self._make_plan(ids)

    @_exclusive
    def commit_spec(self, accepted, sampled=None):
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
    def truncate(self, request_id, n):
        """Cut the request's tokens to its first n (Go: Truncate)."""
        self._check(self._lib.pagedkv_truncate(self._handle, _scalar(request_id, _U64, "truncate", "request_id"),
                                               _scalar(n, _I64, "truncate", "n")))

    @_exclusive
    def commit(self, sampled=None):
        """Record the reserved step; sampled[b] (or NO_TOKEN) per request, or None."""
        if sampled is None:
            self._check(self._lib.pagedkv_commit(self._handle, None, 0))
            return
        s = _ints(sampled, np.int32, _I32, "commit", "sampled")
        # A non-NULL pointer even for an empty list: it is checked against the batch.
        ptr = _addr(s) if s.size else ctypes.addressof(self._i64)
        self._check(self._lib.pagedkv_commit(self._handle, ptr, s.size))

    @_exclusive
    def abort(self):
        self._check(self._lib.pagedkv_abort(self._handle))

    @property
    @_exclusive
    def pending(self):
        v = ctypes.c_int32(0)
        self._check(self._lib.pagedkv_pending(self._handle, ctypes.byref(v)))
        return bool(v.value)

    # -- operations --

    def stats(self):
        """A consistent Stats snapshot; safe from any thread at any time."""
        raw = _ffi.Stats()
        self._check(self._lib.pagedkv_get_stats(self._handle, ctypes.byref(raw), ctypes.sizeof(raw)))
        return Stats(raw)

    @_exclusive
    def audit(self):
        """Check every invariant; raises AuditError naming the first violation."""
        self._check(self._lib.pagedkv_audit(self._handle))

    @_exclusive
    def evict(self, npages):
        freed = ctypes.c_int64(0)
        npages = _scalar(npages, _I64, "evict", "npages")
        self._check(self._lib.pagedkv_evict(self._handle, npages, ctypes.byref(freed)))
        return freed.value

    @_exclusive
    def pin(self, tokens, *, tenant="", lora="", salt=""):
        """Pin the cached prefix of tokens; returns (pin_id, pinned_tokens)."""
        t = _ints(tokens, np.int32, _I32, "pin", "tokens")
        ns = _ffi.Namespace()
        _fill_ns(ns, tenant, lora, salt)
        pin, n = ctypes.c_uint64(0), ctypes.c_int64(0)
        self._check(self._lib.pagedkv_pin(self._handle, ctypes.byref(ns), _addr(t) if t.size else None, t.size,
                                          ctypes.byref(pin), ctypes.byref(n)))
        return pin.value, n.value

    @_exclusive
    def unpin(self, pin_id):
        self._check(self._lib.pagedkv_unpin(self._handle, _scalar(pin_id, _U64, "unpin", "pin_id")))

    # -- inspection (copies) --

    @_exclusive
    def request_state(self, request_id):
        request_id = _scalar(request_id, _U64, "request_state", "request_id")
        self._check(self._lib.pagedkv_get_request_state(self._handle, request_id, ctypes.byref(self._state)))
        return RequestState(self._state)

    def has(self, request_id):
        try:
            self.request_state(request_id)
        except UnknownRequest:
            return False
        return True

    @_exclusive
    def tokens(self, request_id):
        """Every known token of the request (a copy)."""
        return self._copy_out(self._lib.pagedkv_request_tokens, request_id)

    @_exclusive
    def pages(self, request_id):
        """The pages the request holds, in token order (a copy; empty if preempted)."""
        return self._copy_out(self._lib.pagedkv_request_pages, request_id)

    def _copy_out(self, fn, request_id):
        n = ctypes.c_int64(0)
        request_id = _scalar(request_id, _U64, "tokens/pages", "request_id")
        self._check(fn(self._handle, request_id, None, 0, ctypes.byref(n)))
        out = np.empty(n.value, dtype=np.int32)
        if n.value:
            self._check(fn(self._handle, request_id, _addr(out), n.value, ctypes.byref(n)))
        return out[: n.value]


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
