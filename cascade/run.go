package cascade

import (
	"errors"
	"fmt"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// ErrInvalidLevels is wrapped by [Params.Validate] errors about the levels
// themselves (none given, a window, a level that disagrees with q); errors
// about one level's prefill wrap the kernels sentinels.
var ErrInvalidLevels = errors.New("cascade: invalid levels")

// Level is one level of the cascade, with FlashInfer's per-level arrays
// (the golden cases' qo_indptr.l, kv_indptr.l, kv_indices.l,
// kv_last_page_len.l): the one cascade-level type, which kernels/cuda's
// device steps take too.
type Level = kernels.CascadeLevel

// Params are the arguments of [Run]: FlashInfer's
// MultiLevelCascadeAttentionWrapper plan + run, with every level in one
// paged cache.
type Params struct {
	// Levels, level 0 (most shared) first; at least one.
	Levels []Level
	Q      kernels.Tensor // [nnz_qo, Hq, D], f32/f16/bf16
	Cache  kernels.PagedKVCache
	// Causal applies bottom-right causal masking on the last level only:
	// row i of a last-level group with qo_len rows and kv_len keys sees
	// keys j <= i + kv_len - qo_len of that group's segment.
	Causal bool
	// AttentionParams apply to every level. WindowLeft must be -1: FlashInfer
	// would apply a window to each level's own positions, which is not a
	// window over the request. Sinks join the last level only (every row
	// has its group there), so each row's sink is counted once however
	// many levels are merged into it.
	kernels.AttentionParams
	// LevelWindowLeft, when not nil, is each level's window_left (one per
	// level, each >= -1; AttentionParams.WindowLeft must then be -1): level
	// l runs as a batch prefill with window_left LevelWindowLeft[l], masking
	// relative to that level's own keys (row i of a group with qo_len rows
	// and kv_len keys sees keys j >= i + kv_len - qo_len - window_left). A
	// window on the last level is a window over each request when its own
	// pages are a contiguous run of its keys (FlashInfer's mask is
	// shift-invariant); see docs/manager.md "Cascade with windows" for when a
	// shared level may take -1. FlashInfer's MultiLevelCascadeAttentionWrapper
	// takes one window_left for every level, so an engine runs levels with
	// different windows as one BatchPrefillWithPagedKVCacheWrapper per level
	// and merge_state_in_place, which is what Run does.
	LevelWindowLeft []int
	O               kernels.Tensor // output [nnz_qo, Hq, D], f32/f16/bf16
	LSE             []float32      // output [nnz_qo*Hq] base-2 LSE over all levels, or nil
}

// level returns the prefill parameters of level l writing into o and lse.
func (p *Params) level(l int, o kernels.Tensor, lse []float32) *kernels.PrefillParams {
	lv := &p.Levels[l]
	ap := p.AttentionParams
	if p.LevelWindowLeft != nil {
		ap.WindowLeft = p.LevelWindowLeft[l]
	}
	if l != len(p.Levels)-1 {
		ap.Sinks = nil // partial states never hold the sink (docs/attention.md)
	}
	return &kernels.PrefillParams{
		Q: p.Q, QOIndptr: lv.QOIndptr, Cache: p.Cache,
		Table:  lv.Table(),
		Causal: p.Causal && l == len(p.Levels)-1, AttentionParams: ap,
		O: o, LSE: lse,
	}
}

// Validate checks everything [Run] needs before it computes anything: at
// least one level, WindowLeft == -1, LevelWindowLeft nil or one window_left
// >= -1 per level, and each level as a batch prefill of q
// into O (see [kernels.PrefillParams.Validate]: its QOIndptr must end at
// the rows of q, its page table must be well-formed for the cache, ...).
func (p *Params) Validate() error {
	if len(p.Levels) == 0 {
		return fmt.Errorf("%w: no levels", ErrInvalidLevels)
	}
	if p.WindowLeft != -1 {
		if p.LevelWindowLeft != nil {
			return fmt.Errorf("%w: window_left = %d with level_window_left %v; give the windows per level only (want window_left -1)", ErrInvalidLevels, p.WindowLeft, p.LevelWindowLeft)
		}
		return fmt.Errorf("%w: window_left = %d; cascade attention takes no window (want -1, or level_window_left)", ErrInvalidLevels, p.WindowLeft)
	}
	if p.LevelWindowLeft != nil && len(p.LevelWindowLeft) != len(p.Levels) {
		return fmt.Errorf("%w: level_window_left has %d entries for %d levels", ErrInvalidLevels, len(p.LevelWindowLeft), len(p.Levels))
	}
	for l, w := range p.LevelWindowLeft {
		if w < -1 {
			return fmt.Errorf("%w: level_window_left[%d] = %d < -1", ErrInvalidLevels, l, w)
		}
	}
	for l := range p.Levels {
		if err := p.level(l, p.O, p.LSE).Validate(); err != nil {
			return fmt.Errorf("cascade level %d of %d: %w", l, len(p.Levels), err)
		}
	}
	return nil
}

// Run computes cascade attention on b: the last level as a batch prefill
// (causal when p.Causal) into a float32 accumulator, then every other level
// as a non-causal batch prefill merged into it with merge_state; the last
// merge writes p.O (and p.LSE), so the output is rounded once. With one
// level, Run is one batch prefill into p.O.
//
// Run validates every level first; on an error nothing is written to p.O
// or p.LSE. It allocates two float32 [nnz_qo, Hq, D] scratch tensors when
// there is more than one level.
func Run(b kernels.Backend, p *Params) error {
	if err := p.Validate(); err != nil {
		return err
	}
	L := len(p.Levels)
	if L == 1 {
		return p.wrap(L-1, b.BatchPrefill(p.level(0, p.O, p.LSE)))
	}
	shape := p.O.Shape
	n := shape[0] * shape[1]
	acc, tmp := kernels.NewTensor(layout.F32, shape...), kernels.NewTensor(layout.F32, shape...)
	accLSE, tmpLSE := make([]float32, n), make([]float32, n)
	if err := b.BatchPrefill(p.level(L-1, acc, accLSE)); err != nil {
		return p.wrap(L-1, err)
	}
	for l := 0; l < L-1; l++ {
		if err := b.BatchPrefill(p.level(l, tmp, tmpLSE)); err != nil {
			return p.wrap(l, err)
		}
		m := &kernels.MergeStateParams{VA: acc, SA: accLSE, VB: tmp, SB: tmpLSE, V: acc, S: accLSE}
		if l == L-2 {
			m.V = p.O
			if p.LSE != nil {
				m.S = p.LSE
			}
		}
		if err := b.MergeState(m); err != nil {
			return fmt.Errorf("cascade: merging level %d: %w", l, err)
		}
	}
	return nil
}

func (p *Params) wrap(l int, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("cascade level %d of %d: %w", l, len(p.Levels), err)
}

// DecodeLevels returns the two levels of FlashInfer's two-level decode
// cascade for B requests with one query each (q [B, Hq, D]):
//
//   - level 0: QOIndptr [0, B], one group whose pages are sharedPages with
//     sharedLastPageLen tokens in the last (0 when sharedPages is empty);
//   - level 1: QOIndptr [0, 1, ..., B], request b's own pages from unique.
//
// The shared prefix is read once per prefill task for all B queries instead
// of once per request. Pass the levels to [Run] (Causal changes nothing: a
// decode query is the last position of its request).
func DecodeLevels(sharedPages []int32, sharedLastPageLen int32, unique kernels.PageTable) ([]Level, error) {
	B := unique.BatchSize()
	if len(unique.KVIndptr) == 0 {
		return nil, fmt.Errorf("%w: unique kv_indptr is empty (want length batch+1)", ErrInvalidLevels)
	}
	if (len(sharedPages) == 0) != (sharedLastPageLen == 0) || sharedLastPageLen < 0 {
		return nil, fmt.Errorf("%w: shared prefix of %d pages with last_page_len %d (want 0 exactly when there are no pages)", ErrInvalidLevels, len(sharedPages), sharedLastPageLen)
	}
	arange := make([]int32, B+1)
	for i := range arange {
		arange[i] = int32(i)
	}
	return []Level{
		{
			QOIndptr: []int32{0, int32(B)}, KVIndptr: []int32{0, int32(len(sharedPages))},
			KVPageIndices: sharedPages, KVLastPageLen: []int32{sharedLastPageLen},
		},
		{QOIndptr: arange, KVIndptr: unique.KVIndptr, KVPageIndices: unique.KVPageIndices, KVLastPageLen: unique.KVLastPageLen},
	}, nil
}
