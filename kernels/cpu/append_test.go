package cpu_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/kernels/kernelstest"
	"github.com/pagedkv/pagedkv/layout"
)

// appendBackends: one worker (always inline) and three (large appends split
// into chunks on goroutines, so -race sees them).
func appendBackends() map[string]*cpu.Backend {
	return map[string]*cpu.Backend{"workers=1": cpu.New(cpu.Config{Workers: 1}), "workers=3": cpu.New(cpu.Config{Workers: 3})}
}

func TestAppendConformance(t *testing.T) {
	for name, b := range appendBackends() {
		t.Run(name, func(t *testing.T) { kernelstest.TestAppend(t, b) })
	}
}

func TestMLAAppendConformance(t *testing.T) {
	for name, b := range appendBackends() {
		t.Run(name, func(t *testing.T) { kernelstest.TestMLAAppend(t, b) })
	}
}

// Appends big enough to be split across goroutines, checked against the
// reference (the conformance cases are small and run inline).
func TestAppendParallelChunks(t *testing.T) {
	b := cpu.New(cpu.Config{Workers: 4})
	for _, c := range []kernelstest.AppendCase{
		{Layout: layout.NHD, Form: layout.Fused, DType: layout.F32, PageSize: 16, Heads: 4, HeadDim: 64, MaxBatch: 12, Shuffle: true},
		{Layout: layout.HND, Form: layout.Split, DType: layout.E4M3, SrcDType: layout.F16, PageSize: 16, Heads: 4, HeadDim: 64, MaxBatch: 12},
	} {
		kernelstest.CheckAppend(t, b, c, 11)
	}
	kernelstest.CheckMLAAppend(t, b, kernelstest.MLACase{Form: layout.Split, DType: layout.F32, PageSize: 16, DCKV: 512, DKPE: 64, MaxBatch: 8}, 5)
}

// The parallel path (several workers, an append of many 64 KiB chunks)
// allocates nothing either: calls and helpers are reused.
func TestParallelAppendDoesNotAllocate(t *testing.T) {
	p := benchAppend(layout.HND, 256, 1)
	for _, workers := range []int{2, 3} {
		b := cpu.New(cpu.Config{Workers: workers})
		for range 10 {
			require.NoError(t, b.AppendPagedKVCache(&p))
		}
		require.Zero(t, testing.AllocsPerRun(20, func() { require.NoError(t, b.AppendPagedKVCache(&p)) }), "workers=%d", workers)
	}
}

// The serial path (one worker or a small append) does not allocate.
func TestAppendDoesNotAllocate(t *testing.T) {
	b := cpu.New(cpu.Config{Workers: 1})
	f := kernelstest.NewAppendFixture(rand.New(rand.NewPCG(1, 1)), kernelstest.AppendCase{Layout: layout.NHD, Form: layout.Fused, DType: layout.F16, PageSize: 16, Heads: 8, HeadDim: 128, MaxBatch: 8})
	p := f.Params
	require.Zero(t, testing.AllocsPerRun(20, func() { require.NoError(t, b.AppendPagedKVCache(&p)) }))
	m := kernelstest.NewMLAFixture(rand.New(rand.NewPCG(1, 1)), kernelstest.MLACase{Form: layout.Fused, DType: layout.BF16, PageSize: 16, DCKV: 512, DKPE: 64, MaxBatch: 4})
	mp := m.Params
	require.Zero(t, testing.AllocsPerRun(20, func() { require.NoError(t, b.AppendPagedMLAKVCache(&mp)) }))
}

// FuzzAppendGather decodes a case (layout, form, dtypes, page size, heads,
// head dim) and a seed, appends a random batch through the CSR page table on
// the CPU backend and compares the cache with the reference, the appended
// tokens read back, and untouched entries unchanged.
func FuzzAppendGather(f *testing.F) {
	f.Add(uint64(0), uint8(0), uint8(1), uint8(3), uint8(1), uint8(7))
	f.Add(uint64(1), uint8(3), uint8(3), uint8(15), uint8(3), uint8(63))
	f.Add(uint64(2), uint8(0x15), uint8(4), uint8(0), uint8(0), uint8(0))
	b := cpu.New(cpu.Config{Workers: 2})
	dts := []layout.DType{layout.F32, layout.F16, layout.BF16, layout.E4M3, layout.E5M2}
	srcs := []layout.DType{layout.F32, layout.F16, layout.BF16}
	f.Fuzz(func(t *testing.T, seed uint64, bits, dt, pageSize, heads, dim uint8) {
		c := kernelstest.AppendCase{
			Layout: layout.KVLayout(bits & 1), Form: layout.TensorForm(bits >> 1 & 1),
			DType: dts[int(dt)%len(dts)], PageSize: 1 + int(pageSize%17), Heads: 1 + int(heads%4), HeadDim: 1 + int(dim%70),
			MaxBatch: 1 + int(bits>>2&3), Shuffle: bits&0x10 != 0,
		}
		c.SrcDType = c.DType
		if (c.DType == layout.E4M3 || c.DType == layout.E5M2) && bits&0x20 != 0 {
			c.SrcDType = srcs[int(bits>>6)%len(srcs)]
		}
		kernelstest.CheckAppend(t, b, c, seed)
	})
}

