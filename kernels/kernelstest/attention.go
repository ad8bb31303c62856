package kernelstest

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/reference"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// The attention suites: batch decode, batch prefill, MLA decode, merge_state
// and merge_states. Each one runs FlashInfer's worked examples
// (flashinfer-semantics.md §3.6, §4.1, §5, §7) as hand-written tables, then
// random configurations (kv layouts, tensor forms, cache dtypes f32, f16,
// bf16, e4m3 and e5m2 with scales, GQA groups, page sizes including 1, empty
// requests, windows, soft caps, head dims from 1 to 256) compared with the
// float64 model in internal/reference, and finally checks that invalid
// parameters fail with the right sentinel and leave the outputs untouched.
//
// Every cache slot that holds no token of the batch (spare pages, the tail
// of each last page) is filled with NaN, so a kernel that reads past a
// request's length, or lets a masked value leak through a zero weight,
// fails loudly.
//
// A backend may return an error wrapping kernels.ErrUnsupported for a
// configuration it does not implement; that case is logged and skipped.

// Tolerances: |got - want| <= atol + rtol*|want|, by output dtype. The f16
// and bf16 ones are FlashInfer's test tolerances; the expected values are
// float64 over the exact stored inputs, so the error is the backend's
// float32 arithmetic plus one rounding of the output.
type tolerance struct{ atol, rtol float64 }

func outTol(dt layout.DType) tolerance {
	switch dt {
	case layout.F16:
		return tolerance{2e-3, 2e-3}
	case layout.BF16:
		return tolerance{1.6e-2, 1.6e-2}
	}
	return tolerance{1e-4, 1e-4}
}

// lseTol is for LSE outputs, which are float32 whatever the output dtype.
var lseTol = tolerance{1e-3, 1e-4}

// skipUnsupported logs and reports true when err wraps kernels.ErrUnsupported;
// any other error fails the test.
func skipUnsupported(t *testing.T, err error, what string) bool {
	t.Helper()
	if err == nil {
		return false
	}
	if errors.Is(err, kernels.ErrUnsupported) {
		t.Logf("%s: unsupported by backend: %v", what, err)
		return true
	}
	t.Fatalf("%s: %v", what, err)
	return true
}

// closeTo compares got with want elementwise and fails with a table of the
// first mismatches. where names element i (e.g. "row 3 head 1 feat 7").
func closeTo(t *testing.T, what string, got []float32, want []float64, tol tolerance, where func(i int) string) {
	t.Helper()
	require.Equal(t, len(want), len(got), "%s: length", what)
	var b strings.Builder
	bad := 0
	for i := range want {
		g, w := float64(got[i]), want[i]
		ok := false
		switch {
		case math.IsInf(w, 0) || math.IsInf(g, 0):
			ok = g == w
		case math.IsNaN(w):
			ok = math.IsNaN(g)
		default:
			ok = math.Abs(g-w) <= tol.atol+tol.rtol*math.Abs(w)
		}
		if !ok {
			if bad < 10 {
				fmt.Fprintf(&b, "\n  %-28s got %-14.7g want %-14.7g diff %.3g", where(i), g, w, g-w)
			}
			bad++
		}
	}
	if bad > 0 {
		t.Fatalf("%s: %d of %d values outside atol %g + rtol %g:%s", what, bad, len(want), tol.atol, tol.rtol, b.String())
	}
}

func rowHeadFeat(heads, dim int) func(int) string {
	return func(i int) string {
		return fmt.Sprintf("row %d head %d feat %d", i/(heads*dim), i/dim%heads, i%dim)
	}
}

func rowHead(heads int) func(int) string {
	return func(i int) string { return fmt.Sprintf("row %d head %d", i/heads, i%heads) }
}

func f32s(xs []float64) []float32 {
	out := make([]float32, len(xs))
	for i, x := range xs {
		out[i] = float32(x)
	}
	return out
}

func tensorOf(dt layout.DType, vals []float64, shape ...int) kernels.Tensor {
	return kernels.TensorFromF32(dt, f32s(vals), shape...)
}

func (c *cacheCase) String() string {
	g := c.cache.Geometry
	return fmt.Sprintf("%v/%v/%v N=%d H=%d D=%d lens=%v", g.Layout, g.Form, g.DType, g.PageSize, g.NumKVHeads, g.HeadDim, c.lens)
}

// cacheCase is a paged cache holding a batch of requests, with the same
// storage described for the reference model.
type cacheCase struct {
	cache kernels.PagedKVCache
	table kernels.PageTable
	lens  []int
	ref   reference.PagedKV
}

// pagedFromTokens builds a cache of geometry g (NumPages is set here) where
// request b has lens[b] tokens on randomly chosen pages. value(b, t, kv,
// head, feat) gives each stored value (before encoding into g.DType); every
// other slot holds NaN. spare extra pages are added.
func pagedFromTokens(rng *rand.Rand, g layout.Paged, lens []int, spare int, value func(b, t, kv, h, d int) float64) *cacheCase {
	cache, indptr, indices, last := scatteredCache(rng, g, lens, spare)
	g = cache.Geometry
	fillNaN(g.DType, cache.Data, cache.K, cache.V)
	for b, n := range lens {
		for t := 0; t < n; t++ {
			page, entry := int(indices[int(indptr[b])+t/g.PageSize]), t%g.PageSize
			for h := 0; h < g.NumKVHeads; h++ {
				for d := 0; d < g.HeadDim; d++ {
					layout.StoreF32(g.DType, cache.KBuf(), int(g.KOffset(page, entry, h, d)), float32(value(b, t, 0, h, d)))
					layout.StoreF32(g.DType, cache.VBuf(), int(g.VOffset(page, entry, h, d)), float32(value(b, t, 1, h, d)))
				}
			}
		}
	}
	return &cacheCase{
		cache: cache,
		table: kernels.PageTable{KVIndptr: indptr, KVPageIndices: indices, KVLastPageLen: last},
		lens:  lens,
		ref: reference.PagedKV{Layout: g.Layout, Form: g.Form, DType: g.DType, NumPages: g.NumPages, PageSize: g.PageSize,
			NumKVHeads: g.NumKVHeads, HeadDim: g.HeadDim, Data: cache.Data, K: cache.K, V: cache.V},
	}
}

// scatteredCache allocates a zero cache of geometry g (NumPages set to the
// pages lens needs plus spare) and a CSR table that gives request b
// lens[b] tokens on random pages (scatterPages).
func scatteredCache(rng *rand.Rand, g layout.Paged, lens []int, spare int) (cache kernels.PagedKVCache, indptr, indices, last []int32) {
	indptr, indices, numPages := scatterPages(rng, lens, g.PageSize, spare)
	last = make([]int32, len(lens))
	for b, n := range lens {
		if n > 0 {
			last[b] = int32((n-1)%g.PageSize + 1)
		}
	}
	g.NumPages = numPages
	cache, err := kernels.NewPagedKVCache(g)
	if err != nil {
		panic(err)
	}
	return cache, indptr, indices, last
}

// scatterPages gives request b ceil(lens[b]/pageSize) pages, drawn without
// repeats from a random permutation of numPages = (pages needed) + spare
// page ids, and returns the CSR table of them.
func scatterPages(rng *rand.Rand, lens []int, pageSize, spare int) (indptr, indices []int32, numPages int) {
	B := len(lens)
	indptr = make([]int32, B+1)
	for b, n := range lens {
		indptr[b+1] = indptr[b] + int32((n+pageSize-1)/pageSize)
	}
	numPages = int(indptr[B]) + spare
	perm := rng.Perm(numPages)
	indices = make([]int32, indptr[B])
	for i := range indices {
		indices[i] = int32(perm[i])
	}
	return indptr, indices, numPages
}

