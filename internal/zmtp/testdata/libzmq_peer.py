#!/usr/bin/env python3
"""libzmq (pyzmq) peers for internal/zmtp's interoperability tests.

  libzmq_peer.py MODE ENDPOINT

Modes (each prints READY once its socket is set up, then a line per check):
  pub     binds PUB, waits for a subscriber, sends [b"kv", seq, payload] for
          seq 0..99 every few milliseconds until stdin closes
  pub-heartbeat
          the same, 10 ms apart, with heartbeats every 20 ms that drop a
          peer that has not answered for 300 ms (ZMQ_HEARTBEAT_IVL, _TIMEOUT)
  router  binds ROUTER, answers each [id, "", x] with [id, "", b"re:" + x]
          until stdin closes
  sub     connects SUB (topic b"kv"), prints each message's frames as hex
          joined by "," until 5 messages are in
  dealer  connects DEALER (identity b"py-dealer"), sends ["", b"ping"],
          prints the reply's frames as hex
  req     connects REQ, sends b"ping", prints the reply's frames as hex
  dealer-twice
          connects DEALER (identity b"py-dealer"), sends ["", b"ping"],
          prints the reply's frames as hex, waits for a line on stdin, then
          sends ["", b"ping2"] and prints that reply's frames
"""
import sys
import time

import zmq


def line(frames):
    print(",".join(f.hex() for f in frames), flush=True)


def main():
    mode, ep = sys.argv[1], sys.argv[2]
    ctx = zmq.Context()
    if mode in ("pub", "pub-heartbeat"):
        s = ctx.socket(zmq.XPUB)
        if mode == "pub-heartbeat":
            s.setsockopt(zmq.HEARTBEAT_IVL, 20)
            s.setsockopt(zmq.HEARTBEAT_TIMEOUT, 300)
        port = s.bind_to_random_port("tcp://127.0.0.1")
        print(f"READY tcp://127.0.0.1:{port}", flush=True)
        sub = s.recv()  # the subscription, b"\x01kv"
        print("SUBSCRIBED " + sub.hex(), flush=True)
        for seq in range(100):
            s.send_multipart([b"kv", seq.to_bytes(8, "big"), bytes([seq]) * (seq * 7)])
            time.sleep(0.002 if mode == "pub" else 0.01)
        sys.stdin.read()
    elif mode == "router":
        s = ctx.socket(zmq.ROUTER)
        port = s.bind_to_random_port("tcp://127.0.0.1")
        print(f"READY tcp://127.0.0.1:{port}", flush=True)
        while True:
            frames = s.recv_multipart()
            line(frames)
            s.send_multipart(frames[:-1] + [b"re:" + frames[-1]])
    elif mode == "sub":
        s = ctx.socket(zmq.SUB)
        s.connect(ep)
        s.setsockopt(zmq.SUBSCRIBE, b"kv")
        print("READY", flush=True)
        for _ in range(5):
            line(s.recv_multipart())
    elif mode in ("dealer", "req"):
        s = ctx.socket(zmq.DEALER if mode == "dealer" else zmq.REQ)
        if mode == "dealer":
            s.setsockopt(zmq.IDENTITY, b"py-dealer")
        s.connect(ep)
        print("READY", flush=True)
        s.send_multipart([b"", b"ping"] if mode == "dealer" else [b"ping"])
        if not s.poll(10_000):
            print("TIMEOUT", flush=True)
            sys.exit(1)
        line(s.recv_multipart())
    elif mode == "dealer-twice":
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.IDENTITY, b"py-dealer")
        s.connect(ep)
        print("READY", flush=True)
        for msg in (b"ping", b"ping2"):
            if msg == b"ping2":
                sys.stdin.readline()
            s.send_multipart([b"", msg])
            if not s.poll(10_000):
                print("TIMEOUT", flush=True)
                sys.exit(1)
            line(s.recv_multipart())


if __name__ == "__main__":
    main()
