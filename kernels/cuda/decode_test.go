//go:build cgo

package cuda_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/cpuemu"
	"github.com/pagedkv/pagedkv/internal/reference"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/kernels/cuda"
	"github.com/pagedkv/pagedkv/layout"
)

// backend is a backend under test and how it plans decode.
type backend struct {
	kernels.Backend
	label string
}

// testBackends are the emulator, planned as an H100 (split-k only for long
// requests) and with split-k forced into short chunks, plus the GPU under
// -tags cuda when a device is present (gpuBackends).
func testBackends(t *testing.T) []backend {
	bs := []backend{
		{cpuemu.New(cpuemu.Config{}), "emu"},
		{cpuemu.New(cpuemu.Config{MaxChunkTokens: 19}), "emu-split19"},
	}
	return append(bs, gpuBackends(t)...)
}

// decodeCase is one random batch decode configuration.
type decodeCase struct {
	Layout     layout.KVLayout
	Form       layout.TensorForm
	KV, Q, O   layout.DType
	HeadDim    int
	KVHeads    int
	Group      int
	PageSize   int
	Lens       []int // keys per request (0: a request without pages)
	WindowLeft int
	SoftCap    float64
	SMScale    float64
	KScale     float64
	VScale     float64
}

func (c decodeCase) String() string {
	s := fmt.Sprintf("%v-%v-kv%v-q%v-o%v-D%d-H%dx%d-N%d-lens%v", c.Layout, c.Form, c.KV, c.Q, c.O, c.HeadDim,
		c.KVHeads, c.Group, c.PageSize, c.Lens)
	if c.WindowLeft >= 0 {
		s += fmt.Sprintf("-w%d", c.WindowLeft)
	}
	if c.SoftCap > 0 {
		s += fmt.Sprintf("-cap%g", c.SoftCap)
	}
	return strings.ReplaceAll(s, " ", ",")
}

// nanBytes is the NaN of dt, used to fill every cache slot no request owns.
func nanBytes(dt layout.DType) []byte {
	switch dt {
	case layout.F32:
		return []byte{0, 0, 0xc0, 0x7f}
	case layout.F16:
		return []byte{0, 0x7e}
	case layout.BF16:
		return []byte{0xc0, 0x7f}
	}
	return []byte{0x7f} // e4m3 and e5m2
}

// decodeFixture is a filled cache, page table, q and outputs for a case.
type decodeFixture struct {
	p   kernels.DecodeParams
	ref reference.PagedKV
}

