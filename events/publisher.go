package events

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pagedkv/pagedkv/internal/zmtp"
)

// Bind modes of a [PublisherConfig] endpoint.
type BindMode uint8

const (
	// BindAuto follows vLLM: bind when the endpoint has a wildcard ("*" or
	// "::") or is ipc:// or inproc://, connect otherwise ("bind stable,
	// connect volatile").
	BindAuto BindMode = iota
	// Bind binds the PUB socket to the endpoint.
	Bind
	// BindOrConnect binds, and connects instead when the address is in use
	// (a subscriber bound it first).
	BindOrConnect
	// Connect connects the PUB socket to a bound subscriber.
	Connect
)

// Defaults of PublisherConfig, vLLM's KVEventsConfig defaults where it has
// one.
const (
	DefaultBufferSteps = 10_000
	DefaultHWM         = 100_000
	DefaultMaxQueue    = 1024
	// DefaultMaxRequestBytes bounds what the publisher reads from a peer
	// in one message: a subscription on the PUB socket, a request on the
	// replay socket (8 bytes in vLLM's protocol).
	DefaultMaxRequestBytes = 4096
)

// PublisherConfig describes a [Publisher].
type PublisherConfig struct {
	// Endpoint is the PUB socket's address, e.g. "tcp://*:5557" or
	// "tcp://127.0.0.1:0" (a free port; see [Publisher.Endpoint]).
	Endpoint string
	Mode     BindMode
	// ReplayEndpoint, when set, is bound as the ROUTER socket that serves
	// replays; "" means no replay.
	ReplayEndpoint string
	// Topic is the first frame of every message ("" is vLLM's default;
	// subscribers match it as a prefix).
	Topic string
	// BufferSteps is how many past batches replays can return (0:
	// DefaultBufferSteps). HWM bounds the PUB socket's send queue (0:
	// DefaultHWM). MaxQueue bounds the batches between the Recorder and
	// the publishing goroutine (0: DefaultMaxQueue); a full queue makes
	// the Recorder drop and resynchronise, never wait.
	BufferSteps, HWM, MaxQueue int
	// DataParallelRank is the batch's data_parallel_rank.
	DataParallelRank int
	// Linger is how long Close keeps serving replays and flushing the PUB
	// socket after the last batch is sent.
	Linger time.Duration
	// MaxRequestBytes bounds every message the publisher reads (0:
	// DefaultMaxRequestBytes), checked from the frame headers before
	// anything is allocated: a peer that declares more is disconnected and
	// counted in PublisherStats.PeerErrors.
	MaxRequestBytes int64
}

// PublisherStats are a Publisher's cumulative counts.
type PublisherStats struct {
	Batches, Events, Pages, Bytes int64
	LastSeq                       int64 // -1 before the first batch
	Replays                       int64 // replay requests served
	Replayed                      int64 // batches re-sent by them
	SendErrors                    int64
	// PeerErrors counts peers of either socket disconnected for breaking
	// ZMTP or MaxRequestBytes; LastPeerErr names the last one's address.
	PeerErrors  int64
	LastPeerErr string
}

// Publisher sends batches from its [Queue] in vLLM's wire format over
// ZeroMQ. Make it with [NewPublisher], give the Manager its Recorder, and
// Close it when the engine stops.
type Publisher struct {
	cfg      PublisherConfig
	q        *Queue
	pub      *zmtp.Socket
	replay   *zmtp.Socket // nil without a replay endpoint
	endpoint string
	replayEP string
	topic    []byte

	done  chan struct{}
	wg    sync.WaitGroup
	close sync.Once

	mu    sync.Mutex // guards ring and stats
	ring  []entry
	head  int // index of the oldest entry
	n     int
	stats PublisherStats
}

type entry struct {
	seq     uint64
	payload []byte
}

