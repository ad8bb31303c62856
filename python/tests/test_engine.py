"""Randomized engine loops through the Python package.

test_engine_loop_attention runs tools/engine_loop.py (numpy reference
attention with FlashInfer's signatures, checked against dense attention;
decode steps also run from the padded block_tables and must agree bit for
bit).
test_random_loop_fake_kv drives adds with shared prompts, chunked steps,
preemption, forks, resume and release with its own random choices, keeps a
fake K/V store written at the plan's append positions (after the plan's
copies), and after every operation checks that every running request's
pages reproduce its tokens, that audit() passes, and that each of a set of
calls that must fail raised the right error and changed nothing.
"""

import random

import numpy as np
import pytest

import engine_loop
import pagedkv
from conftest import snapshot


@pytest.mark.parametrize("seed,window", [(1, 0), (2, 0), (3, 10), (4, 7)])
def test_engine_loop_attention(seed, window):
    r = engine_loop.run_loop("numpy", steps=60, seed=seed, window=window)
    assert r["ok"], r
    assert r["rows"] > 200 and r["finished"] > 5
    kinds = ("cascade",) if window == 0 else ("decode", "prefill")
    for k in kinds:
        assert r[k] > 0, r
    assert r["preempted"] > 0 and r["forks"] > 0, r
    # Decode steps also ran trtllm_batch_decode_with_kv_cache over the
    # plan's padded block_tables, equal bit for bit (r["ok"] requires it).
    assert r["padded_mismatch"] == 0 and r["padded_decode"] == r["decode"], r


def fake(tok, pos):
    return (int(tok) << 20) | (pos + 1)


class Harness:
    def __init__(self, seed, window):
        self.rng = random.Random(seed)
        self.ps, self.pages = 4, 24
        self.m = pagedkv.Manager(self.pages, self.ps, window_tokens=window, hash_seed=seed, max_pinned_pages=4,
                                 cascade_min_saved_pages=1)
        self.kv = np.zeros((self.pages, self.ps), dtype=np.int64)
        self.next = 1
        self.plan = None
        self.failed_calls = 0

    def ids(self):
        return [i for i in range(1, self.next) if self.m.has(i)]

    def running(self):
        return [i for i in self.ids() if self.m.request_state(i).running]

    def check(self):
        m = self.m
        m.audit()
        for rid in self.running():
            st = m.request_state(rid)
            toks = m.tokens(rid)
            pages = m.pages(rid)
            for pos in range(st.start, st.computed):
                k = pos - st.start
                got = self.kv[pages[k // self.ps], k % self.ps]
                assert got == fake(toks[pos], pos), "request %d token %d: page %d holds %x" % (
                    rid, pos, pages[k // self.ps], got)

    def must_fail(self, exc, fn, *args):
        before = snapshot(self.m, self.ids(), self.plan if self.plan is not None and self.plan.valid else None)
        with pytest.raises(exc):
            fn(*args)
        assert snapshot(self.m, self.ids(), self.plan if self.plan is not None and self.plan.valid else None) == before
        self.failed_calls += 1

    def family(self, f, n):
        return [7] * 4 + [20 + f // 2] * 4 + [40 + f] * max(0, n - 8)

    def step(self):
        m, rng = self.m, self.rng
        ids, nt = [], []
        for rid in self.running():
            st = m.request_state(rid)
            left = st.num_tokens - st.computed
            if left and rng.random() < 0.8:
                ids.append(rid)
                nt.append(rng.randint(1, min(left, 6)))
        try:
            plan = m.reserve(ids, nt)
        except pagedkv.OutOfPages:
            self.must_fail(pagedkv.OutOfPages, m.reserve, ids, nt)
            m.preempt(self.rng.choice(self.running()))
            return
        self.plan = plan
        # Calls that must fail while a step is pending.
        if ids:
            self.must_fail(pagedkv.StepPending, m.release, ids[0])
            self.must_fail(pagedkv.BadArgument, m.commit, [0] * (len(ids) + 1))
        for src, dst, n in plan.copies.tolist():
            self.kv[dst, :n] = self.kv[src, :n]
        for i in range(plan.nnz):
            b = plan.batch_indices[i]
            pos = plan.positions[i]
            page = plan.kv_page_indices[plan.kv_indptr[b] + pos // self.ps]
            self.kv[page, pos % self.ps] = fake(plan.token_ids[i], int(plan.token_positions[i]))
        if rng.random() < 0.1:
            m.abort()
            return
        sampled = []
        for b, rid in enumerate(ids):
            st = m.request_state(rid)
            done = st.computed + nt[b] == st.num_tokens
            sampled.append(rng.randint(0, 60) if done and st.num_tokens < 40 else pagedkv.NO_TOKEN)
        m.commit(sampled)

    def op(self):
        m, rng = self.m, self.rng
        k = rng.random()
        run = self.running()
        pre = [i for i in self.ids() if i not in run]
        if k < 0.2:
            m.add(self.next, self.family(rng.randrange(6), rng.randint(3, 20)), priority=rng.randrange(2))
            self.next += 1
        elif k < 0.65:
            self.step()
        elif k < 0.72 and run:
            m.fork(rng.choice(run), self.next)
            self.next += 1
        elif k < 0.8 and run:
            m.preempt(rng.choice(run))
        elif k < 0.88 and pre:
            try:
                m.resume(rng.choice(pre))
            except pagedkv.PagedKVError:
                raise
        elif k < 0.94 and self.ids():
            m.release(rng.choice(self.ids()))
        elif k < 0.97:
            m.evict(rng.randint(0, 3))
        else:
            # Calls that must fail at any time.
            self.must_fail(pagedkv.UnknownRequest, m.release, 10 ** 6)
            self.must_fail(pagedkv.NoStep, m.abort)
            if run:
                self.must_fail(pagedkv.RequestExists, m.add, run[0], [1])
                self.must_fail(pagedkv.NotPreempted, m.resume, run[0])
                self.must_fail(pagedkv.BadArgument, m.reserve, [run[0], run[0]], [0, 0])
            if pre:
                self.must_fail(pagedkv.Preempted, m.reserve, [pre[0]], [1])
                self.must_fail(pagedkv.Preempted, m.fork, pre[0], 10 ** 6)
        self.check()


@pytest.mark.parametrize("seed,window", [(1, 0), (2, 0), (3, 6), (4, 9)])
def test_random_loop_fake_kv(seed, window):
    h = Harness(seed, window)
    for _ in range(300):
        h.op()
    s = h.m.stats()
    assert s.steps > 30 and s.prompt_hit_tokens > 0 and s.preemptions > 0, s
    assert h.failed_calls > 30
    h.m.close()