// fillNaN stores NaN in every element of bufs (of dtype dt), so that a
// slot no token was written to poisons any result that reads it.
func fillNaN(dt layout.DType, bufs ...[]byte) {
	nan := float32(math.NaN())
	for _, buf := range bufs {
		for i := 0; i < len(buf)/dt.Size(); i++ {
			layout.StoreF32(dt, buf, i, nan)
		}
	}
}

// attnConfig is one random decode/prefill configuration.
type attnConfig struct {
	c        *cacheCase
	hq       int
	qdt, odt layout.DType
	ap       kernels.AttentionParams
	withLSE  bool
	// vAmp, when above 1, is the largest |V| of the cache: an output is a
	// weighted mean of V, so float32's error in the weights (which grows
	// with the logits, |q·k| up to vAmp-sized keys) shows in the output
	// scaled by it, and the absolute tolerance is scaled to match. The
	// suites over values in [-1, 1] leave it 0.
	vAmp float64
}

func (a *attnConfig) String() string {
	return fmt.Sprintf("%v Hq=%d q=%v o=%v sm_scale=%g window=%d cap=%g k_scale=%g v_scale=%g sinks=%v",
		a.c, a.hq, a.qdt, a.odt, a.ap.SMScale, a.ap.WindowLeft, a.ap.LogitsSoftCap, a.ap.KScale, a.ap.VScale, a.ap.Sinks)
}

func pick[T any](rng *rand.Rand, xs ...T) T { return xs[rng.IntN(len(xs))] }

// randomAttn draws a cache geometry, head counts, dtypes and scalars.
// maxLen bounds each request's length.
func randomAttn(rng *rand.Rand, batch, maxLen int) *attnConfig {
	cacheDT := pick(rng, layout.F32, layout.F16, layout.BF16, layout.E4M3, layout.E5M2)
	g := layout.Paged{
		Layout:     pick(rng, layout.NHD, layout.HND),
		Form:       pick(rng, layout.Fused, layout.Split),
		DType:      cacheDT,
		PageSize:   pick(rng, 1, 1, 2, 3, 4, 5, 8, 16),
		NumKVHeads: pick(rng, 1, 1, 2, 3, 4),
		HeadDim:    pick(rng, 1, 3, 4, 8, 16, 32, 64, 64, 128, 256),
	}
	group := pick(rng, 1, 1, 2, 3, 4, 8)
	a := &attnConfig{
		hq:      g.NumKVHeads * group,
		qdt:     pick(rng, layout.F32, layout.F16, layout.BF16),
		odt:     pick(rng, layout.F32, layout.F16, layout.BF16),
		withLSE: rng.IntN(4) != 0,
	}
	a.ap = kernels.AttentionParams{
		NumQOHeads: a.hq,
		SMScale:    pick(rng, 0, 0, 0.05+rng.Float64()/2),
		WindowLeft: pick(rng, -1, -1, rng.IntN(maxLen+2)),
	}
	if rng.IntN(3) == 0 {
		a.ap.LogitsSoftCap = pick(rng, 0.5, 1, 5, 30)
	}
	// fp8 stores x/scale for x in [-1, 1], as FlashInfer's tests quantize
	// (k_fp8 = k/k_scale); other dtypes sometimes get scales too.
	kScale, vScale := 1.0, 1.0
	switch {
	case cacheDT == layout.E4M3 || cacheDT == layout.E5M2:
		kScale, vScale = 1.0/pick(rng, 16.0, 64, 256), 1.0/pick(rng, 8.0, 32, 200)
		a.ap.KScale, a.ap.VScale = kScale, vScale
	case rng.IntN(4) == 0:
		a.ap.KScale, a.ap.VScale = 0.5+rng.Float64(), 0.5+rng.Float64()
	}
	lens := make([]int, batch)
	for b := range lens {
		switch rng.IntN(6) {
		case 0:
			lens[b] = 0 // empty request
		case 1:
			lens[b] = 1
		default:
			lens[b] = 1 + rng.IntN(maxLen)
		}
	}
	a.c = pagedFromTokens(rng, g, lens, rng.IntN(3), func(b, t, kv, h, d int) float64 {
		x := 2*rng.Float64() - 1
		if kv == 0 {
			return x / kScale
		}
		return x / vScale
	})
	return a
}

func refLogits(ap kernels.AttentionParams, causal bool) reference.Logits {
	return reference.Logits{SMScale: ap.SMScale, KScale: ap.KScale, SoftCap: ap.LogitsSoftCap, VScale: ap.VScale, WindowLeft: ap.WindowLeft, Causal: causal,
		Sinks: sinks64(ap.Sinks)}
}

// sinks64 widens FlashInfer's float32 sinks for the reference (nil stays nil).
func sinks64(s []float32) []float64 {
	if s == nil {
		return nil
	}
	return f64s(s)
}

// RandomSinks draws one sink logit per query head the size gpt-oss learns
// relative to its logits: its weight e^sink is comparable to the softmax
// mass of tens to hundreds of keys, so a sink that is dropped, or counted
// twice, moves the output by far more than any backend's tolerance.
func RandomSinks(rng *rand.Rand, hq int) []float32 {
	s := make([]float32, hq)
	for h := range s {
		s[h] = float32(6*rng.Float64() - 1)
	}
	return s
}

// sinkCases is how many random cases the sink subtests run: each draws
// sinks, and a third are long enough (up to 300 keys in pages of 1-16)
// that a backend splits them into split-KV chunks merged afterwards.
const sinkCases = 12

// randomSinkAttn is randomAttn with sinks (and the LSE, which includes
// them) for case i.
func randomSinkAttn(rng *rand.Rand, batch int) *attnConfig {
	a := randomAttn(rng, batch, pick(rng, 8, 60, 300))
	a.ap.Sinks = RandomSinks(rng, a.hq)
	a.withLSE = true
	return a
}

func randomQ(rng *rand.Rand, dt layout.DType, shape ...int) kernels.Tensor {
	n := 1
	for _, s := range shape {
		n *= s
	}
	vals := make([]float64, n)
	for i := range vals {
		vals[i] = 2*rng.Float64() - 1
	}
	return tensorOf(dt, vals, shape...)
}

func seededRNG(t *testing.T, seed uint64) *rand.Rand {
	t.Helper()
	return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
}

// iterations scales the number of random cases: fewer under -short.
func iterations(n int) int {
	if testing.Short() {
		return max(1, n/4)
	}
	return n
}

// ---------------------------------------------------------------- decode

// TestDecode checks b.BatchDecode: the §3.6 worked example, random
// configurations against the reference, and invalid parameters.
func TestDecode(t *testing.T, b kernels.Backend) {
	t.Run("worked example §3.6", func(t *testing.T) { testDecodeWorked(t, b) })
	t.Run("random", func(t *testing.T) {
		for i := 0; i < iterations(60); i++ {
			rng := seededRNG(t, uint64(i))
			a := randomAttn(rng, 1+rng.IntN(5), pick(rng, 8, 40, 70))
			runDecodeCase(t, b, rng, a, fmt.Sprintf("case %d", i))
		}
	})
	t.Run("window equals truncation", func(t *testing.T) { testDecodeWindowTruncation(t, b) })
	// Sinks: a dropped sink, or one counted once per split-KV chunk,
	// moves o and the LSE away from the reference (docs/attention.md).
	t.Run("sinks", func(t *testing.T) {
		for i := 0; i < iterations(sinkCases); i++ {
			rng := seededRNG(t, 9000+uint64(i))
			runDecodeCase(t, b, rng, randomSinkAttn(rng, 1+rng.IntN(3)), fmt.Sprintf("sinks case %d", i))
		}
	})
	t.Run("invalid", func(t *testing.T) { testDecodeInvalid(t, b) })
}

