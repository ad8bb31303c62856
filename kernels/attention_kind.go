package kernels

import "fmt"

// AttentionKind is the attention one step runs: the one enum of the module
// for it. kernels/cuda's StepPlan.Attention, stepglue's CPU and device
// steps, the root package's Plan.AttentionKind and, through the C ABI's
// pagedkv_plan.attention_kind (PAGEDKV_ATTENTION_*, the same numbers),
// the Python binding all use it.
type AttentionKind int32

const (
	// NoAttention: the step only appends (a device step without attention).
	NoAttention AttentionKind = iota
	// Decode: batch decode, one query row per request.
	Decode
	// Prefill: batch prefill with ragged queries (qo_indptr), causal.
	Prefill
	// Cascade: multi-level cascade attention, merged with merge_state.
	Cascade
	// Chunked: a chunked group's batch prefill over its own attention
	// arrays (a hybrid plan's Attn arrays), not the append table.
	Chunked
)

var attentionKindNames = [...]string{NoAttention: "none", Decode: "decode", Prefill: "prefill", Cascade: "cascade", Chunked: "chunked"}

func (k AttentionKind) String() string {
	if k >= 0 && int(k) < len(attentionKindNames) {
		return attentionKindNames[k]
	}
	return fmt.Sprintf("AttentionKind(%d)", int32(k))
}

// AttentionKindOf is the one decision of which attention a step's plan
// runs: Cascade when it has cascade levels, else Chunked when it has a
// chunked group's attention arrays, else Decode when every request has
// exactly one query row (qoIndptr, [B+1]), else Prefill. An empty batch
// is Decode. qoIndptr must be a valid indptr (the caller has checked it).
func AttentionKindOf(qoIndptr []int32, cascade, chunked bool) AttentionKind {
	switch {
	case cascade:
		return Cascade
	case chunked:
		return Chunked
	}
	for b := 1; b < len(qoIndptr); b++ {
		if qoIndptr[b]-qoIndptr[b-1] != 1 {
			return Prefill
		}
	}
	return Decode
}
