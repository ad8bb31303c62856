package cuda

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// Config configures a Backend.
type Config struct {
	// Device is the CUDA device ordinal ([New] only).
	Device int
	// MaxChunkTokens, when > 0, caps the keys one decode block walks: a
	// request with more visible keys is split into chunks of at most this
	// many (split-k) whose partial states are merged by a second kernel.
	// 0 lets the launcher decide from the SM count and the batch shape.
	MaxChunkTokens int
}

// Backend is a [kernels.Backend] that runs the CUDA kernels of this package
// on a [Driver].
type Backend struct {
	name string
	drv  Driver
	cfg  Config
}

var _ kernels.Backend = (*Backend)(nil)

// NewWithDriver returns a backend called name that launches on drv.
func NewWithDriver(name string, drv Driver, cfg Config) *Backend {
	return &Backend{name: name, drv: drv, cfg: cfg}
}

// Close releases the device (the CUDA context of [New]); the backend must
// not be used afterwards. It is a no-op for drivers without a Close method.
func (b *Backend) Close() error {
	if c, ok := b.drv.(interface{ Close() error }); ok {
		return c.Close()
	}
	return nil
}

// Name returns the name given to the backend ("cuda" for [New]).
func (b *Backend) Name() string { return b.name }

// BatchPrefill is not implemented by the CUDA kernels.
func (b *Backend) BatchPrefill(*kernels.PrefillParams) error {
	return fmt.Errorf("%s: batch prefill: %w", b.name, kernels.ErrUnsupported)
}

// MLADecode is not implemented by the CUDA kernels.
func (b *Backend) MLADecode(*kernels.MLADecodeParams) error {
	return fmt.Errorf("%s: MLA decode: %w", b.name, kernels.ErrUnsupported)
}

// MergeState is not implemented by the CUDA kernels (decode merges its own
// split-k states on the device).
func (b *Backend) MergeState(*kernels.MergeStateParams) error {
	return fmt.Errorf("%s: merge_state: %w", b.name, kernels.ErrUnsupported)
}

// MergeStates is not implemented by the CUDA kernels.
func (b *Backend) MergeStates(*kernels.MergeStatesParams) error {
	return fmt.Errorf("%s: merge_states: %w", b.name, kernels.ErrUnsupported)
}

// ---- device buffers -------------------------------------------------------------

// arena is one device allocation cut into 256-byte aligned buffers.
type arena struct {
	drv  Driver
	base DevicePtr
	offs []int
	data [][]byte // host contents to upload (nil: output or scratch only)
}

// buf reserves n bytes and returns the buffer's index; upload, when not nil,
// is copied to the device by arena.upload.
func (a *arena) buf(n int, upload []byte) int {
	a.offs = append(a.offs, n)
	a.data = append(a.data, upload)
	return len(a.offs) - 1
}

// alloc allocates every reserved buffer and uploads their contents.
func (a *arena) alloc() error {
	total := 0
	for i, n := range a.offs {
		a.offs[i] = total
		total += (n + 255) &^ 255
	}
	if total == 0 {
		total = 256
	}
	base, err := a.drv.Alloc(total)
	if err != nil {
		return err
	}
	a.base = base
	for i, d := range a.data {
		if len(d) > 0 {
			if err := a.drv.HtoD(a.ptr(i), d); err != nil {
				return err
			}
		}
	}
	return nil
}

func (a *arena) ptr(i int) DevicePtr { return a.base + DevicePtr(a.offs[i]) }

func (a *arena) free() {
	if a.base != 0 {
		_ = a.drv.Free(a.base)
	}
}

// i32Bytes views an int32 slice as its little-endian bytes (no copy).
func i32Bytes(s []int32) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), 4*len(s))
}

// f32Bytes views a float32 slice as its little-endian bytes (no copy).
func f32Bytes(s []float32) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), 4*len(s))
}

func f64Arg(x float64) uint64 { return math.Float64bits(x) }

// launch checks the argument count against KernelArity and launches.
func (b *Backend) launch(kernel string, grid, block Dim3, smem int, args []uint64) error {
	if n, ok := KernelArity[kernel]; !ok || n != len(args) {
		return fmt.Errorf("%s: kernel %s launched with %d arguments, its entry point takes %d", b.name, kernel, len(args), n)
	}
	if err := b.drv.Launch(kernel, grid, block, smem, args); err != nil {
		return fmt.Errorf("%s: %s grid %v block %v: %w", b.name, kernel, grid, block, err)
	}
	return nil
}

