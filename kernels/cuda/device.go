package cuda

import (
	"fmt"
	"math"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// DeviceTensor is a dense, row-major tensor in device memory: Ptr holds
// product(Shape) * DType.Size() bytes. Whoever allocated Ptr owns it (an
// engine may pass its own allocations; [Backend.AllocTensor] makes one).
type DeviceTensor struct {
	DType layout.DType
	Shape []int
	Ptr   DevicePtr
}

// Bytes is the tensor's size in bytes (-1 for an invalid dtype or shape).
func (t DeviceTensor) Bytes() int64 {
	ht := kernels.Tensor{DType: t.DType, Shape: t.Shape}
	n := ht.NumElements()
	if n < 0 || !t.DType.Valid() {
		return -1
	}
	return n * int64(t.DType.Size())
}

// WrapDeviceTensor wraps device memory an engine owns (a PyTorch or CuPy
// tensor's data_ptr(), of the device's primary context) as a DeviceTensor
// of dtype dt and the given dense row-major shape, with no copy: bytes is
// the size of the memory at ptr, which must hold the shape. It refuses a
// null or misaligned pointer (16 bytes: the kernels copy rows in 16-byte
// units), an invalid dtype or shape and a buffer too small for the shape;
// each operation then checks the shape against its geometry before it
// launches.
func WrapDeviceTensor(ptr uintptr, bytes int64, dt layout.DType, shape ...int) (DeviceTensor, error) {
	t := DeviceTensor{DType: dt, Shape: append([]int(nil), shape...), Ptr: DevicePtr(ptr)}
	need := t.Bytes()
	switch {
	case need < 0:
		return DeviceTensor{}, fmt.Errorf("wrap device tensor: %w: dtype %v shape %v", kernels.ErrInvalidTensor, dt, shape)
	case ptr == 0:
		return DeviceTensor{}, fmt.Errorf("wrap device tensor: %w: null device pointer", kernels.ErrInvalidTensor)
	case ptr%16 != 0:
		return DeviceTensor{}, fmt.Errorf("wrap device tensor: %w: device pointer %#x is not 16-byte aligned", kernels.ErrInvalidTensor, ptr)
	case bytes < need:
		return DeviceTensor{}, fmt.Errorf("wrap device tensor: %w: %d bytes at %#x, a %v %v tensor needs %d", kernels.ErrInvalidTensor, bytes, ptr, dt, shape, need)
	}
	return t, nil
}

// check validates t as a tensor of shape want (kernels.CheckDims, the
// shape check of the host validator) at a non-null address.
func (t DeviceTensor) check(name string, want ...int) error {
	if !t.DType.Valid() {
		return fmt.Errorf("%s: %w: dtype %v", name, kernels.ErrInvalidTensor, t.DType)
	}
	if err := kernels.CheckDims(name, t.Shape, want...); err != nil {
		return err
	}
	if t.Ptr == 0 && t.Bytes() > 0 {
		return fmt.Errorf("%w: %s is a null device pointer", kernels.ErrInvalidTensor, name)
	}
	return nil
}

// checkActivation is check plus the activation dtypes (f32, f16, bf16).
func (t DeviceTensor) checkActivation(op, name string, want ...int) error {
	if err := t.check(name, want...); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if t.DType != layout.F32 && t.DType != layout.F16 && t.DType != layout.BF16 {
		return fmt.Errorf("%s: %w: %s is %v, want f32, f16 or bf16", op, kernels.ErrInvalidTensor, name, t.DType)
	}
	return nil
}

// checkLSE validates an optional float32 LSE output of n values (Ptr 0:
// none).
func checkLSE(op, name string, t DeviceTensor, n int) error {
	if t.Ptr == 0 {
		return nil
	}
	if t.DType != layout.F32 {
		return fmt.Errorf("%s: %w: %s is %v, want f32", op, kernels.ErrInvalidTensor, name, t.DType)
	}
	if err := kernels.CheckDims(name, t.Shape, n); err != nil {
		return fmt.Errorf("%s: %w (rows*heads)", op, err)
	}
	return nil
}

// AllocTensor allocates a device tensor of dtype dt and the given shape
// (contents undefined). Free it with [Backend.FreeTensor].
func (b *Backend) AllocTensor(dt layout.DType, shape ...int) (DeviceTensor, error) {
	t := DeviceTensor{DType: dt, Shape: append([]int(nil), shape...)}
	n := t.Bytes()
	if n < 0 || n > math.MaxInt {
		return DeviceTensor{}, fmt.Errorf("%s: %w: %v %v", b.name, kernels.ErrInvalidTensor, dt, shape)
	}
	p, err := b.drv.Alloc(max(int(n), 1))
	if err != nil {
		return DeviceTensor{}, fmt.Errorf("%s: allocating %v %v: %w", b.name, dt, shape, err)
	}
	t.Ptr = p
	return t, nil
}

// FreeTensor releases a tensor from [Backend.AllocTensor].
func (b *Backend) FreeTensor(t DeviceTensor) error {
	if t.Ptr == 0 {
		return nil
	}
	return b.drv.Free(t.Ptr)
}

// Upload copies the host tensor src into dst (same dtype and shape): an
// explicit host-to-device copy, for tests and `simulate`.
func (b *Backend) Upload(dst DeviceTensor, src kernels.Tensor) error {
	if err := b.idle("Upload"); err != nil {
		return err
	}
	if err := src.Validate(); err != nil {
		return fmt.Errorf("%s: upload: %w", b.name, err)
	}
	if err := dst.check("dst", src.Shape...); err != nil || dst.DType != src.DType {
		return fmt.Errorf("%s: upload of %v %v into %v %v: %w", b.name, src.DType, src.Shape, dst.DType, dst.Shape, kernels.ErrInvalidTensor)
	}
	return b.drv.HtoD(dst.Ptr, src.Data)
}

// Download copies the device tensor src into dst (same dtype and shape): an
// explicit device-to-host copy, which waits for the work queued before it.
func (b *Backend) Download(dst kernels.Tensor, src DeviceTensor) error {
	if err := b.idle("Download"); err != nil {
		return err
	}
	if err := dst.Validate(); err != nil {
		return fmt.Errorf("%s: download: %w", b.name, err)
	}
	if err := src.check("src", dst.Shape...); err != nil || dst.DType != src.DType {
		return fmt.Errorf("%s: download of %v %v into %v %v: %w", b.name, src.DType, src.Shape, dst.DType, dst.Shape, kernels.ErrInvalidTensor)
	}
	defer b.waits.Add(1)
	return b.drv.DtoH(dst.Data, src.Ptr)
}

// UploadF32 and DownloadF32 copy float32 values (an LSE) to and from a
// device tensor of len(v) f32 elements.
func (b *Backend) UploadF32(dst DeviceTensor, v []float32) error {
	return b.Upload(dst, kernels.Tensor{DType: layout.F32, Shape: dst.Shape, Data: f32Bytes(v)})
}

// DownloadF32 copies a device f32 tensor into v (len(v) elements).
func (b *Backend) DownloadF32(v []float32, src DeviceTensor) error {
	return b.Download(kernels.Tensor{DType: layout.F32, Shape: src.Shape, Data: f32Bytes(v)}, src)
}

// Synchronize waits for every operation queued on the device.
func (b *Backend) Synchronize() error {
	if err := b.idle("Synchronize"); err != nil {
		return err
	}
	defer b.waits.Add(1)
	return b.drv.Synchronize()
}

// DeviceKVCache is a paged KV cache in device memory, FlashInfer's
// paged_kv_cache: one 5-D allocation (Geometry.Form == layout.Fused, V is
// the second plane of it) or a K/V pair (layout.Split). An NVFP4 cache
// (layout.NVFP4) also has FlashInfer's kv_cache_sf in the same form: the
// data tensors hold the packed e2m1 codes, KSF and VSF point at the K and
// V views of the scale tensors. It is allocated once by
// [Backend.NewKVCache] and never leaves the device except through
// [Backend.DownloadKVCache].
type DeviceKVCache struct {
	Geometry layout.Paged
	K, V     DevicePtr // the K and V views the layout's offsets index
	KSF, VSF DevicePtr // NVFP4: the K and V views of the scale tensors (0 otherwise)
	allocs   []DevicePtr
	sizes    []int64 // bytes of each allocation
}

// planeBytes is the byte size of one of the layout's data tensors (the
// fused 5-D tensor or one of K, V) and of one of its NVFP4 scale tensors
// (0 for every other dtype).
func planeBytes(g layout.Paged) (data, scales int64, err error) {
	if err := g.Validate(); err != nil {
		return 0, 0, fmt.Errorf("%w: %w", kernels.ErrInvalidCache, err)
	}
	n := g.TensorElements()
	if n < 0 || (g.DType != layout.NVFP4 && n > math.MaxInt/int64(g.DType.Size())) {
		return 0, 0, fmt.Errorf("%w: %v cache of %d elements does not fit in memory", kernels.ErrInvalidCache, g.DType, n)
	}
	return g.DataBytes(), g.ScaleBytes(), nil
}

// NewKVCache allocates a zero-filled paged cache of geometry g in device
// memory. Release it with [DeviceKVCache.Free].
func (b *Backend) NewKVCache(g layout.Paged) (*DeviceKVCache, error) {
	if err := b.idle("NewKVCache"); err != nil {
		return nil, err
	}
	n, ns, err := planeBytes(g)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.name, err)
	}
	c := &DeviceKVCache{Geometry: g}
	count := 2
	if g.Form == layout.Fused {
		count = 1
	}
	sizes := make([]int64, 0, 2*count)
	for range count {
		sizes = append(sizes, n)
	}
	if g.DType == layout.NVFP4 {
		for range count {
			sizes = append(sizes, ns)
		}
	}
	for _, sz := range sizes {
		p, err := b.drv.Alloc(int(max(sz, 1)))
		if err != nil {
			c.free(b.drv)
			return nil, fmt.Errorf("%s: allocating a %d-byte cache: %w", b.name, sz, err)
		}
		c.allocs, c.sizes = append(c.allocs, p), append(c.sizes, sz)
		if err := b.drv.Memset(p, 0, int(sz)); err != nil {
			c.free(b.drv)
			return nil, fmt.Errorf("%s: clearing the cache: %w", b.name, err)
		}
	}
	c.K, c.V = c.views(0, g.DataOffset(g.PlaneElements()))
	if g.DType == layout.NVFP4 {
		c.KSF, c.VSF = c.views(count, g.ScaleOffset(g.PlaneElements()))
	}
	return c, nil
}

