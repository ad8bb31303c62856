//go:build !purego

package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// TestFusedDecodeMatchesPureGo runs batch decode on f16 and bf16 caches in
// the shapes that take the fused assembly path (head_dim a multiple of 8,
// GQA groups of 4 or 8), NHD and HND, fused and split, with windows and
// soft-capping, and compares it with the same decode with the assembly
// switched off (the pure-Go loops).
func TestFusedDecodeMatchesPureGo(t *testing.T) {
	needSIMD(t)
	rng := rand.New(rand.NewPCG(21, 4))
	for i := range 40 {
		dt := []layout.DType{layout.F16, layout.BF16}[i%2]
		g := layout.Paged{
			Layout: []layout.KVLayout{layout.NHD, layout.HND}[i/2%2], Form: []layout.TensorForm{layout.Fused, layout.Split}[i/4%2],
			DType: dt, PageSize: []int{1, 3, 16}[rng.IntN(3)], NumKVHeads: 1 + rng.IntN(3), HeadDim: 8 * (1 + rng.IntN(17)),
		}
		group := []int{4, 8}[rng.IntN(2)]
		B := 1 + rng.IntN(4)
		lens := make([]int, B)
		indptr := []int32{0}
		for b := range lens {
			lens[b] = rng.IntN(70)
			indptr = append(indptr, indptr[b]+int32((lens[b]+g.PageSize-1)/g.PageSize))
		}
		g.NumPages = max(int(indptr[B]), 1)
		cache, err := kernels.NewPagedKVCache(g)
		if err != nil {
			t.Fatal(err)
		}
		for _, buf := range [][]byte{cache.Data, cache.K, cache.V} {
			copy(buf, randNarrow(rng, dt, len(buf)/2))
		}
		last := make([]int32, B)
		for b, l := range lens {
			if l > 0 {
				last[b] = int32((l-1)%g.PageSize + 1)
			}
		}
		indices := make([]int32, indptr[B])
		for j, p := range rng.Perm(len(indices)) {
			indices[j] = int32(p)
		}
		hq := g.NumKVHeads * group
		q := kernels.NewTensor(layout.F32, B, hq, g.HeadDim)
		for j, x := range randF32(rng, B*hq*g.HeadDim) {
			binaryPutF32(q.Data[4*j:], x)
		}
		ap := kernels.AttentionParams{NumQOHeads: hq, WindowLeft: -1}
		if rng.IntN(3) == 0 {
			ap.WindowLeft = rng.IntN(40)
		}
		if rng.IntN(3) == 0 {
			ap.LogitsSoftCap = 30
		}
		run := func(simd bool) (o []float32, lse []float32) {
			defer func(old bool) { hasSIMD = old }(hasSIMD)
			hasSIMD = simd
			p := &kernels.DecodeParams{Q: q, Cache: cache, Table: kernels.PageTable{KVIndptr: indptr, KVPageIndices: indices, KVLastPageLen: last},
				AttentionParams: ap, O: kernels.NewTensor(layout.F32, B, hq, g.HeadDim), LSE: make([]float32, B*hq)}
			if err := New(Config{Workers: 2}).BatchDecode(p); err != nil {
				t.Fatal(err)
			}
			o = make([]float32, B*hq*g.HeadDim)
			layout.LoadRowF32(o, layout.F32, p.O.Data)
			return o, p.LSE
		}
		name := fmt.Sprintf("case %d: %+v group %d lens %v window %d softcap %v", i, g, group, lens, ap.WindowLeft, ap.LogitsSoftCap)
		o1, l1 := run(true)
		o0, l0 := run(false)
		for j := range o0 {
			// !(d <= tol), not d > tol: a NaN on either side must fail.
			if !(math.Abs(float64(o1[j]-o0[j])) <= 1e-4*(1+math.Abs(float64(o0[j])))) {
				t.Fatalf("%s: O[%d] = %v with the assembly, %v without", name, j, o1[j], o0[j])
			}
		}
		for j := range l0 {
			if l0[j] != l1[j] && !(math.Abs(float64(l1[j]-l0[j])) <= 1e-4*(1+math.Abs(float64(l0[j])))) {
				t.Fatalf("%s: LSE[%d] = %v with the assembly, %v without", name, j, l1[j], l0[j])
			}
		}
	}
}

func binaryPutF32(b []byte, x float32) {
	u := math.Float32bits(x)
	b[0], b[1], b[2], b[3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
}
