"""An engine loop written against pagedkv's type hints: test_api.py runs
mypy --strict on it (and it runs: test_typed_example_runs)."""

from typing import List

import numpy as np

import pagedkv


def step(m: pagedkv.Manager, ids: List[int]) -> int:
    plan: pagedkv.Plan = m.reserve(ids, [1] * len(ids))
    indptr: pagedkv.Int32Array = plan.kv_indptr
    pages = int(indptr[-1])
    m.commit([pagedkv.NO_TOKEN] * len(ids))
    return pages


def main() -> str:
    with pagedkv.Manager(num_pages=64, page_size=16, hash_seed=1, busy_timeout=0.5) as m:
        matched: int = m.add(1, np.arange(40, dtype=np.int32), tenant="a")
        plan = m.reserve([1], [40])
        levels = plan.cascade or []
        m.commit([7])
        n = step(m, [1])
        st: pagedkv.Stats = m.stats()
        state = m.request_state(1)
        toks = m.tokens(1)
        usage: pagedkv.CacheUsage = m.cache_usage(1)
        written: int = usage.write_tokens + m.cache_usage_totals().read_tokens
        h = pagedkv.HybridManager(64, 16, [pagedkv.LayerGroup("sliding", window_tokens=32), pagedkv.LayerGroup("full")])
        h.add(2, [1, 2, 3])
        hp = h.reserve([2], [3])
        windows = [g.window_left for g in hp.groups]
        h.close()
        return "%d %d %d %s %d %d %s %d %s" % (matched, len(levels), n, st.hit_rate, state.computed, len(toks), windows,
                                               written, pagedkv.__version__)


if __name__ == "__main__":
    print(main())
