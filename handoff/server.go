package handoff

import (
	"bufio"
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// ServerConfig is the receiving side's network surface: where it listens,
// who may connect, and what connections may hold. Zero fields take the
// defaults; no field means "no limit".
type ServerConfig struct {
	// Addr is where Listen binds (DefaultAddr: loopback, a free port). An
	// address that is not loopback is refused unless AllowRemote.
	Addr string
	// AllowRemote lets the server listen on an address other hosts can
	// reach (a wildcard, a host's address, a name other than localhost).
	AllowRemote bool
	// MaxConns bounds the connections served at once; one past it is
	// answered "busy" and closed before anything is read from it.
	MaxConns int
	// MaxInflightBytes bounds the memory of the requests being received,
	// all connections together: a request's share (its tokens, runs and
	// pages at most) is reserved once its head verified and released when
	// its connection is done; a request it does not fit is refused busy.
	// It must hold one request of Config.Limits.
	MaxInflightBytes int64
	// ReadBuffer is each connection's read buffer, allocated only once a
	// sender's prelude arrived (page bytes are read straight into their
	// buffers).
	ReadBuffer int
	// IdleTimeout bounds each wait for bytes from (or room to write to) a
	// sender; a connection idle past it is closed.
	IdleTimeout time.Duration
	// RequestTimeout bounds a connection from its accept to its last
	// reply.
	RequestTimeout time.Duration
	// Admitted, if not nil, is told each admission and its request before
	// the acknowledgement is sent.
	Admitted func(a Admission, r *Received)
}

var errClosed = errors.New("handoff: server closed")

// Server defaults and fixed limits.
const (
	DefaultAddr                   = "127.0.0.1:0"
	DefaultMaxConns               = 16
	DefaultMaxInflightBytes int64 = 8 << 30
	DefaultReadBuffer             = 16 << 10
	DefaultIdleTimeout            = 10 * time.Second
	DefaultRequestTimeout         = 2 * time.Minute
	// DrainTimeout bounds the wait, after a refusal, for the sender to
	// read it: the server reads (and drops) what the sender was still
	// writing, at most the longest header, so the refusal is not lost to a
	// reset.
	DrainTimeout = time.Second
	// MaxReadBuffer bounds ReadBuffer.
	MaxReadBuffer = 1 << 20
)

func (c *ServerConfig) check(cfg *Config) error {
	switch {
	case c.MaxConns < 0 || c.MaxInflightBytes < 0 || c.ReadBuffer < 0 || c.IdleTimeout < 0 || c.RequestTimeout < 0:
		return fmt.Errorf("%w: MaxConns %d, MaxInflightBytes %d, ReadBuffer %d, IdleTimeout %v, RequestTimeout %v: want >= 0 (0: the default)",
			ErrBadConfig, c.MaxConns, c.MaxInflightBytes, c.ReadBuffer, c.IdleTimeout, c.RequestTimeout)
	case c.ReadBuffer > MaxReadBuffer:
		return fmt.Errorf("%w: ReadBuffer %d: at most %d", ErrBadConfig, c.ReadBuffer, MaxReadBuffer)
	}
	c.Addr = cmp.Or(c.Addr, DefaultAddr)
	c.MaxConns = cmp.Or(c.MaxConns, DefaultMaxConns)
	c.MaxInflightBytes = cmp.Or(c.MaxInflightBytes, DefaultMaxInflightBytes)
	c.ReadBuffer = cmp.Or(c.ReadBuffer, DefaultReadBuffer)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, DefaultIdleTimeout)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, DefaultRequestTimeout)
	p := cfg.Limits.MaxPages
	largest := (&head{lens: [4]int{MaxString, MaxString, MaxString, MaxString}, tokens: p * cfg.Format.PageSize, runs: p, npages: p}).memory(cfg)
	if c.MaxInflightBytes < largest {
		return fmt.Errorf("%w: MaxInflightBytes %d cannot hold one request of Limits.MaxPages %d (%d bytes): raise it, or lower the limits", ErrBadConfig, c.MaxInflightBytes, p, largest)
	}
	return nil
}

