#!/usr/bin/env python3
"""A KV-event subscriber on libzmq (pyzmq) and msgpack, written from vLLM's
definitions (vllm/distributed/kv_events.py), that checks a publisher's
stream: framing, the KVEventBatch array, the tagged event maps with their
required fields, contiguous sequence numbers, a consistent page set per medium ("GPU",
whose stored blocks' parents must be cached on the GPU; "CPU" and others,
whose blocks are kept one by one, so a parent may be absent), and that the
replay socket returns the same payloads.

  kvevents_subscriber.py PUB_ENDPOINT REPLAY_ENDPOINT [TOPIC] [IDLE_SECONDS]

Prints READY once subscribed, then, when the stream has been quiet for
IDLE_SECONDS, one JSON line of counts. Exits 1 with a message on the first
violation. Used by cmd/pagedkv's TestSimulateKVEventsPython.
"""
import json
import sys

import msgpack
import zmq

STORED_REQUIRED = {"type", "block_hashes", "parent_block_hash", "token_ids",
                   "block_size", "lora_id", "medium", "lora_name"}
STORED_OPTIONAL = {"event_version", "extra_keys", "group_idx", "kv_cache_spec_kind",
                   "kv_cache_spec_sliding_window", "locality", "ownership"}
REMOVED_REQUIRED = {"type", "block_hashes", "medium"}
REMOVED_OPTIONAL = {"group_idx", "locality", "ownership"}


def fail(msg):
    print(f"kvevents_subscriber: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def check_event(i, ev):
    if not isinstance(ev, dict) or not isinstance(ev.get("type"), str):
        fail(f"event {i} is not a tagged map: {ev!r}")
    if next(iter(ev)) != "type":
        fail(f"event {i}: the tag is not the first key: {list(ev)}")
    t = ev["type"]
    keys = set(ev)
    if t == "BlockStored":
        req, opt = STORED_REQUIRED, STORED_OPTIONAL
    elif t == "BlockRemoved":
        req, opt = REMOVED_REQUIRED, REMOVED_OPTIONAL
    elif t == "AllBlocksCleared":
        req, opt = {"type"}, set()
    else:
        fail(f"event {i}: unknown type {t!r}")
    if not req <= keys or not keys <= req | opt:
        fail(f"event {i} ({t}): keys {sorted(keys)}, want {sorted(req)} plus some of {sorted(opt)}")
    if t == "AllBlocksCleared":
        return
    hashes = ev["block_hashes"]
    if not hashes or not all(isinstance(h, int) and 0 <= h < 1 << 64 for h in hashes):
        fail(f"event {i}: block_hashes {hashes!r}")
    if ev["medium"] not in ("GPU", "CPU", None) and not isinstance(ev["medium"], str):
        fail(f"event {i}: medium {ev['medium']!r}")
    if t == "BlockStored":
        bs, toks = ev["block_size"], ev["token_ids"]
        if not isinstance(bs, int) or bs < 1 or len(toks) != bs * len(hashes):
            fail(f"event {i}: {len(toks)} tokens for {len(hashes)} blocks of {bs}")
        if not all(isinstance(x, int) and x >= 0 for x in toks):
            fail(f"event {i}: token_ids not non-negative ints")
        p = ev["parent_block_hash"]
        if p is not None and not (isinstance(p, int) and 0 <= p < 1 << 64):
            fail(f"event {i}: parent_block_hash {p!r}")
        if ev["lora_id"] is not None or not (ev["lora_name"] is None or isinstance(ev["lora_name"], str)):
            fail(f"event {i}: lora_id {ev['lora_id']!r} lora_name {ev['lora_name']!r}")


def decode(payload):
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if not isinstance(batch, list) or len(batch) not in (2, 3):
        fail(f"batch is not [ts, events, data_parallel_rank]: {type(batch)}")
    if not isinstance(batch[0], float) or not isinstance(batch[1], list):
        fail(f"batch ts {batch[0]!r} / events {type(batch[1])}")
    if len(batch) == 3 and not (batch[2] is None or isinstance(batch[2], int)):
        fail(f"data_parallel_rank {batch[2]!r}")
    for i, ev in enumerate(batch[1]):
        check_event(i, ev)
    return batch


def main():
    pub_ep, replay_ep = sys.argv[1], sys.argv[2]
    topic = sys.argv[3] if len(sys.argv) > 3 else ""
    idle_ms = int(float(sys.argv[4] if len(sys.argv) > 4 else 3) * 1000)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.connect(pub_ep)
    sub.setsockopt_string(zmq.SUBSCRIBE, topic)
    print("READY", flush=True)

    payloads, media = [], {}
    counts = {"messages": 0, "events": 0, "stored": 0, "removed": 0, "cleared": 0, "stored_cpu": 0}
    while sub.poll(idle_ms if payloads else 120_000):
        frames = sub.recv_multipart()
        if len(frames) != 3 or len(frames[1]) != 8:
            fail(f"message of {len(frames)} frames")
        seq = int.from_bytes(frames[1], "big")
        if seq != len(payloads):
            fail(f"sequence {seq} after {len(payloads)} messages")
        if not frames[0].startswith(topic.encode()):
            fail(f"topic {frames[0]!r}")
        batch = decode(frames[2])
        payloads.append(frames[2])
        counts["messages"] += 1
        for ev in batch[1]:
            counts["events"] += 1
            if ev["type"] == "AllBlocksCleared":
                counts["cleared"] += 1
                for s in media.values():
                    s.clear()
                continue
            medium = ev["medium"] or "GPU"  # vLLM's None is the GPU pool
            cached = media.setdefault(medium, set())
            if ev["type"] == "BlockStored":
                counts["stored"] += len(ev["block_hashes"])
                if medium == "CPU":
                    counts["stored_cpu"] += len(ev["block_hashes"])
                p = ev["parent_block_hash"]
                if medium == "GPU" and p is not None and p not in cached:
                    fail(f"message {seq}: parent {p:#x} not cached")
                for h in ev["block_hashes"]:
                    if h in cached:
                        fail(f"message {seq}: stores {h:#x} twice in {medium}")
                    cached.add(h)
            else:
                counts["removed"] += len(ev["block_hashes"])
                for h in ev["block_hashes"]:
                    if h not in cached:
                        fail(f"message {seq}: removes {h:#x}, not cached in {medium}")
                    cached.discard(h)
    if not payloads:
        fail("no messages")

    # Replay from 1 on a DEALER (the REQ envelope: an empty delimiter).
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, b"python-replay")
    dealer.connect(replay_ep)
    dealer.send_multipart([b"", (1).to_bytes(8, "big")])
    replayed = 0
    while True:
        if not dealer.poll(10_000):
            fail("replay: no end marker")
        frames = dealer.recv_multipart()
        if len(frames) != 4 or frames[0] != b"":
            fail(f"replay reply of {len(frames)} frames")
        seq = int.from_bytes(frames[2], "big", signed=True)
        if seq == -1:
            if frames[3] != b"":
                fail("end marker with a payload")
            break
        if seq != 1 + replayed or frames[3] != payloads[seq]:
            fail(f"replay: sequence {seq} (#{replayed}) differs from the live stream")
        replayed += 1
    counts["replayed"] = replayed
    counts["blocks"] = len(media.get("GPU", ()))
    counts["blocks_by_medium"] = {m: len(s) for m, s in sorted(media.items())}
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
