"""Plan arrays: zero-copy numpy int32 views that stay valid and unchanged
exactly until the next successful reserve() or close() (docs/c-abi.md)."""

import gc

import numpy as np
import pytest

import pagedkv
from conftest import plan_values

ARRAYS = ("qo_indptr", "batch_indices", "positions", "token_ids", "token_positions", "kv_indptr",
          "kv_page_indices", "kv_last_page_len", "seq_lens")


def decoding_manager(n=4):
    m = pagedkv.Manager(256, 4, hash_seed=1)
    for i in range(1, n + 1):
        m.add(i, list(range(10 * i, 10 * i + 9)))
    m.reserve(list(range(1, n + 1)), [9] * n)
    m.commit([1] * n)
    return m


CASCADE_PROMPT = list(range(100, 132))


def cascade_step(num_pages):
    """Four requests that share a 32-token cached prompt prefill 5 tokens
    each (docs/manager.md's example): the manager and the cascade plan."""
    m = pagedkv.Manager(num_pages, 4, hash_seed=1)
    m.add(1, CASCADE_PROMPT + [1])
    m.reserve([1], [33])
    m.commit(None)
    for i in range(2, 6):
        assert m.add(i, CASCADE_PROMPT + [i] * 5) == 32
    return m, m.reserve([2, 3, 4, 5], [5, 5, 5, 5])


def test_views_are_zero_copy_int32_and_torch_ready():
    m = decoding_manager()
    plan = m.reserve([1, 2, 3, 4], [1, 1, 1, 1])
    words = m._plan_words.tolist()  # the C struct pagedkv_reserve filled
    for i, name in enumerate(("copies",) + ARRAYS):
        a = getattr(plan, name)
        assert a.dtype == np.int32 and a.flags.c_contiguous and a.flags.writeable, name
        data, n, cap = words[3 + 3 * i: 6 + 3 * i]
        if name == "copies":
            assert a.size == n == 0
            continue
        # The view is the Manager's buffer itself, not a copy.
        assert a.__array_interface__["data"][0] == data, name
        assert a.size == n <= cap, name
    assert plan.kv_indptr.tolist() == [0, 3, 6, 9, 12]
    assert plan.kv_last_page_len.tolist() == [2, 2, 2, 2]  # 10 tokens on pages of 4
    m.commit(None)
    m.close()


def test_arrays_survive_every_call_but_reserve():
    m = decoding_manager()
    plan = m.reserve([1, 2], [1, 1])
    want = plan_values(plan)
    views = [getattr(plan, a) for a in ARRAYS]

    def same():
        assert plan.valid
        assert plan_values(plan) == want
        assert [v.tolist() for v in views] == [want[a] for a in ARRAYS]

    for fn, args in [(m.stats, ()), (m.audit, ()), (m.commit, ([5, 6],)), (m.add, (9, list(range(90, 130)))),
                     (m.extend, (3, [4, 4])), (m.fork, (1, 10)), (m.preempt, (2,)), (m.resume, (2,)),
                     (m.release, (10,)), (m.evict, (100,)), (m.pin, (list(range(10, 18)),)),
                     (m.request_state, (1,)), (m.tokens, (1,)), (m.pages, (1,))]:
        fn(*args)
        same()
    # Failed calls, a failed reserve included, leave them alone too.
    for fn, args, exc in [(m.reserve, ([1, 1], [1, 1]), pagedkv.BadArgument),
                          (m.reserve, ([9], [10 ** 6]), pagedkv.BadArgument),
                          (m.reserve, ([77], [1]), pagedkv.UnknownRequest),
                          (m.commit, ([1],), pagedkv.NoStep)]:
        with pytest.raises(exc):
            fn(*args)
        same()
    # Go garbage and Python garbage: the pinned buffers stay.
    for i in range(100, 300):
        m.add(i, list(range(1000, 1400)), no_cache=True)
        m.release(i)
    gc.collect()
    same()

    # The next successful reserve ends them: the plan says so, and the same
    # buffer now holds the new step (the views were never copies).
    nxt = m.reserve([3], [2])
    assert not plan.valid and nxt.valid
    if views[0].__array_interface__["data"][0] == nxt.qo_indptr.__array_interface__["data"][0]:
        assert views[0][:2].tolist() == nxt.qo_indptr.tolist() == [0, 2]
    with pytest.raises(pagedkv.StalePlan, match="after the successful reserve of step"):
        plan.copy()
    m.abort()
    m.close()