// views returns the K and V views of the tensors from allocation i on: the
// allocation and its second plane (plane bytes in) when fused, else
// allocations i and i+1.
func (c *DeviceKVCache) views(i int, plane int64) (k, v DevicePtr) {
	if c.Geometry.Form == layout.Fused {
		return c.allocs[i], c.allocs[i] + DevicePtr(plane)
	}
	return c.allocs[i], c.allocs[i+1]
}

func (c *DeviceKVCache) free(drv Driver) {
	for _, p := range c.allocs {
		_ = drv.Free(p)
	}
	c.allocs, c.sizes, c.K, c.V, c.KSF, c.VSF = nil, nil, 0, 0, 0, 0
}

// Free releases the cache's device memory (b must be the backend that made
// it).
func (c *DeviceKVCache) Free(b *Backend) { c.free(b.drv) }

// CacheBytes is the cache's size in device memory (an NVFP4 cache's scale
// tensors included).
func (c *DeviceKVCache) CacheBytes() int64 {
	var n int64
	for _, sz := range c.sizes {
		n += sz
	}
	return n
}

// hostBufs lists the host buffers of src in the order of a device cache's
// allocations: data tensors (Data, or K and V), then for NVFP4 the scale
// tensors (SF, or KSF and VSF).
func hostBufs(src *kernels.PagedKVCache) [][]byte {
	var bufs [][]byte
	if src.Geometry.Form == layout.Fused {
		bufs = append(bufs, src.Data)
		if src.Geometry.DType == layout.NVFP4 {
			bufs = append(bufs, src.SF)
		}
		return bufs
	}
	bufs = append(bufs, src.K, src.V)
	if src.Geometry.DType == layout.NVFP4 {
		bufs = append(bufs, src.KSF, src.VSF)
	}
	return bufs
}

