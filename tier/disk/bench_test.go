package disk

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/tier"
)

// benchFormat is a 256 KiB page: 16 tokens, 8 KV heads of 128, 4 layers,
// f16.
var benchFormat = tier.PageFormat{Layout: layout.NHD, DType: layout.F16, PageSize: 16, NumKVHeads: 8, HeadDim: 128, Layers: 4}

const (
	benchPages = 256 // store capacity: 64 MiB of K/V
	benchChain = 16  // pages per lookup
)

// benchPagesOf builds n distinct pages in chains of benchChain (no shared
// prefixes: every page is stored, and a chain's pages sit in consecutive
// slots).
func benchPagesOf(n int) []tier.RemotePage {
	pages := make([]tier.RemotePage, 0, n)
	root := tier.NamespaceRoot("", "", "")
	for i := range n {
		parent := root
		if i%benchChain != 0 {
			parent = pages[i-1].Digest
		}
		toks := make([]int32, benchFormat.PageSize)
		for k := range toks {
			toks[k] = int32(i*benchFormat.PageSize + k)
		}
		d := tier.Next(nil, parent, toks)
		pages = append(pages, tier.RemotePage{Digest: d, Parent: parent, Tokens: toks, Data: contentOf(benchFormat, d)})
	}
	return pages
}

// BenchmarkThroughput compares the disk tier's page writes (Store, the
// background writer, Flush) and reads (Fetch of 16-page chains: one pread
// per run of slots, checksums, verification, the copy out) with a plain
// sequential file write and read of the same bytes in page-sized calls on
// the same filesystem. Each iteration does a batch on both sides, one
// after the other, so that both see the same machine (a shared machine's
// load varies by the second): the metrics are each side's MB/s over the
// run and tier/file, the disk tier's share of the baseline. "cached"
// leaves the bytes in the page cache on both sides (no fsync); "sync"
// fsyncs every 64 pages on both sides.
func BenchmarkThroughput(b *testing.B) {
	pages := benchPagesOf(2 * benchPages) // twice the capacity: writes evict
	pageBytes := benchFormat.PageBytes()
	const batch = 32
	for _, mode := range []struct {
		name      string
		syncEvery int
	}{{"cached", -1}, {"sync", 64}} {
		b.Run("write/"+mode.name, func(b *testing.B) {
			cfg := Config{Dir: b.TempDir(), Namespace: testNamespace, Format: benchFormat, Pages: benchPages, SegmentPages: 64, QueueLen: batch, SyncEvery: mode.syncEvery}
			s := openStore(b, cfg)
			defer s.Close()
			f := benchFile(b, benchPages*pageBytes)
			defer f.Close()
			alternate(b, int64(batch*pageBytes), func(i int) {
				for k := range batch {
					// Twice the capacity, written in turn: each page has been
					// evicted before its next turn, so it is written, not skipped.
					if !s.Store(&pages[(i*batch+k)%len(pages)]) {
						b.Fatal("a page was dropped: the queue holds a batch")
					}
				}
				flush(b, s)
			}, func(i int) {
				for k := range batch {
					n := i*batch + k
					// The same source bytes the disk tier is handed.
					if _, err := f.WriteAt(pages[n%len(pages)].Data, int64(n%benchPages)*int64(pageBytes)); err != nil {
						b.Fatal(err)
					}
					if mode.syncEvery > 0 && n%mode.syncEvery == mode.syncEvery-1 {
						if err := f.Sync(); err != nil {
							b.Fatal(err)
						}
					}
				}
			})
			if st := s.Stats(); st.Errors+st.Dropped != 0 {
				b.Fatalf("%d write errors, %d dropped", st.Errors, st.Dropped)
			}
		})
	}
	b.Run("read", func(b *testing.B) {
		cfg := Config{Dir: b.TempDir(), Namespace: testNamespace, Format: benchFormat, Pages: benchPages, SegmentPages: 64, QueueLen: 32, SyncEvery: -1}
		s := openStore(b, cfg)
		defer s.Close()
		for i := range pages[:benchPages] {
			for !s.Store(&pages[i]) {
				flush(b, s)
			}
		}
		flush(b, s)
		f := benchFile(b, benchPages*pageBytes)
		defer f.Close()
		// Every lookup fills the same destinations, as the baseline does.
		dsts := request(pages[:benchChain])
		reqs := make([][]tier.RemotePage, benchPages/benchChain)
		for c := range reqs {
			reqs[c] = request(pages[c*benchChain : (c+1)*benchChain])
			for k := range reqs[c] {
				reqs[c][k].Data = dsts[k].Data
			}
		}
		alternate(b, int64(benchChain*pageBytes), func(i int) {
			if n := s.Fetch(context.Background(), reqs[i%len(reqs)]); n != benchChain {
				b.Fatalf("served %d pages of %d", n, benchChain)
			}
		}, func(i int) {
			for k := range benchChain {
				off := int64((i*benchChain+k)%benchPages) * int64(pageBytes)
				if _, err := f.ReadAt(dsts[k].Data, off); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}

// alternate runs b.N iterations of tierBatch then fileBatch, each moving
// bytes bytes, and reports each side's MB/s and the disk tier's share of
// the sequential file's.
func alternate(b *testing.B, bytes int64, tierBatch, fileBatch func(i int)) {
	var tierTime, fileTime time.Duration
	b.SetBytes(2 * bytes)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		tierBatch(i)
		t1 := time.Now()
		fileBatch(i)
		tierTime += t1.Sub(t0)
		fileTime += time.Since(t1)
	}
	b.StopTimer()
	total := float64(bytes) * float64(b.N) / 1e6
	tierMBs, fileMBs := total/tierTime.Seconds(), total/fileTime.Seconds()
	b.ReportMetric(tierMBs, "tier-MB/s")
	b.ReportMetric(fileMBs, "file-MB/s")
	b.ReportMetric(tierMBs/fileMBs, "tier/file")
}

// benchFile is a preallocated, written file of size bytes.
func benchFile(b *testing.B, size int) *os.File {
	f, err := os.Create(filepath.Join(b.TempDir(), "seq"))
	if err != nil {
		b.Fatal(err)
	}
	if err := preallocate(f, int64(size)); err != nil {
		b.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, size), 0); err != nil {
		b.Fatal(err)
	}
	return f
}
