"""Retention hints, TTL pins and the pin budget through the C ABI (Go:
Manager.SetRetention, Manager.PinFor, Config.PinBudget)."""

import pytest

import pagedkv


def serve(m, rid, prompt, priority=0, ranges=None):
    """Add, compute and release prompt; returns the tokens the cache served."""
    matched = m.add(rid, prompt, priority=priority)
    if ranges is not None:
        m.set_retention(rid, ranges)
    m.reserve([rid], [len(prompt) - matched])
    m.commit([1])
    m.release(rid)
    return matched


def test_retention_orders_eviction_until_it_lapses():
    m = pagedkv.Manager(8, 4, priorities=3, hash_seed=1)
    m.set_clock(0)
    a, b = list(range(100, 109)), list(range(200, 209))
    serve(m, 1, a, ranges=[pagedkv.RetentionRange(priority=2, duration=10, session="continues")])
    serve(m, 2, b, priority=1)
    m.evict(m.stats().free_pages + 2)
    assert serve(m, 3, a) == 8  # level 2 outlives level 1; this use restarts the duration
    serve(m, 4, b, priority=1)
    m.set_clock(10)
    m.evict(m.stats().free_pages + 2)  # the retention lapsed at 10 s: level 0 goes first
    assert serve(m, 5, b, priority=1) == 8
    assert serve(m, 6, a) == 0
    m.audit()


def test_ephemeral_tokens_are_not_published():
    m = pagedkv.Manager(8, 4, hash_seed=1)
    m.add(1, list(range(13)))
    m.set_retention(1, [pagedkv.RetentionRange(5, 6, ephemeral=True)])
    m.reserve([1], [13])
    m.commit([7])
    assert m.stats().cached_pages == 1
    m.set_retention(1, [])
    m.reserve([1], [1])
    m.commit([7])
    assert m.stats().cached_pages == 3


def test_ttl_pin_lapses_and_keeps_the_budget():
    m = pagedkv.Manager(8, 4, hash_seed=1, pin_budget=0.25)
    m.set_clock(0)
    a, b = list(range(100, 109)), list(range(200, 209))
    serve(m, 1, a)
    serve(m, 2, b)
    pin, n = m.pin_for(a, 5.0)
    assert n == 8
    with pytest.raises(pagedkv.PinLimit, match=r"over the pin budget of 2 pages \(0.25 of 8\)"):
        m.pin(b[:4])
    m.set_clock(4.9)
    assert serve(m, 3, a) == 8  # refreshes: lapses at 9.9 s
    m.set_clock(9.8)
    m.evict(8)
    assert m.stats().pinned_pages == 2
    m.set_clock(9.9)
    m.evict(8)
    assert m.stats().pinned_pages == 0 and m.stats().cached_pages == 0
    with pytest.raises(pagedkv.UnknownPin):
        m.unpin(pin)


def test_bad_retention_is_refused_by_name():
    m = pagedkv.Manager(8, 4, priorities=2, hash_seed=1)
    m.add(1, [1, 2, 3, 4, 5])
    with pytest.raises(pagedkv.BadArgument, match="priority 2, want 0..1"):
        m.set_retention(1, [pagedkv.RetentionRange(priority=2)])
    with pytest.raises(pagedkv.BadArgument, match=r"ranges\[0\].session = 'later'"):
        m.set_retention(1, [pagedkv.RetentionRange(session="later")])
    with pytest.raises(pagedkv.BadArgument, match=r"ranges\[1\].duration = -1"):
        m.set_retention(1, [pagedkv.RetentionRange(), pagedkv.RetentionRange(duration=-1)])
    with pytest.raises(pagedkv.BadArgument, match="want a list of RetentionRange"):
        m.set_retention(1, pagedkv.RetentionRange())
    with pytest.raises(pagedkv.UnknownRequest):
        m.set_retention(9, [])
    with pytest.raises(pagedkv.BadArgument, match="ttl = -1"):
        m.pin_for([1, 2, 3, 4], -1)
    with pytest.raises(pagedkv.BadArgument, match="now = 'x'"):
        m.set_clock("x")
    with pytest.raises(pagedkv.BadConfig, match="PinBudget = 2"):
        pagedkv.Manager(8, 4, pin_budget=2)
    with pytest.raises(pagedkv.BadArgument, match="pin_budget = 'x'"):
        pagedkv.Manager(8, 4, pin_budget="x")