func runDecodeCase(t *testing.T, b kernels.Backend, rng *rand.Rand, a *attnConfig, name string) {
	t.Helper()
	B, D := len(a.c.lens), a.c.cache.Geometry.HeadDim
	p := &kernels.DecodeParams{
		Q: randomQ(rng, a.qdt, B, a.hq, D), Cache: a.c.cache, Table: a.c.table, AttentionParams: a.ap,
		O: kernels.NewTensor(a.odt, B, a.hq, D),
	}
	if a.withLSE {
		p.LSE = make([]float32, B*a.hq)
	}
	if skipUnsupported(t, b.BatchDecode(p), name+" "+a.String()) {
		return
	}
	q := reference.Rows3(reference.Floats(p.Q.DType, p.Q.Data), B, a.hq, D)
	wo, wl := reference.BatchDecode(q, a.c.ref, a.c.table.KVIndptr, a.c.table.KVPageIndices, a.c.table.KVLastPageLen, refLogits(a.ap, false))
	a.closeToModel(t, name+" "+a.String(), p.O, p.LSE, wo, wl)
}

// closeToModel compares an attention's output o and, when the config asks
// for it, its lse with the reference model's wo [rows][Hq][D] and
// wl [rows][Hq].
func (a *attnConfig) closeToModel(t *testing.T, what string, o kernels.Tensor, lse []float32, wo [][][]float64, wl [][]float64) {
	t.Helper()
	D := a.c.cache.Geometry.HeadDim
	tol := outTol(a.odt)
	if a.vAmp > 1 {
		tol.atol *= a.vAmp
	}
	closeTo(t, what+" o", o.F32(), reference.Flat3(wo), tol, rowHeadFeat(a.hq, D))
	if a.withLSE {
		closeTo(t, what+" lse", lse, reference.Flat2(wl), lseTol, rowHead(a.hq))
	}
}

// workedDecodeCache is §3.6: page_size 2, 1 kv head, head_dim 4; request 0
// is pages [3, 0] (3 tokens), request 1 is page [2] (2 tokens).
func workedDecodeCache(rng *rand.Rand, lay layout.KVLayout, form layout.TensorForm, dt layout.DType) *cacheCase {
	k := [][][]float64{{{1, 0, 0, 0}, {0, 1, 0, 0}, {1, 1, 0, 0}}, {{0, 0, 1, 0}, {0, 0, 0, 2}}}
	v := [][][]float64{{{1, 2, 3, 4}, {0, 0, 1, 0}, {2, 0, 0, 2}}, {{1, 1, 1, 1}, {4, 0, 0, 0}}}
	c := pagedFromTokens(rng, layout.Paged{Layout: lay, Form: form, DType: dt, PageSize: 2, NumKVHeads: 1, HeadDim: 4}, []int{3, 2}, 1,
		func(b, t, kv, h, d int) float64 {
			if kv == 0 {
				return k[b][t][d]
			}
			return v[b][t][d]
		})
	return c
}

type workedRow struct {
	o   []float64
	lse float64
}

var workedDecodePlain = [][]workedRow{
	{{[]float64{1.150955, 0.767303, 1.383652, 2.301910}, 2.103478}, {[]float64{1.000000, 0.310725, 0.888406, 1.466087}, 2.686291}},
	{{[]float64{2.867378, 0.377541, 0.377541, 0.377541}, 2.126644}, {[]float64{1.806824, 0.731059, 0.731059, 0.731059}, 1.894636}},
}

var workedDecode = map[string]struct {
	window int
	cap    float64
	want   [][]workedRow
}{
	"plain": {-1, 0, workedDecodePlain},
	"window_left=1": {1, 0, [][]workedRow{
		{{[]float64{1.244919, 0, 0.377541, 1.244919}, 1.405296}, {[]float64{1, 0, 0.5, 1}, 2.442695}},
		workedDecodePlain[1], // L = 2 <= w+1: unchanged
	}},
	"soft cap 1.0": {-1, 1, [][]workedRow{
		{{[]float64{1.140707, 0.760471, 1.380236, 2.281413}, 2.061729}, {[]float64{1.000000, 0.378546, 0.973182, 1.567819}, 2.401460}},
		{{[]float64{2.722944, 0.425685, 0.425685, 0.425685}, 1.898835}, {[]float64{1.954901, 0.681700, 0.681700, 0.681700}, 1.651540}},
	}},
}

func testDecodeWorked(t *testing.T, b kernels.Backend) {
	rng := seededRNG(t, 36)
	q := []float64{1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 1, 1, 0, 0, 2, 0} // [2 requests][2 heads][4]
	for name, tc := range workedDecode {
		for _, lay := range []layout.KVLayout{layout.NHD, layout.HND} {
			for _, form := range []layout.TensorForm{layout.Fused, layout.Split} {
				// Every input is exact in f16 (and bf16, e4m3, e5m2).
				for _, dt := range []layout.DType{layout.F32, layout.F16, layout.E4M3} {
					c := workedDecodeCache(rng, lay, form, dt)
					what := fmt.Sprintf("%s %v", name, c)
					p := &kernels.DecodeParams{
						Q: tensorOf(layout.F16, q, 2, 2, 4), Cache: c.cache, Table: c.table,
						AttentionParams: kernels.AttentionParams{NumQOHeads: 2, SMScale: 0.5, WindowLeft: tc.window, LogitsSoftCap: tc.cap},
						O:               kernels.NewTensor(layout.F32, 2, 2, 4), LSE: make([]float32, 4),
					}
					if skipUnsupported(t, b.BatchDecode(p), what) {
						continue
					}
					var wo, wl []float64
					for _, req := range tc.want {
						for _, row := range req {
							wo, wl = append(wo, row.o...), append(wl, row.lse)
						}
					}
					closeTo(t, what+" o", p.O.F32(), wo, tolerance{5e-6, 1e-6}, rowHeadFeat(2, 4))
					closeTo(t, what+" lse", p.LSE, wl, tolerance{5e-6, 1e-6}, rowHead(2))
				}
			}
		}
	}
}

