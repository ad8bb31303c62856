package layout

import (
	"fmt"
	"slices"
	"strings"
)

// DType is the scalar type of a tensor element.
type DType uint8

// The dtypes a paged cache or an operand may hold. The zero value is invalid
// so that a forgotten field is caught by validation.
const (
	InvalidDType DType = iota
	F32
	F16
	BF16
	E4M3 // fp8 e4m3fn: 1-4-3, bias 7, max 448, no inf, NaN = S.1111.111
	E5M2 // fp8 e5m2: 1-5-2, bias 15, IEEE-style inf and NaN, max 57344
	I8
	I32
	U8
	// NVFP4 is FlashInfer's packed NVFP4 KV cache (torch.uint8 data,
	// __nv_fp4x2_e2m1 in CUDA): two e2m1 codes per byte plus one e4m3 block
	// scale per 16 elements in separate scale pages. It is a cache dtype
	// only; an element is half a byte, so [DType.Size] is 0 and byte
	// lengths and offsets come from [Paged]'s NVFP4 methods (nvfp4.go).
	NVFP4
)

var dtypeInfo = [...]struct {
	name string
	size int
}{
	InvalidDType: {"invalid", 0},
	F32:          {"f32", 4},
	F16:          {"f16", 2},
	BF16:         {"bf16", 2},
	E4M3:         {"e4m3", 1},
	E5M2:         {"e5m2", 1},
	I8:           {"i8", 1},
	I32:          {"i32", 4},
	U8:           {"u8", 1},
	NVFP4:        {"nvfp4", 0},
}

// Size is the size of one element in bytes (0 for an invalid dtype, and for
// [NVFP4], whose element is half a byte: see [Paged.DataBytes]).
func (d DType) Size() int {
	if int(d) >= len(dtypeInfo) {
		return 0
	}
	return dtypeInfo[d].size
}

// Valid reports whether d names a known dtype.
func (d DType) Valid() bool { return d != InvalidDType && int(d) < len(dtypeInfo) }

// IsFloat reports whether d is one of the floating-point dtypes a KV cache may hold.
func (d DType) IsFloat() bool { return d == F32 || d == F16 || d == BF16 || d == E4M3 || d == E5M2 }

func (d DType) String() string {
	if !d.Valid() {
		return fmt.Sprintf("DType(%d)", uint8(d))
	}
	return dtypeInfo[d].name
}

// ParseDType accepts the names printed by [DType.String] and the common
// PyTorch/safetensors spellings (float16, bfloat16, F32, float8_e4m3fn, ...).
func ParseDType(s string) (DType, error) {
	switch strings.ToLower(s) {
	case "f32", "float32", "float":
		return F32, nil
	case "f16", "float16", "half":
		return F16, nil
	case "bf16", "bfloat16":
		return BF16, nil
	case "e4m3", "fp8_e4m3", "float8_e4m3fn", "f8_e4m3":
		return E4M3, nil
	case "e5m2", "fp8_e5m2", "float8_e5m2", "f8_e5m2":
		return E5M2, nil
	case "i8", "int8":
		return I8, nil
	case "i32", "int32":
		return I32, nil
	case "u8", "uint8":
		return U8, nil
	case "nvfp4", "fp4", "e2m1", "float4_e2m1fn_x2":
		return NVFP4, nil
	}
	return InvalidDType, fmt.Errorf("layout: unknown dtype %q", s)
}

// KVLayout is FlashInfer's kv_layout: the order of the token and head
// dimensions inside a page.
type KVLayout uint8

const (
	// NHD stores a page as [page_size, num_kv_heads, head_dim].
	NHD KVLayout = iota
	// HND stores a page as [num_kv_heads, page_size, head_dim].
	HND
)

// kvLayoutNames are FlashInfer's spellings, by KVLayout: String prints
// them and ParseKVLayout reads them.
var kvLayoutNames = [...]string{NHD: "NHD", HND: "HND"}

func (l KVLayout) String() string {
	if int(l) < len(kvLayoutNames) {
		return kvLayoutNames[l]
	}
	return fmt.Sprintf("KVLayout(%d)", uint8(l))
}

// ParseKVLayout accepts "NHD" and "HND" (FlashInfer's spelling).
func ParseKVLayout(s string) (KVLayout, error) {
	if i := slices.Index(kvLayoutNames[:], s); i >= 0 {
		return KVLayout(i), nil
	}
	return 0, fmt.Errorf("layout: unknown kv_layout %q (want \"NHD\" or \"HND\")", s)
}

// TensorForm says whether K and V live in one 5-D tensor or in two 4-D tensors.
type TensorForm uint8

const (
	// Fused is one tensor [pages, 2, ...page...]: K is [:,0], V is [:,1].
	Fused TensorForm = iota
	// Split is a (K, V) pair of tensors [pages, ...page...] each.
	Split
)

func (f TensorForm) String() string {
	if f == Split {
		return "split"
	}
	return "fused"
}