def test_copy_outlives_the_step_and_close():
    m = decoding_manager()
    plan = m.reserve([1, 2, 3], [1, 1, 1])
    kept = plan.copy()
    want = plan_values(plan)
    m.commit(None)
    m.reserve([4], [1])
    m.close()
    assert not plan.valid
    assert plan_values(kept) == want
    assert all(getattr(kept, a).base is None or getattr(kept, a).flags.owndata for a in ARRAYS)


def test_cascade_levels_and_query_rows():
    # Four requests share a 32-token cached prompt and prefill 5 tokens each
    # (docs/manager.md's example).
    m, plan = cascade_step(64)
    assert plan.cascade is not None and len(plan.cascade) == 2
    l0, l1 = plan.cascade
    assert l0.qo_indptr.tolist() == [0, 20] and l0.kv_indptr.tolist() == [0, 8]
    assert l0.kv_indices.tolist() == m.pages(1)[:8].tolist() and l0.kv_last_page_len.tolist() == [4]
    assert l1.qo_indptr.tolist() == [0, 5, 10, 15, 20] and l1.kv_indptr.tolist() == [0, 2, 4, 6, 8]
    assert l1.kv_last_page_len.tolist() == [1, 1, 1, 1]
    assert sorted(plan.query_rows.tolist()) == list(range(20))
    # A flat step right after: no cascade, and the plan says so.
    m.commit(None)
    flat = m.reserve([2], [0])
    assert flat.cascade is None and flat.query_rows is None
    m.abort()
    m.close()


def test_a_view_keeps_its_manager_alive():
    m = decoding_manager()
    plan = m.reserve([1, 2], [1, 1])
    kv = plan.kv_page_indices
    want = kv.tolist()
    handle = m._handle
    del m, plan
    gc.collect()
    # The Manager was not destroyed behind the view's back: its handle
    # still answers, and the view still holds the step.
    assert pagedkv._lib.pagedkv_audit(handle) == 0
    assert kv.tolist() == want


def test_cascade_arrays_survive_out_of_pages_and_the_other_calls():
    """A cascade plan's arrays (levels and query_rows included) stay
    unchanged through the calls test_arrays_survive_every_call_but_reserve
    does not make: abort, truncate, unpin, a speculative step's failures,
    and failed reserves that get as far as allocating (OutOfPages)."""
    m, plan = cascade_step(40)
    assert plan.cascade is not None
    want = plan_values(plan)
    views = [plan.query_rows] + [getattr(lv, f) for lv in plan.cascade for f in pagedkv.Level.__slots__]
    want_views = [v.tolist() for v in views]

    def same():
        assert plan.valid
        assert plan_values(plan) == want
        assert [v.tolist() for v in views] == want_views

    m.abort()
    same()
    pin, _ = m.pin(CASCADE_PROMPT)
    same()
    m.unpin(pin)
    same()
    m.extend(1, [7, 8, 9])
    m.truncate(1, 34)
    same()
    m.add(6, list(range(500, 700)))  # 50 pages: more than the pool
    for fn, args, exc in [(m.reserve, ([2, 3, 4, 5, 6], [5, 5, 5, 5, 200]), pagedkv.OutOfPages),
                          (m.reserve_spec, ([6], [200], [[1, 2]]), pagedkv.OutOfPages),
                          (m.reserve_spec, ([2], [5], [[-1]]), pagedkv.BadArgument),
                          (m.commit_spec, ([0], [1]), pagedkv.NoStep),
                          (m.abort, (), pagedkv.NoStep),
                          (m.truncate, (2, 99), pagedkv.BadArgument)]:
        with pytest.raises(exc):
            fn(*args)
        same()
    nxt = m.reserve([2, 3, 4, 5], [5, 5, 5, 5])
    assert not plan.valid and nxt.valid and nxt.cascade is not None
    m.abort()
    m.close()
