package zmtp

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	uatomic "go.uber.org/atomic"
)

// Type is a ZeroMQ socket type.
type Type uint8

// The socket types pagedkv's KV events use.
const (
	PUB Type = iota + 1
	SUB
	ROUTER
	DEALER
)

func (t Type) String() string {
	switch t {
	case PUB:
		return "PUB"
	case SUB:
		return "SUB"
	case ROUTER:
		return "ROUTER"
	case DEALER:
		return "DEALER"
	}
	return fmt.Sprintf("Type(%d)", uint8(t))
}

// accepts reports whether a peer of the given Socket-Type may talk to t
// (RFC 28/29: PUB-SUB/XSUB, SUB-PUB/XPUB, ROUTER and DEALER with REQ, REP,
// DEALER, ROUTER as ZeroMQ pairs them).
func (t Type) accepts(peer string) bool {
	var ok []string
	switch t {
	case PUB:
		ok = []string{"SUB", "XSUB"}
	case SUB:
		ok = []string{"PUB", "XPUB"}
	case ROUTER:
		ok = []string{"REQ", "DEALER", "ROUTER"}
	case DEALER:
		ok = []string{"REP", "DEALER", "ROUTER"}
	}
	for _, s := range ok {
		if peer == s {
			return true
		}
	}
	return false
}

// Defaults of Config.
const (
	DefaultMaxMessageBytes   = 64 << 20
	DefaultMaxFrames         = 16
	DefaultHWM               = 1000
	DefaultRecvQueue         = 64
	DefaultSendTimeout       = 5 * time.Second
	DefaultReconnectInterval = 100 * time.Millisecond
	DefaultHandshakeTimeout  = 5 * time.Second
	DefaultMaxPeers          = 1024
	// DefaultMaxPeersPerAddress bounds a bound socket's connections from
	// one remote IP address.
	DefaultMaxPeersPerAddress = 32
	// DefaultIdleTimeout is how long an accepted peer must have been
	// silent both ways before a new connection may evict it from a full
	// socket.
	DefaultIdleTimeout      = 10 * time.Second
	DefaultMaxSubscriptions = 1024
	// maxSubscriptionBytes bounds the topics one PUB peer subscribes to,
	// together (a router subscribes to one short topic).
	maxSubscriptionBytes = 64 << 10
)

var (
	// ErrClosed is returned by a closed Socket.
	ErrClosed = errors.New("zmtp: socket closed")
	// ErrBadConfig is a Config or endpoint the Socket cannot use.
	ErrBadConfig = errors.New("zmtp: bad configuration")
	// ErrNoPeer is a DEALER send that found no connected peer in time, or
	// a ROUTER send (with Config.Mandatory) to an identity not connected.
	ErrNoPeer = errors.New("zmtp: no connected peer")
	// ErrStalled is a send that found the peer's queue full (HWM) for
	// SendTimeout: the peer is not reading.
	ErrStalled = errors.New("zmtp: peer not reading")
	// ErrDuplicateIdentity is a ROUTER peer announcing an identity another
	// connection holds; the first connection keeps it and the newcomer is
	// disconnected.
	ErrDuplicateIdentity = errors.New("zmtp: identity already connected")
)