// ServerStats are a server's counters. Every connection accepted ends in
// exactly one of RefusedConns, RefusedBusy, AuthFailures, BadStreams,
// TimedOut, Refused, Admitted, AlreadyHeld.
type ServerStats struct {
	Open          int64 // connections being served now
	Accepted      int64 // connections accepted, RefusedConns included
	RefusedConns  int64 // answered busy at accept: MaxConns were open
	RefusedBusy   int64 // requests refused busy: MaxInflightBytes reserved
	AuthFailures  int64 // streams whose tag did not verify
	BadStreams    int64 // other streams refused: version, limits, values, cut, a failed TLS handshake
	TimedOut      int64 // connections closed at the idle or request deadline
	Refused       int64 // verified requests the store refused (ErrFull)
	Admitted      int64 // requests admitted with all their bytes taken
	AlreadyHeld   int64 // requests admitted and answered "already held"
	BytesInFlight int64 // reserved by requests being received, now
	BytesRead     int64 // stream bytes read from senders
}

// Server receives requests into a Store: one request per connection,
// verified, admitted, acknowledged (see the package doc).
type Server struct {
	st  *Store
	cfg ServerConfig

	mu     sync.Mutex
	lns    []net.Listener
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup

	inflight atomic.Int64
	stats    struct {
		accepted, refusedConns, refusedBusy, auth, bad, timedOut, refused, admitted, held, read atomic.Int64
	}
}

// NewServer returns a server admitting into st (whose Config, key and
// TLS included, is the receiving side's), not yet serving.
func NewServer(st *Store, cfg ServerConfig) (*Server, error) {
	if err := cfg.check(&st.cfg); err != nil {
		return nil, err
	}
	return &Server{st: st, cfg: cfg, conns: map[net.Conn]struct{}{}}, nil
}

// Listen binds cfg.Addr and serves st on it until Close: NewServer, a
// listener and Serve in a goroutine. Its address is Addr.
func Listen(st *Store, cfg ServerConfig) (*Server, error) {
	s, err := NewServer(st, cfg)
	if err != nil {
		return nil, err
	}
	if err := s.checkAddr(s.cfg.Addr); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("handoff: listen: %w", err)
	}
	if err := s.checkListener(ln); err != nil {
		ln.Close()
		return nil, err
	}
	s.mu.Lock()
	s.lns = append(s.lns, ln)
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.serve(ln)
	}()
	return s, nil
}

// Addr is the address of the listener Listen bound (nil for a server
// that only Serves).
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.lns) == 0 {
		return nil
	}
	return s.lns[0].Addr()
}

// checkAddr refuses, before binding, an address other hosts can reach
// unless AllowRemote.
func (s *Server) checkAddr(addr string) error {
	if s.cfg.AllowRemote {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%w: ServerConfig.Addr %q: %w", ErrBadConfig, addr, err)
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return fmt.Errorf("%w: ServerConfig.Addr %q is not a loopback address: set ServerConfig.AllowRemote to accept senders from other hosts (docs/tiers.md, Trust)", ErrBadConfig, addr)
}

// checkListener refuses a listener other hosts can reach unless
// AllowRemote.
func (s *Server) checkListener(ln net.Listener) error {
	if s.cfg.AllowRemote {
		return nil
	}
	switch a := ln.Addr().(type) {
	case *net.TCPAddr:
		if a.IP.IsLoopback() {
			return nil
		}
	case *net.UnixAddr:
		return nil
	}
	return fmt.Errorf("%w: listening on %s, not a loopback address: set ServerConfig.AllowRemote to accept senders from other hosts (docs/tiers.md, Trust)", ErrBadConfig, ln.Addr())
}

// Serve accepts connections on ln until it or the server is closed,
// reading one request per connection. It refuses a listener that is not
// on loopback unless AllowRemote. It returns nil once Close was called,
// else ln's Accept error.
func (s *Server) Serve(ln net.Listener) error {
	if err := s.checkListener(ln); err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errClosed
	}
	s.lns = append(s.lns, ln)
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	return s.serve(ln)
}

