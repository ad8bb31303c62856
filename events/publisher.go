package events

import (
	"cmp"
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
	// DefaultReplayHWM is how many replies may wait to be sent to one
	// replay client (libzmq's default SNDHWM, which vLLM's replay socket
	// keeps). A replay of more batches is sent as the client reads.
	DefaultReplayHWM = 1000
	// DefaultReplayStallTimeout is how long a replay client's queue may
	// stay full before the client is disconnected.
	DefaultReplayStallTimeout = 2 * time.Second
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
	// ReplayHWM bounds the replies queued for one replay client (0:
	// DefaultReplayHWM). A client whose queue stays full for
	// ReplayStallTimeout (0: DefaultReplayStallTimeout) is disconnected
	// (PublisherStats.ReplayPeersDropped); each replay is sent by its own
	// goroutine, so such a client delays no other.
	ReplayHWM          int
	ReplayStallTimeout time.Duration
	// MaxPeers, MaxPeersPerAddress and IdleTimeout bound each bound
	// socket's connections (0: zmtp's defaults, docs/events.md "Limits"):
	// in all, per remote IP, and how long a peer must have been idle
	// before a newcomer to a full socket may evict it.
	MaxPeers, MaxPeersPerAddress int
	IdleTimeout                  time.Duration
}

// PublisherStats are a Publisher's cumulative counts.
type PublisherStats struct {
	Batches, Events, Pages, Bytes int64
	LastSeq                       int64 // -1 before the first batch
	Replays                       int64 // replay requests served
	Replayed                      int64 // batches re-sent by them (counted as each replay ends)
	SendErrors                    int64
	// ReplaysBusy counts requests dropped because 16 of the same
	// client's were already waiting for its replay in progress;
	// ReplaysCut replays that ended early
	// (end marker sent) because the buffer had moved past a batch not yet
	// sent; ReplayPeersDropped replay clients disconnected for not reading
	// (ReplayStallTimeout, also in PeerErrors).
	ReplaysBusy, ReplaysCut, ReplayPeersDropped int64
	// PeerErrors counts peers of either socket disconnected for breaking
	// ZMTP or a limit (MaxRequestBytes, a duplicate replay identity, a
	// replay client that does not read); LastPeerErr names the last one's
	// address.
	PeerErrors  int64
	LastPeerErr string
	// Refused counts connections refused (over MaxPeers with no idle peer
	// to evict, or over MaxPeersPerAddress), EvictedIdle idle peers
	// disconnected to make room: both sockets together.
	Refused, EvictedIdle int64
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

	mu        sync.Mutex // guards ring, replaying and stats
	ring      []entry
	head      int // index of the oldest entry
	n         int
	replaying map[string]*replayJob // by identity: replays being sent
	stats     PublisherStats
}

type entry struct {
	seq     uint64
	payload []byte
}

