package kernels

import (
	"errors"
	"fmt"
	"math"

	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/ragged"
)

// ErrInvalidAttention is wrapped by attention validation errors that are not
// about a tensor's own shape, a cache, a page table or a scale: head counts
// that do not divide, a window below -1, a bad soft cap, a qo_indptr that
// disagrees with q or with the page table, a NaN or +Inf LSE input.
var ErrInvalidAttention = errors.New("kernels: invalid attention parameters")

// EffectiveSMScale is the softmax scale a backend multiplies q·k by:
// (SMScale, or 1/sqrt(headDim) when 0) * (KScale, or 1 when 0), as
// FlashInfer folds k_scale into sm_scale.
func (a *AttentionParams) EffectiveSMScale(headDim int) float64 {
	s := a.SMScale
	if s == 0 {
		s = 1 / math.Sqrt(float64(headDim))
	}
	if a.KScale != 0 {
		s *= a.KScale
	}
	return s
}

// EffectiveVScale is the factor the output is multiplied by: VScale, or 1
// when 0. It does not enter the LSE.
func (a *AttentionParams) EffectiveVScale() float64 {
	if a.VScale == 0 {
		return 1
	}
	return a.VScale
}

// isActivationDType reports whether dt may hold q, o or an attention state:
// f32, f16 or bf16.
func isActivationDType(dt layout.DType) bool {
	return dt == layout.F32 || dt == layout.F16 || dt == layout.BF16
}

func badFloat(x float64) bool { return math.IsNaN(x) || math.IsInf(x, 0) }

// The soft caps whose cap*log2(e) and 1/cap are finite non-zero float32s.
const (
	minSoftCap = 1 / math.MaxFloat32
	maxSoftCap = math.MaxFloat32 / math.Log2E
)

func softCapFitsF32(c float64) bool { return c >= minSoftCap && c <= maxSoftCap }

// ValidateScalars checks the scalar attention parameters (num_qo_heads
// against q's qHeads and the cache's numKVHeads, window, soft cap and
// scales) as [DecodeParams.Validate] and [PrefillParams.Validate] do. op
// prefixes errors ("decode", "prefill").
func (a *AttentionParams) ValidateScalars(op string, qHeads, numKVHeads, headDim int) error {
	switch {
	case a.NumQOHeads != qHeads:
		return fmt.Errorf("%s: %w: num_qo_heads = %d but q has %d heads", op, ErrInvalidAttention, a.NumQOHeads, qHeads)
	case qHeads <= 0:
		return fmt.Errorf("%s: %w: num_qo_heads = %d, want > 0", op, ErrInvalidAttention, qHeads)
	case qHeads%numKVHeads != 0:
		return fmt.Errorf("%s: %w: num_qo_heads = %d is not a multiple of num_kv_heads = %d", op, ErrInvalidAttention, qHeads, numKVHeads)
	case a.WindowLeft < -1:
		return fmt.Errorf("%s: %w: window_left = %d, want -1 (no window) or >= 0", op, ErrInvalidAttention, a.WindowLeft)
	case badFloat(a.LogitsSoftCap) || a.LogitsSoftCap < 0:
		return fmt.Errorf("%s: %w: logits_soft_cap = %v, want finite and >= 0 (0 disables it)", op, ErrInvalidAttention, a.LogitsSoftCap)
	case a.LogitsSoftCap > 0 && !softCapFitsF32(a.LogitsSoftCap):
		// The kernels compute cap*log2(e) and 1/cap in float32: a cap
		// outside that range turns every logit into NaN or -inf.
		return fmt.Errorf("%s: %w: logits_soft_cap = %v, want 0 or in [%g, %g] (the kernels compute cap*log2(e) and 1/cap in float32)",
			op, ErrInvalidAttention, a.LogitsSoftCap, minSoftCap, maxSoftCap)
	}
	for _, s := range [...]struct {
		name string
		v    float64
	}{{"sm_scale", a.SMScale}, {"k_scale", a.KScale}, {"v_scale", a.VScale}} {
		if badFloat(s.v) || s.v < 0 {
			return fmt.Errorf("%s: %w: %s = %v, want finite and >= 0 (0 means the default)", op, ErrInvalidScale, s.name, s.v)
		}
	}
	if eff := float32(a.EffectiveSMScale(headDim)); eff == 0 || badFloat(float64(eff)) {
		return fmt.Errorf("%s: %w: sm_scale*k_scale = %v is not a finite non-zero float32", op, ErrInvalidScale, a.EffectiveSMScale(headDim))
	}
	if v := float32(a.EffectiveVScale()); badFloat(float64(v)) {
		return fmt.Errorf("%s: %w: v_scale = %v overflows float32", op, ErrInvalidScale, a.VScale)
	}
	return a.validateSinks(op, qHeads)
}