func (s *Server) serve(ln net.Listener) error {
	backoff := time.Millisecond
	for {
		c, err := ln.Accept()
		if err != nil {
			if s.isClosed() {
				return nil
			}
			if t, ok := err.(interface{ Temporary() bool }); ok && t.Temporary() { // EMFILE and the like
				time.Sleep(backoff)
				backoff = min(2*backoff, time.Second)
				continue
			}
			return err
		}
		backoff = time.Millisecond
		s.stats.accepted.Add(1)
		if !s.track(c) {
			s.stats.refusedConns.Add(1)
			if s.st.cfg.TLS == nil {
				c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
				c.Write(appendRefusal(nil, fmt.Sprintf("%s: %d connections open (MaxConns)", ErrBusy, s.cfg.MaxConns)))
			}
			c.Close()
			continue
		}
		go s.serveConn(c)
	}
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// track counts c in, unless MaxConns are open or the server is closed.
func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || len(s.conns) >= s.cfg.MaxConns {
		return false
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	return true
}

// Close stops accepting, closes every connection (admitting nothing more)
// and waits for the server's goroutines.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for _, ln := range s.lns {
		ln.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// Stats returns the server's counters.
func (s *Server) Stats() ServerStats {
	s.mu.Lock()
	open := len(s.conns)
	s.mu.Unlock()
	c := &s.stats
	return ServerStats{
		Open: int64(open), Accepted: c.accepted.Load(), RefusedConns: c.refusedConns.Load(), RefusedBusy: c.refusedBusy.Load(),
		AuthFailures: c.auth.Load(), BadStreams: c.bad.Load(), TimedOut: c.timedOut.Load(), Refused: c.refused.Load(),
		Admitted: c.admitted.Load(), AlreadyHeld: c.held.Load(), BytesInFlight: s.inflight.Load(), BytesRead: c.read.Load(),
	}
}

// reserve takes n bytes of MaxInflightBytes, if they are free.
func (s *Server) reserve(n int64) bool {
	for {
		cur := s.inflight.Load()
		if cur+n > s.cfg.MaxInflightBytes {
			return false
		}
		if s.inflight.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// deadlineConn sets a deadline before each read and write: IdleTimeout
// from now, never past the request's end.
type deadlineConn struct {
	net.Conn
	idle time.Duration
	end  time.Time
}

func (c *deadlineConn) deadline() time.Time {
	d := time.Now().Add(c.idle)
	if d.After(c.end) {
		d = c.end
	}
	return d
}

func (c *deadlineConn) Read(b []byte) (int, error) {
	c.Conn.SetReadDeadline(c.deadline())
	return c.Conn.Read(b)
}

func (c *deadlineConn) Write(b []byte) (int, error) {
	c.Conn.SetWriteDeadline(c.deadline())
	return c.Conn.Write(b)
}

func (c *deadlineConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// outcome is how a connection ended.
type outcome int

const (
	outBad outcome = iota
	outAuth
	outTimeout
	outBusy
	outRefused
	outAdmitted
	outHeld
)

func (s *Server) serveConn(raw net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, raw)
		s.mu.Unlock()
		raw.Close()
	}()
	dc := &deadlineConn{Conn: raw, idle: s.cfg.IdleTimeout, end: time.Now().Add(s.cfg.RequestTimeout)}
	var c net.Conn = dc
	if s.st.cfg.TLS != nil {
		c = tls.Server(dc, s.st.cfg.TLS)
	}
	h := handling{c: c, dc: dc}
	out := s.handle(&h)
	// Counted before the final reply is written (and before the drain): a
	// sender that has its answer sees it in Stats at once.
	s.stats.read.Add(h.read)
	s.counter(out).Add(1)
	if h.reply != nil {
		c.Write(h.reply)
	}
	if h.refused {
		s.drain(&h)
	}
}

// handling is one connection's state: what the counters and the drain
// need after handle.
type handling struct {
	c       net.Conn
	dc      *deadlineConn
	br      *bufio.Reader // nil until the hello was sent
	read    int64         // stream bytes read
	reply   []byte        // the final reply, written after the counters
	refused bool          // a refusal is the reply: drain after it
}

// counter is the counter of an outcome.
func (s *Server) counter(out outcome) *atomic.Int64 {
	c := &s.stats
	switch out {
	case outAuth:
		return &c.auth
	case outTimeout:
		return &c.timedOut
	case outBusy:
		return &c.refusedBusy
	case outRefused:
		return &c.refused
	case outAdmitted:
		return &c.admitted
	case outHeld:
		return &c.held
	}
	return &c.bad
}

// classify is the outcome of a stream error.
func classify(err error) outcome {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return outTimeout
	case errors.Is(err, ErrAuth):
		return outAuth
	}
	return outBad
}

// handle reads, verifies, admits and acknowledges h's request; it returns
// how that ended.
func (s *Server) handle(h *handling) outcome {
	cfg, c := &s.st.cfg, h.c
	var p [preludeBytes]byte
	if _, err := io.ReadFull(c, p[:]); err != nil {
		return classify(err)
	}
	h.read = preludeBytes
	if err := checkPrelude(p[:]); err != nil {
		c.Write(appendRefusal(nil, err.Error()))
		h.refused = true
		return outBad
	}
	nonce := NewNonce()
	hello := make([]byte, 0, helloBytes)
	hello = append(append(hello, prelude[:]...), nonce[:]...)
	if !cfg.Insecure {
		hello[5] = helloAuth
	}
	if _, err := c.Write(hello); err != nil {
		return classify(err)
	}
	h.br = bufio.NewReaderSize(c, s.cfg.ReadBuffer)
	sr := newStreamReader(h.br, cfg, &nonce)
	defer func() { h.read = sr.bytes }()
	refuse := func(seq, status byte, err error, out outcome) outcome {
		h.reply = appendReply(nil, cfg, &nonce, seq, status, err.Error())
		h.refused = true
		return out
	}
	if err := sr.readHead(); err != nil {
		return refuse(replyVerdict, ackRefused, err, classify(err))
	}
	mem := sr.h.memory(cfg)
	if !s.reserve(mem) {
		return refuse(replyVerdict, ackBusy, fmt.Errorf("%w: the request needs %d bytes, %d of MaxInflightBytes %d are reserved", ErrBusy, mem, s.inflight.Load(), s.cfg.MaxInflightBytes), outBusy)
	}
	defer s.inflight.Add(-mem)
	if !s.st.fits(sr.h.npages) {
		return refuse(replyVerdict, ackRefused, fmt.Errorf("%w: %d pages, the store holds at most %d", ErrFull, sr.h.npages, s.st.maxPages), outRefused)
	}
	if err := sr.readBody(); err != nil {
		return refuse(replyVerdict, ackRefused, err, classify(err))
	}
	if _, err := c.Write(appendReply(nil, cfg, &nonce, replyVerdict, ackContinue, "")); err != nil {
		return classify(err)
	}
	rec, err := sr.readPages()
	if err != nil {
		return refuse(replyAck, ackRefused, err, classify(err))
	}
	a, err := s.st.Admit(rec)
	if err != nil {
		return refuse(replyAck, ackRefused, err, outRefused)
	}
	if s.cfg.Admitted != nil {
		s.cfg.Admitted(a, rec)
	}
	status, out := byte(ackAdmitted), outAdmitted
	if a.Held > 0 {
		status, out = ackAlreadyHeld, outHeld
	}
	h.reply = appendReply(nil, cfg, &nonce, replyAck, status, admissionMsg(a))
	return out
}

// drain, after a refusal, closes the writing side and reads (and drops)
// what the sender was still writing, at most the longest header and
// DrainTimeout, so that the refusal reaches it rather than a reset.
func (s *Server) drain(h *handling) {
	if cw, ok := h.c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	if end := time.Now().Add(DrainTimeout); end.Before(h.dc.end) {
		h.dc.end = end
	}
	var r io.Reader = h.c
	if h.br != nil {
		r = h.br
	}
	io.CopyN(io.Discard, r, maxHeaderBytes(&s.st.cfg))
}
