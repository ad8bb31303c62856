package events_test

import (
	"encoding/binary"
	"errors"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/internal/doclimits"
	"github.com/pagedkv/pagedkv/internal/zmtp"
	"github.com/pagedkv/pagedkv/prefixcache"
)

// TestReplayNonReaderDoesNotStall: a replay client that keeps asking and
// never reads is disconnected once its queue stays full, and meanwhile a
// real client's replay of every buffered batch gets its end marker. At
// bf24977 the non-reader held the single replay goroutine 5 s per request
// (issue 35: a real client's replay got no end marker in 10 s), with up
// to 100,000 replies queued for it.
func TestReplayNonReaderDoesNotStall(t *testing.T) {
	const batches, pageSize = 1000, 1024
	pub, err := events.NewPublisher(events.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Mode: events.Bind,
		ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv", BufferSteps: batches,
		ReplayStallTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if got := events.ReplaySocketHWM(pub); got != events.DefaultReplayHWM {
		t.Fatalf("the replay socket queues %d replies per client, want %d", got, events.DefaultReplayHWM)
	}
	rec, err := pub.NewRecorder(events.RecorderConfig{NumPages: batches, PageSize: pageSize})
	if err != nil {
		t.Fatal(err)
	}
	tokens := make([]int32, pageSize)
	for i := range tokens {
		tokens[i] = 1<<20 + int32(i) // 5 bytes each: about 5 KiB a batch
	}
	for i := range batches {
		rec.PageStored(prefixcache.PageID(i), uint64(i+1), -1, 0, prefixcache.Key{}, tokens)
		rec.Flush()
	}
	if !pub.WaitSent(10 * time.Second) {
		t.Fatal("the batches were not sent")
	}

	// The non-reader: a small receive window, a burst of requests, then
	// one every few ms.
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	conn, err := d.Dial("tcp", strings.TrimPrefix(pub.ReplayEndpoint(), "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	request := func(start uint64) []byte { // [empty delimiter, start] as a DEALER sends it
		return append([]byte{0x01, 0, 0x00, 8}, binary.BigEndian.AppendUint64(nil, start)...)
	}
	burst := zmtp.Handshake(zmtp.DEALER, []byte("deaf"))
	for range 150 { // enough to fill a queue of 100,000 replies
		burst = append(burst, request(0)...)
	}
	if _, err := conn.Write(burst); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			if _, err := conn.Write(request(0)); err != nil {
				return // dropped
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	// Once the publisher has taken 101 requests of the non-reader (at
	// bf24977: its queue of 100,000 replies is full), a real client asks.
	for {
		if st := pub.Stats(); st.Replays+st.ReplaysBusy >= 101 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}

	good := replayClient(t, pub, "good")
	defer good.Close()
	if err := good.Send([][]byte{{}, make([]byte, 8)}); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		for want := int64(0); ; want++ {
			m, err := good.Recv()
			if err != nil {
				got <- err
				return
			}
			seq := int64(binary.BigEndian.Uint64(m.Frames[2]))
			if seq == -1 && want == batches {
				got <- nil
				return
			}
			if len(m.Frames) != 4 || seq != want {
				got <- errors.New("reply out of order")
				return
			}
		}
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the real client's replay got no end marker in 10s while a non-reader was connected: %+v", pub.Stats())
	}
	for pub.Stats().ReplayPeersDropped == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	st := pub.Stats()
	if st.ReplayPeersDropped != 1 || !strings.Contains(st.LastPeerErr, "peer not reading") {
		t.Fatalf("stats %+v: want the non-reader dropped and named", st)
	}
	t.Logf("stats %+v", st)
}

// TestDocLimits: docs/events.md's limits table states the transport's
// defaults as the code has them.
func TestDocLimits(t *testing.T) {
	doclimits.Check(t, "docs/events.md", map[string]any{
		"events.DefaultHWM":                events.DefaultHWM,
		"events.DefaultReplayHWM":          events.DefaultReplayHWM,
		"events.DefaultReplayStallTimeout": events.DefaultReplayStallTimeout,
		"events.DefaultBufferSteps":        events.DefaultBufferSteps,
		"events.DefaultMaxRequestBytes":    events.DefaultMaxRequestBytes,
		"events.DefaultMaxQueue":           events.DefaultMaxQueue,
		"zmtp.DefaultMaxPeers":             zmtp.DefaultMaxPeers,
		"zmtp.DefaultMaxPeersPerAddress":   zmtp.DefaultMaxPeersPerAddress,
		"zmtp.DefaultIdleTimeout":          zmtp.DefaultIdleTimeout,
		"zmtp.DefaultHandshakeTimeout":     zmtp.DefaultHandshakeTimeout,
		"zmtp.DefaultHWM":                  zmtp.DefaultHWM,
		"zmtp.DefaultSendTimeout":          zmtp.DefaultSendTimeout,
		"zmtp.DefaultMaxMessageBytes":      zmtp.DefaultMaxMessageBytes,
		"zmtp.DefaultMaxFrames":            zmtp.DefaultMaxFrames,
		"zmtp.DefaultRecvQueue":            zmtp.DefaultRecvQueue,
		"zmtp.DefaultMaxSubscriptions":     zmtp.DefaultMaxSubscriptions,
		"zmtp.DefaultReconnectInterval":    zmtp.DefaultReconnectInterval,
	})
}

// TestReplayRequestsInOrder: a client's requests are answered one after
// the other, each with its end marker, even when the second arrives
// while the first replay is being sent.
func TestReplayRequestsInOrder(t *testing.T) {
	pub, rec := loopbackPublisher(t, events.RecorderConfig{NumPages: 8, PageSize: 2})
	defer pub.Close()
	for i := range 5 {
		rec.PageStored(prefixcache.PageID(i), uint64(i+1), -1, 0, prefixcache.Key{}, []int32{1, 2})
		rec.Flush()
	}
	if !pub.WaitSent(10 * time.Second) {
		t.Fatal("the batches were not sent")
	}
	d := replayClient(t, pub, "twice")
	defer d.Close()
	for _, start := range []uint64{0, 3, 9} {
		if err := d.Send([][]byte{{}, binary.BigEndian.AppendUint64(nil, start)}); err != nil {
			t.Fatal(err)
		}
	}
	var got []int64
	for len(got) < 10 {
		m, err := d.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, int64(binary.BigEndian.Uint64(m.Frames[2])))
	}
	if want := []int64{0, 1, 2, 3, 4, -1, 3, 4, -1, -1}; !slices.Equal(got, want) {
		t.Fatalf("replies %v, want %v", got, want)
	}
}
