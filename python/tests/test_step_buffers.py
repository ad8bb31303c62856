"""Engine-owned step buffers (pagedkv.stepbuffers): a loop with bound step
buffers is byte for byte what a slow packer makes of an unbound twin's plan
views, refusals name the values, plan arrays export DLPack."""

import os
import re

import numpy as np
import pytest

import pagedkv
from pagedkv import stepbuffers
from conftest import snapshot

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# CI runs 200 steps of each kind (about a second on its 2 cores); the full
# count of 10^4 steps each runs with PAGEDKV_STEP_BUFFER_STEPS=10000 (the Go
# test TestStepBuffersEqualPlanViews runs 10^4 on every run).
STEPS = int(os.environ.get("PAGEDKV_STEP_BUFFER_STEPS", "200"))
CAPS = dict(max_requests=12, max_tokens=12 * 24, max_pages=12 * 20, max_cascade_levels=16)
GROUPS = [pagedkv.LayerGroup("full", num_layers=2), pagedkv.LayerGroup("sliding", window_tokens=10, num_layers=2),
          pagedkv.LayerGroup("chunked", chunk_tokens=8, num_layers=2)]


def test_arrays_match_the_header():
    """ARRAYS is cabi/pagedkv.h's PAGEDKV_STEP_* enum, in order."""
    with open(os.path.join(ROOT, "cabi", "pagedkv.h")) as f:
        enum = re.findall(r"PAGEDKV_STEP_([A-Z_]+) = (\d+)", f.read())
    assert [(n.lower(), int(v)) for n, v in enum] == [(n, i) for i, n in enumerate(stepbuffers.ARRAYS)]


def make(hybrid, **kw):
    cfg = dict(hash_seed=7, cascade_min_saved_pages=1, **kw)
    if hybrid:
        return pagedkv.HybridManager(96, 4, GROUPS, **cfg)
    return pagedkv.Manager(96, 4, **cfg)


def groups_of(plan):
    return plan.groups if isinstance(plan, pagedkv.HybridPlan) else [plan]


