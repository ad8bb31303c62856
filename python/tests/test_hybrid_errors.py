"""HybridManager's bad input: every error is the Python exception of its
class, its message names the bad value, and the manager is left exactly as
it was (stats, every request's state, tokens and pages in every group, and
the outstanding plan's arrays in every group)."""

import ctypes
import threading

import numpy as np
import pytest

import pagedkv
from conftest import plan_values

IDS = range(1, 12)
GROUPS = [pagedkv.LayerGroup("sliding", window_tokens=8), pagedkv.LayerGroup("chunked", chunk_tokens=8),
          pagedkv.LayerGroup("full")]


def snapshot(m, plan):
    reqs = {}
    for rid in IDS:
        if m.has(rid):
            reqs[rid] = (m.tokens(rid).tolist(),
                         [(m.request_state(rid, g)._key(), m.pages(rid, g).tolist()) for g in range(m.num_groups)])
    s = dict(stats=m.stats().as_dict(), groups=[g.as_dict() for g in m.group_stats()], requests=reqs)
    if plan is not None:
        s["copies"] = plan.copies.tolist()
        s["groups"] = [(plan_values(p), [None if getattr(p, k) is None else getattr(p, k).tolist()
                                         for k in ("cascade_window_left", "attn_qo_indptr", "attn_kv_indptr",
                                                   "attn_kv_page_indices", "attn_kv_last_page_len",
                                                   "attn_requests")])
                       for p in plan.groups]
    return s


@pytest.fixture
def world():
    """24 pages of 4 tokens in three groups: request 1 computed 20 tokens
    and sampled one, 2 reuses its prompt, 3 is preempted, and a plan is
    outstanding."""
    m = pagedkv.HybridManager(24, 4, GROUPS, hash_seed=1)
    prompt = list(range(1, 21))
    m.add(1, prompt)
    m.reserve([1], [20])
    m.commit([7])
    m.add(2, prompt)
    m.add(3, prompt[:6])
    m.preempt(3)
    plan = m.reserve([1, 2], [1, 3])
    m.commit([8, pagedkv.NO_TOKEN])
    plan = m.reserve([1], [1])
    m.abort()
    yield m, prompt, plan
    m.close()


def expect(m, plan, exc, needle, fn, *args, **kw):
    before = snapshot(m, plan)
    with pytest.raises(exc) as info:
        fn(*args, **kw)
    assert needle in str(info.value), "%s does not name %r" % (info.value, needle)
    assert type(info.value) is exc
    assert snapshot(m, plan) == before, "%s changed the manager" % fn.__name__


def test_world_is_hybrid(world):
    m, prompt, plan = world
    assert m.kinds == ("sliding", "chunked", "full")
    # The sliding and chunked groups released pages the full group keeps.
    assert m.request_state(1, 0).start > 0 and m.request_state(1, 1).start > 0
    assert m.request_state(1, 2).start == 0
    assert plan.groups[1].attn_qo_indptr is not None and plan.groups[0].attn_qo_indptr is None
    assert [p.window_left for p in plan.groups] == [7, -1, -1]
    gs = m.group_stats()
    assert [g.kind for g in gs] == ["sliding", "chunked", "full"]
    assert gs[0].window_released_pages > 0 and gs[1].window_released_pages > 0 and gs[2].window_released_pages == 0
    assert sum(g.cached_pages for g in gs) == m.stats().cached_pages


def test_request_errors(world):
    m, prompt, plan = world
    expect(m, plan, pagedkv.RequestExists, "request 1", m.add, 1, prompt)
    expect(m, plan, pagedkv.BadArgument, "prompt[1] = -9", m.add, 9, [5, -9])
    expect(m, plan, pagedkv.BadArgument, "request_id = -1", m.add, -1, prompt)
    expect(m, plan, pagedkv.UnknownRequest, "request 9", m.extend, 9, [1])
    expect(m, plan, pagedkv.UnknownRequest, "request 9", m.fork, 9, 10)
    expect(m, plan, pagedkv.RequestExists, "to 2", m.fork, 1, 2)
    expect(m, plan, pagedkv.Preempted, "request 3", m.preempt, 3)
    expect(m, plan, pagedkv.NotPreempted, "request 1", m.resume, 1)
    expect(m, plan, pagedkv.UnknownRequest, "request 9", m.release, 9)
    expect(m, plan, pagedkv.UnknownRequest, "request 9", m.request_state, 9, 1)
    expect(m, plan, pagedkv.UnknownRequest, "request 9", m.pages, 9, 1)
    expect(m, plan, pagedkv.BadArgument, "group = 3, want 0..2", m.request_state, 1, 3)
    expect(m, plan, pagedkv.BadArgument, "group = -1, want 0..2", m.pages, 1, -1)
    expect(m, plan, pagedkv.BadArgument, "group = 'x'", m.pages, 1, "x")


