package cascade

import (
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/reference"
	"github.com/pagedkv/pagedkv/internal/safetensors"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/kernels/kernelstest"
	"github.com/pagedkv/pagedkv/layout"
)

// requireClose fails with a table of the first mismatches.
func requireClose(t *testing.T, what string, got []float32, want []float64, atol, rtol float64, heads, dim int) {
	t.Helper()
	require.Len(t, got, len(want), what)
	var b strings.Builder
	bad := 0
	for i, w := range want {
		g := float64(got[i])
		ok := g == w || math.Abs(g-w) <= atol+rtol*math.Abs(w)
		if !ok {
			if bad < 8 {
				fmt.Fprintf(&b, "\n  row %d head %d feat %d: got %.7g want %.7g", i/(heads*dim), i/dim%heads, i%dim, g, w)
			}
			bad++
		}
	}
	if bad > 0 {
		t.Fatalf("%s: %d of %d values outside atol %g + rtol %g:%s", what, bad, len(want), atol, rtol, b.String())
	}
}

func f64s(xs []float32) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(x)
	}
	return out
}

// randomTree is a prefix tree over fresh page ids for the property test.
type randomTree struct {
	root  *Node
	paths map[int][]*Node // request id -> root ... its node
	pages int
}

// genTree draws a tree whose deepest request is at depth levels-1. With
// flat, every node above the last level has only full pages, so each
// request's KV is also expressible as one flat page list; with causal,
// every request ends at the last level with at least qo_len tokens there
// (its queries are the last tokens of its own segment).
func genTree(rng *rand.Rand, levels, pageSize int, flat, causal bool) *randomTree {
	rt := &randomTree{paths: map[int][]*Node{}}
	nextID := 0
	var gen func(depth int, path []*Node) *Node
	gen = func(depth int, path []*Node) *Node {
		n := &Node{}
		last := depth == levels-1
		np := rng.IntN(3)
		if last {
			np = rng.IntN(4)
		}
		qoLen := 1 + rng.IntN(3)
		if rng.IntN(8) == 0 {
			qoLen = 0
		}
		if last && causal {
			np = max(np, (qoLen+pageSize-1)/pageSize)
		}
		for i := 0; i < np; i++ {
			n.Pages = append(n.Pages, int32(rt.pages))
			rt.pages++
		}
		if np > 0 {
			n.LastPageLen = int32(pageSize)
			if last || !flat {
				n.LastPageLen = int32(1 + rng.IntN(pageSize))
			}
			if last && causal {
				// At least qo_len tokens in the segment.
				if tokens := (np-1)*pageSize + int(n.LastPageLen); tokens < qoLen {
					n.LastPageLen = int32(qoLen - (np-1)*pageSize)
				}
			}
		}
		path = append(path[:len(path):len(path)], n)
		if last {
			n.Requests = []Request{{ID: nextID, QOLen: qoLen}}
			rt.paths[nextID] = path
			nextID++
			return n
		}
		kids := 1 + rng.IntN(3)
		for i := 0; i < kids; i++ {
			n.Children = append(n.Children, gen(depth+1, path))
		}
		if !causal && rng.IntN(3) == 0 { // a request that ends above the last level
			n.Requests = []Request{{ID: nextID, QOLen: 1 + rng.IntN(2)}}
			rt.paths[nextID] = path
			nextID++
		}
		return n
	}
	rt.root = gen(0, nil)
	return rt
}

// shuffleIDs renames request ids randomly so that ID order differs from the
// depth-first order.
func (rt *randomTree) shuffleIDs(rng *rand.Rand) {
	n := len(rt.paths)
	perm := rng.Perm(n)
	paths := map[int][]*Node{}
	for id, path := range rt.paths {
		leaf := path[len(path)-1]
		for i := range leaf.Requests {
			if leaf.Requests[i].ID == id {
				leaf.Requests[i].ID = perm[id] + n // mark as renamed
			}
		}
		paths[perm[id]] = path
	}
	for _, path := range paths {
		for i := range path[len(path)-1].Requests {
			if r := &path[len(path)-1].Requests[i]; r.ID >= n {
				r.ID -= n
			}
		}
	}
	rt.paths = paths
}

// flatTable is each request's whole KV as one page list (valid when every
// node above the last has full pages), in ID order.
func (rt *randomTree) flatTable(pageSize int) kernels.PageTable {
	n := len(rt.paths)
	tab := kernels.PageTable{KVIndptr: []int32{0}, KVLastPageLen: make([]int32, n)}
	for id := 0; id < n; id++ {
		for _, node := range rt.paths[id] {
			tab.KVPageIndices = append(tab.KVPageIndices, node.Pages...)
			if len(node.Pages) > 0 {
				tab.KVLastPageLen[id] = node.LastPageLen
			}
		}
		tab.KVIndptr = append(tab.KVIndptr, int32(len(tab.KVPageIndices)))
	}
	return tab
}

