package reference

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/layout"
)

// The worked examples of flashinfer-semantics.md §3.6, §4.1, §5 and §7, as
// tables. They pin the model itself; kernels/kernelstest checks backends
// against the same numbers.

const tol = 5e-6 // the tables are printed with 6 decimals

func f32bytes(xs ...float64) []byte {
	b := make([]byte, 4*len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(x)))
	}
	return b
}

// decodeCache is §3.6: 5-D NHD [4 pages, 2, N=2, H=1, D=4], f32. Request 0
// is pages [3, 0] with 1 token in page 0; request 1 is page [2], 2 tokens.
func decodeCache() PagedKV {
	c := PagedKV{Layout: layout.NHD, Form: layout.Fused, DType: layout.F32, NumPages: 4, PageSize: 2, NumKVHeads: 1, HeadDim: 4}
	vals := make([]float64, 4*2*2*4)
	put := func(page, entry int, k, v []float64) {
		copy(vals[((page*2+0)*2+entry)*4:], k)
		copy(vals[((page*2+1)*2+entry)*4:], v)
	}
	put(3, 0, []float64{1, 0, 0, 0}, []float64{1, 2, 3, 4}) // req 0 t0
	put(3, 1, []float64{0, 1, 0, 0}, []float64{0, 0, 1, 0}) // req 0 t1
	put(0, 0, []float64{1, 1, 0, 0}, []float64{2, 0, 0, 2}) // req 0 t2
	put(2, 0, []float64{0, 0, 1, 0}, []float64{1, 1, 1, 1}) // req 1 t0
	put(2, 1, []float64{0, 0, 0, 2}, []float64{4, 0, 0, 0}) // req 1 t1
	c.Data = f32bytes(vals...)
	return c
}

var (
	decodeIndptr   = []int32{0, 2, 3}
	decodeIndices  = []int32{3, 0, 2}
	decodeLastPage = []int32{1, 2}
	decodeQ        = [][][]float64{
		{{1, 0, 0, 0}, {0, 2, 0, 0}},
		{{0, 0, 1, 1}, {0, 0, 2, 0}},
	}
)

type wantRow struct {
	o   []float64
	lse float64
}

func TestDecodeWorkedExample(t *testing.T) {
	plain := [][]wantRow{
		{{[]float64{1.150955, 0.767303, 1.383652, 2.301910}, 2.103478}, {[]float64{1.000000, 0.310725, 0.888406, 1.466087}, 2.686291}},
		{{[]float64{2.867378, 0.377541, 0.377541, 0.377541}, 2.126644}, {[]float64{1.806824, 0.731059, 0.731059, 0.731059}, 1.894636}},
	}
	tests := map[string]struct {
		lg   Logits
		want [][]wantRow
	}{
		"plain": {Logits{SMScale: 0.5, WindowLeft: -1}, plain},
		"window_left=1": {Logits{SMScale: 0.5, WindowLeft: 1}, [][]wantRow{
			{{[]float64{1.244919, 0, 0.377541, 1.244919}, 1.405296}, {[]float64{1, 0, 0.5, 1}, 2.442695}},
			plain[1], // L=2 <= w+1: unchanged
		}},
		"soft cap 1.0": {Logits{SMScale: 0.5, WindowLeft: -1, SoftCap: 1}, [][]wantRow{
			{{[]float64{1.140707, 0.760471, 1.380236, 2.281413}, 2.061729}, {[]float64{1.000000, 0.378546, 0.973182, 1.567819}, 2.401460}},
			{{[]float64{2.722944, 0.425685, 0.425685, 0.425685}, 1.898835}, {[]float64{1.954901, 0.681700, 0.681700, 0.681700}, 1.651540}},
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o, lse := BatchDecode(decodeQ, decodeCache(), decodeIndptr, decodeIndices, decodeLastPage, tc.lg)
			for b := range tc.want {
				for h, w := range tc.want[b] {
					assert.InDeltaSlice(t, w.o, o[b][h], tol, "o[req %d, head %d]", b, h)
					assert.InDelta(t, w.lse, lse[b][h], tol, "lse[req %d, head %d]", b, h)
				}
			}
		})
	}
}

