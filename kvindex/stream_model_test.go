package kvindex

import (
	"errors"
	"maps"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
)

// The model test's publisher: a replica's true cache (per group, per hash,
// the media holding it) and the run of batches it publishes, with the
// replay buffer a vLLM publisher keeps.
const (
	modelGroups   = 2
	modelHashes   = 24 // hashes 1..24: a small universe, so chains match
	modelBufSize  = 16 // batches a replay can serve
	modelDefaultN = 100_000
)

type modelKey struct {
	group int
	hash  uint64
}

type modelPublisher struct {
	rng   *rand.Rand
	truth map[modelKey]uint8 // media bits
	seq   uint64             // the next sequence of the current run
	buf   map[uint64][]byte  // the replay buffer: the last modelBufSize batches
	// after is the truth after each batch of the current run: what the
	// index may hold once the stream has taken that batch.
	after map[uint64]map[modelKey]uint8
}

var modelMedia = []string{"GPU", "CPU"}

// batch makes the next batch of true events (and applies them to the
// truth); refused adds a BlockStored of another block size, which Apply
// refuses and the truth (of this page size) ignores.
func (p *modelPublisher) batch(t testing.TB, refused bool) []byte {
	var evs []map[string]any
	for range p.rng.IntN(4) {
		g, medium := p.rng.IntN(modelGroups), p.rng.IntN(len(modelMedia))
		bit := uint8(1) << medium
		switch r := p.rng.IntN(40); {
		case r == 0:
			evs = append(evs, clearedWire())
			clear(p.truth)
		case r < 22: // store a few blocks this group and medium lack
			var hs []uint64
			for range 1 + p.rng.IntN(4) {
				h := uint64(1 + p.rng.IntN(modelHashes))
				if k := (modelKey{g, h}); p.truth[k]&bit == 0 {
					p.truth[k] |= bit
					hs = append(hs, h)
				}
			}
			if len(hs) > 0 {
				e := storedWire(g, streamPageSize, hs...)
				e["medium"] = modelMedia[medium]
				evs = append(evs, e)
			}
		default: // remove a few blocks it holds
			var hs []uint64
			for h := range uint64(modelHashes) {
				if p.truth[modelKey{g, h + 1}]&bit != 0 && p.rng.IntN(3) == 0 {
					hs = append(hs, h+1)
				}
			}
			for _, h := range hs {
				k := modelKey{g, h}
				if p.truth[k] &^= bit; p.truth[k] == 0 {
					delete(p.truth, k)
				}
			}
			if len(hs) > 0 {
				e := removedWire(g, hs...)
				e["medium"] = modelMedia[medium]
				evs = append(evs, e)
			}
		}
	}
	if refused {
		i := p.rng.IntN(len(evs) + 1)
		evs = append(evs[:i], append([]map[string]any{storedWire(0, 2*streamPageSize, 7)}, evs[i:]...)...)
	}
	return encodeBatch(t, evs...)
}

// corrupt returns a payload no decoder accepts: cut short, or one byte
// that is no msgpack value.
func corrupt(rng *rand.Rand, payload []byte) []byte {
	if len(payload) > 0 && rng.IntN(2) == 0 {
		return payload[:rng.IntN(len(payload))]
	}
	return []byte{0xc1}
}

// modelMessages is how many messages TestStreamNeverOverReports drives:
// KVINDEX_MODEL_MESSAGES, or 10^5 (10^4 under the race detector).
func modelMessages(t testing.TB) int {
	s := os.Getenv("KVINDEX_MODEL_MESSAGES")
	if s == "" && raceEnabled {
		return modelDefaultN / 10
	}
	if s == "" {
		return modelDefaultN
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("KVINDEX_MODEL_MESSAGES=%q: want a positive count", s)
	}
	return n
}

