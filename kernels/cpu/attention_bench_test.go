package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// decodeBench is the decode benchmark shape: B=32 requests of 4096
// tokens, Hq=32 query heads over Hkv=8 kv heads, head_dim 128, f16 cache,
// page_size 16, NHD, one 5-D tensor. Each request's pages are scattered
// over the pool.
type decodeBench struct {
	p       *kernels.DecodeParams
	kvBytes int64 // bytes of K and V that one decode reads
}

func newDecodeBench(tb testing.TB, B, tokens, hq, hkv, d, pageSize int) *decodeBench {
	tb.Helper()
	g := layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F16, PageSize: pageSize, NumKVHeads: hkv, HeadDim: d}
	pagesPer := (tokens + pageSize - 1) / pageSize
	g.NumPages = B * pagesPer
	cache, err := kernels.NewPagedKVCache(g)
	if err != nil {
		tb.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	// Finite f16 values in [-1, 1): random mantissa, exponents 0..14.
	var pool [4096]uint16
	for i := range pool {
		pool[i] = uint16(rng.IntN(2))<<15 | uint16(rng.IntN(15))<<10 | uint16(rng.IntN(1024))
	}
	for i := 0; i+1 < len(cache.Data); i += 2 {
		v := pool[(i/2*2654435761>>7)%len(pool)]
		cache.Data[i], cache.Data[i+1] = byte(v), byte(v>>8)
	}
	perm := rng.Perm(g.NumPages)
	t := kernels.PageTable{KVIndptr: make([]int32, B+1), KVPageIndices: make([]int32, g.NumPages), KVLastPageLen: make([]int32, B)}
	for b := 0; b < B; b++ {
		t.KVIndptr[b+1] = int32((b + 1) * pagesPer)
		t.KVLastPageLen[b] = int32((tokens-1)%pageSize + 1)
	}
	for i := range t.KVPageIndices {
		t.KVPageIndices[i] = int32(perm[i])
	}
	q := make([]float32, B*hq*d)
	for i := range q {
		q[i] = float32(rng.Float64()*2 - 1)
	}
	return &decodeBench{
		p: &kernels.DecodeParams{
			Q: kernels.TensorFromF32(layout.F16, q, B, hq, d), Cache: cache, Table: t,
			AttentionParams: kernels.AttentionParams{NumQOHeads: hq, WindowLeft: -1},
			O:               kernels.NewTensor(layout.F16, B, hq, d), LSE: make([]float32, B*hq),
		},
		kvBytes: int64(B) * int64(tokens) * int64(hkv) * int64(d) * 2 * 2,
	}
}

// BenchmarkBatchDecode reports bytes of K/V read per second; compare with
// BenchmarkBatchDecode/memmove, a copy of the same number of bytes from the
// same cache, in the same run.
func BenchmarkBatchDecode(b *testing.B) {
	const B, tokens, hq, hkv, d, pageSize = 32, 4096, 32, 8, 128, 16
	bench := newDecodeBench(b, B, tokens, hq, hkv, d, pageSize)
	b.Run(fmt.Sprintf("cpu/B=%d/Hq=%d/Hkv=%d/D=%d/L=%d/f16", B, hq, hkv, d, tokens), func(b *testing.B) {
		be := New(Config{})
		b.SetBytes(bench.kvBytes)
		b.ReportAllocs()
		for b.Loop() {
			if err := be.BatchDecode(bench.p); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("memmove", func(b *testing.B) {
		src := bench.p.Cache.Data[:bench.kvBytes]
		dst := make([]byte, len(src))
		b.SetBytes(bench.kvBytes)
		b.ReportAllocs()
		for b.Loop() {
			copy(dst, src)
		}
	})
}

// TestBatchDecodeAllocs pins the allocations of a decode step at zero, on
// one worker and on several: each call reuses a call record with its
// per-worker scratch, and the helpers are started once.
func TestBatchDecodeAllocs(t *testing.T) {
	bench := newDecodeBench(t, 4, 100, 8, 2, 64, 16)
	for _, workers := range []int{1, 2, 3} {
		be := New(Config{Workers: workers})
		for range 50 { // warm up: every worker's scratch grows on its first task
			if err := be.BatchDecode(bench.p); err != nil {
				t.Fatal(err)
			}
		}
		allocs := testing.AllocsPerRun(20, func() {
			if err := be.BatchDecode(bench.p); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Fatalf("workers=%d: %.1f allocs per decode, want 0", workers, allocs)
		}
	}
}
