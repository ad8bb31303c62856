"""Tiers, KV events, cached hashes and hybrid pins from Python: the calls
and their bad inputs (each raises naming the bad value and changes
nothing). test_tier_trace.py checks the results against Go."""

import threading

import numpy as np
import pytest

import pagedkv
from conftest import snapshot

msgpack = pytest.importorskip("msgpack", reason="Debian's python3-msgpack decodes the KV event payloads")

FORMAT = pagedkv.PageFormat(dtype="f32", num_kv_heads=1, head_dim=1, num_layers=1)  # 32 bytes a page of 4


def tiered(host_pages=8, **kw):
    return pagedkv.Manager(8, 4, hash_seed=1, tiers=pagedkv.Tiers(host_pages, format=FORMAT, **kw), events=True)


def prefill(m, rid, prompt):
    m.add(rid, prompt)
    m.reserve([rid], [len(prompt)])
    m.commit([7])


def test_offload_onload_round_trip():
    m = tiered()
    host = m.host_pages()
    assert host.shape == (8, 32) and host.dtype == np.uint8
    prompt = list(range(100, 112))
    prefill(m, 1, prompt)
    [batch] = m.drain_events()
    ts, events, rank = msgpack.unpackb(batch)
    assert isinstance(ts, float) and rank == 0
    assert [e["type"] for e in events] == ["BlockStored"] and events[0]["medium"] == "GPU"
    assert events[0]["token_ids"] == prompt and events[0]["block_size"] == 4
    assert events[0]["block_hashes"] == m.cached_hashes("GPU").tolist()
    m.release(1)
    m.evict(8)
    c = m.tier_copies()
    assert len(c) == 3 and c.num_offloads == 3 and (c.dirs == pagedkv.TO_HOST).all()
    written = {}
    for d, h in zip(c.device_pages.tolist(), c.host_pages.tolist()):
        host[h] = written[h] = 0x40 + d  # the engine's device-to-host copy
    m.complete_tier_copies(c.ids)
    assert m.tier_stats().offloaded_pages == 3 and m.tier_stats().bytes_to_host == 96
    assert sorted(m.cached_hashes("CPU").tolist()) == sorted(events[0]["block_hashes"])
    kinds = [(e["type"], e["medium"]) for b in m.drain_events() for e in msgpack.unpackb(b)[1]]
    assert ("BlockRemoved", "GPU") in kinds and ("BlockStored", "CPU") in kinds
    assert m.add(2, prompt) == 8  # two pages from the host tier, onloaded
    assert m.loading(2)
    with pytest.raises(pagedkv.Loading, match="onload"):
        m.reserve([2], [4])
    c = m.tier_copies()
    assert len(c) == 2 and c.num_offloads == 0
    # The onloads read host pages the offloads wrote, still holding their bytes.
    assert all(h in written and (host[h] == written[h]).all() for h in c.host_pages.tolist())
    m.complete_tier_copies(c.ids.copy())
    assert not m.loading(2)
    m.reserve([2], [4])
    m.commit([9])
    s = m.events_stats()
    assert s.batches >= 3 and s.dropped_steps == 0
    m.audit()
    m.close()


def test_caller_host_memory_is_used():
    mem = np.zeros(8 * 32, dtype=np.uint8)
    m = tiered(host_memory=mem)
    assert np.shares_memory(m.host_pages(), mem)
    m.close()
    with pytest.raises(pagedkv.BadConfig, match="Memory has 100 bytes"):
        tiered(host_memory=np.zeros(100, dtype=np.uint8))