func newDecodeFixture(t *testing.T, r *rand.Rand, c decodeCase) decodeFixture {
	t.Helper()
	B := len(c.Lens)
	pages := 0
	for _, n := range c.Lens {
		pages += (n + c.PageSize - 1) / c.PageSize
	}
	g := layout.Paged{Layout: c.Layout, Form: c.Form, DType: c.KV, NumPages: pages + 3, PageSize: c.PageSize,
		NumKVHeads: c.KVHeads, HeadDim: c.HeadDim}
	cache, err := kernels.NewPagedKVCache(g)
	require.NoError(t, err)
	nan := nanBytes(c.KV)
	for _, buf := range [][]byte{cache.Data, cache.K, cache.V} {
		for i := range buf {
			buf[i] = nan[i%len(nan)]
		}
	}
	perm := r.Perm(g.NumPages)
	table := kernels.PageTable{KVIndptr: []int32{0}, KVLastPageLen: make([]int32, B)}
	next := 0
	for b, n := range c.Lens {
		np := (n + c.PageSize - 1) / c.PageSize
		for range np {
			table.KVPageIndices = append(table.KVPageIndices, int32(perm[next]))
			next++
		}
		table.KVIndptr = append(table.KVIndptr, int32(len(table.KVPageIndices)))
		if n > 0 {
			table.KVLastPageLen[b] = int32((n-1)%c.PageSize + 1)
		}
	}
	amp := 1.0
	if c.KV == layout.E4M3 || c.KV == layout.E5M2 {
		amp = 8 // use more of the fp8 range
	}
	for b, n := range c.Lens {
		for tok := range n {
			page, entry, err := table.Locate(b, tok, c.PageSize)
			require.NoError(t, err)
			for h := range c.KVHeads {
				for d := range c.HeadDim {
					layout.StoreF32(c.KV, cache.KBuf(), int(g.KOffset(page, entry, h, d)), float32(amp*(2*r.Float64()-1)))
					layout.StoreF32(c.KV, cache.VBuf(), int(g.VOffset(page, entry, h, d)), float32(amp*(2*r.Float64()-1)))
				}
			}
		}
	}
	Hq := c.KVHeads * c.Group
	qv := make([]float32, B*Hq*c.HeadDim)
	for i := range qv {
		qv[i] = float32(2*r.Float64() - 1)
	}
	p := kernels.DecodeParams{
		Q:     kernels.TensorFromF32(c.Q, qv, B, Hq, c.HeadDim),
		Cache: cache,
		Table: table,
		AttentionParams: kernels.AttentionParams{NumQOHeads: Hq, SMScale: c.SMScale, WindowLeft: c.WindowLeft,
			LogitsSoftCap: c.SoftCap, KScale: c.KScale, VScale: c.VScale},
		O:   kernels.NewTensor(c.O, B, Hq, c.HeadDim),
		LSE: make([]float32, B*Hq),
	}
	ref := reference.PagedKV{Layout: c.Layout, Form: c.Form, DType: c.KV, NumPages: g.NumPages, PageSize: c.PageSize,
		NumKVHeads: c.KVHeads, HeadDim: c.HeadDim, Data: cache.Data, K: cache.K, V: cache.V}
	return decodeFixture{p, ref}
}

// tolerance |got - want| <= atol + rtol*|want|, by output dtype: the
// kernels compute in float32 and round the output once.
func outTol(dt layout.DType) (atol, rtol float64) {
	switch dt {
	case layout.F16:
		return 2e-3, 2e-3
	case layout.BF16:
		return 1.6e-2, 1.6e-2
	}
	return 1e-4, 1e-4
}

// checkDecode runs the case on b and compares with internal/reference,
// reporting the first differing elements by (request, head, feature).
func checkDecode(t *testing.T, b kernels.Backend, c decodeCase, seed uint64) {
	t.Helper()
	f := newDecodeFixture(t, rand.New(rand.NewPCG(seed, 77)), c)
	require.NoError(t, b.BatchDecode(&f.p), "%s on %s", c, b.Name())
	compareDecode(t, b, c, seed, f)
}

// compareDecode compares the outputs of f, which b has run, with the
// reference.
func compareDecode(t *testing.T, b kernels.Backend, c decodeCase, seed uint64, f decodeFixture) {
	t.Helper()
	wantO, wantLSE := decodeWant(c, f)
	compareDecodeWant(t, b, c, seed, f, wantO, wantLSE)
}

// decodeWant is the reference's output for f.
func decodeWant(c decodeCase, f decodeFixture) ([][][]float64, [][]float64) {
	q := reference.Rows3(reference.Floats(c.Q, f.p.Q.Data), len(c.Lens), c.KVHeads*c.Group, c.HeadDim)
	return reference.BatchDecode(q, f.ref, f.p.Table.KVIndptr, f.p.Table.KVPageIndices, f.p.Table.KVLastPageLen,
		reference.Logits{SMScale: c.SMScale, KScale: c.KScale, SoftCap: c.SoftCap, VScale: c.VScale, WindowLeft: c.WindowLeft})
}

// compareDecodeWant compares the outputs of f, which b has run, with the
// reference's (decodeWant).
func compareDecodeWant(t *testing.T, b kernels.Backend, c decodeCase, seed uint64, f decodeFixture, wantO [][][]float64, wantLSE [][]float64) {
	t.Helper()
	compareRows(t, fmt.Sprintf("%s on %s (seed %d)", c, b.Name(), seed), "req", c.O, f.p.O, f.p.LSE, wantO, wantLSE)
}

