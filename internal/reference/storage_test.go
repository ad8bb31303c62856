package reference

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/layout"
)

// The worked example of flashinfer-semantics §1.4: P=6, N=4, H=2, D=64, fp16,
// page 3, entry 1, head 1, feature 5.
func TestLocateWorkedOffsets(t *testing.T) {
	for _, tc := range []struct {
		name       string
		layout     layout.KVLayout
		form       layout.TensorForm
		kElem      int64
		vElem      int64
		vInKBuffer bool
	}{
		{"5-D NHD [6,2,4,2,64]", layout.NHD, layout.Fused, 3269, 3781, true},
		{"5-D HND [6,2,2,4,64]", layout.HND, layout.Fused, 3397, 3909, true},
		{"tuple NHD [6,4,2,64]", layout.NHD, layout.Split, 1733, 1733, false},
		{"tuple HND [6,2,4,64]", layout.HND, layout.Split, 1861, 1861, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := PagedKV{Layout: tc.layout, Form: tc.form, DType: layout.F16, NumPages: 6, PageSize: 4, NumKVHeads: 2, HeadDim: 64,
				Data: []byte("d"), K: []byte("k"), V: []byte("v")}
			kb, k := c.Locate(Slot{0, 3, 1, 1, 5})
			vb, v := c.Locate(Slot{1, 3, 1, 1, 5})
			assert.Equal(t, tc.kElem, k, "K element")
			assert.Equal(t, tc.vElem, v, "V element")
			assert.Equal(t, 2*tc.kElem, k*int64(c.DType.Size()), "K byte")
			if tc.vInKBuffer {
				assert.Equal(t, "d", string(kb))
				assert.Equal(t, "d", string(vb))
			} else {
				assert.Equal(t, "k", string(kb))
				assert.Equal(t, "v", string(vb))
			}
		})
	}
}

func TestFlatIndexPanicsOutsideShape(t *testing.T) {
	assert.Equal(t, int64(1*12+2*4+3), FlatIndex([]int{2, 3, 4}, []int{1, 2, 3}))
	assert.Panics(t, func() { FlatIndex([]int{2, 3}, []int{0, 3}) })
	assert.Panics(t, func() { FlatIndex([]int{2, 3}, []int{0}) })
}

// The worked append of flashinfer-semantics §2.3: N=2, kv_indptr=[0,2,4],
// kv_indices=[3,0,2,1], rows (b,pos) = (0,3), (1,2), (1,3) land in
// (page 0, entry 1), (page 1, entry 0), (page 1, entry 1).
func TestAppendWorkedExample(t *testing.T) {
	c := PagedKV{Layout: layout.NHD, Form: layout.Fused, DType: layout.U8, NumPages: 4, PageSize: 2, NumKVHeads: 1, HeadDim: 1,
		Data: make([]byte, 4*2*2)}
	Append(c, AppendInput{
		Key: []byte{10, 11, 12}, Value: []byte{20, 21, 22}, SrcDType: layout.U8,
		BatchIndices: []int32{0, 1, 1}, Positions: []int32{3, 2, 3},
		KVIndptr: []int32{0, 2, 4}, KVPageIndices: []int32{3, 0, 2, 1},
	})
	// [page][K entries, V entries]
	assert.Equal(t, []byte{
		0, 10, 0, 20, // page 0: K entry 1, V entry 1
		11, 12, 21, 22, // page 1
		0, 0, 0, 0,
		0, 0, 0, 0,
	}, c.Data)
	got := GatherBytes(c, []int32{0, 2, 4}, []int32{3, 0, 2, 1}, 1, 4)
	assert.Equal(t, TokenBytes{K: []byte{11}, V: []byte{21}}, got[2])
	assert.Equal(t, TokenBytes{K: []byte{12}, V: []byte{22}}, got[3])
}

