package kvindex

import (
	"fmt"
	"math"
	"sync/atomic"
)

// stream is the sequencing of one replica's batches, apart from any
// transport: which batches to apply, when to ask for a replay, and when
// the replica's indexed blocks can no longer be trusted. A Subscriber's
// source feeds it the messages its sockets receive; tests feed it a model
// publisher's. Its methods run on the source's goroutine (last is also read
// by others). The zero stream is not ready: last must be set to -1.
//
// Whatever arrives, the index never reports a block the replica does not
// hold: a batch that is not applied in full (undecodable, refused by
// Apply, or numbered beyond 2^63-1), a gap no replay fills, and a
// publisher restart each clear the replica's blocks, and the index then
// under-reports until the replica stores its blocks again; so does a
// replay abandoned past its deadline or over its budget. An empty set is
// below any truth, and batches applied in order from there keep it below.
type stream struct {
	last atomic.Int64 // last sequence taken (applied or cleared for), -1 before any
	// liveLast is the highest sequence received live (not replayed) from
	// the publisher's current run, when liveSeen. A publisher sends its
	// run's sequences in increasing order, so a live sequence at or below
	// it is a new run.
	liveLast uint64
	liveSeen bool
}

// streamSource is what a stream needs of the source it sequences (a
// Subscriber's source, or a test's model).
type streamSource interface {
	// indexed returns the index and the replica the stream feeds.
	indexed() (*Index, int)
	// replaysFromStart reports whether a stream that joins late replays
	// from sequence 0 (SubscriberConfig.JoinReplay).
	replaysFromStart() bool
	// replay asks the publisher for every batch from a sequence on and
	// hands each reply to the stream's replayed before it returns (it does
	// nothing without a replay socket).
	replay(from uint64)
	// count updates the source's counts; fail records an error.
	count(func(*SourceStats))
	fail(error)
}

func (so *source) indexed() (*Index, int) { return so.s.ix, so.rep }
func (so *source) replaysFromStart() bool { return so.s.cfg.JoinReplay }

// live takes one message as it arrived on the PUB socket.
func (st *stream) live(src streamSource, seq uint64, payload []byte) {
	ix, r := src.indexed()
	if seq > math.MaxInt64 {
		ix.clearReplica(r, causeUnapplied)
		src.fail(fmt.Errorf("%w: sequence %d is beyond 2^63-1; the replica's blocks are cleared", ErrDecode, seq))
		return
	}
	// fromStart: the stream must begin at sequence 0 (a late joiner that
	// replays, or a publisher's new run), so anything else is a gap.
	fromStart := src.replaysFromStart() && st.last.Load() < 0
	if st.liveSeen && seq <= st.liveLast {
		// The live stream went back: the publisher restarted, and its
		// engine's cache is not what the old run built. Forget it and
		// take the new run from its start.
		ix.clearReplica(r, causeRestart)
		st.last.Store(-1)
		fromStart = true
	}
	st.liveLast, st.liveSeen = seq, true
	last := st.last.Load()
	switch {
	case last < 0 && seq > 0 && fromStart:
		src.replay(0)
	case last >= 0 && int64(seq) <= last:
		return // already applied (from a replay)
	case last >= 0 && int64(seq) > last+1:
		src.count(func(s *SourceStats) { s.Gaps++ })
		src.replay(uint64(last + 1))
	}
	last = st.last.Load()
	if last >= 0 && int64(seq) <= last {
		return
	}
	if (last >= 0 || fromStart) && int64(seq) != last+1 {
		// The replay could not fill the gap (no replay socket, or the
		// buffer moved on): what the index holds for this replica is no
		// longer known to be true. Start over from here; the router
		// underestimates this replica until its pages are stored again.
		src.count(func(s *SourceStats) { s.Unrepaired++ })
		ix.clearReplica(r, causeGap)
	}
	st.apply(src, seq, payload)
}

// replayed takes one reply of a replay asked from sequence from, and
// reports whether it continued the stream and was applied.
func (st *stream) replayed(src streamSource, from, seq uint64, payload []byte) bool {
	last := st.last.Load()
	if seq > math.MaxInt64 || int64(seq) <= last {
		return false
	}
	if int64(seq) != last+1 && !(last < 0 && seq == from) {
		return false // not contiguous: the caller sees the gap remain
	}
	st.apply(src, seq, payload)
	return true
}

// abandoned ends a replay asked from sequence from that the source gave
// up before its end marker (past its deadline or over its budget; why
// says which): the replica's blocks are cleared, as the stream stalled
// while the replica went on and may have removed any of them, and the
// stream takes the live messages on from where it is (a later sequence is
// then a gap the replay did not fill: counted in Unrepaired).
func (st *stream) abandoned(src streamSource, from uint64, why error) {
	ix, r := src.indexed()
	ix.clearReplica(r, causeAbandoned)
	src.fail(fmt.Errorf("replay from %d abandoned: %w; the replica's blocks are cleared", from, why))
}

// apply decodes and indexes one batch and records its sequence. A batch
// that is not applied in full clears the replica's blocks: its removals
// are lost, so the index can no longer know which blocks the replica
// holds.
func (st *stream) apply(src streamSource, seq uint64, payload []byte) {
	ix, r := src.indexed()
	b, err := DecodeBatch(payload)
	if err == nil {
		err = ix.applyOrClear(r, &b)
	} else {
		ix.clearReplica(r, causeUnapplied)
	}
	if err != nil {
		src.fail(fmt.Errorf("sequence %d: %w; the replica's blocks are cleared", seq, err))
	}
	st.last.Store(int64(seq))
}
