package zmtp

import (
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pagedkv/pagedkv/internal/pythontest"
)

// libzmqPeer starts testdata/libzmq_peer.py in mode on ep (Debian's
// python3-zmq) and returns its output lines.
func libzmqPeer(t *testing.T, mode, ep string) <-chan string {
	t.Helper()
	pythontest.Require(t, "zmq")
	return pythontest.Start(t, "testdata/libzmq_peer.py", mode, ep).Lines
}

func nextLine(t *testing.T, lines <-chan string) string {
	t.Helper()
	select {
	case l, ok := <-lines:
		if !ok {
			t.Fatal("the libzmq peer exited")
		}
		return l
	case <-time.After(20 * time.Second):
		t.Fatal("no line from the libzmq peer in 20s")
	}
	return ""
}

func hexFrames(frames [][]byte) string {
	s := make([]string, len(frames))
	for i, f := range frames {
		s[i] = hex.EncodeToString(f)
	}
	return strings.Join(s, ",")
}

func newSocket(t *testing.T, cfg Config) *Socket {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestLibzmqPublisher: our SUB receives a libzmq PUB's stream (as from
// vLLM's ZmqEventPublisher), with the subscription libzmq expects; with
// heartbeats on, it answers libzmq's PINGs and keeps its one connection
// through the second's stream.
func TestLibzmqPublisher(t *testing.T) {
	for _, mode := range []string{"pub", "pub-heartbeat"} {
		t.Run(mode, func(t *testing.T) { testLibzmqPublisher(t, mode) })
	}
}

func testLibzmqPublisher(t *testing.T, mode string) {
	lines := libzmqPeer(t, mode, "")
	ep, _ := strings.CutPrefix(nextLine(t, lines), "READY ")
	sub := subscribe(t, ep, "kv")
	if got := nextLine(t, lines); got != "SUBSCRIBED 016b76" {
		t.Fatalf("libzmq saw %q, want the subscription 0x01 \"kv\"", got)
	}
	for seq := range 100 {
		m, err := sub.Recv()
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("6b76,%016x,%s", seq, strings.Repeat(fmt.Sprintf("%02x", seq), seq*7))
		if got := hexFrames(m.Frames); got != want {
			t.Fatalf("message %d: %s, want %s", seq, got, want)
		}
	}
	if st := sub.Stats(); st.Connections != 1 {
		t.Fatalf("%d connections, want 1: libzmq dropped the first (%+v)", st.Connections, st)
	}
}

// TestLibzmqRouter: our DEALER asks a libzmq ROUTER (vLLM's replay socket)
// and gets the reply routed back by its identity.
func TestLibzmqRouter(t *testing.T) {
	lines := libzmqPeer(t, "router", "")
	ep, _ := strings.CutPrefix(nextLine(t, lines), "READY ")
	d := newSocket(t, Config{Type: DEALER, Identity: []byte("go-dealer")})
	if err := d.Connect(ep); err != nil {
		t.Fatal(err)
	}
	if err := d.Send([][]byte{{}, []byte("ping")}); err != nil {
		t.Fatal(err)
	}
	if got, want := nextLine(t, lines), hexFrames([][]byte{[]byte("go-dealer"), {}, []byte("ping")}); got != want {
		t.Fatalf("libzmq's ROUTER received %s, want %s", got, want)
	}
	m, err := d.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := hexFrames(m.Frames), hexFrames([][]byte{{}, []byte("re:ping")}); got != want {
		t.Fatalf("reply %s, want %s", got, want)
	}
}

// TestLibzmqSubscriber: a libzmq SUB receives our PUB's messages for its
// topic only.
func TestLibzmqSubscriber(t *testing.T) {
	pub := newSocket(t, Config{Type: PUB})
	ep, err := pub.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lines := libzmqPeer(t, "sub", ep)
	nextLine(t, lines)
	deadline := time.Now().Add(20 * time.Second)
	for pub.Subscriptions() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("libzmq's SUB never subscribed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	big := make([]byte, 400) // frames over 255 bytes have an 8-byte size
	for i := range 5 {
		_ = pub.Send([][]byte{[]byte("other"), {byte(i)}})
		if err := pub.Send([][]byte{[]byte("kv-events"), {byte(i)}, big[:i*100]}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		want := hexFrames([][]byte{[]byte("kv-events"), {byte(i)}, big[:i*100]})
		if got := nextLine(t, lines); got != want {
			t.Fatalf("libzmq's SUB got %s, want %s", got, want)
		}
	}
}

// TestLibzmqClients: libzmq DEALER and REQ clients get our ROUTER's
// replies, routed by identity (DEALER) and by a generated one (REQ), not
// the first of a counter from 0 (libzmq's counter starts at random too).
func TestLibzmqClients(t *testing.T) {
	r := newSocket(t, Config{Type: ROUTER})
	ep, err := r.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"dealer", "req"} {
		lines := libzmqPeer(t, mode, ep)
		nextLine(t, lines)
		m, err := r.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Frames) != 3 || string(m.Frames[2]) != "ping" || len(m.Frames[1]) != 0 ||
			(mode == "dealer") != (string(m.Frames[0]) == "py-dealer") {
			t.Fatalf("%s: received %q", mode, m.Frames)
		}
		if id := m.Frames[0]; mode == "req" && (len(id) != 5 || id[0] != 0 || string(id) == "\x00\x00\x00\x00\x01") {
			t.Fatalf("the REQ got identity % x: want a zero byte and a counter from a random start", id)
		}
		if err := r.Send([][]byte{m.Frames[0], {}, []byte("pong")}); err != nil {
			t.Fatal(err)
		}
		want := hexFrames([][]byte{{}, []byte("pong")})
		if mode == "req" {
			want = hexFrames([][]byte{[]byte("pong")})
		}
		if got := nextLine(t, lines); got != want {
			t.Fatalf("%s got %s, want %s", mode, got, want)
		}
	}
}

// TestLibzmqDuplicateIdentity, both ways. Our ROUTER: a libzmq DEALER
// holds identity py-dealer; a second connection announcing it is
// disconnected, and the libzmq DEALER still gets its replies. libzmq's
// ROUTER (ROUTER_HANDOVER off, its default): two of our DEALERs announce
// one identity, and the first keeps it and its replies, as ours does.
func TestLibzmqDuplicateIdentity(t *testing.T) {
	pythontest.Require(t, "zmq")
	t.Run("our-router", func(t *testing.T) {
		r := newSocket(t, Config{Type: ROUTER})
		ep, err := r.Bind("tcp://127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		py := pythontest.Start(t, "testdata/libzmq_peer.py", "dealer-twice", ep)
		nextLine(t, py.Lines)
		for i, q := range []string{"ping", "ping2"} {
			m, err := r.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if got, want := hexFrames(m.Frames), hexFrames([][]byte{[]byte("py-dealer"), {}, []byte(q)}); got != want {
				t.Fatalf("received %s, want %s", got, want)
			}
			if err := r.Send([][]byte{m.Frames[0], {}, []byte("re:" + q)}); err != nil {
				t.Fatal(err)
			}
			if got, want := nextLine(t, py.Lines), hexFrames([][]byte{{}, []byte("re:" + q)}); got != want {
				t.Fatalf("libzmq's DEALER got %s, want %s", got, want)
			}
			if i == 0 {
				second := dialRawFrom(t, ep, "", "DEALER", []byte("py-dealer"))
				if !second.closedByPeer() {
					t.Fatal("a second connection announcing py-dealer was kept")
				}
				if st := r.Stats(); st.DuplicateIDs != 1 {
					t.Fatalf("stats %+v", st)
				}
				if _, err := py.Stdin.Write([]byte("again\n")); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
	t.Run("libzmq-router", func(t *testing.T) {
		lines := libzmqPeer(t, "router", "")
		ep, _ := strings.CutPrefix(nextLine(t, lines), "READY ")
		dealer := func() *Socket {
			d := newSocket(t, Config{Type: DEALER, Identity: []byte("go-dealer")})
			if err := d.Connect(ep); err != nil {
				t.Fatal(err)
			}
			return d
		}
		ask := func(d *Socket, q string) {
			if err := d.Send([][]byte{{}, []byte(q)}); err != nil {
				t.Fatal(err)
			}
		}
		first := dealer()
		ask(first, "one")
		if got, want := nextLine(t, lines), hexFrames([][]byte{[]byte("go-dealer"), {}, []byte("one")}); got != want {
			t.Fatalf("libzmq's ROUTER received %s, want %s", got, want)
		}
		if m, err := first.Recv(); err != nil || string(m.Frames[1]) != "re:one" {
			t.Fatalf("%q %v", m.Frames, err)
		}
		second := dealer()
		ask(second, "two") // libzmq leaves it unrouted: nothing arrives
		secondGot := make(chan [][]byte, 1)
		go func() {
			if m, err := second.Recv(); err == nil {
				secondGot <- m.Frames
			}
		}()
		ask(first, "three")
		if got, want := nextLine(t, lines), hexFrames([][]byte{[]byte("go-dealer"), {}, []byte("three")}); got != want {
			t.Fatalf("libzmq's ROUTER received %s, want %s from the first connection", got, want)
		}
		if m, err := first.Recv(); err != nil || string(m.Frames[1]) != "re:three" {
			t.Fatalf("the first connection got %q %v", m.Frames, err)
		}
		select {
		case f := <-secondGot:
			t.Fatalf("the second connection got %q", f)
		default:
		}
	})
}

// TestLibzmqSubscriberEvicted: a libzmq SUB that is idle in a quiet
// period, on a full PUB, is evicted by a newcomer; libzmq reconnects and
// resubscribes on its own (evicting an idle squatter in turn) and
// receives what is published after.
func TestLibzmqSubscriberEvicted(t *testing.T) {
	const idle = 100 * time.Millisecond
	pub := newSocket(t, Config{Type: PUB, MaxPeers: 2, IdleTimeout: idle})
	ep, err := pub.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lines := libzmqPeer(t, "sub", ep)
	nextLine(t, lines)
	waitFor(t, func() bool { return pub.Subscriptions() == 1 })
	squatter := dialRaw(t, ep, "SUB") // the table is full
	time.Sleep(idle + 20*time.Millisecond)
	dialRaw(t, ep, "SUB") // evicts libzmq's SUB, idle longest
	if st := pub.Stats(); st.EvictedIdle != 1 {
		t.Fatalf("stats %+v: want libzmq's SUB evicted", st)
	}
	// libzmq reconnects (ZMQ_RECONNECT_IVL, 100 ms) and evicts the squatter.
	waitFor(t, func() bool { return pub.Subscriptions() == 1 && pub.Stats().EvictedIdle == 2 })
	if !squatter.closedByPeer() {
		t.Fatal("the squatter was kept")
	}
	for i := range 5 {
		if err := pub.Send([][]byte{[]byte("kv-events"), {byte(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		if got, want := nextLine(t, lines), hexFrames([][]byte{[]byte("kv-events"), {byte(i)}}); got != want {
			t.Fatalf("libzmq's SUB got %s, want %s", got, want)
		}
	}
}
