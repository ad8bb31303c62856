package kernelstest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// TestCacheDiffNaNCodes: in an fp8 cache every NaN code matches every other
// (the GPU's 0x7F against the CPU's 0xFF for a negative NaN input), and a
// NaN never matches a number; other dtypes compare bytes.
func TestCacheDiffNaNCodes(t *testing.T) {
	for _, c := range []struct {
		dt        layout.DType
		got, want byte
		equal     bool
	}{
		{layout.E4M3, 0x7f, 0xff, true},
		{layout.E4M3, 0xff, 0x7f, true},
		{layout.E4M3, 0x7e, 0x7f, false}, // 448 is not NaN
		{layout.E4M3, 0x00, 0xff, false},
		{layout.E5M2, 0x7f, 0xff, true},
		{layout.E5M2, 0x7d, 0xfe, true},
		{layout.E5M2, 0x7c, 0x7f, false}, // +inf is not NaN
		{layout.E5M2, 0xfc, 0x7c, false}, // -inf, +inf
	} {
		g := layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: c.dt, NumPages: 1, PageSize: 1, NumKVHeads: 1, HeadDim: 2}
		got, err := kernels.NewPagedKVCache(g)
		require.NoError(t, err)
		want, err := kernels.NewPagedKVCache(g)
		require.NoError(t, err)
		got.Data[1], want.Data[1] = c.got, c.want
		d := CacheDiff(&got, &want)
		require.Equal(t, c.equal, d == "", "%v got %#x want %#x: %q", c.dt, c.got, c.want, d)
	}
	g := layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F16, NumPages: 1, PageSize: 1, NumKVHeads: 1, HeadDim: 1}
	got, _ := kernels.NewPagedKVCache(g)
	want, _ := kernels.NewPagedKVCache(g)
	got.Data[0], got.Data[1] = 0x00, 0x7e // f16 NaN 0x7E00
	want.Data[0], want.Data[1] = 0xff, 0x7f
	require.NotEmpty(t, CacheDiff(&got, &want), "f16 compares bytes")
}