// compareRows compares o (dtype odt, [rows][heads][features]) and lse with
// the reference's, reporting the first differing elements by (row, head,
// feature); unit names a row ("req" for decode).
func compareRows(t *testing.T, what, unit string, odt layout.DType, o kernels.Tensor, lse []float32, wantO [][][]float64, wantLSE [][]float64) {
	t.Helper()
	gotO := reference.Rows3(reference.Floats(odt, o.Data), o.Shape[0], o.Shape[1], o.Shape[2])
	atol, rtol := outTol(odt)
	var diffs []string
	for r := range wantO {
		Hq := len(wantO[r])
		for h := range Hq {
			for d, w := range wantO[r][h] {
				g := gotO[r][h][d]
				if !(math.Abs(g-w) <= atol+rtol*math.Abs(w)) {
					diffs = append(diffs, fmt.Sprintf("o[%s %d, head %d, feat %d] = %.6g, want %.6g", unit, r, h, d, g, w))
				}
			}
			g, w := float64(lse[r*Hq+h]), wantLSE[r][h]
			same := g == w || math.Abs(g-w) <= 1e-3+1e-4*math.Abs(w)
			if !same {
				diffs = append(diffs, fmt.Sprintf("lse[%s %d, head %d] = %.6g, want %.6g", unit, r, h, g, w))
			}
		}
	}
	if len(diffs) > 0 {
		n := len(diffs)
		if n > 8 {
			diffs = append(diffs[:8], "...")
		}
		t.Fatalf("%s: %d elements differ:\n%s", what, n, strings.Join(diffs, "\n"))
	}
}

// decodeCases is the random matrix: every cache dtype with the tuned head
// dims and an odd small one, GQA groups that fill, split and leave idle
// warps in a block, both layouts and tensor forms, windows and soft caps.
func decodeCases() []decodeCase {
	kvs := []layout.DType{layout.F32, layout.F16, layout.BF16, layout.E4M3, layout.E5M2}
	acts := []layout.DType{layout.F32, layout.F16, layout.BF16}
	dims := []int{64, 128, 256, 5}
	groups := []struct{ heads, group int }{{2, 1}, {1, 4}, {2, 3}, {1, 12}}
	var cs []decodeCase
	i := 0
	for _, kv := range kvs {
		for _, D := range dims {
			for _, gr := range groups {
				c := decodeCase{
					Layout: layout.KVLayout(i % 2), Form: layout.TensorForm(i / 2 % 2),
					KV: kv, Q: acts[i%3], O: acts[(i/3)%3],
					HeadDim: D, KVHeads: gr.heads, Group: gr.group,
					PageSize:   []int{1, 4, 16}[i%3],
					Lens:       [][]int{{37, 0, 5}, {70}, {1, 130, 24}, {300, 2}}[i%4],
					WindowLeft: []int{-1, -1, 0, 9, 1000}[i%5],
				}
				c.vary(i)
				cs = append(cs, c)
				i++
			}
		}
	}
	return cs
}

// vary gives case i of a random matrix a soft cap (every 7th) and the
// fp8 scales an fp8 cache needs.
func (c *decodeCase) vary(i int) {
	if i%7 == 3 {
		c.SoftCap = 2.5
		c.SMScale = 1.5
	}
	if c.KV == layout.E4M3 || c.KV == layout.E5M2 {
		c.KScale, c.VScale = 0.25, 0.5
	}
}

func TestDecodeRandom(t *testing.T) {
	for _, b := range testBackends(t) {
		t.Run(b.label, func(t *testing.T) {
			for i, c := range decodeCases() {
				if testing.Short() && i%4 != 0 {
					continue
				}
				t.Run(c.String(), func(t *testing.T) { checkDecode(t, b, c, uint64(i)) })
			}
		})
	}
}

