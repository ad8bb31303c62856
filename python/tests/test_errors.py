"""Every error kind: the Python exception it maps to, a message naming the
bad value, and a Manager left exactly as it was (stats, pending flag, every
request's state, tokens and pages, and the last plan's arrays)."""

import ctypes
import os
import re
import threading
import time

import numpy as np
import pytest

import pagedkv
from conftest import ROOT, snapshot

IDS = range(1, 12)


def test_every_c_error_code_has_its_exception():
    with open(os.path.join(ROOT, "cabi", "pagedkv.h")) as f:
        header = f.read()
    codes = dict((name, int(v)) for name, v in re.findall(r"PAGEDKV_ERR_(\w+) = (\d+)", header))
    assert len(codes) == 17
    names = {
        "OUT_OF_PAGES": pagedkv.OutOfPages, "UNKNOWN_REQUEST": pagedkv.UnknownRequest,
        "REQUEST_EXISTS": pagedkv.RequestExists, "PREEMPTED": pagedkv.Preempted,
        "NOT_PREEMPTED": pagedkv.NotPreempted, "STEP_PENDING": pagedkv.StepPending, "NO_STEP": pagedkv.NoStep,
        "BAD_ARGUMENT": pagedkv.BadArgument, "BAD_CONFIG": pagedkv.BadConfig, "NOT_CACHED": pagedkv.NotCached,
        "PIN_LIMIT": pagedkv.PinLimit, "UNKNOWN_PIN": pagedkv.UnknownPin, "BAD_HANDLE": pagedkv.BadHandle,
        "BUSY": pagedkv.Busy, "AUDIT": pagedkv.AuditError, "INTERNAL": pagedkv.InternalError,
        "LOADING": pagedkv.Loading,
    }
    assert set(names) == set(codes)
    for name, cls in names.items():
        assert cls.code == codes[name], name
        assert pagedkv._ERRORS[codes[name]] is cls
        assert issubclass(cls, pagedkv.PagedKVError)
    assert issubclass(pagedkv.BadArgument, ValueError) and issubclass(pagedkv.UnknownRequest, KeyError)


@pytest.fixture
def world():
    """8 pages of 4 tokens, at most 2 pinned: request 1 computed 10 tokens
    and sampled one (pages 0-1 cached), 2 reuses the prompt, 3 is a fork of
    1, 4 is preempted, and a plan is outstanding."""
    m = pagedkv.Manager(8, 4, hash_seed=1, max_pinned_pages=2)
    prompt = list(range(1, 11))
    m.add(1, prompt)
    m.reserve([1], [10])
    m.commit([7])
    m.add(2, prompt)
    m.fork(1, 3)
    m.add(4, prompt)
    m.preempt(4)
    m.extend(3, [1, 2, 3])
    m.extend(2, list(range(500, 540)))
    plan = m.reserve([2, 3], [2, 4])
    m.commit([pagedkv.NO_TOKEN, 11])
    plan = m.reserve([1], [0])
    m.abort()
    yield m, prompt, plan
    m.close()


def expect(m, plan, exc, needle, fn, *args, **kw):
    before = snapshot(m, IDS, plan)
    with pytest.raises(exc) as info:
        fn(*args, **kw)
    assert needle in str(info.value), "%s does not name %r" % (info.value, needle)
    assert type(info.value) is exc
    assert snapshot(m, IDS, plan) == before, "%s changed the manager" % fn.__name__


