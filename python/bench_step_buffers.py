#!/usr/bin/env python3
"""Per-step Python overhead with engine-owned step buffers against plan
views, in one run (docs/python.md, "Step buffers", reports the figures).

The workload is bench_step.py's: --requests requests with distinct 64-token
prompts, prefilled, then decode steps (reserve one token each, commit). Four
modes, alternating, in one run:

  views            - reserve + commit, the plan's views read (today);
  bound            - the same with bind_step_buffers (capacities: the
                     requests, one token each, every page they reach);
  views + 8 copies - and each of the step's 8 arrays (qo_indptr,
                     batch_indices, positions, token_ids, kv_indptr,
                     kv_page_indices, kv_last_page_len, seq_lens) copied into
                     its own staging array (what precedes 8 uploads today);
  bound + 1 copy   - and one copy of the whole bound buffer (one upload).

Runs alternate; min and median over runs are printed.

    python3 python/bench_step_buffers.py                 # 256 requests
"""

import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_step import prefilled, step_args  # noqa: E402
ARRAYS = ("qo_indptr", "batch_indices", "positions", "token_ids", "kv_indptr", "kv_page_indices", "kv_last_page_len",
          "seq_lens")


def run(requests, warm, steps, page_size, bound, stage):
    m, ids, ones, sampled, pages_each = prefilled(requests, warm, steps, page_size)
    sb = None
    if bound:
        sb = m.bind_step_buffers(max_requests=requests, max_tokens=requests, max_pages=requests * pages_each)
        device = np.zeros(sb.size, dtype=np.uint8)
    else:
        device = {name: np.zeros(requests * pages_each + 1, dtype=np.int32) for name in ARRAYS}

    def step():
        plan = m.reserve(ids, ones)
        if not stage:
            for name in ARRAYS:
                getattr(plan, name)
        elif bound:
            np.copyto(device, sb.buffer)  # one upload of the whole step
        else:
            for name in ARRAYS:
                a = getattr(plan, name)
                np.copyto(device[name][:a.size], a)
        m.commit(sampled)
        return plan

    for _ in range(warm):
        step()
    t0 = time.perf_counter_ns()
    for _ in range(steps):
        plan = step()
    ns = time.perf_counter_ns() - t0
    assert plan.kv_indptr.size == requests + 1
    m.close()
    return ns / steps


def main():
    ap = step_args(__doc__)
    ap.add_argument("--page-size", type=int, default=16)
    a = ap.parse_args()
    modes = [("views", False, False), ("bound", True, False), ("views + 8 copies", False, True),
             ("bound + 1 copy", True, True)]
    ns = {name: [] for name, _, _ in modes}
    for _ in range(a.reps):
        for name, bound, stage in modes:
            ns[name].append(run(a.requests, a.warm, a.steps, a.page_size, bound, stage))
    print("decode step, %d running requests, %d runs of %d steps, us/step:" % (a.requests, a.reps, a.steps))
    print("                        min   median")
    for name, _, _ in modes:
        print("  %-18s %7.1f  %7.1f" % (name, min(ns[name]) / 1e3, statistics.median(ns[name]) / 1e3))
    for b, v in (("bound", "views"), ("bound + 1 copy", "views + 8 copies")):
        print("  %s / %s: %.2fx (min) %.2fx (median); goal <= 1" % (b, v, min(ns[b]) / min(ns[v]),
                                                                   statistics.median(ns[b]) / statistics.median(ns[v])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