// Long requests are split (split-k) by the H100 plan and merged; the result
// must not depend on the split.
func TestDecodeLongRequestSplitK(t *testing.T) {
	for _, b := range testBackends(t) {
		c := decodeCase{Layout: layout.HND, Form: layout.Fused, KV: layout.F16, Q: layout.F16, O: layout.F32,
			HeadDim: 128, KVHeads: 1, Group: 4, PageSize: 16, Lens: []int{2000, 3, 0}, WindowLeft: -1}
		checkDecode(t, b, c, 1)
		c.WindowLeft = 700
		checkDecode(t, b, c, 2)
	}
}

// The split-KV scheduler's cases on the emulator planned as an H100 (132
// SMs; one kv head, one query head, head_dim 64, f16): batch 1 of 32,768
// keys and mixed lengths 1..32,768 in one batch
// (with and without a window), split by the scheduler (two launches:
// decode and merge), never split (MaxChunkTokens -1: one launch) and in
// forced 19-key chunks; each equals the reference.
func TestDecodeSplitKVMixedLengths(t *testing.T) {
	for _, c := range []struct {
		name   string
		lens   []int
		window int
	}{
		{"B1-L32768", []int{32768}, -1},
		{"mixed", []int{1, 32768, 7, 5000, 300, 0, 2, 200, 64}, -1},
		{"mixed-window1000", []int{1, 32768, 7, 5000, 300, 0, 2, 200, 64}, 1000},
	} {
		dc := decodeCase{Layout: layout.NHD, Form: layout.Split, KV: layout.F16, Q: layout.F16, O: layout.F32,
			HeadDim: 64, KVHeads: 1, Group: 1, PageSize: 16, Lens: c.lens, WindowLeft: c.window} // one query head: the emulator's shuffles cost per key and head
		f := newDecodeFixture(t, rand.New(rand.NewPCG(3, 77)), dc)
		wantO, wantLSE := decodeWant(dc, f)
		for _, b := range []struct {
			label    string
			cfg      cpuemu.Config
			launches int
		}{{"auto", cpuemu.Config{}, 2}, {"off", cpuemu.Config{MaxChunkTokens: -1}, 1}, {"forced19", cpuemu.Config{MaxChunkTokens: 19}, 2}} {
			t.Run(c.name+"/"+b.label, func(t *testing.T) {
				be := cpuemu.NewDevice(b.cfg)
				before := be.Traffic()
				for i := range f.p.LSE {
					f.p.LSE[i] = float32(math.NaN())
				}
				require.NoError(t, be.BatchDecode(&f.p))
				assert.Equal(t, b.launches, be.Traffic().Sub(before).Launches, "decode (+ merge) launches")
				compareDecodeWant(t, be, dc, 3, f, wantO, wantLSE)
			})
		}
	}
}

