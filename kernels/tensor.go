package kernels

import (
	"errors"
	"fmt"
	"math"

	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/ragged"
)

// Sentinels for malformed parameters. Every validation error wraps exactly one
// of them (test with errors.Is) and names the offending value and index.
var (
	// ErrInvalidTensor: a tensor whose dtype, shape or byte length is wrong
	// in itself or for the operation.
	ErrInvalidTensor = errors.New("kernels: invalid tensor")
	// ErrInvalidCache: a cache whose geometry is invalid or whose buffers do
	// not match the geometry.
	ErrInvalidCache = errors.New("kernels: invalid cache")
	// ErrInvalidPageTable: a malformed CSR page table (indptr not starting at
	// 0 or decreasing, last_page_len outside its range, too few indices). It
	// is [ragged.ErrBadPageTable], the one page-table sentinel, which
	// pagetable.ErrBadCSR is too.
	ErrInvalidPageTable = ragged.ErrBadPageTable
	// ErrIndexOutOfRange: a batch index, position or page id that points
	// outside the batch, the request's reserved length or the page pool.
	ErrIndexOutOfRange = errors.New("kernels: index out of range")
	// ErrInvalidScale: a scale that is negative, NaN or infinite, or given
	// where it would be ignored.
	ErrInvalidScale = errors.New("kernels: invalid scale")
)

// NewTensor returns a zero-filled tensor of dtype dt and the given shape. It
// panics on an invalid dtype or a negative dimension (a programming error).
func NewTensor(dt layout.DType, shape ...int) Tensor {
	t := Tensor{DType: dt, Shape: append([]int(nil), shape...)}
	n := t.NumElements()
	if !dt.Valid() || n < 0 || n > layout.MaxElements {
		panic(fmt.Sprintf("kernels: NewTensor(%v, %v): invalid dtype or shape", dt, shape))
	}
	t.Data = make([]byte, int(n)*dt.Size())
	return t
}

// TensorFromF32 returns a tensor of dtype dt and the given shape holding vals
// converted with [layout.StoreF32] (round to nearest even). It panics when
// len(vals) is not the shape's element count.
func TensorFromF32(dt layout.DType, vals []float32, shape ...int) Tensor {
	t := NewTensor(dt, shape...)
	if int64(len(vals)) != t.NumElements() {
		panic(fmt.Sprintf("kernels: TensorFromF32: %d values for shape %v", len(vals), shape))
	}
	layout.StoreRowF32(t.Data, dt, vals)
	return t
}

// NumElements is the product of the shape (1 for a scalar, -1 when a
// dimension is negative or the product exceeds layout.MaxElements).
func (t Tensor) NumElements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		// checked before multiplying: n*d must not wrap around int64
		if d < 0 || d > 0 && n > layout.MaxElements/int64(d) {
			return -1
		}
		n *= int64(d)
	}
	return n
}

// F32 returns every element widened to float32 (a new slice; for tests).
func (t Tensor) F32() []float32 {
	out := make([]float32, t.NumElements())
	layout.LoadRowF32(out, t.DType, t.Data)
	return out
}

// Validate checks that the dtype is valid, every dimension is >= 0 and
// len(Data) equals the element count times the dtype size.
func (t Tensor) Validate() error {
	if !t.DType.Valid() {
		return fmt.Errorf("%w: dtype %v", ErrInvalidTensor, t.DType)
	}
	n := t.NumElements()
	if n < 0 {
		return fmt.Errorf("%w: shape %v", ErrInvalidTensor, t.Shape)
	}
	if want := n * int64(t.DType.Size()); int64(len(t.Data)) != want {
		return fmt.Errorf("%w: %v %v needs %d bytes, has %d", ErrInvalidTensor, t.DType, t.Shape, want, len(t.Data))
	}
	return nil
}

