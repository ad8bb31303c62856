"""Engine-owned step buffers (Go: Manager.BindStepBuffers; docs/python.md,
"Step buffers").

An engine binds memory it owns (a numpy array, pinned host memory from
torch via ``tensor.numpy()``, any writable buffer) with fixed capacities;
from the next reserve() on, every step's plan arrays are written there,
packed at the offsets of a layout, so one host-to-device copy of
``StepBuffers.size`` bytes (or one copy captured in a CUDA graph) moves the
whole step, and the Plan's arrays are views of that memory.

    sb = m.bind_step_buffers(max_requests=256, max_tokens=8192, max_pages=65536)
    plan = m.reserve(ids, ntokens)        # written into sb.buffer
    dev.copy_(torch.from_numpy(sb.buffer), non_blocking=True)   # the whole step
    kv_indptr = sb.view("kv_indptr")[: plan.batch_size + 1]     # same bytes as plan.kv_indptr

A step over a capacity raises BadArgument naming the capacity and the need,
before anything changes. Plan arrays (bound or not) are numpy arrays and so
export ``__dlpack__`` / ``__dlpack_device__`` (numpy.from_dlpack,
torch.from_dlpack).
"""

import collections
import ctypes
from typing import Any, Dict, Optional, Tuple

import numpy as np

# The arrays of a layout's rows, in the order of cabi/pagedkv.h's
# PAGEDKV_STEP_* values (Go: stepbuf.Array).
ARRAYS = ("header", "copies", "group_header", "qo_indptr", "batch_indices", "positions", "token_ids",
          "token_positions", "drafts", "kv_indptr", "kv_page_indices", "kv_last_page_len", "seq_lens",
          "attn_qo_indptr", "attn_kv_indptr", "attn_kv_page_indices", "attn_kv_last_page_len", "attn_requests",
          "query_rows", "cascade_window_left", "level_batch_size", "level_qo_indptr", "level_kv_indptr",
          "level_kv_indices", "level_kv_last_page_len", "block_tables")

# The fields of the pool's header row and of each group's.
HEADER = ("batch_size", "nnz", "num_copies", "num_groups", "step")
GROUP_HEADER = ("num_pages", "window_left", "num_levels", "num_attn", "attn_pages")

ALIGN = 16  # bytes: the base address and every row offset (PAGEDKV_STEP_ALIGN)

StepRow = collections.namedtuple("StepRow", "array group level offset cap")
StepRow.__doc__ = """One row of a layout: the int32 array `array` (a name of ARRAYS) of
group `group` (-1: the pool's header and copies) and, for a level_ row, of
cascade level `level` (else -1), at byte `offset`, room for `cap` values."""


class Capacities(ctypes.Structure):
    _fields_ = [("max_requests", ctypes.c_int64), ("max_tokens", ctypes.c_int64),
                ("max_pages", ctypes.c_int64), ("max_cascade_levels", ctypes.c_int64)]


class _Row(ctypes.Structure):
    _fields_ = [("array", ctypes.c_int32), ("group", ctypes.c_int32), ("level", ctypes.c_int32),
                ("reserved", ctypes.c_int32), ("offset", ctypes.c_int64), ("cap", ctypes.c_int64)]