// Prefill through the split-KV scheduler: causal and windowed rows of
// mixed lengths (a long request's rows are split, its short ones and the
// other requests' are not), on the emulator split by the scheduler, never
// split and in forced chunks, each within float32 rounding of the CPU
// backend.
func TestPrefillSplitKVMixedLengths(t *testing.T) {
	dc := decodeCase{Layout: layout.HND, Form: layout.Fused, KV: layout.F16, Q: layout.F16, O: layout.F32,
		HeadDim: 64, KVHeads: 1, Group: 2, PageSize: 16, Lens: []int{3000, 40, 1, 700}, WindowLeft: -1}
	f := newDecodeFixture(t, rand.New(rand.NewPCG(4, 77)), dc)
	qoLens := []int{5, 3, 1, 4}
	qo := []int32{0}
	for _, n := range qoLens {
		qo = append(qo, qo[len(qo)-1]+int32(n))
	}
	rows, Hq := int(qo[len(qo)-1]), dc.KVHeads*dc.Group
	rng := rand.New(rand.NewPCG(4, 78))
	qv := make([]float32, rows*Hq*dc.HeadDim)
	for i := range qv {
		qv[i] = float32(2*rng.Float64() - 1)
	}
	for _, window := range []int{-1, 900} {
		p := kernels.PrefillParams{Q: kernels.TensorFromF32(dc.Q, qv, rows, Hq, dc.HeadDim), QOIndptr: qo, Cache: f.p.Cache,
			Table: f.p.Table, Causal: true, AttentionParams: kernels.AttentionParams{NumQOHeads: Hq, WindowLeft: window},
			O: kernels.NewTensor(dc.O, rows, Hq, dc.HeadDim), LSE: make([]float32, rows*Hq)}
		require.NoError(t, cpu.New(cpu.Config{Workers: 1}).BatchPrefill(&p))
		wantO, wantLSE := reference.Floats(dc.O, append([]byte(nil), p.O.Data...)), append([]float32(nil), p.LSE...)
		for _, b := range []struct {
			label    string
			cfg      cpuemu.Config
			launches int
		}{{"auto", cpuemu.Config{}, 2}, {"off", cpuemu.Config{MaxChunkTokens: -1}, 1}, {"forced100", cpuemu.Config{MaxChunkTokens: 100}, 2}} {
			t.Run(fmt.Sprintf("window%d/%s", window, b.label), func(t *testing.T) {
				be := cpuemu.NewDevice(b.cfg)
				p.O, p.LSE = kernels.NewTensor(dc.O, rows, Hq, dc.HeadDim), make([]float32, rows*Hq)
				before := be.Traffic()
				require.NoError(t, be.BatchPrefill(&p))
				assert.Equal(t, b.launches, be.Traffic().Sub(before).Launches, "prefill (+ merge) launches")
				got := reference.Floats(dc.O, p.O.Data)
				for i := range got {
					require.InDelta(t, wantO[i], got[i], 1e-4+1e-4*math.Abs(wantO[i]), "o[%d]", i)
				}
				for i := range p.LSE {
					require.InDelta(t, wantLSE[i], p.LSE[i], 1e-3, "lse[%d]", i)
				}
			})
		}
	}
}

