"""An engine loop written against pagedkv's type hints: test_api.py runs
mypy --strict on it (and it runs: test_typed_example_runs)."""

from typing import List, Optional

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


def state_model() -> str:
    """A Qwen3-Next-like model: state groups with checkpoints, prefill cut at
    each next_state_checkpoint, the state slots and copies of each step."""
    st = pagedkv.LayerGroup("state", conv_shape=(8, 3), conv_dtype="bfloat16", ssm_shape=(2, 4, 8),
                            ssm_dtype="float32", page_bytes=4096)
    groups = [st, st, pagedkv.LayerGroup("full"), pagedkv.LayerGroup("shared_kv", target=2, num_layers=2)]
    with pagedkv.HybridManager(64, 4, groups, hash_seed=1, state_checkpoint_every=8) as h:
        h.add(1, list(range(100, 112)))
        slots: List[int] = []
        while True:
            nxt: int = h.next_state_checkpoint(1)
            if nxt == 0:
                break
            plan: pagedkv.HybridPlan = h.reserve([1], [nxt - h.request_state(1).computed])
            idx: Optional[pagedkv.Int32Array] = plan.groups[0].state_indices
            slots.append(-1 if idx is None else int(idx[0]))
            h.commit([7] if nxt == 12 else [pagedkv.NO_TOKEN])
        hit: int = h.add(2, list(range(100, 113)))
        copies = h.reserve([2], [1]).groups[1].copies
        h.abort()
        return "%d slots, hit %d, %d copies" % (len(slots), hit, len(copies))


if __name__ == "__main__":
    print(main())