// testDecodeWindowTruncation checks that decode with window_left = W equals
// decode without a window over a cache holding only the last W+1 tokens of
// each request, and that a soft cap going to infinity equals no cap.
func testDecodeWindowTruncation(t *testing.T, b kernels.Backend) {
	for i := 0; i < iterations(12); i++ {
		rng := seededRNG(t, 1000+uint64(i))
		g := layout.Paged{Layout: pick(rng, layout.NHD, layout.HND), Form: pick(rng, layout.Fused, layout.Split),
			DType: pick(rng, layout.F32, layout.F16, layout.BF16), PageSize: pick(rng, 1, 3, 4, 16), NumKVHeads: pick(rng, 1, 2), HeadDim: pick(rng, 8, 64)}
		B := 1 + rng.IntN(4)
		lens := make([]int, B)
		for j := range lens {
			lens[j] = rng.IntN(50)
		}
		W := rng.IntN(20)
		keys := map[[5]int]float64{}
		full := pagedFromTokens(rng, g, lens, 1, func(b, t, kv, h, d int) float64 {
			x := 2*rng.Float64() - 1
			keys[[5]int{b, t, kv, h, d}] = x
			return x
		})
		short := make([]int, B)
		for j, n := range lens {
			short[j] = min(n, W+1)
		}
		cut := pagedFromTokens(rng, g, short, 0, func(b, t, kv, h, d int) float64 {
			return keys[[5]int{b, lens[b] - short[b] + t, kv, h, d}]
		})
		hq := g.NumKVHeads * pick(rng, 1, 2, 4)
		q := randomQ(rng, layout.F32, B, hq, g.HeadDim)
		run := func(c *cacheCase, window int, softCap float64) ([]float32, []float32, bool) {
			p := &kernels.DecodeParams{Q: q, Cache: c.cache, Table: c.table,
				AttentionParams: kernels.AttentionParams{NumQOHeads: hq, WindowLeft: window, LogitsSoftCap: softCap},
				O:               kernels.NewTensor(layout.F32, B, hq, g.HeadDim), LSE: make([]float32, B*hq)}
			if skipUnsupported(t, b.BatchDecode(p), fmt.Sprintf("window %d cap %g %v", window, softCap, c)) {
				return nil, nil, false
			}
			return p.O.F32(), p.LSE, true
		}
		wo, wl, ok1 := run(cut, -1, 0)
		go_, gl, ok2 := run(full, W, 0)
		if !ok1 || !ok2 {
			continue
		}
		what := fmt.Sprintf("case %d W=%d %v", i, W, full)
		closeTo(t, what+" o", go_, f64s(wo), tolerance{1e-5, 1e-5}, rowHeadFeat(hq, g.HeadDim))
		closeTo(t, what+" lse", gl, f64s(wl), tolerance{1e-5, 1e-5}, rowHead(hq))

		co, cl, ok3 := run(full, -1, 1e9)
		no, nl, ok4 := run(full, -1, 0)
		if ok3 && ok4 {
			closeTo(t, what+" cap 1e9 vs none o", co, f64s(no), tolerance{1e-5, 1e-5}, rowHeadFeat(hq, g.HeadDim))
			closeTo(t, what+" cap 1e9 vs none lse", cl, f64s(nl), tolerance{1e-5, 1e-5}, rowHead(hq))
		}
	}
}

func f64s(xs []float32) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(x)
	}
	return out
}

// invalidCase mutates valid parameters into invalid ones; want is the
// sentinel the error must wrap.
type invalidCase[P any] struct {
	name   string
	mutate func(p *P)
	want   error
}

// expectInvalid runs call and checks that it fails with want and that the
// output bytes are unchanged.
func expectInvalid(t *testing.T, name string, want error, out []byte, lse []float32, call func() error) {
	t.Helper()
	before := append([]byte(nil), out...)
	lseBefore := append([]float32(nil), lse...)
	err := call()
	require.Error(t, err, name)
	require.ErrorIs(t, err, want, name)
	require.Equal(t, before, out, "%s: output written by a failed call", name)
	for i := range lse {
		// Compare bits: the sentinel fill below is NaN-free but be exact.
		require.Equal(t, math.Float32bits(lseBefore[i]), math.Float32bits(lse[i]), "%s: lse[%d] written by a failed call", name, i)
	}
	t.Logf("%s: %v", name, err)
}

// runInvalid runs every case on fresh valid parameters: out names the
// output bytes and LSE that call, failing, must leave as they were (the
// bytes filled with a sentinel before the mutation).
func runInvalid[P any](t *testing.T, tests []invalidCase[P], valid func() *P, out func(*P) ([]byte, []float32), call func(*P) error) {
	t.Helper()
	for _, tc := range tests {
		p := valid()
		o, _ := out(p)
		fillSentinel(o)
		tc.mutate(p)
		o, lse := out(p)
		expectInvalid(t, tc.name, tc.want, o, lse, func() error { return call(p) })
	}
}

func fillSentinel(p []byte) {
	for i := range p {
		p[i] = 0x5a
	}
}

func validDecode(t *testing.T) *kernels.DecodeParams {
	rng := seededRNG(t, 7)
	c := workedDecodeCache(rng, layout.NHD, layout.Fused, layout.F16)
	p := &kernels.DecodeParams{Q: randomQ(rng, layout.F16, 2, 4, 4), Cache: c.cache, Table: c.table,
		AttentionParams: kernels.AttentionParams{NumQOHeads: 4, WindowLeft: -1},
		O:               kernels.NewTensor(layout.F32, 2, 4, 4), LSE: make([]float32, 8)}
	fillSentinel(p.O.Data)
	for i := range p.LSE {
		p.LSE[i] = 42
	}
	return p
}

var decodeInvalid = []invalidCase[kernels.DecodeParams]{
	{"heads not divisible", func(p *kernels.DecodeParams) {
		// 3 query heads over 2 kv heads.
		c := pagedFromTokens(rand.New(rand.NewPCG(1, 2)), layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F16, PageSize: 2, NumKVHeads: 2, HeadDim: 4},
			[]int{3, 2}, 0, func(b, t, kv, h, d int) float64 { return 1 })
		p.Cache, p.Table = c.cache, c.table
		p.Q, p.NumQOHeads = kernels.NewTensor(layout.F16, 2, 3, 4), 3
		p.O = kernels.NewTensor(layout.F32, 2, 3, 4)
		fillSentinel(p.O.Data)
		p.LSE = p.LSE[:6]
	}, kernels.ErrInvalidAttention},
	{"num_qo_heads disagrees with q", func(p *kernels.DecodeParams) { p.NumQOHeads = 8 }, kernels.ErrInvalidAttention},
	{"head_dim mismatch", func(p *kernels.DecodeParams) { p.Q = kernels.NewTensor(layout.F16, 2, 4, 8) }, kernels.ErrInvalidTensor},
	{"sm_scale NaN", func(p *kernels.DecodeParams) { p.SMScale = math.NaN() }, kernels.ErrInvalidScale},
	{"sm_scale +Inf", func(p *kernels.DecodeParams) { p.SMScale = math.Inf(1) }, kernels.ErrInvalidScale},
	{"k_scale negative", func(p *kernels.DecodeParams) { p.KScale = -1 }, kernels.ErrInvalidScale},
	{"window < -1", func(p *kernels.DecodeParams) { p.WindowLeft = -2 }, kernels.ErrInvalidAttention},
	{"soft cap NaN", func(p *kernels.DecodeParams) { p.LogitsSoftCap = math.NaN() }, kernels.ErrInvalidAttention},
	{"sinks shorter than num_qo_heads", func(p *kernels.DecodeParams) { p.Sinks = []float32{0, 0, 0} }, kernels.ErrInvalidAttention},
	{"sinks empty, not nil", func(p *kernels.DecodeParams) { p.Sinks = []float32{} }, kernels.ErrInvalidAttention},
	{"sinks NaN", func(p *kernels.DecodeParams) { p.Sinks = []float32{0, 1, float32(math.NaN()), 2} }, kernels.ErrInvalidAttention},
	{"sinks -Inf", func(p *kernels.DecodeParams) { p.Sinks = []float32{0, 1, 2, float32(math.Inf(-1))} }, kernels.ErrInvalidAttention},
	{"sinks*log2(e) overflows float32", func(p *kernels.DecodeParams) { p.Sinks = []float32{math.MaxFloat32, 0, 0, 0} }, kernels.ErrInvalidAttention},
	{"kv_indptr shorter than batch+1", func(p *kernels.DecodeParams) {
		p.Table.KVIndptr, p.Table.KVLastPageLen = p.Table.KVIndptr[:2], p.Table.KVLastPageLen[:1]
	}, kernels.ErrInvalidPageTable},
	{"last_page_len > page_size", func(p *kernels.DecodeParams) { p.Table.KVLastPageLen = []int32{3, 2} }, kernels.ErrInvalidPageTable},
	{"page id out of range", func(p *kernels.DecodeParams) { p.Table.KVPageIndices = []int32{0, 1, 99} }, kernels.ErrIndexOutOfRange},
	{"o shape", func(p *kernels.DecodeParams) { p.O.Shape = []int{2, 4, 2, 2} }, kernels.ErrInvalidTensor},
	{"lse length", func(p *kernels.DecodeParams) { p.LSE = p.LSE[:7] }, kernels.ErrInvalidTensor},
	{"q dtype e4m3", func(p *kernels.DecodeParams) { p.Q = kernels.NewTensor(layout.E4M3, 2, 4, 4) }, kernels.ErrInvalidTensor},
}