def test_step_errors(world):
    m, prompt, plan = world
    expect(m, plan, pagedkv.NoStep, "commit", m.commit, [1])
    expect(m, plan, pagedkv.BadArgument, "ids[1] = 2 appears twice", m.reserve, [2, 2], [1, 1])
    expect(m, plan, pagedkv.UnknownRequest, "ids[1] = 9", m.reserve, [2, 9], [1, 1])
    expect(m, plan, pagedkv.Preempted, "ids[0] = 3", m.reserve, [3], [1])
    expect(m, plan, pagedkv.BadArgument, "ntokens[0] = 99", m.reserve, [2], [99])
    expect(m, plan, pagedkv.BadArgument, "2 requests but 1 token counts", m.reserve, [1, 2], [1])
    expect(m, plan, pagedkv.BadArgument, "1 requests but 2 draft lists", m.reserve_spec, [1], [1], [[1], [2]])
    expect(m, plan, pagedkv.BadArgument, "drafts[0][1] = -4", m.reserve_spec, [1], [1], [[1, -4]])
    m.extend(2, list(range(100, 300)))
    expect(m, plan, pagedkv.OutOfPages, "needs", m.reserve, [2], [200])
    p = m.reserve([2], [2])
    expect(m, p, pagedkv.StepPending, "reserve", m.reserve, [2], [1])
    expect(m, p, pagedkv.StepPending, "add request 9", m.add, 9, prompt)
    expect(m, p, pagedkv.BadArgument, "3 sampled tokens", m.commit, [1, 2, 3])
    expect(m, p, pagedkv.BadArgument, "sampled[0] = -5", m.commit, [-5])
    m.commit(None)
    m.audit()


def test_bad_config():
    cases = [
        ([], pagedkv.BadArgument, "num_groups = 0"),
        ([pagedkv.LayerGroup("window")], pagedkv.BadArgument, "groups[0].kind = 'window'"),
        ([dict(kind="full", windw=3)], pagedkv.BadArgument, "groups[0] = {'kind': 'full', 'windw': 3}"),
        ("full", pagedkv.BadArgument, "groups = 'full'"),
        ([pagedkv.LayerGroup("sliding")], pagedkv.BadConfig, "WindowTokens = 0"),
        ([pagedkv.LayerGroup("chunked", chunk_tokens=6)], pagedkv.BadConfig, "ChunkTokens = 6"),
        ([pagedkv.LayerGroup("full"), pagedkv.LayerGroup("full", num_layers=2)], pagedkv.BadConfig, "groups[1] has 2 layers"),
        ([pagedkv.LayerGroup("full", window_tokens=4)], pagedkv.BadConfig, "WindowTokens = 4"),
        ([pagedkv.LayerGroup("full", num_layers=1 << 64)], pagedkv.BadArgument, "groups[0].num_layers"),
    ]
    for groups, exc, needle in cases:
        with pytest.raises(exc) as info:
            pagedkv.HybridManager(16, 4, groups)
        assert needle in str(info.value), (groups, str(info.value))
    with pytest.raises(pagedkv.BadConfig, match="NumPages = 0"):
        pagedkv.HybridManager(0, 4, GROUPS)


