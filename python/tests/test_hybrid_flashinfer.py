"""A HybridManager's per-group plans, through pagedkv.flashinfer's keyword
arguments, into the numpy stand-ins of FlashInfer's wrappers
(tools/engine_loop.py, which take FlashInfer's parameter names), compute
each group's attention exactly: every query row of every group equals
dense attention over the keys the group's attention reads (full: every
earlier key; sliding W: the last W; chunked C: from the chunk's start),
through prefix-cache hits, cascade plans, chunk boundaries inside a step,
copies and preemptions."""

import numpy as np
import pytest

import engine_loop as el
import pagedkv
from pagedkv import flashinfer as fi

HQ, HKV, D, PS = 4, 2, 8, 4
CONFIGS = {
    "sliding 16 + full": [pagedkv.LayerGroup("sliding", window_tokens=16), pagedkv.LayerGroup("full")],
    "chunked 16 + full": [pagedkv.LayerGroup("chunked", chunk_tokens=16), pagedkv.LayerGroup("full")],
}
WRAPPERS = {"decode": el.BatchDecodeWithPagedKVCacheWrapper, "prefill": el.BatchPrefillWithPagedKVCacheWrapper}


def first_key(group, pos):
    """The first key a query at pos reads in group."""
    if group.kind == "sliding":
        return max(0, pos - group.window_tokens + 1)
    if group.kind == "chunked":
        return pos // group.chunk_tokens * group.chunk_tokens
    return 0


def group_attention(gp, q, cache):
    kind, kw = fi.group_attention_kwargs(gp, HQ, HKV, D, PS)
    if kind == "cascade":
        w = el.MultiLevelCascadeAttentionWrapper(len(gp.cascade))
        w.plan(**kw)
        out = np.zeros(q.shape)
        out[gp.query_rows] = w.run(q[gp.query_rows], cache)
        return kind, out
    w = WRAPPERS[kind]()
    w.plan(**kw)
    return kind, w.run(q, cache)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_group_attention_equals_dense(name):
    groups = CONFIGS[name]
    rng = np.random.default_rng(3)
    m = pagedkv.HybridManager(64, PS, groups, hash_seed=1, cascade_min_saved_pages=1)
    cache = np.zeros((64, 2, PS, HKV, D))
    shared = list(range(100, 108))
    kinds, rows, next_id = set(), 0, 1
    for step in range(90):
        if step % 6 == 0 and next_id <= 10:
            m.add(next_id, shared + [next_id] * int(rng.integers(1, 17)))
            next_id += 1
        if step % 9 == 4 and m.request_state(next_id - 1).running:
            m.fork(next_id - 1, next_id)  # a shared partial page: a copy on the next step
            m.extend(next_id, [7])
            next_id += 1
        for rid in range(1, next_id):
            st = m.request_state(rid)
            if not st.running and rng.integers(3) == 0:
                try:
                    m.resume(rid)
                except pagedkv.OutOfPages:
                    pass
        ids, nt = [], []
        for rid in range(1, next_id):
            st = m.request_state(rid)
            if st.running and st.num_tokens > st.computed:
                ids.append(rid)
                nt.append(min(st.num_tokens - st.computed, int(rng.integers(1, 11))))
        if not ids:
            continue
        try:
            plan = m.reserve(ids, nt)
        except pagedkv.OutOfPages:
            m.preempt(ids[-1])
            continue
        for src, dst, entries in plan.copies:
            cache[dst, :, :entries] = cache[src, :, :entries]
        for g, gp in enumerate(plan.groups):
            k, v = el.kv_of(gp.token_ids, gp.token_positions, HKV, D)
            el.append_paged_kv_cache(k, v, paged_kv_cache=cache, **fi.append_kwargs(gp))
        for g, gp in enumerate(plan.groups):
            q = el.q_of(gp.token_ids, gp.token_positions, HQ, D)
            kind, out = group_attention(gp, q, cache)
            kinds.add((groups[g].kind, kind))
            if gp.attn_requests is not None and len(gp.attn_requests) > gp.batch_size:
                kinds.add(("chunked", "rows across a chunk boundary"))
            for i, (b, pos) in enumerate(zip(gp.batch_indices.tolist(), gp.token_positions.tolist())):
                toks = m.tokens(ids[b])
                first = first_key(groups[g], pos)
                kk, vv = el.kv_of(toks[first:pos + 1], np.arange(first, pos + 1), HKV, D)
                want = el._attend(q[i][None], kk, vv, np.ones((1, len(kk)), dtype=bool), 1 / np.sqrt(D))[0][0]
                assert np.abs(out[i] - want).max() < 1e-9, (name, step, g, kind, i, pos)
                rows += 1
        sampled = []
        for b, rid in enumerate(ids):
            st = m.request_state(rid)
            sampled.append(int(rng.integers(0, 50)) if st.computed + nt[b] == st.num_tokens else pagedkv.NO_TOKEN)
        m.commit(sampled)
        m.audit()
    # The run reached what it claims to check.
    assert {(groups[0].kind, "prefill"), (groups[0].kind, "cascade"), ("full", "prefill"), ("full", "decode"),
            ("full", "cascade")} <= kinds, kinds
    assert groups[0].kind != "chunked" or ("chunked", "rows across a chunk boundary") in kinds, kinds
    s = m.stats()
    assert s.window_released_pages > 0 and s.prompt_hit_tokens > 0 and s.preemptions > 0 and s.copied_pages > 0, s
    assert rows > 200, rows
    m.close()


def test_kwargs_names_and_views():
    m = pagedkv.HybridManager(32, PS, [pagedkv.LayerGroup("chunked", chunk_tokens=8), pagedkv.LayerGroup("full")],
                              hash_seed=1, cascade_min_saved_pages=-1)
    m.add(1, list(range(20)))
    plan = m.reserve([1], [20])  # rows 0..19 cross two chunk boundaries
    (k0, kw0), (k1, kw1) = fi.hybrid_plan_kwargs(plan, HQ, HKV, D, PS, sm_scale=0.5)
    c = plan.groups[0]
    assert k0 == "prefill" and kw0["qo_indptr"] is c.attn_qo_indptr and kw0["paged_kv_indices"] is c.attn_kv_page_indices
    assert c.attn_qo_indptr.tolist() == [0, 8, 16, 20] and c.attn_requests.tolist() == [0, 0, 0]
    # The library decides the kind (pagedkv_plan.attention_kind), chunked included.
    assert fi.attention_kind(c) == c.attention_kind == "chunked" and plan.groups[1].attention_kind == "prefill"
    assert kw0["causal"] is True and kw0["window_left"] == -1 and kw0["sm_scale"] == 0.5
    assert k1 == "prefill" and kw1["qo_indptr"] is plan.groups[1].qo_indptr and kw1["sm_scale"] == 0.5
    for kw in (kw0, kw1):
        assert set(kw) <= set(el.BatchPrefillWithPagedKVCacheWrapper.plan.__code__.co_varnames)
    m.close()
