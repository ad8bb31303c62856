package redis

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/pagedkv/pagedkv/internal/redistest"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/tier"
)

// BenchmarkStoreThroughput: pages per second and bytes per second of the
// Redis tier, in one run against its baseline: raw pipelined SET/GET of
// the same value bytes under the same keys with the same client. The gap
// is what encoding, verification and the write queue cost. A page is 16
// tokens x 8 K/V heads x 128 x f16 x 4 layers (256 KiB); lookups fetch 16
// pages in one pipeline, as a prefix lookup does.
func BenchmarkStoreThroughput(b *testing.B) {
	srv := redistest.Start(b, "--maxmemory", "512mb", "--maxmemory-policy", "allkeys-lru")
	f := tier.PageFormat{Layout: layout.NHD, DType: layout.F16, PageSize: 16, NumKVHeads: 8, HeadDim: 128, Layers: 4}
	s, err := New(Config{Addr: srv.Addr(), Namespace: "bench", Format: f, QueueLen: 64})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const n = 16
	pages := chain(rand.New(rand.NewPCG(1, 1)), f, "", n)
	keys := make([]string, n)
	vals := make([][]byte, n)
	for i := range pages {
		keys[i] = s.Key(&pages[i])
		vals[i], _ = Encode(nil, f, "bench", DefaultGroup, &pages[i])
	}
	ctx := context.Background()
	c := s.Client()
	perPage := func(b *testing.B) {
		b.SetBytes(int64(n * f.PageBytes()))
		b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "pages/s")
	}
	b.Run("store", func(b *testing.B) {
		dropped := s.Stats().Dropped
		for range b.N {
			for i := range pages {
				for !s.Store(&pages[i]) { // every buffer in use: let the writer catch up
					time.Sleep(20 * time.Microsecond)
				}
			}
		}
		flush(b, s)
		perPage(b)
		// Store's drops while the queue was full were retried.
		b.ReportMetric(float64(s.Stats().Dropped-dropped)/float64(b.N*n), "retries/page")
	})
	b.Run("raw-set", func(b *testing.B) {
		for range b.N {
			pipe := c.Pipeline()
			for i := range keys {
				pipe.Set(ctx, keys[i], vals[i], 0)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
		perPage(b)
	})
	got := asked(pages)
	b.Run("fetch", func(b *testing.B) {
		for range b.N {
			if k := s.Fetch(ctx, got); k != n {
				b.Fatalf("fetched %d of %d", k, n)
			}
		}
		perPage(b)
	})
	b.Run("raw-get", func(b *testing.B) {
		cmds := make([]*goredis.StringCmd, n)
		for range b.N {
			pipe := c.Pipeline()
			for i := range keys {
				cmds[i] = pipe.Get(ctx, keys[i])
			}
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
			for i := range cmds {
				v, err := cmds[i].Bytes()
				if err != nil {
					b.Fatal(err)
				}
				copy(got[i].Data, v[len(v)-crcBytes-f.PageBytes():]) // the copy Fetch makes too
			}
		}
		perPage(b)
	})
}