// CheckShape validates t and checks that its shape is exactly want; name
// (e.g. "append_key") is used in the error.
func (t Tensor) CheckShape(name string, want ...int) error {
	if err := t.Validate(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return CheckDims(name, t.Shape, want...)
}

// byteLen is n elements of dt in bytes, or an error when that is not an int.
func byteLen(n int64, dt layout.DType) (int, error) {
	return bytesFit(n*int64(dt.Size()), dt)
}

// bytesFit is n bytes of a dt tensor as an int, or an error when that is not
// an int.
func bytesFit(n int64, dt layout.DType) (int, error) {
	if n > math.MaxInt {
		return 0, fmt.Errorf("%w: %d bytes of %v do not fit in memory", ErrInvalidCache, n, dt)
	}
	return int(n), nil
}

// NewPagedKVCache allocates a zero-filled paged cache of geometry g in host
// memory: one 5-D buffer (g.Form == layout.Fused) or a K/V pair (Split), and
// for NVFP4 the scale buffers of the same form.
func NewPagedKVCache(g layout.Paged) (PagedKVCache, error) {
	if err := g.Validate(); err != nil {
		return PagedKVCache{}, fmt.Errorf("%w: %w", ErrInvalidCache, err)
	}
	n, err := bytesFit(g.DataBytes(), g.DType)
	if err != nil {
		return PagedKVCache{}, err
	}
	ns := int(g.ScaleBytes()) // at most n/8
	c := PagedKVCache{Geometry: g}
	if g.Form == layout.Fused {
		c.Data = newTensorBytes(n)
		if g.DType == layout.NVFP4 {
			c.SF = newTensorBytes(ns)
		}
	} else {
		c.K, c.V = newTensorBytes(n), newTensorBytes(n)
		if g.DType == layout.NVFP4 {
			c.KSF, c.VSF = newTensorBytes(ns), newTensorBytes(ns)
		}
	}
	return c, nil
}

// Validate checks the geometry and that the buffers of the geometry's form
// (and, for NVFP4, its scale buffers) have exactly their byte length while
// the other buffers are nil.
func (c *PagedKVCache) Validate() error {
	g := c.Geometry
	if err := g.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidCache, err)
	}
	n, err := bytesFit(g.DataBytes(), g.DType)
	if err != nil {
		return err
	}
	ns := int(g.ScaleBytes())
	if g.Form == layout.Fused {
		switch {
		case len(c.Data) != n:
			return fmt.Errorf("%w: fused %v cache %v needs %d bytes in Data, has %d", ErrInvalidCache, g.Layout, g.DataShape(), n, len(c.Data))
		case c.K != nil || c.V != nil:
			return fmt.Errorf("%w: fused cache has K/V buffers set (use Data)", ErrInvalidCache)
		case g.DType == layout.NVFP4 && len(c.SF) != ns:
			return fmt.Errorf("%w: fused nvfp4 cache needs kv_cache_sf %v of %d bytes in SF, has %d", ErrInvalidCache, g.ScaleShape(), ns, len(c.SF))
		case g.DType != layout.NVFP4 && c.SF != nil:
			return fmt.Errorf("%w: %v cache has a scale buffer SF (only nvfp4 has kv_cache_sf)", ErrInvalidCache, g.DType)
		case c.KSF != nil || c.VSF != nil:
			return fmt.Errorf("%w: fused cache has KSF/VSF scale buffers set (use SF)", ErrInvalidCache)
		}
		return nil
	}
	switch {
	case len(c.K) != n || len(c.V) != n:
		return fmt.Errorf("%w: split %v cache %v needs %d bytes in each of K and V, has %d and %d", ErrInvalidCache, g.Layout, g.DataShape(), n, len(c.K), len(c.V))
	case c.Data != nil:
		return fmt.Errorf("%w: split cache has Data set (use K and V)", ErrInvalidCache)
	case g.DType == layout.NVFP4 && (len(c.KSF) != ns || len(c.VSF) != ns):
		return fmt.Errorf("%w: split nvfp4 cache needs kv_cache_sf %v of %d bytes in each of KSF and VSF, has %d and %d", ErrInvalidCache, g.ScaleShape(), ns, len(c.KSF), len(c.VSF))
	case g.DType != layout.NVFP4 && (c.KSF != nil || c.VSF != nil):
		return fmt.Errorf("%w: %v cache has KSF/VSF scale buffers (only nvfp4 has kv_cache_sf)", ErrInvalidCache, g.DType)
	case c.SF != nil:
		return fmt.Errorf("%w: split cache has SF set (use KSF and VSF)", ErrInvalidCache)
	}
	return nil
}

