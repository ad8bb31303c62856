"""The Python binding against the Go reference semantics.

cabi/testdata/trace.json is written by a seeded random engine loop run on
pagedkv.Manager in Go (cabi/trace_test.go, which also fails when the file is
stale): adds from prompt families with shared prefixes, chunked prefill and
decode steps, forks, preemption under memory pressure, resume, release,
aborted steps, evictions, pins and calls that must fail. Replaying every
operation through libpagedkv must give exactly the Go results: the same
error class, matched tokens, plan arrays (cascade levels included) and
Stats after every operation.
"""

import json
import os

import numpy as np
import pytest

import pagedkv
from conftest import ROOT, plan_values

with open(os.path.join(ROOT, "cabi", "testdata", "trace.json")) as f:
    TRACES = json.load(f)["traces"]

PLAN_KEYS = ("copies", "drafts", "qo_indptr", "batch_indices", "positions", "token_ids", "token_positions", "kv_indptr",
             "kv_page_indices", "kv_last_page_len", "seq_lens")


def check_block_tables(plan, where):
    """plan's padded block_tables (when the replay asked for them) name the
    pages of its CSR arrays in the same order, padded with 0, and
    max_seq_len is the stride times the page size."""
    bt = plan.block_tables
    if bt is None:
        return
    indptr, pages = plan.kv_indptr, plan.kv_page_indices
    n = indptr[1:] - indptr[:-1]
    assert bt.shape == (plan.batch_size, bt.shape[1]), where
    cols = np.arange(bt.shape[1])
    held = cols[None, :] < n[:, None]
    assert (bt[~held] == 0).all(), "%s: block_tables padding %s" % (where, bt.tolist())
    assert bt[held].tolist() == pages[:indptr[-1]].tolist(), "%s: block_tables %s, kv_page_indices %s" % (
        where, bt.tolist(), pages.tolist())
    assert plan.max_seq_len % bt.shape[1] == 0 and (plan.seq_lens <= plan.max_seq_len).all(), where


def replay_config(trace):
    """The trace's config, with padded block tables as wide as the pool
    (never refusing a step, so the replay behaves as the Go run did)."""
    return {"block_tables_stride": trace["config"]["num_pages"], **trace["config"]}


def check_plan(plan, want, where):
    """plan's arrays, window_left and cascade are want's ("plan", "cascade");
    its block_tables name the same pages."""
    check_block_tables(plan, where)
    got = plan_values(plan)
    for k in PLAN_KEYS:
        flat = got[k] if k != "copies" else [x for row in got[k] for x in row]
        assert flat == (want["plan"].get(k) or []), "%s: %s" % (where, k)
    assert got["window_left"] == want["plan"]["window_left"][0], where
    if "cascade" in want:
        assert got.get("cascade") == want["cascade"], where
        assert got["query_rows"] == want["plan"]["query_rows"], where
    else:
        assert plan.cascade is None, where


def run_op(m, op, pins):
    kind = op["op"]
    if kind == "add":
        return m.add(op["id"], op.get("tokens", []), tenant=op.get("tenant", ""), priority=op.get("priority", 0))
    if kind == "reserve":
        return m.reserve(op.get("ids", []), op.get("ntokens", []))
    if kind == "commit":
        return m.commit(op.get("sampled", []))
    if kind == "reserve_spec":
        drafts = op.get("drafts")
        n = len(op.get("ids", []))
        return m.reserve_spec(op.get("ids", []), op.get("ntokens", []),
                              None if drafts is None else [d or [] for d in drafts] if drafts else [[]] * n)
    if kind == "commit_spec":
        return m.commit_spec(op.get("accepted", []), op.get("sampled", []))
    if kind == "truncate":
        return m.truncate(op["id"], op.get("n", 0))
    if kind == "abort":
        return m.abort()
    if kind == "fork":
        return m.fork(op["id"], op["child"])
    if kind == "release":
        return m.release(op["id"])
    if kind == "preempt":
        return m.preempt(op["id"])
    if kind == "resume":
        return m.resume(op["id"])
    if kind == "extend":
        return m.extend(op["id"], op["tokens"])
    if kind == "evict":
        return m.evict(op.get("n", 0))
    if kind == "pin":
        pin, n = m.pin(op["tokens"])
        pins.append(pin)
        return n
    if kind == "unpin":
        return m.unpin(op["id"])
    raise AssertionError("unknown op %r" % kind)


@pytest.mark.parametrize("trace", TRACES, ids=[t["name"] for t in TRACES])
def test_replay_matches_go(trace):
    m = pagedkv.Manager(**replay_config(trace))
    pins = []
    for i, op in enumerate(trace["ops"]):
        want = op["want"]
        where = "op %d (%s)" % (i, json.dumps({k: v for k, v in op.items() if k not in ("want", "plan", "cascade")}))
        err, result = "", None
        try:
            result = run_op(m, op, pins)
        except pagedkv.PagedKVError as e:
            err = type(e).__name__
        assert err == want.get("err", ""), where
        got_stats = list(m.stats().as_dict().values())
        assert got_stats == want["stats"], where
        if op["op"] in ("add", "resume", "evict", "pin") and not err:
            assert result == want.get("value", 0), where
        if op["op"] in ("reserve", "reserve_spec") and not err:
            check_plan(result, op, where)
        m.audit()
    m.close()


def test_trace_covers_the_engine_loop():
    ops = [op for t in TRACES for op in t["ops"]]
    kinds = {op["op"] for op in ops}
    assert kinds >= {"add", "reserve", "commit", "abort", "fork", "release", "preempt", "resume", "extend",
                     "evict", "pin", "unpin", "reserve_spec", "commit_spec", "truncate"}
    assert any("cascade" in op for op in ops)
    assert any(op.get("plan", {}).get("copies") for op in ops)
    assert any(op["want"].get("err") == "OutOfPages" for op in ops)
