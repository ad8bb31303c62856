#!/usr/bin/env python3
"""A KV-event publisher on libzmq (pyzmq) and msgpack, shaped after vLLM's
ZmqEventPublisher (vllm/distributed/kv_events.py): a PUB socket sending
[topic, seq (8 bytes big-endian), payload] and a ROUTER socket serving
replays of the buffered batches. Used by kvindex's
TestLibzmqPublisherJoinReplay.

  vllm_publisher.py BATCHES

Binds both sockets on free loopback ports and prints
"READY <pub endpoint> <replay endpoint>", then publishes BATCHES batches,
one every 20 ms, and serves replays until stdin closes. Batch s stores
block s+1 (parent s, none for s = 0, tokens [s, s, s, s], block size 4)
and, when s is odd, removes block s.
"""
import sys
import time

import msgpack
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def payload(seq):
    stored = {"type": "BlockStored", "block_hashes": [seq + 1],
              "parent_block_hash": seq if seq > 0 else None,
              "token_ids": [seq] * 4, "block_size": 4, "lora_id": None,
              "medium": "GPU", "lora_name": None}
    events = [stored]
    if seq % 2 == 1:
        events.append({"type": "BlockRemoved", "block_hashes": [seq], "medium": "GPU"})
    return msgpack.packb([time.time(), events, 0])


def serve_replay(router, buffer, topic):
    frames = router.recv_multipart()
    if len(frames) != 3:
        return
    client, _, start = frames
    start = int.from_bytes(start, "big")
    for seq, buf in buffer:
        if seq >= start:
            router.send_multipart([client, b"", topic, seq.to_bytes(8, "big"), buf])
    router.send_multipart([client, b"", b"", END_SEQ, b""])


def main():
    batches = int(sys.argv[1])
    topic = b"kv@replica@model"
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
    router = ctx.socket(zmq.ROUTER)
    replay_port = router.bind_to_random_port("tcp://127.0.0.1")
    print(f"READY tcp://127.0.0.1:{pub_port} tcp://127.0.0.1:{replay_port}", flush=True)
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(sys.stdin, zmq.POLLIN)
    buffer, seq, next_send = [], 0, time.monotonic()
    while True:
        timeout = max(0, next_send - time.monotonic()) * 1000 if seq < batches else None
        ready = dict(poller.poll(timeout))
        if router in ready:
            serve_replay(router, buffer, topic)
        if sys.stdin.fileno() in ready and not sys.stdin.read(1):
            return
        if seq < batches and time.monotonic() >= next_send:
            buf = payload(seq)
            buffer.append((seq, buf))
            pub.send_multipart([topic, seq.to_bytes(8, "big"), buf])
            seq += 1
            next_send += 0.02


if __name__ == "__main__":
    main()
