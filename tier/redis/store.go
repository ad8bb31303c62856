package redis

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
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

// Bounds of a Config: the write queue's buffers (QueueLen values) are
// allocated by New, so they are bounded before anything is allocated.
const (
	MaxQueueLen   = 1 << 20
	MaxBatch      = 1 << 16
	MaxQueueBytes = 64 << 30
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
	// DefaultQueueLen; at most MaxQueueLen, and QueueLen values at most
	// MaxQueueBytes, since New allocates a buffer for each); past it
	// Store drops pages.
	QueueLen int
	// Batch is the most SETs in one pipeline (0: DefaultBatch; at most
	// MaxBatch).
	Batch int
	// Expiry sets a TTL on written pages (0: none; leave it to maxmemory).
	// A page whose retention has a duration lives that much longer: its
	// TTL is Expiry plus what is left of the duration (docs/retention.md,
	// "Below the device").
	Expiry time.Duration
	// Clock is the wall clock retention deadlines are written and read
	// on (nil: time.Now).
	Clock func() time.Time
	// WriteTimeout bounds one batch of writes (0: 1 s).
	WriteTimeout time.Duration
	// DialTimeout bounds connecting (0: 2 s).
	DialTimeout time.Duration
	// Username and Password are the ACL user the client authenticates as
	// (Redis's AUTH): "" and "" connect as the server's default user;
	// a Password alone authenticates as the default user (requirepass).
	// Neither is ever printed: errors and stats name the user, not the
	// password.
	Username, Password string
	// TLS, when set, connects over TLS with this configuration (a
	// server name and CA pool; a client certificate for mutual TLS).
	TLS *tls.Config
}

// Store is a [tier.RemoteStore] on a Redis server. Close it when done.
type Store struct {
	cfg       Config
	client    *goredis.Client
	prefix    string // "NAMESPACE:FORMAT:GROUP:"
	valueLen  int
	pageBytes int

	queue   chan *job
	free    chan *job
	wg      sync.WaitGroup
	mu      sync.Mutex // guards closed against Store racing Close
	done    bool
	backlog tier.Backlog

	lookups, requested, hits, misses, errs, timeouts atomic.Int64
	stored, dropped, bytesIn, bytesOut               atomic.Int64
	rejections                                       tier.RejectionLog
}

