"""HybridManager from Python against the Go reference semantics.

cabi/testdata/hybrid_trace.json is written by the seeded engine loop of
cabi/trace_test.go (TestHybridTrace, which fails when the file is stale)
run on pagedkv.HybridManager in Go, for a gpt-oss-like model (sliding
window 128 and full attention) and a Llama-4-like one (chunked local
attention and full attention). Replaying every operation through
libpagedkv must give exactly the Go results: the error class, matched
tokens, Stats and every group's GroupStats (pinned_pages included: the
trace pins and unpins prefixes in every group) after every operation, the
drained KV event batches byte for byte (timestamps aside: each group's
pages with its group_idx and kv_cache_spec fields), and
for every step the pool-wide
copies and each group's plan arrays (cascade levels, cascade_window_left
and the chunked attn_* arrays included).
"""

import json
import os

import pytest

import pagedkv
from conftest import ROOT, zero_ts
from test_trace import check_plan, replay_config, run_op

with open(os.path.join(ROOT, "cabi", "testdata", "hybrid_trace.json")) as f:
    TRACES = json.load(f)["traces"]

KINDS = ("full", "sliding", "chunked", "mla")  # PAGEDKV_GROUP_* order
HYBRID_KEYS = ("cascade_window_left", "attn_qo_indptr", "attn_kv_indptr", "attn_kv_page_indices",
               "attn_kv_last_page_len", "attn_requests")


def make(trace):
    groups = [pagedkv.LayerGroup(KINDS[g["kind"]], window_tokens=g.get("window_tokens", 0),
                                 chunk_tokens=g.get("chunk_tokens", 0), num_layers=g["num_layers"])
              for g in trace["groups"]]
    return pagedkv.HybridManager(groups=groups, events=trace.get("events", False), **replay_config(trace))


def check_group(got, want, where):
    check_plan(got, want, where)
    if "cascade" not in want:
        assert got.cascade_window_left is None, where
    for k in HYBRID_KEYS:
        v = getattr(got, k)
        assert (v.tolist() if v is not None else []) == (want["plan"].get(k) or []), "%s: %s" % (where, k)


@pytest.mark.parametrize("trace", TRACES, ids=[t["name"] for t in TRACES])
def test_hybrid_replay_matches_go(trace):
    m = make(trace)
    assert m.num_groups == len(trace["groups"])
    for i, op in enumerate(trace["ops"]):
        want = op["want"]
        where = "op %d (%s)" % (i, json.dumps({k: v for k, v in op.items() if k not in ("want", "plan", "groups")}))
        err, result = "", None
        try:
            result = m.drain_events() if op["op"] == "drain_events" else run_op(m, op, [])
        except pagedkv.PagedKVError as e:
            err = type(e).__name__
        assert err == want.get("err", ""), where
        assert list(m.stats().as_dict().values()) == want["stats"], where
        got_groups = [[KINDS.index(g.kind)] + list(g.as_dict().values())[1:] for g in m.group_stats()]
        assert got_groups == want["group_stats"], where
        if op["op"] in ("add", "resume", "evict", "pin") and not err:
            assert result == want.get("value", 0), where
        if op["op"] == "drain_events":
            # Every group's pages, with its group_idx and spec fields, byte for byte.
            assert [zero_ts(p).hex() for p in result] == want.get("events", []), where
        if op["op"] in ("reserve", "reserve_spec") and not err:
            assert result.request_ids.tolist() == op.get("ids", []), where
            assert result.copies.reshape(-1).tolist() == (op["plan"].get("copies") or []), where
            assert len(result.groups) == len(op["groups"]), where
            for g, (got, wg) in enumerate(zip(result.groups, op["groups"])):
                check_group(got, wg, "%s group %d" % (where, g))
        m.audit()
    m.close()


def test_hybrid_trace_covers_the_engine_loop():
    for t in TRACES:
        ops = t["ops"]
        assert {op["op"] for op in ops} >= {"add", "reserve", "commit", "abort", "fork", "release", "preempt",
                                            "resume", "extend", "evict", "reserve_spec", "commit_spec",
                                            "pin"}, t["name"]
        assert any(gs[8] > 0 for op in ops for gs in op["want"]["group_stats"]), "%s: no pinned pages" % t["name"]
        assert any(op["want"].get("events") for op in ops), "%s: no KV events" % t["name"]
        groups = [g for op in ops for g in op.get("groups", [])]
        assert any("cascade" in g for g in groups), t["name"]
        assert any(op["want"].get("err") == "OutOfPages" for op in ops), t["name"]
        # Windows and chunks release pages: positions restart past them.
        assert any(g["plan"].get("positions") != g["plan"].get("token_positions") for g in groups), t["name"]
    assert any(g["plan"].get("attn_qo_indptr") for t in TRACES for op in t["ops"] for g in op.get("groups", []))
    assert any(op["op"] == "unpin" and not op["want"].get("err") for t in TRACES for op in t["ops"])