func TestMLAAppendFusedAndSplitAgree(t *testing.T) {
	const P, N, DC, DK = 3, 2, 4, 2
	fused := MLACache{Form: layout.Fused, DType: layout.U8, PageSize: N, DCKV: DC, DKPE: DK, Data: make([]byte, P*N*(DC+DK))}
	split := MLACache{Form: layout.Split, DType: layout.U8, PageSize: N, DCKV: DC, DKPE: DK, CKV: make([]byte, P*N*DC), KPE: make([]byte, P*N*DK)}
	in := MLAAppendInput{
		CKV: []byte{1, 2, 3, 4, 5, 6, 7, 8}, KPE: []byte{9, 10, 11, 12},
		BatchIndices: []int32{0, 0}, Positions: []int32{1, 2},
		KVIndptr: []int32{0, 2}, KVPageIndices: []int32{2, 0},
	}
	MLAAppend(fused, in)
	MLAAppend(split, in)
	// Token 1 is page 2 entry 1; token 2 is page 0 entry 0.
	assert.Equal(t, []byte{
		5, 6, 7, 8, 11, 12, 0, 0, 0, 0, 0, 0, // page 0
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // page 1
		0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 9, 10, // page 2
	}, fused.Data)
	require.Equal(t, 3, fused.MLANumPages())
	require.Equal(t, 3, split.MLANumPages())
	assert.Equal(t, MLAGatherBytes(fused, in.KVIndptr, in.KVPageIndices, 0, 3), MLAGatherBytes(split, in.KVIndptr, in.KVPageIndices, 0, 3))
}

func TestEncodeKnownValues(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		dt   layout.DType
		x    float64
		sat  bool
		want uint32
	}{
		{layout.F16, 1, false, 0x3c00},
		{layout.F16, 65504, false, 0x7bff},
		{layout.F16, 65519.99, false, 0x7bff},
		{layout.F16, 65520, false, 0x7c00}, // tie goes to the even (infinite) code
		{layout.F16, -65520, true, 0xfbff},
		{layout.F16, math.Ldexp(1, -24), false, 0x0001},
		{layout.F16, math.Ldexp(1, -25), false, 0x0000}, // tie with zero
		{layout.F16, math.Ldexp(3, -25), false, 0x0002}, // 1.5 ulps: tie goes to even 2
		{layout.F16, -nan, false, 0xfe00},
		{layout.BF16, 1 + math.Ldexp(1, -8), false, 0x3f80}, // tie to even
		{layout.BF16, 1 + math.Ldexp(3, -8), false, 0x3f82},
		{layout.BF16, -nan, false, 0x7fc0},
		{layout.E4M3, 448, false, 0x7e},
		{layout.E4M3, 464, false, 0x7e},
		{layout.E4M3, 464.01, false, 0x7f}, // past 448: NaN, e4m3fn has no inf
		{layout.E4M3, -500, true, 0xfe},
		{layout.E4M3, math.Inf(1), false, 0x7f},
		{layout.E4M3, math.Inf(-1), true, 0xfe},
		{layout.E4M3, math.Ldexp(1, -9), false, 0x01},
		{layout.E4M3, -nan, false, 0xff},
		{layout.E5M2, 57344, false, 0x7b},
		{layout.E5M2, 61440, false, 0x7c},
		{layout.E5M2, 61440, true, 0x7b},
		{layout.E5M2, math.Inf(-1), false, 0xfc},
		{layout.E5M2, nan, false, 0x7f},
		{layout.E5M2, math.Ldexp(1, -16), false, 0x01},
	} {
		assert.Equalf(t, tc.want, Encode(tc.dt, tc.x, tc.sat), "Encode(%v, %v, sat=%v)", tc.dt, tc.x, tc.sat)
	}
}

// Encode and the decoder Float agree on every finite code: decoding a code
// and encoding the value gives the code back.
func TestEncodeInvertsFloat(t *testing.T) {
	for _, dt := range []layout.DType{layout.F16, layout.BF16, layout.E4M3, layout.E5M2} {
		n := 1 << (8 * dt.Size())
		buf := make([]byte, dt.Size())
		for code := 0; code < n; code++ {
			putBits(buf, uint32(code))
			x := Float(dt, buf, 0)
			if math.IsNaN(x) || math.IsInf(x, 0) {
				continue
			}
			if got := Encode(dt, x, false); got != uint32(code) {
				t.Fatalf("%v: code %#x decodes to %v, which encodes to %#x", dt, code, x, got)
			}
		}
	}
}
