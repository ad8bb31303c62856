package kvindex

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/pagedkv/pagedkv/internal/zmtp"
)

// Source is one replica's event stream.
type Source struct {
	Name string
	// Endpoint is the publisher's PUB address; ReplayEndpoint its ROUTER
	// address ("" when it serves no replays: gaps then cannot be repaired).
	// Both are tcp://host:port or ipc://path, connected in the background
	// and reconnected every 100ms while nobody listens there, as ZeroMQ
	// does; a malformed one is refused by NewSubscriber (ErrBadConfig).
	Endpoint, ReplayEndpoint string
}

// SubscriberConfig describes a Subscriber.
type SubscriberConfig struct {
	// Topic is the subscription (a prefix of the publishers' topic; ""
	// takes everything).
	Topic string
	// ReplayTimeout bounds the wait for each reply of a replay, and for a
	// replay request to be sent (0: DefaultReplayTimeout).
	ReplayTimeout time.Duration
	// ReplayDeadline bounds one replay as a whole, from its request to its
	// end marker (0: DefaultReplayDeadline); MaxReplayReplies and
	// MaxReplayBytes bound what one replay may answer, end marker included
	// (0: DefaultMaxReplayReplies, DefaultMaxReplayBytes; a reply's bytes
	// are its frames'). A replay past any of them is abandoned: the source
	// stops waiting for it, clears the replica's blocks (the replica may
	// have removed any of them meanwhile) and takes the live stream on, as
	// after a gap no replay fills (SourceStats.ReplaysPastDeadline,
	// ReplaysOverBudget). While a source replays it applies no live
	// message, so these bound how long a replay endpoint can hold the
	// replica's index back, whatever it sends.
	ReplayDeadline   time.Duration
	MaxReplayReplies int
	MaxReplayBytes   int64
	// JoinReplay makes a subscriber that joins a running stream (its first
	// message has a sequence > 0) replay from sequence 0, so that it
	// rebuilds the replica's whole cached set while the publisher's buffer
	// still holds it. Without it, it indexes from what it sees on.
	JoinReplay bool
	// Lose, when not nil, is asked about every message as it arrives and
	// discards those it returns true for, as if the network had lost them
	// (fault injection for tests and drills).
	Lose func(source int, seq uint64) bool
	// MaxMessageBytes bounds one message from a publisher (its frames'
	// bytes plus 24 per frame; 0: DefaultMaxMessageBytes), checked from
	// the frame headers before anything is allocated. A publisher that
	// declares more, or more than 16 frames, or breaks ZMTP, is
	// disconnected (and reconnected after 100ms) and counted in
	// SourceStats.PeerErrors, naming its endpoint.
	MaxMessageBytes int64
}

// SubscriberConfig's replay defaults. A replay from a gap asks for at
// most the publisher's buffer: vLLM's buffer_steps and pagedkv's
// BufferSteps are 10,000 batches, so a whole buffer is 10,001 replies with
// the end marker, and takes well under a second on a LAN.
const (
	DefaultReplayTimeout    = 2 * time.Second
	DefaultReplayDeadline   = 10 * time.Second
	DefaultMaxReplayReplies = 20_000
	DefaultMaxReplayBytes   = 1 << 30
)

// DefaultMaxMessageBytes is SubscriberConfig.MaxMessageBytes' default:
// room for a batch of about 390,000 BlockStored blocks of 16 tokens (a
// resync of a large cache; docs/events.md), far above a step's batch.
const DefaultMaxMessageBytes = 64 << 20

