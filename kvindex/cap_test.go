package kvindex

import (
	"errors"
	"runtime"
	"strings"
	"testing"
)

// cappedTestStream is a testStream whose index holds at most maxBlocks
// entries a replica.
func cappedTestStream(t testing.TB, maxBlocks int) *testStream {
	ts := newTestStream(t, false)
	ts.capTo(t, maxBlocks)
	return ts
}

// capTo gives a fresh testStream an index capped at maxBlocks entries a
// replica.
func (ts *testStream) capTo(t testing.TB, maxBlocks int) {
	ix, err := New(Config{PageSize: streamPageSize, Seed: 1, MaxBlocks: maxBlocks})
	if err != nil {
		t.Fatal(err)
	}
	ts.ix, ts.rep = ix, ix.AddReplica("capped")
}

// TestReplicaBlockCap: one replica's stream stores 100,000 distinct blocks
// (1,000 batches of a 100-block chain each) into an index capped at 1,000
// entries a replica. The index holds the first 1,000, counts the other
// 99,000 in OverCap, and holds nothing the replica does not hold; a block
// already held takes another medium at the cap; removals make room for
// new blocks; the other replica is not affected. On the old code the
// replica held all 100,000 (2,000,000 grew the router by 72 MiB).
func TestReplicaBlockCap(t *testing.T) {
	const maxBlocks, batches, perBatch = 1000, 1000, 100
	ts := cappedTestStream(t, maxBlocks)
	other := ts.ix.AddReplica("other")
	chain := func(b int) []uint64 {
		hs := make([]uint64, perBatch)
		for i := range hs {
			hs[i] = uint64(b*perBatch + i + 1)
		}
		return hs
	}
	for b := range batches {
		ts.publish(uint64(b), encodeBatch(t, storedWire(0, streamPageSize, chain(b)...)))
	}
	st := ts.ix.Stats(ts.rep)
	t.Logf("after %d stored blocks: %+v", batches*perBatch, st)
	if st.GroupBlocks != maxBlocks || st.Blocks != maxBlocks || st.OverCap != batches*perBatch-maxBlocks || st.Stored != batches*perBatch {
		t.Fatalf("stats %+v: want %d entries and %d blocks over the cap", st, maxBlocks, batches*perBatch-maxBlocks)
	}
	if len(ts.errs) != 0 {
		t.Fatalf("errors %v: the cap is not an error", ts.errs)
	}
	// The first ten chains are indexed, in full; the eleventh not at all.
	if got := ts.ix.Blocks(ts.rep); got[0] != 1 || got[len(got)-1] != maxBlocks {
		t.Fatalf("indexed %d..%d, want 1..%d", got[0], got[len(got)-1], maxBlocks)
	}
	if got := ts.matched(append(chain(0), chain(1)...)...); got != 2*perBatch*streamPageSize {
		t.Fatalf("the first two chains matched %d tokens, want %d", got, 2*perBatch*streamPageSize)
	}
	if got := ts.matched(chain(10)...); got != 0 {
		t.Fatalf("chain 10, stored over the cap, matched %d tokens", got)
	}
	seq := uint64(batches)
	// Another medium for a held block adds no entry.
	cpu := storedWire(0, streamPageSize, 101, 102)
	cpu["medium"] = "CPU"
	ts.publish(seq, encodeBatch(t, cpu))
	seq++
	if st := ts.ix.Stats(ts.rep); st.OverCap != batches*perBatch-maxBlocks || st.GroupBlocks != maxBlocks {
		t.Fatalf("another medium for held blocks: %+v", st)
	}
	// Removing a chain makes room for another: the first 100 blocks go,
	// chain 10 (refused before) comes in.
	ts.publish(seq, encodeBatch(t, removedWire(0, chain(0)...)))
	seq++
	ts.publish(seq, encodeBatch(t, storedWire(0, streamPageSize, chain(10)...)))
	seq++
	if got := ts.matched(chain(10)...); got != perBatch*streamPageSize {
		t.Fatalf("chain 10, stored after a removal made room, matched %d tokens, want %d", got, perBatch*streamPageSize)
	}
	// Blocks 101 and 102 stay on CPU when the GPU removes them.
	ts.publish(seq, encodeBatch(t, removedWire(0, chain(1)...)))
	seq++
	if got := ts.matched(chain(1)...); got != 2*streamPageSize {
		t.Fatalf("blocks 101 and 102, removed from the GPU but held on CPU, matched %d tokens, want %d", got, 2*streamPageSize)
	}
	// The cap counts every group's entries together: of 100 new blocks in
	// group 1, the 98 the removal made room for are indexed.
	ts.publish(seq, encodeBatch(t, storedWire(1, streamPageSize, chain(20)...)))
	if st := ts.ix.Stats(ts.rep); st.GroupBlocks != maxBlocks || st.OverCap != batches*perBatch-maxBlocks+2 || st.Groups != 2 {
		t.Fatalf("a second group's blocks at the cap: %+v", st)
	}
	// The other replica has its own cap.
	if err := ts.ix.Apply(other, &Batch{Events: []Event{{Kind: BlockStored, Hashes: chain(0), BlockSize: streamPageSize, Tokens: make([]int32, perBatch*streamPageSize)}}}); err != nil {
		t.Fatal(err)
	}
	if st := ts.ix.Stats(other); st.GroupBlocks != perBatch || st.OverCap != 0 {
		t.Fatalf("the other replica: %+v", st)
	}
}