// UploadKVCache copies a whole host cache into the device cache (same
// geometry): for tests and for loading a saved cache.
func (b *Backend) UploadKVCache(dst *DeviceKVCache, src *kernels.PagedKVCache) error {
	if err := b.idle("UploadKVCache"); err != nil {
		return err
	}
	if err := src.Validate(); err != nil {
		return fmt.Errorf("%s: upload cache: %w", b.name, err)
	}
	if src.Geometry != dst.Geometry || len(dst.allocs) == 0 {
		return fmt.Errorf("%s: %w: upload of a %+v cache into a %+v device cache", b.name, kernels.ErrInvalidCache, src.Geometry, dst.Geometry)
	}
	for i, buf := range hostBufs(src) {
		if err := b.drv.HtoD(dst.allocs[i], buf); err != nil {
			return err
		}
	}
	return nil
}

// DownloadKVCache copies the device cache into a host cache of the same
// geometry (for inspection and tests).
func (b *Backend) DownloadKVCache(dst *kernels.PagedKVCache, src *DeviceKVCache) error {
	if err := b.idle("DownloadKVCache"); err != nil {
		return err
	}
	defer b.waits.Add(1)
	if err := dst.Validate(); err != nil {
		return fmt.Errorf("%s: download cache: %w", b.name, err)
	}
	if dst.Geometry != src.Geometry || len(src.allocs) == 0 {
		return fmt.Errorf("%s: %w: download of a %+v device cache into a %+v cache", b.name, kernels.ErrInvalidCache, src.Geometry, dst.Geometry)
	}
	for i, buf := range hostBufs(dst) {
		if err := b.drv.DtoH(buf, src.allocs[i]); err != nil {
			return err
		}
	}
	return nil
}