// flashinfer-semantics §3.6: page table kv_indptr [0,2,3], kv_indices
// [3,0,2], kv_last_page_len [1,2]; Hq=2, H=1, D=4, page_size 2, sm_scale 0.5.
func TestDecodeWorkedExample(t *testing.T) {
	g := layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F32, NumPages: 4, PageSize: 2, NumKVHeads: 1, HeadDim: 4}
	table := kernels.PageTable{KVIndptr: []int32{0, 2, 3}, KVPageIndices: []int32{3, 0, 2}, KVLastPageLen: []int32{1, 2}}
	//           req 0: t0        t1          t2          req 1: t0     t1
	keys := [][][]float32{{{1, 0, 0, 0}, {0, 1, 0, 0}, {1, 1, 0, 0}}, {{0, 0, 1, 0}, {0, 0, 0, 2}}}
	vals := [][][]float32{{{1, 2, 3, 4}, {0, 0, 1, 0}, {2, 0, 0, 2}}, {{1, 1, 1, 1}, {4, 0, 0, 0}}}
	q := []float32{1, 0, 0, 0 /**/, 0, 2, 0, 0 /**/, 0, 0, 1, 1 /**/, 0, 0, 2, 0}
	type want struct {
		o   [4][4]float64
		lse [4]float64
	}
	for _, c := range []struct {
		name       string
		windowLeft int
		softCap    float64
		want       want
	}{
		{"plain", -1, 0, want{
			o: [4][4]float64{{1.150955, 0.767303, 1.383652, 2.301910}, {1.000000, 0.310725, 0.888406, 1.466087},
				{2.867378, 0.377541, 0.377541, 0.377541}, {1.806824, 0.731059, 0.731059, 0.731059}},
			lse: [4]float64{2.103478, 2.686291, 2.126644, 1.894636}}},
		{"window_left=1", 1, 0, want{
			o: [4][4]float64{{1.244919, 0, 0.377541, 1.244919}, {1, 0, 0.5, 1},
				{2.867378, 0.377541, 0.377541, 0.377541}, {1.806824, 0.731059, 0.731059, 0.731059}},
			lse: [4]float64{1.405296, 2.442695, 2.126644, 1.894636}}},
		{"soft cap 1", -1, 1, want{
			o: [4][4]float64{{1.140707, 0.760471, 1.380236, 2.281413}, {1.000000, 0.378546, 0.973182, 1.567819},
				{2.722944, 0.425685, 0.425685, 0.425685}, {1.954901, 0.681700, 0.681700, 0.681700}},
			lse: [4]float64{2.061729, 2.401460, 1.898835, 1.651540}}},
	} {
		for _, b := range testBackends(t) {
			cache, err := kernels.NewPagedKVCache(g)
			require.NoError(t, err)
			for r := range keys {
				for tok := range keys[r] {
					page, entry, err := table.Locate(r, tok, g.PageSize)
					require.NoError(t, err)
					for d := range 4 {
						layout.StoreF32(layout.F32, cache.Data, int(g.KOffset(page, entry, 0, d)), keys[r][tok][d])
						layout.StoreF32(layout.F32, cache.Data, int(g.VOffset(page, entry, 0, d)), vals[r][tok][d])
					}
				}
			}
			p := kernels.DecodeParams{
				Q: kernels.TensorFromF32(layout.F32, q, 2, 2, 4), Cache: cache, Table: table,
				AttentionParams: kernels.AttentionParams{NumQOHeads: 2, SMScale: 0.5, WindowLeft: c.windowLeft, LogitsSoftCap: c.softCap},
				O:               kernels.NewTensor(layout.F32, 2, 2, 4), LSE: make([]float32, 4),
			}
			require.NoError(t, b.BatchDecode(&p))
			o := p.O.F32()
			for row := range 4 {
				for d := range 4 {
					assert.InDelta(t, c.want.o[row][d], o[row*4+d], 2e-6, "%s on %s: o[req %d, head %d, feat %d]", c.name, b.label, row/2, row%2, d)
				}
				assert.InDelta(t, c.want.lse[row], p.LSE[row], 2e-6, "%s on %s: lse[req %d, head %d]", c.name, b.label, row/2, row%2)
			}
		}
	}
}

// A request without pages, and one whose window is empty of nothing else,
// give o = 0 and lse = -inf, also through the split-k merge.
func TestDecodeEmptyRequest(t *testing.T) {
	for _, b := range testBackends(t) {
		c := decodeCase{Layout: layout.NHD, Form: layout.Split, KV: layout.BF16, Q: layout.BF16, O: layout.BF16,
			HeadDim: 64, KVHeads: 2, Group: 2, PageSize: 8, Lens: []int{0, 50, 0}, WindowLeft: -1}
		f := newDecodeFixture(t, rand.New(rand.NewPCG(3, 3)), c)
		for i := range f.p.O.Data {
			f.p.O.Data[i] = 0x55
		}
		require.NoError(t, b.BatchDecode(&f.p))
		o := f.p.O.F32()
		for _, r := range []int{0, 2} {
			for h := range 4 {
				assert.True(t, math.IsInf(float64(f.p.LSE[r*4+h]), -1), "%s: lse[req %d, head %d] = %v", b.label, r, h, f.p.LSE[r*4+h])
				for d := range 64 {
					require.Zero(t, o[(r*4+h)*64+d], "%s: o[req %d, head %d, feat %d]", b.label, r, h, d)
				}
			}
		}
	}
}

