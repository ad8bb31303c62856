package disk

import (
	"context"
	"testing"
)

func BenchmarkReadShapes(b *testing.B) {
	pages := benchPagesOf(benchPages)
	pageBytes := benchFormat.PageBytes()
	cfg := Config{Dir: b.TempDir(), Namespace: testNamespace, Format: benchFormat, Pages: benchPages, SegmentPages: 64, QueueLen: 32, SyncEvery: -1}
	s := openStore(b, cfg)
	defer s.Close()
	for i := range pages {
		for !s.Store(&pages[i]) {
			flush(b, s)
		}
	}
	s.Flush(context.Background(), true)
	runFile := benchFile(b, benchPages*pageBytes)
	defer runFile.Close()
	dsts := request(pages[:benchChain])
	s.allocReads(64)
	metaLen, tailLen := s.valueOff+s.dataOff, s.tailBytes()
	whole := alignedBytes(benchChain*s.slotBytes, 4096)
	var v vecIO
	v.init(64)
	b.Run("tier-preadv", func(b *testing.B) {
		b.SetBytes(int64(benchChain * pageBytes))
		for i := range b.N {
			v.reset()
			for k := range benchChain {
				v.add(s.meta[k*metaLen : (k+1)*metaLen])
				v.add(dsts[k].Data)
				v.add(s.tails[k*tailLen : (k+1)*tailLen])
			}
			f, off := s.slotAt((i * benchChain) % benchPages)
			if err := v.readAt(f, off); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("seg-data-pread", func(b *testing.B) {
		b.SetBytes(int64(benchChain * pageBytes))
		for i := range b.N {
			for k := range benchChain {
				f, off := s.slotAt((i*benchChain)%benchPages + k)
				if _, err := f.ReadAt(dsts[k].Data, off+int64(metaLen)); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("seg-whole", func(b *testing.B) {
		b.SetBytes(int64(benchChain * pageBytes))
		for i := range b.N {
			f, off := s.slotAt((i * benchChain) % benchPages)
			if _, err := f.ReadAt(whole, off); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("run-preadv", func(b *testing.B) {
		b.SetBytes(int64(benchChain * pageBytes))
		for i := range b.N {
			v.reset()
			for k := range benchChain {
				v.add(dsts[k].Data)
			}
			if err := v.readAt(runFile, int64((i*benchChain)%benchPages)*int64(pageBytes)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("run-pread", func(b *testing.B) {
		b.SetBytes(int64(benchChain * pageBytes))
		for i := range b.N {
			for k := range benchChain {
				if _, err := runFile.ReadAt(dsts[k].Data, int64((i*benchChain+k)%benchPages)*int64(pageBytes)); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}