// TestBadMaxBlocks: a negative cap is refused, naming the value.
func TestBadMaxBlocks(t *testing.T) {
	if _, err := New(Config{PageSize: 4, Seed: 1, MaxBlocks: -5}); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "max blocks -5") {
		t.Fatalf("MaxBlocks -5: %v", err)
	}
}

// heapInUse is the live heap after a collection.
func heapInUse() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestReplicaMemoryBounded: with the cap at 1,000 entries, a replica's
// stream stores 300,000 distinct blocks, then fills and empties 200
// groups in turn, by removals and by AllBlocksCleared (Go maps keep the
// room for deleted entries: each group's map would keep 1,000 entries'
// room). The replica's index must stay within memBound, about 25 times
// what 1,000 entries need (seen: 33-53 KiB). Without the cap the first
// phase held 9.0 MiB; with the cap but maps kept as they were, the second
// held 7.1 MiB.
func TestReplicaMemoryBounded(t *testing.T) {
	const maxBlocks, memBound = 1000, 1 << 20
	ix, err := New(Config{PageSize: 4, Seed: 1, MaxBlocks: maxBlocks})
	if err != nil {
		t.Fatal(err)
	}
	r := ix.AddReplica("r")
	hashes := make([]uint64, maxBlocks)
	next := uint64(1)
	fill := func(g int) {
		for i := range hashes {
			hashes[i] = next * 0x9e3779b97f4a7c15
			next++
		}
		if err := ix.Apply(r, &Batch{Events: []Event{{Kind: BlockStored, Group: g, Hashes: hashes, BlockSize: 4}}}); err != nil {
			t.Fatal(err)
		}
	}
	base := heapInUse()
	grown := func(phase string) {
		t.Helper()
		n := int64(heapInUse()) - int64(base)
		st := ix.Stats(r)
		t.Logf("%s: heap +%d KiB; %d entries, %d over the cap, %d groups", phase, n>>10, st.GroupBlocks, st.OverCap, st.Groups)
		if n > memBound || st.GroupBlocks > maxBlocks {
			t.Fatalf("%s: the index grew by %d bytes and holds %d entries; the bound is %d bytes, %d entries", phase, n, st.GroupBlocks, memBound, maxBlocks)
		}
	}
	for range 300 {
		fill(0)
	}
	grown("300,000 distinct blocks in one group")
	removed := Event{Kind: BlockRemoved}
	for g := 1; g <= 200; g++ {
		removed.Group = g - 1
		removed.Hashes = ix.GroupBlocks(r, g-1)
		if err := ix.Apply(r, &Batch{Events: []Event{removed}}); err != nil {
			t.Fatal(err)
		}
		fill(g)
	}
	grown("200 groups filled and emptied by removals")
	for g := 200; g < 400; g++ {
		fill(g)
		if err := ix.Apply(r, &Batch{Events: []Event{{Kind: AllBlocksCleared}}}); err != nil {
			t.Fatal(err)
		}
	}
	grown("200 groups filled and cleared")
	if st := ix.Stats(r); st.Groups != 400 {
		t.Fatalf("%d groups, want 400", st.Groups)
	}
	runtime.KeepAlive(ix)
}