def test_request_errors(world):
    m, prompt, plan = world
    expect(m, plan, pagedkv.RequestExists, "request 1", m.add, 1, prompt)
    expect(m, plan, pagedkv.BadArgument, "prompt[1] = -9", m.add, 9, [5, -9])
    expect(m, plan, pagedkv.BadArgument, "priority 4, want 0..3", m.add, 9, prompt, priority=4)
    expect(m, plan, pagedkv.BadArgument, "priority = 300", m.add, 9, prompt, priority=300)
    expect(m, plan, pagedkv.BadArgument, "capacity_tokens = -2", m.add, 9, prompt, capacity_tokens=-2)
    expect(m, plan, pagedkv.BadArgument, "prompt[1] = 4294967296", m.add, 9, [1, 1 << 32])
    expect(m, plan, pagedkv.BadArgument, "dtype float64", m.add, 9, [1.5, 2.0])
    expect(m, plan, pagedkv.BadArgument, "request_id = -1", m.add, -1, prompt)
    expect(m, plan, pagedkv.BadArgument, "shape (2, 2)", m.add, 9, [[1, 2], [3, 4]])
    expect(m, plan, pagedkv.UnknownRequest, "request 9", m.extend, 9, [1])
    expect(m, plan, pagedkv.BadArgument, "tokens[1] = -9", m.extend, 1, [5, -9])
    expect(m, plan, pagedkv.UnknownRequest, "request 9", m.fork, 9, 10)
    expect(m, plan, pagedkv.RequestExists, "to 2", m.fork, 1, 2)
    expect(m, plan, pagedkv.Preempted, "request 4", m.fork, 4, 10)
    expect(m, plan, pagedkv.UnknownRequest, "request 9", m.preempt, 9)
    expect(m, plan, pagedkv.Preempted, "request 4", m.preempt, 4)
    expect(m, plan, pagedkv.UnknownRequest, "request 9", m.resume, 9)
    expect(m, plan, pagedkv.NotPreempted, "request 1", m.resume, 1)
    expect(m, plan, pagedkv.UnknownRequest, "request 9", m.release, 9)
    expect(m, plan, pagedkv.UnknownRequest, "request 9", m.request_state, 9)
    expect(m, plan, pagedkv.UnknownRequest, "request 9", m.tokens, 9)


def test_step_errors(world):
    m, prompt, plan = world
    expect(m, plan, pagedkv.NoStep, "commit", m.commit, [1])
    expect(m, plan, pagedkv.NoStep, "abort", m.abort)
    expect(m, plan, pagedkv.BadArgument, "ids[1] = 2 appears twice", m.reserve, [2, 2], [1, 1])
    expect(m, plan, pagedkv.UnknownRequest, "ids[1] = 9", m.reserve, [2, 9], [1, 1])
    expect(m, plan, pagedkv.Preempted, "ids[0] = 4", m.reserve, [4], [1])
    expect(m, plan, pagedkv.BadArgument, "ntokens[0] = 99", m.reserve, [2], [99])
    expect(m, plan, pagedkv.BadArgument, "ntokens[0] = -1", m.reserve, [2], [-1])
    expect(m, plan, pagedkv.BadArgument, "2 requests but 1 token counts", m.reserve, [2, 3], [1])
    expect(m, plan, pagedkv.BadArgument, "request_ids[0] = -3", m.reserve, [-3], [1])
    expect(m, plan, pagedkv.OutOfPages, "needs", m.reserve, [2], [40])
    p = m.reserve([2], [2])
    expect(m, p, pagedkv.StepPending, "reserve", m.reserve, [2], [1])
    expect(m, p, pagedkv.StepPending, "add request 9", m.add, 9, prompt)
    expect(m, p, pagedkv.StepPending, "extend", m.extend, 1, [1])
    expect(m, p, pagedkv.StepPending, "fork", m.fork, 1, 9)
    expect(m, p, pagedkv.StepPending, "preempt", m.preempt, 1)
    expect(m, p, pagedkv.StepPending, "resume", m.resume, 4)
    expect(m, p, pagedkv.StepPending, "release", m.release, 1)
    expect(m, p, pagedkv.BadArgument, "3 sampled tokens", m.commit, [1, 2, 3])
    expect(m, p, pagedkv.BadArgument, "0 sampled tokens", m.commit, [])
    expect(m, p, pagedkv.BadArgument, "sampled[0] = -5", m.commit, [-5])
    expect(m, p, pagedkv.BadArgument, "sampled[0] = 77", m.commit, [77])
    m.commit(None)
    m.audit()


