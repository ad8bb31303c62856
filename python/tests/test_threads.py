"""A Manager used from two threads at once: every call either returns
results that belong to it or raises (Busy, StepPending, NoStep, StalePlan),
never another call's results (docs/c-abi.md, "Threads").

Two threads share one Manager. Each owns its own requests, never commits
them, and loops: abort (whoever's step is pending), reserve its own
requests, copy the plan, inspect one of its requests, add and release a
probe request whose prefix the cache holds. The Manager's state is the
same before every successful reserve, so each thread's plan is known in
advance (its page numbers aside); the checker compares every plan,
request state and add() result a thread receives with that thread's
expectation.

The checker caught the wrapper of 82375d1, which read the shared plan
buffer after the C call returned, so another thread's reserve could fill
it in between; docs/c-abi-testing.md says how to run this file against that
wrapper (PAGEDKV_PYTHON_DIR). PAGEDKV_STRESS_SECONDS sets how long the
threads run (default 3).
"""

import os
import threading
import time

import pytest

import pagedkv
from conftest import plan_values

# The fields of a plan that do not depend on which pages the allocator hands out.
PAGE_FREE_FIELDS = ("drafts", "qo_indptr", "batch_indices", "positions", "token_ids", "token_positions", "kv_indptr",
                    "kv_last_page_len", "seq_lens", "window_left")

# What raises instead of returning another call's results. The wrapper of
# 82375d1 has no StalePlan; its copy() raised BadArgument for a stale plan.
STALE = getattr(pagedkv, "StalePlan", pagedkv.BadArgument)
REFUSED = (pagedkv.Busy, pagedkv.StepPending, pagedkv.NoStep, STALE)


class Owner:
    """One thread's requests and what every call on them must return."""

    def __init__(self, name, prompts, probe_id, cached):
        self.name = name
        self.prompts = prompts  # request id -> prompt
        # A request added and released again and again: add() must return
        # how much of it the cache holds, this thread's own number.
        self.probe_id, self.cached, self.probe = probe_id, cached, cached + [1]
        self.want_matched = None
        self.ids = sorted(prompts)
        self.ntokens = [len(prompts[i]) for i in self.ids]
        self.want_plan = None
        self.want_states = {}
        self.checked = self.refused = 0
        self.mismatches = []

    def expect(self, m):
        """Records the plan and request states of a reserve on a quiet Manager."""
        plan = m.reserve(self.ids, self.ntokens)
        self.want_plan = plan_facts(plan.copy())
        m.abort()
        self.want_states = {rid: state_facts(m.request_state(rid)) for rid in self.ids}
        m.add(self.probe_id, self.cached)  # computed and released: its full pages stay cached
        m.reserve([self.probe_id], [len(self.cached)])
        m.commit(None)
        m.release(self.probe_id)
        self.want_matched = m.add(self.probe_id, self.probe)
        m.release(self.probe_id)

    def check_matched(self, matched):
        if matched != self.want_matched:
            self.mismatches.append("%s got add() = %d for its probe, want %d" % (self.name, matched, self.want_matched))

    def release_probe(self, m):
        """Releases the probe, aborting the other thread's step if need be."""
        for _ in range(100000):
            try:
                m.release(self.probe_id)
                return
            except pagedkv.Busy:
                time.sleep(0)
            except pagedkv.StepPending:
                try:
                    m.abort()
                except REFUSED:
                    pass
        raise AssertionError("%s could not release its probe request %d" % (self.name, self.probe_id))

    def check_plan(self, plan):
        got = plan_facts(plan)
        if got != self.want_plan:
            diff = ["%s %s, want %s" % (k, got[k], self.want_plan[k]) for k in got if got[k] != self.want_plan[k]]
            self.mismatches.append("%s got a plan with %s" % (self.name, "; ".join(diff)))

    def check_state(self, rid, state):
        got = state_facts(state)
        if got != self.want_states[rid]:
            self.mismatches.append("%s got %r for request %d, want %r" % (self.name, got, rid, self.want_states[rid]))

    def run(self, m, stop):
        turn = 0
        while time.monotonic() < stop:
            turn += 1
            try:
                m.abort()  # the other thread's step, or our own
            except REFUSED:
                pass
            try:
                plan = m.reserve(self.ids, self.ntokens)
                self.check_plan(plan.copy())
                rid = self.ids[turn % len(self.ids)]
                self.check_state(rid, m.request_state(rid))
                self.checked += 1
            except REFUSED:
                self.refused += 1
            try:
                m.abort()  # the step just reserved, or the other thread's: add() needs none pending
            except REFUSED:
                pass
            try:
                matched = m.add(self.probe_id, self.probe)
            except REFUSED:
                self.refused += 1
            else:
                self.check_matched(matched)
                self.release_probe(m)
            # Between its calls an engine thread does other work; here it
            # only lets the other thread run, or it would rarely find the
            # Manager free (a call that finds it in use raises Busy).
            time.sleep(0)