// NewPublisher opens the sockets and starts the publishing goroutine.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	cfg.BufferSteps = cmp.Or(cfg.BufferSteps, DefaultBufferSteps)
	cfg.HWM = cmp.Or(cfg.HWM, DefaultHWM)
	cfg.MaxQueue = cmp.Or(cfg.MaxQueue, DefaultMaxQueue)
	cfg.MaxRequestBytes = cmp.Or(cfg.MaxRequestBytes, DefaultMaxRequestBytes)
	cfg.ReplayHWM = cmp.Or(cfg.ReplayHWM, DefaultReplayHWM)
	cfg.ReplayStallTimeout = cmp.Or(cfg.ReplayStallTimeout, DefaultReplayStallTimeout)
	switch {
	case cfg.Endpoint == "":
		return nil, fmt.Errorf("%w: no endpoint", ErrBadConfig)
	case cfg.BufferSteps < 0 || cfg.HWM < 0 || cfg.MaxQueue < 0 || cfg.MaxRequestBytes < 0 || cfg.ReplayHWM < 0 || cfg.ReplayStallTimeout < 0:
		return nil, fmt.Errorf("%w: buffer steps %d, hwm %d, max queue %d, max request bytes %d, replay hwm %d, replay stall timeout %v: want >= 0",
			ErrBadConfig, cfg.BufferSteps, cfg.HWM, cfg.MaxQueue, cfg.MaxRequestBytes, cfg.ReplayHWM, cfg.ReplayStallTimeout)
	case cfg.Mode > Connect:
		return nil, fmt.Errorf("%w: bind mode %d", ErrBadConfig, cfg.Mode)
	}
	q, err := NewQueue(cfg.MaxQueue)
	if err != nil {
		return nil, err
	}
	p := &Publisher{cfg: cfg, q: q, topic: []byte(cfg.Topic), done: make(chan struct{}), ring: make([]entry, cfg.BufferSteps),
		replaying: map[string]*replayJob{}}
	p.stats.LastSeq = -1
	sockCfg := zmtp.Config{Type: zmtp.PUB, HWM: cfg.HWM, MaxMessageBytes: cfg.MaxRequestBytes,
		MaxPeers: cfg.MaxPeers, MaxPeersPerAddress: cfg.MaxPeersPerAddress, IdleTimeout: cfg.IdleTimeout}
	if p.pub, err = zmtp.New(sockCfg); err != nil {
		return nil, zmtp.TagBadConfig(err, ErrBadConfig)
	}
	if p.endpoint, err = open(p.pub, cfg.Endpoint, cfg.Mode); err != nil {
		p.pub.Close()
		return nil, zmtp.TagBadConfig(err, ErrBadConfig)
	}
	if cfg.ReplayEndpoint != "" {
		// A replay client has ReplayHWM replies queued at most; one whose
		// queue stays full for ReplayStallTimeout is disconnected
		// (DropStalled), and a reply to a client gone is an error
		// (Mandatory), which ends its replay.
		sockCfg.Type = zmtp.ROUTER
		sockCfg.HWM = cfg.ReplayHWM
		sockCfg.SendTimeout = cfg.ReplayStallTimeout
		sockCfg.Mandatory, sockCfg.DropStalled = true, true
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
		st.Refused += ss.Refused + ss.RefusedPerAddress
		st.EvictedIdle += ss.EvictedIdle
		if s == p.replay {
			st.ReplayPeersDropped = ss.Stalled
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

// readReplays takes requests from the ROUTER socket, on its own
// goroutine, and starts each replay on a goroutine of its own: a slow
// replay client holds up its own replies, never another client's nor the
// PUB stream.
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

// serveReplay answers [identity, "", start-seq] like vLLM: every batch
// buffered when the request is taken from start-seq on as [identity, "",
// topic, seq, payload], then [identity, "", "", -1, ""]. A malformed
// request is ignored, as vLLM does. A client's requests are answered one
// after the other, in order, as vLLM's single socket does: those that
// arrive while the client's replay is being sent wait for it, at most
// maxWaitingReplays of them; more are dropped (ReplaysBusy).
func (p *Publisher) serveReplay(frames [][]byte) {
	if len(frames) != 3 || len(frames[2]) != 8 {
		return
	}
	id := frames[0]
	start := binary.BigEndian.Uint64(frames[2])
	p.mu.Lock()
	defer p.mu.Unlock()
	if job := p.replaying[string(id)]; job != nil {
		if len(job.waiting) >= maxWaitingReplays {
			p.stats.ReplaysBusy++
			return
		}
		job.waiting = append(job.waiting, start)
		return
	}
	job := &replayJob{}
	p.replaying[string(id)] = job
	from, count := p.replayRangeLocked(start)
	p.wg.Add(1)
	go p.replayTo(id, job, from, count)
}

// maxWaitingReplays bounds the requests of one client that wait while its
// replay is being sent.
const maxWaitingReplays = 16

// replayJob is a client's replay in progress, and the start sequences of
// the requests it sent meanwhile, oldest first.
type replayJob struct {
	waiting []uint64
}

// replayRangeLocked returns the buffered batches from start on: the first
// sequence and how many (seqs in the ring are consecutive, oldest at
// head), and counts the replay.
func (p *Publisher) replayRangeLocked(start uint64) (from, count uint64) {
	p.stats.Replays++
	if p.n == 0 {
		return 0, 0
	}
	oldest := p.ring[p.head].seq
	newest := oldest + uint64(p.n) - 1
	from = max(start, oldest)
	if from > newest {
		return from, 0
	}
	return from, newest - from + 1
}

// replayTo sends batches from..from+count-1 to the client id, then the end
// marker, then replays the client's waiting requests. Each batch is
// looked up as it is sent (the ring is not copied); one the ring has
// dropped meanwhile ends the replay early, with the end marker. A send
// error (the client gone, disconnected for not reading, the socket
// closed) ends it without one.
func (p *Publisher) replayTo(id []byte, job *replayJob, from, count uint64) {
	defer p.wg.Done()
	for {
		var sent int64
		ok := true
		for seq := from; seq < from+count; seq++ {
			p.mu.Lock()
			oldest := p.ring[p.head].seq
			if seq < oldest {
				p.stats.ReplaysCut++
				p.mu.Unlock()
				break
			}
			e := p.ring[(p.head+int(seq-oldest))%len(p.ring)]
			p.mu.Unlock()
			if p.replay.Send([][]byte{id, nil, p.topic, seqFrame(e.seq), e.payload}) != nil {
				ok = false
				break
			}
			sent++
		}
		p.mu.Lock()
		p.stats.Replayed += sent
		p.mu.Unlock()
		if ok {
			ok = p.replay.Send([][]byte{id, nil, nil, EndOfReplay, nil}) == nil
		}
		p.mu.Lock()
		if !ok || len(job.waiting) == 0 {
			delete(p.replaying, string(id))
			p.mu.Unlock()
			return
		}
		from, count = p.replayRangeLocked(job.waiting[0])
		job.waiting = job.waiting[1:]
		p.mu.Unlock()
	}
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
