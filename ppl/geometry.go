package ppl

import (
	"errors"
	"fmt"
	"math"

	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/quant"
)

// Sentinels. Every error of this package wraps one of them, or one of
// kernels.ErrInvalidTensor / kernels.ErrInvalidCache for a tensor or buffer
// whose shape or length is wrong, and names the offending value.
var (
	// ErrInvalidGeometry: a cache_layout, cache_mode, dimension, dtype or
	// quantisation parameter outside its domain (quant_group errors also
	// wrap quant.ErrInvalidConfig).
	ErrInvalidGeometry = errors.New("ppl: invalid cache geometry")
	// ErrInvalidStarts: seqstarts, kvstarts, start_pos or cachestarts of the
	// wrong length, not starting at 0, decreasing, or disagreeing with each
	// other.
	ErrInvalidStarts = errors.New("ppl: invalid starts")
	// ErrOutOfRange: a token slot outside [0, MaxT), a page index past
	// MaxP, a layer_idx outside [0, num_layer), a page id past int32.
	ErrOutOfRange = errors.New("ppl: index out of range")
	// ErrUnalignedPage: a page start that is not a multiple of page_size,
	// which FlashInfer's page ids cannot express.
	ErrUnalignedPage = errors.New("ppl: page start not a multiple of page_size")
	// ErrQuantised: an operation that needs plain float storage (a FlashInfer
	// view) was asked of a quantised cache.
	ErrQuantised = errors.New("ppl: cache is quantised")
)

// Layout is PPL's cache_layout: the order of the dimensions of the cache and
// scale tensors. Every layout keeps the feature dimension innermost, so one
// (layer, K or V, token, head) row of Dh features is contiguous.
type Layout uint8

const (
	// LayoutTL2HD (0): cache (MaxT, L, 2, H, Dh), scale (MaxT, L, 2, H, Dh/G).
	LayoutTL2HD Layout = 0
	// LayoutLT2HD (1): cache (L, MaxT, 2, H, Dh), scale (L, MaxT, 2, H, Dh/G).
	LayoutLT2HD Layout = 1
	// LayoutL2THD (2): cache (L, 2, MaxT, H, Dh), scale (L, 2, MaxT, H, Dh/G).
	// Per layer, K and V are each FlashInfer's NHD page layout.
	LayoutL2THD Layout = 2
	// LayoutL2HTD (3): cache (L, 2, H, MaxT, Dh), scale (L, 2, H, MaxT, Dh/G).
	LayoutL2HTD Layout = 3
)

func (l Layout) String() string {
	switch l {
	case LayoutTL2HD:
		return "0 (MaxT,L,2,H,Dh)"
	case LayoutLT2HD:
		return "1 (L,MaxT,2,H,Dh)"
	case LayoutL2THD:
		return "2 (L,2,MaxT,H,Dh)"
	case LayoutL2HTD:
		return "3 (L,2,H,MaxT,Dh)"
	}
	return fmt.Sprintf("Layout(%d)", uint8(l))
}

// Mode is PPL's cache_mode: how cachestarts maps a request's positions to
// token slots of the cache.
type Mode uint8

const (
	// ModeOffset (0): cachestarts has shape (B); position p of request b is
	// slot cachestarts[b] + p.
	ModeOffset Mode = 0
	// ModePageTable (1): cachestarts has shape (B, MaxP); position p of
	// request b is slot cachestarts[b, p/page_size] + p%page_size.
	ModePageTable Mode = 1
)

