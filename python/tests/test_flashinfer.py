"""pagedkv.flashinfer: a Plan as the exact keyword arguments of FlashInfer.

The parameter names below were read from flashinfer-python's sources
(flashinfer-ai/flashinfer at fb28d72, 2026-08: decode.py
BatchDecodeWithPagedKVCacheWrapper._plan_impl, prefill.py
BatchPrefillWithPagedKVCacheWrapper.plan, cascade.py
MultiLevelCascadeAttentionWrapper.plan, page.py append_paged_kv_cache).
Every keyword a helper returns must be a parameter of the call, every
required parameter must be present, and the arrays must be the plan's own
views (no copy) passed through `to`.
"""

import inspect

import numpy as np
import pytest

import engine_loop
import pagedkv
from pagedkv import flashinfer as fi

DECODE_REQUIRED = ["indptr", "indices", "last_page_len", "num_qo_heads", "num_kv_heads", "head_dim", "page_size"]
DECODE_OPTIONAL = ["pos_encoding_mode", "window_left", "window_right", "logits_soft_cap", "q_data_type",
                   "kv_data_type", "o_data_type", "data_type", "sm_scale", "rope_scale", "rope_theta",
                   "non_blocking", "block_tables", "seq_lens", "fixed_split_size", "disable_split_kv",
                   "q_len_per_req"]
PREFILL_REQUIRED = ["qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len", "num_qo_heads",
                    "num_kv_heads", "head_dim_qk", "page_size"]
PREFILL_OPTIONAL = ["head_dim_vo", "custom_mask", "packed_custom_mask", "causal", "pos_encoding_mode",
                    "use_fp16_qk_reduction", "sm_scale", "window_left", "logits_soft_cap", "rope_scale",
                    "rope_theta", "q_data_type", "kv_data_type", "o_data_type", "non_blocking", "prefix_len_ptr",
                    "token_pos_in_items_ptr", "token_pos_in_items_len", "max_item_len_ptr", "seq_lens",
                    "seq_lens_q", "block_tables", "max_token_per_sequence", "max_sequence_kv",
                    "fixed_split_size", "disable_split_kv"]
CASCADE_REQUIRED = ["qo_indptr_arr", "paged_kv_indptr_arr", "paged_kv_indices_arr", "paged_kv_last_page_len",
                    "num_qo_heads", "num_kv_heads", "head_dim", "page_size"]
CASCADE_OPTIONAL = ["causal", "pos_encoding_mode", "use_fp16_qk_reduction", "sm_scale", "window_left",
                    "logits_soft_cap", "rope_scale", "rope_theta", "q_data_type", "kv_data_type"]
APPEND_REQUIRED = ["append_key", "append_value", "batch_indices", "positions", "paged_kv_cache", "kv_indices",
                   "kv_indptr", "kv_last_page_len"]
APPEND_OPTIONAL = ["kv_layout"]
CALLER_SUPPLIED = {"append_key", "append_value", "paged_kv_cache"}


def check_names(kw, required, optional, supplied=()):
    assert set(kw) <= set(required) | set(optional), set(kw) - set(required) - set(optional)
    assert set(required) - set(supplied) <= set(kw), set(required) - set(kw)


def shared_prefix_manager():
    m = pagedkv.Manager(64, 4, hash_seed=1)
    shared = list(range(100, 132))
    m.add(1, shared + [1])
    m.reserve([1], [33])
    m.commit([5])
    for i in range(2, 5):
        m.add(i, shared + [i] * 3)
    return m


