package kernels

import "errors"

// ErrUnsupported is returned (wrapped) by a backend for an operation, dtype or
// shape it does not implement.
var ErrUnsupported = errors.New("kernels: not supported by this backend")

// ErrNoDevice is returned when a GPU backend is asked for and no usable device
// (or no CUDA build) is present.
var ErrNoDevice = errors.New("kernels: no CUDA device")

// Backend runs the paged-KV operations. Every method validates its parameters
// first and returns an error without writing anything when they are invalid.
type Backend interface {
	// Name is a short identifier: "cpu", "emu", "cuda".
	Name() string

	// AppendPagedKVCache is flashinfer.page.append_paged_kv_cache.
	AppendPagedKVCache(p *AppendParams) error
	// AppendPagedMLAKVCache is flashinfer.page.append_paged_mla_kv_cache.
	AppendPagedMLAKVCache(p *MLAAppendParams) error
	// BatchDecode is BatchDecodeWithPagedKVCacheWrapper.run (one query per request).
	BatchDecode(p *DecodeParams) error
	// BatchPrefill is BatchPrefillWithPagedKVCacheWrapper.run (ragged queries).
	BatchPrefill(p *PrefillParams) error
	// MLADecode is BatchMLAPagedAttentionWrapper.run for decode.
	MLADecode(p *MLADecodeParams) error
	// MergeState is flashinfer.merge_state.
	MergeState(p *MergeStateParams) error
	// MergeStates is flashinfer.merge_states.
	MergeStates(p *MergeStatesParams) error
}