func randomCache(rng *rand.Rand, g layout.Paged) kernels.PagedKVCache {
	c, err := kernels.NewPagedKVCache(g)
	if err != nil {
		panic(err)
	}
	for _, buf := range [][]byte{c.Data, c.K, c.V} {
		for i := 0; i < len(buf)/g.DType.Size(); i++ {
			layout.StoreF32(g.DType, buf, i, float32(2*rng.Float64()-1))
		}
	}
	return c
}

func permuteRows(t kernels.Tensor, rows []int32) kernels.Tensor {
	out := kernels.NewTensor(t.DType, t.Shape...)
	rowBytes := len(t.Data) / max(t.Shape[0], 1)
	for r, src := range rows {
		copy(out.Data[r*rowBytes:(r+1)*rowBytes], t.Data[int(src)*rowBytes:(int(src)+1)*rowBytes])
	}
	return out
}

// TestCascadeEqualsFlat is the property test of the issue: for random
// batches with random shared prefixes of 2, 3 and 4 levels, cascade
// attention (Build, then Run) equals flat batch prefill over each request's
// full page list, and equals the float64 cascade model when intermediate
// pages are partial.
func TestCascadeEqualsFlat(t *testing.T) {
	b := cpu.New(cpu.Config{Workers: 2})
	checkCascadeEqualsFlat(t, 30, b, func(p *Params) error { return Run(b, p) })
}