// validateSinks checks Sinks: nil or one finite logit per query head whose
// base-2 form sink*log2(e) is a finite float32.
func (a *AttentionParams) validateSinks(op string, qHeads int) error {
	if a.Sinks == nil {
		return nil
	}
	if len(a.Sinks) != qHeads {
		return fmt.Errorf("%s: %w: len(sinks) = %d, want nil or num_qo_heads = %d", op, ErrInvalidAttention, len(a.Sinks), qHeads)
	}
	for h, s := range a.Sinks {
		if badFloat(float64(s)) || badFloat(float64(a.SinkLog2(h))) {
			return fmt.Errorf("%s: %w: sinks[%d] = %v, want finite with sinks*log2(e) a finite float32", op, ErrInvalidAttention, h, s)
		}
	}
	return nil
}

// checkRank3 validates t as [?, ?, ?] of an activation dtype and returns its
// dimensions.
func checkRank3(op, name string, t *Tensor) (a, b, c int, err error) {
	if err := t.Validate(); err != nil {
		return 0, 0, 0, fmt.Errorf("%s: %s: %w", op, name, err)
	}
	if len(t.Shape) != 3 {
		return 0, 0, 0, fmt.Errorf("%s: %w: %s has shape %v, want 3 dimensions", op, ErrInvalidTensor, name, t.Shape)
	}
	if !isActivationDType(t.DType) {
		return 0, 0, 0, fmt.Errorf("%s: %w: %s is %v, want f32, f16 or bf16", op, ErrInvalidTensor, name, t.DType)
	}
	return t.Shape[0], t.Shape[1], t.Shape[2], nil
}

// checkOut validates an output tensor of the given shape (activation dtype).
func checkOut(op, name string, t *Tensor, shape ...int) error {
	if err := t.CheckShape(name, shape...); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if !isActivationDType(t.DType) {
		return fmt.Errorf("%s: %w: %s is %v, want f32, f16 or bf16", op, ErrInvalidTensor, name, t.DType)
	}
	return nil
}

func checkLSE(op, name string, lse []float32, n int, optional bool) error {
	if (optional && lse == nil) || len(lse) == n {
		return nil
	}
	return fmt.Errorf("%s: %w: %s has %d values, want %d (rows*heads)", op, ErrInvalidTensor, name, len(lse), n)
}

// checkLSEValues rejects NaN and +Inf in an input LSE (-Inf, the empty
// state, is fine).
func checkLSEValues(op, name string, s []float32, heads int) error {
	for i, x := range s {
		if x != x || math.IsInf(float64(x), 1) {
			return fmt.Errorf("%s: %w: %s[%d] (row %d, head %d) = %v, want finite or -inf", op, ErrInvalidAttention, name, i, i/heads, i%heads, x)
		}
	}
	return nil
}

// Validate checks every input of batch decode before anything is written:
//   - the cache (see [PagedKVCache.Validate]);
//   - q: [B, Hq, D], f32/f16/bf16, D equal to the cache's head_dim;
//   - NumQOHeads == Hq, a positive multiple of the cache's num_kv_heads;
//   - the page table: len(KVIndptr) == B+1 and well-formed
//     (see [PageTable.Validate]), every page id below num_pages;
//   - SMScale, KScale, VScale finite and >= 0 (0 means the default), and
//     their product a finite non-zero float32; WindowLeft >= -1;
//     LogitsSoftCap 0 or within the float32 range the kernels compute in;
//   - Sinks nil or Hq finite logits;
//   - o: [B, Hq, D], f32/f16/bf16; LSE nil or B*Hq values.
//
// It does not check that O overlaps neither Q nor the cache; it must not.
func (p *DecodeParams) Validate() error {
	const op = "decode"
	B, hq, d, err := validatePagedQ(op, &p.Q, &p.Cache, &p.AttentionParams)
	if err != nil {
		return err
	}
	if err := p.Table.ValidateBatch(op, B); err != nil {
		return err
	}
	if err := p.Table.Validate(p.Cache.Geometry.PageSize, p.Cache.Geometry.NumPages); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return validateAttentionOut(op, &p.O, p.LSE, B, hq, d)
}

