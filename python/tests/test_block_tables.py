"""The padded block-table contract through the Python package
(Plan.block_tables, docs/pagetable.md "Padded block tables").

test_block_tables_match_csr runs randomized steps (dense full and
sliding-window Managers, a gpt-oss-like HybridManager; chunked prefill,
decode, speculative steps with rejected drafts, preemption, resume, forks,
aborted steps) and checks every plan's block_tables against its CSR arrays
(test_trace.check_block_tables; the trace replays check the Go traces'
plans the same way). CI runs 1000 steps over the three managers (the
house pattern: a tenth); PAGEDKV_BLOCK_TABLE_STEPS=10000 runs the full
count (about 20 s of CPU). The flashinfer kwargs helpers and the refusals
are checked below.
"""

import os
import random

import numpy as np
import pytest

import pagedkv
from pagedkv import flashinfer as fi
from test_trace import check_block_tables

STEPS = int(os.environ.get("PAGEDKV_BLOCK_TABLE_STEPS", "1000"))


def _plans(plan):
    return plan.groups if isinstance(plan, pagedkv.HybridPlan) else [plan]


def _run(m, rng, steps):
    """steps randomized steps on m; returns how many plans were checked."""
    ids, nxt, checked = [], 1, 0
    while checked < steps:
        running = [i for i in ids if m.request_state(i).running]
        if len(running) < 6 and rng.random() < 0.3:
            fam = rng.randrange(4)
            m.add(nxt, [fam * 100 + t for t in range(rng.randint(2, 30))])
            ids.append(nxt)
            nxt += 1
            continue
        k = rng.random()
        if k < 0.03 and running:
            m.preempt(rng.choice(running))
            continue
        if k < 0.08 and len(running) < len(ids):
            try:
                m.resume(rng.choice([i for i in ids if i not in running]))
            except pagedkv.OutOfPages:
                pass
            continue
        if k < 0.1 and running:
            m.fork(rng.choice(running), nxt)
            ids.append(nxt)
            nxt += 1
            continue
        batch, nt = [], []
        for rid in running:
            st = m.request_state(rid)
            if st.num_tokens > st.computed:
                batch.append(rid)
                nt.append(rng.randint(1, min(8, st.num_tokens - st.computed)))
        if not batch:
            continue
        spec = rng.random() < 0.3
        drafts = [[rng.randrange(90) for _ in range(rng.randrange(4))]
                  if m.request_state(r).computed + n == m.request_state(r).num_tokens else [] for r, n in zip(batch, nt)]
        try:
            plan = m.reserve_spec(batch, nt, drafts) if spec else m.reserve(batch, nt)
        except pagedkv.OutOfPages:
            m.preempt(rng.choice(batch))
            continue
        for p in _plans(plan):
            check_block_tables(p, "step %d" % checked)
            assert p.block_tables is not None
        checked += 1
        if rng.random() < 0.05:
            m.abort()
            continue
        sampled = []
        for r, n in zip(batch, nt):
            st = m.request_state(r)
            done = st.computed + n == st.num_tokens - (len(drafts[batch.index(r)]) if spec else 0)
            sampled.append(rng.randrange(90) if done and st.num_tokens < 120 else pagedkv.NO_TOKEN)
        if spec:
            m.commit_spec([rng.randint(0, len(d)) for d in drafts], sampled)
        else:
            m.commit(sampled)
        for r in batch:
            st = m.request_state(r)
            if st.num_tokens >= 120 and st.computed == st.num_tokens:
                m.release(r)
                ids.remove(r)
    return checked


@pytest.mark.parametrize("kind", ["full", "window", "hybrid"])
def test_block_tables_match_csr(kind):
    rng = random.Random(len(kind))
    if kind == "hybrid":
        m = pagedkv.HybridManager(64, 4, [pagedkv.LayerGroup("sliding", window_tokens=10), pagedkv.LayerGroup("full")],
                                  hash_seed=3, block_tables_stride=40)
    else:
        m = pagedkv.Manager(64, 4, window_tokens=10 if kind == "window" else 0, hash_seed=3, block_tables_stride=40)
    steps = STEPS // 3 + 1
    assert _run(m, rng, steps) >= steps
    s = m.stats()
    assert s.preemptions > 0 and s.accepted_draft_tokens < s.draft_tokens, s
    if kind != "full":
        assert s.window_released_pages > 0
    m.audit()
    m.close()


def _decode_plan(stride, window=0):
    m = pagedkv.Manager(16, 4, window_tokens=window, block_tables_stride=stride)
    m.add(1, list(range(13)))
    m.reserve([1], [13])
    m.commit([7])
    return m, m.reserve([1], [1])