// benchAppend builds an append of nnz tokens in requests of perReq tokens
// each, every request in its own pages scattered over the pool:
// page_size 16, H=8, D=128, f16.
func benchAppend(l layout.KVLayout, nnz, perReq int) kernels.AppendParams {
	const N, H, D = 16, 8, 128
	B := nnz / perReq
	pagesPer := (perReq + N - 1) / N
	r := rand.New(rand.NewPCG(1, 2))
	ids := r.Perm(B * pagesPer)
	t := kernels.PageTable{KVIndptr: make([]int32, B+1), KVLastPageLen: make([]int32, B)}
	var bi, pos []int32
	for b := range B {
		t.KVIndptr[b+1] = int32((b + 1) * pagesPer)
		t.KVLastPageLen[b] = int32((perReq-1)%N + 1)
		for i := range perReq {
			bi, pos = append(bi, int32(b)), append(pos, int32(i))
		}
	}
	for _, id := range ids {
		t.KVPageIndices = append(t.KVPageIndices, int32(id))
	}
	cache, err := kernels.NewPagedKVCache(layout.Paged{Layout: l, Form: layout.Fused, DType: layout.F16, NumPages: len(ids), PageSize: N, NumKVHeads: H, HeadDim: D})
	if err != nil {
		panic(err)
	}
	return kernels.AppendParams{AppendKey: kernels.NewTensor(layout.F16, nnz, H, D), AppendValue: kernels.NewTensor(layout.F16, nnz, H, D),
		BatchIndices: bi, Positions: pos, Cache: cache, Table: t}
}

// BenchmarkAppend reports the CPU append's throughput (bytes of K and V
// written) next to a memmove of the same bytes in the same run. Shapes:
// decode (256 requests x 1 token) and prefill (64 requests x 64 tokens).
func BenchmarkAppend(b *testing.B) {
	for _, shape := range []struct {
		name        string
		nnz, perReq int
	}{{"decode", 256, 1}, {"prefill", 4096, 64}} {
		for _, l := range []layout.KVLayout{layout.NHD, layout.HND} {
			p := benchAppend(l, shape.nnz, shape.perReq)
			bytes := int64(len(p.AppendKey.Data) + len(p.AppendValue.Data))
			for _, workers := range []int{1, 0} {
				be := cpu.New(cpu.Config{Workers: workers})
				b.Run(fmt.Sprintf("%s/%v/f16/workers=%d", shape.name, l, workers), func(b *testing.B) {
					b.SetBytes(bytes)
					b.ReportAllocs()
					for b.Loop() {
						if err := be.AppendPagedKVCache(&p); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
		// The physical baseline: one memmove per tensor of the same bytes.
		p := benchAppend(layout.NHD, shape.nnz, shape.perReq)
		dstK, dstV := make([]byte, len(p.AppendKey.Data)), make([]byte, len(p.AppendValue.Data))
		b.Run(shape.name+"/memmove", func(b *testing.B) {
			b.SetBytes(int64(len(dstK) + len(dstV)))
			b.ReportAllocs()
			for b.Loop() {
				copy(dstK, p.AppendKey.Data)
				copy(dstV, p.AppendValue.Data)
			}
		})
	}
}

// BenchmarkAppendConvert is the converting path (f16 rows into an e4m3
// cache), next to the plain f16 copy above.
func BenchmarkAppendConvert(b *testing.B) {
	p := benchAppend(layout.NHD, 4096, 64)
	g := p.Cache.Geometry
	g.DType = layout.E4M3
	var err error
	if p.Cache, err = kernels.NewPagedKVCache(g); err != nil {
		b.Fatal(err)
	}
	p.KScale, p.VScale = 0.5, 0.25
	be := cpu.New(cpu.Config{Workers: 1})
	b.SetBytes(int64(len(p.AppendKey.Data) + len(p.AppendValue.Data)))
	b.ReportAllocs()
	for b.Loop() {
		if err := be.AppendPagedKVCache(&p); err != nil {
			b.Fatal(err)
		}
	}
}

func TestNVFP4Conformance(t *testing.T) {
	for name, b := range appendBackends() {
		t.Run(name, func(t *testing.T) { kernelstest.TestNVFP4(t, b) })
	}
}

// An NVFP4 append and a decode over the NVFP4 cache allocate nothing, on
// one worker and on several (the quantiser widens through a stack buffer).
func TestNVFP4DoesNotAllocate(t *testing.T) {
	f := kernelstest.NewAppendFixture(rand.New(rand.NewPCG(2, 2)), kernelstest.AppendCase{Layout: layout.HND, Form: layout.Split, DType: layout.NVFP4, SrcDType: layout.BF16, PageSize: 16, Heads: 2, HeadDim: 128, MaxBatch: 6})
	p := f.Params
	B := p.Table.BatchSize()
	d := kernels.DecodeParams{Q: kernels.NewTensor(layout.F16, B, 4, 128), Cache: p.Cache, Table: p.Table,
		AttentionParams: kernels.AttentionParams{NumQOHeads: 4, WindowLeft: -1, KScale: 0.01, VScale: 0.02}, O: kernels.NewTensor(layout.F32, B, 4, 128)}
	for _, workers := range []int{1, 3} {
		b := cpu.New(cpu.Config{Workers: workers})
		for range 20 {
			require.NoError(t, b.AppendPagedKVCache(&p))
			require.NoError(t, b.BatchDecode(&d))
		}
		require.Zero(t, testing.AllocsPerRun(10, func() { require.NoError(t, b.AppendPagedKVCache(&p)) }), "append, workers=%d", workers)
		require.Zero(t, testing.AllocsPerRun(10, func() { require.NoError(t, b.BatchDecode(&d)) }), "decode, workers=%d", workers)
	}
}