// Config describes a Socket. Zero values take the defaults.
type Config struct {
	Type Type
	// Identity is sent in READY by ROUTER and DEALER sockets (at most 255
	// bytes); a ROUTER peer routes replies to it.
	Identity []byte
	// MaxMessageBytes bounds one received message: the sum of its frame
	// bodies plus 24 bytes per frame, checked against each frame header
	// before the frame is read. MaxFrames bounds its frame count. A peer
	// that declares more is disconnected and reported.
	MaxMessageBytes int64
	MaxFrames       int
	// HWM is how many messages may wait to be sent to one peer; a PUB
	// socket drops what does not fit (as ZeroMQ's PUB), ROUTER and DEALER
	// wait up to SendTimeout for room.
	HWM int
	// RecvQueue is how many received messages may wait for Recv, and
	// RecvQueueBytes how many bytes they may hold together (counted as for
	// MaxMessageBytes; one message is always let in). A full queue stops
	// reading from the peers (TCP pushes back).
	RecvQueue         int
	RecvQueueBytes    int64
	SendTimeout       time.Duration
	ReconnectInterval time.Duration
	HandshakeTimeout  time.Duration
	// MaxPeers bounds a socket's connections (handshaken or not). When a
	// bound socket is full, a new connection evicts the accepted peer that
	// has been idle longest, if one has been idle for IdleTimeout, and is
	// refused otherwise (Stats.EvictedIdle, Stats.Refused).
	MaxPeers int
	// MaxPeersPerAddress bounds a bound socket's connections from one
	// remote IP address (TCP; ipc peers are not counted); more are refused
	// (Stats.RefusedPerAddress).
	MaxPeersPerAddress int
	// IdleTimeout: an accepted peer that has neither sent a message nor
	// been written one for this long is idle, and may be evicted when the
	// socket is full. Commands (PING, PONG) and subscriptions do not count
	// as messages. Idle peers are never closed otherwise: a subscriber in
	// a quiet period stays connected while there is room.
	IdleTimeout time.Duration
	// Mandatory (ROUTER): Send to an identity that is not connected
	// returns an error wrapping ErrNoPeer instead of dropping the message
	// (libzmq's ZMQ_ROUTER_MANDATORY).
	Mandatory bool
	// DropStalled (ROUTER): a Send that finds the peer's queue full for
	// SendTimeout disconnects that peer (Stats.Stalled, reported as a
	// PeerError wrapping ErrStalled) besides returning the error.
	DropStalled bool
	// MaxSubscriptions bounds a PUB socket's subscriptions per peer.
	MaxSubscriptions int
	// OnPeerError, when not nil, hears of every peer disconnected for
	// breaking the protocol or the limits (on the connection's goroutine).
	OnPeerError func(*PeerError)
}

func (c *Config) fill() error {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.RecvQueueBytes == 0 {
		c.RecvQueueBytes = c.MaxMessageBytes
	}
	def(&c.MaxFrames, DefaultMaxFrames)
	def(&c.HWM, DefaultHWM)
	def(&c.RecvQueue, DefaultRecvQueue)
	def(&c.MaxPeers, DefaultMaxPeers)
	def(&c.MaxPeersPerAddress, DefaultMaxPeersPerAddress)
	defDur(&c.IdleTimeout, DefaultIdleTimeout)
	def(&c.MaxSubscriptions, DefaultMaxSubscriptions)
	defDur(&c.SendTimeout, DefaultSendTimeout)
	defDur(&c.ReconnectInterval, DefaultReconnectInterval)
	defDur(&c.HandshakeTimeout, DefaultHandshakeTimeout)
	switch {
	case c.Type < PUB || c.Type > DEALER:
		return fmt.Errorf("%w: socket type %v", ErrBadConfig, c.Type)
	case len(c.Identity) > 255:
		return fmt.Errorf("%w: identity of %d bytes, at most 255", ErrBadConfig, len(c.Identity))
	case c.MaxMessageBytes < frameOverhead || c.RecvQueueBytes < 0:
		return fmt.Errorf("%w: max message bytes %d (want >= %d), recv queue bytes %d (want >= 0)",
			ErrBadConfig, c.MaxMessageBytes, frameOverhead, c.RecvQueueBytes)
	case c.MaxFrames < 1 || c.HWM < 1 || c.RecvQueue < 1 || c.MaxPeers < 1 || c.MaxPeersPerAddress < 1 || c.MaxSubscriptions < 1:
		return fmt.Errorf("%w: max frames %d, hwm %d, recv queue %d, max peers %d, max peers per address %d, max subscriptions %d: want >= 1",
			ErrBadConfig, c.MaxFrames, c.HWM, c.RecvQueue, c.MaxPeers, c.MaxPeersPerAddress, c.MaxSubscriptions)
	case c.SendTimeout < 0 || c.ReconnectInterval < 0 || c.HandshakeTimeout < 0 || c.IdleTimeout < 0:
		return fmt.Errorf("%w: send timeout %v, reconnect interval %v, handshake timeout %v, idle timeout %v: want >= 0",
			ErrBadConfig, c.SendTimeout, c.ReconnectInterval, c.HandshakeTimeout, c.IdleTimeout)
	}
	return nil
}

