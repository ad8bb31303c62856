//go:build cgo

package cpuemu

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/layout"
)

// benchDecodeParams is one decode step of a small GQA model: 8 requests of
// 512 keys, 2 kv heads x group 4, head_dim 128, f16 cache, NHD.
func benchDecodeParams(b *testing.B) (*kernels.DecodeParams, int64) {
	const B, L, H, group, D, N = 8, 512, 2, 4, 128, 16
	g := layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F16, NumPages: B * L / N, PageSize: N, NumKVHeads: H, HeadDim: D}
	cache, err := kernels.NewPagedKVCache(g)
	require.NoError(b, err)
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i+1 < len(cache.Data); i += 2 {
		cache.Data[i], cache.Data[i+1] = byte(r.IntN(256)), byte(0x30+r.IntN(8)) // f16 values of modest size
	}
	t := kernels.PageTable{KVIndptr: []int32{0}, KVLastPageLen: make([]int32, B)}
	for b := range B {
		for p := range L / N {
			t.KVPageIndices = append(t.KVPageIndices, int32(b*L/N+p))
		}
		t.KVIndptr = append(t.KVIndptr, int32(len(t.KVPageIndices)))
		t.KVLastPageLen[b] = N
	}
	q := make([]float32, B*H*group*D)
	for i := range q {
		q[i] = float32(r.Float64() - 0.5)
	}
	p := &kernels.DecodeParams{Q: kernels.TensorFromF32(layout.F16, q, B, H*group, D), Cache: cache, Table: t,
		AttentionParams: kernels.AttentionParams{NumQOHeads: H * group, WindowLeft: -1},
		O:               kernels.NewTensor(layout.F16, B, H*group, D), LSE: make([]float32, B*H*group)}
	return p, int64(B * L * 2 * H * D * 2) // K and V bytes the kernels read
}

// BenchmarkDecode: the emulated CUDA kernel next to the pure-Go CPU backend
// on the same step (bytes = K/V bytes read). The emulator's cost is the
// fiber switches of its barriers and shuffles, not the arithmetic.
func BenchmarkDecode(b *testing.B) {
	for _, be := range []kernels.Backend{New(Config{}), cpu.New(cpu.Config{})} {
		b.Run(be.Name(), func(b *testing.B) {
			p, bytes := benchDecodeParams(b)
			b.SetBytes(bytes)
			b.ReportAllocs()
			for b.Loop() {
				if err := be.BatchDecode(p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAppend: appending 64 tokens (8 heads x 128, f16) through the
// emulator, the CPU backend, and a plain copy of the same bytes (the
// baseline every append implementation is bounded by).
func BenchmarkAppend(b *testing.B) {
	const nnz, H, D, N = 64, 8, 128, 16
	g := layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F16, NumPages: 2 * nnz / N, PageSize: N, NumKVHeads: H, HeadDim: D}
	cache, err := kernels.NewPagedKVCache(g)
	require.NoError(b, err)
	t := kernels.PageTable{KVIndptr: []int32{0, nnz / N}, KVLastPageLen: []int32{N}}
	for p := range nnz / N {
		t.KVPageIndices = append(t.KVPageIndices, int32(2*p+1))
	}
	p := &kernels.AppendParams{AppendKey: kernels.NewTensor(layout.F16, nnz, H, D), AppendValue: kernels.NewTensor(layout.F16, nnz, H, D),
		BatchIndices: make([]int32, nnz), Positions: make([]int32, nnz), Cache: cache, Table: t}
	for i := range p.Positions {
		p.Positions[i] = int32(i)
	}
	bytes := int64(2 * len(p.AppendKey.Data))
	for _, be := range []kernels.Backend{New(Config{}), cpu.New(cpu.Config{})} {
		b.Run(be.Name(), func(b *testing.B) {
			b.SetBytes(bytes)
			b.ReportAllocs()
			for b.Loop() {
				if err := be.AppendPagedKVCache(p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("memmove", func(b *testing.B) {
		b.SetBytes(bytes)
		b.ReportAllocs()
		for b.Loop() {
			copy(cache.Data, p.AppendKey.Data)
			copy(cache.Data[len(p.AppendKey.Data):], p.AppendValue.Data)
		}
	})
}