// SourceStats are a Subscriber's counts for one source.
type SourceStats struct {
	Messages   int64 // live messages received
	Lost       int64 // of them, discarded by Lose
	Gaps       int64 // sequence gaps detected
	Replays    int64 // replay requests made (gaps, joins and catch-ups)
	Replayed   int64 // batches applied from replays
	Unrepaired int64 // gaps a replay could not fill: the replica's index was cleared
	Errors     int64 // undecodable messages, batches the index refused, replays that failed
	LastErr    string
	// ReplaysPastDeadline and ReplaysOverBudget count the replays
	// abandoned past SubscriberConfig.ReplayDeadline, and over
	// MaxReplayReplies or MaxReplayBytes: each cleared the replica's
	// blocks (LastErr names the replay and the limit).
	ReplaysPastDeadline, ReplaysOverBudget int64
	// PeerErrors counts disconnections of this source's publisher (either
	// socket) for breaking ZMTP or MaxMessageBytes; LastPeerErr is the
	// last, naming the endpoint and the peer's address.
	PeerErrors  int64
	LastPeerErr string
}

// Subscriber subscribes to any number of publishers and keeps an Index up
// to date from their events: it applies batches in sequence order, detects
// gaps, and repairs them from the publisher's replay socket.
type Subscriber struct {
	ix     *Index
	cfg    SubscriberConfig
	srcs   []*source
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type source struct {
	s       *Subscriber
	i       int // source number
	rep     int // replica number in the index
	sub     *zmtp.Socket
	dealer  *zmtp.Socket // nil without a replay endpoint
	msgs    chan [][]byte
	replies chan [][]byte
	catchup chan struct{}
	stream  // the sequencing of the replica's batches (stream.go)

	mu    sync.Mutex
	stats SourceStats
}

// NewSubscriber adds a replica to ix for every source (in order) and starts
// following their streams. When it fails (a bad config, a malformed
// endpoint) it adds no replica and leaves nothing running.
func NewSubscriber(ix *Index, cfg SubscriberConfig, sources ...Source) (*Subscriber, error) {
	if cfg.ReplayTimeout < 0 || cfg.ReplayDeadline < 0 || cfg.MaxReplayReplies < 0 || cfg.MaxReplayBytes < 0 || cfg.MaxMessageBytes < 0 {
		return nil, fmt.Errorf("%w: replay timeout %v, replay deadline %v, max replay replies %d, max replay bytes %d, max message bytes %d: want >= 0 (0: the default)",
			ErrBadConfig, cfg.ReplayTimeout, cfg.ReplayDeadline, cfg.MaxReplayReplies, cfg.MaxReplayBytes, cfg.MaxMessageBytes)
	}
	cfg.ReplayTimeout = cmp.Or(cfg.ReplayTimeout, DefaultReplayTimeout)
	cfg.ReplayDeadline = cmp.Or(cfg.ReplayDeadline, DefaultReplayDeadline)
	cfg.MaxReplayReplies = cmp.Or(cfg.MaxReplayReplies, DefaultMaxReplayReplies)
	cfg.MaxReplayBytes = cmp.Or(cfg.MaxReplayBytes, DefaultMaxReplayBytes)
	cfg.MaxMessageBytes = cmp.Or(cfg.MaxMessageBytes, DefaultMaxMessageBytes)
	ctx, cancel := context.WithCancel(context.Background())
	s := &Subscriber{ix: ix, cfg: cfg, ctx: ctx, cancel: cancel}
	for i, src := range sources {
		so, err := s.open(i, src)
		if err != nil {
			for _, o := range s.srcs {
				o.close()
			}
			cancel()
			return nil, err
		}
		s.srcs = append(s.srcs, so)
	}
	// Every socket is open: only now touch the index.
	for i, so := range s.srcs {
		so.rep = ix.AddReplica(sources[i].Name)
		s.wg.Add(2)
		go so.read(so.sub, so.msgs)
		if so.dealer != nil {
			s.wg.Add(1)
			go so.read(so.dealer, so.replies)
		}
		go so.run()
	}
	return s, nil
}

// open makes and connects source i's sockets.
func (s *Subscriber) open(i int, src Source) (*source, error) {
	// One-slot channels: the sockets' own queues hold what is in flight
	// (bounded in bytes), these only hand it to the source's goroutine.
	so := &source{s: s, i: i, msgs: make(chan [][]byte, 1), replies: make(chan [][]byte, 1), catchup: make(chan struct{}, 1)}
	so.last.Store(-1)
	var err error
	if so.sub, err = so.socket(zmtp.SUB, nil); err == nil {
		err = so.sub.Subscribe(s.cfg.Topic)
	}
	if err == nil {
		err = so.sub.Connect(src.Endpoint)
	}
	if err != nil {
		so.close()
		return nil, fmt.Errorf("kvindex: source %d (%s): subscribe to %q, topic %q: %w", i, src.Name, src.Endpoint, s.cfg.Topic, zmtp.TagBadConfig(err, ErrBadConfig))
	}
	if src.ReplayEndpoint != "" {
		var id [12]byte
		_, _ = rand.Read(id[:])
		// A unique identity, so that the publisher's ROUTER routes the
		// replies to this socket alone.
		if so.dealer, err = so.socket(zmtp.DEALER, fmt.Appendf(nil, "kvindex-%x", id)); err == nil {
			err = so.dealer.Connect(src.ReplayEndpoint)
		}
		if err != nil {
			so.close()
			return nil, fmt.Errorf("kvindex: source %d (%s): replay socket %q: %w", i, src.Name, src.ReplayEndpoint, zmtp.TagBadConfig(err, ErrBadConfig))
		}
	}
	return so, nil
}

// socket makes one of the source's sockets, bounded by MaxMessageBytes,
// reporting the publisher's protocol and limit violations in its stats.
func (so *source) socket(t zmtp.Type, identity []byte) (*zmtp.Socket, error) {
	return zmtp.New(zmtp.Config{Type: t, Identity: identity, MaxMessageBytes: so.s.cfg.MaxMessageBytes,
		SendTimeout: so.s.cfg.ReplayTimeout,
		OnPeerError: func(e *zmtp.PeerError) {
			so.count(func(st *SourceStats) {
				st.PeerErrors++
				st.LastPeerErr = e.Error()
			})
		}})
}

// close closes the source's sockets.
func (so *source) close() {
	for _, sk := range []*zmtp.Socket{so.sub, so.dealer} {
		if sk != nil {
			sk.Close()
		}
	}
}

// read forwards a socket's messages until the subscriber closes.
func (so *source) read(sk *zmtp.Socket, out chan<- [][]byte) {
	defer so.s.wg.Done()
	for {
		msg, err := sk.Recv()
		if err != nil {
			return // closed
		}
		select {
		case out <- msg.Frames:
		case <-so.s.ctx.Done():
			return
		}
	}
}

func (so *source) run() {
	defer so.s.wg.Done()
	for {
		select {
		case <-so.s.ctx.Done():
			return
		case frames := <-so.msgs:
			so.onMessage(frames)
		case <-so.catchup:
			so.replay(uint64(so.last.Load() + 1))
		}
	}
}

func (so *source) fail(err error) {
	so.mu.Lock()
	so.stats.Errors++
	so.stats.LastErr = err.Error()
	so.mu.Unlock()
}

func (so *source) count(f func(*SourceStats)) {
	so.mu.Lock()
	f(&so.stats)
	so.mu.Unlock()
}

func (so *source) onMessage(frames [][]byte) {
	msg, err := ParseMessage(frames)
	if err != nil {
		so.fail(err)
		return
	}
	so.count(func(st *SourceStats) { st.Messages++ })
	if lose := so.s.cfg.Lose; lose != nil && lose(so.i, msg.Seq) {
		so.count(func(st *SourceStats) { st.Lost++ })
		return
	}
	if !strings.HasPrefix(msg.Topic, so.s.cfg.Topic) {
		return
	}
	so.live(so, msg.Seq, msg.Payload)
}

// replay asks the publisher for every batch from seq on and applies those
// that continue the stream, until the end marker, the per-reply timeout,
// or the replay's deadline or budget (then it is abandoned: the replica is
// cleared).
func (so *source) replay(from uint64) {
	if so.dealer == nil {
		return
	}
	for len(so.replies) > 0 { // leftovers of a replay that timed out
		<-so.replies
	}
	so.count(func(st *SourceStats) { st.Replays++ })
	req := binary.BigEndian.AppendUint64(nil, from)
	// REQ's envelope: an empty delimiter, then the request.
	if err := so.dealer.Send([][]byte{{}, req}); err != nil {
		so.fail(fmt.Errorf("replay request from %d: %w", from, err))
		return
	}
	// The timeout is per reply: a long replay that keeps coming is fine,
	// up to the deadline and the budget, which no endpoint can extend.
	cfg := &so.s.cfg
	timer := time.NewTimer(cfg.ReplayTimeout)
	defer timer.Stop()
	deadline := time.NewTimer(cfg.ReplayDeadline)
	defer deadline.Stop()
	replies, bytes := 0, int64(0)
	for {
		select {
		case <-so.s.ctx.Done():
			return
		case <-timer.C:
			so.fail(fmt.Errorf("replay from %d: nothing for %v before the end marker", from, cfg.ReplayTimeout))
			return
		case <-deadline.C:
			so.count(func(st *SourceStats) { st.ReplaysPastDeadline++ })
			so.abandoned(so, from, fmt.Errorf("no end marker within the replay deadline of %v (%d replies, %d bytes)", cfg.ReplayDeadline, replies, bytes))
			return
		case frames := <-so.replies:
			replies++
			for _, f := range frames {
				bytes += int64(len(f))
			}
			if replies > cfg.MaxReplayReplies || bytes > cfg.MaxReplayBytes {
				so.count(func(st *SourceStats) { st.ReplaysOverBudget++ })
				so.abandoned(so, from, fmt.Errorf("%d replies, %d bytes without the end marker: over the budget of %d replies, %d bytes",
					replies, bytes, cfg.MaxReplayReplies, cfg.MaxReplayBytes))
				return
			}
			timer.Reset(cfg.ReplayTimeout)
			seq, payload, err := parseReply(frames)
			if err != nil {
				so.fail(err)
				continue
			}
			if seq == replyEnd {
				return
			}
			if so.replayed(so, from, seq, payload) {
				so.count(func(st *SourceStats) { st.Replayed++ })
			}
		}
	}
}

// Replica returns the index's replica number of source i.
func (s *Subscriber) Replica(i int) int { return s.srcs[i].rep }

// Applied returns the last sequence applied from source i (-1 before any).
func (s *Subscriber) Applied(i int) int64 { return s.srcs[i].last.Load() }

// Stats returns source i's counts.
func (s *Subscriber) Stats(i int) SourceStats {
	so := s.srcs[i]
	so.mu.Lock()
	defer so.mu.Unlock()
	return so.stats
}

// WaitApplied waits until source i has applied sequence seq, asking the
// publisher for a replay when nothing new arrives for a while (the last
// message may have been lost, and only the next one would reveal the gap),
// and reports whether it got there within timeout.
func (s *Subscriber) WaitApplied(i int, seq int64, timeout time.Duration) bool {
	so := s.srcs[i]
	deadline := time.Now().Add(timeout)
	lastSeen, since := so.last.Load(), time.Now()
	for {
		cur := so.last.Load()
		if cur >= seq {
			return true
		}
		now := time.Now()
		if now.After(deadline) {
			return false
		}
		if cur != lastSeen || len(so.msgs) > 0 {
			lastSeen, since = cur, now // still working through what arrived
		} else if now.Sub(since) > 50*time.Millisecond {
			select {
			case so.catchup <- struct{}{}:
			default:
			}
			since = now
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// Close stops following the streams and closes the sockets.
func (s *Subscriber) Close() {
	s.cancel()
	for _, so := range s.srcs {
		so.close()
	}
	s.wg.Wait()
}