// DeviceMLACache is an MLA paged cache in device memory: ckv [pages, N,
// head_dim_ckv] and kpe [pages, N, head_dim_kpe], fused into one
// [pages, N, ckv+kpe] allocation (layout.Fused; KPE points head_dim_ckv
// elements into it) or two (layout.Split).
type DeviceMLACache struct {
	Geometry layout.MLA
	CKV, KPE DevicePtr
	allocs   []DevicePtr
	sizes    []int64
}

// NewMLACache allocates a zero-filled MLA cache of geometry g in device
// memory. Release it with [DeviceMLACache.Free].
func (b *Backend) NewMLACache(g layout.MLA) (*DeviceMLACache, error) {
	if err := b.idle("NewMLACache"); err != nil {
		return nil, err
	}
	if err := g.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w: %w", b.name, kernels.ErrInvalidCache, err)
	}
	es := int64(g.DType.Size())
	nc, nk := g.CKVElements(), g.KPEElements()
	if nc < 0 || nk < 0 || nc > math.MaxInt/es || nk > math.MaxInt/es {
		return nil, fmt.Errorf("%s: %w: MLA cache does not fit in memory", b.name, kernels.ErrInvalidCache)
	}
	c := &DeviceMLACache{Geometry: g}
	sizes := []int64{nc * es, nk * es}
	if g.Form == layout.Fused {
		sizes = sizes[:1]
	}
	for _, n := range sizes {
		p, err := b.drv.Alloc(int(max(n, 1)))
		if err != nil {
			c.Free(b)
			return nil, fmt.Errorf("%s: allocating a %d-byte MLA cache: %w", b.name, n, err)
		}
		c.allocs, c.sizes = append(c.allocs, p), append(c.sizes, n)
		if err := b.drv.Memset(p, 0, int(n)); err != nil {
			c.Free(b)
			return nil, fmt.Errorf("%s: clearing the MLA cache: %w", b.name, err)
		}
	}
	c.CKV = c.allocs[0]
	if g.Form == layout.Fused {
		c.KPE = c.CKV + DevicePtr(g.KPEOffset(0, 0, 0)*es)
	} else {
		c.KPE = c.allocs[1]
	}
	return c, nil
}