@pytest.mark.parametrize("kw, exc, needle", [
    (dict(tiers=pagedkv.Tiers(-1)), pagedkv.BadArgument, "tiers.host_pages = -1"),
    (dict(tiers=8), pagedkv.BadArgument, "tiers = 8, want a pagedkv.Tiers"),
    (dict(tiers=pagedkv.Tiers(8, format=pagedkv.PageFormat(dtype="f64", num_kv_heads=1, head_dim=1, num_layers=1))),
     pagedkv.BadArgument, "dtype = 'f64'"),
    (dict(tiers=pagedkv.Tiers(8, format=pagedkv.PageFormat(kv_layout="HDN", num_kv_heads=1, head_dim=1, num_layers=1))),
     pagedkv.BadArgument, "kv_layout = 'HDN'"),
    (dict(tiers=pagedkv.Tiers(8, format=pagedkv.PageFormat(num_kv_heads=0, head_dim=1, num_layers=1))),
     pagedkv.BadArgument, "tiers.format.num_kv_heads = 0"),
    (dict(tiers=pagedkv.Tiers(8, host_memory=[0] * 256)), pagedkv.BadArgument, "host_memory must be"),
    (dict(tiers=pagedkv.Tiers(8, remote_deadline_ms=-5)), pagedkv.BadArgument, "remote_deadline_ms = -5"),
    (dict(tiers=pagedkv.Tiers(8, redis=pagedkv.RedisTier("127.0.0.1:1", "ns"))), pagedkv.BadConfig,
     "needs tiers.format"),
    (dict(tiers=pagedkv.Tiers(8, format=FORMAT, redis=pagedkv.RedisTier("127.0.0.1:1", ""))), pagedkv.BadConfig,
     'Namespace = ""'),
    (dict(tiers=pagedkv.Tiers(8, format=FORMAT, redis=pagedkv.RedisTier("127.0.0.1:1", "ns", queue_len=-2))),
     pagedkv.BadArgument, "tiers.redis.queue_len = -2"),
    (dict(tiers=pagedkv.Tiers(8, format=FORMAT, redis=pagedkv.RedisTier(5, "ns"))), pagedkv.BadArgument,
     "tiers.redis.addr = 5"),
    (dict(tiers=pagedkv.Tiers(8, format=FORMAT, disk=pagedkv.DiskTier("/tmp/x", "ns", 0))), pagedkv.BadConfig,
     "Pages"),
    (dict(tiers=pagedkv.Tiers(0, offload_free_pages=2)), pagedkv.BadConfig, "Tiers.HostPages = 0"),
    (dict(events=pagedkv.Events(queue_batches=-1)), pagedkv.BadArgument, "events.queue_batches = -1"),
    (dict(events="yes"), pagedkv.BadArgument, "events = 'yes'"),
    (dict(events=pagedkv.Events(endpoint="nonsense")), pagedkv.BadConfig, 'endpoint "nonsense"'),
    (dict(events=pagedkv.Events(endpoint="tcp://127.0.0.1:0", mode="bindd")), pagedkv.BadArgument,
     "events.mode = 'bindd'"),
    (dict(events=pagedkv.Events(topic="kv")), pagedkv.BadArgument, "without an endpoint"),
])
def test_bad_options(kw, exc, needle):
    with pytest.raises(exc) as e:
        pagedkv.Manager(8, 4, **kw)
    assert needle in str(e.value)


def test_disk_tier(tmp_path):
    m = pagedkv.Manager(8, 4, hash_seed=1, tiers=pagedkv.Tiers(
        4, format=FORMAT, disk=pagedkv.DiskTier(str(tmp_path / "disk"), "test", 16)))
    prefill(m, 1, list(range(100, 112)))
    c = m.tier_copies()  # write-through: every published page goes down
    assert c.num_offloads == 3
    m.complete_tier_copies(c.ids)
    m.tier_flush(10000)
    assert m.tier_stats().remote_stored_pages == 3
    m.close()
    assert list((tmp_path / "disk").iterdir())


def test_calls_that_need_tiers_or_events():
    m = pagedkv.Manager(8, 4)
    for call in (m.tier_copies, m.host_pages, lambda: m.complete_tier_copies([1]), lambda: m.loading(1),
                 m.tier_flush):
        with pytest.raises(pagedkv.BadConfig, match="has no tiers"):
            call()
    for call in (m.drain_events, m.events_stats):
        with pytest.raises(pagedkv.BadConfig, match="has no KV events"):
            call()
    assert m.tier_stats().host_pages == 0
    assert m.cached_hashes().size == 0
    m.close()


def test_failed_tier_calls_change_nothing():
    m = tiered()
    prefill(m, 1, list(range(100, 112)))
    m.release(1)
    m.evict(8)
    c = m.tier_copies()
    ids = c.ids.tolist()
    before = (snapshot(m, [1, 2]), m.tier_stats())
    for bad, exc, needle in ((ids + [ids[0]], pagedkv.BadArgument, "appears twice"),
                             ([1 << 40], pagedkv.BadArgument, "is not a copy in flight"),
                             ([-1], pagedkv.BadArgument, "ids[0] = -1 does not fit uint64"),
                             ([[1]], pagedkv.BadArgument, "must be 1-D")):
        with pytest.raises(exc) as e:
            m.complete_tier_copies(bad)
        assert needle in str(e.value)
        assert (snapshot(m, [1, 2]), m.tier_stats()) == before
    with pytest.raises(pagedkv.BadArgument, match="medium = 'TPU'"):
        m.cached_hashes("TPU")
    with pytest.raises(pagedkv.BadArgument, match="timeout_ms = -1"):
        m.tier_flush(-1)
    with pytest.raises(pagedkv.UnknownRequest, match="request 5"):
        m.loading(5)
    m.complete_tier_copies(ids)
    m.audit()
    m.close()


