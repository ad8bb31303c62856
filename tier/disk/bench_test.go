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
// background writer, Flush) and reads (Fetch of 16-page chains: one preadv
// per run of slots, checksums, verification) with two plain sequential
// file writes and reads of the same bytes on the same filesystem: "file"
// moves a page per call (WriteAt, ReadAt), "run" moves the bytes in the
// call sizes the tier uses at most (one pwritev of a batch's pages, up to
// maxWriteBytes a call; one preadv of a lookup's 16 pages). Each
// iteration does a batch on every side, one after the other, so that all
// see the same machine (a shared machine's load varies by the second): the
// metrics are each side's MB/s over the run and tier/file and tier/run,
// the disk tier's share of each baseline. "cached" leaves the bytes in the
// page cache on every side (no fsync); "sync" fsyncs every 64 pages on
// every side. pages/write is the tier's pages per vectored write.
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
			runFile := benchFile(b, benchPages*pageBytes)
			defer runFile.Close()
			perCall := max(1, maxWriteBytes/pageBytes)
			var v vecIO
			v.init(batch)
			sync := func(f *os.File, n int) {
				if mode.syncEvery > 0 && n%mode.syncEvery == mode.syncEvery-1 {
					if err := f.Sync(); err != nil {
						b.Fatal(err)
					}
				}
			}
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
					sync(f, n)
				}
			}, func(i int) {
				for k := 0; k < batch; k += perCall {
					n := i*batch + k
					v.reset()
					for c := range min(perCall, batch-k) {
						v.add(pages[(n+c)%len(pages)].Data)
					}
					if err := v.writeAt(runFile, int64(n%benchPages)*int64(pageBytes)); err != nil {
						b.Fatal(err)
					}
					for c := range min(perCall, batch-k) {
						sync(runFile, n+c)
					}
				}
			})
			st := s.DiskStats()
			if st.Remote.Errors+st.Remote.Dropped != 0 {
				b.Fatalf("%d write errors, %d dropped", st.Remote.Errors, st.Remote.Dropped)
			}
			b.ReportMetric(float64(st.Remote.Stored)/float64(max(1, st.Writes)), "pages/write")
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
		runFile := benchFile(b, benchPages*pageBytes) // not the bytes f's reads just read
		defer runFile.Close()
		// Every side reads clean pages: none is being written back while
		// the others read.
		if err := s.Flush(context.Background(), true); err != nil {
			b.Fatal(err)
		}
		for _, f := range []*os.File{f, runFile} {
			if err := f.Sync(); err != nil {
				b.Fatal(err)
			}
		}
		// Every lookup fills the same destinations, as the baselines do.
		dsts := request(pages[:benchChain])
		reqs := make([][]tier.RemotePage, benchPages/benchChain)
		for c := range reqs {
			reqs[c] = request(pages[c*benchChain : (c+1)*benchChain])
			for k := range reqs[c] {
				reqs[c][k].Data = dsts[k].Data
			}
		}
		var v vecIO
		v.init(benchChain)
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
		}, func(i int) {
			v.reset()
			for k := range benchChain {
				v.add(dsts[k].Data)
			}
			if err := v.readAt(runFile, int64((i*benchChain)%benchPages)*int64(pageBytes)); err != nil {
				b.Fatal(err)
			}
		})
	})
}

// alternate runs b.N iterations of tierBatch, fileBatch and runBatch, each
// moving bytes bytes, in turns, and reports each side's MB/s and the disk tier's
// share of each baseline's.
func alternate(b *testing.B, bytes int64, tierBatch, fileBatch, runBatch func(i int)) {
	var times [3]time.Duration
	sides := [3]func(int){tierBatch, fileBatch, runBatch}
	b.SetBytes(3 * bytes)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		// Each side goes first in turn: the sides share their source
		// bytes (writes) or destinations (reads), which the first side
		// of an iteration brings into the CPU's caches for the others.
		for r := range sides {
			k := (i + r) % len(sides)
			t0 := time.Now()
			sides[k](i)
			times[k] += time.Since(t0)
		}
	}
	b.StopTimer()
	total := float64(bytes) * float64(b.N) / 1e6
	var mbs [3]float64
	for k, t := range times {
		mbs[k] = total / t.Seconds()
	}
	b.ReportMetric(mbs[0], "tier-MB/s")
	b.ReportMetric(mbs[1], "file-MB/s")
	b.ReportMetric(mbs[2], "run-MB/s")
	b.ReportMetric(mbs[0]/mbs[1], "tier/file")
	b.ReportMetric(mbs[0]/mbs[2], "tier/run")
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