// Free releases the cache's device memory.
func (c *DeviceMLACache) Free(b *Backend) {
	for _, p := range c.allocs {
		_ = b.drv.Free(p)
	}
	c.allocs, c.sizes, c.CKV, c.KPE = nil, nil, 0, 0
}

// UploadMLACache copies a whole host MLA cache into the device cache.
func (b *Backend) UploadMLACache(dst *DeviceMLACache, src *kernels.MLACache) error {
	if err := b.idle("UploadMLACache"); err != nil {
		return err
	}
	if err := src.Validate(); err != nil {
		return fmt.Errorf("%s: upload MLA cache: %w", b.name, err)
	}
	if src.Geometry != dst.Geometry || len(dst.allocs) == 0 {
		return fmt.Errorf("%s: %w: upload of a %+v MLA cache into a %+v device cache", b.name, kernels.ErrInvalidCache, src.Geometry, dst.Geometry)
	}
	if dst.Geometry.Form == layout.Fused {
		return b.drv.HtoD(dst.allocs[0], src.Data)
	}
	if err := b.drv.HtoD(dst.allocs[0], src.CKV); err != nil {
		return err
	}
	return b.drv.HtoD(dst.allocs[1], src.KPE)
}

// DownloadMLACache copies the device MLA cache into a host cache.
func (b *Backend) DownloadMLACache(dst *kernels.MLACache, src *DeviceMLACache) error {
	if err := b.idle("DownloadMLACache"); err != nil {
		return err
	}
	defer b.waits.Add(1)
	if err := dst.Validate(); err != nil {
		return fmt.Errorf("%s: download MLA cache: %w", b.name, err)
	}
	if dst.Geometry != src.Geometry || len(src.allocs) == 0 {
		return fmt.Errorf("%s: %w: download of a %+v device MLA cache into a %+v cache", b.name, kernels.ErrInvalidCache, src.Geometry, dst.Geometry)
	}
	if src.Geometry.Form == layout.Fused {
		return b.drv.DtoH(dst.Data, src.allocs[0])
	}
	if err := b.drv.DtoH(dst.CKV, src.allocs[0]); err != nil {
		return err
	}
	return b.drv.DtoH(dst.KPE, src.allocs[1])
}

// CopyPage copies entries [0, entries) of page src to page dst in every kv
// head, K and V, within device memory (a copy-on-write copy). It moves no
// host memory.
func (b *Backend) CopyPage(c *DeviceKVCache, src, dst, entries int) error {
	if err := b.idle("CopyPage"); err != nil {
		return err
	}
	g := c.Geometry
	if len(c.allocs) == 0 || src < 0 || dst < 0 || src >= g.NumPages || dst >= g.NumPages || entries < 0 || entries > g.PageSize {
		return fmt.Errorf("%s: copy of %d entries of page %d to page %d in a pool of %d pages of %d: %w",
			b.name, entries, src, dst, g.NumPages, g.PageSize, kernels.ErrIndexOutOfRange)
	}
	if entries == 0 || src == dst {
		return nil
	}
	runs, run := g.NumKVHeads, int64(entries)*int64(g.HeadDim) // elements; HND: one run per head
	if g.Layout == layout.NHD {
		runs, run = 1, int64(entries)*int64(g.NumKVHeads)*int64(g.HeadDim)
	}
	for _, v := range c.kvViews() {
		for h := range runs {
			so, do := v.bytes(g.KOffset(src, 0, h, 0)), v.bytes(g.KOffset(dst, 0, h, 0))
			if err := b.drv.DtoD(v.ptr+DevicePtr(do), v.ptr+DevicePtr(so), int(v.bytes(run))); err != nil {
				return fmt.Errorf("%s: copy page %d to %d: %w", b.name, src, dst, err)
			}
		}
	}
	return nil
}