// Validate checks every input of batch prefill before anything is written:
// everything [DecodeParams.Validate] checks (with q [nnz_qo, Hq, D] and the
// batch size taken from the page table), and QOIndptr: length B+1 (the
// same batch as KVIndptr), QOIndptr[0] == 0, non-decreasing, and
// QOIndptr[B] == nnz_qo, the rows of q.
//
// A request may have more queries than keys; with Causal its first
// qo_len - kv_len rows see no key (output 0, LSE -inf), as in FlashInfer's
// batch kernels.
func (p *PrefillParams) Validate() error {
	const op = "prefill"
	nnz, hq, d, err := validatePagedQ(op, &p.Q, &p.Cache, &p.AttentionParams)
	if err != nil {
		return err
	}
	if err := p.Table.Validate(p.Cache.Geometry.PageSize, p.Cache.Geometry.NumPages); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := ValidateQOIndptr(op, p.QOIndptr, len(p.Table.KVIndptr)-1, nnz); err != nil {
		return err
	}
	return validateAttentionOut(op, &p.O, p.LSE, nnz, hq, d)
}

// validatePagedQ checks, in this order, what decode and prefill share before
// their page tables: the cache, q [rows, Hq, D] of an activation dtype with
// the cache's head_dim, and the scalar attention parameters against Hq and
// the cache's num_kv_heads. It returns q's dimensions.
func validatePagedQ(op string, q *Tensor, cache *PagedKVCache, a *AttentionParams) (rows, hq, d int, err error) {
	if err := cache.Validate(); err != nil {
		return 0, 0, 0, fmt.Errorf("%s: paged_kv_cache: %w", op, err)
	}
	g := cache.Geometry
	rows, hq, d, err = checkRank3(op, "q", q)
	if err != nil {
		return 0, 0, 0, err
	}
	if d != g.HeadDim {
		return 0, 0, 0, fmt.Errorf("%s: %w: q has head_dim %d but the cache has head_dim %d", op, ErrInvalidTensor, d, g.HeadDim)
	}
	if err := a.ValidateScalars(op, hq, g.NumKVHeads, d); err != nil {
		return 0, 0, 0, err
	}
	return rows, hq, d, nil
}

// validateAttentionOut checks an attention's outputs: o [rows, heads, d] of
// an activation dtype and lse nil or rows*heads values.
func validateAttentionOut(op string, o *Tensor, lse []float32, rows, heads, d int) error {
	if err := checkOut(op, "o", o, rows, heads, d); err != nil {
		return err
	}
	return checkLSE(op, "lse", lse, rows*heads, true)
}

// ValidateQOIndptr checks qo_indptr ([ragged.CheckIndptr], the one indptr
// check) against the batch size of the page table and the row count of q,
// the check [PrefillParams.Validate] makes after the page table.
func ValidateQOIndptr(op string, qoIndptr []int32, batch, nnz int) error {
	if len(qoIndptr) != batch+1 {
		return fmt.Errorf("%s: %w: qo_indptr has length %d but kv_indptr has %d (want the same batch+1)", op, ErrInvalidAttention, len(qoIndptr), batch+1)
	}
	if err := ragged.CheckIndptr("qo_indptr", qoIndptr); err != nil {
		return fmt.Errorf("%s: %w: %w", op, ErrInvalidAttention, err)
	}
	if int(qoIndptr[batch]) != nnz {
		return fmt.Errorf("%s: %w: qo_indptr[%d] = %d but q has %d rows", op, ErrInvalidAttention, batch, qoIndptr[batch], nnz)
	}
	return nil
}

