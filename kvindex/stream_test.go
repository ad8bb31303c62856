package kvindex

import (
	"errors"
	"math"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

const streamPageSize = 4

// wireEvent is one event as the publisher writes it (vLLM's map form).
func storedWire(group, blockSize int, hashes ...uint64) map[string]any {
	return map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": nil,
		"token_ids": make([]int, blockSize*len(hashes)), "block_size": blockSize, "medium": "GPU", "group_idx": group}
}

func removedWire(group int, hashes ...uint64) map[string]any {
	return map[string]any{"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU", "group_idx": group}
}

func clearedWire() map[string]any { return map[string]any{"type": "AllBlocksCleared"} }

// encodeBatch writes a KVEventBatch payload with the generic encoder.
func encodeBatch(t testing.TB, evs ...map[string]any) []byte {
	list := make([]any, len(evs))
	for i, e := range evs {
		list[i] = e
	}
	p, err := msgpack.Marshal([]any{1.0, list, 0})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// testStream is a stream on a fresh one-replica index whose replays are
// served from replies (what the publisher's buffer holds: seq -> payload)
// by serve (nil: no replay socket). It is the stream's streamSource.
type testStream struct {
	stream
	ix         *Index
	rep        int
	joinReplay bool
	serve      func(from uint64)
	replies    map[uint64][]byte
	stats      SourceStats
	errs       []error
	model      *modelPublisher // TestStreamNeverOverReports' publisher
}

func newTestStream(t testing.TB, joinReplay bool) *testStream {
	ix, err := New(Config{PageSize: streamPageSize, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	ts := &testStream{ix: ix, rep: ix.AddReplica("r"), joinReplay: joinReplay, replies: map[uint64][]byte{}}
	ts.last.Store(-1)
	ts.serve = func(from uint64) {
		for seq := from; ; seq++ {
			p, ok := ts.replies[seq]
			if !ok {
				return
			}
			if ts.replayed(ts, from, seq, p) {
				ts.stats.Replayed++
			}
		}
	}
	return ts
}

func (ts *testStream) indexed() (*Index, int)     { return ts.ix, ts.rep }
func (ts *testStream) replaysFromStart() bool     { return ts.joinReplay }
func (ts *testStream) count(f func(*SourceStats)) { f(&ts.stats) }
func (ts *testStream) fail(err error)             { ts.errs = append(ts.errs, err) }
func (ts *testStream) replay(from uint64) {
	if ts.serve != nil {
		ts.stats.Replays++
		ts.serve(from)
	}
}

// publish hands the stream a live message and keeps it for replays.
func (ts *testStream) publish(seq uint64, payload []byte) {
	ts.replies[seq] = payload
	ts.live(ts, seq, payload)
}

// matched is how many tokens of chain the index matches.
func (ts *testStream) matched(chain ...uint64) int { return ts.ix.MatchHashes(nil, chain)[0] }

var fourBlocks = []uint64{11, 12, 13, 14}

// TestStreamUndecodableBatchClears: the replica stores four blocks, then a
// batch that removes two of them arrives undecodable. The index must not
// go on matching all four (the old code advanced the sequence and kept
// them: 16 tokens).
func TestStreamUndecodableBatchClears(t *testing.T) {
	for _, how := range []string{"live", "replayed"} {
		ts := newTestStream(t, false)
		ts.publish(0, encodeBatch(t, storedWire(0, streamPageSize, fourBlocks...)))
		removal := encodeBatch(t, removedWire(0, 13, 14))
		bad := removal[:len(removal)-1] // cut short in transit
		if how == "live" {
			ts.publish(1, bad)
		} else {
			ts.replies[1] = bad // lost live; the replay serves it cut short
		}
		ts.publish(2, encodeBatch(t))
		if got := ts.matched(fourBlocks...); got > 2*streamPageSize {
			t.Fatalf("%s: after an undecodable removal of blocks 3 and 4 the index matches %d tokens, want <= %d", how, got, 2*streamPageSize)
		}
		if len(ts.errs) != 1 || !errors.Is(ts.errs[0], ErrDecode) || ts.ix.Stats(ts.rep).Unapplied != 1 {
			t.Fatalf("%s: errors %v, stats %+v: want one ErrDecode, one unapplied batch", how, ts.errs, ts.ix.Stats(ts.rep))
		}
		// The replica catches up as its blocks are stored again.
		ts.publish(3, encodeBatch(t, storedWire(0, streamPageSize, 11, 12)))
		if got := ts.matched(fourBlocks...); got != 2*streamPageSize {
			t.Fatalf("%s: after storing blocks 1 and 2 again the index matches %d tokens, want %d", how, got, 2*streamPageSize)
		}
	}
}

// TestStreamRefusedBatchClears: a batch that Apply refuses (a BlockStored
// of another block size) also carried the removal of two blocks; the
// index must not keep them (the old code did).
func TestStreamRefusedBatchClears(t *testing.T) {
	ts := newTestStream(t, false)
	ts.publish(0, encodeBatch(t, storedWire(0, streamPageSize, fourBlocks...)))
	ts.publish(1, encodeBatch(t, removedWire(0, 13, 14), storedWire(0, 2*streamPageSize, 21)))
	if got := ts.matched(fourBlocks...); got > 2*streamPageSize {
		t.Fatalf("after a refused batch that removed blocks 3 and 4 the index matches %d tokens, want <= %d", got, 2*streamPageSize)
	}
	if len(ts.errs) != 1 || !errors.Is(ts.errs[0], ErrBadEvent) || ts.ix.Stats(ts.rep).Unapplied != 1 {
		t.Fatalf("errors %v, stats %+v: want one ErrBadEvent, one unapplied batch", ts.errs, ts.ix.Stats(ts.rep))
	}
}

// TestStreamRestart: the publisher restarts (its sequence numbers start
// again at 0) with an empty cache. The index must forget what the old run
// stored and take the new run's batches (the old code ignored every batch
// numbered at most the last one applied, and kept matching the old run's
// blocks).
func TestStreamRestart(t *testing.T) {
	for _, firstSeen := range []uint64{0, 1, 3} {
		ts := newTestStream(t, false)
		for seq := range fourBlocks {
			ts.publish(uint64(seq), encodeBatch(t, storedWire(0, streamPageSize, fourBlocks[:seq+1]...)))
		}
		if got := ts.matched(fourBlocks...); got != 4*streamPageSize {
			t.Fatalf("before the restart the index matches %d tokens, want 16", got)
		}
		// The new run: seq 0 stores 31, seq 1 stores 32, seq 2 removes 31.
		// The subscriber first hears of it at firstSeen (the earlier
		// ones are lost live, but held for replays).
		run := [][]byte{
			encodeBatch(t, storedWire(0, streamPageSize, 31)),
			encodeBatch(t, storedWire(0, streamPageSize, 31, 32)),
			encodeBatch(t, removedWire(0, 32)),
			encodeBatch(t, storedWire(0, streamPageSize, 32, 33)),
		}
		clear(ts.replies)
		for seq, p := range run {
			if uint64(seq) < firstSeen {
				ts.replies[uint64(seq)] = p
			} else {
				ts.publish(uint64(seq), p)
			}
		}
		if got := ts.matched(fourBlocks...); got != 0 {
			t.Fatalf("first seen %d: after the restart the index matches %d tokens of the old run's blocks, want 0", firstSeen, got)
		}
		if got := ts.matched(31, 32, 33); got != 3*streamPageSize {
			t.Fatalf("first seen %d: the new run's chain matched %d tokens, want %d", firstSeen, got, 3*streamPageSize)
		}
		if st := ts.ix.Stats(ts.rep); st.Restarts != 1 || ts.Applied() != 3 {
			t.Fatalf("first seen %d: stats %+v, applied %d: want one restart, sequence 3 applied", firstSeen, st, ts.Applied())
		}
	}
}

// TestStreamReplayAfterLiveIsNotARestart: batches applied from a replay
// and then received live again are not a restart.
func TestStreamReplayAfterLiveIsNotARestart(t *testing.T) {
	ts := newTestStream(t, true)
	for seq := range uint64(4) {
		ts.replies[seq] = encodeBatch(t, storedWire(0, streamPageSize, fourBlocks[seq]))
	}
	ts.publish(1, ts.replies[1]) // a late joiner: replays 0..3
	ts.publish(2, ts.replies[2])
	ts.publish(3, ts.replies[3])
	if st := ts.ix.Stats(ts.rep); st.Restarts != 0 || st.Batches != 4 || ts.matched(fourBlocks...) != 16 {
		t.Fatalf("stats %+v, matched %d: want no restart, 4 batches, 16 tokens", st, ts.matched(fourBlocks...))
	}
}

// TestStreamHugeSequence: a sequence beyond 2^63-1 (no vLLM publisher
// reaches it) cannot be placed in the stream: the replica is cleared.
func TestStreamHugeSequence(t *testing.T) {
	ts := newTestStream(t, false)
	ts.publish(0, encodeBatch(t, storedWire(0, streamPageSize, fourBlocks...)))
	ts.publish(math.MaxUint64-1, encodeBatch(t, removedWire(0, 11)))
	if got := ts.matched(fourBlocks...); got != 0 || len(ts.errs) != 1 {
		t.Fatalf("matched %d, errors %v: want 0 and one error", got, ts.errs)
	}
}

// Applied is the last sequence applied.
func (st *stream) Applied() int64 { return st.last.Load() }
