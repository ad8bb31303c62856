"""Cache reads and writes from Python (usage.py): a request's reads by
medium and its writes, kept after release until read once, the pool's
totals, on both kinds; bad input raises naming the value and changes
nothing."""

import dataclasses

import pytest

import pagedkv

FORMAT = pagedkv.PageFormat(dtype="f32", num_kv_heads=1, head_dim=1, num_layers=1)


def prefill(m, rid, prompt):
    m.add(rid, prompt)
    m.reserve([rid], [len(prompt)])
    m.commit([7])


def test_device_and_host_reads_and_writes():
    m = pagedkv.Manager(8, 4, hash_seed=1, tiers=pagedkv.Tiers(8, format=FORMAT))
    prompt = list(range(100, 112))
    prefill(m, 1, prompt)  # computes 12 tokens: 3 full pages written
    u1 = m.cache_usage(1)
    assert isinstance(u1, pagedkv.CacheUsage)
    assert u1 == pagedkv.CacheUsage(read_tokens=0, device_read_tokens=0, host_read_tokens=0, disk_read_tokens=0,
                                    remote_read_tokens=0, write_tokens=12)
    assert m.add(2, prompt) == 8  # two pages from the device cache
    assert m.cache_usage(2).device_read_tokens == 8 and m.cache_usage(2).write_tokens == 0
    m.release(1)
    m.release(2)
    assert m.cache_usage(1) == u1  # kept after release, read once
    with pytest.raises(pagedkv.UnknownRequest, match="request 1"):
        m.cache_usage(1)
    m.evict(8)  # offloads the three pages to the host tier
    c = m.tier_copies()
    m.complete_tier_copies(c.ids)
    assert m.add(3, prompt) == 8  # now from the host tier
    u3 = m.cache_usage(3)
    assert (u3.read_tokens, u3.host_read_tokens, u3.device_read_tokens) == (8, 8, 0)
    m.complete_tier_copies(m.tier_copies().ids)
    tot = m.cache_usage_totals()
    assert (tot.read_tokens, tot.device_read_tokens, tot.host_read_tokens, tot.write_tokens, tot.dropped) == (16, 8, 8, 12, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        tot.read_tokens = 0  # type: ignore[misc]
    m.close()


def test_hybrid_and_bad_input():
    h = pagedkv.HybridManager(16, 4, [pagedkv.LayerGroup("sliding", window_tokens=8), pagedkv.LayerGroup("full")])
    prompt = list(range(200, 213))
    prefill(h, 1, prompt)
    assert h.cache_usage(1).write_tokens == 12
    assert h.add(2, prompt) == 12
    assert h.cache_usage(2).device_read_tokens == 12
    before = h.stats()
    for bad in (-1, 1 << 64, "1", 1.0, True):
        with pytest.raises(pagedkv.BadArgument, match="request_id"):
            h.cache_usage(bad)
    with pytest.raises(pagedkv.UnknownRequest, match="request 9"):
        h.cache_usage(9)
    assert h.stats() == before
    assert h.cache_usage_totals().read_tokens == 12
    h.close()
    with pytest.raises(pagedkv.BadHandle):
        h.cache_usage_totals()
    with pytest.raises(pagedkv.BadHandle):
        h.cache_usage(1)
