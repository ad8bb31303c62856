"""Cache reads and writes, as a provider bills them (Go: Manager.CacheUsage;
docs/python.md, "Cache usage").

    u = m.cache_usage(request_id)   # after release too, once
    bill(read=u.read_tokens, write=u.write_tokens)
    m.cache_usage_totals()           # every request's, summed

``read_tokens`` is what Anthropic's usage calls cache_read_input_tokens
(split by the medium that served each token: the device prefix cache, the
host tier, a disk store, a remote store such as Redis or a handoff) and
``write_tokens`` its cache_creation_input_tokens: tokens of pages the
request computed and added to the prefix cache.
"""

import ctypes
import dataclasses

FIELDS = ("read_tokens", "device_read_tokens", "host_read_tokens", "disk_read_tokens", "remote_read_tokens",
          "write_tokens", "dropped")

KEPT = 1024
"""How many released requests' usage a Manager keeps until read (PAGEDKV_CACHE_USAGE_KEPT)."""


class _Raw(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in FIELDS]


@dataclasses.dataclass(frozen=True)
class CacheUsage:
    """One request's cache reads and writes in tokens (over Add and every
    Resume), or every request's summed (cache_usage_totals; dropped then
    counts released requests whose usage was forgotten unread)."""

    read_tokens: int
    device_read_tokens: int
    host_read_tokens: int
    disk_read_tokens: int
    remote_read_tokens: int
    write_tokens: int
    dropped: int = 0


def _declare(lib):
    u64, sz = ctypes.c_uint64, ctypes.c_size_t
    p = ctypes.POINTER(_Raw)
    for name, args in (("pagedkv_get_cache_usage", [u64, u64, p, sz]),
                       ("pagedkv_get_cache_usage_totals", [u64, p, sz])):
        try:
            fn = getattr(lib, name)
        except AttributeError as e:  # a library older than this package
            raise ImportError("pagedkv: libpagedkv has no %s: it is older than this package" % name) from e
        fn.restype, fn.argtypes = ctypes.c_int32, args


def _usage(raw):
    return CacheUsage(**{name: int(getattr(raw, name)) for name in FIELDS})


def install(cls, exclusive, scalar, u64_bounds, lib):
    """Adds cache_usage (run under the Manager's call lock by exclusive) and
    cache_usage_totals (lock-free, like stats) to cls."""
    _declare(lib)

    def cache_usage(self, request_id: int) -> CacheUsage:
        """Request request_id's cache reads and writes so far, or, once, a
        released request's (the last KEPT released are kept until read);
        UnknownRequest otherwise."""
        request_id = scalar(request_id, u64_bounds, "cache_usage", "request_id")
        raw = _Raw()
        self._check(self._lib.pagedkv_get_cache_usage(self._handle, request_id, ctypes.byref(raw), ctypes.sizeof(raw)))
        return _usage(raw)

    def cache_usage_totals(self) -> CacheUsage:
        """Every request's cache reads and writes summed, released ones
        included (Go: Stats.CacheUsage); safe from any thread at any time."""
        self._live("cache_usage_totals")
        raw = _Raw()
        self._check(self._lib.pagedkv_get_cache_usage_totals(self._handle, ctypes.byref(raw), ctypes.sizeof(raw)))
        return _usage(raw)

    cls.cache_usage = exclusive(cache_usage)
    cls.cache_usage_totals = cache_usage_totals
