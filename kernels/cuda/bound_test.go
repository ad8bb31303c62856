package cuda

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/pagedkv/pagedkv/layout"
)

// The bandwidth model against docs/kernels.md's table (one layer, f16,
// H=8, D=128): decode B=64 x 4096 keys with Hq=32 reads 1.07 GB, 320 us at
// 3.35 TB/s; an fp8 cache half that; a 64-token append writes 256 KiB.
func TestCacheBytesModel(t *testing.T) {
	g := layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F16, NumPages: 1, PageSize: 16, NumKVHeads: 8, HeadDim: 128}
	lens := make([]int, 64)
	for i := range lens {
		lens[i] = 4096
	}
	b := DecodeCacheBytes(g, 32, lens, -1)
	assert.Equal(t, int64(64*4096*4096), b)
	assert.InDelta(t, 320*time.Microsecond, Bound(b, H100Bandwidth), float64(time.Microsecond))
	g.DType = layout.E4M3
	assert.Equal(t, b/2, DecodeCacheBytes(g, 32, lens, -1))
	assert.Equal(t, b/2/4096*100, DecodeCacheBytes(g, 32, lens, 99), "a window of 100 keys")
	assert.Equal(t, 2*b/2, DecodeCacheBytes(g, 128, lens, -1), "group 16 reads every row twice")
	g.DType = layout.F16
	assert.Equal(t, int64(256<<10), AppendCacheBytes(g, 64))
}