func testDecodeInvalid(t *testing.T, b kernels.Backend) {
	for _, tc := range decodeInvalid {
		p := validDecode(t)
		tc.mutate(p)
		expectInvalid(t, tc.name, tc.want, p.O.Data, p.LSE, func() error { return b.BatchDecode(p) })
	}
}

// ---------------------------------------------------------------- prefill

// TestPrefill checks b.BatchPrefill: the §7 worked example, random
// configurations (ragged queries, causal or not, windows, requests with more
// queries than keys) against the reference, and invalid parameters.
func TestPrefill(t *testing.T, b kernels.Backend) {
	t.Run("worked example §7", func(t *testing.T) { testPrefillWorked(t, b) })
	t.Run("random", func(t *testing.T) {
		for i := 0; i < iterations(60); i++ {
			rng := seededRNG(t, 5000+uint64(i))
			a := randomAttn(rng, 1+rng.IntN(4), pick(rng, 6, 30, 60))
			runPrefillCase(t, b, rng, a, rng.IntN(2) == 0, fmt.Sprintf("case %d", i))
		}
	})
	t.Run("sinks", func(t *testing.T) {
		for i := 0; i < iterations(sinkCases); i++ {
			rng := seededRNG(t, 9500+uint64(i))
			runPrefillCase(t, b, rng, randomSinkAttn(rng, 1+rng.IntN(3)), rng.IntN(2) == 0, fmt.Sprintf("sinks case %d", i))
		}
	})
	t.Run("invalid", func(t *testing.T) { testPrefillInvalid(t, b) })
}

func runPrefillCase(t *testing.T, b kernels.Backend, rng *rand.Rand, a *attnConfig, causal bool, name string) {
	t.Helper()
	B, D := len(a.c.lens), a.c.cache.Geometry.HeadDim
	qo := make([]int32, B+1)
	for i, n := range a.c.lens {
		qoLen := min(n, 1+rng.IntN(8))
		switch rng.IntN(8) {
		case 0:
			qoLen = 0 // a request with keys but no queries
		case 1:
			qoLen = n + 1 + rng.IntN(3) // more queries than keys
		}
		qo[i+1] = qo[i] + int32(qoLen)
	}
	nnz := int(qo[B])
	p := &kernels.PrefillParams{
		Q: randomQ(rng, a.qdt, nnz, a.hq, D), QOIndptr: qo, Cache: a.c.cache, Table: a.c.table, Causal: causal,
		AttentionParams: a.ap, O: kernels.NewTensor(a.odt, nnz, a.hq, D),
	}
	if a.withLSE {
		p.LSE = make([]float32, nnz*a.hq)
	}
	what := fmt.Sprintf("%s causal=%v qo_indptr=%v %v", name, causal, qo, a)
	if skipUnsupported(t, b.BatchPrefill(p), what) {
		return
	}
	q := reference.Rows3(reference.Floats(p.Q.DType, p.Q.Data), nnz, a.hq, D)
	wo, wl := reference.BatchPrefill(q, qo, a.c.ref, a.c.table.KVIndptr, a.c.table.KVPageIndices, a.c.table.KVLastPageLen, refLogits(a.ap, causal))
	a.closeToModel(t, what, p.O, p.LSE, wo, wl)
}

func testPrefillWorked(t *testing.T, b kernels.Backend) {
	k := [][]float64{{1, 0}, {0, 1}, {1, 1}, {0, 0}}
	v := [][]float64{{1, 0}, {0, 1}, {1, 1}, {2, 2}}
	tests := map[string]struct {
		causal bool
		window int
		want   [2]workedRow
	}{
		"non-causal":      {false, -1, [2]workedRow{{[]float64{1, 0.768941}, 2.894636}, {[]float64{0.768941, 1}, 2.894636}}},
		"causal":          {true, -1, [2]workedRow{{[]float64{0.844638, 0.577681}, 2.686291}, {[]float64{0.768941, 1}, 2.894636}}},
		"causal, w=1":     {true, 1, [2]workedRow{{[]float64{0.731059, 1}, 1.894636}, {[]float64{1.268941, 1.268941}, 1.894636}}},
		"non-causal, w=1": {false, 1, [2]workedRow{{[]float64{1, 1.211942}, 2.238262}, {[]float64{1.268941, 1.268941}, 1.894636}}},
	}
	rng := seededRNG(t, 7)
	for name, tc := range tests {
		for _, pageSize := range []int{1, 3, 4} {
			c := pagedFromTokens(rng, layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F32, PageSize: pageSize, NumKVHeads: 1, HeadDim: 2},
				[]int{4}, 1, func(b, t, kv, h, d int) float64 {
					if kv == 0 {
						return k[t][d]
					}
					return v[t][d]
				})
			p := &kernels.PrefillParams{Q: tensorOf(layout.F32, []float64{1, 0, 0, 1}, 2, 1, 2), QOIndptr: []int32{0, 2},
				Cache: c.cache, Table: c.table, Causal: tc.causal,
				AttentionParams: kernels.AttentionParams{NumQOHeads: 1, SMScale: 1, WindowLeft: tc.window},
				O:               kernels.NewTensor(layout.F32, 2, 1, 2), LSE: make([]float32, 2)}
			what := fmt.Sprintf("%s page_size %d", name, pageSize)
			if skipUnsupported(t, b.BatchPrefill(p), what) {
				continue
			}
			closeTo(t, what+" o", p.O.F32(), append(append([]float64(nil), tc.want[0].o...), tc.want[1].o...), tolerance{5e-6, 1e-6}, rowHeadFeat(1, 2))
			closeTo(t, what+" lse", p.LSE, []float64{tc.want[0].lse, tc.want[1].lse}, tolerance{5e-6, 1e-6}, rowHead(1))
		}
	}
	// A fully masked row: 3 causal queries over 1 key; rows 0 and 1 see
	// nothing and must give exactly o = 0, lse = -inf.
	c := pagedFromTokens(rng, layout.Paged{Layout: layout.HND, Form: layout.Split, DType: layout.F16, PageSize: 2, NumKVHeads: 1, HeadDim: 2},
		[]int{1}, 0, func(b, t, kv, h, d int) float64 { return float64(1 + d) })
	p := &kernels.PrefillParams{Q: tensorOf(layout.F16, []float64{1, 1, 1, 1, 1, 1}, 3, 1, 2), QOIndptr: []int32{0, 3},
		Cache: c.cache, Table: c.table, Causal: true,
		AttentionParams: kernels.AttentionParams{NumQOHeads: 1, SMScale: 1, WindowLeft: -1},
		O:               kernels.NewTensor(layout.F32, 3, 1, 2), LSE: make([]float32, 3)}
	if !skipUnsupported(t, b.BatchPrefill(p), "fully masked rows") {
		inf := math.Inf(-1)
		closeTo(t, "fully masked rows o", p.O.F32(), []float64{0, 0, 0, 0, 1, 2}, tolerance{0, 0}, rowHeadFeat(1, 2))
		closeTo(t, "fully masked rows lse", p.LSE, []float64{inf, inf, 3 / math.Ln2}, tolerance{1e-6, 1e-6}, rowHead(1))
	}
}