// An invalid call is rejected by the shared validator before any launch
// and leaves O and LSE as they were.
func TestDecodeInvalidWritesNothing(t *testing.T) {
	for _, b := range testBackends(t) {
		c := decodeCase{Layout: layout.NHD, Form: layout.Fused, KV: layout.F16, Q: layout.F16, O: layout.F16,
			HeadDim: 64, KVHeads: 1, Group: 2, PageSize: 4, Lens: []int{9, 3}, WindowLeft: -1}
		f := newDecodeFixture(t, rand.New(rand.NewPCG(5, 5)), c)
		f.p.Table.KVPageIndices[1] = int32(f.p.Cache.Geometry.NumPages) // one past the pool
		for i := range f.p.O.Data {
			f.p.O.Data[i] = 0x55
		}
		for i := range f.p.LSE {
			f.p.LSE[i] = 42
		}
		err := b.BatchDecode(&f.p)
		require.ErrorIs(t, err, kernels.ErrIndexOutOfRange)
		assert.Contains(t, err.Error(), "kv_indices[1]")
		for _, x := range f.p.O.Data {
			require.Equal(t, byte(0x55), x)
		}
		for _, x := range f.p.LSE {
			require.Equal(t, float32(42), x)
		}
	}
}

// What the kernels do not cover (head_dim above 256, MLA head_dim_ckv above
// 512) is declined with kernels.ErrUnsupported.
func TestUnsupported(t *testing.T) {
	for _, b := range testBackends(t) {
		c := decodeCase{Layout: layout.NHD, Form: layout.Fused, KV: layout.F16, Q: layout.F16, O: layout.F16,
			HeadDim: 264, KVHeads: 1, Group: 1, PageSize: 4, Lens: []int{3}, WindowLeft: -1}
		f := newDecodeFixture(t, rand.New(rand.NewPCG(5, 5)), c)
		assert.ErrorIs(t, b.BatchDecode(&f.p), kernels.ErrUnsupported, "head_dim 264")
		f.p.O = kernels.NewTensor(layout.F16, 1, 1, 264)
		assert.ErrorIs(t, b.BatchPrefill(&kernels.PrefillParams{Q: f.p.Q, QOIndptr: []int32{0, 1}, Cache: f.p.Cache,
			Table: f.p.Table, AttentionParams: f.p.AttentionParams, O: f.p.O}), kernels.ErrUnsupported, "prefill head_dim 264")
		g := layout.MLA{Form: layout.Split, DType: layout.F16, NumPages: 1, PageSize: 4, HeadDimCKV: 520, HeadDimKPE: 8}
		cache, err := kernels.NewMLACache(g)
		require.NoError(t, err)
		assert.ErrorIs(t, b.MLADecode(&kernels.MLADecodeParams{QNope: kernels.NewTensor(layout.F16, 1, 1, 520),
			QPE: kernels.NewTensor(layout.F16, 1, 1, 8), Cache: cache, KVIndptr: []int32{0, 1}, KVPageIndices: []int32{0},
			KVLen: []int32{3}, NumHeads: 1, SMScale: 0.1, O: kernels.NewTensor(layout.F16, 1, 1, 520)}),
			kernels.ErrUnsupported, "MLA head_dim_ckv 520")
	}
}

// A backend may be called from several goroutines at once (the emulator
// serialises launches; the GPU driver serialises on its context's thread).
func TestConcurrentCalls(t *testing.T) {
	for _, b := range testBackends(t) {
		c := decodeCase{Layout: layout.NHD, Form: layout.Split, KV: layout.F16, Q: layout.F32, O: layout.F32,
			HeadDim: 64, KVHeads: 2, Group: 2, PageSize: 8, Lens: []int{40, 17}, WindowLeft: -1}
		fixtures := make([]decodeFixture, 8)
		errs := make([]error, len(fixtures))
		for i := range fixtures {
			fixtures[i] = newDecodeFixture(t, rand.New(rand.NewPCG(uint64(i), 77)), c)
		}
		var wg sync.WaitGroup
		for i := range fixtures {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = b.BatchDecode(&fixtures[i].p)
			}()
		}
		wg.Wait()
		for i := range fixtures {
			require.NoError(t, errs[i])
			compareDecode(t, b, c, uint64(i), fixtures[i])
		}
	}
}

