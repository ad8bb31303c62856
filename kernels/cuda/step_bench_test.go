//go:build cgo

package cuda_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/cpuemu"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cuda"
	"github.com/pagedkv/pagedkv/layout"
)

// benchDevice is a device backend under benchmark: the emulator (whose
// times say nothing about a GPU) and, under -tags cuda with a device, the
// GPU.
type benchDevice struct {
	b   *cuda.Backend
	gpu bool
}

func benchDevices(b *testing.B) []benchDevice {
	ds := []benchDevice{{cpuemu.NewDevice(cpuemu.Config{}), false}}
	if g := gpuDevice(b); g != nil {
		ds = append(ds, benchDevice{g, true})
	}
	return ds
}

// benchCase is one device-resident step shape.
type benchCase struct {
	B, L, H, Hq, D int
	dt             layout.DType
}

func (c benchCase) String() string {
	return fmt.Sprintf("B%d-L%d-H%d-Hq%d-D%d-%v", c.B, c.L, c.H, c.Hq, c.D, c.dt)
}

// reportStep reports the step's model and measured traffic: cache-B/op
// (what the kernels must touch in the cache), the bound that gives at an
// H100's 3.35 TB/s, the host bytes per step (index arrays), and on a GPU
// the achieved fraction of the bound (goal >= 0.85 for large decode).
func reportStep(b *testing.B, d benchDevice, cacheBytes int64, host cuda.Traffic, elapsed time.Duration) {
	bound := cuda.Bound(cacheBytes, cuda.H100Bandwidth)
	b.ReportMetric(float64(cacheBytes), "cache-B/op")
	b.ReportMetric(float64(bound.Nanoseconds())/1e3, "h100-bound-us/op")
	b.ReportMetric(float64(host.TransferBytes())/float64(b.N), "copied-B/op")
	if d.gpu {
		b.ReportMetric(float64(bound)/(float64(elapsed)/float64(b.N)), "hbm-fraction")
	}
}

// BenchmarkStepDecode: one device-resident decode step (plan: one index
// upload; launch; on the GPU a synchronize) over a cache that never leaves
// the device. Sizes: small on the emulator, the docs/kernels.md shapes on a
// GPU.
func BenchmarkStepDecode(b *testing.B) {
	for _, d := range benchDevices(b) {
		cases := []benchCase{{4, 512, 2, 8, 128, layout.F16}}
		if d.gpu {
			cases = []benchCase{{64, 4096, 8, 32, 128, layout.F16}, {64, 4096, 8, 32, 128, layout.E4M3}, {8, 512, 8, 32, 128, layout.F16}, {1, 32768, 8, 32, 128, layout.F16}}
		}
		for _, c := range cases {
			b.Run(d.b.Name()+"/"+c.String(), func(b *testing.B) { benchDecode(b, d, c) })
		}
	}
}

// benchCache allocates a fused cache of case c on d (freed when b's run
// ends): pages of 16 tokens, enough for c.B requests of c.L tokens, with
// the pages each request needs.
func benchCache(b *testing.B, d benchDevice, c benchCase) (layout.Paged, *cuda.DeviceKVCache, int) {
	const ps = 16
	pagesPer := (c.L + ps - 1) / ps
	g := layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: c.dt, NumPages: c.B * pagesPer, PageSize: ps, NumKVHeads: c.H, HeadDim: c.D}
	cache, err := d.b.NewKVCache(g)
	require.NoError(b, err)
	b.Cleanup(func() { cache.Free(d.b) })
	return g, cache, pagesPer
}

