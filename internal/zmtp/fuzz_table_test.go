package zmtp

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/pagedkv/pagedkv/internal/heaptest"
)

// fakeConn is a connection in the peer table that records its Close.
type fakeConn struct {
	net.Conn
	closed bool
}

func (c *fakeConn) Close() error { c.closed = true; return nil }

// tableConn is the model's view of one admitted connection.
type tableConn struct {
	conn     *fakeConn
	addr     string // remote IP ("" for a dialed or ipc connection)
	accepted bool
	p        *peer // after the handshake
	inTable  bool  // in s.conns (false once evicted)
}

const (
	fuzzTableMaxPeers = 4
	fuzzTablePerAddr  = 2
	fuzzTableIdle     = 50 * time.Millisecond
	// fuzzTableAllocPerOp bounds the heap bytes one operation allocates: a
	// connection, a peer and its identity, map entries.
	fuzzTableAllocPerOp = 2048
	fuzzTableAllocSlack = 16 << 10
)

// FuzzPeerTable drives a ROUTER's peer table with what strangers control:
// connections from a few addresses, handshakes announcing identities
// (none, fixed ones, the next generated one), messages, hang-ups and the
// passing of time. After each step it checks the table against a model:
// at most MaxPeers connections and MaxPeersPerAddress per address; a
// newcomer to a full table evicts exactly the accepted peer idle longest
// (idle for IdleTimeout at least), or is refused when there is none; an
// identity in use is refused and the first keeps it; generated identities
// are 5 bytes from a zero and never collide. Heap bytes allocated stay
// within fuzzTableAllocPerOp per operation.
func FuzzPeerTable(f *testing.F) {
	f.Add([]byte{0, 0, 1, 1, 0, 1, 1, 1, 4, 60, 0, 2, 0, 2})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 1, 0, 1, 0, 1, 1, 1, 1, 1, 2, 4, 200, 0, 0, 1, 0})
	f.Add([]byte{0, 0x80, 1, 3, 0, 0, 1, 0, 3, 0, 4, 60, 0, 1, 2, 0})
	f.Add(bytes.Repeat([]byte{0, 5, 1, 2, 4, 30, 3, 1}, 20))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1024 {
			data = data[:1024]
		}
		s, err := New(Config{Type: ROUTER, MaxPeers: fuzzTableMaxPeers, MaxPeersPerAddress: fuzzTablePerAddr, IdleTimeout: fuzzTableIdle})
		if err != nil {
			t.Fatal(err)
		}
		var fail error
		alloc := heaptest.Growth(func() { fail = runPeerTable(s, data) })
		if fail != nil {
			t.Fatal(fail)
		}
		if limit := uint64(fuzzTableAllocPerOp*(len(data)/2) + fuzzTableAllocSlack); alloc > limit {
			t.Fatalf("%d operations allocated %d bytes, over %d", len(data)/2, alloc, limit)
		}
	})
}

