package cascade

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/pagedkv/pagedkv/internal/reference"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/stretchr/testify/require"
)

// TestRunLevelWindowLeft: with Params.LevelWindowLeft, Run equals the float64
// model of FlashInfer's per-level plan (each level a batch prefill with its
// own window_left, causal on the last level only, the states merged), for
// random trees and random windows per level; all -1 equals no
// LevelWindowLeft, and some case's windows change the output (they are
// applied).
func TestRunLevelWindowLeft(t *testing.T) {
	b := cpu.New(cpu.Config{Workers: 2})
	changed := 0
	for i := range 60 {
		rng := rand.New(rand.NewPCG(7, uint64(i)))
		levels := 2 + rng.IntN(3)
		causal := rng.IntN(2) == 0
		g := layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F32, PageSize: []int{1, 2, 4}[rng.IntN(3)], NumKVHeads: 1, HeadDim: 8}
		rt := genTree(rng, levels, g.PageSize, false, causal)
		rt.shuffleIDs(rng)
		g.NumPages = rt.pages + 1
		cache := randomCache(rng, g)
		lay, err := Build(rt.root, g.PageSize)
		require.NoError(t, err)
		hq := 2
		nnz := int(lay.RequestQOIndptr[len(lay.RequestOrder)])
		q := kernels.TensorFromF32(layout.F32, randFloats(rng, nnz*hq*g.HeadDim), nnz, hq, g.HeadDim)
		windows := make([]int, len(lay.Levels))
		for l := range windows {
			windows[l] = rng.IntN(6) - 1
		}
		run := func(w []int) *Params {
			p := &Params{Levels: lay.Levels, Q: q, Cache: cache, Causal: causal, LevelWindowLeft: w,
				AttentionParams: kernels.AttentionParams{NumQOHeads: hq, WindowLeft: -1},
				O:               kernels.NewTensor(layout.F32, nnz, hq, g.HeadDim), LSE: make([]float32, nnz*hq)}
			require.NoError(t, Run(b, p))
			return p
		}
		p := run(windows)
		what := fmt.Sprintf("case %d levels %d windows %v causal %v page %d", i, len(lay.Levels), windows, causal, g.PageSize)

		refCache := reference.PagedKV{Layout: g.Layout, Form: g.Form, DType: g.DType, NumPages: g.NumPages, PageSize: g.PageSize, NumKVHeads: g.NumKVHeads, HeadDim: g.HeadDim, Data: cache.Data, K: cache.K, V: cache.V}
		qRef := reference.Rows3(reference.Floats(q.DType, q.Data), nnz, hq, g.HeadDim)
		os := make([][][][]float64, len(lay.Levels))
		ls := make([][][]float64, len(lay.Levels))
		for l, lv := range lay.Levels {
			os[l], ls[l] = reference.BatchPrefill(qRef, lv.QOIndptr, refCache, lv.KVIndptr, lv.KVPageIndices, lv.KVLastPageLen,
				reference.Logits{WindowLeft: windows[l], Causal: causal && l == len(lay.Levels)-1})
		}
		wantO := make([]float64, 0, nnz*hq*g.HeadDim)
		wantLSE := make([]float64, 0, nnz*hq)
		for r := range nnz {
			for h := range hq {
				var vs [][]float64
				var ss []float64
				for l := range lay.Levels {
					vs, ss = append(vs, os[l][r][h]), append(ss, ls[l][r][h])
				}
				v, s := reference.MergeStates(vs, ss, g.HeadDim)
				wantO, wantLSE = append(wantO, v...), append(wantLSE, s)
			}
		}
		requireClose(t, what+" o", p.O.F32(), wantO, 1e-4, 1e-4, hq, g.HeadDim)
		requireClose(t, what+" lse", p.LSE, wantLSE, 1e-4, 1e-4, hq, 1)

		none, minus := run(nil), run(func() []int {
			w := make([]int, len(lay.Levels))
			for l := range w {
				w[l] = -1
			}
			return w
		}())
		require.Equal(t, none.O.Data, minus.O.Data, what)
		for k := range none.O.Data {
			if none.O.Data[k] != p.O.Data[k] {
				changed++
				break
			}
		}
	}
	require.Positive(t, changed, "no case's windows changed the output")
}