// TagBadConfig returns err, made to match tag too under errors.Is when it
// is an ErrBadConfig: callers tag this package's configuration errors (a
// malformed endpoint, a limit it cannot use) with their own sentinel.
func TagBadConfig(err, tag error) error {
	if errors.Is(err, ErrBadConfig) && !errors.Is(err, tag) {
		return fmt.Errorf("%w: %w", tag, err)
	}
	return err
}

// PeerError is a peer disconnected for breaking the protocol or the
// limits. It names the socket's endpoint and the peer's address.
type PeerError struct {
	Endpoint string // the endpoint bound or connected
	Remote   string // the peer's address
	Err      error
}

func (e *PeerError) Error() string {
	if e.Remote == e.Endpoint { // a connection we made
		return fmt.Sprintf("zmtp: peer %s: %v", e.Remote, e.Err)
	}
	return fmt.Sprintf("zmtp: peer %s on %s: %v", e.Remote, e.Endpoint, e.Err)
}

func (e *PeerError) Unwrap() error { return e.Err }

// Stats are a Socket's cumulative counts.
type Stats struct {
	Connections int64 // handshakes completed
	PeerErrors  int64 // peers disconnected for a protocol or limit violation
	Refused     int64 // connections refused over MaxPeers, no peer being idle to evict
	Dropped     int64 // messages not sent: PUB over HWM, ROUTER to an unknown identity
	// RefusedPerAddress counts connections refused over MaxPeersPerAddress.
	RefusedPerAddress int64
	// EvictedIdle counts idle peers disconnected to make room for a new
	// connection on a full socket.
	EvictedIdle int64
	// DuplicateIDs counts ROUTER connections disconnected for announcing
	// an identity already connected (also PeerErrors).
	DuplicateIDs int64
	// Stalled counts ROUTER peers disconnected by DropStalled (also
	// PeerErrors).
	Stalled     int64
	LastPeerErr string
}

// Message is a received message and the address of the peer that sent it.
// A ROUTER socket's messages start with the peer's identity frame.
type Message struct {
	Frames [][]byte
	Peer   string
}

// Socket is a ZeroMQ socket of one Type speaking ZMTP 3.0 over TCP (and
// Unix sockets for ipc://) with the NULL mechanism. Its methods are safe
// for concurrent use.
type Socket struct {
	cfg   Config
	inbox *inbox
	done  chan struct{}
	wg    sync.WaitGroup

	epoch time.Time // peers' activity times are durations since it (monotonic)

	mu        sync.Mutex
	closed    bool
	listeners []net.Listener
	conns     map[net.Conn]struct{} // every open connection, handshaken or not
	perAddr   map[string]int        // accepted TCP connections by remote IP
	peers     []*peer               // handshaken, in connection order
	byID      map[string]*peer      // ROUTER: peers by identity
	subs      [][]byte              // SUB: our subscriptions
	nextID    uint32                // ROUTER: generated identities (from a random start)
	rr        int                   // DEALER: round robin
	joined    chan struct{}         // closed and replaced when a peer joins

	connections, peerErrors, refused, dropped          atomic.Int64
	refusedPerAddr, evictedIdle, duplicateIDs, stalled atomic.Int64
	lastPeerErr                                        uatomic.String
}

// New returns a Socket with no endpoints.
func New(cfg Config) (*Socket, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	s := &Socket{cfg: cfg, done: make(chan struct{}), conns: map[net.Conn]struct{}{}, perAddr: map[string]int{},
		byID: map[string]*peer{}, joined: make(chan struct{}), epoch: time.Now()}
	// As libzmq: generated identities count from a random value, so that
	// a stranger cannot tell which identity the next anonymous peer gets.
	var r [4]byte
	_, _ = rand.Read(r[:]) // never fails (crypto/rand, Go 1.24+)
	s.nextID = binary.BigEndian.Uint32(r[:])
	s.inbox = newInbox(cfg.RecvQueue, cfg.RecvQueueBytes)
	if cfg.Identity != nil {
		s.cfg.Identity = bytes.Clone(cfg.Identity)
	}
	return s, nil
}

