package layout_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/layout"
)

// The NVFP4 worked example (docs/layout.md, "NVFP4"), written by hand from
// page.cuh's layout description: P=6, N=4, H=2, D=64; the data tensor is the
// cache's shape with the last dimension D/2 = 32 (uint8, element 2i in the
// low nibble of byte i), kv_cache_sf the same with D/16 = 4 (e4m3, byte b
// scales elements 16b..16b+15). Element K/V[page 3, entry 1, head 1, feat
// 37] is the high nibble (37 is odd) of data byte 18 of its row and uses
// scale byte 2 of its row.
func TestNVFP4WorkedOffsets(t *testing.T) {
	table := []struct {
		name               string
		layout             layout.KVLayout
		form               layout.TensorForm
		dataShape, sfShape []int
		kByte, kSF         int64 // K's data byte and scale byte
		vByte, vSF         int64
	}{
		// 5-D NHD [6,2,4,2,32]: K row (3,0,1,1) = ((3*2+0)*4+1)*2+1 = 51, byte 51*32+18; scale 51*4+2.
		{"5-D NHD", layout.NHD, layout.Fused, []int{6, 2, 4, 2, 32}, []int{6, 2, 4, 2, 4}, 1650, 206, 1906, 238},
		// 5-D HND [6,2,2,4,32]: K row (3,0,1,1) = ((3*2+0)*2+1)*4+1 = 53.
		{"5-D HND", layout.HND, layout.Fused, []int{6, 2, 2, 4, 32}, []int{6, 2, 2, 4, 4}, 1714, 214, 1970, 246},
		// K/V pair NHD [6,4,2,32]: row (3,1,1) = (3*4+1)*2+1 = 27.
		{"tuple NHD", layout.NHD, layout.Split, []int{6, 4, 2, 32}, []int{6, 4, 2, 4}, 882, 110, 882, 110},
		// K/V pair HND [6,2,4,32]: row (3,1,1) = (3*2+1)*4+1 = 29.
		{"tuple HND", layout.HND, layout.Split, []int{6, 2, 4, 32}, []int{6, 2, 4, 4}, 946, 118, 946, 118},
	}
	for _, tc := range table {
		t.Run(tc.name, func(t *testing.T) {
			g := layout.Paged{Layout: tc.layout, Form: tc.form, DType: layout.NVFP4, NumPages: 6, PageSize: 4, NumKVHeads: 2, HeadDim: 64}
			require.NoError(t, g.Validate())
			assert.Equal(t, tc.dataShape, g.DataShape())
			assert.Equal(t, tc.sfShape, g.ScaleShape())
			k, v := g.KOffset(3, 1, 1, 37), g.VOffset(3, 1, 1, 37)
			assert.Equal(t, tc.kByte, g.DataOffset(k-1), "K data byte (of the even element 36, whose byte holds 37)")
			assert.Equal(t, tc.vByte, g.DataOffset(v-1), "V data byte")
			assert.Equal(t, tc.kSF, g.ScaleOffset(k-5), "K scale byte (block 32..47)")
			assert.Equal(t, tc.vSF, g.ScaleOffset(v-5), "V scale byte")
			n := int64(6 * 2 * 4 * 2 * 64)
			if tc.form == layout.Split {
				n /= 2
			}
			assert.Equal(t, n/2, g.DataBytes())
			assert.Equal(t, n/16, g.ScaleBytes())
			assert.Equal(t, 32, g.RowBytes())
		})
	}
	f16 := layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F16, NumPages: 6, PageSize: 4, NumKVHeads: 2, HeadDim: 64}
	assert.Equal(t, int64(6*2*4*2*64*2), f16.DataBytes())
	assert.Zero(t, f16.ScaleBytes())
	assert.Nil(t, f16.ScaleShape())
	assert.Equal(t, f16.Shape(), f16.DataShape())
}

// A block of NVFP4 bytes written by hand: values 2*e2m1(c) for c = 0..15
// under global scale 1 have amax 12, block scale 12/6 = 2 (e4m3 0x40) and
// codes c, so the data bytes are c(2i) | c(2i+1)<<4.
func TestNVFP4WorkedBytes(t *testing.T) {
	codes := []byte{0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE}
	got := make([]float32, 16)
	layout.LoadRowNVFP4(got, codes, []byte{0x40})
	want := []float32{0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}
	assert.Equal(t, want, got)
	assert.True(t, math.Signbit(float64(got[8])), "code 0x8 is negative zero")
}

func TestNVFP4Validate(t *testing.T) {
	g := layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.NVFP4, NumPages: 1, PageSize: 1, NumKVHeads: 1, HeadDim: 24}
	err := g.Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "head_dim 24")
	g.HeadDim = 16
	require.NoError(t, g.Validate())
	dt, err := layout.ParseDType("nvfp4")
	require.NoError(t, err)
	assert.Equal(t, layout.NVFP4, dt)
	assert.Equal(t, "nvfp4", dt.String())
	assert.False(t, dt.IsFloat(), "nvfp4 is a cache dtype, not an activation or MLA dtype")
	assert.Zero(t, dt.Size())
}

// Every e2m1 code decodes to its value and encodes back to itself; between
// codes, the encoder picks the nearest value with ties to the even mantissa
// (checked on each midpoint and one float32 step either side of it).
func TestE2M1AllCodes(t *testing.T) {
	want := []float64{0, 0.5, 1, 1.5, 2, 3, 4, 6}
	for c := uint8(0); c < 16; c++ {
		v := layout.E2M1ToF32(c)
		w := want[c&7]
		if c&8 != 0 {
			w = -w
		}
		require.Equal(t, w, float64(v), "code %#x", c)
		require.Equal(t, c&8 != 0, math.Signbit(float64(v)), "code %#x sign", c)
		require.Equal(t, c, layout.F32ToE2M1(v), "code %#x round trip", c)
	}
	for c := uint8(0); c < 7; c++ {
		mid := float32((want[c] + want[c+1]) / 2)
		even := c
		if c&1 == 1 {
			even = c + 1
		}
		for _, s := range []float32{1, -1} {
			sign := uint8(0)
			if s < 0 {
				sign = 8
			}
			assert.Equal(t, sign|even, layout.F32ToE2M1(s*mid), "midpoint %v", s*mid)
			assert.Equal(t, sign|c, layout.F32ToE2M1(s*math.Nextafter32(mid, 0)), "below %v", s*mid)
			assert.Equal(t, sign|(c+1), layout.F32ToE2M1(s*math.Nextafter32(mid, 10)), "above %v", s*mid)
		}
	}
	assert.Equal(t, uint8(7), layout.F32ToE2M1(float32(math.Inf(1))))
	assert.Equal(t, uint8(0xf), layout.F32ToE2M1(float32(math.Inf(-1))))
	assert.Equal(t, uint8(0xf), layout.F32ToE2M1(-1e30))
	assert.Equal(t, uint8(0), layout.F32ToE2M1(float32(math.NaN())))
	assert.Equal(t, uint8(0), layout.F32ToE2M1(-float32(math.NaN())))
	assert.Equal(t, uint8(8), layout.F32ToE2M1(-1e-30), "a negative value rounding to zero keeps its sign")
}