func testPrefillInvalid(t *testing.T, b kernels.Backend) {
	valid := func() *kernels.PrefillParams {
		d := validDecode(t)
		return &kernels.PrefillParams{Q: kernels.NewTensor(layout.F16, 5, 4, 4), QOIndptr: []int32{0, 3, 5}, Cache: d.Cache, Table: d.Table,
			AttentionParams: d.AttentionParams, O: kernels.NewTensor(layout.BF16, 5, 4, 4), LSE: make([]float32, 20)}
	}
	tests := []invalidCase[kernels.PrefillParams]{
		{"qo_indptr last != rows of q", func(p *kernels.PrefillParams) { p.QOIndptr = []int32{0, 3, 4} }, kernels.ErrInvalidAttention},
		{"qo_indptr batch != kv_indptr batch", func(p *kernels.PrefillParams) { p.QOIndptr = []int32{0, 1, 3, 5} }, kernels.ErrInvalidAttention},
		{"qo_indptr decreasing", func(p *kernels.PrefillParams) { p.QOIndptr = []int32{0, 6, 5} }, kernels.ErrInvalidAttention},
		{"qo_indptr[0] != 0", func(p *kernels.PrefillParams) { p.QOIndptr = []int32{1, 3, 5} }, kernels.ErrInvalidAttention},
		{"window < -1", func(p *kernels.PrefillParams) { p.WindowLeft = -5 }, kernels.ErrInvalidAttention},
		{"sinks longer than num_qo_heads", func(p *kernels.PrefillParams) { p.Sinks = make([]float32, 5) }, kernels.ErrInvalidAttention},
		{"sinks +Inf", func(p *kernels.PrefillParams) { p.Sinks = []float32{float32(math.Inf(1)), 0, 0, 0} }, kernels.ErrInvalidAttention},
		{"sm_scale -Inf", func(p *kernels.PrefillParams) { p.SMScale = math.Inf(-1) }, kernels.ErrInvalidScale},
		{"head_dim mismatch", func(p *kernels.PrefillParams) {
			p.Q = kernels.NewTensor(layout.F16, 5, 4, 3)
			p.O = kernels.NewTensor(layout.F16, 5, 4, 3)
		}, kernels.ErrInvalidTensor},
		{"kv_indptr decreasing", func(p *kernels.PrefillParams) { p.Table.KVIndptr = []int32{0, 2, 1} }, kernels.ErrInvalidPageTable},
		{"o rows", func(p *kernels.PrefillParams) { p.O = kernels.NewTensor(layout.F32, 4, 4, 4) }, kernels.ErrInvalidTensor},
	}
	runInvalid(t, tests, valid, func(p *kernels.PrefillParams) ([]byte, []float32) { return p.O.Data, p.LSE }, b.BatchPrefill)
}

// ---------------------------------------------------------------- MLA decode

// TestMLADecode checks b.MLADecode: the §5 worked example (head dims 4+2),
// random configurations against the reference, and invalid parameters.
func TestMLADecode(t *testing.T, b kernels.Backend) {
	t.Run("worked example §5", func(t *testing.T) { testMLAWorked(t, b) })
	t.Run("random", func(t *testing.T) {
		for i := 0; i < iterations(24); i++ {
			rng := seededRNG(t, 9000+uint64(i))
			runMLACase(t, b, rng, fmt.Sprintf("case %d", i))
		}
	})
	t.Run("invalid", func(t *testing.T) { testMLAInvalid(t, b) })
}

type mlaCase struct {
	cache         kernels.MLACache
	ref           reference.MLACache
	kvIndptr      []int32
	kvPageIndices []int32
	kvLen         []int32
}

// mlaFromTokens builds an MLA cache where request b has lens[b] tokens;
// value(b, t, part, d) gives ckv (part 0) and kpe (part 1) values. Unused
// slots hold NaN.
func mlaFromTokens(rng *rand.Rand, g layout.MLA, lens []int, spare int, value func(b, t, part, d int) float64) *mlaCase {
	indptr, indices, numPages := scatterPages(rng, lens, g.PageSize, spare)
	kvLen := make([]int32, len(lens))
	for b, n := range lens {
		kvLen[b] = int32(n)
	}
	g.NumPages = numPages
	cache, err := kernels.NewMLACache(g)
	if err != nil {
		panic(err)
	}
	fillNaN(g.DType, cache.Data, cache.CKV, cache.KPE)
	for b, n := range lens {
		for t := 0; t < n; t++ {
			page, entry := int(indices[int(indptr[b])+t/g.PageSize]), t%g.PageSize
			for d := 0; d < g.HeadDimCKV; d++ {
				layout.StoreF32(g.DType, cache.CKVBuf(), int(g.CKVOffset(page, entry, d)), float32(value(b, t, 0, d)))
			}
			for d := 0; d < g.HeadDimKPE; d++ {
				layout.StoreF32(g.DType, cache.KPEBuf(), int(g.KPEOffset(page, entry, d)), float32(value(b, t, 1, d)))
			}
		}
	}
	return &mlaCase{
		cache: cache, kvIndptr: indptr, kvPageIndices: indices, kvLen: kvLen,
		ref: reference.MLACache{Form: g.Form, DType: g.DType, PageSize: g.PageSize, DCKV: g.HeadDimCKV, DKPE: g.HeadDimKPE,
			Data: cache.Data, CKV: cache.CKV, KPE: cache.KPE},
	}
}

func runMLACase(t *testing.T, b kernels.Backend, rng *rand.Rand, name string) {
	t.Helper()
	g := layout.MLA{Form: pick(rng, layout.Fused, layout.Split), DType: pick(rng, layout.F32, layout.F16, layout.BF16, layout.E4M3, layout.E5M2),
		PageSize: pick(rng, 1, 2, 16, 64), HeadDimCKV: pick(rng, 512, 512, 16, 8), HeadDimKPE: pick(rng, 64, 64, 4, 1)}
	B := 1 + rng.IntN(4)
	lens := make([]int, B)
	for i := range lens {
		lens[i] = pick(rng, 0, 1, rng.IntN(80))
	}
	c := mlaFromTokens(rng, g, lens, rng.IntN(2), func(b, t, part, d int) float64 { return 2*rng.Float64() - 1 })
	H := pick(rng, 1, 2, 16, 20, 32)
	qdt, odt := pick(rng, layout.F32, layout.F16, layout.BF16), pick(rng, layout.F32, layout.F16, layout.BF16)
	p := &kernels.MLADecodeParams{
		QNope: randomQ(rng, qdt, B, H, g.HeadDimCKV), QPE: randomQ(rng, qdt, B, H, g.HeadDimKPE), Cache: c.cache,
		KVIndptr: c.kvIndptr, KVPageIndices: c.kvPageIndices, KVLen: c.kvLen, NumHeads: H,
		SMScale: pick(rng, 1/math.Sqrt(192), 0.3),
		O:       kernels.NewTensor(odt, B, H, g.HeadDimCKV), LSE: make([]float32, B*H),
	}
	what := fmt.Sprintf("%s %v/%v N=%d ckv=%d kpe=%d lens=%v H=%d q=%v o=%v", name, g.Form, g.DType, g.PageSize, g.HeadDimCKV, g.HeadDimKPE, lens, H, qdt, odt)
	if skipUnsupported(t, b.MLADecode(p), what) {
		return
	}
	qn := reference.Rows3(reference.Floats(qdt, p.QNope.Data), B, H, g.HeadDimCKV)
	qp := reference.Rows3(reference.Floats(qdt, p.QPE.Data), B, H, g.HeadDimKPE)
	wo, wl := reference.MLADecode(qn, qp, c.ref, c.kvIndptr, c.kvPageIndices, c.kvLen, p.SMScale)
	closeTo(t, what+" o", p.O.F32(), reference.Flat3(wo), outTol(odt), rowHeadFeat(H, g.HeadDimCKV))
	closeTo(t, what+" lse", p.LSE, reference.Flat2(wl), lseTol, rowHead(H))
}