def test_decode_prefill_append_kwargs():
    m = shared_prefix_manager()
    m.reserve([2, 3, 4], [3, 3, 3])
    m.commit([6, 7, 8])
    m2 = pagedkv.Manager(64, 4, cascade_min_saved_pages=-1, hash_seed=1)  # flat plans
    m2.add(1, list(range(10)))
    m2.reserve([1], [10])
    m2.commit([3])
    plan = m2.reserve([1], [1])
    assert fi.attention_kind(plan) == "decode"
    kw = fi.decode_plan_kwargs(plan, 8, 2, 64, 4, q_data_type="bfloat16")
    check_names(kw, DECODE_REQUIRED, DECODE_OPTIONAL)
    assert kw["indptr"] is plan.kv_indptr and kw["indices"] is plan.kv_page_indices
    assert kw["last_page_len"] is plan.kv_last_page_len and kw["window_left"] == -1
    assert kw["q_data_type"] == "bfloat16" and kw["head_dim"] == 64 and kw["page_size"] == 4
    kw = fi.prefill_plan_kwargs(plan, 8, 2, 64, 4)
    check_names(kw, PREFILL_REQUIRED, PREFILL_OPTIONAL)
    assert kw["qo_indptr"] is plan.qo_indptr and kw["paged_kv_indices"] is plan.kv_page_indices
    assert kw["causal"] is True and kw["head_dim_qk"] == 64
    kw = fi.append_kwargs(plan)
    check_names(kw, APPEND_REQUIRED, APPEND_OPTIONAL, CALLER_SUPPLIED)
    assert kw["batch_indices"] is plan.batch_indices and kw["positions"] is plan.positions
    with pytest.raises(pagedkv.BadArgument, match="flat"):
        fi.cascade_plan_kwargs(plan, 8, 2, 64, 4)
    m2.commit(None)
    m2.extend(1, [1, 2])
    plan = m2.reserve([1], [2])
    assert fi.attention_kind(plan) == "prefill"
    with pytest.raises(pagedkv.BadArgument, match="not one row per request"):
        fi.decode_plan_kwargs(plan, 8, 2, 64, 4)
    m.close()
    m2.close()


def test_cascade_kwargs():
    m = shared_prefix_manager()
    plan = m.reserve([2, 3, 4], [3, 3, 3])
    assert fi.attention_kind(plan) == "cascade" and plan.copy().attention_kind == "cascade"
    seen = []
    kw = fi.cascade_plan_kwargs(plan, 8, 2, 64, 4, to=lambda a: seen.append(a) or ("T", a))
    check_names(kw, CASCADE_REQUIRED, CASCADE_OPTIONAL)
    n = len(plan.cascade)
    assert all(len(kw[k]) == n for k in CASCADE_REQUIRED[:4])
    for i, lv in enumerate(plan.cascade):
        assert kw["qo_indptr_arr"][i] == ("T", lv.qo_indptr)
        assert kw["paged_kv_indices_arr"][i][1] is lv.kv_indices
        assert kw["paged_kv_last_page_len"][i][1] is lv.kv_last_page_len
    assert len(seen) == 4 * n and kw["causal"] is True
    m.abort()
    m.close()


@pytest.mark.parametrize("fn,required,optional", [
    (engine_loop.BatchDecodeWithPagedKVCacheWrapper.plan, DECODE_REQUIRED, DECODE_OPTIONAL),
    (engine_loop.BatchPrefillWithPagedKVCacheWrapper.plan, PREFILL_REQUIRED, PREFILL_OPTIONAL),
    (engine_loop.MultiLevelCascadeAttentionWrapper.plan, CASCADE_REQUIRED, CASCADE_OPTIONAL),
    (engine_loop.append_paged_kv_cache, APPEND_REQUIRED, APPEND_OPTIONAL),
])
def test_numpy_reference_has_flashinfer_signatures(fn, required, optional):
    """The engine loop's numpy stand-ins take FlashInfer's names (so the
    loop that passes the helpers' kwargs to them would pass them to
    FlashInfer), and nothing FlashInfer does not."""
    params = [p for p in inspect.signature(fn).parameters if p != "self"]
    assert params[:len(required)] == required
    assert set(params[len(required):]) <= set(optional)


def test_kwargs_are_torch_ready_views():
    m = shared_prefix_manager()
    plan = m.reserve([2, 3, 4], [3, 3, 3])
    for lv in plan.cascade:
        for a in (lv.qo_indptr, lv.kv_indptr, lv.kv_indices, lv.kv_last_page_len):
            assert a.dtype == np.int32 and a.flags.c_contiguous and a.flags.writeable
    m.abort()
    m.close()
