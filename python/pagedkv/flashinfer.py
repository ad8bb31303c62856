"""A pagedkv Plan as the keyword arguments of FlashInfer's calls.

Each function returns a dict to splat into one FlashInfer call, with the
parameter names of flashinfer-python (checked against v0.6.x sources:
flashinfer/decode.py, prefill.py, cascade.py, page.py):

    wrapper.plan(**decode_plan_kwargs(plan, Hq, Hkv, D, page_size))    # BatchDecodeWithPagedKVCacheWrapper
    wrapper.plan(**prefill_plan_kwargs(plan, Hq, Hkv, D, page_size))   # BatchPrefillWithPagedKVCacheWrapper
    wrapper.plan(**cascade_plan_kwargs(plan, Hq, Hkv, D, page_size))   # MultiLevelCascadeAttentionWrapper(len(plan.cascade), ...)
    flashinfer.append_paged_kv_cache(k, v, paged_kv_cache=cache, **append_kwargs(plan))

Arrays are the Plan's numpy int32 views, passed through `to` (for example
`to=lambda a: torch.from_numpy(a).to("cuda")`; plan() accepts host tensors,
append_paged_kv_cache needs them on the device). Extra keyword arguments
(q_data_type, sm_scale, pos_encoding_mode, ...) are passed through.

Cascade plans order query rows per level: give the wrapper
q[plan.query_rows] and scatter its output back with out[plan.query_rows] = o.
The append always uses the plan's own row order.
"""

from . import BadArgument

__all__ = ["decode_plan_kwargs", "prefill_plan_kwargs", "cascade_plan_kwargs", "append_kwargs", "attention_kind"]


def _identity(a):
    return a


def attention_kind(plan):
    """'cascade' when the plan has cascade levels, 'decode' when every
    request has exactly one query row, else 'prefill'."""
    if plan.cascade is not None:
        return "cascade"
    q = plan.qo_indptr
    if plan.batch_size > 0 and bool(((q[1:] - q[:-1]) == 1).all()):
        return "decode"
    return "prefill"


def decode_plan_kwargs(plan, num_qo_heads, num_kv_heads, head_dim, page_size, *, to=_identity, **extra):
    """BatchDecodeWithPagedKVCacheWrapper.plan(); every request must have
    exactly one query row (a decode step)."""
    q = plan.qo_indptr
    if plan.batch_size == 0 or not bool(((q[1:] - q[:-1]) == 1).all()):
        raise BadArgument("pagedkv: decode_plan_kwargs: qo_indptr %s is not one row per request; use "
                          "prefill_plan_kwargs" % (q.tolist(),))
    kw = dict(
        indptr=to(plan.kv_indptr),
        indices=to(plan.kv_page_indices),
        last_page_len=to(plan.kv_last_page_len),
        num_qo_heads=num_qo_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        page_size=page_size,
        window_left=plan.window_left,
    )
    kw.update(extra)
    return kw


def prefill_plan_kwargs(plan, num_qo_heads, num_kv_heads, head_dim, page_size, *, causal=True, to=_identity,
                        **extra):
    """BatchPrefillWithPagedKVCacheWrapper.plan() (causal: bottom-right
    aligned, as a chunked prefill needs)."""
    kw = dict(
        qo_indptr=to(plan.qo_indptr),
        paged_kv_indptr=to(plan.kv_indptr),
        paged_kv_indices=to(plan.kv_page_indices),
        paged_kv_last_page_len=to(plan.kv_last_page_len),
        num_qo_heads=num_qo_heads,
        num_kv_heads=num_kv_heads,
        head_dim_qk=head_dim,
        page_size=page_size,
        causal=causal,
        window_left=plan.window_left,
    )
    kw.update(extra)
    return kw


def cascade_plan_kwargs(plan, num_qo_heads, num_kv_heads, head_dim, page_size, *, causal=True, to=_identity,
                        **extra):
    """MultiLevelCascadeAttentionWrapper.plan(); construct the wrapper with
    num_levels=len(plan.cascade). FlashInfer applies causal to the last
    level only, which is where pagedkv puts each request's own pages."""
    if plan.cascade is None:
        raise BadArgument("pagedkv: cascade_plan_kwargs: the plan is flat (plan.cascade is None)")
    levels = plan.cascade
    kw = dict(
        qo_indptr_arr=[to(lv.qo_indptr) for lv in levels],
        paged_kv_indptr_arr=[to(lv.kv_indptr) for lv in levels],
        paged_kv_indices_arr=[to(lv.kv_indices) for lv in levels],
        paged_kv_last_page_len=[to(lv.kv_last_page_len) for lv in levels],
        num_qo_heads=num_qo_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        page_size=page_size,
        causal=causal,
    )
    kw.update(extra)
    return kw


def append_kwargs(plan, *, to=_identity):
    """append_paged_kv_cache's index arguments (pass append_key,
    append_value and paged_kv_cache yourself; kv_layout if not NHD)."""
    return dict(
        batch_indices=to(plan.batch_indices),
        positions=to(plan.positions),
        kv_indices=to(plan.kv_page_indices),
        kv_indptr=to(plan.kv_indptr),
        kv_last_page_len=to(plan.kv_last_page_len),
    )