// checkCascadeEqualsFlat runs cases random cascades per level count (2, 3,
// 4) through run and compares them with the float64 model and with flat
// batch prefill on flat.
func checkCascadeEqualsFlat(t *testing.T, cases int, flatBackend kernels.Backend, run func(p *Params) error) {
	b := flatBackend
	for levels := 2; levels <= 4; levels++ {
		reached := 0 // cases whose layout kept every one of the levels
		for i := 0; i < cases; i++ {
			rng := rand.New(rand.NewPCG(uint64(levels), uint64(i)))
			causal := rng.IntN(2) == 0
			flat := i%3 != 2
			g := layout.Paged{Layout: []layout.KVLayout{layout.NHD, layout.HND}[rng.IntN(2)], Form: []layout.TensorForm{layout.Fused, layout.Split}[rng.IntN(2)],
				DType: []layout.DType{layout.F32, layout.F16, layout.BF16}[rng.IntN(3)], PageSize: []int{1, 2, 4, 5, 16}[rng.IntN(5)],
				NumKVHeads: 1 + rng.IntN(2), HeadDim: []int{8, 16, 64}[rng.IntN(3)]}
			rt := genTree(rng, levels, g.PageSize, flat, causal)
			rt.shuffleIDs(rng)
			g.NumPages = rt.pages + 1
			cache := randomCache(rng, g)
			lay, err := Build(rt.root, g.PageSize)
			require.NoError(t, err)
			// Depths without any page are dropped (see Build).
			require.NotEmpty(t, lay.Levels)
			require.LessOrEqual(t, len(lay.Levels), levels)
			if len(lay.Levels) == levels {
				reached++
			}
			hq := g.NumKVHeads * []int{1, 2, 4}[rng.IntN(3)]
			nnz := int(lay.RequestQOIndptr[len(lay.RequestOrder)])
			qCaller := kernels.TensorFromF32(layout.F16, randFloats(rng, nnz*hq*g.HeadDim), nnz, hq, g.HeadDim)
			rows := lay.QueryRows()
			ap := kernels.AttentionParams{NumQOHeads: hq, WindowLeft: -1, LogitsSoftCap: []float64{0, 0, 20}[rng.IntN(3)]}
			var sinks []float64
			if i%2 == 1 { // attention sinks: counted once over all levels, as in one flat softmax
				ap.Sinks = kernelstest.RandomSinks(rng, hq)
				for _, s := range ap.Sinks {
					sinks = append(sinks, float64(s))
				}
			}
			p := &Params{Levels: lay.Levels, Q: permuteRows(qCaller, rows), Cache: cache, Causal: causal, AttentionParams: ap,
				O: kernels.NewTensor(layout.F32, nnz, hq, g.HeadDim), LSE: make([]float32, nnz*hq)}
			require.NoError(t, run(p))
			what := fmt.Sprintf("levels=%d case %d causal=%v flat=%v %v/%v/%v N=%d H=%d Hq=%d D=%d sinks=%v", levels, i, causal, flat, g.Layout, g.Form, g.DType, g.PageSize, g.NumKVHeads, hq, g.HeadDim, ap.Sinks)

			// The float64 model of cascade attention, on the cascade's rows.
			refCache := reference.PagedKV{Layout: g.Layout, Form: g.Form, DType: g.DType, NumPages: g.NumPages, PageSize: g.PageSize, NumKVHeads: g.NumKVHeads, HeadDim: g.HeadDim, Data: cache.Data, K: cache.K, V: cache.V}
			var refLevels []reference.CascadeLevel
			for _, lv := range lay.Levels {
				refLevels = append(refLevels, reference.CascadeLevel{QOIndptr: lv.QOIndptr, KVIndptr: lv.KVIndptr, KVPageIndices: lv.KVPageIndices, KVLastPageLen: lv.KVLastPageLen})
			}
			qRef := reference.Rows3(reference.Floats(p.Q.DType, p.Q.Data), nnz, hq, g.HeadDim)
			wo, wl := reference.Cascade(qRef, refLevels, refCache, reference.Logits{WindowLeft: -1, Causal: causal, SoftCap: ap.LogitsSoftCap, Sinks: sinks})
			requireClose(t, what+" o vs model", p.O.F32(), reference.Flat3(wo), 1e-4, 1e-4, hq, g.HeadDim)
			requireClose(t, what+" lse vs model", p.LSE, reference.Flat2(wl), 1e-4, 1e-4, hq, 1)
			if !flat {
				continue
			}
			// Flat batch prefill over each request's whole page list, in ID order.
			table := rt.flatTable(g.PageSize)
			qo := []int32{0}
			for _, n := range lay.QOLenByID {
				qo = append(qo, qo[len(qo)-1]+int32(n))
			}
			fp := &kernels.PrefillParams{Q: qCaller, QOIndptr: qo, Cache: cache, Table: table, Causal: causal, AttentionParams: ap,
				O: kernels.NewTensor(layout.F32, nnz, hq, g.HeadDim), LSE: make([]float32, nnz*hq)}
			require.NoError(t, b.BatchPrefill(fp))
			requireClose(t, what+" o vs flat", p.O.F32(), f64s(permuteRows(fp.O, rows).F32()), 1e-4, 1e-4, hq, g.HeadDim)
			flatLSE := make([]float64, len(fp.LSE))
			for r, src := range rows {
				for h := 0; h < hq; h++ {
					flatLSE[r*hq+h] = float64(fp.LSE[int(src)*hq+h])
				}
			}
			requireClose(t, what+" lse vs flat", p.LSE, flatLSE, 1e-4, 1e-4, hq, 1)
		}
		// Build drops depths without pages: make sure the level count
		// under test was really run, not only shallower cascades.
		require.Positive(t, reached, "no case of %d levels kept all %d levels", levels, levels)
	}
}

func randFloats(rng *rand.Rand, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(2*rng.Float64() - 1)
	}
	return out
}

