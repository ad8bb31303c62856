package tier

import (
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
		{Layout: layout.NHD, DType: layout.F32, PageSize: 1 << 12, NumKVHeads: 64, HeadDim: 256, Layers: 80},
	} {
		require.ErrorIs(t, bad.Validate(), ErrBadFormat, "%+v", bad)
	}
}
