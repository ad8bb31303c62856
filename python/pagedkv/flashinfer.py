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

Attention sinks (gpt-oss) are not a plan() argument: pass them to the
wrapper's run(..., sinks=...) (float32 [num_qo_heads], one logit per query
head) with a backend that honours them (trtllm-gen). With a cascade, give
them to the last level only, or add them once after merging, never per
level (docs/attention.md, "Attention sinks").

Cascade plans order query rows per level: give the wrapper
q[plan.query_rows] and scatter its output back with out[plan.query_rows] = o.
The append always uses the plan's own row order.

A HybridManager step has one Plan per layer group. Each group appends its
own K and V with append_kwargs(group_plan), after the pool-wide
plan.copies, and runs its attention with

    for kind, kw in hybrid_plan_kwargs(plan, Hq, Hkv, D, page_size):
        wrapper[kind].plan(**kw)    # kind: "decode", "prefill" or "cascade"

group_attention_kwargs(group_plan, ...) gives one group's (kind, kwargs):
a chunked group's flat attention is batch prefill over its attn_* arrays
(one entry per run of a request's rows inside one chunk), every other
group's is the dense choice with the group's window_left; a cascade passes
the group's window_left to every level, which is exact (pagedkv only
shares keys every row of a level sees in full, see docs/manager.md,
"Cascade with windows").

The padded contract of FlashInfer's fastest decode backends needs a
Manager made with block_tables_stride > 0 (plan.block_tables):

    flashinfer.decode.trtllm_batch_decode_with_kv_cache(q, kv_cache, workspace, **trtllm_decode_kwargs(plan))
    flashinfer.cudnn_batch_decode_with_kv_cache(q, k_cache, v_cache, scale, workspace, **cudnn_decode_kwargs(plan))

