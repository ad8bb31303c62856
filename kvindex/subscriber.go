package kvindex

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Source is one replica's event stream.
type Source struct {
	Name string
	// Endpoint is the publisher's PUB address; ReplayEndpoint its ROUTER
	// address ("" when it serves no replays: gaps then cannot be repaired).
	Endpoint, ReplayEndpoint string
}

// SubscriberConfig describes a Subscriber.
type SubscriberConfig struct {
	// Topic is the subscription (a prefix of the publishers' topic; ""
	// takes everything).
	Topic string
	// ReplayTimeout bounds the wait for each reply of a replay (0: 2s).
	ReplayTimeout time.Duration
	// JoinReplay makes a subscriber that joins a running stream (its first
	// message has a sequence > 0) replay from sequence 0, so that it
	// rebuilds the replica's whole cached set while the publisher's buffer
	// still holds it. Without it, it indexes from what it sees on.
	JoinReplay bool
	// Lose, when not nil, is asked about every message as it arrives and
	// discards those it returns true for, as if the network had lost them
	// (fault injection for tests and drills).
	Lose func(source int, seq uint64) bool
}

// SourceStats are a Subscriber's counts for one source.
type SourceStats struct {
	Messages   int64 // live messages received
	Lost       int64 // of them, discarded by Lose
	Gaps       int64 // sequence gaps detected
	Replays    int64 // replay requests made (gaps, joins and catch-ups)
	Replayed   int64 // batches applied from replays
	Unrepaired int64 // gaps a replay could not fill: the replica's index was cleared
	Errors     int64 // undecodable messages or batches the index refused
	LastErr    string
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
	sub     zmq4.Socket
	dealer  zmq4.Socket // nil without a replay endpoint
	msgs    chan [][]byte
	replies chan [][]byte
	catchup chan struct{}
	stream  // the sequencing of the replica's batches (stream.go)

	mu    sync.Mutex
	stats SourceStats
}

// NewSubscriber adds a replica to ix for every source (in order) and starts
// following their streams.
func NewSubscriber(ix *Index, cfg SubscriberConfig, sources ...Source) (*Subscriber, error) {
	if cfg.ReplayTimeout == 0 {
		cfg.ReplayTimeout = 2 * time.Second
	}
	if cfg.ReplayTimeout < 0 {
		return nil, fmt.Errorf("%w: replay timeout %v", ErrBadConfig, cfg.ReplayTimeout)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Subscriber{ix: ix, cfg: cfg, ctx: ctx, cancel: cancel}
	for i, src := range sources {
		if err := s.add(i, src); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

func (s *Subscriber) add(i int, src Source) error {
	so := &source{s: s, i: i, msgs: make(chan [][]byte, 256), replies: make(chan [][]byte, 256), catchup: make(chan struct{}, 1)}
	so.last.Store(-1)
	so.sub = zmq4.NewSub(s.ctx)
	if err := so.sub.Dial(src.Endpoint); err != nil {
		so.sub.Close()
		return fmt.Errorf("kvindex: source %d (%s): subscribe to %q: %w", i, src.Name, src.Endpoint, err)
	}
	// After Dial: go-zeromq sends a subscription only to connected peers.
	if err := so.sub.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err != nil {
		so.sub.Close()
		return fmt.Errorf("kvindex: source %d (%s): subscribe to topic %q: %w", i, src.Name, s.cfg.Topic, err)
	}
	if src.ReplayEndpoint != "" {
		var id [12]byte
		_, _ = rand.Read(id[:])
		// A unique identity, so that the publisher's ROUTER routes the
		// replies to this socket alone.
		so.dealer = zmq4.NewDealer(s.ctx, zmq4.WithID(zmq4.SocketIdentity(fmt.Sprintf("kvindex-%x", id))))
		if err := so.dealer.Dial(src.ReplayEndpoint); err != nil {
			so.sub.Close()
			so.dealer.Close()
			return fmt.Errorf("kvindex: source %d (%s): replay socket %q: %w", i, src.Name, src.ReplayEndpoint, err)
		}
	}
	so.rep = s.ix.AddReplica(src.Name)
	s.srcs = append(s.srcs, so)
	s.wg.Add(2)
	go so.read(so.sub, so.msgs)
	if so.dealer != nil {
		s.wg.Add(1)
		go so.read(so.dealer, so.replies)
	}
	go so.run()
	return nil
}

// read forwards a socket's messages until the subscriber closes.
func (so *source) read(sk zmq4.Socket, out chan<- [][]byte) {
	defer so.s.wg.Done()
	for {
		msg, err := sk.Recv()
		if err != nil {
			if so.s.ctx.Err() != nil {
				return
			}
			time.Sleep(10 * time.Millisecond) // a dropped connection: zmq4 reconnects or Close ends us
			continue
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
// that continue the stream, until the end marker or the timeout.
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
	if err := so.dealer.SendMulti(zmq4.NewMsgFrom([]byte{}, req)); err != nil {
		so.fail(fmt.Errorf("replay request from %d: %w", from, err))
		return
	}
	// The timeout is per reply: a long replay that keeps coming is fine.
	timer := time.NewTimer(so.s.cfg.ReplayTimeout)
	defer timer.Stop()
	for {
		select {
		case <-so.s.ctx.Done():
			return
		case <-timer.C:
			so.fail(fmt.Errorf("replay from %d: nothing for %v before the end marker", from, so.s.cfg.ReplayTimeout))
			return
		case frames := <-so.replies:
			timer.Reset(so.s.cfg.ReplayTimeout)
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
		so.sub.Close()
		if so.dealer != nil {
			so.dealer.Close()
		}
	}
	s.wg.Wait()
}
