package kvindex

import (
	"fmt"
	"sync/atomic"
)

// stream is the sequencing of one replica's batches, apart from any
// transport: which batches to apply, when to ask for a replay, and when
// the replica's indexed blocks can no longer be trusted. A Subscriber's
// source feeds it the messages its sockets receive; tests feed it a model
// publisher's. Its methods run on the source's goroutine (last is also read
// by others).
type stream struct {
	ix         *Index
	rep        int
	joinReplay bool
	// requestReplay asks the publisher for every batch from a sequence on
	// and hands each reply to replayed before it returns; nil when the
	// source has no replay socket.
	requestReplay func(from uint64)
	// note updates the source's counts; failed records an error.
	note   func(func(*SourceStats))
	failed func(error)

	last atomic.Int64 // last sequence applied, -1 before any
}

func (st *stream) init(ix *Index, rep int, joinReplay bool) {
	st.ix, st.rep, st.joinReplay = ix, rep, joinReplay
	st.last.Store(-1)
}

func (st *stream) replay(from uint64) {
	if st.requestReplay != nil {
		st.requestReplay(from)
	}
}

// live takes one message as it arrived on the PUB socket.
func (st *stream) live(seq uint64, payload []byte) {
	last := st.last.Load()
	switch {
	case last < 0 && seq > 0 && st.joinReplay:
		st.replay(0)
	case last >= 0 && int64(seq) <= last:
		return // already applied (from a replay)
	case last >= 0 && int64(seq) > last+1:
		st.note(func(s *SourceStats) { s.Gaps++ })
		st.replay(uint64(last + 1))
	}
	last = st.last.Load()
	if last >= 0 && int64(seq) <= last {
		return
	}
	if (last >= 0 || st.joinReplay) && int64(seq) != last+1 {
		// The replay could not fill the gap (no replay socket, or the
		// buffer moved on): what the index holds for this replica is no
		// longer known to be true. Start over from here; the router
		// underestimates this replica until its pages are stored again.
		st.note(func(s *SourceStats) { s.Unrepaired++ })
		st.ix.clearReplica(st.rep)
	}
	st.apply(seq, payload)
}

// replayed takes one reply of a replay asked from sequence from, and
// reports whether it continued the stream and was applied.
func (st *stream) replayed(from, seq uint64, payload []byte) bool {
	last := st.last.Load()
	if int64(seq) <= last {
		return false
	}
	if int64(seq) != last+1 && !(last < 0 && seq == from) {
		return false // not contiguous: the caller sees the gap remain
	}
	st.apply(seq, payload)
	return true
}

// apply decodes and indexes one batch and records its sequence.
func (st *stream) apply(seq uint64, payload []byte) {
	b, err := DecodeBatch(payload)
	if err == nil {
		err = st.ix.Apply(st.rep, &b)
	}
	if err != nil {
		st.failed(fmt.Errorf("sequence %d: %w", seq, err))
	}
	st.last.Store(int64(seq))
}