// NewPublisher opens the sockets and starts the publishing goroutine.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if cfg.BufferSteps == 0 {
		cfg.BufferSteps = DefaultBufferSteps
	}
	if cfg.HWM == 0 {
		cfg.HWM = DefaultHWM
	}
	if cfg.MaxQueue == 0 {
		cfg.MaxQueue = DefaultMaxQueue
	}
	if cfg.MaxRequestBytes == 0 {
		cfg.MaxRequestBytes = DefaultMaxRequestBytes
	}
	switch {
	case cfg.Endpoint == "":
		return nil, fmt.Errorf("%w: no endpoint", ErrBadConfig)
	case cfg.BufferSteps < 0 || cfg.HWM < 0 || cfg.MaxQueue < 0 || cfg.MaxRequestBytes < 0:
		return nil, fmt.Errorf("%w: buffer steps %d, hwm %d, max queue %d, max request bytes %d: want >= 0",
			ErrBadConfig, cfg.BufferSteps, cfg.HWM, cfg.MaxQueue, cfg.MaxRequestBytes)
	case cfg.Mode > Connect:
		return nil, fmt.Errorf("%w: bind mode %d", ErrBadConfig, cfg.Mode)
	}
	q, err := NewQueue(cfg.MaxQueue)
	if err != nil {
		return nil, err
	}
	p := &Publisher{cfg: cfg, q: q, topic: []byte(cfg.Topic), done: make(chan struct{}), ring: make([]entry, cfg.BufferSteps)}
	p.stats.LastSeq = -1
	sockCfg := zmtp.Config{Type: zmtp.PUB, HWM: cfg.HWM, MaxMessageBytes: cfg.MaxRequestBytes}
	if p.pub, err = zmtp.New(sockCfg); err != nil {
		return nil, zmtp.TagBadConfig(err, ErrBadConfig)
	}
	if p.endpoint, err = open(p.pub, cfg.Endpoint, cfg.Mode); err != nil {
		p.pub.Close()
		return nil, zmtp.TagBadConfig(err, ErrBadConfig)
	}
	if cfg.ReplayEndpoint != "" {
		// A bounded send (SendTimeout): a replay client that stops reading
		// loses its replies instead of holding the replay goroutine.
		sockCfg.Type = zmtp.ROUTER
		if p.replay, err = zmtp.New(sockCfg); err == nil {
			p.replayEP, err = open(p.replay, cfg.ReplayEndpoint, Bind)
		}
		if err != nil {
			if p.replay != nil {
				p.replay.Close()
			}
			p.pub.Close()
			return nil, fmt.Errorf("events: replay endpoint: %w", zmtp.TagBadConfig(err, ErrBadConfig))
		}
		p.wg.Add(1)
		go p.readReplays()
	}
	p.wg.Add(1)
	go p.run()
	return p, nil
}

// open binds or connects s to ep and returns the endpoint actually bound
// (the port chosen for ":0") or connected.
func open(s *zmtp.Socket, ep string, mode BindMode) (string, error) {
	if mode == BindAuto {
		mode = Connect
		if strings.Contains(ep, "*") || strings.Contains(ep, "::") || strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://") {
			mode = Bind
		}
	}
	if mode == Connect {
		if err := s.Connect(ep); err != nil {
			return "", fmt.Errorf("events: connect to %q: %w", ep, err)
		}
		return ep, nil
	}
	bound, err := s.Bind(ep)
	if err != nil && mode == BindOrConnect && errors.Is(err, syscall.EADDRINUSE) {
		if derr := s.Connect(ep); derr != nil {
			return "", fmt.Errorf("events: %q is in use and connecting to it failed: %w", ep, derr)
		}
		return ep, nil
	}
	if err != nil {
		return "", fmt.Errorf("events: bind %q: %w", ep, err)
	}
	return bound, nil
}

// Queue is the queue a Recorder for this publisher flushes into.
func (p *Publisher) Queue() *Queue { return p.q }

// NewRecorder returns a Recorder that flushes into this publisher.
func (p *Publisher) NewRecorder(cfg RecorderConfig) (*Recorder, error) { return NewRecorder(cfg, p.q) }

// Endpoint returns the PUB endpoint as bound (with the port a ":0"
// endpoint was given) or connected.
func (p *Publisher) Endpoint() string { return p.endpoint }

// ReplayEndpoint returns the bound ROUTER endpoint, or "".
func (p *Publisher) ReplayEndpoint() string { return p.replayEP }

// Subscribed reports whether at least one subscriber has subscribed.
func (p *Publisher) Subscribed() bool { return p.pub.Subscriptions() > 0 }

