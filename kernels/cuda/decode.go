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
	if maxChunk < 0 {
		return 0 // never split: a plan whose launch shape depends on the batch only
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
	return p, true
}
