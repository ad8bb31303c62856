//go:build cgo

package cuda_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cuda"
	"github.com/pagedkv/pagedkv/layout"
)

// BenchmarkStepMLADecode: one device-resident MLA decode step (plan: one
// index upload; the tensor-core launch, + the split-KV merge when the plan
// splits; on the GPU a synchronize) over a ckv/kpe cache that never leaves
// the device, with q and o in bf16 (f16 for an f16 cache), FlashInfer's
// configurations, which run mla_decode_tc_<kv>, not _hilo. cache-B/op counts every key's ckv and kpe row once (what HBM must
// deliver; the head tiles' re-reads come from L2). Sizes: small on the
// emulator; on a GPU the DeepSeek shapes of docs/kernels.md's prediction.
func BenchmarkStepMLADecode(b *testing.B) {
	type mlaBench struct {
		B, L, H int
		dt      layout.DType
	}
	for _, d := range benchDevices(b) {
		cases := []mlaBench{{2, 64, 16, layout.F16}}
		if d.gpu {
			cases = []mlaBench{{64, 4096, 16, layout.BF16}, {64, 4096, 16, layout.E4M3}, {64, 4096, 128, layout.BF16}, {1, 32768, 16, layout.BF16}}
		}
		for _, c := range cases {
			b.Run(fmt.Sprintf("%s/B%d-L%d-H%d-%v", d.b.Name(), c.B, c.L, c.H, c.dt), func(b *testing.B) {
				benchMLADecode(b, d, c.B, c.L, c.H, c.dt)
			})
		}
	}
}

func benchMLADecode(b *testing.B, d benchDevice, B, L, H int, dt layout.DType) {
	const ps = 64
	pagesPer := (L + ps - 1) / ps
	g := layout.MLA{Form: layout.Split, DType: dt, NumPages: B * pagesPer, PageSize: ps, HeadDimCKV: 512, HeadDimKPE: 64}
	cache, err := d.b.NewMLACache(g)
	require.NoError(b, err)
	defer cache.Free(d.b)
	p := &cuda.MLAStepPlan{Geometry: g, KVIndptr: []int32{0}, Decode: true, NumHeads: H, SMScale: 0.0722}
	for r := range B {
		for i := range pagesPer {
			p.KVPageIndices = append(p.KVPageIndices, int32(r*pagesPer+i))
		}
		p.KVIndptr = append(p.KVIndptr, int32(len(p.KVPageIndices)))
		p.KVLen = append(p.KVLen, int32(L))
	}
	s, err := d.b.NewStep(cuda.StepLimits{MaxBatch: B, MaxPages: len(p.KVPageIndices), MaxRows: B, MaxQOHeads: H, MaxHeadDim: 512})
	require.NoError(b, err)
	defer s.Free()
	qt := layout.BF16 // FlashInfer's MLA q and o for bf16 and fp8 caches
	if dt == layout.F16 {
		qt = layout.F16
	}
	require.Equal(b, "mla_decode_tc_"+map[layout.DType]string{layout.F16: "f16", layout.BF16: "bf16", layout.E4M3: "e4m3"}[dt],
		cuda.MLAKernelFor(g, qt, qt, qt))
	tensor := func(dim int) cuda.DeviceTensor {
		x, err := d.b.AllocTensor(qt, B, H, dim)
		require.NoError(b, err)
		require.NoError(b, d.b.Upload(x, kernels.NewTensor(qt, B, H, dim)))
		return x
	}
	qn, qp, o := tensor(512), tensor(64), tensor(512)
	step := func() {
		require.NoError(b, s.PlanMLA(p))
		require.NoError(b, s.MLADecode(cache, qn, qp, o, cuda.DeviceTensor{}))
		require.NoError(b, d.b.Synchronize())
	}
	timeStep(b, d, step, int64(B)*int64(L)*int64(576*dt.Size()))
}

// timeStep runs step once untimed, then b.N times, and reports the step's
// cache bytes, bound and host traffic (reportStep).
func timeStep(b *testing.B, d benchDevice, step func(), cacheBytes int64) {
	step()
	before := d.b.Traffic()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		step()
	}
	reportStep(b, d, cacheBytes, d.b.Traffic().Sub(before), time.Since(start))
}
