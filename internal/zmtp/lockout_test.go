package zmtp

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// dialRawFrom connects a raw peer of socketType with identity to a bound
// socket from the local address from ("" for any), and handshakes.
func dialRawFrom(t *testing.T, ep, from, socketType string, identity []byte) *rawPeer {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	conn, err := d.Dial("tcp", strings.TrimPrefix(ep, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := conn.Write(append(greeting(), readyCommand(socketType, identity)...)); err != nil {
		t.Fatal(err)
	}
	p := &rawPeer{conn: conn, r: bufio.NewReader(conn)}
	g := make([]byte, greetingLen)
	if _, err := io.ReadFull(p.r, g); err != nil {
		t.Fatal(err)
	}
	fr := &frameReader{r: p.r, maxMessage: 1 << 20, maxFrames: 16}
	if cmd, _, err := fr.next(); err != nil || cmd == nil {
		t.Fatalf("READY: %v", err)
	}
	return p
}

// next reads the next message the socket sends the raw peer.
func (p *rawPeer) next(t *testing.T) [][]byte {
	t.Helper()
	_ = p.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	fr := &frameReader{r: p.r, maxMessage: 1 << 20, maxFrames: 16}
	for {
		cmd, msg, err := fr.next()
		if err != nil {
			t.Fatalf("reading from the socket: %v", err)
		}
		if cmd == nil {
			return msg
		}
	}
}

// TestSilentPeersDoNotLockOut: a bound PUB whose every slot is held by
// handshaken peers that stay silent still takes a real subscriber, which
// evicts the peer idle longest and receives the stream. At bf24977 the
// subscriber was refused for as long as the squatters stayed (issue 35:
// 0 messages in 6 s).
func TestSilentPeersDoNotLockOut(t *testing.T) {
	const maxPeers = 4
	pub := newSocket(t, Config{Type: PUB, MaxPeers: maxPeers, IdleTimeout: 20 * time.Millisecond})
	ep, err := pub.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	for range maxPeers {
		dialRaw(t, ep, "SUB") // handshakes, then says nothing
	}
	waitFor(t, func() bool { return pub.Stats().Connections == maxPeers })
	sub := newSocket(t, Config{Type: SUB, ReconnectInterval: 5 * time.Millisecond})
	if err := sub.Subscribe("kv"); err != nil {
		t.Fatal(err)
	}
	if err := sub.Connect(ep); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return pub.Subscriptions() == 1 })
	for i := range 10 {
		if err := pub.Send([][]byte{[]byte("kv"), {byte(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		m, err := sub.Recv()
		if err != nil || len(m.Frames) != 2 || m.Frames[1][0] != byte(i) {
			t.Fatalf("message %d: %q %v", i, m.Frames, err)
		}
	}
	if st := pub.Stats(); st.EvictedIdle < 1 {
		t.Fatalf("stats %+v: want an idle peer evicted", st)
	}
}

// TestActivePeersAreNotEvicted: a subscriber that is being sent messages
// is never evicted; a full socket evicts the idle squatter instead, and
// refuses newcomers while no peer has been idle for IdleTimeout.
func TestActivePeersAreNotEvicted(t *testing.T) {
	const idle = 150 * time.Millisecond
	pub, sub, ep := pubSub(t, Config{MaxPeers: 2, IdleTimeout: idle}, "")
	stop := make(chan struct{})
	defer close(stop)
	go func() { // a steady stream, well within IdleTimeout
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
				_ = pub.Send([][]byte{[]byte("kv"), []byte("x")})
			}
		}
	}()
	go func() { // the subscriber reads
		for {
			if _, err := sub.Recv(); err != nil {
				return
			}
		}
	}()
	squatter := dialRaw(t, ep, "SUB")
	// Full, and nobody idle yet: refused.
	if !dialSilent(t, ep).closedByPeer() {
		t.Fatal("a full socket with no idle peer kept a newcomer")
	}
	if st := pub.Stats(); st.Refused != 1 || st.EvictedIdle != 0 {
		t.Fatalf("stats %+v: want 1 refused, none evicted", st)
	}
	time.Sleep(idle + 50*time.Millisecond)
	dialRaw(t, ep, "SUB") // evicts the squatter, not the subscriber
	if !squatter.closedByPeer() {
		t.Fatal("the idle squatter was kept")
	}
	if st := pub.Stats(); st.EvictedIdle != 1 {
		t.Fatalf("stats %+v: want 1 evicted", st)
	}
	if st := sub.Stats(); st.Connections != 1 {
		t.Fatalf("the subscriber was disconnected: %+v", st)
	}
	if pub.Subscriptions() != 1 {
		t.Fatal("the subscriber lost its subscription")
	}
}

// TestMaxPeersPerAddress: connections from one IP over the limit are
// refused and counted; another address still gets in.
func TestMaxPeersPerAddress(t *testing.T) {
	r := newSocket(t, Config{Type: ROUTER, MaxPeersPerAddress: 2})
	ep, err := r.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dialRaw(t, ep, "DEALER")
	dialRaw(t, ep, "DEALER")
	if !dialSilent(t, ep).closedByPeer() {
		t.Fatal("a third connection from 127.0.0.1 was kept over MaxPeersPerAddress 2")
	}
	if st := r.Stats(); st.RefusedPerAddress != 1 || st.Refused != 0 {
		t.Fatalf("stats %+v, want 1 refused per address", st)
	}
	// 127.0.0.2 is another address (Linux routes all of 127/8 to lo).
	p := dialRawFrom(t, ep, "127.0.0.2", "DEALER", []byte("other"))
	if _, err := p.conn.Write(appendFrame(appendFrame(nil, flagMore, nil), 0, []byte("q"))); err != nil {
		t.Fatal(err)
	}
	m, err := r.Recv()
	if err != nil || string(m.Frames[0]) != "other" || !strings.Contains(m.Peer, "127.0.0.2") {
		t.Fatalf("%q from %s, %v", m.Frames, m.Peer, err)
	}
}

// TestRouterIdentities: anonymous peers get identities that differ from
// socket to socket (a zero byte and a counter from a random start, as
// libzmq), and a second connection announcing an identity in use is
// disconnected: the first keeps its replies. At bf24977 both sockets'
// first identity was 00 00 00 00 01, and the second connection took the
// identity over and received the reply meant for the first.
func TestRouterIdentities(t *testing.T) {
	var firsts [][]byte
	for range 2 {
		r := newSocket(t, Config{Type: ROUTER})
		ep, err := r.Bind("tcp://127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var ids [][]byte
		for range 2 {
			p := dialRaw(t, ep, "REQ")
			if _, err := p.conn.Write(appendFrame(appendFrame(nil, flagMore, nil), 0, []byte("q"))); err != nil {
				t.Fatal(err)
			}
			m, err := r.Recv()
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, m.Frames[0])
		}
		for _, id := range ids {
			if len(id) != 5 || id[0] != 0 {
				t.Fatalf("generated identity % x: want a zero byte and 4 more", id)
			}
		}
		if bytes.Equal(ids[0], ids[1]) {
			t.Fatalf("two peers got identity % x", ids[0])
		}
		firsts = append(firsts, ids[0])
	}
	if bytes.Equal(firsts[0], firsts[1]) {
		t.Fatalf("two sockets gave their first anonymous peer the same identity % x: predictable", firsts[0])
	}

	// A duplicate identity does not take over.
	var pe peerErrors
	r := newSocket(t, Config{Type: ROUTER, OnPeerError: pe.add})
	ep, err := r.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	first := dialRawFrom(t, ep, "", "DEALER", []byte("replica-7"))
	if _, err := first.conn.Write(appendFrame(appendFrame(nil, flagMore, nil), 0, []byte("replay from 0"))); err != nil {
		t.Fatal(err)
	}
	m, err := r.Recv()
	if err != nil || string(m.Frames[0]) != "replica-7" {
		t.Fatalf("%q %v", m.Frames, err)
	}
	second := dialRawFrom(t, ep, "", "DEALER", []byte("replica-7"))
	if !second.closedByPeer() {
		t.Fatal("the second connection announcing replica-7 was kept")
	}
	if err := r.Send([][]byte{[]byte("replica-7"), {}, []byte("meant for the first")}); err != nil {
		t.Fatal(err)
	}
	if got := first.next(t); len(got) != 2 || string(got[1]) != "meant for the first" {
		t.Fatalf("the first connection got %q", got)
	}
	e := pe.wait(t, 1)
	if !errors.Is(e, ErrDuplicateIdentity) || !strings.Contains(e.Error(), `"replica-7"`) {
		t.Fatalf("peer error %v: want ErrDuplicateIdentity naming the identity", e)
	}
	if st := r.Stats(); st.DuplicateIDs != 1 || st.PeerErrors != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestGeneratedIdentitySkipsAnnounced: a peer that announces the identity
// the next anonymous peer would get does not receive that peer's replies.
func TestGeneratedIdentitySkipsAnnounced(t *testing.T) {
	r := newSocket(t, Config{Type: ROUTER})
	ep, err := r.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	next := binary.BigEndian.AppendUint32([]byte{0}, r.nextID+1)
	r.mu.Unlock()
	squatter := dialRawFrom(t, ep, "", "DEALER", next)
	if _, err := squatter.conn.Write(appendFrame(appendFrame(nil, flagMore, nil), 0, []byte("s"))); err != nil {
		t.Fatal(err)
	}
	if m, err := r.Recv(); err != nil || !bytes.Equal(m.Frames[0], next) {
		t.Fatalf("%q %v", m.Frames, err)
	}
	anon := dialRaw(t, ep, "REQ")
	if _, err := anon.conn.Write(appendFrame(appendFrame(nil, flagMore, nil), 0, []byte("a"))); err != nil {
		t.Fatal(err)
	}
	m, err := r.Recv()
	if err != nil || bytes.Equal(m.Frames[0], next) || len(m.Frames[0]) != 5 {
		t.Fatalf("the anonymous peer got identity % x (the squatter holds % x), %v", m.Frames[0], next, err)
	}
}

// TestRouterMandatoryAndDropStalled: with Mandatory, a send to an unknown
// identity fails naming it; with DropStalled, a peer that does not read
// is disconnected once its queue stays full for SendTimeout.
func TestRouterMandatoryAndDropStalled(t *testing.T) {
	var pe peerErrors
	r := newSocket(t, Config{Type: ROUTER, HWM: 2, SendTimeout: 20 * time.Millisecond, Mandatory: true, DropStalled: true, OnPeerError: pe.add})
	ep, err := r.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Send([][]byte{[]byte("nobody"), []byte("x")}); !errors.Is(err, ErrNoPeer) || !strings.Contains(err.Error(), `"nobody"`) {
		t.Fatalf("send to an unknown identity: %v", err)
	}
	p := dialRawFrom(t, ep, "", "DEALER", []byte("deaf"))
	waitFor(t, func() bool { return r.Stats().Connections == 1 })
	big := make([]byte, 1<<20)
	var sendErr error
	for i := 0; i < 200 && sendErr == nil; i++ { // far more than the socket buffers
		sendErr = r.Send([][]byte{[]byte("deaf"), big})
	}
	if !errors.Is(sendErr, ErrStalled) {
		t.Fatalf("sending to a peer that never reads: %v, want ErrStalled", sendErr)
	}
	if e := pe.wait(t, 1); !errors.Is(e, ErrStalled) || !strings.Contains(e.Error(), "send queue full (2 messages)") {
		t.Fatalf("peer error %v", e)
	}
	if !p.closedByPeer() {
		t.Fatal("the stalled peer was kept")
	}
	if st := r.Stats(); st.Stalled != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestIdlePeersKeptWhileRoom: an idle subscriber (a quiet period: nothing
// published) is not disconnected while the socket has room.
func TestIdlePeersKeptWhileRoom(t *testing.T) {
	pub, sub, ep := pubSub(t, Config{MaxPeers: 2, IdleTimeout: 10 * time.Millisecond}, "")
	time.Sleep(50 * time.Millisecond)
	dialRaw(t, ep, "SUB") // fills the table: no eviction needed
	if err := pub.Send([][]byte{[]byte("after the quiet period")}); err != nil {
		t.Fatal(err)
	}
	if m, err := sub.Recv(); err != nil || string(m.Frames[0]) != "after the quiet period" {
		t.Fatalf("%q %v", m.Frames, err)
	}
	// The raw peer's handshake completes on the publisher's goroutine: wait
	// for it to be counted (a loaded machine may take a while).
	st := pub.Stats()
	for deadline := time.Now().Add(5 * time.Second); st.Connections < 2 && st.EvictedIdle == 0 && time.Now().Before(deadline); st = pub.Stats() {
		time.Sleep(time.Millisecond)
	}
	if st.EvictedIdle != 0 || st.Connections != 2 {
		t.Fatalf("stats %+v: nobody should have been evicted", st)
	}
}
