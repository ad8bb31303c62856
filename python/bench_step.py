#!/usr/bin/env python3
"""Per-step overhead of pagedkv from Python against the same steps in Go,
in one run (docs/python.md reports the figure).

The workload: --requests requests with distinct 64-token prompts,
prefilled in one step, then decode steps: reserve one token per request,
build the Plan (numpy views of every array), commit one sampled token per
request. The Go figure is the same workload run inside the library by
pagedkv_bench_decode_steps (pagedkv.Manager called directly from Go); the
Python figure goes through the package. Go and Python runs alternate;
the minimum over runs is the figure least disturbed by other load on the
machine (both minimum and median are printed).

    python3 python/bench_step.py                 # 256 requests
    python3 python/bench_step.py --requests 64 --steps 500
"""

import argparse
import ctypes
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pagedkv  # noqa: E402

PROMPT = 64


def prefilled(requests, warm, steps, page_size):
    """The workload's manager after the prefill step, with room for warm +
    steps decode steps: (manager, ids, ones, sampled, pages per request)."""
    total = PROMPT + warm + steps + 1
    pages_each = -(-total // page_size) + 1
    m = pagedkv.Manager(requests * pages_each, page_size, hash_seed=1)
    ids = np.arange(1, requests + 1, dtype=np.uint64)
    for i in range(requests):
        m.add(i + 1, np.arange(i * PROMPT, (i + 1) * PROMPT, dtype=np.int32), capacity_tokens=total)
    ones = np.ones(requests, dtype=np.int32)
    sampled = np.full(requests, 7, dtype=np.int32)
    m.reserve(ids, np.full(requests, PROMPT, dtype=np.int32))
    m.commit(sampled)
    return m, ids, ones, sampled, pages_each


def step_args(doc):
    """The command line both step benchmarks take."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warm", type=int, default=50)
    ap.add_argument("--reps", type=int, default=15)
    return ap


def python_steps(requests, warm, steps, page_size):
    m, ids, ones, sampled, _ = prefilled(requests, warm, steps, page_size)
    for _ in range(warm):
        m.reserve(ids, ones)
        m.commit(sampled)
    t0 = time.perf_counter_ns()
    for _ in range(steps):
        plan = m.reserve(ids, ones)
        m.commit(sampled)
    ns = time.perf_counter_ns() - t0
    assert plan.kv_indptr.size == requests + 1
    m.close()
    return ns


def go_steps(requests, warm, steps, page_size):
    lib = pagedkv._load()
    fn = lib.pagedkv_bench_decode_steps
    fn.restype = ctypes.c_int32
    fn.argtypes = [ctypes.c_int64] * 5 + [ctypes.POINTER(ctypes.c_int64)]
    ns = ctypes.c_int64(0)
    rc = fn(requests, PROMPT, warm, steps, page_size, ctypes.byref(ns))
    if rc:
        pagedkv._raise(lib, rc)
    return ns.value


def measure(requests=256, steps=200, warm=50, reps=15, page_size=16):
    """Returns the per-step nanoseconds of every run: (go, python) lists."""
    go, py = [], []
    for _ in range(reps):
        go.append(go_steps(requests, warm, steps, page_size) / steps)
        py.append(python_steps(requests, warm, steps, page_size) / steps)
    return go, py


def main():
    a = step_args(__doc__).parse_args()
    go, py = measure(a.requests, a.steps, a.warm, a.reps)
    print("decode step (reserve + plan + commit), %d running requests, %d runs of %d steps, us/step:"
          % (a.requests, a.reps, a.steps))
    print("                              min   median")
    print("  Go (pagedkv.Manager)     %7.1f  %7.1f" % (min(go) / 1e3, statistics.median(go) / 1e3))
    print("  Python (pagedkv package) %7.1f  %7.1f" % (min(py) / 1e3, statistics.median(py) / 1e3))
    print("  Python / Go              %7.2fx %7.2fx  (goal: within 3x)"
          % (min(py) / min(go), statistics.median(py) / statistics.median(go)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