func testMLAWorked(t *testing.T, b kernels.Backend) {
	ckv := [][]float64{{1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}}
	kpe := [][]float64{{1, 0}, {0, 1}, {1, 1}}
	rng := seededRNG(t, 5)
	for _, form := range []layout.TensorForm{layout.Fused, layout.Split} {
		c := mlaFromTokens(rng, layout.MLA{Form: form, DType: layout.BF16, PageSize: 2, HeadDimCKV: 4, HeadDimKPE: 2}, []int{3}, 1,
			func(b, t, part, d int) float64 {
				if part == 0 {
					return ckv[t][d]
				}
				return kpe[t][d]
			})
		p := &kernels.MLADecodeParams{
			QNope: tensorOf(layout.F32, []float64{1, 0, 0, 0, 0, 0, 2, 0}, 1, 2, 4), QPE: tensorOf(layout.F32, []float64{0, 1, 1, 0}, 1, 2, 2),
			Cache: c.cache, KVIndptr: c.kvIndptr, KVPageIndices: c.kvPageIndices, KVLen: c.kvLen, NumHeads: 2, SMScale: 0.5,
			O: kernels.NewTensor(layout.F32, 1, 2, 4), LSE: make([]float32, 2),
		}
		what := fmt.Sprintf("§5 %v", form)
		if skipUnsupported(t, b.MLADecode(p), what) {
			continue
		}
		closeTo(t, what+" o", p.O.F32(), []float64{1.0 / 3, 1.0 / 3, 1.0 / 3, 0, 0.231224, 0.140244, 0.628532, 0}, tolerance{5e-6, 1e-6}, rowHeadFeat(2, 4))
		closeTo(t, what+" lse", p.LSE, []float64{2.306310, 2.833985}, tolerance{5e-6, 1e-6}, rowHead(2))
	}
}

func testMLAInvalid(t *testing.T, b kernels.Backend) {
	valid := func() *kernels.MLADecodeParams {
		rng := seededRNG(t, 3)
		c := mlaFromTokens(rng, layout.MLA{Form: layout.Split, DType: layout.F16, PageSize: 4, HeadDimCKV: 8, HeadDimKPE: 2}, []int{5, 0}, 1,
			func(b, t, part, d int) float64 { return 0.25 })
		return &kernels.MLADecodeParams{QNope: kernels.NewTensor(layout.F16, 2, 3, 8), QPE: kernels.NewTensor(layout.F16, 2, 3, 2),
			Cache: c.cache, KVIndptr: c.kvIndptr, KVPageIndices: c.kvPageIndices, KVLen: c.kvLen, NumHeads: 3, SMScale: 0.3,
			O: kernels.NewTensor(layout.F16, 2, 3, 8), LSE: make([]float32, 6)}
	}
	tests := []invalidCase[kernels.MLADecodeParams]{
		{"sm_scale 0", func(p *kernels.MLADecodeParams) { p.SMScale = 0 }, kernels.ErrInvalidScale},
		{"sm_scale NaN", func(p *kernels.MLADecodeParams) { p.SMScale = math.NaN() }, kernels.ErrInvalidScale},
		{"num_heads", func(p *kernels.MLADecodeParams) { p.NumHeads = 4 }, kernels.ErrInvalidAttention},
		{"q_pe heads", func(p *kernels.MLADecodeParams) { p.QPE = kernels.NewTensor(layout.F16, 2, 2, 2) }, kernels.ErrInvalidTensor},
		{"ckv head_dim", func(p *kernels.MLADecodeParams) { p.QNope = kernels.NewTensor(layout.F16, 2, 3, 16) }, kernels.ErrInvalidTensor},
		{"kv_len beyond pages", func(p *kernels.MLADecodeParams) { p.KVLen = []int32{9, 0} }, kernels.ErrInvalidPageTable},
		{"kv_len negative", func(p *kernels.MLADecodeParams) { p.KVLen = []int32{5, -1} }, kernels.ErrInvalidPageTable},
		{"kv_len count", func(p *kernels.MLADecodeParams) { p.KVLen = []int32{5} }, kernels.ErrInvalidPageTable},
		{"page id out of range", func(p *kernels.MLADecodeParams) { p.KVPageIndices = []int32{0, 7} }, kernels.ErrIndexOutOfRange},
	}
	runInvalid(t, tests, valid, func(p *kernels.MLADecodeParams) ([]byte, []float32) { return p.O.Data, p.LSE }, b.MLADecode)
}

// ---------------------------------------------------------------- merge

// TestMergeState checks b.MergeState: the §4.1 worked examples, random
// states (with -inf identities) in and out of place, and invalid parameters.
func TestMergeState(t *testing.T, b kernels.Backend) {
	t.Run("worked example §4.1", func(t *testing.T) { testMergeWorked(t, b) })
	t.Run("random", func(t *testing.T) {
		for i := 0; i < iterations(30); i++ {
			rng := seededRNG(t, 12000+uint64(i))
			runMergeStateCase(t, b, rng, i%3 == 0, fmt.Sprintf("case %d", i))
		}
	})
	t.Run("invalid", func(t *testing.T) {
		valid := func() *kernels.MergeStateParams {
			return &kernels.MergeStateParams{VA: kernels.NewTensor(layout.F16, 2, 1, 4), VB: kernels.NewTensor(layout.F16, 2, 1, 4),
				SA: make([]float32, 2), SB: make([]float32, 2), V: kernels.NewTensor(layout.F32, 2, 1, 4), S: make([]float32, 2)}
		}
		tests := []invalidCase[kernels.MergeStateParams]{
			{"v_b shape", func(p *kernels.MergeStateParams) { p.VB = kernels.NewTensor(layout.F16, 2, 2, 4) }, kernels.ErrInvalidTensor},
			{"s_a length", func(p *kernels.MergeStateParams) { p.SA = p.SA[:1] }, kernels.ErrInvalidTensor},
			{"s_b NaN", func(p *kernels.MergeStateParams) { p.SB[1] = float32(math.NaN()) }, kernels.ErrInvalidAttention},
			{"s_a +Inf", func(p *kernels.MergeStateParams) { p.SA[0] = float32(math.Inf(1)) }, kernels.ErrInvalidAttention},
			{"v dtype e5m2", func(p *kernels.MergeStateParams) { p.V = kernels.NewTensor(layout.E5M2, 2, 1, 4) }, kernels.ErrInvalidTensor},
		}
		runInvalid(t, tests, valid, func(p *kernels.MergeStateParams) ([]byte, []float32) { return p.V.Data, p.S }, b.MergeState)
	})
}