// splitEndpoint parses "tcp://host:port" (host "*" for every interface)
// and "ipc://path" into a network and address for package net.
func splitEndpoint(ep string) (network, addr string, err error) {
	scheme, rest, ok := strings.Cut(ep, "://")
	switch {
	case !ok || rest == "":
		return "", "", fmt.Errorf("%w: endpoint %q is not transport://address", ErrBadConfig, ep)
	case scheme == "tcp":
		host, port, err := net.SplitHostPort(rest)
		if err != nil {
			return "", "", fmt.Errorf("%w: endpoint %q: %v", ErrBadConfig, ep, err)
		}
		if host == "*" {
			host = ""
		}
		return "tcp", net.JoinHostPort(host, port), nil
	case scheme == "ipc":
		return "unix", rest, nil
	}
	return "", "", fmt.Errorf("%w: endpoint %q: transport %q (want tcp or ipc)", ErrBadConfig, ep, scheme)
}

// Bind listens on ep and returns the endpoint as bound (with the port
// chosen for tcp port 0).
func (s *Socket) Bind(ep string) (string, error) {
	network, addr, err := splitEndpoint(ep)
	if err != nil {
		return "", err
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		return "", fmt.Errorf("zmtp: bind %q: %w", ep, err)
	}
	bound := ep
	if network == "tcp" {
		bound = "tcp://" + ln.Addr().String()
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return "", ErrClosed
	}
	s.listeners = append(s.listeners, ln)
	s.wg.Add(1)
	s.mu.Unlock()
	go s.accept(ln, bound)
	return bound, nil
}

func (s *Socket) accept(ln net.Listener, ep string) {
	defer s.wg.Done()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if s.isClosed() {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			// Out of file descriptors and the like: wait instead of spinning.
			select {
			case <-s.done:
				return
			case <-time.After(s.cfg.ReconnectInterval):
			}
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serve(conn, ep, true)
		}()
	}
}

// Connect validates ep and connects to it in the background, reconnecting
// after every disconnection until Close, as ZeroMQ does.
func (s *Socket) Connect(ep string) error {
	network, addr, err := splitEndpoint(ep)
	if err != nil {
		return err
	}
	if network == "tcp" && strings.HasPrefix(addr, ":") {
		return fmt.Errorf("%w: endpoint %q: connect needs a host", ErrBadConfig, ep)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.wg.Add(1)
	go s.dial(network, addr, ep)
	return nil
}

func (s *Socket) dial(network, addr, ep string) {
	defer s.wg.Done()
	d := net.Dialer{Timeout: s.cfg.HandshakeTimeout}
	for !s.isClosed() {
		if conn, err := d.Dial(network, addr); err == nil {
			s.serve(conn, ep, false)
		}
		select {
		case <-s.done:
			return
		case <-time.After(s.cfg.ReconnectInterval):
		}
	}
}

func (s *Socket) isClosed() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// peer is one handshaken connection.
type peer struct {
	s        *Socket
	conn     net.Conn
	endpoint string
	remote   string
	id       []byte           // ROUTER: the identity replies are routed by
	accepted bool             // a connection to our listener (may be evicted)
	evicted  bool             // closed by us: evicted, or dropped for not reading (guarded by s.mu)
	last     uatomic.Duration // last message read or written, as time since s.epoch
	out      *sendQueue       // messages to send, at most HWM
	pong     chan []byte      // a PONG command to send (one pending at most)
	gone     chan struct{}    // closed when the connection ends
	subs     map[string]int   // PUB: the peer's subscriptions, with counts
	nsubs    int              // their total count
	subBytes int              // and bytes
}

// touch records activity (a message read or written) on p.
func (p *peer) touch() { p.last.Store(time.Since(p.s.epoch)) }

// serve runs one connection: handshake, then reads until it ends.
// accepted is a connection to one of our listeners.
func (s *Socket) serve(conn net.Conn, ep string, accepted bool) {
	remote := conn.RemoteAddr().String()
	var addr string // the remote IP, for MaxPeersPerAddress
	switch {
	case conn.RemoteAddr().Network() == "tcp":
		remote = "tcp://" + remote
		if ta, ok := conn.RemoteAddr().(*net.TCPAddr); ok && accepted {
			addr = ta.IP.String()
		}
	case remote == "" || remote == "@": // the client end of a Unix socket has no name
		remote = "an unnamed ipc client"
	default:
		remote = "ipc://" + remote
	}
	if !s.admit(conn, addr) {
		conn.Close()
		return
	}
	defer s.release(conn, addr)

	br := bufio.NewReaderSize(conn, 32<<10)
	fr := &frameReader{r: br, maxMessage: s.cfg.MaxMessageBytes, maxFrames: s.cfg.MaxFrames}
	md, err := s.handshake(conn, fr)
	if err != nil {
		s.peerFailed(ep, remote, err)
		return
	}
	// Past the handshake, a peer that hangs up is no error.
	p := &peer{s: s, conn: conn, endpoint: ep, remote: remote, out: newSendQueue(s.cfg.HWM),
		pong: make(chan []byte, 1), gone: make(chan struct{}), accepted: accepted}
	p.touch()
	if s.cfg.Type == ROUTER {
		p.id = md.identity
	}
	if s.cfg.Type == PUB {
		p.subs = map[string]int{}
	}
	if err := s.join(p); err != nil {
		s.peerFailed(ep, remote, err)
		return
	}
	s.connections.Add(1)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		p.write()
	}()
	err = p.read(fr)
	s.leave(p)
	close(p.gone)
	conn.Close()
	<-writerDone
	s.peerFailed(ep, remote, err)
}

