"""The memory a configuration asks for (issue 35): a HybridManager (or
Manager) whose bookkeeping exceeds memory_limit, by default this machine's
physical memory, raises BadConfig naming the groups, the pages, the bytes
needed and the limit, before anything is allocated, instead of the Go
runtime dying out of memory and taking the Python process with it."""

import re

import pytest

import pagedkv


def test_huge_hybrid_config_is_refused():
    groups = [pagedkv.LayerGroup("full")] * 65536
    with pytest.raises(pagedkv.BadConfig) as e:
        pagedkv.HybridManager(4096, 16, groups, memory_limit=1 << 30)
    msg = str(e.value)
    assert "a HybridManager of 65536 groups, NumPages = 4096, PageSize = 16" in msg, msg
    assert re.search(r"needs \d+ bytes, more than MemoryLimit \(1073741824 bytes\)", msg), msg
    need = int(re.search(r"needs (\d+) bytes", msg).group(1))
    assert need > 38 << 30, msg


@pytest.mark.parametrize("kind", ["Manager", "HybridManager"])
def test_memory_limit_is_exact(kind):
    """One byte short of what the configuration asks for is refused, exactly
    that is accepted: the limit the caller raises or lowers is the one the
    library checks."""
    def make(limit):
        if kind == "Manager":
            return pagedkv.Manager(4096, 16, memory_limit=limit)
        return pagedkv.HybridManager(4096, 16, [pagedkv.LayerGroup("full")] * 4, memory_limit=limit)

    with pytest.raises(pagedkv.BadConfig, match=r"more than MemoryLimit \(1 bytes\)") as e:
        make(1)
    need = int(re.search(r"needs (\d+) bytes", str(e.value)).group(1))
    with pytest.raises(pagedkv.BadConfig, match=r"needs %d bytes, more than MemoryLimit \(%d bytes\)" % (need, need - 1)):
        make(need - 1)
    make(need).close()
    make(0).close()  # the default: physical memory
    with pytest.raises(pagedkv.BadConfig, match="MemoryLimit = -1"):
        make(-1)
    with pytest.raises(pagedkv.BadArgument, match="memory_limit"):
        make(1 << 63)