func (m Mode) String() string {
	switch m {
	case ModeOffset:
		return "0 (offset)"
	case ModePageTable:
		return "1 (page table)"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// Geometry is the shape of one PPL KeyValueCache cache (and scale) tensor and
// the operator attributes that fix how it is read. The zero value is not
// valid; call [Geometry.Validate].
type Geometry struct {
	Layout     Layout // cache_layout
	Mode       Mode   // cache_mode
	NumLayers  int    // num_layer, L >= 1
	MaxTokens  int    // MaxT >= 0: token slots (per layer and K/V)
	NumKVHeads int    // H >= 1: heads stored in the cache
	HeadDim    int    // Dh >= 1
	// PageSize is page_size, tokens per page, >= 1 in ModePageTable (PPL's
	// default is 128). ModeOffset does not read it.
	PageSize int
	// NumRepeat is num_repeat >= 1: the operator's outputs repeat each cache
	// head NumRepeat times (output head j reads cache head j/NumRepeat).
	NumRepeat int
	// QuantBits is quant_bit: 0 (plain float storage), 8 or 4.
	QuantBits int
	// QuantGroup is quant_group, the features per scale when QuantBits != 0:
	// a power of two dividing HeadDim. Not read when QuantBits == 0.
	QuantGroup int
	// DType is the element dtype when QuantBits == 0: F32, F16 (the seed's
	// T2) or BF16. It must be layout.InvalidDType (zero) when quantised.
	DType layout.DType
	// ScaleDType is the scale tensor's dtype (the seed's T3) when
	// QuantBits != 0: F16 (PPL's kernels) or F32. Zero when not quantised.
	ScaleDType layout.DType
}

// Quantised reports whether the cache holds group-quantised codes.
func (g Geometry) Quantised() bool { return g.QuantBits != 0 }

// Quant is the quantisation format of a quantised geometry.
func (g Geometry) Quant() quant.Config {
	return quant.Config{Bits: g.QuantBits, Group: g.QuantGroup, ScaleDType: g.ScaleDType}
}

// Validate checks every attribute and that the cache is addressable (at
// most layout.MaxElements elements, so every offset fits in int64 and every
// byte length in int).
func (g Geometry) Validate() error {
	switch {
	case g.Layout > LayoutL2HTD:
		return fmt.Errorf("%w: cache_layout %d, want 0..3", ErrInvalidGeometry, g.Layout)
	case g.Mode > ModePageTable:
		return fmt.Errorf("%w: cache_mode %d, want 0 (offset) or 1 (page table)", ErrInvalidGeometry, g.Mode)
	case g.NumLayers < 1:
		return fmt.Errorf("%w: num_layer %d < 1", ErrInvalidGeometry, g.NumLayers)
	case g.MaxTokens < 0:
		return fmt.Errorf("%w: MaxT %d < 0", ErrInvalidGeometry, g.MaxTokens)
	case g.NumKVHeads < 1:
		return fmt.Errorf("%w: num_heads %d < 1", ErrInvalidGeometry, g.NumKVHeads)
	case g.HeadDim < 1:
		return fmt.Errorf("%w: head_dim %d < 1", ErrInvalidGeometry, g.HeadDim)
	case g.NumRepeat < 1:
		return fmt.Errorf("%w: num_repeat %d < 1", ErrInvalidGeometry, g.NumRepeat)
	case g.Mode == ModePageTable && g.PageSize < 1:
		return fmt.Errorf("%w: page_size %d < 1 in page-table mode", ErrInvalidGeometry, g.PageSize)
	}
	switch g.QuantBits {
	case 0:
		if g.DType != layout.F32 && g.DType != layout.F16 && g.DType != layout.BF16 {
			return fmt.Errorf("%w: unquantised cache dtype %v, want f32, f16 or bf16", ErrInvalidGeometry, g.DType)
		}
		if g.ScaleDType != layout.InvalidDType {
			return fmt.Errorf("%w: scale dtype %v given for an unquantised cache (quant_bit 0)", ErrInvalidGeometry, g.ScaleDType)
		}
	case 8, 4:
		if g.DType != layout.InvalidDType {
			return fmt.Errorf("%w: dtype %v given for an int%d cache (leave it zero)", ErrInvalidGeometry, g.DType, g.QuantBits)
		}
		if err := g.Quant().Validate(g.HeadDim); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidGeometry, err)
		}
	default:
		return fmt.Errorf("%w: quant_bit %d, want 0, 8 or 4", ErrInvalidGeometry, g.QuantBits)
	}
	n := int64(1)
	for _, d := range []int{g.NumLayers, 2, g.MaxTokens, g.NumKVHeads, g.HeadDim} {
		if d != 0 && n > layout.MaxElements/int64(d) {
			return fmt.Errorf("%w: cache (L %d, 2, MaxT %d, H %d, Dh %d) exceeds %d elements",
				ErrInvalidGeometry, g.NumLayers, g.MaxTokens, g.NumKVHeads, g.HeadDim, int64(layout.MaxElements))
		}
		n *= int64(d)
	}
	return nil
}

// Elements is the element count of the cache tensor, L*2*MaxT*H*Dh.
func (g Geometry) Elements() int64 {
	return int64(g.NumLayers) * 2 * int64(g.MaxTokens) * int64(g.NumKVHeads) * int64(g.HeadDim)
}

// Bytes is the byte length of the cache tensor (int4: two elements a byte).
func (g Geometry) Bytes() int64 {
	switch g.QuantBits {
	case 8:
		return g.Elements()
	case 4:
		return g.Elements() / 2
	}
	return g.Elements() * int64(g.DType.Size())
}

// ScaleElements is the element count of the scale tensor (0 when not
// quantised): L*2*MaxT*H*(Dh/QuantGroup).
func (g Geometry) ScaleElements() int64 {
	if !g.Quantised() {
		return 0
	}
	return g.Elements() / int64(g.QuantGroup)
}

// ScaleBytes is the byte length of the scale tensor (0 when not quantised).
func (g Geometry) ScaleBytes() int64 {
	if !g.Quantised() {
		return 0
	}
	return g.ScaleElements() * int64(g.ScaleDType.Size())
}

// Shape is the cache tensor's shape for the layout.
func (g Geometry) Shape() []int { return g.shape(g.HeadDim) }

// ScaleShape is the scale tensor's shape (nil when not quantised).
func (g Geometry) ScaleShape() []int {
	if !g.Quantised() {
		return nil
	}
	return g.shape(g.HeadDim / g.QuantGroup)
}