// handshake exchanges greetings and READY commands.
func (s *Socket) handshake(conn net.Conn, fr *frameReader) (metadata, error) {
	_ = conn.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	var id []byte
	if s.cfg.Type == ROUTER || s.cfg.Type == DEALER {
		id = s.cfg.Identity
		if id == nil {
			id = []byte{}
		}
	}
	out := Handshake(s.cfg.Type, id)
	if _, err := conn.Write(out); err != nil {
		return metadata{}, err // gone before it heard us: no protocol was broken
	}
	g := make([]byte, greetingLen)
	if n, err := io.ReadFull(fr.r, g); err != nil {
		if n == 0 && errors.Is(err, io.EOF) {
			return metadata{}, err // hung up without a word (a peer refusing us, or going away)
		}
		return metadata{}, fmt.Errorf("%w: greeting: %d of %d bytes: %v", ErrProtocol, n, greetingLen, err)
	}
	if err := checkGreeting(g); err != nil {
		return metadata{}, err
	}
	body, msg, err := fr.next()
	if err != nil {
		return metadata{}, fmt.Errorf("handshake: %w", err)
	}
	if msg != nil {
		return metadata{}, fmt.Errorf("%w: a message before READY", ErrProtocol)
	}
	cmd, err := parseCommand(body)
	if err != nil {
		return metadata{}, err
	}
	if cmd.name != "READY" {
		return metadata{}, fmt.Errorf("%w: command %q before READY", ErrProtocol, cmd.name)
	}
	md, err := parseReady(cmd.data)
	if err != nil {
		return metadata{}, err
	}
	if !s.cfg.Type.accepts(md.socketType) {
		return metadata{}, fmt.Errorf("%w: a %s socket does not talk to a %q peer", ErrProtocol, s.cfg.Type, md.socketType)
	}
	_ = conn.SetDeadline(time.Time{})
	return md, nil
}

// peerFailed reports why a connection ended when the peer is to blame:
// it broke the protocol or a limit, or hung up in the middle of a frame.
// Clean hang-ups, network errors and our own Close are not reported.
func (s *Socket) peerFailed(ep, remote string, err error) {
	blame := errors.Is(err, ErrProtocol) || errors.Is(err, ErrTooLarge) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, ErrDuplicateIdentity) || errors.Is(err, ErrStalled)
	if !blame || s.isClosed() {
		return
	}
	pe := &PeerError{Endpoint: ep, Remote: remote, Err: err}
	// The message is stored before the count moves, so that a reader who
	// sees the count also sees this peer's message (Stats loads the count
	// first).
	msg := pe.Error()
	s.lastPeerErr.Store(msg)
	s.peerErrors.Add(1)
	if s.cfg.OnPeerError != nil {
		s.cfg.OnPeerError(pe)
	}
}

// admit takes a new connection into the socket's table, or says no: over
// MaxPeersPerAddress for its remote IP addr (accepted TCP connections; ""
// for others), or over MaxPeers with no peer idle for IdleTimeout to
// evict. Evicting closes the accepted peer idle longest.
func (s *Socket) admit(conn net.Conn, addr string) bool {
	return s.admitAt(conn, addr, time.Since(s.epoch))
}