func TestMergeWorkedExample(t *testing.T) {
	inf := math.Inf(-1)
	tests := map[string]struct {
		va     []float64
		sa     float64
		vb     []float64
		sb     float64
		wantV  []float64
		wantS  float64
		wantNI bool // want s == -inf
	}{
		"weights 1/3, 2/3":   {[]float64{1, 0}, 1, []float64{0, 1}, 2, []float64{0.333333, 0.666667}, 2.584963, false},
		"-inf is identity":   {[]float64{7, 7}, inf, []float64{1, 2}, 0.5, []float64{1, 2}, 0.5, false},
		"identity, flipped":  {[]float64{1, 2}, 0.5, []float64{7, 7}, inf, []float64{1, 2}, 0.5, false},
		"both empty":         {[]float64{3, 3}, inf, []float64{4, 4}, inf, []float64{0, 0}, 0, true},
		"§3.6 prefix+suffix": {[]float64{0.268941, 0.537883, 1.537883, 1.075766}, 1.894636, []float64{2, 0, 0, 2}, 1.442695, []float64{1.0, 0.310725, 0.888406, 1.466087}, 2.686291, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			v, s := MergeState(tc.va, tc.sa, tc.vb, tc.sb)
			assert.InDeltaSlice(t, tc.wantV, v, tol)
			if tc.wantNI {
				assert.True(t, math.IsInf(s, -1), "s = %v, want -inf", s)
			} else {
				assert.InDelta(t, tc.wantS, s, tol)
			}
		})
	}
	v, s := MergeStates(nil, nil, 3)
	assert.Equal(t, []float64{0, 0, 0}, v)
	assert.True(t, math.IsInf(s, -1))
}

// TestPrefillWorkedExample is §7: one head, D=2, sm_scale=1, qo_len=2,
// kv_len=4 (page_size 4, one page), so the queries sit at positions 2 and 3.
func TestPrefillWorkedExample(t *testing.T) {
	c := PagedKV{Layout: layout.HND, Form: layout.Split, DType: layout.F32, NumPages: 1, PageSize: 4, NumKVHeads: 1, HeadDim: 2,
		K: f32bytes(1, 0, 0, 1, 1, 1, 0, 0),
		V: f32bytes(1, 0, 0, 1, 1, 1, 2, 2)}
	q := [][][]float64{{{1, 0}}, {{0, 1}}}
	tests := map[string]struct {
		causal bool
		window int
		want   [2]wantRow
	}{
		"non-causal":      {false, -1, [2]wantRow{{[]float64{1, 0.768941}, 2.894636}, {[]float64{0.768941, 1}, 2.894636}}},
		"causal":          {true, -1, [2]wantRow{{[]float64{0.844638, 0.577681}, 2.686291}, {[]float64{0.768941, 1}, 2.894636}}},
		"causal, w=1":     {true, 1, [2]wantRow{{[]float64{0.731059, 1}, 1.894636}, {[]float64{1.268941, 1.268941}, 1.894636}}},
		"non-causal, w=1": {false, 1, [2]wantRow{{[]float64{1, 1.211942}, 2.238262}, {[]float64{1.268941, 1.268941}, 1.894636}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o, lse := BatchPrefill(q, []int32{0, 2}, c, []int32{0, 1}, []int32{0}, []int32{4},
				Logits{SMScale: 1, WindowLeft: tc.window, Causal: tc.causal})
			for r, w := range tc.want {
				assert.InDeltaSlice(t, w.o, o[r][0], tol, "row %d o", r)
				assert.InDelta(t, w.lse, lse[r][0], tol, "row %d lse", r)
			}
		})
	}
}

// TestMLAWorkedExample is §5 (dims 4+2, sm_scale 0.5, page_size 2, pages
// [1, 0], kv_len 3), on both a fused and a split cache.
func TestMLAWorkedExample(t *testing.T) {
	ckv := [][]float64{{1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}}
	kpe := [][]float64{{1, 0}, {0, 1}, {1, 1}}
	slots := [][2]int{{1, 0}, {1, 1}, {0, 0}} // token -> (page, entry)
	fused := make([]float64, 2*2*6)
	splitC, splitK := make([]float64, 2*2*4), make([]float64, 2*2*2)
	for tkn, s := range slots {
		slot := s[0]*2 + s[1]
		copy(fused[slot*6:], ckv[tkn])
		copy(fused[slot*6+4:], kpe[tkn])
		copy(splitC[slot*4:], ckv[tkn])
		copy(splitK[slot*2:], kpe[tkn])
	}
	qNope := [][][]float64{{{1, 0, 0, 0}, {0, 0, 2, 0}}}
	qPE := [][][]float64{{{0, 1}, {1, 0}}}
	want := []wantRow{{[]float64{1.0 / 3, 1.0 / 3, 1.0 / 3, 0}, 2.306310}, {[]float64{0.231224, 0.140244, 0.628532, 0}, 2.833985}}
	for _, c := range []MLACache{
		{Form: layout.Fused, DType: layout.F32, PageSize: 2, DCKV: 4, DKPE: 2, Data: f32bytes(fused...)},
		{Form: layout.Split, DType: layout.F32, PageSize: 2, DCKV: 4, DKPE: 2, CKV: f32bytes(splitC...), KPE: f32bytes(splitK...)},
	} {
		o, lse := MLADecode(qNope, qPE, c, []int32{0, 2}, []int32{1, 0}, []int32{3}, 0.5)
		for h, w := range want {
			assert.InDeltaSlice(t, w.o, o[0][h], tol, "%v head %d", c.Form, h)
			assert.InDelta(t, w.lse, lse[0][h], tol, "%v head %d", c.Form, h)
		}
	}
}