// TestStreamNeverOverReports drives a stream with a model publisher and
// hostile delivery: batches lost (gaps, repaired by replay or not),
// undecodable in transit or in the publisher's buffer, refused by Apply,
// publisher restarts (with and without a leading AllBlocksCleared),
// catch-up replays, duplicate replay replies, replays cut short, and
// sources with no replay socket or joining late. After every message every
// (group, hash, medium) the index holds must be one the replica holds: the
// index never over-reports. It must also catch up: the index equals the
// truth after a good share of the messages.
//
// A restart is driven only where sequence numbers can show it: the first
// message of the new run the stream receives is numbered at most the last
// it received live, and no catch-up replay comes before it (see "Publisher
// restarts" in docs/events.md).
func TestStreamNeverOverReports(t *testing.T) {
	total := modelMessages(t)
	rng := rand.New(rand.NewPCG(28, 1))
	var counts struct {
		lost, transit, atSource, refused, restarts, catchups, abandoned, exact, messages int
		capped, cappedMessages                                                           int
		gaps, unrepaired, restartsSeen, overCap                                          int64
	}
	for sub := 0; counts.messages < total; sub++ {
		ts := newTestStream(t, sub%3 == 1)
		// Every fourth source's index is capped below the 48 (group,
		// hash) entries the model's replica can hold: the index then holds
		// at most the cap, and still nothing the replica does not hold.
		maxBlocks := 0
		if sub%4 == 2 {
			maxBlocks = 2 + rng.IntN(10)
			ts.capTo(t, maxBlocks)
			counts.capped++
		}
		if sub%5 == 4 {
			ts.serve = nil // no replay socket
		} else {
			ts.serve = func(from uint64) {
				end, abandon := ts.model.seq, false
				if rng.IntN(8) == 0 && end > from {
					end = from + uint64(rng.IntN(int(end-from))) // the replay times out partway
					// or is abandoned past its deadline or budget
					abandon = rng.IntN(2) == 0
				}
				if abandon {
					defer ts.abandoned(ts, from, errors.New("the model's deadline"))
					counts.abandoned++
				}
				for seq := from; seq < end; seq++ {
					p, ok := ts.replies[seq]
					if !ok {
						continue // the buffer moved on
					}
					ts.replayed(ts, from, seq, p)
					if rng.IntN(10) == 0 { // a duplicate reply
						ts.replayed(ts, from, seq, p)
					}
				}
			}
		}
		pub := &modelPublisher{rng: rng, truth: map[modelKey]uint8{}, buf: ts.replies, after: map[uint64]map[modelKey]uint8{}}
		// taken is the truth after each batch of the run the stream is
		// following: the publisher's, but the old run's from a restart
		// until the stream has seen it.
		taken := pub.after
		ts.model = pub
		// restartSeen is false from a restart until the stream has
		// received a message of the new run that shows it.
		restartSeen, restartBelow := true, int64(-1)
		burst := 0 // messages left to lose in a row (past the replay buffer)
		for range 1000 + rng.IntN(2000) {
			if counts.messages == total {
				break
			}
			counts.messages++
			if restartSeen && ts.liveSeen && rng.IntN(200) == 0 {
				counts.restarts++
				pub.seq = 0
				clear(pub.buf)
				clear(pub.truth) // the engine restarted with an empty cache
				pub.after = map[uint64]map[modelKey]uint8{}
				restartSeen, restartBelow = false, int64(ts.liveLast)
			}
			refused := rng.IntN(25) == 0
			payload := pub.batch(t, refused)
			if pub.seq == 0 && rng.IntN(2) == 0 { // a run that starts with AllBlocksCleared
				clear(pub.truth)
				payload, refused = encodeBatch(t, clearedWire()), false
			}
			seq := pub.seq
			pub.seq++
			stored := payload
			if rng.IntN(30) == 0 {
				stored = corrupt(rng, payload) // replays serve it undecodable too
				counts.atSource++
			}
			pub.buf[seq] = stored
			pub.after[seq] = maps.Clone(pub.truth)
			delete(pub.buf, seq-modelBufSize)
			if refused {
				counts.refused++
			}
			delivered := stored
			if rng.IntN(30) == 0 {
				delivered = corrupt(rng, stored)
				counts.transit++
			}
			if rng.IntN(400) == 0 {
				burst = modelBufSize + rng.IntN(modelBufSize)
			}
			if (burst > 0 || rng.IntN(8) == 0) && (restartSeen || int64(seq) < restartBelow) {
				counts.lost++
				burst = max(burst-1, 0)
			} else {
				ts.live(ts, seq, delivered)
				if !restartSeen && int64(seq) <= restartBelow {
					restartSeen, taken = true, pub.after
				}
			}
			if restartSeen && ts.liveSeen && rng.IntN(30) == 0 {
				counts.catchups++
				ts.replay(uint64(ts.last.Load() + 1)) // WaitApplied's catch-up
			}
			if maxBlocks > 0 {
				counts.cappedMessages++
				if st := ts.ix.Stats(ts.rep); st.GroupBlocks > maxBlocks {
					t.Fatalf("message %d: the index holds %d entries, over the cap of %d", counts.messages, st.GroupBlocks, maxBlocks)
				}
				ts.checkNotOver(t, counts.messages, taken[uint64(ts.last.Load())])
			} else if ts.checkNotOver(t, counts.messages, taken[uint64(ts.last.Load())]) {
				counts.exact++
			}
		}
		counts.overCap += ts.ix.Stats(ts.rep).OverCap
		counts.gaps += ts.stats.Gaps
		counts.unrepaired += ts.stats.Unrepaired
		counts.restartsSeen += ts.ix.Stats(ts.rep).Restarts
	}
	t.Logf("%d messages: %d lost (%d gaps seen, %d unrepaired), %d undecodable in transit, %d undecodable at the source, %d refused, %d restarts, %d catch-up replays, %d replays abandoned; %d sources capped (%d messages, %d blocks over the cap); the index equalled the truth after %d of %d uncapped",
		counts.messages, counts.lost, counts.gaps, counts.unrepaired, counts.transit, counts.atSource, counts.refused, counts.restarts, counts.catchups, counts.abandoned,
		counts.capped, counts.cappedMessages, counts.overCap, counts.exact, counts.messages-counts.cappedMessages)
	if counts.restartsSeen != int64(counts.restarts) {
		t.Fatalf("the stream saw %d restarts; the publisher made %d", counts.restartsSeen, counts.restarts)
	}
	if total >= modelDefaultN/10 && (counts.unrepaired == 0 || counts.restarts == 0 || counts.refused == 0 || counts.atSource == 0 || counts.transit == 0 || counts.catchups == 0 ||
		counts.abandoned == 0 || counts.overCap == 0) {
		t.Fatalf("a hostile event never happened: %+v", counts)
	}
	if uncapped := counts.messages - counts.cappedMessages; counts.exact < uncapped/5 {
		t.Fatalf("the index equalled the truth after only %d of %d uncapped messages: it does not catch up", counts.exact, uncapped)
	}
}

// checkNotOver fails the test if the index holds a (group, hash, medium)
// the replica did not hold after the last batch the stream took (truth;
// nil before any), and reports whether the index equals it.
func (ts *testStream) checkNotOver(t testing.TB, msg int, truth map[modelKey]uint8) bool {
	ts.ix.mu.RLock()
	defer ts.ix.mu.RUnlock()
	n := 0
	for _, x := range ts.ix.replicas[ts.rep].groups {
		for h, bits := range x.blocks {
			held := truth[modelKey{x.idx, h}]
			if bits&^held != 0 {
				t.Fatalf("message %d: the index holds group %d block %d on media %02b; the replica holds it on %02b", msg, x.idx, h, bits, held)
			}
			if bits == held {
				n++
			}
		}
	}
	return n == len(truth)
}