def test_flashinfer_padded_kwargs():
    m, p = _decode_plan(5, window=6)
    kw = fi.trtllm_decode_kwargs(p)
    assert kw["block_tables"].tolist() == [[1, 2, 3, 0, 0]]
    assert kw["seq_lens"].tolist() == [10] and kw["max_seq_len"] == 20
    assert kw["window_left"] == 5 and kw["q_len_per_req"] == 1
    with pytest.raises(pagedkv.BadArgument, match="window_left = 5, but cuDNN decode has no window"):
        fi.cudnn_decode_kwargs(p)
    m.close()
    m, p = _decode_plan(5)
    kw = fi.cudnn_decode_kwargs(p, host=lambda a: a.copy())
    assert kw["block_tables"].tolist() == [[0, 1, 2, 3, 0]]
    assert kw["actual_seq_lens_kv"].tolist() == [14] and kw["max_sequence_kv"] == 20
    m.close()
    # Uneven rows: trtllm-gen's variable query lengths.
    m = pagedkv.Manager(16, 4, block_tables_stride=4)
    m.add(1, [1, 2, 3])
    m.add(2, [4, 5, 6, 7, 8])
    p = m.reserve([1, 2], [3, 5])
    kw = fi.trtllm_decode_kwargs(p)
    assert kw["q_len_per_req"] is None and kw["max_q_len"] == 5 and kw["cum_seq_lens_q"].tolist() == [0, 3, 8]
    with pytest.raises(pagedkv.BadArgument, match="not one row per request"):
        fi.cudnn_decode_kwargs(p)
    m.close()
    m = pagedkv.Manager(16, 4)
    m.add(1, [1, 2, 3])
    p = m.reserve([1], [3])
    assert p.block_tables is None and p.max_seq_len is None
    with pytest.raises(pagedkv.BadArgument, match="block_tables_stride > 0"):
        fi.trtllm_decode_kwargs(p)
    m.close()


def test_stride_refusals():
    with pytest.raises(pagedkv.BadConfig, match="BlockTablesStride = 17, want 0..NumPages = 16"):
        pagedkv.Manager(16, 4, block_tables_stride=17)
    m = pagedkv.Manager(16, 4, block_tables_stride=2)
    m.add(1, list(range(12)))
    before = m.stats().as_dict()
    with pytest.raises(pagedkv.BadArgument, match="would hold 3 pages .* more than Config.BlockTablesStride = 2"):
        m.reserve([1], [9])
    assert m.stats().as_dict() == before and not m.pending
    p = m.reserve([1], [8])
    assert p.block_tables.shape == (1, 2)
    m.close()


# Read from flashinfer-python's sources (flashinfer/decode.py
# trtllm_batch_decode_with_kv_cache, flashinfer/cudnn/decode.py
# cudnn_batch_decode_with_kv_cache, 2026).
TRTLLM_REQUIRED = ["query", "kv_cache", "workspace_buffer", "block_tables", "seq_lens", "max_seq_len"]
TRTLLM_OPTIONAL = ["bmm1_scale", "bmm2_scale", "window_left", "out", "out_dtype", "o_sf_scale", "o_sf_vec_size",
                   "sinks", "kv_layout", "enable_pdl", "backend", "q_len_per_req", "o_scale", "mask", "max_q_len",
                   "cum_seq_lens_q"]
CUDNN_REQUIRED = ["q", "k_cache", "v_cache", "scale", "workspace_buffer", "max_sequence_kv"]
CUDNN_OPTIONAL = ["actual_seq_lens_kv", "block_tables", "is_cuda_graph_compatible", "batch_offsets_q",
                  "batch_offsets_o", "batch_offsets_k", "batch_offsets_v", "out"]


def test_padded_kwargs_are_flashinfer_signatures():
    from test_flashinfer import check_names
    m, p = _decode_plan(5)
    kw = fi.trtllm_decode_kwargs(p)
    check_names(kw, TRTLLM_REQUIRED, TRTLLM_OPTIONAL, {"query", "kv_cache", "workspace_buffer"})
    assert kw["block_tables"] is p.block_tables and kw["seq_lens"] is p.seq_lens  # views, no copy
    kw = fi.cudnn_decode_kwargs(p)
    check_names(kw, CUDNN_REQUIRED, CUDNN_OPTIONAL, {"q", "k_cache", "v_cache", "scale", "workspace_buffer"})
    assert kw["block_tables"] is p.block_tables
    m.close()
