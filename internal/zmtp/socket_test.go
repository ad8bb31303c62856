package zmtp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// peerErrors collects a socket's PeerErrors.
type peerErrors struct {
	mu   sync.Mutex
	errs []*PeerError
}

func (p *peerErrors) add(e *PeerError) {
	p.mu.Lock()
	p.errs = append(p.errs, e)
	p.mu.Unlock()
}

// wait returns the n-th error (1-based), waiting up to 10s for it.
func (p *peerErrors) wait(t *testing.T, n int) *PeerError {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.mu.Lock()
		if len(p.errs) >= n {
			e := p.errs[n-1]
			p.mu.Unlock()
			return e
		}
		p.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("no peer error #%d in 10s", n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// rawPeer is the far end of a connection, driven byte by byte.
type rawPeer struct {
	conn net.Conn
	r    *bufio.Reader
}

// handshakeRaw sends a greeting and READY as socketType and reads the
// socket's greeting and READY.
func handshakeRaw(t *testing.T, conn net.Conn, socketType string) *rawPeer {
	t.Helper()
	t.Cleanup(func() { conn.Close() })
	if _, err := conn.Write(append(greeting(), readyCommand(socketType, nil)...)); err != nil {
		t.Fatal(err)
	}
	p := &rawPeer{conn: conn, r: bufio.NewReader(conn)}
	g := make([]byte, greetingLen)
	if _, err := io.ReadFull(p.r, g); err != nil {
		t.Fatal(err)
	}
	if err := checkGreeting(g); err != nil {
		t.Fatal(err)
	}
	fr := &frameReader{r: p.r, maxMessage: 1 << 20, maxFrames: 16}
	if cmd, _, err := fr.next(); err != nil || cmd == nil {
		t.Fatalf("READY: %v", err)
	}
	return p
}

// dialRaw connects a raw peer of socketType to a bound socket.
func dialRaw(t *testing.T, ep, socketType string) *rawPeer {
	t.Helper()
	return handshakeRaw(t, dialTCP(t, ep), socketType)
}

// dialTCP connects to a bound socket's endpoint, sending nothing.
func dialTCP(t *testing.T, ep string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(ep, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// dialSilent connects a raw peer that sends nothing (no greeting), closed
// when the test ends.
func dialSilent(t *testing.T, ep string) *rawPeer {
	t.Helper()
	conn := dialTCP(t, ep)
	t.Cleanup(func() { conn.Close() })
	return &rawPeer{conn: conn, r: bufio.NewReader(conn)}
}

// acceptRaw waits for a socket to connect to ln and handshakes as
// socketType.
func acceptRaw(t *testing.T, ln net.Listener, socketType string) *rawPeer {
	t.Helper()
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return handshakeRaw(t, conn, socketType)
}

// closedByPeer reports whether the socket closed the connection within 10s.
func (p *rawPeer) closedByPeer() bool {
	_ = p.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.Copy(io.Discard, p.r)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

func listen(t *testing.T) (net.Listener, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln, "tcp://" + ln.Addr().String()
}

// TestEverySocketRefusesHugeFrames: each socket type, facing a compatible
// peer that declares a 2^62-byte frame (and, on a new connection, a frame
// one byte over the limit), drops that connection, reports the peer, and
// still takes a message exactly at the limit from the next one.
func TestEverySocketRefusesHugeFrames(t *testing.T) {
	const limit = 1000
	cases := []struct {
		typ       Type
		peer      string
		bind      bool
		topicLead []byte // PUB: what makes a message a subscription
	}{
		{SUB, "PUB", false, nil},
		{DEALER, "ROUTER", false, nil},
		{ROUTER, "DEALER", true, nil},
		{PUB, "SUB", true, []byte{1}},
	}
	for _, tc := range cases {
		t.Run(tc.typ.String(), func(t *testing.T) {
			var pe peerErrors
			s := newSocket(t, Config{Type: tc.typ, MaxMessageBytes: limit, OnPeerError: pe.add, ReconnectInterval: 5 * time.Millisecond})
			if tc.typ == SUB {
				if err := s.Subscribe(""); err != nil {
					t.Fatal(err)
				}
			}
			var ln net.Listener
			var ep string
			if tc.bind {
				var err error
				if ep, err = s.Bind("tcp://127.0.0.1:0"); err != nil {
					t.Fatal(err)
				}
			} else {
				ln, ep = listen(t)
				if err := s.Connect(ep); err != nil {
					t.Fatal(err)
				}
			}
			connect := func() *rawPeer {
				if tc.bind {
					return dialRaw(t, ep, tc.peer)
				}
				return acceptRaw(t, ln, tc.peer)
			}
			for i, hdr := range [][]byte{
				binary.BigEndian.AppendUint64([]byte{flagLong}, 1<<62),
				binary.BigEndian.AppendUint64([]byte{flagLong}, limit-frameOverhead+1),
			} {
				p := connect()
				if _, err := p.conn.Write(hdr); err != nil {
					t.Fatal(err)
				}
				if !p.closedByPeer() {
					t.Fatalf("header % x: the socket kept the connection", hdr)
				}
				e := pe.wait(t, i+1)
				if !errors.Is(e, ErrTooLarge) || !strings.Contains(e.Error(), "zmtp: peer tcp://127.0.0.1:") || !strings.Contains(e.Error(), "the limit is 1000") {
					t.Fatalf("peer error %q: want ErrTooLarge naming the peer and the limit", e)
				}
			}
			// Exactly at the limit: taken.
			p := connect()
			body := append(append([]byte{}, tc.topicLead...), make([]byte, limit-frameOverhead-len(tc.topicLead))...)
			if _, err := p.conn.Write(appendFrame(nil, 0, body)); err != nil {
				t.Fatal(err)
			}
			if tc.typ == PUB {
				waitFor(t, func() bool { return s.Subscriptions() == 1 })
			} else {
				m, err := s.Recv()
				if err != nil {
					t.Fatal(err)
				}
				if got := m.Frames[len(m.Frames)-1]; len(got) != len(body) {
					t.Fatalf("received %d bytes, want %d", len(got), len(body))
				}
			}
			if st := s.Stats(); st.PeerErrors != 2 || !strings.Contains(st.LastPeerErr, "the limit is 1000") {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// subscribe returns a SUB socket subscribed to topic and connected to ep.
func subscribe(t *testing.T, ep, topic string) *Socket {
	t.Helper()
	sub := newSocket(t, Config{Type: SUB})
	if err := sub.Subscribe(topic); err != nil {
		t.Fatal(err)
	}
	if err := sub.Connect(ep); err != nil {
		t.Fatal(err)
	}
	return sub
}

// pubSub binds a PUB socket of cfg on a loopback port and connects a SUB
// subscribed to topic, returning once the PUB has seen the subscription.
func pubSub(t *testing.T, cfg Config, topic string) (pub, sub *Socket, ep string) {
	t.Helper()
	cfg.Type = PUB
	pub = newSocket(t, cfg)
	ep, err := pub.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sub = subscribe(t, ep, topic)
	waitFor(t, func() bool { return pub.Subscriptions() == 1 })
	return pub, sub, ep
}

// TestHandshakeRefusals: peers with a bad greeting or an incompatible
// socket type are dropped and named.
func TestHandshakeRefusals(t *testing.T) {
	var pe peerErrors
	s := newSocket(t, Config{Type: ROUTER, OnPeerError: pe.add, HandshakeTimeout: 200 * time.Millisecond})
	ep, err := s.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	plain := greeting()
	copy(plain[12:], "PLAIN")
	for i, tc := range []struct {
		name string
		send []byte
		want string
	}{
		{"PLAIN", plain, `mechanism "PLAIN"`},
		{"a SUB", append(greeting(), readyCommand("SUB", nil)...), `a ROUTER socket does not talk to a "SUB" peer`},
		{"data before READY", append(greeting(), appendFrame(nil, 0, []byte("hi"))...), "a message before READY"},
		{"HTTP", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), "greeting"},
		{"silence", nil, "greeting"},
	} {
		conn := dialTCP(t, ep)
		if _, err := conn.Write(tc.send); err != nil {
			t.Fatal(err)
		}
		e := pe.wait(t, i+1)
		conn.Close()
		if !errors.Is(e, ErrProtocol) || !strings.Contains(e.Error(), tc.want) || !strings.Contains(e.Error(), " on "+ep+": ") {
			t.Errorf("%s: %q, want ErrProtocol naming the endpoint and %q", tc.name, e, tc.want)
		}
	}
}

// TestRoundTrips: Go to Go, PUB/SUB with topic filtering and ROUTER/DEALER
// with identities and the ROUTER's generated ones.
func TestRoundTrips(t *testing.T) {
	pub, sub, _ := pubSub(t, Config{}, "a")
	for i := range 50 {
		topic := []string{"a", "b", "ab"}[i%3]
		if err := pub.Send([][]byte{[]byte(topic), {byte(i)}, make([]byte, i*20)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 50 {
		if i%3 == 1 {
			continue
		}
		m, err := sub.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Frames) != 3 || m.Frames[1][0] != byte(i) || len(m.Frames[2]) != i*20 {
			t.Fatalf("message %d: %d frames, %v", i, len(m.Frames), m.Frames[1])
		}
	}

	router := newSocket(t, Config{Type: ROUTER})
	rep, err := router.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range [][]byte{[]byte("dealer-1"), nil} {
		d := newSocket(t, Config{Type: DEALER, Identity: id})
		if err := d.Connect(rep); err != nil {
			t.Fatal(err)
		}
		if err := d.Send([][]byte{{}, []byte("q")}); err != nil {
			t.Fatal(err)
		}
		m, err := router.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if id != nil && string(m.Frames[0]) != string(id) || id == nil && (len(m.Frames[0]) != 5 || m.Frames[0][0] != 0) {
			t.Fatalf("identity %q for a DEALER with %q", m.Frames[0], id)
		}
		if err := router.Send([][]byte{m.Frames[0], {}, []byte("r")}); err != nil {
			t.Fatal(err)
		}
		r, err := d.Recv()
		if err != nil || len(r.Frames) != 2 || string(r.Frames[1]) != "r" {
			t.Fatalf("reply %q %v", r.Frames, err)
		}
	}
	// An unknown identity: dropped and counted, as ZeroMQ's ROUTER does.
	if err := router.Send([][]byte{[]byte("nobody"), []byte("x")}); err != nil || router.Stats().Dropped != 1 {
		t.Fatalf("send to an unknown identity: %v, %+v", err, router.Stats())
	}
}

// TestSubscriptionLimit: a SUB peer that subscribes more than
// MaxSubscriptions topics is dropped.
func TestSubscriptionLimit(t *testing.T) {
	var pe peerErrors
	pub := newSocket(t, Config{Type: PUB, MaxSubscriptions: 3, OnPeerError: pe.add})
	ep, err := pub.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := dialRaw(t, ep, "SUB")
	var out []byte
	for i := range 4 {
		out = appendFrame(out, 0, fmt.Appendf([]byte{1}, "t%d", i))
	}
	if _, err := p.conn.Write(out); err != nil {
		t.Fatal(err)
	}
	if e := pe.wait(t, 1); !errors.Is(e, ErrTooLarge) || !strings.Contains(e.Error(), "more than 3 subscriptions") {
		t.Fatalf("%v", e)
	}
	if !p.closedByPeer() {
		t.Fatal("the PUB kept a peer over its subscription limit")
	}
	// Few subscriptions, but long ones: bounded in bytes too.
	p = dialRaw(t, ep, "SUB")
	out = appendFrame(nil, 0, append([]byte{1}, make([]byte, 40<<10)...))
	out = appendFrame(out, 0, append([]byte{1}, make([]byte, 30<<10)...))
	if _, err := p.conn.Write(out); err != nil {
		t.Fatal(err)
	}
	if e := pe.wait(t, 2); !errors.Is(e, ErrTooLarge) || !strings.Contains(e.Error(), "subscriptions of more than 65536 bytes") {
		t.Fatalf("%v", e)
	}
}

// TestPubDropsOverHWM: a subscriber that never reads costs its PUB at most
// HWM queued messages; the rest are dropped and counted, and Send never
// blocks.
func TestPubDropsOverHWM(t *testing.T) {
	pub := newSocket(t, Config{Type: PUB, HWM: 4})
	ep, err := pub.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := dialRaw(t, ep, "SUB")
	if _, err := p.conn.Write(appendFrame(nil, 0, []byte{1})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return pub.Subscriptions() == 1 })
	big := make([]byte, 1<<20)
	for range 200 { // 200 MiB: far more than the kernel's socket buffers
		if err := pub.Send([][]byte{{}, big}); err != nil {
			t.Fatal(err)
		}
	}
	if d := pub.Stats().Dropped; d < 100 {
		t.Fatalf("dropped %d of 200 messages to a subscriber that never reads", d)
	}
}

// TestMaxPeers: connections over MaxPeers are refused and counted.
func TestMaxPeers(t *testing.T) {
	r := newSocket(t, Config{Type: ROUTER, MaxPeers: 1})
	ep, err := r.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dialRaw(t, ep, "DEALER")
	if !dialSilent(t, ep).closedByPeer() {
		t.Fatal("a second peer was kept over MaxPeers 1")
	}
	if st := r.Stats(); st.Refused != 1 {
		t.Fatalf("stats %+v, want 1 refused", st)
	}
}

func TestBadConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "socket type Type(0)"},
		{Config{Type: 9}, "socket type Type(9)"},
		{Config{Type: DEALER, Identity: make([]byte, 256)}, "identity of 256 bytes"},
		{Config{Type: SUB, MaxMessageBytes: 10}, "max message bytes 10"},
		{Config{Type: SUB, MaxMessageBytes: -1}, "max message bytes -1"},
		{Config{Type: SUB, HWM: -1}, "hwm -1"},
		{Config{Type: SUB, SendTimeout: -1}, "send timeout -1ns"},
		{Config{Type: PUB, IdleTimeout: -1}, "idle timeout -1ns"},
		{Config{Type: PUB, MaxPeersPerAddress: -3}, "max peers per address -3"},
	} {
		if _, err := New(tc.cfg); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want ErrBadConfig with %q", tc.cfg, err, tc.want)
		}
	}
	s := newSocket(t, Config{Type: SUB})
	for _, ep := range []string{"127.0.0.1:5", "inproc://x", "tcp://nohost", "udp://1.2.3.4:5", "tcp://"} {
		if err := s.Connect(ep); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), fmt.Sprintf("%q", ep)) {
			t.Errorf("Connect(%q): %v, want ErrBadConfig naming it", ep, err)
		}
	}
	if err := s.Connect("tcp://*:5"); !errors.Is(err, ErrBadConfig) {
		t.Errorf("Connect to a wildcard: %v", err)
	}
	if err := s.Send([][]byte{{1}}); !errors.Is(err, ErrBadConfig) {
		t.Errorf("Send on a SUB: %v", err)
	}
	d := newSocket(t, Config{Type: DEALER, SendTimeout: 20 * time.Millisecond})
	if err := d.Send([][]byte{{1}}); !errors.Is(err, ErrNoPeer) {
		t.Errorf("DEALER Send with no peer: %v", err)
	}
	d.Close()
	if _, err := d.Recv(); !errors.Is(err, ErrClosed) {
		t.Errorf("Recv after Close: %v", err)
	}
}

// TestIPC: ipc:// endpoints are Unix sockets.
func TestIPC(t *testing.T) {
	ep := "ipc://" + t.TempDir() + "/kv.sock"
	pub := newSocket(t, Config{Type: PUB})
	if bound, err := pub.Bind(ep); err != nil || bound != ep {
		t.Fatalf("Bind(%q) = %q, %v", ep, bound, err)
	}
	sub := subscribe(t, ep, "")
	waitFor(t, func() bool { return pub.Subscriptions() == 1 })
	if err := pub.Send([][]byte{[]byte("t"), []byte("over a unix socket")}); err != nil {
		t.Fatal(err)
	}
	m, err := sub.Recv()
	if err != nil || len(m.Frames) != 2 || string(m.Frames[1]) != "over a unix socket" {
		t.Fatalf("%q %v", m.Frames, err)
	}
}

// TestSlowReaderBackpressure: a publisher floods 1 MiB messages at a SUB
// whose reader never calls Recv; the socket holds at most its receive
// queue's bytes plus the message being read (TCP pushes back on the rest),
// so the heap stays bounded however much is sent.
func TestSlowReaderBackpressure(t *testing.T) {
	const msgBytes, queueBytes = 1 << 20, 4 << 20
	ln, ep := listen(t)
	sub := newSocket(t, Config{Type: SUB, MaxMessageBytes: 2 * msgBytes, RecvQueueBytes: queueBytes})
	if err := sub.Subscribe(""); err != nil {
		t.Fatal(err)
	}
	if err := sub.Connect(ep); err != nil {
		t.Fatal(err)
	}
	p := acceptRaw(t, ln, "PUB")
	msg := appendFrame(nil, 0, make([]byte, msgBytes))
	sent := make(chan int, 1)
	go func() {
		n := 0
		for ; n < 200; n++ { // 200 MiB offered
			_ = p.conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
			if _, err := p.conn.Write(msg); err != nil {
				break // pushed back: the socket stopped reading
			}
		}
		sent <- n
	}()
	n := <-sent
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	// The queue, the message being read, and the read buffer, with room
	// for the test's own 1 MiB message and the runtime's slack.
	const bound = queueBytes + 2*msgBytes + 4<<20
	t.Logf("the peer wrote %d MiB before TCP pushed back; heap in use %.1f MiB (bound %d MiB)", n, float64(ms.HeapAlloc)/(1<<20), bound>>20)
	if n >= 200 {
		t.Fatal("all 200 MiB went through: nothing pushed back")
	}
	if ms.HeapAlloc > bound {
		t.Fatalf("heap in use %d bytes, over %d", ms.HeapAlloc, bound)
	}
	for range 4 { // what is queued is intact
		m, err := sub.Recv()
		if err != nil || len(m.Frames) != 1 || len(m.Frames[0]) != msgBytes {
			t.Fatalf("%d frames, %v", len(m.Frames), err)
		}
	}
}