// Validate checks every input of MLA decode before anything is written:
//   - the cache (see [MLACache.Validate]);
//   - q_nope: [B, H, head_dim_ckv] and q_pe: [B, H, head_dim_kpe], f32/f16/bf16,
//     with the cache's head dims, and NumHeads == H;
//   - KVIndptr: length B+1, starting at 0, non-decreasing, KVIndptr[B] <=
//     len(KVPageIndices), every used page id below num_pages;
//   - KVLen: B values, each >= 0 and fitting in its request's pages
//     (ceil(kv_len/page_size) <= pages; trailing pages are not read);
//   - SMScale finite and > 0 (MLA has no default);
//   - o: [B, H, head_dim_ckv], f32/f16/bf16; LSE nil or B*H values.
func (p *MLADecodeParams) Validate() error {
	const op = "mla decode"
	if err := p.Cache.Validate(); err != nil {
		return fmt.Errorf("%s: ckv/kpe cache: %w", op, err)
	}
	g := p.Cache.Geometry
	B, h, dc, err := checkRank3(op, "q_nope", &p.QNope)
	if err != nil {
		return err
	}
	B2, h2, dk, err := checkRank3(op, "q_pe", &p.QPE)
	if err != nil {
		return err
	}
	switch {
	case B2 != B || h2 != h:
		return fmt.Errorf("%s: %w: q_nope is %v but q_pe is %v (want the same batch and heads)", op, ErrInvalidTensor, p.QNope.Shape, p.QPE.Shape)
	case dc != g.HeadDimCKV || dk != g.HeadDimKPE:
		return fmt.Errorf("%s: %w: q head dims (ckv %d, kpe %d) differ from the cache's (%d, %d)", op, ErrInvalidTensor, dc, dk, g.HeadDimCKV, g.HeadDimKPE)
	case p.NumHeads != h:
		return fmt.Errorf("%s: %w: num_heads = %d but q_nope has %d heads", op, ErrInvalidAttention, p.NumHeads, h)
	}
	if err := ValidateMLADecodeScalars(h, p.SMScale); err != nil {
		return err
	}
	if err := ValidateMLADecodeTable(g, B, p.KVIndptr, p.KVPageIndices, p.KVLen); err != nil {
		return err
	}
	return validateAttentionOut(op, &p.O, p.LSE, B, h, dc)
}

// Validate checks merge_state's inputs before anything is written: VA, VB
// and V all [n, H, D] of f32/f16/bf16 (dtypes may differ), SA, SB and S n*H
// values each, and no NaN or +Inf in SA or SB. V may be VA's (or VB's)
// buffer and S may be SA (or SB): in-place merges are allowed.
func (p *MergeStateParams) Validate() error {
	const op = "merge_state"
	n, h, d, err := checkRank3(op, "v_a", &p.VA)
	if err != nil {
		return err
	}
	if err := checkOut(op, "v_b", &p.VB, n, h, d); err != nil {
		return err
	}
	if err := checkOut(op, "v", &p.V, n, h, d); err != nil {
		return err
	}
	for _, s := range [...]struct {
		name string
		v    []float32
	}{{"s_a", p.SA}, {"s_b", p.SB}, {"s", p.S}} {
		if err := checkLSE(op, s.name, s.v, n*h, false); err != nil {
			return err
		}
	}
	if err := checkLSEValues(op, "s_a", p.SA, h); err != nil {
		return err
	}
	return checkLSEValues(op, "s_b", p.SB, h)
}

// Validate checks merge_states' inputs before anything is written: V
// [n, S, H, D] of f32/f16/bf16 (S may be 0), S with n*S*H values and no NaN
// or +Inf, OutV [n, H, D] of f32/f16/bf16 and OutS with n*H values.
func (p *MergeStatesParams) Validate() error {
	const op = "merge_states"
	if err := p.V.Validate(); err != nil {
		return fmt.Errorf("%s: v: %w", op, err)
	}
	if len(p.V.Shape) != 4 || !isActivationDType(p.V.DType) {
		return fmt.Errorf("%s: %w: v is %v %v, want [n, num_states, heads, head_dim] of f32, f16 or bf16", op, ErrInvalidTensor, p.V.DType, p.V.Shape)
	}
	n, ns, h, d := p.V.Shape[0], p.V.Shape[1], p.V.Shape[2], p.V.Shape[3]
	if err := checkLSE(op, "s", p.S, n*ns*h, false); err != nil {
		return err
	}
	if err := checkLSEValues(op, "s", p.S, h); err != nil {
		return err
	}
	if err := checkOut(op, "v_merged", &p.OutV, n, h, d); err != nil {
		return err
	}
	return checkLSE(op, "s_merged", p.OutS, n*h, false)
}