def test_cache_errors(world):
    m, prompt, plan = world
    expect(m, plan, pagedkv.NotCached, "not cached", m.pin, [50, 51, 52, 53])
    expect(m, plan, pagedkv.NotCached, "not cached", m.pin, prompt[:8], tenant="other")
    pin, n = m.pin(prompt[:8])
    assert n == 8
    expect(m, plan, pagedkv.PinLimit, "limit 2", m.pin, m.tokens(3)[:12])
    expect(m, plan, pagedkv.UnknownPin, "pin", m.unpin, pin + 100)
    m.unpin(pin)
    expect(m, plan, pagedkv.UnknownPin, "pin", m.unpin, pin)
    expect(m, plan, pagedkv.BadArgument, "npages = -1", m.evict, -1)


def test_bad_config():
    for kw, needle in [(dict(num_pages=0, page_size=16), "0"), (dict(num_pages=-5, page_size=16), "-5"),
                       (dict(num_pages=64, page_size=0), "0"), (dict(num_pages=64, page_size=16, window_tokens=-3), "-3"),
                       (dict(num_pages=64, page_size=16, priorities=99), "99")]:
        with pytest.raises(pagedkv.BadConfig) as info:
            pagedkv.Manager(**kw)
        assert needle in str(info.value)
    with pytest.raises(pagedkv.BadArgument, match="num_pages = 1.5"):
        pagedkv.Manager(1.5, 16)
    with pytest.raises(pagedkv.BadArgument, match="hash_seed = -1"):
        pagedkv.Manager(8, 4, hash_seed=-1)


def test_bad_handle_after_close(world):
    m, prompt, plan = world
    m2 = pagedkv.Manager(8, 4)
    m2.add(1, [1, 2, 3])
    m2.close()
    m2.close()  # idempotent in Python
    # The error names the Manager by the handle it was made with, never "handle 0".
    for fn, args in [(m2.add, (2, [1])), (m2.audit, ()), (m2.stats, ()), (m2.reserve, ([1], [1])),
                     (m2.tier_stats, ()), (m2.host_pages, ()), (m2.events_endpoint, ())]:
        with pytest.raises(pagedkv.BadHandle) as e:
            fn(*args)
        assert str(e.value) == "pagedkv: %s: Manager %d is closed" % (fn.__name__, m2._id)
    assert repr(m2) == "<pagedkv.Manager %d: num_pages=8, page_size=4, closed>" % m2._id
    # A raw destroyed handle, through the C ABI.
    assert pagedkv._lib.pagedkv_destroy(m2._handle or 123456789) == pagedkv.BadHandle.code


def test_internal_error_poisons_the_handle_only():
    m = pagedkv.Manager(8, 4)
    other = pagedkv.Manager(8, 4)
    m.add(1, [1, 2, 3])
    before = m.stats()
    with pytest.raises(pagedkv.InternalError, match="pagedkv_debug_panic was called"):
        m._check(pagedkv._lib.pagedkv_debug_panic(m._handle))
    with pytest.raises(pagedkv.InternalError, match="poisoned"):
        m.audit()
    with pytest.raises(pagedkv.InternalError, match="poisoned"):
        m.add(2, [1])
    assert m.stats() == before  # stats still answer
    other.add(1, [1, 2, 3])  # other handles are unaffected
    other.audit()
    m.close()
    other.close()