// The decode kernel, launched by hand on the emulator: in a split launch
// (partial = 1) an empty work item is padding and writes nothing (its
// partial-state rows keep their 0x7f fill), while the real item beside it
// writes its state; in a direct launch (partial = 0) an empty item is a
// row without keys and writes o = 0, lse = -inf.
func TestDecodeKernelSkipsEmptySplitItems(t *testing.T) {
	d := cpuemu.NewDriver(1)
	g := layout.Paged{Layout: layout.NHD, Form: layout.Split, DType: layout.F16, NumPages: 2, PageSize: 4, NumKVHeads: 1, HeadDim: 32}
	const D, items = 32, 2
	alloc := func(b []byte) cuda.DevicePtr {
		p, err := d.Alloc(max(len(b), 16))
		require.NoError(t, err)
		t.Cleanup(func() { _ = d.Free(p) })
		require.NoError(t, d.HtoD(p, b))
		return p
	}
	i32 := func(xs ...int32) []byte {
		b := make([]byte, 4*len(xs))
		for i, x := range xs {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
		}
		return b
	}
	fill := func(n int, v byte) []byte { return bytes.Repeat([]byte{v}, n) }
	kv := make([]byte, g.TensorElements()*2)
	for i := 0; i < len(kv); i += 2 {
		kv[i+1] = 0x3c // f16 1.0
	}
	q, k, v := alloc(fill(D*2, 0)), alloc(kv), alloc(kv)
	indptr, indices, last := alloc(i32(0, 1, 1)), alloc(i32(0)), alloc(i32(3, 1))
	work := alloc(i32(0, 0, 0, 3 /* request 0, keys 0..2 */, 0, 1, 0, 0 /* empty */))
	o, lse := alloc(fill(D*4, 0x7f)), alloc(fill(4, 0x7f))
	tmpO, tmpLSE := alloc(fill(items*D*4, 0x7f)), alloc(fill(items*4, 0x7f))
	launch := func(partial uint64) {
		args := []uint64{uint64(q), uint64(k), uint64(v), uint64(indptr), uint64(indices), uint64(last), uint64(work),
			uint64(o), uint64(lse), uint64(tmpO), uint64(tmpLSE), 1, 1, D, uint64(g.PageSize), uint64(g.NumPages),
			uint64(g.StridePage()), uint64(g.StrideN()), uint64(g.StrideH()), 1, 0, math.Float64bits(0.25), 0,
			math.Float64bits(1), 32, 16, partial}
		// vec 1 for head_dim 32; block (32 lanes, 1 head, 8 token warps); 4 tiles of 32 rows of 64 bytes + merge area
		require.NoError(t, d.Launch("batch_decode_paged_f16_v1", cuda.Dim3{X: items, Y: 1, Z: 1}, cuda.Dim3{X: 32, Y: 1, Z: 8},
			4*32*64+4*8*(D+2), args))
		require.NoError(t, d.Synchronize())
	}
	launch(1)
	got := make([]byte, items*D*4)
	require.NoError(t, d.DtoH(got, tmpO))
	assert.Equal(t, fill(D*4, 0x7f), got[D*4:], "the empty item of a split launch wrote its partial state")
	assert.Equal(t, float32(1), math.Float32frombits(binary.LittleEndian.Uint32(got)), "the real item's state (V rows of 1.0)")
	gotLSE := make([]byte, items*4)
	require.NoError(t, d.DtoH(gotLSE, tmpLSE))
	assert.Equal(t, fill(4, 0x7f), gotLSE[4:], "the empty item of a split launch wrote its lse")

	work = alloc(i32(0, 1, 0, 0, 0, 1, 0, 0)) // two empty items of row 0
	launch(0)
	require.NoError(t, d.DtoH(got[:D*4], o))
	assert.Equal(t, make([]byte, D*4), got[:D*4], "a direct launch's empty item writes o = 0")
	require.NoError(t, d.DtoH(gotLSE[:4], lse))
	assert.True(t, math.IsInf(float64(math.Float32frombits(binary.LittleEndian.Uint32(gotLSE))), -1), "lse = -inf")
}
