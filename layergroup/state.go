package layergroup

import "fmt"

// State groups: the recurrent layers of a hybrid model (Mamba-2 in
// Nemotron-H, Jamba and Granite 4; Gated DeltaNet in Qwen3-Next; KDA).
// Such a layer keeps, per request, a fixed state instead of K/V per token:
// a convolution state (the last ConvShape[1] inputs of the causal conv1d)
// and a recurrent state (Mamba-2's SSM state, GDN's delta-rule matrix).
//
// A state slot is one page of the pool: layer j of a state group views
// page p of the engine's tensor j as that layer's conv state followed by
// its recurrent state, so a request's state in a group is one page ID and
// copying a state is copying a page (as vLLM sizes a Mamba state as one
// attention block after padding the block). The state must therefore fit a
// layer's page: ConvBytes+SSMBytes <= PageBytes, which the engine reaches
// by choosing the page size (vLLM raises the attention block size until an
// attention page holds a Mamba state).

// StateDType is the element type of a state tensor (vLLM's
// mamba_ssm_cache_dtype and the conv state's dtype).
type StateDType uint8

// State element types.
const (
	StateInvalid StateDType = iota
	StateF32
	StateF16
	StateBF16
)

// stateDTypes are each dtype's name (torch's) and bytes per element.
var stateDTypes = [...]struct {
	name string
	size int
}{StateF32: {"float32", 4}, StateF16: {"float16", 2}, StateBF16: {"bfloat16", 2}}

// Size is the dtype's bytes per element (0 for an invalid dtype).
func (d StateDType) Size() int {
	if int(d) < len(stateDTypes) {
		return stateDTypes[d].size
	}
	return 0
}

func (d StateDType) String() string {
	if d != StateInvalid && int(d) < len(stateDTypes) {
		return stateDTypes[d].name
	}
	return fmt.Sprintf("StateDType(%d)", uint8(d))
}

// MaxStateBytes bounds one layer's state (1 GiB), so sizes never overflow.
const MaxStateBytes = 1 << 30

// StateShape is one layer's state in a State group, with the shapes the
// engine's kernels see (row-major, one request's slot):
//
//   - conv state [ConvShape[0], ConvShape[1]] of ConvDType: vLLM's
//     (conv_dim, conv_kernel-1) for causal_conv1d_update;
//   - recurrent state [SSMShape[0], SSMShape[1], SSMShape[2]] of SSMDType:
//     Mamba-2's (nheads, headdim, d_state), GDN's (num_v_heads,
//     head_k_dim, head_v_dim).
//
// PageBytes is the bytes of one layer's page of the pool as the engine
// allocates it (for an attention layer, 2*page_size*num_kv_heads*head_dim
// *dtype bytes): the state lives in one page and must fit it.
type StateShape struct {
	ConvShape [2]int
	ConvDType StateDType
	SSMShape  [3]int
	SSMDType  StateDType
	PageBytes int
}

// ConvBytes is the conv state's bytes (valid shapes only).
func (s StateShape) ConvBytes() int { return s.ConvShape[0] * s.ConvShape[1] * s.ConvDType.Size() }

// SSMBytes is the recurrent state's bytes (valid shapes only).
func (s StateShape) SSMBytes() int {
	return s.SSMShape[0] * s.SSMShape[1] * s.SSMShape[2] * s.SSMDType.Size()
}

// Bytes is one layer's state: ConvBytes + SSMBytes, the conv state first
// in the slot's page, the recurrent state at byte offset ConvBytes.
func (s StateShape) Bytes() int { return s.ConvBytes() + s.SSMBytes() }

// validate checks a State group's shape; every product is bounded before
// it is taken, so nothing overflows.
func (s StateShape) validate() error {
	for i, d := range s.ConvShape {
		if d < 1 || d > MaxStateBytes {
			return fmt.Errorf("%w: state group with ConvShape[%d] = %d, want 1..%d", ErrBadSpec, i, d, MaxStateBytes)
		}
	}
	for i, d := range s.SSMShape {
		if d < 1 || d > MaxStateBytes {
			return fmt.Errorf("%w: state group with SSMShape[%d] = %d, want 1..%d", ErrBadSpec, i, d, MaxStateBytes)
		}
	}
	if s.ConvDType.Size() == 0 {
		return fmt.Errorf("%w: state group with ConvDType = %v, want float32, float16 or bfloat16", ErrBadSpec, s.ConvDType)
	}
	if s.SSMDType.Size() == 0 {
		return fmt.Errorf("%w: state group with SSMDType = %v, want float32, float16 or bfloat16", ErrBadSpec, s.SSMDType)
	}
	conv := int64(s.ConvShape[0]) * int64(s.ConvShape[1])
	if conv > MaxStateBytes/int64(s.ConvDType.Size()) {
		return fmt.Errorf("%w: state group with a conv state of %dx%d %v, over %d bytes", ErrBadSpec,
			s.ConvShape[0], s.ConvShape[1], s.ConvDType, MaxStateBytes)
	}
	ssm := int64(s.SSMShape[0]) * int64(s.SSMShape[1])
	if ssm > MaxStateBytes || ssm*int64(s.SSMShape[2]) > MaxStateBytes/int64(s.SSMDType.Size()) {
		return fmt.Errorf("%w: state group with a recurrent state of %dx%dx%d %v, over %d bytes", ErrBadSpec,
			s.SSMShape[0], s.SSMShape[1], s.SSMShape[2], s.SSMDType, MaxStateBytes)
	}
	if s.PageBytes < 1 || s.PageBytes > 2*MaxStateBytes {
		return fmt.Errorf("%w: state group with PageBytes = %d, want 1..%d", ErrBadSpec, s.PageBytes, 2*MaxStateBytes)
	}
	if b := s.Bytes(); b > s.PageBytes {
		return fmt.Errorf("%w: state group whose state of %d bytes (conv %d + recurrent %d) exceeds PageBytes = %d: a state is one page, so raise the page size",
			ErrBadSpec, b, s.ConvBytes(), s.SSMBytes(), s.PageBytes)
	}
	return nil
}