def test_tier_stats_from_another_thread():
    m = tiered()
    stop, seen = threading.Event(), []

    def reader():
        while not stop.is_set():
            seen.append(m.tier_stats().offloaded_pages)

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(50):
            prefill(m, i + 1, [1000 * i + j for j in range(8)])
            m.release(i + 1)
            m.evict(8)
            m.complete_tier_copies(m.tier_copies().ids)
            m.drain_events()
    finally:
        stop.set()
        t.join()
    assert seen and seen == sorted(seen) and m.tier_stats().offloaded_pages >= 50
    m.close()


def hybrid_offload(h, prompt):
    """Request 1 computes prompt, is released and its cached pages are
    evicted with offload: the tier copies planned."""
    h.add(1, prompt)
    h.reserve([1], [len(prompt)])
    h.commit([3])
    h.release(1)
    h.evict(16)
    return h.tier_copies()


def test_hybrid_tiers():
    """A HybridManager's host tier: the same calls as Manager's, copies of
    pool pages (every layer), each group's tier counters."""
    groups = [pagedkv.LayerGroup("sliding", window_tokens=8), pagedkv.LayerGroup("full")]
    fmt = pagedkv.PageFormat(dtype="f32", num_kv_heads=1, head_dim=1, num_layers=2)
    with pytest.raises(pagedkv.BadArgument, match="tiers.host_pages = -1"):
        pagedkv.HybridManager(16, 4, groups, tiers=pagedkv.Tiers(-1))
    h = pagedkv.HybridManager(16, 4, groups, hash_seed=1, tiers=pagedkv.Tiers(16, format=fmt))
    host = h.host_pages()
    assert host.shape == (16, 64)
    prompt = list(range(12))
    c = hybrid_offload(h, prompt)
    assert len(c.ids) == 6 and c.num_offloads == 6 and set(c.dirs.tolist()) == {pagedkv.TO_HOST}
    host[c.host_pages] = 7
    h.complete_tier_copies(c.ids)
    assert h.cached_hashes("CPU").size == 6
    with pytest.raises(pagedkv.BadHandle, match="PAGEDKV_MEDIUM_CPU works"):
        h.cached_hashes("GPU")
    assert h.add(2, prompt) == 8 and h.loading(2)
    with pytest.raises(pagedkv.Loading):
        h.reserve([2], [4])
    c = h.tier_copies()
    assert len(c.ids) == 4 and c.num_offloads == 0
    with pytest.raises(pagedkv.BadArgument, match="is not a copy in flight"):
        h.complete_tier_copies([1 << 40])
    h.complete_tier_copies(c.ids)
    assert not h.loading(2)
    with pytest.raises(pagedkv.UnknownRequest):
        h.loading(9)
    gs, ts = h.group_stats(), h.tier_stats()
    assert [(g.host_hit_tokens, g.offloaded_pages, g.onloaded_pages) for g in gs] == [(8, 3, 2), (8, 3, 2)]
    assert (ts.host_hit_tokens, ts.offloaded_pages, ts.onloaded_pages) == (16, 6, 4)
    h.tier_flush()
    h.audit()
    h.close()


def test_hybrid_tier_events():
    """A HybridManager with a host tier and KV events announces each group's
    host pages: medium "CPU", the group's group_idx and spec; the CPU pages
    announced and not removed are the host tier's servable ones."""
    groups = [pagedkv.LayerGroup("sliding", window_tokens=8), pagedkv.LayerGroup("full")]
    fmt = pagedkv.PageFormat(dtype="f32", num_kv_heads=1, head_dim=1, num_layers=2)
    h = pagedkv.HybridManager(16, 4, groups, hash_seed=1, tiers=pagedkv.Tiers(8, format=fmt), events=True)
    prompt = list(range(12))
    c = hybrid_offload(h, prompt)
    assert c.num_offloads == 6
    h.complete_tier_copies(c.ids)
    events = [e for b in h.drain_events() for e in msgpack.unpackb(b)[1]]
    cpu = {0: set(), 1: set()}
    gpu = {0: set(), 1: set()}
    for e in events:
        sets = cpu if e["medium"] == "CPU" else gpu
        if e["type"] == "BlockStored":
            spec = ("sliding_window", "full_attention")[e["group_idx"]]
            assert e["kv_cache_spec_kind"] == spec
            sets[e["group_idx"]].update(e["block_hashes"])
        elif e["type"] == "BlockRemoved":
            sets[e["group_idx"]].difference_update(e["block_hashes"])
    assert [len(cpu[g]) for g in (0, 1)] == [3, 3]  # 3 pages a group offloaded
    assert cpu[0] == cpu[1]  # one hash chain, a host page per group
    assert sorted(h.cached_hashes("CPU").tolist()) == sorted(list(cpu[0]) + list(cpu[1]))
    assert [len(gpu[g]) for g in (0, 1)] == [g.cached_pages for g in h.group_stats()]
    h.audit()
    h.close()


