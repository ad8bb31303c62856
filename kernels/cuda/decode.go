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
	resident    int // CTAs an SM holds at once (residentCTAs)
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
	layout.NVFP4: "nvfp4",
}

// nvfp4MinVec is the fewest features per lane of the NVFP4 decode: a lane
// holds whole code bytes (batch_decode_paged_nvfp4_v2/v4/v8).
const nvfp4MinVec = 2

// tileRowBytes is the shared-memory bytes of one K or V row in a tile of
// the decode and the tiled prefill: head_dim elements, or for NVFP4 the
// head_dim/2 code bytes plus head_dim/16 scale bytes (the prefill pads
// the code rows by 16 bytes: prefill.cu kKVRowOf).
func tileRowBytes(g layout.Paged) int {
	if g.DType == layout.NVFP4 {
		return g.HeadDim/2 + g.HeadDim/layout.NVFP4BlockSize
	}
	return g.HeadDim * g.DType.Size()
}

// decodeKernels names the decode entry point of each cache dtype and
// features per lane (built once: planning a step allocates nothing).
var decodeKernels = func() map[layout.DType]map[int]string {
	m := map[layout.DType]map[int]string{}
	for dt, sfx := range kvSuffix {
		m[dt] = map[int]string{}
		for _, vec := range decodeVecs {
			if dt != layout.NVFP4 || vec >= nvfp4MinVec {
				m[dt][vec] = decodeKernel(sfx, vec)
			}
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
	if g.DType == layout.NVFP4 {
		vec = max(vec, nvfp4MinVec)
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
	rowBytes := tileRowBytes(g)
	p.pitch = (rowBytes + 15) / 16 * 16
	p.tile = min(decodeMaxTile, decodeTileBudget/(4*p.pitch))
	p.tile -= p.tile % p.nz // every z-warp gets the same number of rows
	p.unit = copyUnit(int64(rowBytes))
	if g.DType == layout.NVFP4 {
		p.unit = copyUnit(int64(g.HeadDim / 2)) // the code bytes' unit; the kernel picks the scales'
	}
	warps := p.hpb * p.nz
	p.smem = 4*p.tile*p.pitch + 4*warps*(g.HeadDim+2)
	p.resident = residentCTAs(32*warps, 64, p.smem)
	// a CTA reads K and V rows of one kv head and, split, writes and
	// merges the partial states of its hpb query heads
	p.minChunk = minChunkKeys(2*rowBytes, 2*p.hpb*(g.HeadDim+1)*4, p.tile)
	return p, nil
}

// residentCTAs estimates how many CTAs of threads threads, regs registers
// per thread and smem bytes of shared memory an SM holds at once
// (FlashInfer asks cudaOccupancyMaxActiveBlocksPerMultiprocessor; the
// Driver has no such call): registers allotted per warp from an SM's 64K,
// 228 KiB of shared memory per SM (H100), 1 KiB of it reserved per CTA; at
// most 2048 threads and 32 CTAs per SM. The CUDA-core decode entries have
// __launch_bounds__(256, 4), at most 64 registers per thread (the static
// report: 58 to 64 in both builds).
func residentCTAs(threads, regs, smem int) int {
	warps := (threads + 31) / 32
	byRegs := 65536 / (regs * 32 * warps)
	bySmem := (228 << 10) / (smem + 1<<10)
	byThreads := 2048 / (32 * warps)
	return max(1, min(byRegs, bySmem, byThreads, 32))
}

// The tensor-core decode (decode_tc.cu) mirrored here: its stages, the K
// plus V bytes of one stage, and the smallest GQA group it serves.
const (
	tcStages      = 2
	tcStageBudget = 16 << 10
	// tcMinGroup: a group of one query head leaves 15 of the mma's 16 rows
	// idle and its K/V bytes serve one head either way; the CUDA-core
	// kernel keeps it (see docs/kernels.md).
	tcMinGroup = 2
)

// tcRegisters are the registers per thread of the tensor-core decode
// entries by head_dim (ptxas -arch=sm_90: the largest over their cache
// dtypes, scripts/ptx-report.sh), for the scheduler's occupancy estimate.
var tcRegisters = map[int]int{64: 100, 128: 144, 256: 248}

// tcDecodeKernels names batch_decode_paged_tc_<kv>_d<D> by cache dtype and
// head_dim: f16, bf16, e4m3 and e5m2 caches with head_dim 64, 128 or 256.
var tcDecodeKernels = func() map[layout.DType]map[int]string {
	m := map[layout.DType]map[int]string{}
	for _, dt := range []layout.DType{layout.F16, layout.BF16, layout.E4M3, layout.E5M2} {
		m[dt] = map[int]string{}
		for _, d := range []int{64, 128, 256} {
			m[dt][d] = fmt.Sprintf("batch_decode_paged_tc_%s_d%d", kvSuffix[dt], d)
		}
	}
	return m
}()

// planDecodeTC is the launch shape of the tensor-core decode, and whether
// it serves the geometry and group: an f16, bf16, e4m3 or e5m2 cache with
// head_dim 64, 128 or 256 and a group of at least tcMinGroup query heads.
// Everything else keeps the CUDA-core kernel (planDecodeShape). The shape
// mirrors decode_tc.cu's Shape: rows padded to 128 bytes, 16 keys a warp,
// a stage within tcStageBudget, block (32, warps, 1), one block per 16
// query heads of a group.
func planDecodeTC(g layout.Paged, group int) (decodePlan, bool) {
	name, ok := tcDecodeKernels[g.DType][g.HeadDim]
	if !ok || group < tcMinGroup {
		return decodePlan{}, false
	}
	pitch := max(g.HeadDim*g.DType.Size(), 128)
	keys := min(64, tcStageBudget/(2*pitch))
	p := decodePlan{kernel: name, hpb: keys / 16, nz: 1, gz: (group + 15) / 16, tile: keys, pitch: pitch, unit: 16}
	p.smem = tcStages*2*keys*pitch + 2*16*2*g.HeadDim // stages, then Q's high and low parts
	p.resident = residentCTAs(32*p.hpb, tcRegisters[g.HeadDim], p.smem)
	// a CTA reads K and V rows of one kv head and, split, writes and
	// merges the partial states of its (up to 16) query heads
	p.minChunk = minChunkKeys(2*g.HeadDim*g.DType.Size(), 2*min(group, 16)*(g.HeadDim+1)*4, p.tile)
	return p, true
}