// runPeerTable runs the operations of data (two bytes each) and returns
// the first difference from the model.
func runPeerTable(s *Socket, data []byte) error {
	var conns []*tableConn // in admission order
	var now time.Duration
	addrs := [...]string{"10.0.0.1", "10.0.0.2", "2001:db8::1"}
	for i := 0; i+1 < len(data); i += 2 {
		op, arg := data[i]%5, data[i+1]
		switch op {
		case 0: // a connection
			c := &tableConn{conn: &fakeConn{}, accepted: arg&0x80 == 0}
			if c.accepted {
				c.addr = addrs[int(arg)%len(addrs)]
			}
			// The model's verdict.
			perAddr, inTable := 0, 0
			var victim *tableConn
			for _, o := range conns {
				if !o.inTable {
					continue
				}
				inTable++
				if c.addr != "" && o.addr == c.addr && !o.conn.closed {
					perAddr++
				}
			}
			// perAddr counts connections until they are released, evicted
			// or not; recount as the socket does.
			perAddr = 0
			for _, o := range conns {
				if c.addr != "" && o.addr == c.addr {
					perAddr++
				}
			}
			for _, p := range s.peers { // join order, as the socket scans
				o := modelOf(conns, p)
				if o == nil || !o.inTable || !o.accepted || p.evicted {
					continue
				}
				if l := p.last.Load(); l <= now-fuzzTableIdle && (victim == nil || l < victim.p.last.Load()) {
					victim = o
				}
			}
			wantAdmit := true
			switch {
			case c.addr != "" && perAddr >= fuzzTablePerAddr:
				wantAdmit, victim = false, nil
			case inTable < fuzzTableMaxPeers:
				victim = nil
			case victim == nil:
				wantAdmit = false
			}
			got := s.admitAt(c.conn, c.addr, now)
			if got != wantAdmit {
				return fmt.Errorf("op %d: admitted %v, want %v (%d in the table, %d from %q)", i/2, got, wantAdmit, inTable, perAddr, c.addr)
			}
			if victim != nil {
				if !victim.conn.closed || !victim.p.evicted {
					return fmt.Errorf("op %d: the peer idle longest was not evicted", i/2)
				}
				victim.inTable = false
			}
			for _, o := range conns {
				if o != victim && o.conn.closed && o.inTable {
					return fmt.Errorf("op %d: a peer not idle longest was closed", i/2)
				}
			}
			if got {
				c.inTable = true
				conns = append(conns, c)
			}
		case 1: // the first connection not handshaken yet sends READY
			var c *tableConn
			for _, o := range conns {
				if o.p == nil && !o.conn.closed {
					c = o
					break
				}
			}
			if c == nil {
				continue
			}
			var id []byte
			switch arg % 4 {
			case 1:
				id = []byte("a")
			case 2:
				id = []byte("b")
			case 3:
				id = binary.BigEndian.AppendUint32([]byte{0}, s.nextID+1) // the next generated one
			}
			p := &peer{s: s, conn: c.conn, accepted: c.accepted, id: id}
			p.last.Store(now)
			holder := s.byID[string(id)]
			err := s.join(p)
			switch {
			case len(id) > 0 && holder != nil:
				if err == nil || s.byID[string(id)] != holder {
					return fmt.Errorf("op %d: identity %q taken over (%v)", i/2, id, err)
				}
				s.release(c.conn, c.addr) // serve ends the connection
				conns = remove(conns, c)
			case err != nil:
				return fmt.Errorf("op %d: join: %v", i/2, err)
			default:
				c.p = p
				if len(id) == 0 && (len(p.id) != 5 || p.id[0] != 0) {
					return fmt.Errorf("op %d: generated identity % x", i/2, p.id)
				}
			}
		case 2: // a connection ends (an evicted one too, later)
			if len(conns) == 0 {
				continue
			}
			c := conns[int(arg)%len(conns)]
			if c.p != nil {
				s.leave(c.p)
			}
			s.release(c.conn, c.addr)
			conns = remove(conns, c)
		case 3: // a message from or to a peer
			if len(conns) > 0 {
				if c := conns[int(arg)%len(conns)]; c.p != nil {
					c.p.last.Store(now)
				}
			}
		case 4: // time passes
			now += time.Duration(arg) * time.Millisecond
		}
		if err := checkTable(s, conns); err != nil {
			return fmt.Errorf("after op %d: %w", i/2, err)
		}
	}
	return nil
}

func modelOf(conns []*tableConn, p *peer) *tableConn {
	for _, o := range conns {
		if o.p == p {
			return o
		}
	}
	return nil
}

func remove(conns []*tableConn, c *tableConn) []*tableConn {
	for i, o := range conns {
		if o == c {
			return append(conns[:i], conns[i+1:]...)
		}
	}
	return conns
}

// checkTable compares the socket's table with the model's connections.
func checkTable(s *Socket, conns []*tableConn) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	inTable := 0
	perAddr := map[string]int{}
	for _, c := range conns {
		if c.inTable {
			inTable++
			if _, ok := s.conns[c.conn]; !ok {
				return fmt.Errorf("a connection is missing from the table")
			}
		}
		if c.addr != "" {
			perAddr[c.addr]++
		}
	}
	if len(s.conns) != inTable || len(s.conns) > s.cfg.MaxPeers {
		return fmt.Errorf("%d connections in the table, the model has %d (max %d)", len(s.conns), inTable, s.cfg.MaxPeers)
	}
	if len(perAddr) != len(s.perAddr) {
		return fmt.Errorf("per address %v, the model has %v", s.perAddr, perAddr)
	}
	for a, n := range perAddr {
		if s.perAddr[a] != n || n > s.cfg.MaxPeersPerAddress {
			return fmt.Errorf("per address %v, the model has %v", s.perAddr, perAddr)
		}
	}
	held := 0
	for _, c := range conns {
		if c.p == nil {
			continue
		}
		held++
		if s.byID[string(c.p.id)] != c.p {
			return fmt.Errorf("identity % x does not route to its connection", c.p.id)
		}
	}
	if len(s.byID) != held {
		return fmt.Errorf("%d identities routed, %d peers", len(s.byID), held)
	}
	return nil
}
