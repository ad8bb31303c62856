#!/usr/bin/env python3
"""A small serving-engine loop over pagedkv's Python package.

Every step it asks pagedkv for a plan, performs the plan's page copies,
appends the step's K/V into a paged cache with append_paged_kv_cache, runs
attention with the wrapper the plan calls for (batch decode, batch prefill,
or multi-level cascade when requests share a prefix), and checks every
output row against dense attention over the request's whole sequence. The
workload has shared system prompts, chunked prefill, decode, forks (parallel
sampling), preemption under memory pressure, resume and release.

Backends:

  --backend numpy       (default) numpy reference implementations of the
                        four FlashInfer calls, with FlashInfer's parameter
                        names, in float64. Runs anywhere; CI runs it.
  --backend flashinfer  torch + flashinfer-python on a CUDA GPU, float16
                        cache. NOT TESTED: written against FlashInfer's
                        documented signatures, never run on a GPU here.

The library is found as the package finds it ($PAGEDKV_LIB, the library
bundled by pip install ./python, or build/cabi/libpagedkv.so after
scripts/cabi.sh).

    python3 tools/engine_loop.py --steps 60
    python3 tools/engine_loop.py --window 12
"""

import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import pagedkv  # noqa: E402
from pagedkv import flashinfer as fi  # noqa: E402

# ---------------------------------------------------------------------------
# numpy reference implementations with FlashInfer's signatures (NHD layout,
# paged_kv_cache [num_pages, 2, page_size, num_kv_heads, head_dim]).


def append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices,
                          kv_indptr, kv_last_page_len, kv_layout="NHD"):
    assert kv_layout == "NHD"
    page_size = paged_kv_cache.shape[2]
    page = kv_indices[kv_indptr[batch_indices] + positions // page_size]
    entry = positions % page_size
    paged_kv_cache[page, 0, entry] = append_key
    paged_kv_cache[page, 1, entry] = append_value


def _attend(q, k, v, allowed, sm_scale):
    """q [n, Hq, D], k/v [L, H, D], allowed [n, L] -> (o [n, Hq, D], lse [n, Hq]) natural log."""
    n, hq, d = q.shape
    h = k.shape[1]
    g = hq // h
    kk = np.repeat(k, g, axis=1) if len(k) else np.zeros((0, hq, d))
    vv = np.repeat(v, g, axis=1) if len(v) else np.zeros((0, hq, d))
    s = np.einsum("nhd,lhd->nhl", q, kk) * sm_scale
    s = np.where(allowed[:, None, :], s, -np.inf)
    mx = s.max(axis=2, initial=-np.inf)
    safe = np.where(np.isfinite(mx), mx, 0.0)
    p = np.exp(s - safe[:, :, None])
    den = p.sum(axis=2)
    o = np.einsum("nhl,lhd->nhd", p, vv) / np.where(den > 0, den, 1.0)[:, :, None]
    lse = np.where(den > 0, np.log(np.where(den > 0, den, 1.0)) + safe, -np.inf)
    return o, lse


def _gather(cache, pages, last_page_len):
    page_size = cache.shape[2]
    if len(pages) == 0:
        return cache[:0, 0, 0], cache[:0, 1, 0]
    kv = cache[np.asarray(pages)]  # [n, 2, ps, H, D]
    n = (len(pages) - 1) * page_size + int(last_page_len)
    k = kv[:, 0].reshape(-1, *cache.shape[3:])[:n]
    v = kv[:, 1].reshape(-1, *cache.shape[3:])[:n]
    return k, v


def _paged_attention(q, cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, window_left, sm_scale):
    out = np.zeros(q.shape)
    lse = np.full(q.shape[:2], -np.inf)
    for b in range(len(qo_indptr) - 1):
        lo, hi = int(qo_indptr[b]), int(qo_indptr[b + 1])
        if hi == lo:
            continue
        k, v = _gather(cache, kv_indices[kv_indptr[b]:kv_indptr[b + 1]], kv_last_page_len[b])
        qo, L = hi - lo, len(k)
        i = np.arange(qo)[:, None] + (L - qo)  # bottom-right aligned query positions
        j = np.arange(L)[None, :]
        allowed = np.ones((qo, L), dtype=bool)
        if causal:
            allowed &= j <= i
        if window_left >= 0:
            allowed &= j >= i - window_left
        out[lo:hi], lse[lo:hi] = _attend(q[lo:hi], k, v, allowed, sm_scale)
    return out, lse


def trtllm_batch_decode_with_kv_cache(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len,
                                      bmm1_scale=1.0, bmm2_scale=1.0, window_left=-1, out=None, out_dtype=None,
                                      o_sf_scale=None, o_sf_vec_size=None, sinks=None, kv_layout="HND",
                                      enable_pdl=None, backend="auto", q_len_per_req=1, o_scale=1.0, mask=None,
                                      max_q_len=None, cum_seq_lens_q=None):
    """flashinfer.decode.trtllm_batch_decode_with_kv_cache over the padded
    contract alone: request b's keys are the first seq_lens[b] slots of the
    pages block_tables[b, :ceil(seq_lens[b] / page_size)]; its
    q_len_per_req rows are the last of them (causal), within window_left."""
    assert kv_layout == "NHD" and sinks is None and cum_seq_lens_q is None
    page_size = kv_cache.shape[2]
    out = np.zeros(query.shape)
    for b in range(block_tables.shape[0]):
        n = int(seq_lens[b])
        assert 0 < n <= max_seq_len, (n, max_seq_len)
        pages = block_tables[b, :(n + page_size - 1) // page_size]
        kv = kv_cache[np.asarray(pages)]  # [pages, 2, ps, H, D]
        k = kv[:, 0].reshape(-1, *kv_cache.shape[3:])[:n]
        v = kv[:, 1].reshape(-1, *kv_cache.shape[3:])[:n]
        lo = b * q_len_per_req
        i = np.arange(q_len_per_req)[:, None] + (n - q_len_per_req)
        j = np.arange(n)[None, :]
        allowed = (j <= i) & ((j >= i - window_left) if window_left >= 0 else True)
        o, _ = _attend(query[lo:lo + q_len_per_req], k, v, allowed, bmm1_scale)
        out[lo:lo + q_len_per_req] = o * bmm2_scale
    return out


class BatchPrefillWithPagedKVCacheWrapper:
    def __init__(self, float_workspace_buffer=None, kv_layout="NHD"):
        assert kv_layout == "NHD"

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
             num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, packed_custom_mask=None,
             causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None, window_left=-1,
             logits_soft_cap=None, rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None):
        self.args = (qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len)
        self.causal, self.window_left = causal, window_left
        self.sm_scale = sm_scale if sm_scale is not None else 1 / math.sqrt(head_dim_qk)

    def run(self, q, paged_kv_cache, return_lse=False):
        o, lse = _paged_attention(q, paged_kv_cache, *self.args, self.causal, self.window_left, self.sm_scale)
        return (o, lse) if return_lse else o


class BatchDecodeWithPagedKVCacheWrapper:
    def __init__(self, float_workspace_buffer=None, kv_layout="NHD"):
        assert kv_layout == "NHD"

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
             pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type="float16",
             kv_data_type=None, sm_scale=None, rope_scale=None, rope_theta=None):
        self.args = (indptr, indices, last_page_len)
        self.window_left = window_left
        self.sm_scale = sm_scale if sm_scale is not None else 1 / math.sqrt(head_dim)

    def run(self, q, paged_kv_cache):
        indptr, indices, last = self.args
        qo = np.arange(len(indptr))
        return _paged_attention(q, paged_kv_cache, qo, indptr, indices, last, True, self.window_left,
                                self.sm_scale)[0]


