// sink.cuh: FlashInfer's attention sinks (gpt-oss): sinks [num_qo_heads]
// float32 holds one logit per query head, in the natural-log domain of the
// scaled logits s_j = (q·k_j) * sm_scale; it joins the softmax denominator
// once and carries no value (docs/attention.md, "Attention sinks").
#ifndef PAGEDKV_SINK_CUH
#define PAGEDKV_SINK_CUH

#include "compat.cuh"

namespace pkv {

// sink_fold folds query head hq's sink into the finished state (m, d) of a
// whole row (base-2 maximum m, denominator d, o = acc / d): one more key of
// logit sinks[hq]*log2(e) and value zero. It returns the factor the
// unnormalised accumulator is rescaled by (1 without sinks). The tiled
// prefill calls it only where it writes the final o and lse, never on a
// split-KV partial state: merge_partial_states folds the sink there
// instead, so a sink is counted once however the keys are split. The
// decode kernels take no sinks (a fold at their end pushed the CUDA-core
// v8 fp8 entries past 64 registers into spills): a step with sinks always
// merges their states, one per row at least, with merge_partial_states.
__device__ __forceinline__ float sink_fold(const float* __restrict__ sinks, int64_t hq, float& m, float& d) {
  if (sinks == nullptr) return 1.0f;
  const float s = sinks[hq] * kLog2e;
  const float m_new = fmaxf(m, s);
  const float c = exp2_approx(m - m_new);  // m = -inf (no key): 0
  d = d * c + exp2_approx(s - m_new);
  m = m_new;
  return c;
}

}  // namespace pkv

#endif  // PAGEDKV_SINK_CUH