// WaitSubscribed waits up to timeout for a first subscriber and reports
// whether one came. PUB drops what it sends before anyone subscribes.
func (p *Publisher) WaitSubscribed(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for !p.Subscribed() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// Stats returns the cumulative counts.
func (p *Publisher) Stats() PublisherStats {
	p.mu.Lock()
	st := p.stats
	p.mu.Unlock()
	for _, s := range []*zmtp.Socket{p.pub, p.replay} {
		if s == nil {
			continue
		}
		ss := s.Stats()
		st.PeerErrors += ss.PeerErrors
		if ss.LastPeerErr != "" {
			st.LastPeerErr = ss.LastPeerErr
		}
	}
	return st
}

// WaitSent blocks until every batch flushed so far has been sent (or
// timeout) and reports whether it was; the sequence number of the last one
// is Stats().LastSeq.
func (p *Publisher) WaitSent(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for p.q.offered.Load() != p.sentCount() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Microsecond)
	}
	return true
}

func (p *Publisher) sentCount() int64 { return p.Stats().Batches }

// run is the publishing goroutine: it sends queued batches in order.
func (p *Publisher) run() {
	defer p.wg.Done()
	enc := NewEncoder()
	var seq uint64
	for b := range p.q.full {
		payload := enc.AppendBatch(nil, b, p.cfg.DataParallelRank)
		nev, npages := b.Len(), b.Pages()
		p.q.Done(b)
		err := p.pub.Send([][]byte{p.topic, seqFrame(seq), payload})
		p.mu.Lock()
		if err != nil {
			p.stats.SendErrors++
		}
		p.push(seq, payload)
		p.stats.Batches++
		p.stats.Events += int64(nev)
		p.stats.Pages += int64(npages)
		p.stats.Bytes += int64(len(payload))
		p.stats.LastSeq = int64(seq)
		p.mu.Unlock()
		seq++
	}
	p.linger()
	close(p.done)
}

// linger keeps the sockets open for cfg.Linger after the last batch: the
// PUB socket flushes and replays are still served.
func (p *Publisher) linger() {
	if p.cfg.Linger > 0 {
		time.Sleep(p.cfg.Linger)
	}
}

// push appends to the replay ring, dropping the oldest entry when full.
func (p *Publisher) push(seq uint64, payload []byte) {
	if len(p.ring) == 0 {
		return
	}
	if p.n == len(p.ring) {
		p.ring[p.head] = entry{seq, payload}
		p.head = (p.head + 1) % len(p.ring)
		return
	}
	p.ring[(p.head+p.n)%len(p.ring)] = entry{seq, payload}
	p.n++
}

// readReplays serves requests from the ROUTER socket, on its own
// goroutine: a slow replay client holds up its replies, never the PUB
// stream.
func (p *Publisher) readReplays() {
	defer p.wg.Done()
	for {
		msg, err := p.replay.Recv()
		if err != nil {
			return // closed
		}
		p.serveReplay(msg.Frames)
	}
}

// serveReplay answers [identity, "", start-seq] like vLLM: every buffered
// batch from start-seq on as [identity, "", topic, seq, payload], then
// [identity, "", "", -1, ""]. A malformed request is ignored, as vLLM
// does.
func (p *Publisher) serveReplay(frames [][]byte) {
	if len(frames) != 3 || len(frames[2]) != 8 {
		return
	}
	id := frames[0]
	start := binary.BigEndian.Uint64(frames[2])
	p.mu.Lock()
	var out []entry
	for i := range p.n {
		e := p.ring[(p.head+i)%len(p.ring)]
		if e.seq >= start {
			out = append(out, e)
		}
	}
	p.stats.Replays++
	p.stats.Replayed += int64(len(out))
	p.mu.Unlock()
	for _, e := range out {
		if p.replay.Send([][]byte{id, nil, p.topic, seqFrame(e.seq), e.payload}) != nil {
			return
		}
	}
	_ = p.replay.Send([][]byte{id, nil, nil, EndOfReplay, nil})
}

// Close sends what is queued, keeps serving replays for Linger, and closes
// the sockets. The Recorder must not flush after Close.
func (p *Publisher) Close() error {
	var err error
	p.close.Do(func() {
		p.q.Close()
		<-p.done
		err = p.pub.Close()
		if p.replay != nil {
			if e := p.replay.Close(); err == nil {
				err = e
			}
		}
		p.wg.Wait()
	})
	return err
}
