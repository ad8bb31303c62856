package mla

import (
	"errors"
	"fmt"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// ErrGeometry is returned when two caches that must agree do not.
var ErrGeometry = errors.New("mla: cache geometries differ")

// Config describes an MLA cache. Zero head dims mean FlashInfer's 512 and 64.
type Config struct {
	Form       layout.TensorForm // layout.Fused: one [pages, N, ckv+kpe] tensor
	DType      layout.DType
	NumPages   int
	PageSize   int
	HeadDimCKV int // 0 means layout.HeadDimCKV (512)
	HeadDimKPE int // 0 means layout.HeadDimKPE (64)
}

// Geometry returns the layout.MLA of cfg with defaults applied.
func (cfg Config) Geometry() layout.MLA {
	g := layout.MLA{Form: cfg.Form, DType: cfg.DType, NumPages: cfg.NumPages, PageSize: cfg.PageSize,
		HeadDimCKV: cfg.HeadDimCKV, HeadDimKPE: cfg.HeadDimKPE}
	if g.HeadDimCKV == 0 {
		g.HeadDimCKV = layout.HeadDimCKV
	}
	if g.HeadDimKPE == 0 {
		g.HeadDimKPE = layout.HeadDimKPE
	}
	return g
}

// NewCache allocates a zero-filled MLA cache in host memory.
func NewCache(cfg Config) (kernels.MLACache, error) {
	c, err := kernels.NewMLACache(cfg.Geometry())
	if err != nil {
		return c, fmt.Errorf("mla: new cache: %w", err)
	}
	return c, nil
}

// View is one part (ckv or kpe) of an MLA cache as FlashInfer's
// paged_kv_mla_t addresses it: feature f of (page, entry) is element
// Base + (page*PageSize + entry)*StrideN + f of Buf.
type View struct {
	Buf      []byte
	DType    layout.DType
	PageSize int
	Dim      int   // features per token: 512 for ckv, 64 for kpe
	Base     int64 // elements: 0, or HeadDimCKV for kpe in a fused cache
	StrideN  int64 // elements between consecutive tokens: Dim, or ckv+kpe fused
}

// StridePage is the distance in elements between consecutive pages.
func (v View) StridePage() int64 { return int64(v.PageSize) * v.StrideN }

// Offset is the element offset of feature f of (page, entry).
func (v View) Offset(page, entry, f int) int64 {
	return v.Base + int64(page)*v.StridePage() + int64(entry)*v.StrideN + int64(f)
}

// Row returns the Dim elements of (page, entry) as bytes aliasing Buf.
func (v View) Row(page, entry int) []byte {
	es := int64(v.DType.Size())
	off := v.Offset(page, entry, 0) * es
	return v.Buf[off : off+int64(v.Dim)*es]
}

// CKV is the ckv view of c: [pages, N, 512], the first 512 features of each
// 576-element row when fused.
func CKV(c *kernels.MLACache) View {
	g := c.Geometry
	return View{Buf: c.CKVBuf(), DType: g.DType, PageSize: g.PageSize, Dim: g.HeadDimCKV, StrideN: g.RowCKV()}
}

// KPE is the kpe view of c: [pages, N, 64], features 512.. of each row when
// fused.
func KPE(c *kernels.MLACache) View {
	g := c.Geometry
	v := View{Buf: c.KPEBuf(), DType: g.DType, PageSize: g.PageSize, Dim: g.HeadDimKPE, StrideN: g.RowKPE()}
	if g.Form == layout.Fused {
		v.Base = int64(g.HeadDimCKV)
	}
	return v
}

// CopyCache copies every token slot of src into dst. The two may differ in
// form (fused <-> split) but must agree on everything else. Both caches are
// validated first; on error dst is unchanged.
func CopyCache(dst, src *kernels.MLACache) error {
	if err := src.Validate(); err != nil {
		return fmt.Errorf("mla: copy: src: %w", err)
	}
	if err := dst.Validate(); err != nil {
		return fmt.Errorf("mla: copy: dst: %w", err)
	}
	a, b := dst.Geometry, src.Geometry
	a.Form, b.Form = 0, 0
	if a != b {
		return fmt.Errorf("mla: copy: dst %+v, src %+v: %w", dst.Geometry, src.Geometry, ErrGeometry)
	}
	if dst.Geometry.Form == src.Geometry.Form {
		copy(dst.Data, src.Data)
		copy(dst.CKV, src.CKV)
		copy(dst.KPE, src.KPE)
		return nil
	}
	sc, sk, dc, dk := CKV(src), KPE(src), CKV(dst), KPE(dst)
	for page := 0; page < a.NumPages; page++ {
		for entry := 0; entry < a.PageSize; entry++ {
			copy(dc.Row(page, entry), sc.Row(page, entry))
			copy(dk.Row(page, entry), sk.Row(page, entry))
		}
	}
	return nil
}
