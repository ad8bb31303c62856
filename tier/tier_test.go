package tier

import (
	"math"
	"math/big"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/layout"
)

func TestDigestChain(t *testing.T) {
	// Field boundaries are part of the encoding.
	require.NotEqual(t, NamespaceRoot("ab", "c", ""), NamespaceRoot("a", "bc", ""))
	require.NotEqual(t, NamespaceRoot("", "x", ""), NamespaceRoot("", "", "x"))
	root := NamespaceRoot("t", "", "")
	a := Next(nil, root, []int32{1, 2, 3, 4})
	require.Equal(t, a, Next(make([]byte, 0, 200), root, []int32{1, 2, 3, 4}), "deterministic, scratch or not")
	require.NotEqual(t, a, Next(nil, root, []int32{1, 2, 3, 5}))
	require.NotEqual(t, a, Next(nil, NamespaceRoot("u", "", ""), []int32{1, 2, 3, 4}))
	require.NotEqual(t, Next(nil, a, []int32{1}), Next(nil, root, []int32{1}), "the parent is part of the digest")
	// Pinned value, computed independently (Python hashlib over the encoding
	// in the package doc): replicas on other builds must compute the same names.
	require.Equal(t, "bdaba087", Next(nil, NamespaceRoot("", "", ""), []int32{0, 1, 2, 3}).String()[:8])
	buf := make([]byte, 0, 128)
	require.Zero(t, testing.AllocsPerRun(100, func() { Next(buf, root, []int32{1, 2, 3, 4}) }))
}

func TestPageFormat(t *testing.T) {
	f := PageFormat{Layout: layout.HND, DType: layout.BF16, PageSize: 16, NumKVHeads: 2, HeadDim: 64, Layers: 3}
	require.NoError(t, f.Validate())
	require.Equal(t, 16*2*64*2, f.PlaneBytes())
	require.Equal(t, 6*f.PlaneBytes(), f.PageBytes())
	require.Equal(t, 4*f.PlaneBytes(), f.LayerOffset(2))
	for _, bad := range []PageFormat{
		{Layout: 7, DType: layout.F16, PageSize: 1, NumKVHeads: 1, HeadDim: 1, Layers: 1},
		{Layout: layout.NHD, DType: layout.I8, PageSize: 1, NumKVHeads: 1, HeadDim: 1, Layers: 1},
		{Layout: layout.NHD, DType: layout.F16, PageSize: 0, NumKVHeads: 1, HeadDim: 1, Layers: 1},
	} {
		require.ErrorIs(t, bad.Validate(), ErrBadFormat, "%+v", bad)
	}
	for _, bad := range []PageFormat{
		{Layout: layout.NHD, DType: layout.F32, PageSize: 1 << 12, NumKVHeads: 64, HeadDim: 256, Layers: 80},
		// Issue 28: products that wrap int64 (PageBytes() was 0 with 16
		// layers, -2^63 with 3) passed.
		{Layout: layout.NHD, DType: layout.F16, PageSize: 1, NumKVHeads: 1 << 30, HeadDim: 1 << 30, Layers: 16},
		{Layout: layout.NHD, DType: layout.F16, PageSize: 1, NumKVHeads: 1 << 30, HeadDim: 1 << 30, Layers: 3},
		{Layout: layout.HND, DType: layout.E4M3, PageSize: 1 << 31, NumKVHeads: 1 << 31, HeadDim: 1 << 31, Layers: 1 << 31},
		{Layout: layout.HND, DType: layout.BF16, PageSize: math.MaxInt, NumKVHeads: math.MaxInt, HeadDim: math.MaxInt, Layers: math.MaxInt},
	} {
		err := bad.Validate()
		require.ErrorIs(t, err, ErrBadFormat, "%+v", bad)
		require.Contains(t, err.Error(), "layers "+strconv.Itoa(bad.Layers), "the error names the values")
		require.Contains(t, err.Error(), "kv heads "+strconv.Itoa(bad.NumKVHeads), "the error names the values")
	}
}

// Validate accepts exactly the formats whose page fits MaxPageBytes,
// against a big.Int product (no overflow possible), and PageBytes is that
// product for every accepted one.
func TestPageFormatBoundRandomized(t *testing.T) {
	rng := rand.New(rand.NewPCG(28, 4))
	dtypes := []layout.DType{layout.F32, layout.F16, layout.BF16, layout.E4M3, layout.E5M2}
	dim := func() int {
		switch rng.IntN(4) {
		case 0:
			return 1 + rng.IntN(64)
		case 1:
			return 1 << rng.IntN(63)
		case 2:
			return math.MaxInt - rng.IntN(3)
		default:
			return 1 + rng.IntN(1<<20)
		}
	}
	accepted := 0
	for range 20000 {
		f := PageFormat{Layout: layout.NHD, DType: dtypes[rng.IntN(len(dtypes))],
			PageSize: dim(), NumKVHeads: dim(), HeadDim: dim(), Layers: dim()}
		want := big.NewInt(2 * int64(f.DType.Size()))
		for _, d := range []int{f.PageSize, f.NumKVHeads, f.HeadDim, f.Layers} {
			want.Mul(want, big.NewInt(int64(d)))
		}
		fits := want.Cmp(big.NewInt(MaxPageBytes)) <= 0
		err := f.Validate()
		require.Equal(t, fits, err == nil, "%+v: %d bytes, Validate: %v", f, want, err)
		if fits {
			accepted++
			require.EqualValues(t, want.Int64(), f.PageBytes(), "%+v", f)
		}
	}
	require.Greater(t, accepted, 100, "the generator must reach accepted formats too")
}