func benchDecode(b *testing.B, d benchDevice, c benchCase) {
	g, cache, pagesPer := benchCache(b, d, c)
	ps := g.PageSize
	rng := rand.New(rand.NewPCG(1, 2))
	perm := rng.Perm(g.NumPages)
	t := kernels.PageTable{KVIndptr: []int32{0}}
	lens := make([]int, c.B)
	for r := range c.B {
		for p := range pagesPer {
			t.KVPageIndices = append(t.KVPageIndices, int32(perm[r*pagesPer+p]))
		}
		t.KVIndptr = append(t.KVIndptr, int32(len(t.KVPageIndices)))
		t.KVLastPageLen = append(t.KVLastPageLen, int32((c.L-1)%ps+1))
		lens[r] = c.L
	}
	s, err := d.b.NewStep(cuda.StepLimits{MaxBatch: c.B, MaxPages: len(t.KVPageIndices), MaxRows: c.B, MaxQOHeads: c.Hq, MaxHeadDim: c.D})
	require.NoError(b, err)
	defer s.Free()
	q, err := d.b.AllocTensor(layout.F16, c.B, c.Hq, c.D)
	require.NoError(b, err)
	o, err := d.b.AllocTensor(layout.F16, c.B, c.Hq, c.D)
	require.NoError(b, err)
	require.NoError(b, d.b.Upload(q, kernels.NewTensor(layout.F16, c.B, c.Hq, c.D)))
	p := &cuda.StepPlan{Geometry: g, Table: t, Attention: kernels.Decode, Rows: c.B, AttentionParams: kernels.AttentionParams{NumQOHeads: c.Hq, WindowLeft: -1}}
	step := func() {
		require.NoError(b, s.Plan(p))
		require.NoError(b, s.Attention(cache, q, o, cuda.DeviceTensor{}))
		require.NoError(b, d.b.Synchronize())
	}
	timeStep(b, d, step, cuda.DecodeCacheBytes(g, c.Hq, lens, -1))
}

// BenchmarkStepAppend: one device-resident append step of B requests'
// new tokens (L each: 1 is a decode step's append, more a prefill chunk).
func BenchmarkStepAppend(b *testing.B) {
	for _, d := range benchDevices(b) {
		cases := []benchCase{{8, 8, 2, 8, 128, layout.F16}}
		if d.gpu {
			cases = []benchCase{{64, 1, 8, 32, 128, layout.F16}, {1, 8192, 8, 32, 128, layout.F16}}
		}
		for _, c := range cases {
			b.Run(d.b.Name()+"/"+c.String(), func(b *testing.B) { benchAppend(b, d, c) })
		}
	}
}

func benchAppend(b *testing.B, d benchDevice, c benchCase) {
	g, cache, pagesPer := benchCache(b, d, c)
	ps := g.PageSize
	t := kernels.PageTable{KVIndptr: []int32{0}}
	var bi, pos []int32
	for r := range c.B {
		for p := range pagesPer {
			t.KVPageIndices = append(t.KVPageIndices, int32(r*pagesPer+p))
		}
		t.KVIndptr = append(t.KVIndptr, int32(len(t.KVPageIndices)))
		t.KVLastPageLen = append(t.KVLastPageLen, int32((c.L-1)%ps+1))
		for i := range c.L {
			bi, pos = append(bi, int32(r)), append(pos, int32(i))
		}
	}
	nnz := len(bi)
	s, err := d.b.NewStep(cuda.StepLimits{MaxBatch: c.B, MaxPages: len(t.KVPageIndices), MaxRows: nnz})
	require.NoError(b, err)
	defer s.Free()
	kv, err := d.b.AllocTensor(c.dt, nnz, c.H, c.D)
	require.NoError(b, err)
	require.NoError(b, d.b.Upload(kv, kernels.NewTensor(c.dt, nnz, c.H, c.D)))
	p := &cuda.StepPlan{Geometry: g, Table: t, BatchIndices: bi, Positions: pos}
	step := func() {
		require.NoError(b, s.Plan(p))
		require.NoError(b, s.Append(cache, kv, kv, 0, 0))
		require.NoError(b, d.b.Synchronize())
	}
	timeStep(b, d, step, cuda.AppendCacheBytes(g, nnz))
}