def test_hybrid_events_and_pins():
    groups = [pagedkv.LayerGroup("sliding", window_tokens=8), pagedkv.LayerGroup("full")]
    h = pagedkv.HybridManager(32, 4, groups, hash_seed=1, max_pinned_pages=2, events=True)
    prompt = list(range(12))
    h.add(1, prompt)
    h.reserve([1], [12])
    h.commit([3])
    events = [e for b in h.drain_events() for e in msgpack.unpackb(b)[1]]
    assert [(e["group_idx"], e["kv_cache_spec_kind"]) for e in events] == [(0, "sliding_window"), (1, "full_attention")]
    assert events[0]["kv_cache_spec_sliding_window"] == 8
    pin, n = h.pin(prompt[:8])
    assert n == 8 and [g.pinned_pages for g in h.group_stats()] == [2, 2]
    with pytest.raises(pagedkv.PinLimit):
        h.pin(prompt)
    h.unpin(pin)
    assert [g.pinned_pages for g in h.group_stats()] == [0, 0]
    with pytest.raises(pagedkv.UnknownPin):
        h.unpin(pin)
    with pytest.raises(pagedkv.BadHandle, match="hybrid manager; medium = PAGEDKV_MEDIUM_GPU"):
        h.cached_hashes("GPU")  # a cache per group: no one list
    assert h.cached_hashes("CPU").size == 0  # no host tier
    with pytest.raises(pagedkv.BadConfig, match="has no tiers"):
        h.tier_copies()
    h.audit()
    h.close()


def test_events_published_on_zmq():
    """With an endpoint the library publishes each committed step's batch
    as vLLM's ZmqEventPublisher does: [topic, 8-byte big-endian seq,
    payload] on the PUB socket, and replays from a sequence number on the
    ROUTER socket, ending with seq -1."""
    zmq = pytest.importorskip("zmq", reason="Debian's python3-zmq subscribes like vLLM's consumers")
    import struct
    import time

    m = pagedkv.Manager(16, 4, hash_seed=1, events=pagedkv.Events(
        endpoint="tcp://127.0.0.1:0", mode="bind", replay_endpoint="tcp://127.0.0.1:0", topic="kv", data_parallel_rank=2))
    ep, rep = m.events_endpoint(), m.events_endpoint(replay=True)
    assert ep.startswith("tcp://127.0.0.1:") and not ep.endswith(":0") and rep != ep
    with pytest.raises(pagedkv.BadConfig, match="publishes its KV events at " + ep):
        m.drain_events()
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.connect(ep)
    live, rid, deadline = [], 0, time.monotonic() + 10
    while not live and time.monotonic() < deadline:  # the subscription takes a moment to reach the publisher
        rid += 1
        prefill(m, rid, [100 * rid + j for j in range(8)])
        if sub.poll(100):
            live.append(sub.recv_multipart())
    assert live, "no batch reached the subscriber in 10 s"
    topic, seq, payload = live[0]
    ts, events, rank = msgpack.unpackb(payload)
    assert topic == b"kv" and len(seq) == 8 and rank == 2
    assert [e["type"] for e in events] == ["BlockStored"] and events[0]["token_ids"] == [100 * rid + j for j in range(8)]
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(rep)
    dealer.send_multipart([b"", struct.pack(">q", 0)])
    seqs = []
    while dealer.poll(5000):
        _, _, s, _ = dealer.recv_multipart()
        seqs.append(struct.unpack(">q", s)[0])
        if seqs[-1] == -1:
            break
    assert seqs == list(range(rid)) + [-1]
    st = m.events_stats()
    assert st.sent_batches == rid and st.last_seq == rid - 1 and st.replays == 1 and st.replayed == rid
    m.close()
    sub.close(0)
    dealer.close(0)
    ctx.term()