// admitAt is admit at time now (since s.epoch).
func (s *Socket) admitAt(conn net.Conn, addr string, now time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if addr != "" && s.perAddr[addr] >= s.cfg.MaxPeersPerAddress {
		s.refusedPerAddr.Add(1)
		return false
	}
	if len(s.conns) >= s.cfg.MaxPeers {
		victim := s.idlestLocked(now)
		if victim == nil {
			s.refused.Add(1)
			return false
		}
		// Out of the table now, so that the count stays within MaxPeers;
		// its goroutines end on their own.
		victim.evicted = true
		delete(s.conns, victim.conn)
		victim.conn.Close()
		s.evictedIdle.Add(1)
	}
	s.conns[conn] = struct{}{}
	if addr != "" {
		s.perAddr[addr]++
	}
	return true
}

// release takes an admitted connection out of the table and closes it.
func (s *Socket) release(conn net.Conn, addr string) {
	s.mu.Lock()
	delete(s.conns, conn)
	if addr != "" {
		if s.perAddr[addr]--; s.perAddr[addr] <= 0 {
			delete(s.perAddr, addr)
		}
	}
	s.mu.Unlock()
	conn.Close()
}

// idlestLocked returns the accepted, handshaken peer that has been idle
// longest, if it has been idle for at least IdleTimeout at time now, or
// nil.
func (s *Socket) idlestLocked(now time.Duration) *peer {
	var victim *peer
	threshold := now - s.cfg.IdleTimeout
	for _, p := range s.peers {
		if !p.accepted || p.evicted {
			continue
		}
		if l := p.last.Load(); l <= threshold && (victim == nil || l < victim.last.Load()) {
			victim = p
		}
	}
	return victim
}

// join registers a handshaken peer; a SUB socket queues its subscriptions
// first, so that none is missed. A ROUTER peer gets its identity, or a
// generated one; an identity another connection holds is refused
// (ErrDuplicateIdentity), as libzmq's ROUTER does with ROUTER_HANDOVER
// off.
func (s *Socket) join(p *peer) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.cfg.Type == ROUTER {
		if len(p.id) == 0 {
			p.id = s.generateIDLocked()
		} else if s.byID[string(p.id)] != nil {
			s.duplicateIDs.Add(1)
			return fmt.Errorf("%w: %q; the first connection keeps it", ErrDuplicateIdentity, p.id)
		}
		s.byID[string(p.id)] = p
	}
	if s.cfg.Type == SUB {
		for _, t := range s.subs {
			p.out.push(subscription(1, t)) // room: Subscribe keeps len(subs) < HWM
		}
	}
	s.peers = append(s.peers, p)
	close(s.joined)
	s.joined = make(chan struct{})
	return nil
}

// generateIDLocked returns a ROUTER identity for a peer without one, as
// libzmq makes them: a zero byte, then a 32-bit counter (starting at a
// random value), skipping any identity a peer holds (a peer may announce
// one of this form).
func (s *Socket) generateIDLocked() []byte {
	for {
		s.nextID++
		id := binary.BigEndian.AppendUint32([]byte{0}, s.nextID)
		if s.byID[string(id)] == nil {
			return id
		}
	}
}

func (s *Socket) leave(p *peer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, q := range s.peers {
		if q == p {
			s.peers = append(s.peers[:i], s.peers[i+1:]...)
			break
		}
	}
	if p.id != nil && s.byID[string(p.id)] == p {
		delete(s.byID, string(p.id))
	}
}

func subscription(op byte, topic []byte) [][]byte {
	return [][]byte{append([]byte{op}, topic...)}
}

// write sends the peer's queued messages, flushing when the queue is empty.
func (p *peer) write() {
	w := bufio.NewWriterSize(p.conn, 32<<10)
	for {
		select {
		case <-p.gone:
			return
		case pong := <-p.pong:
			if _, err := w.Write(pong); err != nil || w.Flush() != nil {
				p.conn.Close()
				return
			}
		case <-p.out.ready:
			for {
				frames, more, ok := p.out.pop()
				if !ok {
					break
				}
				if writeMessage(w, frames) != nil || !more && w.Flush() != nil {
					p.conn.Close()
					return
				}
				p.touch()
			}
		}
	}
}