// TestDecodeLevels checks the two-level decode form: FlashInfer's docstring
// arrays, and that running it equals plain batch decode.
func TestDecodeLevels(t *testing.T) {
	t.Run("docstring", func(t *testing.T) {
		arange := func(lo, hi int32) []int32 {
			var out []int32
			for i := lo; i < hi; i++ {
				out = append(out, i)
			}
			return out
		}
		unique := kernels.PageTable{KVIndptr: []int32{0, 17, 29, 44, 48, 66, 100, 128}, KVPageIndices: arange(512, 640), KVLastPageLen: []int32{1, 7, 14, 4, 3, 1, 16}}
		levels, err := DecodeLevels(arange(0, 512), 16, unique)
		require.NoError(t, err)
		require.Equal(t, []Level{
			{QOIndptr: []int32{0, 7}, KVIndptr: []int32{0, 512}, KVPageIndices: arange(0, 512), KVLastPageLen: []int32{16}},
			{QOIndptr: arange(0, 8), KVIndptr: unique.KVIndptr, KVPageIndices: unique.KVPageIndices, KVLastPageLen: unique.KVLastPageLen},
		}, levels)
	})
	t.Run("equals batch decode", func(t *testing.T) {
		b := cpu.New(cpu.Config{})
		for i := 0; i < 10; i++ {
			rng := rand.New(rand.NewPCG(77, uint64(i)))
			g := layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F16, PageSize: 1 + rng.IntN(8), NumKVHeads: 2, HeadDim: 32}
			shared := rng.IntN(4)
			B := 1 + rng.IntN(5)
			g.NumPages = shared + 4*B
			cache := randomCache(rng, g)
			var sharedPages []int32
			for p := 0; p < shared; p++ {
				sharedPages = append(sharedPages, int32(p))
			}
			unique := kernels.PageTable{KVIndptr: []int32{0}}
			flatTab := kernels.PageTable{KVIndptr: []int32{0}}
			next := int32(shared)
			for r := 0; r < B; r++ {
				np := rng.IntN(4)
				last := int32(0)
				if np > 0 {
					last = int32(1 + rng.IntN(g.PageSize))
				}
				flatTab.KVPageIndices = append(flatTab.KVPageIndices, sharedPages...)
				for p := 0; p < np; p++ {
					unique.KVPageIndices = append(unique.KVPageIndices, next)
					flatTab.KVPageIndices = append(flatTab.KVPageIndices, next)
					next++
				}
				unique.KVIndptr = append(unique.KVIndptr, int32(len(unique.KVPageIndices)))
				unique.KVLastPageLen = append(unique.KVLastPageLen, last)
				flatTab.KVIndptr = append(flatTab.KVIndptr, int32(len(flatTab.KVPageIndices)))
				switch {
				case np > 0:
					flatTab.KVLastPageLen = append(flatTab.KVLastPageLen, last)
				case shared > 0:
					flatTab.KVLastPageLen = append(flatTab.KVLastPageLen, int32(g.PageSize))
				default:
					flatTab.KVLastPageLen = append(flatTab.KVLastPageLen, 0)
				}
			}
			sharedLast := int32(0)
			if shared > 0 {
				sharedLast = int32(g.PageSize)
			}
			levels, err := DecodeLevels(sharedPages, sharedLast, unique)
			require.NoError(t, err)
			hq := 4
			q := kernels.TensorFromF32(layout.BF16, randFloats(rng, B*hq*g.HeadDim), B, hq, g.HeadDim)
			ap := kernels.AttentionParams{NumQOHeads: hq, WindowLeft: -1}
			p := &Params{Levels: levels, Q: q, Cache: cache, AttentionParams: ap, O: kernels.NewTensor(layout.F32, B, hq, g.HeadDim)}
			require.NoError(t, Run(b, p))
			d := &kernels.DecodeParams{Q: q, Cache: cache, Table: flatTab, AttentionParams: ap, O: kernels.NewTensor(layout.F32, B, hq, g.HeadDim)}
			require.NoError(t, b.BatchDecode(d))
			requireClose(t, fmt.Sprintf("case %d", i), p.O.F32(), f64s(d.O.F32()), 1e-5, 1e-5, hq, g.HeadDim)
		}
	})
	t.Run("errors", func(t *testing.T) {
		_, err := DecodeLevels([]int32{1}, 0, kernels.PageTable{KVIndptr: []int32{0}})
		require.ErrorIs(t, err, ErrInvalidLevels)
		_, err = DecodeLevels(nil, 0, kernels.PageTable{})
		require.ErrorIs(t, err, ErrInvalidLevels)
	})
}