class MultiLevelCascadeAttentionWrapper:
    def __init__(self, num_levels, float_workspace_buffer=None, kv_layout="NHD"):
        self.num_levels = num_levels

    def plan(self, qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr, paged_kv_last_page_len,
             num_qo_heads, num_kv_heads, head_dim, page_size, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None, rope_scale=None,
             rope_theta=None, q_data_type="float16", kv_data_type=None):
        assert len(qo_indptr_arr) == self.num_levels
        self.levels = list(zip(qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr, paged_kv_last_page_len))
        self.causal, self.window_left = causal, window_left
        self.sm_scale = sm_scale if sm_scale is not None else 1 / math.sqrt(head_dim)

    def run(self, q, paged_kv_cache):
        out = lse = None
        for i, lv in enumerate(self.levels):
            causal = self.causal and i == self.num_levels - 1
            o, s = _paged_attention(q, paged_kv_cache, *lv, causal, self.window_left, self.sm_scale)
            if out is None:
                out, lse = o, s
                continue
            m = np.maximum(lse, s)
            safe = np.where(np.isfinite(m), m, 0.0)
            a, b = np.exp(lse - safe), np.exp(s - safe)
            den = np.where(a + b > 0, a + b, 1.0)
            out = (out * a[..., None] + o * b[..., None]) / den[..., None]
            lse = np.where(a + b > 0, np.log(den) + safe, -np.inf)
        return out


# ---------------------------------------------------------------------------
# Deterministic K, V and Q of a token at a position, so that a page served
# from the prefix cache holds exactly what recomputing it would write.


def _features(tokens, positions, shape, salt):
    t = np.asarray(tokens, dtype=np.float64)[:, None]
    p = np.asarray(positions, dtype=np.float64)[:, None]
    f = np.arange(1, int(np.prod(shape)) + 1, dtype=np.float64)[None, :]
    x = np.sin(0.013 * t * f + 0.071 * p * np.sqrt(f) + salt)
    return x.reshape(len(t), *shape)


