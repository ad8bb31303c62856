package cuda

import (
	"fmt"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// Decode launch limits (see decode.cu): at most 8 warps per block, and the
// four K/V tile buffers of a block within 32 KiB of shared memory.
const (
	decodeMaxWarps   = 8
	decodeTileBudget = 32 << 10
	decodeMaxTile    = 32
)

// decodePlan is the launch shape of one batch decode.
type decodePlan struct {
	kernel      string
	vec         int // features per lane
	hpb, nz, gz int // block = (32, hpb, nz); grid.z = gz
	tile        int // tokens per shared-memory tile
	pitch       int // bytes per tile row
	smem        int // dynamic shared memory bytes
	unit        int // copy unit in bytes (16: cp.async)
	resident    int // CTAs an SM holds at once (decodeResident)
	minChunk    int // the split-KV scheduler's least per-CTA target (minChunkKeys)
}

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

// decodeKernels names the decode entry point of each cache dtype and
// features per lane (built once: planning a step allocates nothing).
var decodeKernels = func() map[layout.DType]map[int]string {
	m := map[layout.DType]map[int]string{}
	for dt, sfx := range kvSuffix {
		m[dt] = map[int]string{}
		for _, vec := range decodeVecs {
			m[dt][vec] = decodeKernel(sfx, vec)
		}
	}
	return m
}()

// planDecodeShape picks the kernel, block shape and tiling for a cache
// geometry and GQA group size.
func planDecodeShape(g layout.Paged, group int) (decodePlan, error) {
	vec, ok := decodeVec(g.HeadDim)
	if !ok {
		return decodePlan{}, fmt.Errorf("head_dim %d (want <= 256): %w", g.HeadDim, kernels.ErrUnsupported)
	}
	var p decodePlan
	p.vec = vec
	p.kernel = decodeKernels[g.DType][vec]
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
	p.resident = decodeResident(32*warps, p.smem)
	// a CTA reads K and V rows of one kv head and, split, writes and
	// merges the partial states of its hpb query heads
	p.minChunk = minChunkKeys(2*rowBytes, 2*p.hpb*(g.HeadDim+1)*4, p.tile)
	return p, nil
}

// decodeResident estimates how many decode CTAs of threads threads and smem
// bytes of shared memory an SM holds at once (FlashInfer asks
// cudaOccupancyMaxActiveBlocksPerMultiprocessor; the Driver has no such
// call): __launch_bounds__(256, 4) caps every decode entry at 64 registers
// per thread (the static report: 58 to 64 in both builds), allotted per warp
// from an SM's 64K; 228 KiB of shared memory per SM (H100), 1 KiB of it
// reserved per CTA; at most 2048 threads and 32 CTAs per SM.
func decodeResident(threads, smem int) int {
	warps := (threads + 31) / 32
	byRegs := 65536 / (64 * 32 * warps)
	bySmem := (228 << 10) / (smem + 1<<10)
	byThreads := 2048 / (32 * warps)
	return max(1, min(byRegs, bySmem, byThreads, 32))
}