// TestRunValidates: a bad level fails before anything is written.
func TestRunValidates(t *testing.T) {
	lay, err := Build(flashInferFigure(true), 4)
	require.NoError(t, err)
	g := layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F16, NumPages: 16, PageSize: 4, NumKVHeads: 2, HeadDim: 8}
	cache, err := kernels.NewPagedKVCache(g)
	require.NoError(t, err)
	valid := func() *Params {
		o := kernels.NewTensor(layout.F16, 9, 4, 8)
		for i := range o.Data {
			o.Data[i] = 0x11
		}
		levels := append([]Level(nil), lay.Levels...)
		return &Params{Levels: levels, Q: kernels.NewTensor(layout.F16, 9, 4, 8), Cache: cache,
			AttentionParams: kernels.AttentionParams{NumQOHeads: 4, WindowLeft: -1}, O: o}
	}
	tests := map[string]struct {
		mutate func(p *Params)
		want   error
	}{
		"no levels":                {func(p *Params) { p.Levels = nil }, ErrInvalidLevels},
		"window":                   {func(p *Params) { p.WindowLeft = 3 }, ErrInvalidLevels},
		"window and level windows": {func(p *Params) { p.WindowLeft, p.LevelWindowLeft = 3, []int{-1, -1, 3} }, ErrInvalidLevels},
		"level windows short":      {func(p *Params) { p.LevelWindowLeft = []int{-1, 3} }, ErrInvalidLevels},
		"level window below -1":    {func(p *Params) { p.LevelWindowLeft = []int{-1, -2, 3} }, ErrInvalidLevels},
		"qo_indptr short of q":     {func(p *Params) { p.Levels[1].QOIndptr = []int32{0, 4, 6, 8} }, kernels.ErrInvalidAttention},
		"page id beyond the cache": {func(p *Params) { p.Levels[2].KVPageIndices = []int32{10, 11, 12, 13, 14, 16} }, kernels.ErrIndexOutOfRange},
		"level batch mismatch":     {func(p *Params) { p.Levels[1].KVIndptr = []int32{0, 2, 4} }, kernels.ErrInvalidPageTable},
		"heads":                    {func(p *Params) { p.NumQOHeads = 3 }, kernels.ErrInvalidAttention},
		// The audit's wrapping kv_indptr (MaxInt32 - (-5) is positive in
		// int32): it panicked inside the shared validation.
		"wrapping kv_indptr": {func(p *Params) {
			ptr := append([]int32(nil), p.Levels[1].KVIndptr...)
			ptr[1], ptr[2] = math.MaxInt32, -5
			p.Levels[1].KVIndptr = ptr
		}, kernels.ErrInvalidPageTable},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := valid()
			tc.mutate(p)
			before := append([]byte(nil), p.O.Data...)
			err := Run(cpu.New(cpu.Config{}), p)
			require.ErrorIs(t, err, tc.want)
			require.Equal(t, before, p.O.Data, "output written by a failed Run")
			t.Log(err)
		})
	}
}

// TestGoldenCascade runs the cascade_attention reference cases, including
// seed_flashinfer_cascade_figure, through Run on the CPU backend.
func TestGoldenCascade(t *testing.T) {
	files, err := filepath.Glob("../testdata/golden/cascade_attention_*.safetensors")
	require.NoError(t, err)
	files = append(files, "../testdata/golden/seed_flashinfer_cascade_figure.safetensors")
	b := cpu.New(cpu.Config{})
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			f, err := safetensors.ReadFile(path)
			require.NoError(t, err)
			meta := f.Metadata
			require.Equal(t, "cascade_attention", meta["op"])
			atoi := func(k string) int {
				v, err := strconv.Atoi(meta[k])
				require.NoError(t, err, k)
				return v
			}
			atof := func(k string) float64 {
				v, err := strconv.ParseFloat(meta[k], 64)
				require.NoError(t, err, k)
				return v
			}
			tensor := func(name string) kernels.Tensor {
				st, ok := f.Tensor(name)
				require.True(t, ok, name)
				dt, err := layout.ParseDType(st.DType.String())
				require.NoError(t, err)
				return kernels.Tensor{DType: dt, Shape: st.Shape, Data: st.Data}
			}
			ints := func(name string) []int32 {
				st, ok := f.Tensor(name)
				require.True(t, ok, name)
				v, err := st.Int32s()
				require.NoError(t, err)
				return v
			}
			lay, err := layout.ParseKVLayout(meta["kv_layout"])
			require.NoError(t, err)
			kv := tensor("in.paged_kv_cache")
			g := layout.Paged{Layout: lay, Form: layout.Fused, DType: kv.DType, NumPages: kv.Shape[0], PageSize: atoi("page_size"),
				NumKVHeads: atoi("num_kv_heads"), HeadDim: atoi("head_dim")}
			q := tensor("in.q")
			p := &Params{Q: q, Cache: kernels.PagedKVCache{Geometry: g, Data: kv.Data}, Causal: atoi("causal") == 1,
				AttentionParams: kernels.AttentionParams{NumQOHeads: atoi("num_qo_heads"), SMScale: atof("sm_scale"), WindowLeft: -1},
				O:               kernels.NewTensor(layout.F32, q.Shape...)}
			for l := 0; l < atoi("num_levels"); l++ {
				p.Levels = append(p.Levels, Level{QOIndptr: ints(fmt.Sprintf("in.qo_indptr.%d", l)), KVIndptr: ints(fmt.Sprintf("in.kv_indptr.%d", l)),
					KVPageIndices: ints(fmt.Sprintf("in.kv_indices.%d", l)), KVLastPageLen: ints(fmt.Sprintf("in.kv_last_page_len.%d", l))})
			}
			require.NoError(t, Run(b, p))
			want, ok := f.Tensor("out.o")
			require.True(t, ok)
			wantF, err := want.Float32s()
			require.NoError(t, err)
			requireClose(t, "o", p.O.F32(), f64s(wantF), atof("atol"), atof("rtol"), q.Shape[1], q.Shape[2])
		})
	}
}
