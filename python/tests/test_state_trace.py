"""State, indexer and shared-KV groups from Python against Go.

cabi/testdata/state_trace.json is written by the seeded engine loop of
cabi/trace_test.go (TestStateTrace in cabi/state_trace_test.go, which fails
when the file is stale) on pagedkv.HybridManager for a Qwen3-Next-like model
(3 state groups : 1 full, shared-KV layers, a checkpoint every 8 tokens)
and one of every kind (state, full, MLA, an indexer on the MLA group,
shared-KV layers), both with KV events; most prefill chunks end at the
request's next_state_checkpoint. Replaying every operation through
libpagedkv must give exactly the Go results: error classes, values (hits,
next_state_checkpoint), Stats and every group's GroupStats after every
operation, the drained KV event batches byte for byte (the state groups'
checkpoints announced with kv_cache_spec_kind "mamba"), and for every step
the pool-wide copies and each group's plan: a state group's state_indices
and copies, an indexer's and a shared-KV group's arrays (their target's).
"""

import json
import os

import pytest

import pagedkv
from conftest import ROOT, zero_ts
from test_hybrid_trace import check_group
from test_trace import run_op

with open(os.path.join(ROOT, "cabi", "testdata", "state_trace.json")) as f:
    TRACES = json.load(f)["traces"]

KINDS = ("full", "sliding", "chunked", "mla", "state", "indexer", "shared_kv")  # PAGEDKV_GROUP_* order
DTYPES = ("", "float32", "float16", "bfloat16")  # PAGEDKV_STATE_* order


def layer_group(g):
    return pagedkv.LayerGroup(
        KINDS[g["kind"]], window_tokens=g["window_tokens"], chunk_tokens=g["chunk_tokens"], num_layers=g["num_layers"],
        target=g["target"], indexer_head_dim=g["indexer_head_dim"], indexer_quant_block=g["indexer_quant_block"],
        conv_shape=(g["conv_shape0"], g["conv_shape1"]), conv_dtype=DTYPES[g["conv_dtype"]],
        ssm_shape=(g["ssm_shape0"], g["ssm_shape1"], g["ssm_shape2"]), ssm_dtype=DTYPES[g["ssm_dtype"]],
        page_bytes=g["page_bytes"])


@pytest.mark.parametrize("trace", TRACES, ids=[t["name"] for t in TRACES])
def test_state_replay_matches_go(trace):
    m = pagedkv.HybridManager(groups=[layer_group(g) for g in trace["groups"]], events=True, **trace["config"])
    assert m.kinds == tuple(KINDS[g["kind"]] for g in trace["groups"])
    pins = []
    for i, op in enumerate(trace["ops"]):
        want = op["want"]
        where = "op %d (%s)" % (i, json.dumps({k: v for k, v in op.items() if k not in ("want", "plan", "groups")}))
        err, result = "", None
        try:
            if op["op"] == "drain_events":
                result = m.drain_events()
            elif op["op"] == "next_state_checkpoint":
                result = m.next_state_checkpoint(op["id"])
            else:
                result = run_op(m, op, pins)
        except pagedkv.PagedKVError as e:
            err = type(e).__name__
        assert err == want.get("err", ""), where
        assert list(m.stats().as_dict().values()) == want["stats"], where
        got_groups = [[KINDS.index(g.kind)] + list(g.as_dict().values())[1:] for g in m.group_stats()]
        assert got_groups == want["group_stats"], where
        if op["op"] in ("add", "resume", "evict", "pin", "next_state_checkpoint") and not err:
            assert result == want.get("value", 0), where
        if op["op"] == "drain_events":
            assert [zero_ts(p).hex() for p in result] == want.get("events", []), where
        if op["op"] in ("reserve", "reserve_spec") and not err:
            assert result.request_ids.tolist() == op.get("ids", []), where
            assert result.copies.reshape(-1).tolist() == (op["plan"].get("copies") or []), where
            assert len(result.groups) == len(op["groups"]), where
            for g, (got, wg) in enumerate(zip(result.groups, op["groups"])):
                gw = "%s group %d" % (where, g)
                check_group(got, wg, gw)
                if m.kinds[g] == "state":
                    assert got.state_indices.tolist() == (wg["plan"].get("state_indices") or []), gw
                    assert len(got.state_indices) == got.batch_size, gw
                else:
                    assert got.state_indices is None and "state_indices" not in wg["plan"], gw
        m.audit()
    m.close()


def test_state_trace_covers_the_new_kinds():
    ops = [op for t in TRACES for op in t["ops"]]
    assert {op["op"] for op in ops} >= {"add", "reserve", "commit", "fork", "preempt", "resume", "next_state_checkpoint",
                                        "drain_events", "truncate"}
    assert any(op["op"] == "next_state_checkpoint" and op["want"].get("value") for op in ops)
    # Checkpoint hits, restore copies, and checkpoint events ("mamba").
    assert any(op["op"] in ("add", "resume") and op["want"].get("value") for op in ops)
    assert any(g["plan"].get("state_indices") and g["plan"].get("copies") for op in ops for g in op.get("groups", []))
    assert any("6d616d6261" in p for op in ops for p in op["want"].get("events", []))  # "mamba"
    kinds = {KINDS[g["kind"]] for t in TRACES for g in t["groups"]}
    assert kinds >= {"state", "full", "mla", "indexer", "shared_kv"}
