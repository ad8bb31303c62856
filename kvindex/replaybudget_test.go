package kvindex_test

import (
	"bufio"
	"encoding/binary"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/pagedkv/pagedkv/kvindex"
)

// appendWireFrame appends one ZMTP data frame (short or long form).
func appendWireFrame(dst []byte, more bool, body []byte) []byte {
	flags := byte(0)
	if more {
		flags = 0x01
	}
	if len(body) < 256 {
		dst = append(dst, flags, byte(len(body)))
	} else {
		dst = binary.BigEndian.AppendUint64(append(dst, flags|0x02), uint64(len(body)))
	}
	return append(dst, body...)
}

// wireMessage is a whole message of frames, as bytes on the wire.
func wireMessage(frames ...[]byte) []byte {
	var out []byte
	for i, f := range frames {
		out = appendWireFrame(out, i < len(frames)-1, f)
	}
	return out
}

// loopbackPair listens on two loopback ports, a publisher's and a replay
// endpoint's, closed when the test ends.
func loopbackPair(t testing.TB) (pub, replay net.Listener) {
	t.Helper()
	pub, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	replay, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { replay.Close() })
	return pub, replay
}

func wireStored(hashes ...uint64) map[string]any {
	return map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": nil,
		"token_ids": make([]int, 4*len(hashes)), "block_size": 4, "medium": "GPU"}
}

func wireRemoved(hashes ...uint64) map[string]any {
	return map[string]any{"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}
}

func seqFrame(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// uselessReplies serves a replay endpoint (written byte by byte, as a
// libzmq ROUTER would speak): it takes one connection, waits for the first
// replay request and answers it, every interval (0: as fast as the
// subscriber reads), with a reply of sequence 0 (already applied: useless)
// and a payload of size bytes, and never sends the end marker. Once the
// subscriber's DEALER has connected it sends the connection on conns (the
// caller closes it) and nil on ready; ready gets the error if it fails.
func uselessReplies(ln net.Listener, interval time.Duration, size int, ready chan<- error, conns chan<- net.Conn) {
	conn, r, err := acceptHandshake(ln, "ROUTER")
	if err != nil {
		ready <- err
		return
	}
	conns <- conn
	ready <- nil
	// The request: an empty delimiter and 8 bytes.
	if skipFrame(r) != nil || skipFrame(r) != nil {
		return
	}
	reply := wireMessage(nil, []byte("kv"), seqFrame(0), make([]byte, size))
	w := bufio.NewWriter(conn)
	for {
		if _, err := w.Write(reply); err != nil {
			return
		}
		if interval > 0 {
			if w.Flush() != nil {
				return
			}
			time.Sleep(interval)
		}
	}
}

// TestReplayAbandonedPastItsBudget: a replay endpoint answers the
// subscriber's replay request with useless replies (sequence 0, already
// applied) for ever, never the end marker: a trickle, one every
// millisecond, that no per-reply timeout ends, or a flood. Meanwhile the
// publisher goes on: sequence 0 stores blocks 1-3, sequence 1 is lost
// (the gap asks for the replay), 2 stores 4, 3 removes 1, and 4-19 store
// 5-20. The subscriber must give the replay up at its deadline or budget,
// clear the replica, take the live stream on from 2 (counting the gap
// unrepaired) and honour the removal of block 1 at sequence 3. On the old
// code, whose only timeout was per reply, the source stayed in the replay
// for ever: last applied sequence 0 of 19, block 1 still indexed.
func TestReplayAbandonedPastItsBudget(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      kvindex.SubscriberConfig
		interval time.Duration
		size     int
		counter  func(kvindex.SourceStats) int64
	}{
		{"trickle past the deadline", kvindex.SubscriberConfig{ReplayTimeout: time.Second, ReplayDeadline: 20 * time.Millisecond},
			time.Millisecond, 0, func(s kvindex.SourceStats) int64 { return s.ReplaysPastDeadline }},
		{"flood over the reply budget", kvindex.SubscriberConfig{ReplayDeadline: time.Minute, MaxReplayReplies: 100},
			0, 0, func(s kvindex.SourceStats) int64 { return s.ReplaysOverBudget }},
		{"flood over the byte budget", kvindex.SubscriberConfig{ReplayDeadline: time.Minute, MaxReplayBytes: 64 << 10},
			0, 4 << 10, func(s kvindex.SourceStats) int64 { return s.ReplaysOverBudget }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pubLn, replayLn := loopbackPair(t)
			replayReady, replayConn := make(chan error, 1), make(chan net.Conn, 1)
			go uselessReplies(replayLn, tc.interval, tc.size, replayReady, replayConn)
			defer func() {
				select {
				case c := <-replayConn:
					c.Close() // ends the endless replies
				default:
				}
			}()

			ix, err := kvindex.New(kvindex.Config{PageSize: 4, Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			sub, err := kvindex.NewSubscriber(ix, tc.cfg, kvindex.Source{Name: "r",
				Endpoint: "tcp://" + pubLn.Addr().String(), ReplayEndpoint: "tcp://" + replayLn.Addr().String()})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			conn, r, err := acceptHandshake(pubLn, "PUB")
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if err := skipFrame(r); err != nil { // the subscription
				t.Fatal(err)
			}
			if err := <-replayReady; err != nil {
				t.Fatalf("replay endpoint: %v", err)
			}

			var stream []byte
			for seq := uint64(0); seq < 20; seq++ {
				var p []byte
				switch seq {
				case 0:
					p = kvindex.EncodeBatch(t, wireStored(1, 2, 3))
				case 1:
					continue // lost
				case 3:
					p = kvindex.EncodeBatch(t, wireRemoved(1))
				default:
					p = kvindex.EncodeBatch(t, wireStored(seq+2))
				}
				stream = append(stream, wireMessage([]byte("kv"), seqFrame(seq), p)...)
			}
			if _, err := conn.Write(stream); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for sub.Applied(0) < 19 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			st, blocks := sub.Stats(0), ix.Blocks(0)
			t.Logf("applied %d of 19; blocks %v; %+v", sub.Applied(0), blocks, st)
			if sub.Applied(0) != 19 {
				t.Fatalf("last applied sequence %d of 19: the source is still in the replay", sub.Applied(0))
			}
			if slices.Contains(blocks, 1) {
				t.Fatalf("block 1, removed at sequence 3, is still indexed: %v", blocks)
			}
			want := []uint64{4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21}
			if !slices.Equal(blocks, want) {
				t.Fatalf("indexed %v, want %v (cleared, then sequences 2-19)", blocks, want)
			}
			if tc.counter(st) != 1 || st.Unrepaired != 1 || st.Replays != 1 {
				t.Fatalf("stats %+v: want the replay abandoned once and its gap unrepaired", st)
			}
		})
	}
}
