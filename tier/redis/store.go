package redis

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/pagedkv/pagedkv/tier"
)

// ErrBadConfig reports an invalid [Config].
var ErrBadConfig = errors.New("redis: bad config")

// Defaults.
const (
	DefaultQueueLen   = 256
	DefaultBatch      = 32
	DefaultGroup      = "all"
	defaultDialTimout = 2 * time.Second
)

// Config describes a Store.
type Config struct {
	// Addr is the server's host:port.
	Addr string
	// Namespace names the deployment (model and revision, tenant salt):
	// only values written under the same namespace are served. Required.
	Namespace string
	// Format is the page format; values of another format are foreign.
	Format tier.PageFormat
	// Group names the layer group the pages hold ("" means DefaultGroup).
	Group string
	// TagByChain keys pages by the first page of their prefix as the Redis
	// Cluster hash tag, keeping a chain on one shard; false spreads pages
	// by their own digest.
	TagByChain bool
	// QueueLen bounds the pages queued or being written (0:
	// DefaultQueueLen); past it Store drops pages.
	QueueLen int
	// Batch is the most SETs in one pipeline (0: DefaultBatch).
	Batch int
	// Expiry sets a TTL on written pages (0: none; leave it to maxmemory).
	Expiry time.Duration
	// WriteTimeout bounds one batch of writes (0: 1 s).
	WriteTimeout time.Duration
	// DialTimeout bounds connecting (0: 2 s).
	DialTimeout time.Duration
}

// Store is a [tier.RemoteStore] on a Redis server. Close it when done.
type Store struct {
	cfg      Config
	client   *goredis.Client
	prefix   string // "NAMESPACE:FORMAT:GROUP:"
	valueLen int

	queue   chan *job
	free    chan *job
	wg      sync.WaitGroup
	mu      sync.Mutex // guards closed against Store racing Close
	done    bool
	backlog tier.Backlog

	lookups, requested, hits, misses, rejected, errs, timeouts atomic.Int64
	stored, dropped, bytesIn, bytesOut                         atomic.Int64
}

type job struct {
	key string
	val []byte
}

var _ tier.RemoteStore = (*Store)(nil)

// New connects to cfg.Addr (lazily: the first command dials) and starts
// the writer.
func New(cfg Config) (*Store, error) {
	if err := cfg.Format.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	switch {
	case cfg.Addr == "":
		return nil, fmt.Errorf("%w: Addr is empty", ErrBadConfig)
	case cfg.Namespace == "" || len(cfg.Namespace) > 1024 || strings.ContainsAny(cfg.Namespace, "{}"):
		return nil, fmt.Errorf("%w: Namespace = %q: want 1..1024 bytes without braces", ErrBadConfig, cfg.Namespace)
	case len(cfg.Group) > 1024 || strings.ContainsAny(cfg.Group, "{}"):
		return nil, fmt.Errorf("%w: Group = %q: want <= 1024 bytes without braces", ErrBadConfig, cfg.Group)
	case cfg.QueueLen < 0 || cfg.Batch < 0 || cfg.Expiry < 0 || cfg.WriteTimeout < 0 || cfg.DialTimeout < 0:
		return nil, fmt.Errorf("%w: negative QueueLen %d, Batch %d, Expiry %v, WriteTimeout %v or DialTimeout %v",
			ErrBadConfig, cfg.QueueLen, cfg.Batch, cfg.Expiry, cfg.WriteTimeout, cfg.DialTimeout)
	}
	if cfg.Group == "" {
		cfg.Group = DefaultGroup
	}
	if cfg.QueueLen == 0 {
		cfg.QueueLen = DefaultQueueLen
	}
	if cfg.Batch == 0 {
		cfg.Batch = DefaultBatch
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = time.Second
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = defaultDialTimout
	}
	f := cfg.Format
	s := &Store{
		cfg: cfg,
		client: goredis.NewClient(&goredis.Options{
			Addr: cfg.Addr, DialTimeout: cfg.DialTimeout, ContextTimeoutEnabled: true,
			MaxRetries: -1, DisableIdentity: true, Protocol: 2,
			// A refused connection fails the call at once: no dial retries
			// with backoff inside a lookup's deadline.
			DialerRetries: 1, DialerRetryTimeout: time.Millisecond,
		}),
		prefix:   fmt.Sprintf("%s:%s.%s.p%d.h%d.d%d.l%d:%s:", cfg.Namespace, f.Layout, f.DType, f.PageSize, f.NumKVHeads, f.HeadDim, f.Layers, cfg.Group),
		valueLen: EncodedLen(f, cfg.Namespace, cfg.Group),
		queue:    make(chan *job, cfg.QueueLen),
		free:     make(chan *job, cfg.QueueLen),
	}
	for range cfg.QueueLen {
		s.free <- &job{val: make([]byte, 0, s.valueLen)}
	}
	s.wg.Add(1)
	go s.writer()
	return s, nil
}

// Client returns the store's client (benchmarks compare against raw
// SET/GET through it).
func (s *Store) Client() *goredis.Client { return s.client }