def test_busy_on_concurrent_use_and_stats_from_any_thread():
    # A big manager so that audit() takes a while.
    m = pagedkv.Manager(8192, 4)
    for i in range(1, 401):
        m.add(i, list(range(i % 7, i % 7 + 40)))
    plan = m.reserve(list(range(1, 401)), [40] * 400)
    m.commit(None)
    before = snapshot(m, IDS, plan)
    stop = time.monotonic() + 10
    busy, other, stats_errors = [], [], []

    def auditor():
        while not busy and time.monotonic() < stop:
            try:
                m.audit()
            except pagedkv.Busy as e:  # this thread came second
                busy.append(e)

    def stats_reader():
        while not busy and time.monotonic() < stop:
            try:
                m.stats()
            except pagedkv.PagedKVError as e:  # never: stats may run on any thread
                stats_errors.append(e)

    threads = [threading.Thread(target=auditor), threading.Thread(target=stats_reader)]
    for t in threads:
        t.start()
    while not busy and time.monotonic() < stop:
        try:
            m.add(1, [1])  # fails either way: RequestExists, or Busy while the audit runs
        except pagedkv.Busy as e:
            busy.append(e)
        except pagedkv.RequestExists as e:
            other.append(e)
    for t in threads:
        t.join()
    assert busy, "no Busy in 10 s of concurrent calls"
    assert "in use by another thread" in str(busy[0])
    assert not stats_errors
    assert snapshot(m, IDS, plan) == before
    m.audit()
    m.close()


def test_no_pointer_is_kept_after_a_call():
    """Inputs are copied: changing or freeing them after the call changes
    nothing in the Manager."""
    m = pagedkv.Manager(16, 4, hash_seed=1)
    prompt = np.arange(20, 30, dtype=np.int32)
    m.add(1, prompt)
    m.extend(1, prompt[:3])
    prompt[:] = 0
    assert m.tokens(1).tolist() == list(range(20, 30)) + [20, 21, 22]
    ids = np.array([1], dtype=np.uint64)
    nt = np.array([13], dtype=np.int32)
    plan = m.reserve(ids, nt)
    ids[0], nt[0] = 99, 1
    assert plan.token_ids.tolist() == list(range(20, 30)) + [20, 21, 22]
    m.commit(np.array([5], dtype=np.int32))
    assert m.request_state(1).computed == 13
    m.close()


def test_c_struct_sizes_match_the_header():
    assert ctypes.sizeof(pagedkv._ffi.Plan) == 8 * pagedkv._ffi.PLAN_WORDS == 8 * (3 + 33 + 2 + 3 + 1)
    assert ctypes.sizeof(pagedkv._ffi.Stats) == 8 * 27
    assert ctypes.sizeof(pagedkv._ffi.Request) == 48 + 8 + 8 + 4 + 4 + 8


def test_speculative_step_and_its_errors(world):
    m, prompt, plan = world
    expect(m, plan, pagedkv.BadArgument, "drafts[0][1] = -6", m.reserve_spec, [1], [1], [[5, -6]])
    expect(m, plan, pagedkv.BadArgument, "2 draft lists", m.reserve_spec, [1], [1], [[5], [6]])
    expect(m, plan, pagedkv.BadArgument, "still has", m.reserve_spec, [2], [1], [[5]])
    expect(m, plan, pagedkv.UnknownRequest, "request 9", m.truncate, 9, 1)
    expect(m, plan, pagedkv.BadArgument, "to -1 tokens", m.truncate, 1, -1)
    expect(m, plan, pagedkv.BadArgument, "to 99 tokens", m.truncate, 1, 99)
    p = m.reserve_spec([1], [1], [[5, 6, 7]])
    assert p.drafts.tolist() == [3] and p.nnz == 4 and p.token_ids.tolist()[1:] == [5, 6, 7]
    assert m.tokens(1).tolist()[-3:] == [5, 6, 7]  # during the step, tokens end with the drafts
    expect(m, p, pagedkv.BadArgument, "CommitSpec", m.commit, [9])
    expect(m, p, pagedkv.BadArgument, "accepted[0] = 4", m.commit_spec, [4], [9])
    expect(m, p, pagedkv.BadArgument, "0 accepted counts", m.commit_spec, [], [9])
    expect(m, p, pagedkv.StepPending, "truncate", m.truncate, 1, 1)
    m.commit_spec([1], [9])
    st = m.request_state(1)
    assert (st.computed, st.num_tokens) == (12, 13) and m.tokens(1).tolist()[-2:] == [5, 9]
    s = m.stats()
    assert (s.draft_tokens, s.accepted_draft_tokens) == (3, 1)
    m.truncate(1, 12)
    assert m.request_state(1).num_tokens == 12
    m.audit()
