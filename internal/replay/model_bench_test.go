package replay

import (
	"fmt"
	"testing"
)

// BenchmarkReplayModel replays the whole conversation trace through the
// qwen3-next-like HybridManager at 25% capacity (LRU, 16-token pages),
// with and without a state checkpoint every 8 pages.
func BenchmarkReplayModel(b *testing.B) {
	tr := conversation(b)
	for _, every := range []int{0, 8} {
		b.Run(fmt.Sprintf("qwen3-next-like/every=%d", every), func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if _, err := Run(tr, Config{CapacityPages: tr.DistinctBlocks / 4, Eviction: "lru", PageTokens: 16,
					Model: "qwen3-next-like", StateCheckpointPages: every}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(tr.References)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}
