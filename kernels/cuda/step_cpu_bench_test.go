//go:build cuda

package cuda_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cuda"
	"github.com/pagedkv/pagedkv/layout"
)

// TestStepCPUAllocatesNothing pins the GPU Driver's share of the hot path:
// a whole decode step (plan, append and attention for 4 layers,
// synchronize) through the -tags cuda Driver allocates nothing. It runs
// against the stand-in driver in CI (scripts/cuda-stub.sh) and on a GPU.
func TestStepCPUAllocatesNothing(t *testing.T) {
	d := gpuDevice(t)
	if d == nil {
		t.Skip("no CUDA device")
	}
	step := cpuStep(t, d, 64, 512, 4)
	require.NoError(t, step())
	var err error
	allocs := testing.AllocsPerRun(50, func() {
		if e := step(); e != nil {
			err = e
		}
	})
	require.NoError(t, err)
	require.Zero(t, allocs, "allocations per decode step")
}

// BenchmarkStepCPU times the host side of one decode step as an engine
// runs it: one Plan (validate and upload the index arrays), then for each
// layer an Append of the step's new tokens and a decode Attention, then one
// Synchronize. B = 64 requests of 512 tokens (f16, 8 kv heads, 32 query
// heads, head_dim 128), 1 and 32 layers. Against the stand-in driver of
// scripts/cuda-stub.sh the kernels take no time, so the figures are the
// host overhead alone (goals in docs/kernels.md: <= 5 us per step plus
// <= 1 us per layer, 0 allocations); on a GPU they include the kernels.
func BenchmarkStepCPU(b *testing.B) {
	d := gpuDevice(b)
	if d == nil {
		b.Skip("no CUDA device")
	}
	for _, layers := range []int{1, 32} {
		b.Run(fmt.Sprintf("B64/layers%d", layers), func(b *testing.B) { benchStepCPU(b, d, 64, 512, layers) })
	}
}

// cpuStep sets up a decode step of B requests of L tokens over the given
// number of layers on d and returns it as a function (one Plan, per layer
// an Append and an Attention, one Synchronize).
func cpuStep(b testing.TB, d *cuda.Backend, B, L, layers int) func() error {
	const ps, H, Hq, D = 16, 8, 32, 128
	pagesPer := (L + ps - 1) / ps
	g := layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F16, NumPages: B * pagesPer, PageSize: ps, NumKVHeads: H, HeadDim: D}
	caches := make([]*cuda.DeviceKVCache, layers)
	for l := range caches {
		c, err := d.NewKVCache(g)
		require.NoError(b, err)
		b.Cleanup(func() { c.Free(d) })
		caches[l] = c
	}
	perm := rand.New(rand.NewPCG(1, 2)).Perm(g.NumPages)
	t := kernels.PageTable{KVIndptr: []int32{0}}
	var bi, pos []int32
	for r := range B {
		for p := range pagesPer {
			t.KVPageIndices = append(t.KVPageIndices, int32(perm[r*pagesPer+p]))
		}
		t.KVIndptr = append(t.KVIndptr, int32(len(t.KVPageIndices)))
		t.KVLastPageLen = append(t.KVLastPageLen, int32((L-1)%ps+1))
		bi, pos = append(bi, int32(r)), append(pos, int32(L-1))
	}
	s, err := d.NewStep(cuda.StepLimits{MaxBatch: B, MaxPages: len(t.KVPageIndices), MaxRows: B, MaxQOHeads: Hq, MaxHeadDim: D})
	require.NoError(b, err)
	b.Cleanup(s.Free)
	tensor := func(shape ...int) cuda.DeviceTensor {
		x, err := d.AllocTensor(layout.F16, shape...)
		require.NoError(b, err)
		b.Cleanup(func() { _ = d.FreeTensor(x) })
		return x
	}
	q, o, kv := tensor(B, Hq, D), tensor(B, Hq, D), tensor(B, H, D)
	p := &cuda.StepPlan{Geometry: g, Table: t, BatchIndices: bi, Positions: pos, Attention: kernels.Decode, Rows: B,
		AttentionParams: kernels.AttentionParams{NumQOHeads: Hq, WindowLeft: -1}}
	return func() error {
		if err := s.Plan(p); err != nil {
			return err
		}
		for _, c := range caches {
			if err := s.Append(c, kv, kv, 0, 0); err != nil {
				return err
			}
			if err := s.Attention(c, q, o, cuda.DeviceTensor{}); err != nil {
				return err
			}
		}
		return d.Synchronize()
	}
}

func benchStepCPU(b *testing.B, d *cuda.Backend, B, L, layers int) {
	step := cpuStep(b, d, B, L, layers)
	require.NoError(b, step())
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		if err := step(); err != nil {
			b.Fatal(err)
		}
	}
	ns := float64(time.Since(start).Nanoseconds()) / float64(b.N)
	b.ReportMetric(ns, "ns/step")
	b.ReportMetric(ns/float64(layers), "ns/layer")
}