// Paged is the geometry of a paged GQA/MHA KV cache. The zero value is not
// valid; call [Paged.Validate].
type Paged struct {
	Layout     KVLayout
	Form       TensorForm
	DType      DType
	NumPages   int // max_num_pages: pages in the pool
	PageSize   int // tokens per page (N)
	NumKVHeads int // H
	HeadDim    int // D
}

// MaxElements bounds any tensor's element count so that every offset fits in
// int64 with room to spare and every byte length fits in int.
const MaxElements = 1 << 40

// Validate checks that every dimension is positive, the dtype is a float dtype
// or NVFP4 (then head_dim is a multiple of [NVFP4BlockSize]) and the whole
// cache is addressable.
func (p Paged) Validate() error {
	switch {
	case p.Layout != NHD && p.Layout != HND:
		return fmt.Errorf("layout: invalid kv_layout %v", p.Layout)
	case p.Form != Fused && p.Form != Split:
		return fmt.Errorf("layout: invalid tensor form %d", p.Form)
	case !p.DType.IsFloat() && p.DType != NVFP4:
		return fmt.Errorf("layout: cache dtype %v is not a float dtype", p.DType)
	case p.DType == NVFP4 && (p.HeadDim <= 0 || p.HeadDim%NVFP4BlockSize != 0):
		return fmt.Errorf("layout: nvfp4 cache head_dim %d is not a positive multiple of the %d-element scale block", p.HeadDim, NVFP4BlockSize)
	case p.NumPages < 0:
		return fmt.Errorf("layout: num_pages %d < 0", p.NumPages)
	case p.PageSize <= 0:
		return fmt.Errorf("layout: page_size %d <= 0", p.PageSize)
	case p.NumKVHeads <= 0:
		return fmt.Errorf("layout: num_kv_heads %d <= 0", p.NumKVHeads)
	case p.HeadDim <= 0:
		return fmt.Errorf("layout: head_dim %d <= 0", p.HeadDim)
	}
	// Each product is checked before it is formed: page_size 1<<62 times
	// 4 would wrap int64 to 0 and pass a plain "> MaxElements" test.
	pe, ok := productWithin(MaxElements/2, p.PageSize, p.NumKVHeads, p.HeadDim)
	if !ok {
		return fmt.Errorf("layout: page of page_size %d x num_kv_heads %d x head_dim %d elements exceeds %d elements", p.PageSize, p.NumKVHeads, p.HeadDim, int64(MaxElements/2))
	}
	if _, ok := productWithin(MaxElements, p.NumPages, 2, int(pe)); !ok {
		return fmt.Errorf("layout: cache of num_pages %d x 2 x %d elements exceeds %d elements", p.NumPages, pe, int64(MaxElements))
	}
	return nil
}

// productWithin returns the product of the non-negative factors and whether
// it is at most limit, checking before each multiplication so that no
// intermediate product can overflow int64.
func productWithin(limit int64, factors ...int) (int64, bool) {
	n := int64(1)
	for _, f := range factors {
		if f < 0 {
			return 0, false
		}
		if f != 0 && n > limit/int64(f) {
			return 0, false
		}
		n *= int64(f)
	}
	return n, n <= limit
}

// PlaneElements is the number of elements of K (or V) in one page: N*H*D.
func (p Paged) PlaneElements() int64 {
	return int64(p.PageSize) * int64(p.NumKVHeads) * int64(p.HeadDim)
}

// StridePage is the distance in elements between consecutive pages of the K
// view (and of the V view): 2*N*H*D for Fused, N*H*D for Split.
func (p Paged) StridePage() int64 {
	if p.Form == Fused {
		return 2 * p.PlaneElements()
	}
	return p.PlaneElements()
}

// StrideN is the distance in elements between consecutive tokens (entries) of
// a page: H*D for NHD, D for HND.
func (p Paged) StrideN() int64 {
	if p.Layout == NHD {
		return int64(p.NumKVHeads) * int64(p.HeadDim)
	}
	return int64(p.HeadDim)
}

// StrideH is the distance in elements between consecutive heads: D for NHD,
// N*D for HND.
func (p Paged) StrideH() int64 {
	if p.Layout == NHD {
		return int64(p.HeadDim)
	}
	return int64(p.PageSize) * int64(p.HeadDim)
}

// KOffset is the element offset of K[page, entry, head, feat] within the
// tensor that holds K (the 5-D tensor for Fused, the K tensor for Split).
// page is a physical page id (FlashInfer's page_idx), not a position in
// kv_indices.
func (p Paged) KOffset(page, entry, head, feat int) int64 {
	return int64(page)*p.StridePage() + int64(head)*p.StrideH() + int64(entry)*p.StrideN() + int64(feat)
}

