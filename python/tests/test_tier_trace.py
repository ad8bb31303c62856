"""Tiers and KV events from Python against the Go reference semantics.

cabi/testdata/tier_trace.json (a host tier) and tier_redis_trace.json (a
host tier over a real redis-server) are written by the seeded engine loop
of cabi/tier_trace_test.go (TestTierTrace, which fails when they are
stale) run on pagedkv.Manager in Go with KV events;
hybrid_tier_trace.json and hybrid_tier_redis_trace.json (TestHybridTierTrace)
by the same loop on a pagedkv.HybridManager (sliding window 8 + full
attention, one layer each) with a host tier (and Redis), without KV
events (a HybridManager's host tier has none yet). Both are the dense trace's
operations plus taking the tier copies, completing some of them (steps of
requests still loading fail with Loading), draining the KV event batches
and listing the cached hashes. Replaying them through libpagedkv must give
exactly the Go results after every operation: error class, values, Stats,
tier stats, the tier copies, the event payloads byte for byte (the
timestamp aside) and the hashes; for the hybrid traces every group's
GroupStats (its tier counters included) and every group's plan.

The replay is also an engine: it keeps simulated device memory, writes
every appended token into its page (copy-on-write copies first), runs the
tier copies between device pages and the Manager's host pages (the numpy
view of host_pages()) when it completes them, and checks after every
operation that each running, not loading request's pages hold its
computed tokens: pages that went down to the host tier (and through Redis)
and came back hold what was written. A hybrid page has one layer per group
(a tier copy moves every layer); each group's plan writes its own layer,
and each group's pages are checked from the first token it still holds.
"""

import json
import os

import numpy as np
import pytest

import pagedkv
from conftest import ROOT, zero_ts
from test_hybrid_trace import KINDS, check_group
from test_trace import check_plan, run_op

TRACES = []
for _name in ("tier_trace.json", "tier_redis_trace.json", "hybrid_tier_trace.json", "hybrid_tier_redis_trace.json"):
    with open(os.path.join(ROOT, "cabi", "testdata", _name)) as f:
        TRACES += json.load(f)["traces"]

DTYPE_NAMES = {1: "f32", 2: "f16", 3: "bf16", 4: "e4m3", 5: "e5m2"}


def make(trace, redis_addr):
    t = trace["tiers"]
    fmt = pagedkv.PageFormat(kv_layout=("NHD", "HND")[t["format_kv_layout"]], dtype=DTYPE_NAMES[t["format_dtype"]],
                             num_kv_heads=t["format_num_kv_heads"], head_dim=t["format_head_dim"],
                             num_layers=t["format_num_layers"])
    redis = pagedkv.RedisTier(redis_addr, "trace") if trace.get("redis") else None
    tiers = pagedkv.Tiers(t["host_pages"], format=fmt, remote_deadline_ms=t["remote_deadline_us"] // 1000,
                          offload_free_pages=t["offload_free_pages"], write_through=bool(t["write_through"]), redis=redis)
    if "groups" in trace:
        groups = [pagedkv.LayerGroup(KINDS[g["kind"]], window_tokens=g["window_tokens"], chunk_tokens=g["chunk_tokens"],
                                     num_layers=g["num_layers"]) for g in trace["groups"]]
        return pagedkv.HybridManager(groups=groups, **trace["config"], tiers=tiers)
    return pagedkv.Manager(**trace["config"], tiers=tiers, events=trace.get("events", False))