// formBuf is a cache's fused buffer for the fused form, else its split
// buffer: the one a layout offset of that form indexes.
func formBuf(f layout.TensorForm, fused, split []byte) []byte {
	if f == layout.Fused {
		return fused
	}
	return split
}

// KBuf is the buffer [layout.Paged.KOffset] indexes (Data or K).
func (c *PagedKVCache) KBuf() []byte { return formBuf(c.Geometry.Form, c.Data, c.K) }

// VBuf is the buffer [layout.Paged.VOffset] indexes (Data or V).
func (c *PagedKVCache) VBuf() []byte { return formBuf(c.Geometry.Form, c.Data, c.V) }

// KSFBuf is the NVFP4 scale buffer that K's scales live in (SF or KSF; nil
// for other dtypes); [layout.Paged.ScaleOffset] of a K element offset
// indexes it.
func (c *PagedKVCache) KSFBuf() []byte { return formBuf(c.Geometry.Form, c.SF, c.KSF) }

// VSFBuf is the NVFP4 scale buffer of V (SF or VSF), like [PagedKVCache.KSFBuf].
func (c *PagedKVCache) VSFBuf() []byte { return formBuf(c.Geometry.Form, c.SF, c.VSF) }

// GatherK widens K[page, entry, head, 0:D] into dst[:D] (for NVFP4,
// e2m1*block scale, without the global scale). It panics on an index
// outside the cache (tests and debugging; no validation).
func (c *PagedKVCache) GatherK(dst []float32, page, entry, head int) {
	c.gather(dst, c.KBuf(), c.KSFBuf(), c.Geometry.KOffset(page, entry, head, 0))
}

// GatherV widens V[page, entry, head, 0:D] into dst[:D], like [PagedKVCache.GatherK].
func (c *PagedKVCache) GatherV(dst []float32, page, entry, head int) {
	c.gather(dst, c.VBuf(), c.VSFBuf(), c.Geometry.VOffset(page, entry, head, 0))
}

func (c *PagedKVCache) gather(dst []float32, buf, sf []byte, off int64) {
	g := c.Geometry
	if g.DType == layout.NVFP4 {
		layout.LoadRowNVFP4(dst[:g.HeadDim], buf[g.DataOffset(off):], sf[g.ScaleOffset(off):])
		return
	}
	layout.LoadRowF32(dst[:g.HeadDim], g.DType, buf[g.DataOffset(off):])
}

// GatherToken widens every head of token t of request b (through table) into
// k and v, each [H*D] (head-major). It returns an error when b or t is outside
// the table; it does not validate the rest of the table.
func (c *PagedKVCache) GatherToken(k, v []float32, table *PageTable, b, t int) error {
	g := c.Geometry
	page, entry, err := table.Locate(b, t, g.PageSize)
	if err != nil {
		return err
	}
	if page < 0 || page >= g.NumPages {
		return fmt.Errorf("%w: page id %d of request %d >= num_pages %d", ErrIndexOutOfRange, page, b, g.NumPages)
	}
	D := g.HeadDim
	for h := 0; h < g.NumKVHeads; h++ {
		c.GatherK(k[h*D:(h+1)*D], page, entry, h)
		c.GatherV(v[h*D:(h+1)*D], page, entry, h)
	}
	return nil
}

// BatchSize is B, len(KVIndptr)-1 (0 for an empty table).
func (t *PageTable) BatchSize() int { return max(len(t.KVIndptr)-1, 0) }

// SeqLen is FlashInfer's get_length(b): 0 for a request with no pages,
// otherwise (pages-1)*pageSize + KVLastPageLen[b]. It assumes a valid table.
func (t *PageTable) SeqLen(b, pageSize int) int {
	pages := int64(t.KVIndptr[b+1]) - int64(t.KVIndptr[b])
	if pages <= 0 {
		return 0
	}
	return int(pagesTokens(pages-1, pageSize) + int64(t.KVLastPageLen[b]))
}