def ref_pack(ref, rows, plan, step):
    """Writes plan into ref (uint8) the slow way: each array at its row."""
    index = {(r.array, r.group, r.level): r for r in rows}

    def put(name, g, level, values):
        r = index[(name, g, level)]
        v = np.asarray(values, dtype="<i4").reshape(-1)
        assert v.size <= r.cap, (name, g, level)
        ref[r.offset:r.offset + 4 * v.size] = v.view(np.uint8)

    gs = groups_of(plan)
    copies = np.asarray(plan.copies).reshape(-1)
    put("header", -1, -1, [len(plan.request_ids), gs[0].nnz, copies.size // 3, len(gs), step])
    put("copies", -1, -1, copies)
    for g, p in enumerate(gs):
        levels = p.cascade or []
        attn = getattr(p, "attn_requests", None)
        attn_pages = getattr(p, "attn_kv_page_indices", None)
        put("group_header", g, -1, [p.kv_indptr[-1], p.window_left, len(levels),
                                    0 if attn is None else attn.size, 0 if attn_pages is None else attn_pages.size])
        for name in ("qo_indptr", "batch_indices", "positions", "token_ids", "token_positions", "drafts", "kv_indptr",
                     "kv_page_indices", "kv_last_page_len", "seq_lens"):
            put(name, g, -1, getattr(p, name))
        if p.block_tables is not None:
            put("block_tables", g, -1, p.block_tables)
        if attn is not None:
            for name in ("attn_qo_indptr", "attn_kv_indptr", "attn_kv_page_indices", "attn_kv_last_page_len",
                         "attn_requests"):
                put(name, g, -1, getattr(p, name))
        if levels:
            put("query_rows", g, -1, p.query_rows)
            cwl = getattr(p, "cascade_window_left", None)
            put("cascade_window_left", g, -1, [p.window_left if l == len(levels) - 1 else -1
                                               for l in range(len(levels))] if cwl is None else cwl)
            put("level_batch_size", g, -1, [lv.qo_indptr.size - 1 for lv in levels])
            for l, lv in enumerate(levels):
                put("level_qo_indptr", g, l, lv.qo_indptr)
                put("level_kv_indptr", g, l, lv.kv_indptr)
                put("level_kv_indices", g, l, lv.kv_indices)
                put("level_kv_last_page_len", g, l, lv.kv_last_page_len)


def same(f, g):
    """Runs f on both managers; both must fail alike or succeed."""
    out = []
    for m in (0, 1):
        try:
            out.append((f(m), None))
        except pagedkv.PagedKVError as e:
            out.append((None, "%s: %s" % (type(e).__name__, e)))
    assert out[0][1] == out[1][1], out
    return out[0][1] is None, out[0][0], out[1][0]


@pytest.mark.parametrize("hybrid", [False, True], ids=["dense", "hybrid"])
def test_bound_loop_equals_plan_views(hybrid):
    # Padded block tables on (every request's pages fit 24 columns).
    bound, twin = make(hybrid, block_tables_stride=24), make(hybrid, block_tables_stride=24)
    ms = (bound, twin)
    sb = bound.bind_step_buffers(**CAPS)
    assert bound.step_buffers is sb
    ref = np.zeros(sb.size, dtype=np.uint8)
    ref[:] = sb.buffer  # the pool header's num_groups, written at bind
    rng = np.random.default_rng(40)
    prompts = [list(range(1000 * p, 1000 * p + 9 + 4 * p)) for p in range(4)]
    live, nxt, steps, cascades, copies = [], 0, 0, 0, 0
    while steps < STEPS:
        k = rng.integers(20)
        if k < 3 and len(live) < 14:
            prompt = prompts[rng.integers(len(prompts))] + list(range(nxt * 31, nxt * 31 + rng.integers(6)))
            if same(lambda i: ms[i].add(nxt, prompt, capacity_tokens=80), 0)[0]:
                live.append(nxt)
            nxt += 1
        elif k < 4 and 0 < len(live) < 14:
            parent = live[rng.integers(len(live))]
            if same(lambda i: ms[i].fork(parent, nxt), 0)[0]:
                live.append(nxt)
            nxt += 1
        elif k < 5 and live:
            rid = live[rng.integers(len(live))]
            if same(lambda i: ms[i].release(rid), 0)[0]:
                live.remove(rid)
        elif k < 6 and live:
            rid = live[rng.integers(len(live))]
            if bound.request_state(rid).running:
                same(lambda i: ms[i].preempt(rid), 0)
            else:
                same(lambda i: ms[i].resume(rid), 0)
        else:
            ids, nt = [], []
            for rid in live:
                st = bound.request_state(rid)
                if not st.running or rng.integers(3) == 0 or len(ids) == 12:
                    continue
                ids.append(rid)
                nt.append(min(st.num_tokens - st.computed, 1 + int(rng.integers(8))))
            ok, bp, tp = same(lambda i: ms[i].reserve(ids, nt), 0)
            if not ok:
                continue
            steps += 1
            ref_pack(ref, sb.rows, tp, steps)
            if not np.array_equal(ref, sb.buffer):
                bad = [r for r in sb.rows
                       if not np.array_equal(ref[r.offset:r.offset + 4 * r.cap], sb.buffer[r.offset:r.offset + 4 * r.cap])]
                pytest.fail("step %d: rows %s differ" % (steps, bad[:3]))
            for g, (b, t) in enumerate(zip(groups_of(bp), groups_of(tp))):
                assert np.shares_memory(b.kv_indptr, sb.buffer)
                assert np.array_equal(b.kv_page_indices, t.kv_page_indices), (steps, g)
                row = sb.view("block_tables", g)[:b.block_tables.size].reshape(-1, 24)
                assert np.array_equal(row, b.block_tables) and (b.block_tables.size == 0 or np.shares_memory(b.block_tables, sb.buffer)), (steps, g)
                cascades += t.cascade is not None
            copies += len(tp.copies)
            if rng.integers(10) == 0:
                same(lambda i: ms[i].abort(), 0)
                continue
            sampled = []
            for rid, n in zip(ids, nt):
                st = bound.request_state(rid)
                sampled.append(steps % 5000 if st.computed + n == st.num_tokens and rng.integers(4) else pagedkv.NO_TOKEN)
            same(lambda i: ms[i].commit(sampled), 0)
    bound.audit()
    assert cascades > 0 and copies > 0


def decode_manager(hybrid=False, n=3):
    m = pagedkv.HybridManager(32, 4, GROUPS) if hybrid else pagedkv.Manager(32, 4)
    for i in range(1, n + 1):
        m.add(i, list(range(100 * i, 100 * i + 7)))
    return m


def state(m, hybrid):
    """What a failed call must leave unchanged."""
    if not hybrid:
        return snapshot(m, [1, 2, 3])
    return (repr(m.stats()), [(m.tokens(i).tolist(), [m.pages(i, g).tolist() for g in range(m.num_groups)])
                              for i in (1, 2, 3)])


@pytest.mark.parametrize("hybrid", [False, True], ids=["dense", "hybrid"])
@pytest.mark.parametrize("caps,msg", [
    (dict(max_requests=2, max_tokens=100, max_pages=100), "the step has 3 requests, MaxRequests = 2"),
    (dict(max_requests=3, max_tokens=20, max_pages=100), "the step appends 21 tokens (drafts included), MaxTokens = 20"),
    (dict(max_requests=3, max_tokens=100, max_pages=5), "holds 6 pages, MaxPages = 5"),
])
def test_step_over_capacity_is_refused(hybrid, caps, msg):
    m = decode_manager(hybrid)
    m.bind_step_buffers(**caps)
    before = state(m, hybrid)
    with pytest.raises(pagedkv.BadArgument, match=re.escape(msg)):
        m.reserve([1, 2, 3], [7, 7, 7])
    assert state(m, hybrid) == before
    m.bind_step_buffers(max_requests=3, max_tokens=21, max_pages=6)
    p = m.reserve([1, 2, 3], [7, 7, 7])
    assert groups_of(p)[0].kv_page_indices.size == 6


def test_bad_buffers_are_refused():
    m = decode_manager()
    caps = dict(max_requests=3, max_tokens=21, max_pages=6)
    rows, size = m.step_buffers_layout(**caps)
    assert rows[0] == stepbuffers.StepRow("header", -1, -1, 0, 8)
    good = stepbuffers.aligned_buffer(size + 64)
    ro = stepbuffers.aligned_buffer(size)
    ro.setflags(write=False)
    f32 = np.zeros(size // 4 + 16, dtype=np.float32)
    i64 = np.zeros(size // 8 + 16, dtype=np.int64)
    cases = [
        (stepbuffers.aligned_buffer(size - 4), "the buffer has %d bytes, the layout needs %d" % (size - 4, size)),
        (good[4:], "is not a multiple of 16"),
        (ro, "the buffer is read-only"),
        (f32, "dtype is <f4, want bytes (uint8) or little-endian int32"),
        (i64, "dtype is <i8"),
        (np.zeros(2 * size + 64, dtype=np.uint8)[::2], "not C-contiguous"),
        (np.zeros(size + 64, dtype=">i4"), "dtype is >i4"),
        (bytes(size + 64), "read-only"),
        (42, "int has neither the array interface nor the buffer protocol"),
    ]
    for buf, msg in cases:
        with pytest.raises(pagedkv.BadArgument, match=re.escape(msg)):
            m.bind_step_buffers(buf, **caps)
        assert m.step_buffers is None
    for bad, msg in [(dict(caps, max_requests=0), "MaxRequests = 0"),
                     (dict(caps, max_cascade_levels=65), "MaxCascadeLevels = 65, want 0..64"),
                     (dict(caps, max_pages=1.5), "max_pages = 1.5 is not an integer")]:
        with pytest.raises(pagedkv.BadArgument, match=re.escape(msg)):
            m.bind_step_buffers(good, **bad)
    # A bytearray (the buffer protocol) works when aligned; good works.
    sb = m.bind_step_buffers(good, **caps)
    assert np.shares_memory(sb.buffer, good)
    p = m.reserve([1, 2, 3], [7, 7, 7])
    assert np.shares_memory(p.kv_indptr, good)
    assert sb.header() == dict(batch_size=3, nnz=21, num_copies=0, num_groups=1, step=1)
    assert sb.group_header()["num_pages"] == 6
    assert np.array_equal(sb.view("kv_indptr")[:4], p.kv_indptr)


def test_bytearray_buffer():
    m = decode_manager()
    rows, size = m.step_buffers_layout(max_requests=3, max_tokens=21, max_pages=6)
    for off in range(16):
        ba = bytearray(size + 16)
        import ctypes
        addr = ctypes.addressof((ctypes.c_char * len(ba)).from_buffer(ba))
        if addr % 16 == 0:
            break
    else:
        pytest.skip("no aligned bytearray")
    m.bind_step_buffers(ba, max_requests=3, max_tokens=21, max_pages=6)
    p = m.reserve([1, 2, 3], [7, 7, 7])
    assert np.frombuffer(ba, dtype=np.int32)[:8].tolist()[:2] == [3, 21]
    with pytest.raises(BufferError):
        ba.extend(b"x")  # the bound memory cannot move
    assert p.nnz == 21


@pytest.mark.parametrize("bind", [False, True], ids=["plan-views", "bound"])
def test_plan_arrays_export_dlpack(bind):
    m = decode_manager()
    if bind:
        m.bind_step_buffers(max_requests=3, max_tokens=21, max_pages=6)
    p = m.reserve([1, 2, 3], [7, 7, 7])
    for name in ("qo_indptr", "kv_indptr", "kv_page_indices", "kv_last_page_len", "positions", "batch_indices"):
        a = getattr(p, name)
        assert a.__dlpack_device__() == (1, 0)  # kDLCPU
        d = np.from_dlpack(a)
        assert d.dtype == np.int32 and np.array_equal(d, a) and np.shares_memory(d, a)


def test_rebind_unbind_close_keep_memory():
    m = decode_manager()
    sb1 = m.bind_step_buffers(max_requests=3, max_tokens=21, max_pages=6)
    p1 = m.reserve([1, 2, 3], [7, 7, 7])
    kv1 = p1.kv_page_indices
    m.abort()
    sb2 = m.bind_step_buffers(max_requests=3, max_tokens=21, max_pages=6)
    p2 = m.reserve([1, 2, 3], [7, 7, 7])
    assert np.shares_memory(p2.kv_indptr, sb2.buffer) and not np.shares_memory(p2.kv_indptr, sb1.buffer)
    assert kv1.size == 6  # the old view still reads the first buffer, which the Manager keeps
    m.abort()
    m.unbind_step_buffers()
    assert m.step_buffers is None
    p3 = m.reserve([1, 2, 3], [7, 7, 7])
    assert not np.shares_memory(p3.kv_indptr, sb2.buffer)
    m.close()
    with pytest.raises(pagedkv.BadHandle):
        m.bind_step_buffers(max_requests=3, max_tokens=21, max_pages=6)
    assert sb2.header()["batch_size"] == 3