class Engine:
    """Device memory of the trace's format (a layer per group, one K/V
    head of one f32 element: a page is each layer's K[page_size] then
    V[page_size] int32) and the tier copies in flight."""

    def __init__(self, m, num_pages, page_size, layers):
        self.m, self.ps, self.layers = m, page_size, layers
        host = m.host_pages()
        assert host.shape == (m.tier_stats().host_pages, 8 * page_size * layers)
        self.host = host.view(np.int32)  # [host_pages, layers*2*page_size]
        self.dev = np.zeros((num_pages, layers * 2 * page_size), dtype=np.int32)
        self.inflight = {}  # id -> (dir, device page, host page)
        self.ids = set()

    def step(self, plan):
        ps, dev = self.ps, self.dev
        for src, dst, entries in plan.copies.reshape(-1, 3).tolist():
            for layer in range(self.layers):  # a copy copies every layer
                o = 2 * ps * layer
                dev[dst, o:o + entries] = dev[src, o:o + entries]
                dev[dst, o + ps:o + ps + entries] = dev[src, o + ps:o + ps + entries]
        for layer, gp in enumerate(getattr(plan, "groups", None) or [plan]):
            o = 2 * ps * layer
            kv_indptr, pages = gp.kv_indptr, gp.kv_page_indices
            for b, pos, tok in zip(gp.batch_indices.tolist(), gp.positions.tolist(), gp.token_ids.tolist()):
                page = pages[kv_indptr[b] + pos // ps]
                dev[page, o + pos % ps], dev[page, o + ps + pos % ps] = tok, ~tok

    def take(self, copies):
        for i, d, dp, hp in zip(copies.ids.tolist(), copies.dirs.tolist(), copies.device_pages.tolist(),
                                copies.host_pages.tolist()):
            self.inflight[i] = (d, dp, hp)

    def run_copies(self, ids):
        """Runs the copies ids (before reporting them; a copy runs again if
        its report is refused, which changes nothing)."""
        for i in ids:
            if i not in self.inflight:
                continue
            d, dp, hp = self.inflight[i]
            if d == pagedkv.TO_HOST:
                self.host[hp] = self.dev[dp]
            else:
                self.dev[dp] = self.host[hp]

    def completed(self, ids):
        for i in ids:
            self.inflight.pop(i, None)

    def check(self, where):
        """Every running, not loading request's pages hold its computed
        tokens, in every group (from the first token the group holds)."""
        ps, hybrid = self.ps, isinstance(self.m, pagedkv.HybridManager)
        for rid in sorted(self.ids):
            try:
                st = self.m.request_state(rid)
            except pagedkv.UnknownRequest:
                continue
            if not st.running or not st.computed or self.m.loading(rid):
                continue
            toks = self.m.tokens(rid)[: st.computed]
            for layer in range(self.layers):
                o = 2 * ps * layer
                if hybrid:
                    start, pages = self.m.request_state(rid, layer).start, self.m.pages(rid, layer)
                else:
                    start, pages = 0, self.m.pages(rid)
                t = np.arange(start, st.computed)
                pg = pages[t // ps - start // ps]
                assert np.array_equal(self.dev[pg, o + t % ps], toks[start:]), "%s: request %d's K rows, layer %d" % (
                    where, rid, layer)
                assert np.array_equal(self.dev[pg, o + ps + t % ps], ~toks[start:]), "%s: request %d's V rows, layer %d" % (
                    where, rid, layer)


@pytest.mark.parametrize("trace", TRACES, ids=[t["name"] for t in TRACES])
def test_tier_replay_matches_go(trace, request):
    redis_addr = request.getfixturevalue("redis_addr") if trace.get("redis") else ""
    m = make(trace, redis_addr)
    e = Engine(m, trace["config"]["num_pages"], trace["config"]["page_size"], trace["tiers"]["format_num_layers"])
    pins = []
    for i, op in enumerate(trace["ops"]):
        want = op["want"]
        where = "op %d (%s)" % (i, json.dumps({k: v for k, v in op.items() if k not in ("want", "plan", "cascade")}))
        kind = op["op"]
        for k in ("id", "child"):
            if k in op:
                e.ids.add(op[k])
        err, result = "", None
        try:
            if kind == "tier_copies":
                result = m.tier_copies()
                e.take(result)
            elif kind == "complete":
                e.run_copies(op.get("complete_ids", []))
                m.complete_tier_copies(op.get("complete_ids", []))
                e.completed(op.get("complete_ids", []))
            elif kind == "drain_events":
                result = m.drain_events()
            elif kind == "cached_hashes":
                result = m.cached_hashes(("GPU", "CPU")[op.get("medium", 0)])
            else:
                result = run_op(m, op, pins)
        except pagedkv.PagedKVError as ex:
            err = type(ex).__name__
        assert err == want.get("err", ""), "%s: %s" % (where, err)
        if trace.get("redis"):
            m.tier_flush(10000)  # the Go run waited for Redis's writes before reading stats
        assert list(m.stats().as_dict().values()) == want["stats"], where
        assert list(m.tier_stats().as_dict().values()) == want["tier_stats"], where
        if "groups" in trace:
            got_groups = [[KINDS.index(g.kind)] + list(g.as_dict().values())[1:] for g in m.group_stats()]
            assert got_groups == want["group_stats"], where
        if kind in ("add", "resume", "evict", "pin") and not err:
            assert result == want.get("value", 0), where
        if kind in ("reserve", "reserve_spec") and not err:
            if "groups" in trace:
                assert result.copies.reshape(-1).tolist() == (op["plan"].get("copies") or []), where
                for g, (got, wg) in enumerate(zip(result.groups, op["groups"])):
                    check_group(got, wg, "%s group %d" % (where, g))
            else:
                check_plan(result, op, where)
            e.step(result)
        if kind == "tier_copies":
            got = [list(c) for c in zip(result.ids.tolist(), result.dirs.tolist(), result.device_pages.tolist(),
                                        result.host_pages.tolist())]
            assert got == want.get("copies", []), where
            assert result.num_offloads == sum(1 for c in got if c[1] == pagedkv.TO_HOST), where
        if kind == "drain_events":
            assert [zero_ts(p).hex() for p in result] == want.get("events", []), where
        if kind == "cached_hashes":
            assert result.tolist() == want.get("hashes", []), where
        e.check(where)
        m.audit()
    m.close()


def test_tier_traces_cover_the_tiers():
    for t in TRACES:
        ops = t["ops"]
        want = {"tier_copies", "complete", "cached_hashes", "add", "reserve", "commit", "evict"}
        if "groups" not in t:
            want.add("drain_events")
        assert {op["op"] for op in ops} >= want, t["name"]
        assert any(op["want"].get("err") == "Loading" for op in ops), t["name"]
        assert any(c[1] == 1 for op in ops for c in op["want"].get("copies", [])), "%s: no onloads" % t["name"]
        assert any(c[1] == 0 for op in ops for c in op["want"].get("copies", [])), "%s: no offloads" % t["name"]
        assert ops[-1]["want"]["tier_stats"][3] > 0, "%s: no host hits" % t["name"]
        # Host pages are announced with medium "CPU" (msgpack fixstr "CPU").
        if "groups" in t:
            # Each group's tier counters add up to the pool's.
            for op in ops:
                gs, ts = op["want"]["group_stats"], op["want"]["tier_stats"]
                assert [sum(g[i] for g in gs) for i in (9, 10, 11, 12)] == ts[3:7], t["name"]
            assert all(g[11] > 0 and g[12] > 0 for g in ops[-1]["want"]["group_stats"]), "%s: a group never offloaded and onloaded" % t["name"]
            continue
        assert any(b"\xa3CPU".hex() in p for op in ops for p in op["want"].get("events", [])), t["name"]
    redis = [t for t in TRACES if t.get("redis")]
    assert len(redis) == 2 and all(t["ops"][-1]["want"]["tier_stats"][4] > 0 for t in redis), "no remote hits"
    assert sum(1 for t in TRACES if "groups" in t) == 2