func (g Geometry) shape(last int) []int {
	L, T, H := g.NumLayers, g.MaxTokens, g.NumKVHeads
	switch g.Layout {
	case LayoutTL2HD:
		return []int{T, L, 2, H, last}
	case LayoutLT2HD:
		return []int{L, T, 2, H, last}
	case LayoutL2THD:
		return []int{L, 2, T, H, last}
	}
	return []int{L, 2, H, T, last}
}

// Strides are the element strides of the cache tensor's dimensions; the
// feature stride is 1. The element (layer, kv, token, head, feat) is at
// layer*Layer + kv*KV + token*Token + head*Head + feat.
type Strides struct {
	Layer, KV, Token, Head int64
}

// Strides returns the cache tensor's strides. The scale tensor's strides are
// these divided by QuantGroup (every stride is a multiple of Dh).
func (g Geometry) Strides() Strides {
	L, T, H, D := int64(g.NumLayers), int64(g.MaxTokens), int64(g.NumKVHeads), int64(g.HeadDim)
	switch g.Layout {
	case LayoutTL2HD:
		return Strides{Token: L * 2 * H * D, Layer: 2 * H * D, KV: H * D, Head: D}
	case LayoutLT2HD:
		return Strides{Layer: T * 2 * H * D, Token: 2 * H * D, KV: H * D, Head: D}
	case LayoutL2THD:
		return Strides{Layer: 2 * T * H * D, KV: T * H * D, Token: H * D, Head: D}
	}
	return Strides{Layer: 2 * H * T * D, KV: H * T * D, Head: T * D, Token: D}
}

// Offset is the element offset of cache[layer, kv, token, head, feat] (kv 0
// is K, 1 is V) in the cache tensor. It does not check its arguments.
func (g Geometry) Offset(layer, kv, token, head, feat int) int64 {
	s := g.Strides()
	return int64(layer)*s.Layer + int64(kv)*s.KV + int64(token)*s.Token + int64(head)*s.Head + int64(feat)
}

// ScaleOffset is the element offset of scale[layer, kv, token, head, group]
// in the scale tensor of a quantised geometry: Offset(layer, kv, token, head,
// 0)/QuantGroup + group, because the scale tensor is the cache tensor with
// its last dimension divided by QuantGroup.
func (g Geometry) ScaleOffset(layer, kv, token, head, group int) int64 {
	return g.Offset(layer, kv, token, head, 0)/int64(g.QuantGroup) + int64(group)
}

// RowBytes is the byte length of one (layer, kv, token, head) row of the
// cache tensor.
func (g Geometry) RowBytes() int {
	switch g.QuantBits {
	case 8:
		return g.HeadDim
	case 4:
		return g.HeadDim / 2
	}
	return g.HeadDim * g.DType.Size()
}

// FlashInferView describes layer l's K and V planes of an unquantised cache
// as FlashInfer's paged_kv_t with kv_strides: with page_size N, page p is
// token slots [p*N, p*N+N), and K[p, entry, head, feat] is at element
// KData + p*StridePage + entry*StrideN + head*StrideH + feat of the cache
// tensor (V likewise from VData). NumPages counts the whole pages in MaxT.
type FlashInferView struct {
	StridePage, StrideN, StrideH int64
	KData, VData                 int64
	NumPages                     int
}

// FlashInferView returns the view of layer's K and V as pages of pageSize
// slots. FlashInfer keeps strides in uint32, so a stride of 2^32 or more is
// an ErrOutOfRange error; a quantised cache is ErrQuantised (FlashInfer has
// no group-int8 cache). Only LayoutL2THD gives the contiguous NHD strides
// (StrideH = Dh, StrideN = H*Dh, StridePage = N*H*Dh) that
// layout.Paged describes; see [Cache.FlashInferCache].
func (g Geometry) FlashInferView(layer, pageSize int) (FlashInferView, error) {
	if err := g.Validate(); err != nil {
		return FlashInferView{}, err
	}
	switch {
	case g.Quantised():
		return FlashInferView{}, fmt.Errorf("%w: int%d group-quantised storage has no FlashInfer view", ErrQuantised, g.QuantBits)
	case layer < 0 || layer >= g.NumLayers:
		return FlashInferView{}, fmt.Errorf("%w: layer_idx %d outside [0, num_layer %d)", ErrOutOfRange, layer, g.NumLayers)
	case pageSize < 1:
		return FlashInferView{}, fmt.Errorf("%w: page_size %d < 1", ErrInvalidGeometry, pageSize)
	}
	s := g.Strides()
	v := FlashInferView{
		StrideN: s.Token, StrideH: s.Head,
		KData: int64(layer) * s.Layer, VData: int64(layer)*s.Layer + s.KV,
		NumPages: g.MaxTokens / pageSize,
	}
	if s.Token > math.MaxUint32/int64(pageSize) || s.Head > math.MaxUint32 {
		return FlashInferView{}, fmt.Errorf("%w: strides (page %d*%d, head %d) do not fit FlashInfer's uint32 strides",
			ErrOutOfRange, s.Token, pageSize, s.Head)
	}
	v.StridePage = s.Token * int64(pageSize)
	return v, nil
}
