package ppl

import (
	"fmt"
	"math"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// Cache is one PPL cache tensor and its scale tensor in host memory, both
// dense, row-major and little-endian. The engine owns the buffers; the
// operator functions of this package write into them in place (the seed's
// in-out tensors).
type Cache struct {
	Geometry Geometry
	Data     []byte // cache tensor, Geometry.Shape(), Geometry.Bytes() bytes
	Scale    []byte // scale tensor, Geometry.ScaleShape(), Geometry.ScaleBytes() bytes; nil when not quantised
}

// NewCache allocates a zero-filled cache (and scale tensor) of geometry g.
func NewCache(g Geometry) (Cache, error) {
	if err := g.Validate(); err != nil {
		return Cache{}, err
	}
	if g.Bytes() > math.MaxInt || g.ScaleBytes() > math.MaxInt {
		return Cache{}, fmt.Errorf("%w: %d cache bytes do not fit in memory", ErrInvalidGeometry, g.Bytes())
	}
	c := Cache{Geometry: g, Data: make([]byte, g.Bytes())}
	if g.Quantised() {
		c.Scale = make([]byte, g.ScaleBytes())
	}
	return c, nil
}

// Validate checks the geometry and that Data and Scale have exactly its byte
// lengths (Scale nil or empty when not quantised).
func (c *Cache) Validate() error {
	g := c.Geometry
	if err := g.Validate(); err != nil {
		return err
	}
	if int64(len(c.Data)) != g.Bytes() {
		return fmt.Errorf("%w: cache %v (layout %v) needs %d bytes, has %d", kernels.ErrInvalidCache, g.Shape(), g.Layout, g.Bytes(), len(c.Data))
	}
	if int64(len(c.Scale)) != g.ScaleBytes() {
		return fmt.Errorf("%w: scale %v needs %d bytes, has %d", kernels.ErrInvalidCache, g.ScaleShape(), g.ScaleBytes(), len(c.Scale))
	}
	return nil
}

// rowOffsets returns the byte offsets of row (layer, kv, token, head) in Data
// and, for a quantised cache, in Scale.
func (c *Cache) rowOffsets(layer, kv, token, head int) (data, scale int64) {
	g := &c.Geometry
	off := g.Offset(layer, kv, token, head, 0)
	switch g.QuantBits {
	case 0:
		return off * int64(g.DType.Size()), 0
	case 8:
		data = off
	default:
		data = off / 2 // Dh is even, so a row starts on a byte
	}
	return data, off / int64(g.QuantGroup) * int64(g.ScaleDType.Size())
}

// rowAt is row (layer, kv, token, head)'s bytes in Data and the scales from
// its first group on (empty when the cache is not quantised).
func (c *Cache) rowAt(layer, kv, token, head int) (row, scale []byte) {
	d, s := c.rowOffsets(layer, kv, token, head)
	return c.Data[d : d+int64(c.Geometry.RowBytes())], c.Scale[s:]
}

// LoadRow writes row (layer, kv, token, head) of the cache into dst[:Dh] as
// float32, dequantising a quantised cache (code*scale). It does not allocate.
// It panics when an index is outside the cache (a programming error; the
// operators validate before they read).
func (c *Cache) LoadRow(dst []float32, layer, kv, token, head int) {
	g := &c.Geometry
	dst = dst[:g.HeadDim]
	row, scale := c.rowAt(layer, kv, token, head)
	if !g.Quantised() {
		layout.LoadRowF32(dst, g.DType, row)
		return
	}
	g.Quant().Dequantize(dst, row, scale)
}

// StoreRow writes src[:Dh] into row (layer, kv, token, head): rounded to the
// cache dtype (RNE), or group-quantised with fresh scales. It does not
// allocate and panics on an index outside the cache.
func (c *Cache) StoreRow(layer, kv, token, head int, src []float32) {
	g := &c.Geometry
	src = src[:g.HeadDim]
	row, scale := c.rowAt(layer, kv, token, head)
	if !g.Quantised() {
		layout.StoreRowF32(row, g.DType, src)
		return
	}
	g.Quant().Quantize(row, scale, src)
}

// rowBytes returns the bytes of row (layer, kv, token, head) of an
// unquantised cache.
func (c *Cache) rowBytes(layer, kv, token, head int) []byte {
	d, _ := c.rowOffsets(layer, kv, token, head)
	return c.Data[d : d+int64(c.Geometry.RowBytes())]
}

// FlashInferCache returns layer's K and V planes of an unquantised
// LayoutL2THD cache as a kernels.PagedKVCache (NHD, split K/V, MaxT/pageSize
// pages of pageSize tokens) whose K and V alias Data: a kernels.Backend reads
// and writes the PPL cache in place, with page id = page start / pageSize
// (see [CSRFromPageTable]). Other layouts need FlashInfer's general strides
// ([Geometry.FlashInferView]), which layout.Paged does not describe; they
// return ErrInvalidGeometry, a quantised cache ErrQuantised.
func (c *Cache) FlashInferCache(layer, pageSize int) (kernels.PagedKVCache, error) {
	if err := c.Validate(); err != nil {
		return kernels.PagedKVCache{}, err
	}
	g := c.Geometry
	v, err := g.FlashInferView(layer, pageSize)
	if err != nil {
		return kernels.PagedKVCache{}, err
	}
	if g.Layout != LayoutL2THD {
		return kernels.PagedKVCache{}, fmt.Errorf("%w: cache_layout %v is not FlashInfer's contiguous NHD (only layout 2 is)", ErrInvalidGeometry, g.Layout)
	}
	pg := layout.Paged{Layout: layout.NHD, Form: layout.Split, DType: g.DType, NumPages: v.NumPages,
		PageSize: pageSize, NumKVHeads: g.NumKVHeads, HeadDim: g.HeadDim}
	es := int64(g.DType.Size())
	n := pg.TensorElements() * es
	k, vv := v.KData*es, v.VData*es
	return kernels.PagedKVCache{Geometry: pg, K: c.Data[k : k+n : k+n], V: c.Data[vv : vv+n : vv+n]}, nil
}