def _declare(lib):
    """Declares the step buffer calls on lib (once)."""
    if getattr(lib, "_step_buffers_declared", False):
        return
    i32, i64, u64, vp, sz = ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t
    for name, args in (("pagedkv_step_layout", [u64, ctypes.POINTER(Capacities), sz, vp, i64,
                                                ctypes.POINTER(i64), ctypes.POINTER(i64)]),
                       ("pagedkv_bind_step_buffers", [u64, vp, i64, ctypes.POINTER(Capacities), sz]),
                       ("pagedkv_unbind_step_buffers", [u64])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = i32, args
    lib._step_buffers_declared = True


def _bad(msg):
    from . import BadArgument
    return BadArgument("pagedkv: bad argument: " + msg)


def _caps(op, max_requests, max_tokens, max_pages, max_cascade_levels):
    vals = []
    for name, v in (("max_requests", max_requests), ("max_tokens", max_tokens), ("max_pages", max_pages),
                    ("max_cascade_levels", max_cascade_levels)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise _bad("%s: %s = %r is not an integer" % (op, name, v))
        if not -(1 << 63) <= int(v) < (1 << 63):
            raise _bad("%s: %s = %d is out of int64 range" % (op, name, v))
        vals.append(int(v))
    return Capacities(*vals)


def _layout(m, op, caps):
    """The rows and size of the layout of caps for m (binds nothing)."""
    lib = m._lib
    _declare(lib)
    n, size = ctypes.c_int64(0), ctypes.c_int64(0)
    m._check(lib.pagedkv_step_layout(m._handle, ctypes.byref(caps), ctypes.sizeof(caps), None, 0,
                                     ctypes.byref(n), ctypes.byref(size)))
    rows = (_Row * n.value)()
    m._check(lib.pagedkv_step_layout(m._handle, ctypes.byref(caps), ctypes.sizeof(caps), rows, n.value,
                                     ctypes.byref(n), ctypes.byref(size)))
    return tuple(StepRow(ARRAYS[r.array], r.group, r.level, r.offset, r.cap) for r in rows), size.value


# Element types a step buffer may have: raw bytes or little-endian int32.
_TYPESTRS = {"|u1", "|i1", "|b1", "<i4", "<u4"}
_FORMATS = {"B", "b", "c", "i", "I", "<i", "<I", "=i", "=I"}


def _address(op, buf, need):
    """(address, nbytes, keep) of buf's writable, C-contiguous memory;
    keep is what must stay referenced while the memory is bound. Raises
    BadArgument naming what is wrong."""
    ai = getattr(buf, "__array_interface__", None)
    if isinstance(ai, dict):
        addr, readonly = ai["data"]
        typestr, shape = ai["typestr"], tuple(ai["shape"])
        if readonly:
            raise _bad("%s: the buffer is read-only" % op)
        if typestr not in _TYPESTRS:
            raise _bad("%s: the buffer's dtype is %s, want bytes (uint8) or little-endian int32 (<i4)" % (op, typestr))
        itemsize = int(typestr[2:])
        strides = ai.get("strides")
        if strides is not None:
            want, s = [], itemsize
            for d in reversed(shape):
                want.append(s)
                s *= d
            if tuple(reversed(want)) != tuple(strides) and int(np.prod(shape)) > 1:
                raise _bad("%s: the buffer is not C-contiguous (strides %s, shape %s)" % (op, strides, shape))
        nbytes, keep = int(np.prod(shape, dtype=np.int64)) * itemsize, buf
    else:
        try:
            mv = memoryview(buf)
        except TypeError:
            raise _bad("%s: %s has neither the array interface nor the buffer protocol" % (op, type(buf).__name__)) \
                from None
        if mv.readonly:
            raise _bad("%s: the buffer is read-only" % op)
        if mv.format not in _FORMATS or mv.itemsize not in (1, 4):
            raise _bad("%s: the buffer's format is %r, want bytes or int32" % (op, mv.format))
        if not mv.c_contiguous:
            raise _bad("%s: the buffer is not C-contiguous" % op)
        nbytes = mv.nbytes
        keep = (ctypes.c_char * nbytes).from_buffer(mv) if nbytes else mv  # holds the export: no resize
        addr = ctypes.addressof(keep) if nbytes else 0
    if nbytes < need:
        raise _bad("%s: the buffer has %d bytes, the layout needs %d" % (op, nbytes, need))
    if addr % ALIGN:
        raise _bad("%s: the buffer's address %#x is not a multiple of %d" % (op, addr, ALIGN))
    return addr, nbytes, keep


def aligned_buffer(nbytes: int) -> np.ndarray:
    """A zeroed numpy uint8 array of nbytes whose address is a multiple of ALIGN."""
    raw = np.zeros(nbytes + ALIGN, dtype=np.uint8)
    off = -raw.ctypes.data % ALIGN
    return raw[off:off + nbytes]


class StepBuffers:
    """Step buffers bound to a Manager (see the module doc). rows: the
    layout (StepRow each); size: the bytes one step copy moves (from the
    buffer's start); buffer: a uint8 numpy view of those bytes; capacities:
    the bound capacities. view() gives any row as an int32 numpy view of its
    whole capacity; header() and group_header() decode the counts."""

    __slots__ = ("manager", "rows", "size", "buffer", "capacities", "_address", "_keep", "_index")

    def __init__(self, manager: Any, rows: Tuple["StepRow", ...], size: int, address: int, keep: Any,
                 capacities: Capacities) -> None:
        self.manager, self.rows, self.size, self.capacities = manager, rows, size, capacities
        self._address, self._keep = address, keep
        self._index = {(r.array, r.group, r.level): r for r in rows}
        mem = (ctypes.c_uint8 * size).from_address(address)
        mem._owner = keep
        self.buffer = np.frombuffer(mem, dtype=np.uint8)

    def view(self, array: str, group: int = 0, level: int = -1) -> np.ndarray:
        """Row `array` of `group` (ignored for the pool's header and copies)
        and, for a level_ array, cascade `level`: an int32 numpy view of its
        whole capacity. KeyError names a row the layout lacks."""
        if array in ("header", "copies"):
            group = -1
        r = self._index.get((array, group, level))
        if r is None:
            raise KeyError("pagedkv: step buffers have no row %s of group %d level %d" % (array, group, level))
        return self.buffer[r.offset:r.offset + 4 * r.cap].view(np.int32)

    def header(self) -> Dict[str, int]:
        """The pool header: batch_size, nnz, num_copies, num_groups, step (a dict)."""
        return dict(zip(HEADER, self.view("header").tolist()))

    def group_header(self, group: int = 0) -> Dict[str, int]:
        """Group `group`'s header: num_pages, window_left, num_levels,
        num_attn, attn_pages (a dict)."""
        return dict(zip(GROUP_HEADER, self.view("group_header", group).tolist()))

    def __repr__(self) -> str:
        c = self.capacities
        return ("StepBuffers(size=%d, rows=%d, max_requests=%d, max_tokens=%d, max_pages=%d, max_cascade_levels=%d)"
                % (self.size, len(self.rows), c.max_requests, c.max_tokens, c.max_pages, c.max_cascade_levels))


def step_buffers_layout(self: Any, *, max_requests: int, max_tokens: int, max_pages: int,
                        max_cascade_levels: int = 0) -> Tuple[Tuple["StepRow", ...], int]:
    """The layout bind_step_buffers would use, without binding: (rows,
    size) with rows a tuple of StepRow and size the bytes the buffer needs."""
    return _layout(self, "step_buffers_layout",
                   _caps("step_buffers_layout", max_requests, max_tokens, max_pages, max_cascade_levels))


def bind_step_buffers(self: Any, buffer: Any = None, *, max_requests: int, max_tokens: int, max_pages: int,
                      max_cascade_levels: int = 0) -> "StepBuffers":
    """Bind engine-owned step buffers (Go: BindStepBuffers) and return a
    StepBuffers. buffer is any writable, C-contiguous buffer of bytes or
    int32 (array interface or buffer protocol: a numpy array, a bytearray,
    pinned torch memory through tensor.numpy()) of at least the layout's
    size from an address that is a multiple of 16; None allocates one
    (aligned_buffer). From the next reserve() on, every plan array is
    written there and the Plan's arrays are views of it. The Manager keeps
    a reference to every buffer it was ever bound to (earlier plans may
    still view one) until it and its views are gone. A bind that fails
    changes nothing."""
    op = "bind_step_buffers"
    caps = _caps(op, max_requests, max_tokens, max_pages, max_cascade_levels)
    rows, size = _layout(self, op, caps)
    if buffer is None:
        buffer = aligned_buffer(size)
    addr, nbytes, keep = _address(op, buffer, size)
    self._check(self._lib.pagedkv_bind_step_buffers(self._handle, addr, nbytes, ctypes.byref(caps),
                                                    ctypes.sizeof(caps)))
    sb = StepBuffers(self, rows, size, addr, keep, caps)
    kept = self.__dict__.setdefault("_step_buffers_kept", [])
    kept.append(keep)
    self._step_buffers = sb
    return sb


def unbind_step_buffers(self: Any) -> None:
    """Later plans use the Manager's own buffers again (Go:
    UnbindStepBuffers); the current plan keeps viewing the bound memory."""
    _declare(self._lib)
    self._check(self._lib.pagedkv_unbind_step_buffers(self._handle))
    self._step_buffers = None


def step_buffers(self: Any) -> Optional["StepBuffers"]:
    """The bound StepBuffers, or None."""
    return self.__dict__.get("_step_buffers")


def install(cls, exclusive):
    """Adds the step buffer methods to cls, each run under the Manager's
    call lock by the decorator exclusive."""
    for fn in (bind_step_buffers, unbind_step_buffers, step_buffers_layout):
        setattr(cls, fn.__name__, exclusive(fn))
    cls.step_buffers = property(step_buffers, doc=step_buffers.__doc__)