// read handles the peer's commands and messages until the connection ends.
func (p *peer) read(fr *frameReader) error {
	s := p.s
	for {
		body, msg, err := fr.next()
		if err != nil {
			return err
		}
		if body != nil {
			cmd, err := parseCommand(body)
			if err != nil {
				return err
			}
			switch cmd.name {
			case "READY":
				return fmt.Errorf("%w: a second READY", ErrProtocol)
			case "ERROR":
				return io.EOF // the peer is going away
			case "SUBSCRIBE", "CANCEL": // ZMTP 3.1's form
				if s.cfg.Type == PUB {
					if err := p.subscribe(cmd.name == "SUBSCRIBE", cmd.data); err != nil {
						return err
					}
				}
			case "PING":
				// libzmq sends heartbeats (ZMQ_HEARTBEAT_IVL) to 3.0 peers
				// too and drops those that do not answer.
				select {
				case p.pong <- pongCommand(cmd.data):
				default: // one is pending already
				}
			}
			// Other commands (PONG: we send no PING) are ignored.
			continue
		}
		switch s.cfg.Type {
		case PUB:
			// ZMTP 3.0 subscriptions: one frame, 0x01 or 0x00, then the topic.
			if len(msg) == 1 && len(msg[0]) > 0 && msg[0][0] <= 1 {
				if err := p.subscribe(msg[0][0] == 1, msg[0][1:]); err != nil {
					return err
				}
			}
			continue
		case SUB:
			if !s.subscribed(msg[0]) {
				continue
			}
		case ROUTER:
			msg = append([][]byte{p.id}, msg...)
		}
		p.touch()
		if !s.inbox.put(Message{Frames: msg, Peer: p.remote}, messageBytes(msg)) {
			return ErrClosed
		}
	}
}

func (p *peer) subscribe(add bool, topic []byte) error {
	s := p.s
	s.mu.Lock()
	defer s.mu.Unlock()
	t := string(topic)
	if !add {
		if p.subs[t] > 0 {
			p.subs[t]--
			p.nsubs--
			p.subBytes -= len(t)
			if p.subs[t] == 0 {
				delete(p.subs, t)
			}
		}
		return nil
	}
	if p.nsubs >= s.cfg.MaxSubscriptions {
		return fmt.Errorf("%w: more than %d subscriptions", ErrTooLarge, s.cfg.MaxSubscriptions)
	}
	if p.subBytes+len(t) > maxSubscriptionBytes {
		return fmt.Errorf("%w: subscriptions of more than %d bytes in all", ErrTooLarge, maxSubscriptionBytes)
	}
	p.subs[t]++
	p.nsubs++
	p.subBytes += len(t)
	return nil
}

// Subscribe (SUB) subscribes to messages whose first frame starts with
// topic ("" for all).
func (s *Socket) Subscribe(topic string) error {
	if s.cfg.Type != SUB {
		return fmt.Errorf("%w: Subscribe on a %s socket", ErrBadConfig, s.cfg.Type)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.subs) >= s.cfg.MaxSubscriptions || len(s.subs) >= s.cfg.HWM {
		return fmt.Errorf("%w: subscription %q over the limit of %d", ErrBadConfig, topic, min(s.cfg.MaxSubscriptions, s.cfg.HWM))
	}
	t := []byte(topic)
	s.subs = append(s.subs, t)
	for _, p := range s.peers {
		p.out.push(subscription(1, t)) // room: a SUB peer's queue holds only subscriptions
	}
	return nil
}

func (s *Socket) subscribed(topic []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.subs {
		if bytes.HasPrefix(topic, t) {
			return true
		}
	}
	return false
}

// Subscriptions (PUB) returns how many subscriptions the connected peers
// hold.
func (s *Socket) Subscriptions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, p := range s.peers {
		n += p.nsubs
	}
	return n
}

