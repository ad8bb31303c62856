package cuda

import (
	"fmt"
	"math"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// Decode launch limits (see decode.cu): at most 8 warps per block, and the
// four K/V tile buffers of a block within 32 KiB of shared memory.
const (
	decodeMaxWarps   = 8
	decodeTileBudget = 32 << 10
	decodeMaxTile    = 32
	// minChunkTokens keeps split-k chunks long enough that the merge and
	// the per-block setup stay small next to the streaming.
	minChunkTokens = 256
)

// decodePlan is the launch shape of one batch decode.
type decodePlan struct {
	kernel      string
	vec         int     // features per lane
	hpb, nz, gz int     // block = (32, hpb, nz); grid.z = gz
	tile        int     // tokens per shared-memory tile
	pitch       int     // bytes per tile row
	smem        int     // dynamic shared memory bytes
	unit        int     // copy unit in bytes (16: cp.async)
	work        []int32 // [items][3]: request, kv_begin, kv_end
	mergeIndptr []int32 // [B+1] rows of each request in the partial buffers (split-k only)
}

func (p *decodePlan) items() int    { return len(p.work) / 3 }
func (p *decodePlan) partial() bool { return p.mergeIndptr != nil }

// decodeVec is the smallest features-per-lane count that covers headDim with
// one warp.
func decodeVec(headDim int) (int, bool) {
	for _, v := range decodeVecs {
		if 32*v >= headDim {
			return v, true
		}
	}
	return 0, false
}

var kvSuffix = map[layout.DType]string{
	layout.F32: "f32", layout.F16: "f16", layout.BF16: "bf16", layout.E4M3: "e4m3", layout.E5M2: "e5m2",
}

// planDecodeShape picks the kernel, block shape and tiling for a cache
// geometry and GQA group size.
func planDecodeShape(g layout.Paged, group int) (decodePlan, error) {
	vec, ok := decodeVec(g.HeadDim)
	if !ok {
		return decodePlan{}, fmt.Errorf("head_dim %d (want <= 256): %w", g.HeadDim, kernels.ErrUnsupported)
	}
	var p decodePlan
	p.vec = vec
	p.kernel = decodeKernel(kvSuffix[g.DType], vec)
	p.hpb = min(group, decodeMaxWarps)
	p.nz = 1
	for p.nz*2*p.hpb <= decodeMaxWarps {
		p.nz *= 2
	}
	p.gz = (group + p.hpb - 1) / p.hpb
	rowBytes := g.HeadDim * g.DType.Size()
	p.pitch = (rowBytes + 15) / 16 * 16
	p.tile = min(decodeMaxTile, decodeTileBudget/(4*p.pitch))
	p.tile -= p.tile % p.nz // every z-warp gets the same number of rows
	p.unit = copyUnit(int64(rowBytes))
	warps := p.hpb * p.nz
	p.smem = 4*p.tile*p.pitch + 4*warps*(g.HeadDim+2)
	return p, nil
}

// chooseChunk returns the split-k chunk length in tokens, or 0 for no split.
// visible[b] is the number of keys request b attends; blocksPerRequest is
// num_kv_heads * grid.z. Without an override it splits only when the batch
// alone cannot give every SM two blocks, into chunks of at least
// minChunkTokens keys.
func chooseChunk(visible []int, blocksPerRequest, numSMs, maxChunk, tile int) int {
	longest, total := 0, 0
	for _, v := range visible {
		longest = max(longest, v)
		total += v
	}
	if maxChunk > 0 {
		if longest > maxChunk {
			return maxChunk
		}
		return 0
	}
	target := 2 * max(numSMs, 1)
	if len(visible)*blocksPerRequest >= target || longest <= minChunkTokens {
		return 0
	}
	perBlock := (total*blocksPerRequest + target - 1) / target
	chunk := max(minChunkTokens, (perBlock+tile-1)/tile*tile)
	if longest <= chunk {
		return 0
	}
	return chunk
}

// splitWork makes the work items: with chunk == 0 one item (b, 0, MaxInt32)
// per request (the kernel clips to the request's visible range); otherwise
// request b's visible keys [lo[b], hi[b]) cut into chunks of at most chunk
// keys (one empty item for a request that sees none), and the CSR of each
// request's items.
func splitWork(lo, hi []int, chunk int) (work, mergeIndptr []int32) {
	B := len(lo)
	if chunk == 0 {
		work = make([]int32, 0, 3*B)
		for b := range B {
			work = append(work, int32(b), 0, math.MaxInt32)
		}
		return work, nil
	}
	mergeIndptr = make([]int32, B+1)
	for b := range B {
		n := 0
		for s := lo[b]; s < hi[b] || n == 0; s += chunk {
			e := min(s+chunk, hi[b])
			work = append(work, int32(b), int32(s), int32(e))
			n++
		}
		mergeIndptr[b+1] = mergeIndptr[b] + int32(n)
	}
	return work, mergeIndptr
}

// BatchDecode is BatchDecodeWithPagedKVCacheWrapper.run with one query per
// request: o = softmax(s) v with s = (q·k)*sm_scale (soft-capped, windowed)
// and the base-2 LSE. Long requests may be split into chunks (split-k) and
// merged on the device; see [Config.MaxChunkTokens].
func (b *Backend) BatchDecode(p *kernels.DecodeParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	g := p.Cache.Geometry
	B, Hq, D := p.Q.Shape[0], p.Q.Shape[1], p.Q.Shape[2]
	if B == 0 {
		return nil
	}
	group := Hq / g.NumKVHeads
	plan, err := planDecodeShape(g, group)
	if err != nil {
		return fmt.Errorf("%s: decode: %w", b.name, err)
	}
	lo, hi := make([]int, B), make([]int, B)
	visible := make([]int, B)
	for r := range B {
		n := p.Table.SeqLen(r, g.PageSize)
		if n > math.MaxInt32 {
			return fmt.Errorf("%s: decode: request %d has %d keys, more than the kernels' 2^31-1: %w", b.name, r, n, kernels.ErrUnsupported)
		}
		hi[r] = n
		if p.WindowLeft >= 0 {
			lo[r] = max(0, n-1-p.WindowLeft)
		}
		visible[r] = hi[r] - lo[r]
	}
	chunk := chooseChunk(visible, g.NumKVHeads*plan.gz, b.drv.NumSMs(), b.cfg.MaxChunkTokens, plan.tile)
	plan.work, plan.mergeIndptr = splitWork(lo, hi, chunk)

	qCode, _ := dtypeCode(p.Q.DType)
	oCode, _ := dtypeCode(p.O.DType)
	scale := p.EffectiveSMScale(D)
	qScale := scale * math.Log2E // the kernel works in the base-2 domain
	if p.LogitsSoftCap > 0 {
		qScale = scale // the cap is applied before the change of base
	}
	es := int64(g.DType.Size())

	a := &arena{drv: b.drv}
	defer a.free()
	q := a.buf(len(p.Q.Data), p.Q.Data)
	kb, vb := cacheBuffers(a, &p.Cache)
	indptr := a.buf(4*len(p.Table.KVIndptr), i32Bytes(p.Table.KVIndptr))
	indices := a.buf(4*len(p.Table.KVIndices), i32Bytes(p.Table.KVIndices))
	last := a.buf(4*len(p.Table.KVLastPageLen), i32Bytes(p.Table.KVLastPageLen))
	work := a.buf(4*len(plan.work), i32Bytes(plan.work))
	o := a.buf(len(p.O.Data), nil)
	lse := -1
	if p.LSE != nil {
		lse = a.buf(4*len(p.LSE), nil)
	}
	tmpO, tmpLSE, merge := -1, -1, -1
	if plan.partial() {
		tmpO = a.buf(4*plan.items()*Hq*D, nil)
		tmpLSE = a.buf(4*plan.items()*Hq, nil)
		merge = a.buf(4*len(plan.mergeIndptr), i32Bytes(plan.mergeIndptr))
	}
	if err := a.alloc(); err != nil {
		return fmt.Errorf("%s: decode: %w", b.name, err)
	}
	opt := func(i int) uint64 {
		if i < 0 {
			return 0
		}
		return uint64(a.ptr(i))
	}
	kPtr, vPtr := a.ptr(kb), a.ptr(vb)
	if g.Form == layout.Fused {
		vPtr = kPtr + DevicePtr(g.PlaneElements()*es)
	}
	var partial uint64
	if plan.partial() {
		partial = 1
	}
	args := []uint64{
		uint64(a.ptr(q)), uint64(kPtr), uint64(vPtr),
		uint64(a.ptr(indptr)), uint64(a.ptr(indices)), uint64(a.ptr(last)), uint64(a.ptr(work)),
		uint64(a.ptr(o)), opt(lse), opt(tmpO), opt(tmpLSE),
		uint64(Hq), uint64(g.NumKVHeads), uint64(D), uint64(g.PageSize), uint64(g.NumPages),
		uint64(g.StridePage()), uint64(g.StrideN()), uint64(g.StrideH()),
		uint64(qCode), uint64(oCode), f64Arg(qScale), f64Arg(p.LogitsSoftCap), uint64(int64(p.WindowLeft)),
		f64Arg(p.EffectiveVScale()), uint64(plan.tile), uint64(plan.unit), partial,
	}
	grid := Dim3{plan.items(), g.NumKVHeads, plan.gz}
	if err := b.launch(plan.kernel, grid, Dim3{32, plan.hpb, plan.nz}, plan.smem, args); err != nil {
		return err
	}
	if plan.partial() {
		margs := []uint64{
			uint64(a.ptr(tmpO)), uint64(a.ptr(tmpLSE)), uint64(a.ptr(merge)), uint64(a.ptr(o)), opt(lse),
			uint64(Hq), uint64(D), uint64(oCode), f64Arg(p.EffectiveVScale()),
		}
		if err := b.launch("merge_partial_states", Dim3{B, Hq, 1}, Dim3{threadsFor(int64(D)), 1, 1}, 0, margs); err != nil {
			return err
		}
	}
	if err := b.drv.DtoH(p.O.Data, a.ptr(o)); err != nil {
		return err
	}
	if lse >= 0 {
		return b.drv.DtoH(f32Bytes(p.LSE), a.ptr(lse))
	}
	return nil
}
