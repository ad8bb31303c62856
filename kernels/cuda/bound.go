package cuda

import (
	"time"

	"github.com/pagedkv/pagedkv/layout"
)

// H100Bandwidth is the HBM3 bandwidth of an H100 SXM5 in bytes per second:
// the physical limit the benchmarks state their bound at (an H100 PCIe has
// 2.0e12, an H200 4.8e12).
const H100Bandwidth = 3.35e12

// DecodeCacheBytes is what one batch decode must read from the cache: the K
// and V rows (every kv head) of every key a request sees, seqLens[b] keys
// for request b with the window applied (windowLeft < 0: none). The
// kernels read each row once per block of up to 8 query heads of a GQA
// group, so groups above 8 read it ceil(group/8) times.
func DecodeCacheBytes(g layout.Paged, numQOHeads int, seqLens []int, windowLeft int) int64 {
	group := numQOHeads / max(g.NumKVHeads, 1)
	perKey := 2 * int64(g.NumKVHeads) * int64(tileRowBytes(g)) * int64((group+decodeMaxWarps-1)/decodeMaxWarps)
	var keys int64
	for _, n := range seqLens {
		if windowLeft >= 0 {
			n = min(n, windowLeft+1)
		}
		keys += int64(n)
	}
	return keys * perKey
}

// AppendCacheBytes is what an append of nnz tokens writes into the cache:
// one K and one V row of every kv head per token.
func AppendCacheBytes(g layout.Paged, nnz int) int64 {
	return 2 * int64(nnz) * int64(g.NumKVHeads) * int64(tileRowBytes(g))
}

// Bound is the shortest time moving bytes takes at bandwidth bytes per
// second.
func Bound(bytes int64, bandwidth float64) time.Duration {
	return time.Duration(float64(bytes) / bandwidth * 1e9)
}