def test_bad_state_indexer_shared_kv_groups():
    """Every bad value of the new kinds is refused, named: by the binding
    (types, dtype names, shape lengths) or by Go (ranges, targets)."""
    def st(**kw):
        g = dict(conv_shape=(8, 3), conv_dtype="bfloat16", ssm_shape=(2, 4, 8), ssm_dtype="float32", page_bytes=4096)
        g.update(kw)
        return pagedkv.LayerGroup("state", **g)
    full = pagedkv.LayerGroup("full")
    cases = [
        ([st(conv_dtype="fp8"), full], {}, pagedkv.BadArgument, "groups[0].conv_dtype = 'fp8'"),
        ([st(ssm_dtype=1), full], {}, pagedkv.BadArgument, "groups[0].ssm_dtype = 1"),
        ([st(conv_shape=(8,)), full], {}, pagedkv.BadArgument, "groups[0].conv_shape = (8,), want 2 integers"),
        ([st(ssm_shape=(2, 4, "8")), full], {}, pagedkv.BadArgument, "groups[0].ssm_shape[2] = '8' is not an integer"),
        ([st(page_bytes=1 << 70), full], {}, pagedkv.BadArgument, "groups[0].page_bytes"),
        ([st(ssm_shape=(2, 0, 8)), full], {}, pagedkv.BadConfig, "SSMShape[1] = 0"),
        ([st(page_bytes=100), full], {}, pagedkv.BadConfig, "exceeds PageBytes = 100"),
        ([st(conv_dtype=""), full], {}, pagedkv.BadConfig, "ConvDType"),
        ([st()], {}, pagedkv.BadConfig, "all of kind state"),
        ([st(), full], {"state_checkpoint_every": 6}, pagedkv.BadConfig, "StateCheckpointEvery = 6"),
        ([full], {"state_checkpoint_every": 4}, pagedkv.BadConfig, "StateCheckpointEvery = 4 without state groups"),
        ([st(), full], {"state_checkpoint_every": -4}, pagedkv.BadArgument, "state_checkpoint_every = -4"),
        ([full, pagedkv.LayerGroup("indexer", target=0, indexer_head_dim=128, indexer_quant_block=128)], {},
         pagedkv.BadConfig, "an MLA group"),
        ([pagedkv.LayerGroup("mla"), pagedkv.LayerGroup("indexer", target=0, indexer_head_dim=128, indexer_quant_block=48)],
         {}, pagedkv.BadConfig, "IndexerQuantBlock = 48"),
        ([full, pagedkv.LayerGroup("shared_kv", target=5)], {}, pagedkv.BadConfig, "Target = 5"),
        ([pagedkv.LayerGroup("shared_kv", target=1), full], {}, pagedkv.BadConfig, "list every group that owns pages"),
        ([full, pagedkv.LayerGroup("full", conv_shape=(1, 1))], {}, pagedkv.BadConfig, "State shape"),
    ]
    for groups, kw, exc, needle in cases:
        with pytest.raises(exc) as info:
            pagedkv.HybridManager(16, 4, groups, **kw)
        assert needle in str(info.value), (groups, kw, str(info.value))
    with pytest.raises(pagedkv.BadArgument, match="state_checkpoint_every = 8"):
        _dense_with_every(8)
    h = pagedkv.HybridManager(16, 4, [st(), full])
    assert h.next_state_checkpoint(99) == 0  # unknown request: 0, as in Go
    with pytest.raises(pagedkv.BadArgument, match="request_id = -1"):
        h.next_state_checkpoint(-1)
    h.close()


def _dense_with_every(every):
    """pagedkv_create with state_checkpoint_every set: refused, named."""
    cfg = pagedkv._ffi.Config(16, 4)
    cfg.state_checkpoint_every = every
    lib = pagedkv._load()
    h = ctypes.c_uint64(0)
    rc = lib.pagedkv_create(ctypes.byref(cfg), ctypes.sizeof(cfg), ctypes.byref(h))
    pagedkv._raise(lib, rc)