def kv_of(tokens, positions, heads, dim):
    return _features(tokens, positions, (heads, dim), 0.5), _features(tokens, positions, (heads, dim), 1.7)


def q_of(tokens, positions, heads, dim):
    return _features(tokens, positions, (heads, dim), 2.9)


def dense(tokens, pos, q, num_kv_heads, dim, window_left, sm_scale):
    """Attention of the query at absolute position pos over the request's
    keys 0..pos (within the window)."""
    first = 0 if window_left < 0 else max(0, pos - window_left)
    k, v = kv_of(tokens[first:pos + 1], np.arange(first, pos + 1), num_kv_heads, dim)
    return _attend(q[None], k, v, np.ones((1, len(k)), dtype=bool), sm_scale)[0][0]


# ---------------------------------------------------------------------------


class NumpyBackend:
    name = "numpy"

    def __init__(self, num_pages, page_size, num_kv_heads, dim):
        self.cache = np.zeros((num_pages, 2, page_size, num_kv_heads, dim))
        self.to = lambda a: a

    def array(self, x):
        return x

    def host(self, x):
        return np.asarray(x)

    def copy_page(self, src, dst, entries):
        self.cache[dst, :, :entries] = self.cache[src, :, :entries]

    append_paged_kv_cache = staticmethod(append_paged_kv_cache)
    Decode, Prefill, Cascade = (BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper,
                                MultiLevelCascadeAttentionWrapper)


class FlashInferBackend:  # untested: needs a CUDA GPU, torch and flashinfer-python
    name = "flashinfer"

    def __init__(self, num_pages, page_size, num_kv_heads, dim):
        import flashinfer
        import torch
        self.torch, self.fi = torch, flashinfer
        self.dev = torch.device("cuda")
        self.cache = torch.zeros((num_pages, 2, page_size, num_kv_heads, dim), dtype=torch.float16, device=self.dev)
        self.workspace = torch.empty(128 << 20, dtype=torch.uint8, device=self.dev)
        self.to = lambda a: torch.from_numpy(a).to(self.dev)
        self.append_paged_kv_cache = flashinfer.append_paged_kv_cache
        ws = self.workspace
        self.Decode = lambda: flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
        self.Prefill = lambda: flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        self.Cascade = lambda n: flashinfer.MultiLevelCascadeAttentionWrapper(n, ws, "NHD")

    def array(self, x):
        return self.torch.from_numpy(np.ascontiguousarray(x)).to(self.dev, self.torch.float16)

    def host(self, x):
        return x.float().cpu().numpy()

    def copy_page(self, src, dst, entries):
        self.cache[dst, :, :entries] = self.cache[src, :, :entries]