// kvView is one view the layout's element offsets index: K or V of the
// data tensors, or of an NVFP4 cache's scale tensors; bytes turns an
// element offset (or count) into its bytes in the view.
type kvView struct {
	ptr   DevicePtr
	bytes func(int64) int64
}

// kvViews lists the cache's K and V views: data, then NVFP4 scales.
func (c *DeviceKVCache) kvViews() []kvView {
	g := c.Geometry
	v := []kvView{{c.K, g.DataOffset}, {c.V, g.DataOffset}}
	if g.DType == layout.NVFP4 {
		v = append(v, kvView{c.KSF, g.ScaleOffset}, kvView{c.VSF, g.ScaleOffset})
	}
	return v
}

// pageBytes is the bytes of one page in allocation i of the cache (in the
// order of hostBufs): a data tensor's, or an NVFP4 scale tensor's.
func (c *DeviceKVCache) pageBytes(i int) int64 {
	g := c.Geometry
	if g.DType == layout.NVFP4 && i >= len(c.allocs)/2 { // data tensors first, then as many scale tensors
		return g.ScaleOffset(g.StridePage())
	}
	return g.DataOffset(g.StridePage())
}

// UploadPages copies the listed pages (K and V, every head) of a host
// cache of the same geometry into the device cache: an onload from a host
// tier.
func (b *Backend) UploadPages(dst *DeviceKVCache, src *kernels.PagedKVCache, pages []int32) error {
	if err := b.idle("UploadPages"); err != nil {
		return err
	}
	g := dst.Geometry
	if src.Geometry != g || len(dst.allocs) == 0 {
		return fmt.Errorf("%s: %w: upload of pages of a %+v cache into a %+v device cache", b.name, kernels.ErrInvalidCache, src.Geometry, g)
	}
	if err := src.Validate(); err != nil {
		return fmt.Errorf("%s: upload pages: %w", b.name, err)
	}
	bufs := hostBufs(src)
	for _, p := range pages {
		if p < 0 || int(p) >= g.NumPages {
			return fmt.Errorf("%s: upload of page %d of %d: %w", b.name, p, g.NumPages, kernels.ErrIndexOutOfRange)
		}
		for i, buf := range bufs {
			es := dst.pageBytes(i)
			off := int64(p) * es
			if err := b.drv.HtoD(dst.allocs[i]+DevicePtr(off), buf[off:off+es]); err != nil {
				return err
			}
		}
	}
	return nil
}

// DownloadPages copies the listed pages (K and V, every head) of the
// device cache into the same pages of a host cache of the same geometry:
// a partial mirror for inspection and verification.
func (b *Backend) DownloadPages(dst *kernels.PagedKVCache, src *DeviceKVCache, pages []int32) error {
	if err := b.idle("DownloadPages"); err != nil {
		return err
	}
	g := src.Geometry
	if dst.Geometry != g || len(src.allocs) == 0 {
		return fmt.Errorf("%s: %w: download of pages of a %+v device cache into a %+v cache", b.name, kernels.ErrInvalidCache, g, dst.Geometry)
	}
	if err := dst.Validate(); err != nil {
		return fmt.Errorf("%s: download pages: %w", b.name, err)
	}
	defer b.waits.Add(1)
	bufs := hostBufs(dst)
	for _, p := range pages {
		if p < 0 || int(p) >= g.NumPages {
			return fmt.Errorf("%s: download of page %d of %d: %w", b.name, p, g.NumPages, kernels.ErrIndexOutOfRange)
		}
		for i, buf := range bufs {
			es := src.pageBytes(i)
			off := int64(p) * es
			if err := b.drv.DtoH(buf[off:off+es], src.allocs[i]+DevicePtr(off)); err != nil {
				return err
			}
		}
	}
	return nil
}