// Key returns the key of page p.
func (s *Store) Key(p *tier.RemotePage) string {
	tag := p.Digest
	if s.cfg.TagByChain {
		tag = p.Chain
	}
	var b strings.Builder
	b.Grow(4 + 2 + 32 + len(s.prefix) + 64)
	b.WriteString("pkv:{")
	b.WriteString(hex.EncodeToString(tag[:16]))
	b.WriteString("}:")
	b.WriteString(s.prefix)
	b.WriteString(p.Digest.String())
	return b.String()
}

// Fetch implements [tier.RemoteStore]: one pipeline of GETs, then the
// leading pages verified, by ctx's deadline.
func (s *Store) Fetch(ctx context.Context, pages []tier.RemotePage) int {
	if len(pages) == 0 {
		return 0
	}
	s.lookups.Add(1)
	s.requested.Add(int64(len(pages)))
	pipe := s.client.Pipeline()
	cmds := make([]*goredis.StringCmd, len(pages))
	for i := range pages {
		cmds[i] = pipe.Get(ctx, s.Key(&pages[i]))
	}
	_, err := pipe.Exec(ctx)
	if err != nil && !errors.Is(err, goredis.Nil) {
		s.fail(ctx, err)
		return 0
	}
	var tokens []int32
	for i, c := range cmds {
		b, err := c.Bytes()
		switch {
		case errors.Is(err, goredis.Nil):
			s.misses.Add(1)
			return i
		case err != nil:
			s.fail(ctx, err)
			return i
		}
		s.bytesIn.Add(int64(len(b)))
		v, err := Decode(b, tokens)
		if err == nil {
			tokens = v.Tokens
			err = v.Verify(s.cfg.Format, s.cfg.Namespace, s.cfg.Group, &pages[i])
		}
		if err != nil || len(pages[i].Data) != len(v.Data) {
			s.rejected.Add(1)
			return i
		}
		copy(pages[i].Data, v.Data)
		s.hits.Add(1)
	}
	return len(pages)
}

func (s *Store) fail(ctx context.Context, err error) {
	s.errs.Add(1)
	if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		s.timeouts.Add(1)
	}
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// Store implements [tier.RemoteStore]: it encodes p into a free buffer and
// queues it, or drops it when none is free or the store is closed.
func (s *Store) Store(p *tier.RemotePage) bool {
	var j *job
	select {
	case j = <-s.free:
	default:
		s.dropped.Add(1)
		return false
	}
	val, err := Encode(j.val[:0], s.cfg.Format, s.cfg.Namespace, s.cfg.Group, p)
	if err != nil {
		s.free <- j
		s.dropped.Add(1)
		return false
	}
	j.val, j.key = val, s.Key(p)
	s.mu.Lock()
	if s.done {
		s.mu.Unlock()
		s.free <- j
		s.dropped.Add(1)
		return false
	}
	s.backlog.Add(1)
	s.queue <- j // never blocks: at most QueueLen jobs exist
	s.mu.Unlock()
	return true
}

// writer sends queued pages in pipelined batches until Close.
func (s *Store) writer() {
	defer s.wg.Done()
	batch := make([]*job, 0, s.cfg.Batch)
	for j := range s.queue {
		batch = append(batch[:0], j)
	more:
		for len(batch) < s.cfg.Batch {
			select {
			case j, ok := <-s.queue:
				if !ok {
					break more
				}
				batch = append(batch, j)
			default:
				break more
			}
		}
		s.write(batch)
	}
}

func (s *Store) write(batch []*job) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.WriteTimeout)
	pipe := s.client.Pipeline()
	for _, j := range batch {
		pipe.Set(ctx, j.key, j.val, s.cfg.Expiry)
	}
	cmds, err := pipe.Exec(ctx)
	cancel()
	if err != nil && len(cmds) == 0 {
		s.errs.Add(int64(len(batch)))
	}
	for i, j := range batch {
		if i < len(cmds) && cmds[i].Err() == nil {
			s.stored.Add(1)
			s.bytesOut.Add(int64(len(j.val)))
		} else if i < len(cmds) {
			s.errs.Add(1)
		}
		j.key, j.val = "", j.val[:0]
		s.free <- j
	}
	s.backlog.Done(len(batch))
}

// Flush waits until every queued page has been written or has failed, or
// until ctx is done.
func (s *Store) Flush(ctx context.Context) error { return s.backlog.Wait(ctx, nil) }

// Close stops accepting pages, writes what is queued (each batch bounded by
// WriteTimeout) and closes the client.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.done {
		s.mu.Unlock()
		return nil
	}
	s.done = true
	close(s.queue)
	s.mu.Unlock()
	s.wg.Wait()
	return s.client.Close()
}

// Stats implements [tier.RemoteStore].
func (s *Store) Stats() tier.RemoteStats {
	return tier.RemoteStats{
		Lookups: s.lookups.Load(), Requested: s.requested.Load(), Hits: s.hits.Load(), Misses: s.misses.Load(),
		Rejected: s.rejected.Load(), Errors: s.errs.Load(), Timeouts: s.timeouts.Load(),
		Stored: s.stored.Load(), Dropped: s.dropped.Load(), BytesIn: s.bytesIn.Load(), BytesOut: s.bytesOut.Load(),
	}
}