def test_kind_of_handle_is_checked():
    """The C calls of one kind of manager on the other kind's handle fail
    with BAD_HANDLE naming the kind, and change nothing."""
    lib = pagedkv._load()
    h = pagedkv.HybridManager(16, 4, GROUPS, hash_seed=1)
    d = pagedkv.Manager(16, 4)
    try:
        h.add(1, [1, 2, 3])
        plan_words = (ctypes.c_int64 * 64)()
        ids, nt = (ctypes.c_uint64 * 1)(1), (ctypes.c_int32 * 1)(3)
        rc = lib.pagedkv_reserve(h._handle, ctypes.addressof(ids), ctypes.addressof(nt), 1, ctypes.addressof(plan_words))
        assert rc == pagedkv.BadHandle.code
        msg = lib.pagedkv_last_error().decode()
        assert "manager %d is a hybrid manager" % h._handle in msg and "pagedkv_create" in msg, msg
        rc = lib.pagedkv_hybrid_reserve(d._handle, ctypes.addressof(ids), ctypes.addressof(nt), 1,
                                        ctypes.addressof(plan_words), ctypes.addressof(plan_words), 1)
        assert rc == pagedkv.BadHandle.code
        assert "is a dense manager" in lib.pagedkv_last_error().decode()
        # num_groups must be the manager's.
        rc = lib.pagedkv_hybrid_reserve(h._handle, ctypes.addressof(ids), ctypes.addressof(nt), 1,
                                        ctypes.addressof(plan_words), ctypes.addressof(plan_words), 2)
        assert rc == pagedkv.BadArgument.code
        assert "num_groups = 2; the manager has 3 groups" in lib.pagedkv_last_error().decode()
        rc = lib.pagedkv_hybrid_reserve(h._handle, ctypes.addressof(ids), ctypes.addressof(nt), 1, None,
                                        ctypes.addressof(plan_words), 3)
        assert rc == pagedkv.BadArgument.code
        assert "copies is NULL" in lib.pagedkv_last_error().decode()
        assert h.stats().steps == 0 and not h.request_state(1).computed
        n = ctypes.c_int64(0)
        assert lib.pagedkv_hybrid_num_groups(h._handle, ctypes.byref(n)) == 0 and n.value == 3
        gs = pagedkv._ffi.GroupStats()
        assert lib.pagedkv_hybrid_get_group_stats(d._handle, 0, ctypes.byref(gs), ctypes.sizeof(gs)) == pagedkv.BadHandle.code
        assert "is a dense manager" in lib.pagedkv_last_error().decode()
        assert lib.pagedkv_hybrid_get_group_stats(h._handle, 3, ctypes.byref(gs), ctypes.sizeof(gs)) == pagedkv.BadArgument.code
        assert "group = 3, want 0..2" in lib.pagedkv_last_error().decode()
        # An older caller's smaller struct gets the leading fields only.
        small = (ctypes.c_int64 * 3)(-1, -1, -1)
        assert lib.pagedkv_hybrid_get_group_stats(h._handle, 0, ctypes.cast(small, ctypes.POINTER(pagedkv._ffi.GroupStats)), 16) == 0
        assert small[0] == 1 and small[2] == -1  # kind sliding; the third word untouched
        # A wrong struct size is named.
        cfg = pagedkv._ffi.Config(16, 4, 0, 0, 0, 1, 0)
        g = (pagedkv._ffi.LayerGroup * 1)(pagedkv._ffi.LayerGroup(0, 0, 0, 1))
        out = ctypes.c_uint64(0)
        rc = lib.pagedkv_hybrid_create(ctypes.byref(cfg), ctypes.sizeof(cfg), g, 1, 16, ctypes.byref(out))
        assert rc == pagedkv.BadArgument.code
        assert "group_size = 16, want sizeof(pagedkv_layer_group) = 120 (or 32," in lib.pagedkv_last_error().decode()
        g[0].kind = 7
        rc = lib.pagedkv_hybrid_create(ctypes.byref(cfg), ctypes.sizeof(cfg), g, 1, 32, ctypes.byref(out))
        assert rc == pagedkv.BadArgument.code and "groups[0].kind = 7" in lib.pagedkv_last_error().decode()
    finally:
        h.close()
        d.close()


def test_plan_goes_stale_and_copies_stay(world):
    m, prompt, plan = world
    p = m.reserve([1], [1])
    kept = p.copy()
    want = [plan_values(g) for g in p.groups]
    m.commit([9])
    m.reserve([1], [1])
    for fn in (lambda: p.copies, lambda: p.groups, lambda: p.copy()):
        with pytest.raises(pagedkv.StalePlan, match="step"):
            fn()
    assert not p.valid and kept.valid
    assert [plan_values(g) for g in kept.groups] == want
    m.abort()
    m.close()
    with pytest.raises(pagedkv.StalePlan, match="close"):
        kept.groups  # an owned copy stays current
        p.groups


def test_busy_from_another_thread(world):
    """A call while another thread's call is in flight raises Busy at once
    and changes nothing (the call lock is the dense Manager's)."""
    m, prompt, plan = world
    before = snapshot(m, plan)
    got = []
    with m._lock:  # a call in flight
        t = threading.Thread(target=lambda: got.append(pytest.raises(pagedkv.Busy, m.reserve, [1], [1])))
        t.start()
        t.join()
    assert "in use by another thread" in str(got[0].value)
    assert snapshot(m, plan) == before
    assert np.array_equal(plan.groups[0].kv_indptr, np.array(before["groups"][0][0]["kv_indptr"]))
