package replay

import (
	"fmt"
	"testing"

	"github.com/pagedkv/pagedkv/evict"
)

// BenchmarkReplay replays the whole conversation trace one request at a
// time through the Manager at 10% capacity under each policy, with full
// 512-token pages and with 16-token pages (Config.PageTokens), and reports
// block lookups (prompt blocks admitted) per second; beside it, in the
// same run, the floor of any block-level replay: the unlimited-capacity
// count over the same stream (one map probe per block) and Belady's
// optimum (one heap operation per block).
func BenchmarkReplay(b *testing.B) {
	tr := conversation(b)
	capacity := tr.DistinctBlocks / 10
	perSec := func(b *testing.B, blocks int) {
		b.ReportMetric(float64(blocks)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
	}
	for _, pageTokens := range []int{512, 16} {
		for _, policy := range evict.Names() {
			b.Run(fmt.Sprintf("manager/page-tokens=%d/%s", pageTokens, policy), func(b *testing.B) {
				b.ReportAllocs()
				for range b.N {
					if _, err := Run(tr, Config{CapacityPages: capacity, Eviction: policy, PageTokens: pageTokens}); err != nil {
						b.Fatal(err)
					}
				}
				perSec(b, tr.References)
			})
		}
	}
	s := TraceStream(tr)
	b.Run("baseline/unlimited-map", func(b *testing.B) {
		for range b.N {
			Unlimited(s)
		}
		perSec(b, tr.References)
	})
	b.Run("baseline/belady", func(b *testing.B) {
		for range b.N {
			Belady(s, capacity)
		}
		perSec(b, tr.References)
	})
}