// gridFor is the 1-D grid of a grid-stride loop over n items: enough blocks
// to fill every SM a few times, never more than n.
func (b *Backend) gridFor(n int) int {
	g := 8 * max(b.drv.NumSMs(), 1)
	return max(min(n, g), 1)
}

// threadsFor is a block size for units copy units per item: a whole number
// of warps, at most 256.
func threadsFor(units int64) int {
	t := (units + 31) / 32 * 32
	return int(min(max(t, 32), 256))
}

// ---- append -----------------------------------------------------------------

// AppendPagedKVCache is flashinfer.page.append_paged_kv_cache: rows of
// append_key/append_value are copied (or, into an fp8 cache, converted) into
// the K and V slots that batch_indices/positions name through the page
// table. The whole cache makes a round trip through device memory.
func (b *Backend) AppendPagedKVCache(p *kernels.AppendParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	nnz := len(p.BatchIndices)
	if nnz == 0 {
		return nil
	}
	g := p.Cache.Geometry
	es := int64(g.DType.Size())
	if tok := int64(g.NumKVHeads) * int64(g.HeadDim) * es; tok > math.MaxInt32 {
		return fmt.Errorf("%s: append: %d bytes per token exceed the kernels' 32-bit token indexing: %w", b.name, tok, kernels.ErrUnsupported)
	}
	a := &arena{drv: b.drv}
	defer a.free()
	key := a.buf(len(p.AppendKey.Data), p.AppendKey.Data)
	val := a.buf(len(p.AppendValue.Data), p.AppendValue.Data)
	bi := a.buf(4*nnz, i32Bytes(p.BatchIndices))
	pos := a.buf(4*nnz, i32Bytes(p.Positions))
	idx := a.buf(4*len(p.Table.KVIndices), i32Bytes(p.Table.KVIndices))
	ptr := a.buf(4*len(p.Table.KVIndptr), i32Bytes(p.Table.KVIndptr))
	kb, vb := cacheBuffers(a, &p.Cache)
	if err := a.alloc(); err != nil {
		return fmt.Errorf("%s: append: %w", b.name, err)
	}
	kPtr, vPtr := a.ptr(kb), a.ptr(vb)
	if g.Form == layout.Fused {
		vPtr = kPtr + DevicePtr(g.PlaneElements()*es)
	}
	common := []uint64{
		uint64(a.ptr(key)), uint64(a.ptr(val)), uint64(a.ptr(bi)), uint64(a.ptr(pos)),
		uint64(kPtr), uint64(vPtr), uint64(a.ptr(idx)), uint64(a.ptr(ptr)),
		uint64(nnz), uint64(g.NumKVHeads),
	}
	var err error
	if kernels.AppendConverts(p.AppendKey.DType, g.DType) {
		src, _ := dtypeCode(p.AppendKey.DType)
		dst, _ := dtypeCode(g.DType)
		args := append(common, uint64(g.HeadDim), uint64(g.PageSize), uint64(g.NumPages),
			uint64(g.StridePage()), uint64(g.StrideN()), uint64(g.StrideH()), uint64(src), uint64(dst),
			f64Arg(float64(kernels.EffectiveScale(p.KScale))), f64Arg(float64(kernels.EffectiveScale(p.VScale))))
		err = b.launch("append_paged_kv_cache_quant", Dim3{b.gridFor(nnz), 1, 1},
			Dim3{threadsFor(int64(g.NumKVHeads) * int64(g.HeadDim)), 1, 1}, 0, args)
	} else {
		rowBytes := int64(g.HeadDim) * es
		u := copyUnit(rowBytes)
		args := append(common, uint64(rowBytes), uint64(g.PageSize), uint64(g.NumPages),
			uint64(g.StridePage()*es), uint64(g.StrideN()*es), uint64(g.StrideH()*es))
		err = b.launch(fmt.Sprintf("append_paged_kv_cache_u%d", u), Dim3{b.gridFor(nnz), 1, 1},
			Dim3{threadsFor(int64(g.NumKVHeads) * rowBytes / int64(u)), 1, 1}, 0, args)
	}
	if err != nil {
		return err
	}
	return downloadCache(b.drv, a, &p.Cache, kb, vb)
}