// Locate maps token pos of request b to (physical page id, entry):
// page = KVPageIndices[KVIndptr[b] + pos/pageSize], entry = pos % pageSize. It
// returns ErrIndexOutOfRange when b is not in the batch or pos is not below
// the request's SeqLen; it does not check the page id against a pool.
func (t *PageTable) Locate(b, pos, pageSize int) (page, entry int, err error) {
	if b < 0 || b >= t.BatchSize() || b >= len(t.KVLastPageLen) {
		return 0, 0, fmt.Errorf("%w: request %d not in a batch of %d", ErrIndexOutOfRange, b, t.BatchSize())
	}
	if n := t.SeqLen(b, pageSize); pos < 0 || pos >= n {
		return 0, 0, fmt.Errorf("%w: position %d of request %d outside seq_len %d", ErrIndexOutOfRange, pos, b, n)
	}
	i := int(t.KVIndptr[b]) + pos/pageSize
	if i < 0 || i >= len(t.KVPageIndices) {
		return 0, 0, fmt.Errorf("%w: kv_indices[%d] of request %d beyond %d indices", ErrInvalidPageTable, i, b, len(t.KVPageIndices))
	}
	return int(t.KVPageIndices[i]), pos % pageSize, nil
}

// Validate checks that the table is well-formed CSR for a pool of numPages
// pages of pageSize tokens: len(KVIndptr) == len(KVLastPageLen)+1,
// KVIndptr[0] == 0, KVIndptr non-decreasing, KVIndptr[B] <= len(KVPageIndices),
// every used page id in [0, numPages), KVLastPageLen[b] in [1, pageSize]
// for a request with pages and 0 for one without, and every seq_len at most
// [MaxSeqLen] (FlashInfer's int32 lengths and positions).
//
// Every comparison is made on the int32 values themselves or in int64, so
// no hostile value (MinInt32, MaxInt32, a decreasing or wrapping indptr) can
// wrap into an accepted table: a table that passes names only pages and
// tokens that exist.
func (t *PageTable) Validate(pageSize, numPages int) error {
	return validateCSR(t.KVIndptr, t.KVPageIndices, t.KVLastPageLen, true, pageSize, numPages)
}

// MaxSeqLen is the longest request a kernel takes, in tokens: FlashInfer
// keeps lengths and positions in int32.
const MaxSeqLen = math.MaxInt32

// pagesTokens is pages*pageSize in int64, saturated at MaxSeqLen+1 so that
// it cannot overflow for any pages <= MaxInt32 and pageSize > 0.
func pagesTokens(pages int64, pageSize int) int64 {
	if pages > MaxSeqLen/int64(pageSize) {
		return MaxSeqLen + 1
	}
	return pages * int64(pageSize)
}

// validateCSR is PageTable.Validate with an optional last_page_len (MLA).
// It is the one check every backend op, cascade level and MLA call runs on
// an index array before a kernel reads it: [ragged.ValidatePageTable], with
// kv_indices allowed to be longer than kv_indptr[B], and a page id outside
// the pool reported as ErrIndexOutOfRange like every other index.
func validateCSR(indptr, indices, lastPageLen []int32, needLast bool, pageSize, numPages int) error {
	err := ragged.ValidatePageTable(indptr, indices, lastPageLen, ragged.PageTableCheck{
		PageSize: pageSize, NumPages: numPages, IndicesMayBeLonger: true, LastPageLenOptional: !needLast})
	if err == nil {
		return nil
	}
	if pe := (*ragged.PageTableError)(nil); errors.As(err, &pe) && pe.Kind == ragged.ErrOutOfRange {
		return fmt.Errorf("%w: %s", ErrIndexOutOfRange, pe.Detail)
	}
	return err
}

// NewMLACache allocates a zero-filled MLA cache of geometry g in host memory:
// one [pages, N, ckv+kpe] buffer (g.Form == layout.Fused) or a ckv/kpe pair.
func NewMLACache(g layout.MLA) (MLACache, error) {
	if err := g.Validate(); err != nil {
		return MLACache{}, fmt.Errorf("%w: %w", ErrInvalidCache, err)
	}
	c := MLACache{Geometry: g}
	nc, err := byteLen(g.CKVElements(), g.DType)
	if err != nil {
		return MLACache{}, err
	}
	if g.Form == layout.Fused {
		c.Data = make([]byte, nc)
		return c, nil
	}
	nk, err := byteLen(g.KPEElements(), g.DType)
	if err != nil {
		return MLACache{}, err
	}
	c.CKV, c.KPE = make([]byte, nc), make([]byte, nk)
	return c, nil
}