// Send sends one message. PUB: to every peer subscribed to its first
// frame, dropping it for peers over HWM. ROUTER: the first frame is the
// identity of the peer to send the rest to (unknown: dropped, no error).
// DEALER: to the next peer in turn, waiting up to SendTimeout for one to
// connect and for room in its queue. The frames must not change after.
func (s *Socket) Send(frames [][]byte) error {
	if len(frames) == 0 {
		return fmt.Errorf("%w: a message of no frames", ErrBadConfig)
	}
	switch s.cfg.Type {
	case PUB:
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			return ErrClosed
		}
		for _, p := range s.peers {
			if !p.matches(frames[0]) {
				continue
			}
			if !p.out.push(frames) {
				s.dropped.Add(1)
			}
		}
		return nil
	case ROUTER:
		s.mu.Lock()
		p := s.byID[string(frames[0])]
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return ErrClosed
		}
		if p == nil && s.cfg.Mandatory && len(frames) >= 2 {
			return fmt.Errorf("%w: identity %q", ErrNoPeer, frames[0])
		}
		if p == nil || len(frames) < 2 {
			s.dropped.Add(1)
			return nil
		}
		err := s.enqueue(p, frames[1:], time.NewTimer(s.cfg.SendTimeout))
		if errors.Is(err, ErrStalled) && s.cfg.DropStalled {
			s.dropStalled(p, err)
		}
		return err
	case DEALER:
		timer := time.NewTimer(s.cfg.SendTimeout)
		defer timer.Stop()
		for {
			s.mu.Lock()
			if s.closed {
				s.mu.Unlock()
				return ErrClosed
			}
			joined := s.joined
			var p *peer
			if len(s.peers) > 0 {
				s.rr = (s.rr + 1) % len(s.peers)
				p = s.peers[s.rr]
			}
			s.mu.Unlock()
			if p != nil {
				return s.enqueue(p, frames, timer)
			}
			select {
			case <-joined:
			case <-s.done:
				return ErrClosed
			case <-timer.C:
				return fmt.Errorf("%w after %v", ErrNoPeer, s.cfg.SendTimeout)
			}
		}
	}
	return fmt.Errorf("%w: Send on a %s socket", ErrBadConfig, s.cfg.Type)
}

// enqueue queues frames for p, waiting for room until the timer fires.
func (s *Socket) enqueue(p *peer, frames [][]byte, timer *time.Timer) error {
	defer timer.Stop()
	for !p.out.push(frames) {
		select {
		case <-p.out.room:
		case <-p.gone:
			return fmt.Errorf("zmtp: peer %s disconnected", p.remote)
		case <-s.done:
			return ErrClosed
		case <-timer.C:
			return fmt.Errorf("%w: peer %s: send queue full (%d messages) for %v", ErrStalled, p.remote, s.cfg.HWM, s.cfg.SendTimeout)
		}
	}
	return nil
}

// dropStalled disconnects a peer that stopped reading, once.
func (s *Socket) dropStalled(p *peer, err error) {
	s.mu.Lock()
	first := !p.evicted
	p.evicted = true
	s.mu.Unlock()
	if !first {
		return
	}
	p.conn.Close()
	s.stalled.Add(1)
	s.peerFailed(p.endpoint, p.remote, err)
}

func (p *peer) matches(topic []byte) bool {
	for t := range p.subs {
		if len(topic) >= len(t) && string(topic[:len(t)]) == t {
			return true
		}
	}
	return false
}

// Recv returns the next received message, waiting for one; ErrClosed
// once the socket is closed.
func (s *Socket) Recv() (Message, error) {
	m, ok := s.inbox.get()
	if !ok {
		return Message{}, ErrClosed
	}
	return m, nil
}

// Config returns the socket's configuration, with the defaults filled in.
func (s *Socket) Config() Config { return s.cfg }

// Stats returns the cumulative counts.
func (s *Socket) Stats() Stats {
	st := Stats{Connections: s.connections.Load(), PeerErrors: s.peerErrors.Load(),
		Refused: s.refused.Load(), Dropped: s.dropped.Load(), RefusedPerAddress: s.refusedPerAddr.Load(),
		EvictedIdle: s.evictedIdle.Load(), DuplicateIDs: s.duplicateIDs.Load(), Stalled: s.stalled.Load()}
	st.LastPeerErr = s.lastPeerErr.Load()
	return st
}

// Close closes every connection and listener and waits for the socket's
// goroutines; messages not yet sent are lost.
func (s *Socket) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	for _, ln := range s.listeners {
		ln.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.inbox.close()
	s.wg.Wait()
	return nil
}