def plan_facts(plan):
    if hasattr(plan, "groups"):  # a HybridPlan: each group's facts
        return dict(request_ids=plan.request_ids.tolist(), groups=[plan_facts(g) for g in plan.groups])
    values = plan_values(plan)
    facts = {name: values[name] for name in PAGE_FREE_FIELDS}
    facts.update(request_ids=plan.request_ids.tolist(), batch_size=plan.batch_size, nnz=plan.nnz)
    return facts


def state_facts(state):
    """A request state without num_pages, which depends on whether a step is
    pending (the other thread may abort ours at any time)."""
    return dict(running=state.running, computed=state.computed, num_tokens=state.num_tokens, start=state.start)


def owners():
    # Different batch sizes and lengths, distinct tokens: no plan of one
    # owner can pass for the other's.
    a = Owner("thread A", {1: list(range(1000, 1010)), 2: list(range(2000, 2007))}, 100, list(range(3000, 3008)))
    b = Owner("thread B", {11: list(range(5000, 5005)), 12: list(range(6000, 6009)), 13: list(range(7000, 7003))},
              200, list(range(8000, 8004)))
    return a, b


def new_manager(a, b, kind="dense"):
    if kind == "dense":
        m = pagedkv.Manager(256, 4, hash_seed=1)
    else:
        if not hasattr(pagedkv, "HybridManager"):
            pytest.skip("this wrapper (PAGEDKV_PYTHON_DIR) has no HybridManager")
        m = pagedkv.HybridManager(256, 4, [pagedkv.LayerGroup("sliding", window_tokens=6), pagedkv.LayerGroup("full")],
                                  hash_seed=1)
    for owner in (a, b):
        for rid in owner.ids:
            m.add(rid, owner.prompts[rid])
    for owner in (a, b):
        owner.expect(m)
    return m


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
def test_two_threads_get_only_their_own_results(kind):
    a, b = owners()
    m = new_manager(a, b, kind)
    seconds = float(os.environ.get("PAGEDKV_STRESS_SECONDS", "3"))
    stop = time.monotonic() + seconds
    errors = []

    def run(owner):
        try:
            owner.run(m, stop)
        except Exception as e:  # anything but a refusal fails the test
            errors.append("%s: %r" % (owner.name, e))

    threads = [threading.Thread(target=run, args=(o,)) for o in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("%.1f s: A checked %d, refused %d; B checked %d, refused %d"
          % (seconds, a.checked, a.refused, b.checked, b.refused))
    assert not errors
    mismatches = a.mismatches + b.mismatches
    assert not mismatches, "%d results of another call, the first: %s" % (len(mismatches), mismatches[0])
    # Both threads got through, so the check had something to check.
    assert a.checked > 0 and b.checked > 0, (a.checked, b.checked)
    try:
        m.abort()
    except pagedkv.NoStep:
        pass
    m.audit()
    m.close()


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
def test_the_checker_sees_another_threads_plan(kind):
    """The checker is not blind: a plan with A's request ids and B's arrays
    (what the old wrapper returned) is a mismatch, and so is B's state."""
    a, b = owners()
    m = new_manager(a, b, kind)
    mixed = dict(b.want_plan, request_ids=a.want_plan["request_ids"])
    assert mixed != a.want_plan
    plan = m.reserve(a.ids, a.ntokens)
    a.check_plan(plan)
    assert a.mismatches == []
    assert (a.want_matched, b.want_matched) == (8, 4)
    a.want_plan, a.want_states[1] = mixed, b.want_states[12]
    a.check_plan(plan)
    a.check_state(1, m.request_state(1))
    a.check_matched(b.want_matched)
    assert len(a.mismatches) == 3
    m.abort()
    m.close()


def test_a_plan_raises_once_its_step_has_passed():
    m = pagedkv.Manager(64, 4, hash_seed=1)
    m.add(1, list(range(10)))
    m.add(2, list(range(20, 30)))
    plan = m.reserve([1], [10])
    kept = plan.copy()
    m.commit(None)  # the arrays stay valid after commit (docs/c-abi.md)
    assert plan.valid and plan.kv_indptr.tolist() == [0, 3]
    nxt = m.reserve([2], [10])  # the next reserve ends the plan
    assert not plan.valid and nxt.valid
    for name in pagedkv._PLAN_FIELDS:
        with pytest.raises(pagedkv.StalePlan, match=r"plan\.%s: the plan of step 1 was read after the successful "
                                                    r"reserve of step 2" % name):
            getattr(plan, name)
    with pytest.raises(pagedkv.StalePlan, match="copy of the plan of step 1"):
        plan.copy()
    # A failed reserve does not end the current plan.
    with pytest.raises(pagedkv.StepPending):
        m.reserve([1], [1])
    assert nxt.valid and nxt.seq_lens.tolist() == [10]
    m.close()
    assert not nxt.valid
    with pytest.raises(pagedkv.StalePlan, match=r"plan\.seq_lens: .* after close\(\) of its Manager"):
        nxt.seq_lens
    # An owned copy is current forever.
    assert kept.valid and kept.kv_indptr.tolist() == [0, 3] and kept.copy().request_ids.tolist() == [1]


def test_plan_currency_matches_a_model():
    """Random steps, failed calls among them, against the obvious model: a
    plan is current exactly until the next successful reserve or
    reserve_spec, or close(). A current plan reads the values it was
    reserved with; every other raises StalePlan on every property."""
    import random

    for seed in range(20):
        rng = random.Random(seed)
        m = pagedkv.Manager(64, 4, hash_seed=1)
        ids = [1, 2, 3]
        for rid in ids:
            m.add(rid, [rng.randrange(100) for _ in range(rng.randrange(1, 12))])
        held = []  # (plan, its step in the model, its values when reserved)
        spec = None  # the batch of a pending speculative step
        step = 0  # the model's current step: plans of other steps are stale
        for _ in range(60):
            op = rng.choice(["reserve", "reserve_spec", "bad_reserve", "commit", "abort", "other"])
            try:
                plan = None
                if op == "reserve":
                    batch = rng.sample(ids, rng.randrange(1, 4))
                    plan, spec = m.reserve(batch, [1] * len(batch)), None
                elif op == "reserve_spec":
                    batch = rng.sample(ids, rng.randrange(1, 4))
                    plan, spec = m.reserve_spec(batch, [1] * len(batch), [[5] * rng.randrange(3) for _ in batch]), batch
                elif op == "bad_reserve":
                    m.reserve([99], [1])  # UnknownRequest (or StepPending): fails, changes nothing
                elif op == "commit" and spec:
                    m.commit_spec([0] * len(spec))
                elif op == "commit":
                    m.commit(None)
                elif op == "abort":
                    m.abort()
                else:
                    m.stats(), m.audit(), m.request_state(ids[0])
            except (pagedkv.StepPending, pagedkv.NoStep, pagedkv.UnknownRequest, pagedkv.BadArgument,
                    pagedkv.OutOfPages):
                plan = None
            if plan is not None:
                step += 1
                held.append((plan, step, plan_values(plan)))
            for p, s, values in held:
                assert p.valid == (s == step), (seed, op, s, step)
                if s == step:
                    assert plan_values(p) == values, (seed, op)
                else:
                    with pytest.raises(pagedkv.StalePlan):
                        p.kv_indptr
                    with pytest.raises(pagedkv.StalePlan):
                        p.copy()
        m.close()
        for p, _, _ in held:
            assert not p.valid
            with pytest.raises(pagedkv.StalePlan, match="close"):
                p.seq_lens