// Validate checks the geometry and the buffer lengths of its form.
func (c *MLACache) Validate() error {
	g := c.Geometry
	if err := g.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidCache, err)
	}
	nc, err := byteLen(g.CKVElements(), g.DType)
	if err != nil {
		return err
	}
	nk, err := byteLen(g.KPEElements(), g.DType)
	if err != nil {
		return err
	}
	if g.Form == layout.Fused {
		switch {
		case len(c.Data) != nc:
			return fmt.Errorf("%w: fused MLA cache [%d, %d, %d] needs %d bytes in Data, has %d", ErrInvalidCache, g.NumPages, g.PageSize, g.HeadDimCKV+g.HeadDimKPE, nc, len(c.Data))
		case c.CKV != nil || c.KPE != nil:
			return fmt.Errorf("%w: fused MLA cache has CKV/KPE buffers set (use Data)", ErrInvalidCache)
		}
		return nil
	}
	switch {
	case len(c.CKV) != nc || len(c.KPE) != nk:
		return fmt.Errorf("%w: split MLA cache needs %d and %d bytes in CKV and KPE, has %d and %d", ErrInvalidCache, nc, nk, len(c.CKV), len(c.KPE))
	case c.Data != nil:
		return fmt.Errorf("%w: split MLA cache has Data set (use CKV and KPE)", ErrInvalidCache)
	}
	return nil
}

// CKVBuf is the buffer [layout.MLA.CKVOffset] indexes (Data or CKV).
func (c *MLACache) CKVBuf() []byte { return formBuf(c.Geometry.Form, c.Data, c.CKV) }

// KPEBuf is the buffer [layout.MLA.KPEOffset] indexes (Data or KPE).
func (c *MLACache) KPEBuf() []byte { return formBuf(c.Geometry.Form, c.Data, c.KPE) }

// GatherMLA widens ckv[page, entry, :] into ckv[:HeadDimCKV] and
// kpe[page, entry, :] into kpe[:HeadDimKPE]. It panics on an index outside
// the cache (tests and debugging; no validation).
func (c *MLACache) GatherMLA(ckv, kpe []float32, page, entry int) {
	g := c.Geometry
	es := int64(g.DType.Size())
	layout.LoadRowF32(ckv[:g.HeadDimCKV], g.DType, c.CKVBuf()[g.CKVOffset(page, entry, 0)*es:])
	layout.LoadRowF32(kpe[:g.HeadDimKPE], g.DType, c.KPEBuf()[g.KPEOffset(page, entry, 0)*es:])
}

// GatherMLAToken widens token t of request b (page kvPageIndices[kvIndptr[b] +
// t/page_size], entry t % page_size) into ckv and kpe. It returns
// ErrIndexOutOfRange when b is not in the batch, t is beyond the request's
// pages, or the page id is outside the pool.
func (c *MLACache) GatherMLAToken(ckv, kpe []float32, kvIndptr, kvPageIndices []int32, b, t int) error {
	g := c.Geometry
	if b < 0 || b+1 >= len(kvIndptr) {
		return fmt.Errorf("%w: request %d not in a batch of %d", ErrIndexOutOfRange, b, max(len(kvIndptr)-1, 0))
	}
	pages := int(kvIndptr[b+1]) - int(kvIndptr[b])
	if t < 0 || t >= pages*g.PageSize {
		return fmt.Errorf("%w: position %d of request %d outside its %d pages of %d", ErrIndexOutOfRange, t, b, pages, g.PageSize)
	}
	i := int(kvIndptr[b]) + t/g.PageSize
	if i < 0 || i >= len(kvPageIndices) {
		return fmt.Errorf("%w: kv_indices[%d] of request %d beyond %d indices", ErrInvalidPageTable, i, b, len(kvPageIndices))
	}
	page := int(kvPageIndices[i])
	if page < 0 || page >= g.NumPages {
		return fmt.Errorf("%w: page id %d of request %d >= num_pages %d", ErrIndexOutOfRange, page, b, g.NumPages)
	}
	c.GatherMLA(ckv, kpe, page, t%g.PageSize)
	return nil
}