// TestFloatDecoding pins the reference's own element decoders at their
// edges (so the model does not share a bug with layout's tables).
func TestFloatDecoding(t *testing.T) {
	tests := map[string]struct {
		dt   layout.DType
		bits []byte
		want float64
	}{
		"f16 1.0":            {layout.F16, []byte{0x00, 0x3c}, 1},
		"f16 -2.5":           {layout.F16, []byte{0x00, 0xc1}, -2.5},
		"f16 max 65504":      {layout.F16, []byte{0xff, 0x7b}, 65504},
		"f16 min subnormal":  {layout.F16, []byte{0x01, 0x00}, math.Ldexp(1, -24)},
		"f16 -inf":           {layout.F16, []byte{0x00, 0xfc}, math.Inf(-1)},
		"f16 1.1513671875":   {layout.F16, []byte{0x9b, 0x3c}, 1.1513671875}, // §3.6 hex 3c9b
		"bf16 1.0":           {layout.BF16, []byte{0x80, 0x3f}, 1},
		"bf16 -3.0":          {layout.BF16, []byte{0x40, 0xc0}, -3},
		"e4m3 1.0":           {layout.E4M3, []byte{0x38}, 1},
		"e4m3 max 448":       {layout.E4M3, []byte{0x7e}, 448},
		"e4m3 min subnormal": {layout.E4M3, []byte{0x01}, math.Ldexp(1, -9)},
		"e4m3 -0.5":          {layout.E4M3, []byte{0xb0}, -0.5},
		"e5m2 1.0":           {layout.E5M2, []byte{0x3c}, 1},
		"e5m2 max 57344":     {layout.E5M2, []byte{0x7b}, 57344},
		"e5m2 min subnormal": {layout.E5M2, []byte{0x01}, math.Ldexp(1, -16)},
		"e5m2 +inf":          {layout.E5M2, []byte{0x7c}, math.Inf(1)},
		"f32 0.1 (rounded)":  {layout.F32, f32bytes(0.1), float64(float32(0.1))},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			require.Equal(t, tc.want, Float(tc.dt, tc.bits, 0))
		})
	}
	assert.True(t, math.IsNaN(Float(layout.E4M3, []byte{0x7f}, 0)), "e4m3 S.1111.111 is NaN")
	assert.True(t, math.IsNaN(Float(layout.F16, []byte{0x01, 0x7c}, 0)))
}

// TestCascadeEqualsFlat checks the cascade model against the prefill model
// on the §3.6 cache: request 0's first page as a shared level, the rest as
// the last level, must equal plain decode.
func TestCascadeEqualsFlat(t *testing.T) {
	c := decodeCache()
	levels := []CascadeLevel{
		{QOIndptr: []int32{0, 1}, KVIndptr: []int32{0, 1}, KVPageIndices: []int32{3}, KVLastPageLen: []int32{2}},
		{QOIndptr: []int32{0, 1}, KVIndptr: []int32{0, 1}, KVPageIndices: []int32{0}, KVLastPageLen: []int32{1}},
	}
	lg := Logits{SMScale: 0.5, WindowLeft: -1, Causal: true}
	o, lse := Cascade(decodeQ[:1], levels, c, lg)
	wo, wl := BatchDecode(decodeQ[:1], c, decodeIndptr[:2], decodeIndices, decodeLastPage, lg)
	for h := 0; h < 2; h++ {
		assert.InDeltaSlice(t, wo[0][h], o[0][h], 1e-12)
		assert.InDelta(t, wl[0][h], lse[0][h], 1e-12)
	}
}

// An attention sink is one more logit of the softmax with value zero: one
// key of logit 0 and value 2 beside a sink of ln 3 gives o = 2*1/(1+3) =
// 0.5 and lse = log2(1+3) = 2; with no key the row is o = 0, lse =
// ln 3/ln 2; a sink of -inf is no sink.
func TestAttendSinkWorkedExample(t *testing.T) {
	keys, vals := [][]float64{{0}}, [][]float64{{2}}
	o, lse := AttendSink([]float64{1}, keys, vals, []bool{true}, 1, 0, 1, math.Log(3))
	if math.Abs(o[0]-0.5) > 1e-15 || math.Abs(lse-2) > 1e-15 {
		t.Fatalf("o = %v lse = %v, want [0.5] 2", o, lse)
	}
	o, lse = AttendSink([]float64{1}, keys, vals, []bool{false}, 1, 0, 1, math.Log(3))
	if o[0] != 0 || math.Abs(lse-math.Log2(3)) > 1e-15 {
		t.Fatalf("no visible key: o = %v lse = %v, want [0] log2(3)", o, lse)
	}
	o, lse = AttendSink([]float64{1}, keys, vals, []bool{true}, 1, 0, 1, math.Inf(-1))
	if o[0] != 2 || lse != 0 {
		t.Fatalf("sink -inf: o = %v lse = %v, want [2] 0", o, lse)
	}
}