// VOffset is the element offset of V[page, entry, head, feat] within the
// tensor that holds V (the 5-D tensor for Fused, the V tensor for Split).
func (p Paged) VOffset(page, entry, head, feat int) int64 {
	off := p.KOffset(page, entry, head, feat)
	if p.Form == Fused {
		off += p.PlaneElements()
	}
	return off
}

// TensorElements is the element count of the one 5-D tensor (Fused) or of
// each of K and V (Split).
func (p Paged) TensorElements() int64 { return int64(p.NumPages) * p.StridePage() }

// Shape is the PyTorch shape of the 5-D tensor (Fused) or of each of the K and
// V tensors (Split).
func (p Paged) Shape() []int {
	page := []int{p.PageSize, p.NumKVHeads, p.HeadDim}
	if p.Layout == HND {
		page = []int{p.NumKVHeads, p.PageSize, p.HeadDim}
	}
	if p.Form == Fused {
		return append([]int{p.NumPages, 2}, page...)
	}
	return append([]int{p.NumPages}, page...)
}

// MLA head dimensions fixed by FlashInfer's append_paged_mla_kv_cache.
const (
	HeadDimCKV = 512
	HeadDimKPE = 64
)

// MLA is the geometry of an MLA paged cache: ckv [pages, N, 512] and
// kpe [pages, N, 64], either as two tensors (Split) or as views into one
// [pages, N, 576] tensor (Fused; ckv = [..., :512], kpe = [..., 512:]).
type MLA struct {
	Form       TensorForm
	DType      DType
	NumPages   int
	PageSize   int
	HeadDimCKV int // 512 for FlashInfer's append; other values are accepted by decode
	HeadDimKPE int // 64 likewise
}

// Validate checks the dimensions and dtype.
func (m MLA) Validate() error {
	switch {
	case m.Form != Fused && m.Form != Split:
		return fmt.Errorf("layout: invalid MLA tensor form %d", m.Form)
	case !m.DType.IsFloat():
		return fmt.Errorf("layout: MLA cache dtype %v is not a float dtype", m.DType)
	case m.NumPages < 0:
		return fmt.Errorf("layout: num_pages %d < 0", m.NumPages)
	case m.PageSize <= 0:
		return fmt.Errorf("layout: page_size %d <= 0", m.PageSize)
	case m.HeadDimCKV <= 0 || m.HeadDimKPE <= 0:
		return fmt.Errorf("layout: MLA head dims ckv=%d kpe=%d must be > 0", m.HeadDimCKV, m.HeadDimKPE)
	}
	if m.HeadDimCKV > MaxElements || m.HeadDimKPE > MaxElements {
		return fmt.Errorf("layout: MLA head dims ckv=%d kpe=%d exceed %d elements", m.HeadDimCKV, m.HeadDimKPE, int64(MaxElements))
	}
	if _, ok := productWithin(MaxElements, m.NumPages, m.PageSize, m.HeadDimCKV+m.HeadDimKPE); !ok {
		return fmt.Errorf("layout: MLA cache of num_pages %d x page_size %d x (ckv %d + kpe %d) elements exceeds %d elements", m.NumPages, m.PageSize, m.HeadDimCKV, m.HeadDimKPE, int64(MaxElements))
	}
	return nil
}

// RowCKV is the stride in elements between consecutive tokens of the ckv view.
func (m MLA) RowCKV() int64 {
	if m.Form == Fused {
		return int64(m.HeadDimCKV + m.HeadDimKPE)
	}
	return int64(m.HeadDimCKV)
}

// RowKPE is the stride in elements between consecutive tokens of the kpe view.
func (m MLA) RowKPE() int64 {
	if m.Form == Fused {
		return int64(m.HeadDimCKV + m.HeadDimKPE)
	}
	return int64(m.HeadDimKPE)
}

// CKVOffset is the element offset of ckv[page, entry, feat] within the tensor
// that holds ckv (the fused tensor or the ckv tensor).
func (m MLA) CKVOffset(page, entry, feat int) int64 {
	return (int64(page)*int64(m.PageSize)+int64(entry))*m.RowCKV() + int64(feat)
}

// KPEOffset is the element offset of kpe[page, entry, feat] within the tensor
// that holds kpe (the fused tensor, where kpe starts 512 elements into each
// row, or the kpe tensor).
func (m MLA) KPEOffset(page, entry, feat int) int64 {
	off := (int64(page)*int64(m.PageSize)+int64(entry))*m.RowKPE() + int64(feat)
	if m.Form == Fused {
		off += int64(m.HeadDimCKV)
	}
	return off
}

// CKVElements is the element count of the ckv tensor (Split) or of the whole
// fused tensor (Fused).
func (m MLA) CKVElements() int64 { return int64(m.NumPages) * int64(m.PageSize) * m.RowCKV() }

// KPEElements is the element count of the kpe tensor (Split); for Fused it is
// the fused tensor's count, the same as [MLA.CKVElements].
func (m MLA) KPEElements() int64 { return int64(m.NumPages) * int64(m.PageSize) * m.RowKPE() }