func testMergeWorked(t *testing.T, b kernels.Backend) {
	inf := math.Inf(-1)
	tests := map[string]struct {
		va, vb, want []float64
		sa, sb, ws   float64
	}{
		"weights 1/3, 2/3":       {[]float64{1, 0}, []float64{0, 1}, []float64{0.333333, 0.666667}, 1, 2, 2.584963},
		"-inf is the identity":   {[]float64{7, 7}, []float64{1, 2}, []float64{1, 2}, inf, 0.5, 0.5},
		"identity on the right":  {[]float64{1, 2}, []float64{7, 7}, []float64{1, 2}, 0.5, inf, 0.5},
		"NaN under -inf ignored": {[]float64{math.NaN(), 1}, []float64{1, 2}, []float64{1, 2}, inf, 0.5, 0.5},
		"both empty":             {[]float64{3, 3}, []float64{4, 4}, []float64{0, 0}, inf, inf, inf},
		"§3.6 prefix + suffix":   {[]float64{0.268941, 0.537883, 1.537883, 1.075766}, []float64{2, 0, 0, 2}, []float64{1.0, 0.310725, 0.888406, 1.466087}, 1.894636, 1.442695, 2.686291},
	}
	for name, tc := range tests {
		d := len(tc.va)
		p := &kernels.MergeStateParams{VA: tensorOf(layout.F32, tc.va, 1, 1, d), VB: tensorOf(layout.F32, tc.vb, 1, 1, d),
			SA: []float32{float32(tc.sa)}, SB: []float32{float32(tc.sb)}, V: kernels.NewTensor(layout.F32, 1, 1, d), S: make([]float32, 1)}
		if skipUnsupported(t, b.MergeState(p), name) {
			continue
		}
		closeTo(t, name+" v", p.V.F32(), tc.want, tolerance{2e-6, 1e-6}, rowHeadFeat(1, d))
		closeTo(t, name+" s", p.S, []float64{tc.ws}, tolerance{2e-6, 1e-6}, rowHead(1))
	}
}

// randomLSE draws LSE values in [-20, 20] with some -inf (empty states).
func randomLSE(rng *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		if rng.IntN(6) == 0 {
			s[i] = float32(math.Inf(-1))
		} else {
			s[i] = float32(40*rng.Float64() - 20)
		}
	}
	return s
}

func runMergeStateCase(t *testing.T, b kernels.Backend, rng *rand.Rand, inPlace bool, name string) {
	t.Helper()
	n, h, d := rng.IntN(6), 1+rng.IntN(4), pick(rng, 1, 3, 8, 64, 128)
	adt, bdt, vdt := pick(rng, layout.F32, layout.F16, layout.BF16), pick(rng, layout.F32, layout.F16, layout.BF16), pick(rng, layout.F32, layout.F16, layout.BF16)
	p := &kernels.MergeStateParams{VA: randomQ(rng, adt, n, h, d), VB: randomQ(rng, bdt, n, h, d),
		SA: randomLSE(rng, n*h), SB: randomLSE(rng, n*h), V: kernels.NewTensor(vdt, n, h, d), S: make([]float32, n*h)}
	va, vb := reference.Floats(adt, p.VA.Data), reference.Floats(bdt, p.VB.Data)
	sa, sb := f64s(p.SA), f64s(p.SB)
	if inPlace {
		vdt = adt
		p.V, p.S = p.VA, p.SA
	}
	what := fmt.Sprintf("%s n=%d H=%d D=%d %v+%v->%v in-place=%v", name, n, h, d, adt, bdt, vdt, inPlace)
	if skipUnsupported(t, b.MergeState(p), what) {
		return
	}
	var wv, ws []float64
	for i := 0; i < n*h; i++ {
		v, s := reference.MergeState(va[i*d:(i+1)*d], sa[i], vb[i*d:(i+1)*d], sb[i])
		wv, ws = append(wv, v...), append(ws, s)
	}
	closeTo(t, what+" v", p.V.F32(), wv, outTol(vdt), rowHeadFeat(h, d))
	closeTo(t, what+" s", p.S, ws, tolerance{1e-5, 1e-5}, rowHead(h))
}

// TestMergeStates checks b.MergeStates: zero, one and many states per row,
// -inf states, against the reference, and invalid parameters.
func TestMergeStates(t *testing.T, b kernels.Backend) {
	t.Run("random", func(t *testing.T) {
		for i := 0; i < iterations(30); i++ {
			rng := seededRNG(t, 15000+uint64(i))
			n, ns, h, d := rng.IntN(5), pick(rng, 0, 1, 2, 5, 9), 1+rng.IntN(3), pick(rng, 1, 4, 8, 64, 128)
			vdt, odt := pick(rng, layout.F32, layout.F16, layout.BF16), pick(rng, layout.F32, layout.F16, layout.BF16)
			p := &kernels.MergeStatesParams{V: randomQ(rng, vdt, n, ns, h, d), S: randomLSE(rng, n*ns*h),
				OutV: kernels.NewTensor(odt, n, h, d), OutS: make([]float32, n*h)}
			what := fmt.Sprintf("case %d n=%d S=%d H=%d D=%d %v->%v", i, n, ns, h, d, vdt, odt)
			if skipUnsupported(t, b.MergeStates(p), what) {
				continue
			}
			v, s := reference.Floats(vdt, p.V.Data), f64s(p.S)
			var wv, ws []float64
			for r := 0; r < n; r++ {
				for hh := 0; hh < h; hh++ {
					var vs [][]float64
					var ss []float64
					for si := 0; si < ns; si++ {
						k := (r*ns+si)*h + hh
						vs, ss = append(vs, v[k*d:(k+1)*d]), append(ss, s[k])
					}
					mv, ms := reference.MergeStates(vs, ss, d)
					wv, ws = append(wv, mv...), append(ws, ms)
				}
			}
			closeTo(t, what+" v", p.OutV.F32(), wv, outTol(odt), rowHeadFeat(h, d))
			closeTo(t, what+" s", p.OutS, ws, tolerance{1e-5, 1e-5}, rowHead(h))
		}
	})
	t.Run("invalid", func(t *testing.T) {
		valid := func() *kernels.MergeStatesParams {
			return &kernels.MergeStatesParams{V: kernels.NewTensor(layout.F32, 2, 3, 1, 4), S: make([]float32, 6),
				OutV: kernels.NewTensor(layout.F32, 2, 1, 4), OutS: make([]float32, 2)}
		}
		tests := []invalidCase[kernels.MergeStatesParams]{
			{"v rank", func(p *kernels.MergeStatesParams) { p.V = kernels.NewTensor(layout.F32, 2, 3, 4) }, kernels.ErrInvalidTensor},
			{"s length", func(p *kernels.MergeStatesParams) { p.S = p.S[:5] }, kernels.ErrInvalidTensor},
			{"s NaN", func(p *kernels.MergeStatesParams) { p.S[4] = float32(math.NaN()) }, kernels.ErrInvalidAttention},
			{"out heads", func(p *kernels.MergeStatesParams) { p.OutV = kernels.NewTensor(layout.F32, 2, 2, 4) }, kernels.ErrInvalidTensor},
			{"out_s length", func(p *kernels.MergeStatesParams) { p.OutS = make([]float32, 3) }, kernels.ErrInvalidTensor},
		}
		runInvalid(t, tests, valid, func(p *kernels.MergeStatesParams) ([]byte, []float32) { return p.OutV.Data, p.OutS }, b.MergeStates)
	})
}
