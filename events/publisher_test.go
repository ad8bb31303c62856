package events_test

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/internal/zmtp"
	"github.com/pagedkv/pagedkv/prefixcache"
)

// TestPublisherRefusesHugeRequests: the publisher's sockets read only
// subscriptions and replay requests, bounded by MaxRequestBytes: peers that
// declare a 2^62-byte frame on either socket, or send a replay request
// over the limit, are disconnected and named in the stats, and the
// publisher goes on serving replays.
func TestPublisherRefusesHugeRequests(t *testing.T) {
	pub, rec := loopbackPublisher(t, events.RecorderConfig{NumPages: 4, PageSize: 2})
	defer pub.Close()
	rec.PageStored(0, 77, -1, 0, prefixcache.Key{}, []int32{1, 2})
	rec.Flush()
	if !pub.WaitSent(10 * time.Second) {
		t.Fatal("the batch was not sent")
	}

	huge := binary.BigEndian.AppendUint64([]byte{0x02}, 1<<62)
	overLimit := append([]byte{0x01, 0}, 0x02) // [empty delimiter, a request of DefaultMaxRequestBytes+1 bytes]
	overLimit = binary.BigEndian.AppendUint64(overLimit, events.DefaultMaxRequestBytes+1)
	overLimit = append(overLimit, make([]byte, events.DefaultMaxRequestBytes+1)...)
	for i, tc := range []struct {
		ep   string
		peer zmtp.Type
		send []byte
	}{
		{pub.Endpoint(), zmtp.SUB, huge},
		{pub.ReplayEndpoint(), zmtp.DEALER, huge},
		{pub.ReplayEndpoint(), zmtp.DEALER, overLimit},
	} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(tc.ep, "tcp://"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write(append(zmtp.Handshake(tc.peer, nil), tc.send...)); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.Copy(io.Discard, conn); err != nil {
			t.Fatalf("case %d: the publisher kept the connection: %v", i, err)
		}
		conn.Close()
		deadline := time.Now().Add(10 * time.Second)
		for pub.Stats().PeerErrors != int64(i+1) && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond)
		}
		st := pub.Stats()
		if st.PeerErrors != int64(i+1) || !strings.Contains(st.LastPeerErr, "zmtp: peer tcp://127.0.0.1:") || !strings.Contains(st.LastPeerErr, " on "+tc.ep+": ") {
			t.Fatalf("case %d: stats %+v: want %d peer errors, the last naming the peer and %s", i, st, i+1, tc.ep)
		}
	}

	// A well-behaved replay client is still served.
	d := replayClient(t, pub, "good")
	defer d.Close()
	if err := d.Send([][]byte{{}, make([]byte, 8)}); err != nil {
		t.Fatal(err)
	}
	for _, wantSeq := range []int64{0, -1} {
		m, err := d.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Frames) != 4 || int64(binary.BigEndian.Uint64(m.Frames[2])) != wantSeq {
			t.Fatalf("replay reply %q, want sequence %d", m.Frames, wantSeq)
		}
	}
}

// TestPublisherBadConfig: limits and endpoints the transport cannot use
// are refused with ErrBadConfig naming the value.
func TestPublisherBadConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  events.PublisherConfig
		want string
	}{
		{events.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", MaxRequestBytes: -1}, "max request bytes -1"},
		{events.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", MaxRequestBytes: 10}, "max message bytes 10 (want >= 24)"},
		{events.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayStallTimeout: -1}, "replay stall timeout -1ns"},
		{events.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayHWM: -2}, "replay hwm -2"},
		{events.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Mode: events.Bind, MaxPeersPerAddress: -1}, "max peers per address -1"},
		{events.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Mode: events.Bind, IdleTimeout: -1}, "idle timeout -1ns"},
		{events.PublisherConfig{Endpoint: "garbage", Mode: events.Bind}, `endpoint "garbage" is not transport://address`},
		{events.PublisherConfig{Endpoint: "inproc://kv"}, `transport "inproc"`},
		{events.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Mode: events.Bind, ReplayEndpoint: "udp://127.0.0.1:0"}, `transport "udp"`},
	} {
		pub, err := events.NewPublisher(tc.cfg)
		if !errors.Is(err, events.ErrBadConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want ErrBadConfig with %q", tc.cfg, err, tc.want)
		}
		if pub != nil {
			pub.Close()
		}
	}
}

// replayClient is a DEALER with the given identity connected to pub's replay
// endpoint; the caller closes it.
func replayClient(t testing.TB, pub *events.Publisher, identity string) *zmtp.Socket {
	t.Helper()
	d, err := zmtp.New(zmtp.Config{Type: zmtp.DEALER, Identity: []byte(identity)})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Connect(pub.ReplayEndpoint()); err != nil {
		d.Close()
		t.Fatal(err)
	}
	return d
}

// loopbackPublisher binds a publisher (topic "kv") and its replay socket on
// loopback ports and makes a recorder for it with rc; the caller closes the
// publisher.
func loopbackPublisher(t testing.TB, rc events.RecorderConfig) (*events.Publisher, *events.Recorder) {
	t.Helper()
	pub, err := events.NewPublisher(events.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Mode: events.Bind,
		ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv"})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := pub.NewRecorder(rc)
	if err != nil {
		pub.Close()
		t.Fatal(err)
	}
	return pub, rec
}