// cacheBuffers reserves the cache's buffers (one for Fused, K and V for
// Split) with their contents; for Fused both indices are the same buffer.
func cacheBuffers(a *arena, c *kernels.PagedKVCache) (k, v int) {
	if c.Geometry.Form == layout.Fused {
		k = a.buf(len(c.Data), c.Data)
		return k, k
	}
	return a.buf(len(c.K), c.K), a.buf(len(c.V), c.V)
}

// downloadCache copies the cache's device buffers back to the host.
func downloadCache(drv Driver, a *arena, c *kernels.PagedKVCache, k, v int) error {
	if c.Geometry.Form == layout.Fused {
		return drv.DtoH(c.Data, a.ptr(k))
	}
	if err := drv.DtoH(c.K, a.ptr(k)); err != nil {
		return err
	}
	return drv.DtoH(c.V, a.ptr(v))
}

// AppendPagedMLAKVCache is flashinfer.page.append_paged_mla_kv_cache: rows
// of append_ckv and append_kpe are copied into ckv[page, entry] and
// kpe[page, entry] (split caches or one fused [pages, N, ckv+kpe] tensor).
func (b *Backend) AppendPagedMLAKVCache(p *kernels.MLAAppendParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	nnz := len(p.BatchIndices)
	if nnz == 0 {
		return nil
	}
	g := p.Cache.Geometry
	es := int64(g.DType.Size())
	if tok := int64(g.HeadDimCKV+g.HeadDimKPE) * es; tok > math.MaxInt32 {
		return fmt.Errorf("%s: mla append: %d bytes per token exceed the kernels' 32-bit token indexing: %w", b.name, tok, kernels.ErrUnsupported)
	}
	a := &arena{drv: b.drv}
	defer a.free()
	ckv := a.buf(len(p.AppendCKV.Data), p.AppendCKV.Data)
	kpe := a.buf(len(p.AppendKPE.Data), p.AppendKPE.Data)
	bi := a.buf(4*nnz, i32Bytes(p.BatchIndices))
	pos := a.buf(4*nnz, i32Bytes(p.Positions))
	idx := a.buf(4*len(p.KVIndices), i32Bytes(p.KVIndices))
	ptr := a.buf(4*len(p.KVIndptr), i32Bytes(p.KVIndptr))
	var cb, kb int
	if g.Form == layout.Fused {
		cb = a.buf(len(p.Cache.Data), p.Cache.Data)
		kb = cb
	} else {
		cb = a.buf(len(p.Cache.CKV), p.Cache.CKV)
		kb = a.buf(len(p.Cache.KPE), p.Cache.KPE)
	}
	if err := a.alloc(); err != nil {
		return fmt.Errorf("%s: mla append: %w", b.name, err)
	}
	ckvPtr, kpePtr := a.ptr(cb), a.ptr(kb)
	kpeOff := int64(0)
	if g.Form == layout.Fused {
		kpeOff = g.KPEOffset(0, 0, 0) * es
		kpePtr = ckvPtr + DevicePtr(kpeOff)
	}
	ckvRow, kpeRow := int64(g.HeadDimCKV)*es, int64(g.HeadDimKPE)*es
	ckvStride, kpeStride := g.RowCKV()*es, g.RowKPE()*es
	u := copyUnit(ckvRow, kpeRow, ckvStride, kpeStride, kpeOff)
	args := []uint64{
		uint64(a.ptr(ckv)), uint64(a.ptr(kpe)), uint64(a.ptr(bi)), uint64(a.ptr(pos)),
		uint64(ckvPtr), uint64(kpePtr), uint64(a.ptr(idx)), uint64(a.ptr(ptr)),
		uint64(nnz), uint64(ckvRow), uint64(kpeRow), uint64(g.PageSize), uint64(g.NumPages),
		uint64(ckvStride), uint64(kpeStride),
	}
	err := b.launch(fmt.Sprintf("append_paged_mla_kv_cache_u%d", u), Dim3{b.gridFor(nnz), 1, 1},
		Dim3{threadsFor((ckvRow + kpeRow) / int64(u)), 1, 1}, 0, args)
	if err != nil {
		return err
	}
	if g.Form == layout.Fused {
		return b.drv.DtoH(p.Cache.Data, a.ptr(cb))
	}
	if err := b.drv.DtoH(p.Cache.CKV, a.ptr(cb)); err != nil {
		return err
	}
	return b.drv.DtoH(p.Cache.KPE, a.ptr(kb))
}