type job struct {
	key string
	val []byte
	ttl time.Duration
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
	case cfg.Username != "" && cfg.Password == "":
		return nil, fmt.Errorf("%w: Username = %q without a Password", ErrBadConfig, cfg.Username)
	case cfg.QueueLen < 0 || cfg.Batch < 0 || cfg.Expiry < 0 || cfg.WriteTimeout < 0 || cfg.DialTimeout < 0:
		return nil, fmt.Errorf("%w: negative QueueLen %d, Batch %d, Expiry %v, WriteTimeout %v or DialTimeout %v",
			ErrBadConfig, cfg.QueueLen, cfg.Batch, cfg.Expiry, cfg.WriteTimeout, cfg.DialTimeout)
	}
	cfg.Group = cmp.Or(cfg.Group, DefaultGroup)
	cfg.QueueLen = cmp.Or(cfg.QueueLen, DefaultQueueLen)
	cfg.Batch = cmp.Or(cfg.Batch, DefaultBatch)
	// The queue's buffers are allocated here, one value each.
	valueLen := EncodedLen(cfg.Format, cfg.Namespace, cfg.Group)
	switch {
	case cfg.QueueLen > MaxQueueLen || cfg.Batch > MaxBatch:
		return nil, fmt.Errorf("%w: QueueLen %d, Batch %d: want at most %d and %d", ErrBadConfig, cfg.QueueLen, cfg.Batch, MaxQueueLen, MaxBatch)
	case int64(cfg.QueueLen)*int64(valueLen) > MaxQueueBytes:
		return nil, fmt.Errorf("%w: QueueLen %d x %d-byte values = %d bytes of write buffers exceeds %d: lower QueueLen",
			ErrBadConfig, cfg.QueueLen, valueLen, int64(cfg.QueueLen)*int64(valueLen), MaxQueueBytes)
	}
	cfg.WriteTimeout = cmp.Or(cfg.WriteTimeout, time.Second)
	cfg.DialTimeout = cmp.Or(cfg.DialTimeout, defaultDialTimout)
	f := cfg.Format
	s := &Store{
		cfg: cfg,
		client: goredis.NewClient(&goredis.Options{
			Addr: cfg.Addr, DialTimeout: cfg.DialTimeout, ContextTimeoutEnabled: true,
			Username: cfg.Username, Password: cfg.Password, TLSConfig: cfg.TLS,
			MaxRetries: -1, DisableIdentity: true, Protocol: 2,
			// A refused connection fails the call at once: no dial retries
			// with backoff inside a lookup's deadline.
			DialerRetries: 1, DialerRetryTimeout: time.Millisecond,
		}),
		prefix:    fmt.Sprintf("%s:%s.%s.p%d.h%d.d%d.l%d:%s:", cfg.Namespace, f.Layout, f.DType, f.PageSize, f.NumKVHeads, f.HeadDim, f.Layers, cfg.Group),
		valueLen:  valueLen,
		pageBytes: f.PageBytes(),
		queue:     make(chan *job, cfg.QueueLen),
		free:      make(chan *job, cfg.QueueLen),
	}
	for range cfg.QueueLen {
		s.free <- &job{val: make([]byte, 0, s.valueLen+tier.RetentionFieldBytes)}
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

// Fetch implements [tier.RemoteStore]: one pipeline, two commands per
// page, then the leading pages verified, by ctx's deadline.
//
// A value's type and length are known before its bytes are: TYPE tells a
// missing key from an empty value and a wrong-type key from a string, and
// GETRANGE reads at most one byte past the page's encoded length, so a
// value of any other length is refused without being read (four 48 MiB
// values made with SETRANGE once cost 192 MiB in one lookup). A rejected
// value, of whatever kind, ends the served prefix at that page only.
func (s *Store) Fetch(ctx context.Context, pages []tier.RemotePage) int {
	pages = pages[:s.sizedBuffers(pages)]
	if len(pages) == 0 {
		return 0
	}
	s.lookups.Add(1)
	s.requested.Add(int64(len(pages)))
	pipe := s.client.Pipeline()
	keys := make([]string, len(pages))
	types := make([]*goredis.StatusCmd, len(pages))
	values := make([]*goredis.StringCmd, len(pages))
	for i := range pages {
		keys[i] = s.Key(&pages[i])
		types[i] = pipe.Type(ctx, keys[i])
		// Bytes 0..valueLen+RetentionFieldBytes inclusive: one past the
		// longer value (one with a retention field) shows a longer one.
		values[i] = pipe.GetRange(ctx, keys[i], 0, int64(s.valueLen+tier.RetentionFieldBytes))
	}
	// Exec's error is the first command's; each command's own error is
	// read below, so a reply error (WRONGTYPE) stays with its page. A
	// connection that failed as a whole may leave the commands blank.
	_, execErr := pipe.Exec(ctx)
	var tokens []int32
	for i := range pages {
		typ, err := types[i].Result()
		if err != nil {
			s.fail(ctx, err)
			return i
		}
		switch typ {
		case "":
			// No type and no error of its own: the connection failed as
			// a whole (an AUTH refused with WRONGPASS leaves the commands
			// blank and says so only in Exec's error).
			s.fail(ctx, execErr)
			return i
		case "none":
			s.misses.Add(1)
			return i
		case "string":
		default:
			s.rejections.Record(keys[i], tier.RejectWrongType, fmt.Sprintf("the key holds a %s, not a string", typ))
			return i
		}
		b, err := values[i].Bytes()
		switch {
		case isWrongType(err): // replaced between the two commands
			s.rejections.Record(keys[i], tier.RejectWrongType, err.Error())
			return i
		case err != nil:
			s.fail(ctx, err)
			return i
		}
		s.bytesIn.Add(int64(len(b)))
		if len(b) != s.valueLen && len(b) != s.valueLen+tier.RetentionFieldBytes {
			s.rejections.Record(keys[i], tier.RejectSize, sizeDetail(len(b), s.valueLen))
			return i
		}
		v, err := Decode(b, tokens)
		if err == nil {
			tokens = v.Tokens
			err = v.Verify(s.cfg.Format, s.cfg.Namespace, s.cfg.Group, &pages[i])
		}
		if err != nil {
			s.rejections.Record(keys[i], rejectReason(err), err.Error())
			return i
		}
		copy(pages[i].Data, v.Data)
		pages[i].Retention = v.Retention.At(s.now())
		s.hits.Add(1)
	}
	return len(pages)
}

// sizedBuffers returns how many leading pages have a Data buffer of the
// format's page size; Fetch looks up only those (a caller's bug is not a
// value's fault, so it is not counted as a rejection).
func (s *Store) sizedBuffers(pages []tier.RemotePage) int {
	for i := range pages {
		if len(pages[i].Data) != s.pageBytes {
			return i
		}
	}
	return len(pages)
}

func sizeDetail(got, want int) string {
	if got > want {
		return fmt.Sprintf("value of more than %d bytes, want %d", want, want)
	}
	return fmt.Sprintf("value of %d bytes, want %d", got, want)
}

// rejectReason classifies a Decode or Verify error.
func rejectReason(err error) tier.RejectReason {
	switch {
	case errors.Is(err, ErrForeign):
		return tier.RejectForeign
	case errors.Is(err, ErrStale):
		return tier.RejectStale
	}
	return tier.RejectCorrupt
}

// isWrongType reports a Redis WRONGTYPE reply.
func isWrongType(err error) bool {
	var reply goredis.Error
	return errors.As(err, &reply) && strings.HasPrefix(reply.Error(), "WRONGTYPE")
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
	now := s.now()
	val, err := tier.EncodeValueAt(j.val[:0], s.cfg.Format, s.cfg.Namespace, s.cfg.Group, p, now)
	if err != nil {
		s.free <- j
		s.dropped.Add(1)
		return false
	}
	j.val, j.key, j.ttl = val, s.Key(p), s.ttl(p.Retention)
	s.mu.Lock()
	if s.done {
		s.mu.Unlock()
		s.free <- j
		s.dropped.Add(1)
		return false
	}
	tier.Queue(&s.backlog, s.queue, j) // never blocks: at most QueueLen jobs exist
	s.mu.Unlock()
	return true
}

// now reads the store's wall clock.
func (s *Store) now() time.Time {
	if s.cfg.Clock != nil {
		return s.cfg.Clock()
	}
	return time.Now()
}

// ttl is the TTL of a page with retention r: Expiry (0: none), and with
// Expiry set, what is left of r's duration on top, so a page whose level
// runs lives Expiry past its lapse, as an unhinted page lives Expiry past
// its write. Without Expiry no TTL is set: a TTL would only shorten a
// hinted page's life.
func (s *Store) ttl(r tier.Retention) time.Duration {
	if s.cfg.Expiry == 0 {
		return 0
	}
	return s.cfg.Expiry + r.Left
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
		pipe.Set(ctx, j.key, j.val, j.ttl)
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
	if !tier.CloseQueue(&s.mu, &s.done, s.queue) {
		return nil
	}
	s.wg.Wait()
	return s.client.Close()
}

// Stats implements [tier.RemoteStore].
func (s *Store) Stats() tier.RemoteStats {
	st := tier.RemoteStats{
		Lookups: s.lookups.Load(), Requested: s.requested.Load(), Hits: s.hits.Load(), Misses: s.misses.Load(),
		Errors: s.errs.Load(), Timeouts: s.timeouts.Load(),
		Stored: s.stored.Load(), Dropped: s.dropped.Load(), BytesIn: s.bytesIn.Load(), BytesOut: s.bytesOut.Load(),
	}
	s.rejections.Fill(&st)
	return st
}

// The environment variables [Config.FromEnv] reads: the way the CLI and the
// C ABI (and so Python) take Redis credentials, kept out of flags, command
// lines and process listings.
const (
	EnvUsername = "PAGEDKV_REDIS_USERNAME"
	EnvPassword = "PAGEDKV_REDIS_PASSWORD"
)

// FromEnv fills Username and Password from $PAGEDKV_REDIS_USERNAME and
// $PAGEDKV_REDIS_PASSWORD where they are empty, and returns c.
func (c Config) FromEnv() Config {
	if c.Username == "" {
		c.Username = os.Getenv(EnvUsername)
	}
	if c.Password == "" {
		c.Password = os.Getenv(EnvPassword)
	}
	return c
}

// Medium returns [tier.Remote]: pages a Manager reads from the store are
// accounted as remote reads ([tier.MediumStore]).
func (s *Store) Medium() tier.Medium { return tier.Remote }