block_tables and seq_lens name the same pages as the CSR arrays (a
sliding window's released pages are in neither; docs/pagetable.md,
"Padded block tables"); max_seq_len is block_tables_stride * page_size,
the same every step, so a CUDA graph can replay the call.
"""

from . import BadArgument

__all__ = ["decode_plan_kwargs", "prefill_plan_kwargs", "cascade_plan_kwargs", "append_kwargs", "attention_kind",
           "group_attention_kwargs", "hybrid_plan_kwargs", "trtllm_decode_kwargs", "cudnn_decode_kwargs"]


def _identity(a):
    return a


def attention_kind(plan):
    """The attention plan runs, as the library decides it (plan.attention_kind,
    from the C ABI's pagedkv_plan.attention_kind; Go: Plan.AttentionKind):
    'cascade' when the plan has cascade levels, 'chunked' for a chunked
    group's plan (batch prefill over its attn_* arrays), 'decode' when every
    request has exactly one query row, else 'prefill'."""
    return plan.attention_kind


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
    return _prefill(plan.qo_indptr, plan.kv_indptr, plan.kv_page_indices, plan.kv_last_page_len, num_qo_heads,
                    num_kv_heads, head_dim, page_size, causal, plan.window_left, to, extra)


def _prefill(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             causal, window_left, to, extra):
    kw = dict(
        qo_indptr=to(qo_indptr),
        paged_kv_indptr=to(kv_indptr),
        paged_kv_indices=to(kv_indices),
        paged_kv_last_page_len=to(kv_last_page_len),
        num_qo_heads=num_qo_heads,
        num_kv_heads=num_kv_heads,
        head_dim_qk=head_dim,
        page_size=page_size,
        causal=causal,
        window_left=window_left,
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


def group_attention_kwargs(plan, num_qo_heads, num_kv_heads, head_dim, page_size, *, to=_identity, **extra):
    """One layer group's attention of a HybridManager step as (kind, kwargs):
    kind "cascade" (MultiLevelCascadeAttentionWrapper(len(plan.cascade)),
    with the group's window_left on every level), "decode" or "prefill"
    (the dense wrappers with the group's window_left), or, for a chunked
    group's flat plan, "prefill" over its attn_* arrays (causal,
    window_left -1): its rows come out in the plan's own order."""
    kind = attention_kind(plan)
    if kind == "cascade":
        extra.setdefault("window_left", plan.window_left)
        return kind, cascade_plan_kwargs(plan, num_qo_heads, num_kv_heads, head_dim, page_size, to=to, **extra)
    if kind == "chunked":
        return "prefill", _prefill(plan.attn_qo_indptr, plan.attn_kv_indptr, plan.attn_kv_page_indices,
                                   plan.attn_kv_last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, True,
                                   -1, to, extra)
    if kind == "decode":
        return kind, decode_plan_kwargs(plan, num_qo_heads, num_kv_heads, head_dim, page_size, to=to, **extra)
    return kind, prefill_plan_kwargs(plan, num_qo_heads, num_kv_heads, head_dim, page_size, to=to, **extra)


def hybrid_plan_kwargs(plan, num_qo_heads, num_kv_heads, head_dim, page_size, *, to=_identity, **extra):
    """group_attention_kwargs of every group of a HybridPlan, in group order."""
    return [group_attention_kwargs(g, num_qo_heads, num_kv_heads, head_dim, page_size, to=to, **dict(extra))
            for g in plan.groups]


def _padded(plan, op):
    """plan's block_tables, refusing a plan without them or whose attention
    is not its page table (a chunked group's)."""
    if plan.block_tables is None:
        raise BadArgument("pagedkv: %s: the plan has no block_tables; make the Manager with block_tables_stride > 0"
                          % op)
    if plan.attn_qo_indptr is not None:
        raise BadArgument("pagedkv: %s: a chunked group's attention is its attn_* arrays (batch prefill), "
                          "not its page table" % op)
    return plan.block_tables


def trtllm_decode_kwargs(plan, *, to=_identity, **extra):
    """trtllm_batch_decode_with_kv_cache(query, kv_cache, workspace_buffer,
    **kw) (backend trtllm-gen or xqa): block_tables [B, stride], seq_lens
    [B], max_seq_len, window_left, and the query layout: q_len_per_req when
    every request has the same number of rows (1 for decode, 1 + drafts for
    uniform speculative steps), else max_q_len and cum_seq_lens_q (the
    plan's qo_indptr; trtllm-gen only). kv_layout is FlashInfer's default,
    HND; pass kv_layout="NHD" for an NHD cache."""
    bt = _padded(plan, "trtllm_decode_kwargs")
    q = plan.qo_indptr
    rows = q[1:] - q[:-1]
    if plan.batch_size == 0 or not bool((rows > 0).all()):
        raise BadArgument("pagedkv: trtllm_decode_kwargs: qo_indptr %s has a request without query rows"
                          % (q.tolist(),))
    kw = dict(block_tables=to(bt), seq_lens=to(plan.seq_lens), max_seq_len=plan.max_seq_len,
              window_left=plan.window_left)
    if bool((rows == rows[0]).all()):
        kw["q_len_per_req"] = int(rows[0])
    else:
        kw.update(q_len_per_req=None, max_q_len=int(rows.max()), cum_seq_lens_q=to(q))
    kw.update(extra)
    return kw


def cudnn_decode_kwargs(plan, *, to=_identity, host=_identity, **extra):
    """cudnn_batch_decode_with_kv_cache(q, k_cache, v_cache, scale,
    workspace_buffer, **kw): max_sequence_kv, actual_seq_lens_kv (through
    host: FlashInfer wants it on the CPU) and block_tables. cuDNN decode has
    one query row per request and no window: a plan with more rows or a
    window_left is refused."""
    bt = _padded(plan, "cudnn_decode_kwargs")
    q = plan.qo_indptr
    if plan.batch_size == 0 or not bool(((q[1:] - q[:-1]) == 1).all()):
        raise BadArgument("pagedkv: cudnn_decode_kwargs: qo_indptr %s is not one row per request" % (q.tolist(),))
    if plan.window_left >= 0:
        raise BadArgument("pagedkv: cudnn_decode_kwargs: window_left = %d, but cuDNN decode has no window; use "
                          "trtllm_decode_kwargs" % plan.window_left)
    kw = dict(max_sequence_kv=plan.max_seq_len, actual_seq_lens_kv=host(plan.seq_lens), block_tables=to(bt))
    kw.update(extra)
    return kw