def run_loop(backend="numpy", steps=80, seed=1, window=0, num_pages=20, page_size=4, heads=(4, 2), dim=8,
             verbose=False):
    """Runs the engine loop; returns a dict of counts and the largest error."""
    hq, hkv = heads
    be = (NumpyBackend if backend == "numpy" else FlashInferBackend)(num_pages, page_size, hkv, dim)
    tol = 1e-9 if backend == "numpy" else 2e-2
    rng = np.random.default_rng(seed)
    # Padded block tables too: the numpy backend also decodes from them
    # (trtllm_batch_decode_with_kv_cache) and must match the CSR decode bit
    # for bit.
    m = pagedkv.Manager(num_pages, page_size, window_tokens=window, hash_seed=seed, cascade_min_saved_pages=2,
                        block_tables_stride=num_pages)
    system = [list(range(10, 10 + 12)), list(range(50, 50 + 9))]  # two shared system prompts
    waiting, running = [], []  # running: ids in admission order
    target = {}  # request id -> total tokens at which it finishes
    next_id = 1
    counts = dict(steps=0, rows=0, decode=0, prefill=0, cascade=0, copies=0, preempted=0, forks=0, finished=0,
                  padded_decode=0, padded_mismatch=0)
    max_err = 0.0
    sm_scale = 1 / math.sqrt(dim)
    wl = window - 1 if window else -1

    for _ in range(steps):
        # Admit new requests now and then.
        if len(running) + len(waiting) < 8 and rng.random() < 0.6:
            prompt = system[rng.integers(2)] + [int(t) for t in rng.integers(100, 200, rng.integers(1, 9))]
            m.add(next_id, prompt)
            running.append(next_id)
            target[next_id] = len(prompt) + int(rng.integers(2, 24))
            next_id += 1
        # Resume a preempted request when the pool has room.
        if waiting and m.stats().free_pages + m.stats().evictable_pages > num_pages // 3:
            rid = waiting.pop(0)
            m.resume(rid)
            running.append(rid)
        # Fork a decoding request now and then (parallel sampling).
        if running and rng.random() < 0.1:
            parent = running[int(rng.integers(len(running)))]
            st = m.request_state(parent)
            if st.num_tokens - st.computed == 1:  # decoding
                m.fork(parent, next_id)
                target[next_id] = target[parent] + 2
                running.append(next_id)
                next_id += 1
                counts["forks"] += 1

        # Schedule: every running request with known tokens left; prefill in chunks.
        ids, nt = [], []
        for rid in running:
            st = m.request_state(rid)
            left = st.num_tokens - st.computed
            if left:
                ids.append(rid)
                nt.append(min(left, 6))
        if not ids:
            continue
        while True:
            try:
                plan = m.reserve(ids, nt)
                break
            except pagedkv.OutOfPages:
                victim = running.pop()  # the newest goes back to the queue
                m.preempt(victim)
                waiting.append(victim)
                counts["preempted"] += 1
                if victim in ids:
                    i = ids.index(victim)
                    del ids[i], nt[i]
                if not ids:
                    plan = None
                    break
        if plan is None:
            continue

        # The forward pass: copies, append, attention.
        for src, dst, entries in plan.copies.tolist():
            be.copy_page(src, dst, entries)
        counts["copies"] += len(plan.copies)
        k, v = kv_of(plan.token_ids, plan.token_positions, hkv, dim)
        be.append_paged_kv_cache(be.array(k), be.array(v), paged_kv_cache=be.cache, **fi.append_kwargs(plan, to=be.to))
        q = q_of(plan.token_ids, plan.token_positions, hq, dim)
        kind = fi.attention_kind(plan)
        counts[kind] += 1
        if kind == "decode":
            w = be.Decode()
            w.plan(**fi.decode_plan_kwargs(plan, hq, hkv, dim, page_size, to=be.to, sm_scale=sm_scale))
            out = be.host(w.run(be.array(q), be.cache))
            if backend == "numpy":
                padded = trtllm_batch_decode_with_kv_cache(q, be.cache, None, bmm1_scale=sm_scale, kv_layout="NHD",
                                                           **fi.trtllm_decode_kwargs(plan))
                counts["padded_decode"] += 1
                counts["padded_mismatch"] += int(not np.array_equal(padded, out))
        elif kind == "prefill":
            w = be.Prefill()
            w.plan(**fi.prefill_plan_kwargs(plan, hq, hkv, dim, page_size, to=be.to, sm_scale=sm_scale))
            out = be.host(w.run(be.array(q), be.cache))
        else:
            w = be.Cascade(len(plan.cascade))
            w.plan(**fi.cascade_plan_kwargs(plan, hq, hkv, dim, page_size, to=be.to, sm_scale=sm_scale))
            rows = plan.query_rows
            out = np.empty(q.shape)
            out[rows] = be.host(w.run(be.array(q[rows]), be.cache))

        # Check every row against dense attention over the whole sequence.
        qo = plan.qo_indptr
        for b, rid in enumerate(ids):
            tokens = m.tokens(rid)
            for i in range(qo[b], qo[b + 1]):
                want = dense(tokens, int(plan.token_positions[i]), q[i], hkv, dim, wl, sm_scale)
                max_err = max(max_err, float(np.abs(out[i] - want).max()))
        counts["rows"] += plan.nnz

        # Sample: the next token is a function of the request, so forks diverge.
        sampled = []
        for b, rid in enumerate(ids):
            st = m.request_state(rid)
            if st.computed + nt[b] == st.num_tokens and st.num_tokens < target[rid]:
                sampled.append(int(300 + (rid * 7 + st.num_tokens) % 50))
            else:
                sampled.append(pagedkv.NO_TOKEN)
        m.commit(sampled)
        m.audit()
        counts["steps"] += 1
        for rid in list(running):
            st = m.request_state(rid)
            if st.computed == st.num_tokens and st.num_tokens >= target[rid]:
                m.release(rid)
                running.remove(rid)
                counts["finished"] += 1
        if verbose:
            print("step %d: %s %d rows, max error %.2e" % (counts["steps"], kind, plan.nnz, max_err))

    counts["max_error"] = max_err
    counts["ok"] = max_err <= tol and counts["padded_mismatch"] == 0
    counts["stats"] = m.stats()
    m.close()
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("numpy", "flashinfer"), default="numpy")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--window", type=int, default=0, help="sliding window in tokens (0: full attention)")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    r = run_loop(a.backend, a.steps, a.seed, a.window, verbose=a.verbose)
    s = r.pop("stats")
    print("engine loop (%s): %s" % (a.backend, ", ".join("%s %s" % kv for kv in r.items())))
    print("hit rate %.2f, %d pages copied, %d preemptions" % (s.hit_rate, s.copied_pages, s.preemptions))
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
