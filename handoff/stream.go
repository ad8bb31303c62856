package handoff

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
	"slices"
	"unsafe"

	"github.com/pagedkv/pagedkv/tier"
)

// Run is a run of consecutive device pages: Pages pages from Page on.
type Run struct {
	Page  int32
	Pages int32
}

// Plan appends to dst the runs of consecutive page IDs in pages (token
// order) and returns it: one run per break in the sequence.
func Plan(dst []Run, pages []int32) []Run {
	for _, p := range pages {
		if n := len(dst); n > 0 && int64(dst[n-1].Page)+int64(dst[n-1].Pages) == int64(p) {
			dst[n-1].Pages++
			continue
		}
		dst = append(dst, Run{Page: p, Pages: 1})
	}
	return dst
}

// Errors.
var (
	// ErrBadConfig reports an invalid [Config] or [ServerConfig].
	ErrBadConfig = errors.New("handoff: bad config")
	// ErrBadStream: the bytes are not a request this version writes, or
	// are past the limits; nothing was admitted.
	ErrBadStream = errors.New("handoff: bad stream")
	// ErrAuth: a MAC did not verify (another key or none, another
	// connection's nonce, bytes changed in transit), or the two sides
	// disagree on whether to authenticate. A stream that fails it wraps
	// ErrBadStream too; nothing was admitted.
	ErrAuth = errors.New("handoff: authentication failed")
	// ErrRefused: the receiver refused the request (see the message).
	ErrRefused = errors.New("handoff: refused by the receiver")
	// ErrBusy: the receiver refused the request for its connection or
	// in-flight byte limits (it wraps ErrRefused): try again later.
	ErrBusy = errors.New("handoff: receiver busy")
	// ErrFull: the store cannot hold the request's pages.
	ErrFull = errors.New("handoff: store full")
	// ErrAlreadyHeld: the receiver admitted the request, but it already
	// held some of its pages (the same digests, from an earlier transfer)
	// with other bytes, and serves those: this transfer's bytes for them
	// were not taken. [Send] returns it (not wrapping ErrRefused).
	ErrAlreadyHeld = errors.New("handoff: pages already held")
)

// Config is what both sides agree on: the deployment (namespace and
// layer group, as in the Redis and disk tiers), the page format and the
// handoff key.
type Config struct {
	Namespace string
	Group     string // "" means "all"
	Format    tier.PageFormat
	Limits    Limits

	// Key is the deployment's handoff key, the same on every sender and
	// receiver, at least MinKeyBytes of it (32 random bytes, say). Every
	// stream carries HMAC-SHA256 tags under it, bound to a nonce the
	// receiver picks for each connection, and the receiver's replies
	// carry one too. Required unless Insecure.
	Key []byte
	// Insecure runs without authentication: the tags are computed under
	// a public constant, so they catch damage but not a forger, and any
	// peer that can connect can admit pages. Only when set explicitly; a
	// Config with neither Key nor Insecure is an error, one with both too.
	Insecure bool
	// TLS, if not nil, runs every connection over TLS with it: the
	// receiver's server configuration (for mutual TLS, ClientAuth
	// tls.RequireAndVerifyClientCert and ClientCAs) in the Config a
	// [Server] serves, the sender's client configuration (RootCAs and its
	// Certificates) in the Config [Send] is given. The Key is still
	// required: TLS adds confidentiality (tokens and K/V are otherwise in
	// clear) and the peers' certificates.
	TLS *tls.Config
}

// Limits bound what a receiver accepts from one stream.
type Limits struct {
	// MaxPages bounds the pages of one request (0: DefaultMaxPages).
	MaxPages int
	// MaxBytes bounds the page bytes of one request (0: DefaultMaxBytes).
	MaxBytes int64
}

// Defaults and fixed sizes.
const (
	DefaultMaxPages       = 1 << 16
	DefaultMaxBytes int64 = 4 << 30
	// MaxString bounds each namespace field (tenant, LoRA, salt) and the
	// deployment's namespace and group.
	MaxString = 1024
	// MinKeyBytes is the shortest Config.Key accepted.
	MinKeyBytes = 16
	// NonceBytes is the receiver's nonce, fresh for every connection.
	NonceBytes = 32
	// TagBytes is an HMAC-SHA256 tag.
	TagBytes = sha256.Size
	// StreamVersion is the version this package writes and reads; a
	// stream or receiver of another version is refused by name.
	StreamVersion = 3

	streamMagic  = "PKVH"
	preludeBytes = 8
	headBytes    = 24
	// tokenChunk is the most token bytes read at once: the tokens grow as
	// they arrive, never sized by the header alone.
	tokenChunk = 16 << 10
)

// insecureKey is the MAC key of an Insecure Config: public, so its tags
// detect damage only.
var insecureKey = []byte("pagedkv handoff: no key (Config.Insecure)")

// Domain labels of the MACs: the stream's, and the receiver's replies'.
const (
	streamLabel = "pagedkv handoff stream v2\x00"
	replyLabel  = "pagedkv handoff reply v2\x00"
)

// Checkpoints: the stream's three tags cover the stream up to them, each
// after its own label byte (hashed, not sent), so no tag verifies at
// another checkpoint.
const (
	tagHead   = 1 // the fixed head: its counts are trusted only after it
	tagHeader = 2 // the namespace, tokens and runs
	tagStream = 3 // the whole stream, pages included
)

// Nonce is the receiver's challenge for one connection: every tag of the
// stream on it and of the replies is bound to it, so a recorded stream does
// not verify on another connection.
type Nonce [NonceBytes]byte

// NewNonce returns a fresh random nonce.
func NewNonce() Nonce {
	var n Nonce
	rand.Read(n[:]) // never fails (crypto/rand crashes the program instead)
	return n
}

func (c *Config) check() error {
	if err := c.Format.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	switch {
	case c.Namespace == "" || len(c.Namespace) > MaxString || len(c.Group) > MaxString:
		return fmt.Errorf("%w: namespace of %d bytes, group of %d: want 1..%d and <= %d", ErrBadConfig, len(c.Namespace), len(c.Group), MaxString, MaxString)
	case c.Limits.MaxPages < 0 || c.Limits.MaxBytes < 0:
		return fmt.Errorf("%w: MaxPages %d, MaxBytes %d: want >= 0", ErrBadConfig, c.Limits.MaxPages, c.Limits.MaxBytes)
	case c.Insecure && len(c.Key) > 0:
		return fmt.Errorf("%w: Config.Key and Config.Insecure are both set: give a key, or run without authentication, not both", ErrBadConfig)
	case !c.Insecure && len(c.Key) == 0:
		return fmt.Errorf("%w: Config.Key is empty: give the deployment's handoff key (at least %d bytes, the same on every sender and receiver), or set Config.Insecure to run without authentication", ErrBadConfig, MinKeyBytes)
	case !c.Insecure && len(c.Key) < MinKeyBytes:
		return fmt.Errorf("%w: Config.Key of %d bytes: want at least %d", ErrBadConfig, len(c.Key), MinKeyBytes)
	}
	if c.Group == "" {
		c.Group = "all"
	}
	if c.Limits.MaxPages == 0 {
		c.Limits.MaxPages = DefaultMaxPages
	}
	if c.Limits.MaxBytes == 0 {
		c.Limits.MaxBytes = DefaultMaxBytes
	}
	return nil
}

// macKey is the key the tags are computed under.
func (c *Config) macKey() []byte {
	if c.Insecure {
		return insecureKey
	}
	return c.Key
}

// streamMAC is the running MAC of a stream on the connection of nonce.
func (c *Config) streamMAC(nonce *Nonce) hash.Hash {
	m := hmac.New(sha256.New, c.macKey())
	m.Write([]byte(streamLabel))
	m.Write(nonce[:])
	m.Write(prelude[:])
	return m
}

// replyTag is the tag of the receiver's reply seq (1: the verdict on the
// header, 2: the acknowledgement) on the connection of nonce.
func (c *Config) replyTag(nonce *Nonce, seq, status byte, msg []byte) [TagBytes]byte {
	m := hmac.New(sha256.New, c.macKey())
	m.Write([]byte(replyLabel))
	m.Write(nonce[:])
	var b [4]byte
	b[0], b[1] = seq, status
	binary.LittleEndian.PutUint16(b[2:], uint16(len(msg)))
	m.Write(b[:])
	m.Write(msg)
	var t [TagBytes]byte
	m.Sum(t[:0])
	return t
}

// prelude opens every stream of this version.
var prelude = [preludeBytes]byte{'P', 'K', 'V', 'H', StreamVersion}

// checkPrelude refuses, by name, a stream that is not of this version.
func checkPrelude(b []byte) error {
	switch {
	case string(b[:4]) != streamMagic:
		return fmt.Errorf("%w: magic %q: not a handoff stream", ErrBadStream, b[:4])
	case b[4] != StreamVersion:
		return fmt.Errorf("%w: stream version %d: this receiver reads version %d only (the authenticated handoff): upgrade the sender", ErrBadStream, b[4], StreamVersion)
	case b[5]|b[6]|b[7] != 0:
		return fmt.Errorf("%w: version %d prelude with reserved bytes %x", ErrBadStream, b[4], b[5:8])
	}
	return nil
}

// Request is one request's KV as it moves: its namespace, the tokens of
// its full pages, the sender's plan and each full page's bytes
// (tier.PageFormat order).
type Request struct {
	Tenant, LoRA, Salt string
	Tokens             []int32
	Runs               []Run
	Pages              [][]byte
	// GroupTag, when set, is a HybridManager's layer group
	// (HybridManager.TierTag): the pages chain from
	// tier.GroupRoot(namespace root, GroupTag) instead of the namespace
	// root. With State, Pages is that state group's one checkpoint page
	// of the prefix Tokens (whole pages; docs/state-groups.md, "Tiers").
	GroupTag string
	State    bool
	// Retention is the request's retention ranges (at most
	// MaxRetentionRanges).
	Retention []RetentionRange
}

// StreamBytes is the length of r's stream (the sender's bytes; the
// receiver's hello and replies are not counted).
func (c Config) StreamBytes(r *Request) int64 {
	if c.Group == "" {
		c.Group = "all"
	}
	return int64(preludeBytes+headBytes+TagBytes+len(r.Tenant)+len(r.LoRA)+len(r.Salt)+len(r.GroupTag)+4*len(r.Tokens)+8*len(r.Runs)+
		retentionRangeBytes*len(r.Retention)+TagBytes+TagBytes) +
		int64(len(r.Pages))*int64(tier.EncodedValueLen(c.Format, c.Namespace, c.Group))
}

// checkRequest checks that r is consistent (tokens of len(Pages) full
// pages, runs covering them once each, pages of the format's size).
func (c *Config) checkRequest(r *Request) error {
	ps := c.Format.PageSize
	switch {
	case r.State && (len(r.Pages) != 1 || len(r.Tokens) == 0 || len(r.Tokens)%ps != 0 || r.GroupTag == ""):
		return fmt.Errorf("handoff: write: a state checkpoint of %d tokens in %d pages, group tag of %d bytes: want 1 page after whole pages of %d tokens, and a tag",
			len(r.Tokens), len(r.Pages), len(r.GroupTag), ps)
	case !r.State && len(r.Tokens) != len(r.Pages)*ps:
		return fmt.Errorf("handoff: write: %d tokens for %d pages of %d", len(r.Tokens), len(r.Pages), ps)
	case len(r.Tenant) > MaxString || len(r.LoRA) > MaxString || len(r.Salt) > MaxString || len(r.GroupTag) > MaxString:
		return fmt.Errorf("handoff: write: namespace fields of %d, %d, %d bytes, group tag of %d: want <= %d", len(r.Tenant), len(r.LoRA), len(r.Salt), len(r.GroupTag), MaxString)
	case len(r.Runs) > math.MaxUint32 || len(r.Tokens) > math.MaxUint32:
		return fmt.Errorf("handoff: write: %d runs, %d tokens", len(r.Runs), len(r.Tokens))
	}
	if err := checkRuns(r.Runs, len(r.Pages)); err != nil {
		return fmt.Errorf("handoff: write: %w", err)
	}
	if err := checkRetention(r.Retention); err != nil {
		return fmt.Errorf("handoff: write: %w", err)
	}
	for i, p := range r.Pages {
		if len(p) != c.Format.PageBytes() {
			return fmt.Errorf("handoff: write: page %d of %d bytes, the format has %d", i, len(p), c.Format.PageBytes())
		}
	}
	return nil
}

// checkRuns refuses a run list that is not a plan of npages distinct
// device pages: a run with a negative page, no pages, or an end past
// int32, runs naming a page twice, or runs covering another number of
// pages. It names the run.
func checkRuns(runs []Run, npages int) error {
	covered := int64(0)
	for i, r := range runs {
		switch {
		case r.Page < 0 || r.Pages < 1:
			return fmt.Errorf("run %d %v: want a page >= 0 and >= 1 pages", i, r)
		case int64(r.Page)+int64(r.Pages) > math.MaxInt32:
			return fmt.Errorf("run %d %v: its end, page %d, is past int32", i, r, int64(r.Page)+int64(r.Pages))
		}
		covered += int64(r.Pages)
	}
	if covered != int64(npages) {
		return fmt.Errorf("the runs cover %d pages, the request has %d", covered, npages)
	}
	if len(runs) < 2 {
		return nil
	}
	order := make([]int, len(runs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return int(runs[a].Page) - int(runs[b].Page) })
	for k := 1; k < len(order); k++ {
		a, b := runs[order[k-1]], runs[order[k]]
		if int64(a.Page)+int64(a.Pages) > int64(b.Page) {
			i, j := min(order[k-1], order[k]), max(order[k-1], order[k])
			return fmt.Errorf("run %d %v and run %d %v both name page %d", i, runs[i], j, runs[j], b.Page)
		}
	}
	return nil
}

// streamWriter writes a stream, MACing what it writes.
type streamWriter struct {
	w   *bufio.Writer
	cfg *Config
	mac hash.Hash
	tag [TagBytes]byte
	err error
}

func newStreamWriter(w io.Writer, cfg *Config, nonce *Nonce) *streamWriter {
	bw, ok := w.(*bufio.Writer)
	if !ok {
		bw = bufio.NewWriterSize(w, 256<<10)
	}
	return &streamWriter{w: bw, cfg: cfg, mac: cfg.streamMAC(nonce)}
}

func (s *streamWriter) write(b []byte) {
	if s.err != nil {
		return
	}
	s.mac.Write(b)
	_, s.err = s.w.Write(b)
}

func (s *streamWriter) checkpoint(label byte) {
	if s.err != nil {
		return
	}
	s.mac.Write([]byte{label})
	_, s.err = s.w.Write(s.mac.Sum(s.tag[:0]))
}

// prelude writes the prelude (in the MAC from its start).
func (s *streamWriter) prelude() {
	if s.err == nil {
		_, s.err = s.w.Write(prelude[:])
	}
}

// header writes the head and its tag, the namespace, tokens and runs and
// their tag.
func (s *streamWriter) header(r *Request) {
	var h [headBytes]byte
	binary.LittleEndian.PutUint16(h[0:], uint16(len(r.Tenant)))
	binary.LittleEndian.PutUint16(h[2:], uint16(len(r.LoRA)))
	binary.LittleEndian.PutUint16(h[4:], uint16(len(r.Salt)))
	binary.LittleEndian.PutUint16(h[6:], groupField(r.GroupTag, r.State))
	binary.LittleEndian.PutUint16(h[20:], uint16(len(r.Retention))) // h[22:24] stay zero
	binary.LittleEndian.PutUint32(h[8:], uint32(len(r.Tokens)))
	binary.LittleEndian.PutUint32(h[12:], uint32(len(r.Runs)))
	binary.LittleEndian.PutUint32(h[16:], uint32(len(r.Pages)))
	s.write(h[:])
	s.checkpoint(tagHead)
	for _, f := range []string{r.Tenant, r.LoRA, r.Salt, r.GroupTag} {
		s.write([]byte(f))
	}
	var b [tokenChunk]byte
	for toks := r.Tokens; len(toks) > 0; {
		n := min(len(toks), tokenChunk/4)
		for i, t := range toks[:n] {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(t))
		}
		s.write(b[:4*n])
		toks = toks[n:]
	}
	for _, run := range r.Runs {
		binary.LittleEndian.PutUint32(b[0:], uint32(run.Page))
		binary.LittleEndian.PutUint32(b[4:], uint32(run.Pages))
		s.write(b[:8])
	}
	for _, x := range r.Retention {
		s.write(appendRetentionRange(b[:0], x))
	}
	s.checkpoint(tagHeader)
}

// pages writes one tier page value per page, chained from the namespace
// root, and the stream's tag.
func (s *streamWriter) pages(r *Request) {
	cfg, ps := s.cfg, s.cfg.Format.PageSize
	val := make([]byte, 0, tier.EncodedValueLen(cfg.Format, cfg.Namespace, cfg.Group))
	parent := chainRoot(r.Tenant, r.LoRA, r.Salt, r.GroupTag, r.State, r.Tokens, ps)
	scratch := make([]byte, 0, 64+4*ps)
	for i, data := range r.Pages {
		if s.err != nil {
			return
		}
		toks := r.Tokens[i*ps : (i+1)*ps]
		if r.State {
			toks = r.Tokens[len(r.Tokens)-ps:]
		}
		d := tier.Next(scratch, parent, toks)
		var err error
		val, err = tier.EncodeValue(val[:0], cfg.Format, cfg.Namespace, cfg.Group, &tier.RemotePage{Digest: d, Parent: parent, Tokens: toks, Data: data, State: r.State})
		if err != nil {
			s.err = fmt.Errorf("handoff: write: page %d: %w", i, err)
			return
		}
		s.write(val)
		parent = d
	}
	s.checkpoint(tagStream)
}

func (s *streamWriter) flush() error {
	if s.err != nil {
		return s.err
	}
	return s.w.Flush()
}

// WriteRequest writes r's whole stream for the connection of nonce to w:
// what [Send] writes, without waiting for the receiver's verdict between
// the header and the pages. r must be consistent (tokens of len(Pages)
// full pages, runs covering them once each, pages of the format's size).
func WriteRequest(w io.Writer, cfg Config, nonce Nonce, r *Request) error {
	if err := cfg.check(); err != nil {
		return err
	}
	if err := cfg.checkRequest(r); err != nil {
		return err
	}
	s := newStreamWriter(w, &cfg, &nonce)
	s.prelude()
	s.header(r)
	s.pages(r)
	return s.flush()
}

// Received is a verified request: its pages as the tiers name them.
type Received struct {
	Tenant, LoRA, Salt string
	Tokens             []int32
	Runs               []Run
	GroupTag           string // as Request.GroupTag
	State              bool   // as Request.State
	// Pages are the full pages in order, digests chained from the
	// namespace root; their Tokens alias Tokens. Each carries the
	// retention the ranges give it (Store serves it with the page).
	Pages []tier.RemotePage
	// Retention is the sender's retention ranges, checked: the decode
	// engine passes them on to its Manager's Add (pagedkv.RetentionRange
	// field for field).
	Retention []RetentionRange
}

// Bytes is the page bytes received.
func (r *Received) Bytes() int64 {
	var n int64
	for _, p := range r.Pages {
		n += int64(len(p.Data))
	}
	return n
}

// head is a stream's fixed head: the namespace fields' lengths and the
// counts, trusted only once its tag verified.
type head struct {
	lens                 [4]int // tenant, LoRA, salt, group tag
	state                bool
	tokens, runs, npages int
	ranges               int
	reserved             uint16
}

// groupField is the head's group field: the group tag's length, and bit
// 15 for a state checkpoint (0 for a dense chain: the field was reserved).
func groupField(tag string, state bool) uint16 {
	v := uint16(len(tag))
	if state {
		v |= stateBit
	}
	return v
}

const stateBit = 1 << 15

// chainRoot is the digest a request's pages chain from: the namespace
// root, its group's root (tier.GroupRoot) with a group tag, and for a
// state checkpoint the state parent after every page of tokens but the
// last (tier.StateParent).
func chainRoot(tenant, lora, salt, tag string, state bool, tokens []int32, ps int) tier.Digest {
	d := tier.NamespaceRoot(tenant, lora, salt)
	if !state {
		if tag != "" {
			d = tier.GroupRoot(d, tag)
		}
		return d
	}
	scratch := make([]byte, 0, 64+4*ps)
	for i := 0; i+ps < len(tokens); i += ps {
		d = tier.Next(scratch, d, tokens[i:i+ps])
	}
	return tier.StateParent(d, tag)
}

// Memory is the most a receiver allocates for the request of this head:
// the reservation [Server] makes against MaxInflightBytes.
func (h *head) memory(cfg *Config) int64 {
	const pageOverhead = 256 // a RemotePage and its slice headers, rounded up
	return int64(h.lens[0]+h.lens[1]+h.lens[2]+h.lens[3]) + 2*4*int64(h.tokens) + 2*8*int64(h.runs) + 2*int64(unsafe.Sizeof(RetentionRange{}))*int64(h.ranges) +
		int64(h.npages)*(int64(cfg.Format.PageBytes())+pageOverhead) + int64(tier.ValueDataOffset(cfg.Format, cfg.Namespace, cfg.Group))
}

// maxHeaderBytes is the longest header (head through its second tag) a
// receiver of cfg accepts.
func maxHeaderBytes(cfg *Config) int64 {
	p := int64(cfg.Limits.MaxPages)
	return preludeBytes + headBytes + TagBytes + 4*MaxString + 4*p*int64(cfg.Format.PageSize) + 8*p + retentionRangeBytes*MaxRetentionRanges + TagBytes
}

// streamReader reads a stream, MACing what it reads (the tags excepted).
type streamReader struct {
	r     io.Reader
	cfg   *Config
	mac   hash.Hash
	tag   [TagBytes]byte
	got   [TagBytes]byte
	h     head
	rec   *Received
	bytes int64 // read so far, prelude included
}

func newStreamReader(r io.Reader, cfg *Config, nonce *Nonce) *streamReader {
	return &streamReader{r: r, cfg: cfg, mac: cfg.streamMAC(nonce), bytes: preludeBytes}
}

// read fills b and MACs it.
func (s *streamReader) read(b []byte, what string) error {
	n, err := io.ReadFull(s.r, b)
	s.mac.Write(b[:n])
	s.bytes += int64(n)
	if err != nil {
		return fmt.Errorf("%w: reading the %s: %w", ErrBadStream, what, err)
	}
	return nil
}

// verify reads the tag of checkpoint label and checks it.
func (s *streamReader) verify(label byte, what string) error {
	s.mac.Write([]byte{label})
	want := s.mac.Sum(s.tag[:0])
	n, err := io.ReadFull(s.r, s.got[:])
	s.bytes += int64(n)
	if err != nil {
		return fmt.Errorf("%w: reading the %s's MAC: %w", ErrBadStream, what, err)
	}
	if !hmac.Equal(s.got[:], want) {
		return fmt.Errorf("%w: %w: the %s's MAC does not verify: another key (or none), another connection's nonce, or bytes changed in transit", ErrBadStream, ErrAuth, what)
	}
	return nil
}

// readHead reads the fixed head and its tag, then checks its counts
// against the limits: nothing is allocated from a field before both.
func (s *streamReader) readHead() error {
	var b [headBytes]byte
	if err := s.read(b[:], "head"); err != nil {
		return err
	}
	if err := s.verify(tagHead, "head"); err != nil {
		return err
	}
	cfg, h := s.cfg, &s.h
	for i := range h.lens {
		h.lens[i] = int(binary.LittleEndian.Uint16(b[2*i:]))
	}
	h.state, h.lens[3] = h.lens[3]&stateBit != 0, h.lens[3]&^stateBit
	h.tokens = int(binary.LittleEndian.Uint32(b[8:]))
	h.runs = int(binary.LittleEndian.Uint32(b[12:]))
	h.npages = int(binary.LittleEndian.Uint32(b[16:]))
	h.ranges = int(binary.LittleEndian.Uint16(b[20:]))
	h.reserved = binary.LittleEndian.Uint16(b[22:])
	ps, pageBytes := cfg.Format.PageSize, int64(cfg.Format.PageBytes())
	switch {
	case h.reserved != 0:
		return fmt.Errorf("%w: head's reserved u16 at offset 22 is %#x, want 0", ErrBadStream, h.reserved)
	case h.ranges > MaxRetentionRanges:
		return fmt.Errorf("%w: %d retention ranges: at most %d", ErrBadStream, h.ranges, MaxRetentionRanges)
	case max(h.lens[0], h.lens[1], h.lens[2], h.lens[3]) > MaxString:
		return fmt.Errorf("%w: tenant, LoRA, salt, group tag of %d, %d, %d, %d bytes: at most %d each", ErrBadStream, h.lens[0], h.lens[1], h.lens[2], h.lens[3], MaxString)
	case h.state && (h.npages != 1 || h.lens[3] == 0 || h.tokens == 0 || h.tokens%ps != 0 || h.tokens/ps > cfg.Limits.MaxPages):
		return fmt.Errorf("%w: a state checkpoint of %d pages, %d tokens, a group tag of %d bytes: want 1 page after 1..%d whole pages of %d tokens, and a tag",
			ErrBadStream, h.npages, h.tokens, h.lens[3], cfg.Limits.MaxPages, ps)
	case h.npages > cfg.Limits.MaxPages:
		return fmt.Errorf("%w: %d pages: at most %d (Limits.MaxPages)", ErrBadStream, h.npages, cfg.Limits.MaxPages)
	case int64(h.npages)*pageBytes > cfg.Limits.MaxBytes:
		return fmt.Errorf("%w: %d pages of %d bytes exceed the limit of %d (Limits.MaxBytes)", ErrBadStream, h.npages, pageBytes, cfg.Limits.MaxBytes)
	case !h.state && int64(h.tokens) != int64(h.npages)*int64(ps):
		return fmt.Errorf("%w: %d tokens for %d pages of %d", ErrBadStream, h.tokens, h.npages, ps)
	case h.runs > h.npages || (h.runs == 0) != (h.npages == 0):
		return fmt.Errorf("%w: %d runs for %d pages", ErrBadStream, h.runs, h.npages)
	}
	return nil
}

// readBody reads the namespace, the tokens and the runs (growing as they
// arrive) and the header's tag, then checks the runs.
func (s *streamReader) readBody() error {
	h := &s.h
	rec := &Received{}
	s.rec = rec
	var b [tokenChunk]byte
	for i, f := range []*string{&rec.Tenant, &rec.LoRA, &rec.Salt, &rec.GroupTag} {
		if err := s.read(b[:h.lens[i]], [...]string{"tenant", "LoRA", "salt", "group tag"}[i]); err != nil {
			return err
		}
		*f = string(b[:h.lens[i]])
	}
	rec.State = h.state
	var err error
	if rec.Tokens, err = readItems(s, b[:], rec.Tokens, h.tokens, 4, "tokens", func(x []byte) int32 {
		return int32(binary.LittleEndian.Uint32(x))
	}); err != nil {
		return err
	}
	if rec.Runs, err = readItems(s, b[:], rec.Runs, h.runs, 8, "runs", func(x []byte) Run {
		return Run{Page: int32(binary.LittleEndian.Uint32(x)), Pages: int32(binary.LittleEndian.Uint32(x[4:]))}
	}); err != nil {
		return err
	}
	for i := range h.ranges {
		if err := s.read(b[:retentionRangeBytes], "retention ranges"); err != nil {
			return err
		}
		x, err := parseRetentionRange(i, b[:retentionRangeBytes])
		if err != nil {
			return fmt.Errorf("%w: %w", ErrBadStream, err)
		}
		rec.Retention = append(rec.Retention, x)
	}
	if err := s.verify(tagHeader, "header"); err != nil {
		return err
	}
	if err := checkRuns(rec.Runs, h.npages); err != nil {
		return fmt.Errorf("%w: %w", ErrBadStream, err)
	}
	return nil
}

// readItems reads n items of size bytes each, as many at a time as fit in
// b, and appends them, decoded, to dst as they arrive (so dst grows with
// what the stream delivers, not with what its header claims). On error dst
// holds the items read before it.
func readItems[T any](s *streamReader, b []byte, dst []T, n, size int, what string, decode func([]byte) T) ([]T, error) {
	for left := n; left > 0; {
		k := min(left, len(b)/size)
		if err := s.read(b[:size*k], what); err != nil {
			return dst, err
		}
		dst = slices.Grow(dst, k)
		for i := range k {
			dst = append(dst, decode(b[size*i:]))
		}
		left -= k
	}
	return dst, nil
}

// readPages reads, decodes and verifies each page value as the page the
// token chain names before the next is read (each page's buffer allocated
// as its bytes arrive), then the stream's tag.
func (s *streamReader) readPages() (*Received, error) {
	cfg, rec, n := s.cfg, s.rec, s.h.npages
	ps := cfg.Format.PageSize
	vhead := make([]byte, tier.ValueDataOffset(cfg.Format, cfg.Namespace, cfg.Group))
	var tail [tier.ValueCRCBytes]byte
	parent := chainRoot(rec.Tenant, rec.LoRA, rec.Salt, rec.GroupTag, rec.State, rec.Tokens, ps)
	scratch := make([]byte, 0, 64+4*ps)
	var tokens []int32
	for i := range n {
		p := tier.RemotePage{Parent: parent, Tokens: rec.Tokens[i*ps : (i+1)*ps : (i+1)*ps], State: rec.State}
		if rec.State {
			p.Tokens = rec.Tokens[len(rec.Tokens)-ps:]
		}
		err := s.read(vhead, "page")
		if err == nil {
			p.Data = make([]byte, cfg.Format.PageBytes())
			err = s.read(p.Data, "page")
		}
		if err == nil {
			err = s.read(tail[:], "page")
		}
		if err != nil {
			return nil, fmt.Errorf("page %d of %d: %w", i, n, err)
		}
		p.Digest = tier.Next(scratch, parent, p.Tokens)
		p.Retention = pageRetention(rec.Retention, i, ps)
		p.Chain = p.Digest
		if i > 0 {
			p.Chain = rec.Pages[0].Digest
		}
		v, err := tier.DecodeValueParts(vhead, p.Data, tail[:], tokens, cfg.Namespace, cfg.Group)
		if err == nil {
			tokens = v.Tokens
			err = v.Verify(cfg.Format, cfg.Namespace, cfg.Group, &p)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: page %d of %d: %w", ErrBadStream, i, n, err)
		}
		rec.Pages = append(rec.Pages, p)
		parent = p.Digest
	}
	if err := s.verify(tagStream, "stream"); err != nil {
		return nil, err
	}
	return rec, nil
}

// ReadRequest reads one request's whole stream on the connection of nonce
// from r and verifies all of it (see the package doc); it returns the
// request only if every byte checked out and every tag verified under
// cfg's key. Memory follows the bytes that arrived and is bounded by
// cfg.Limits whatever the stream says.
func ReadRequest(r io.Reader, cfg Config, nonce Nonce) (*Received, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	var p [preludeBytes]byte
	if _, err := io.ReadFull(r, p[:]); err != nil {
		return nil, fmt.Errorf("%w: reading the prelude: %w", ErrBadStream, err)
	}
	if err := checkPrelude(p[:]); err != nil {
		return nil, err
	}
	s := newStreamReader(r, &cfg, &nonce)
	if err := s.readHead(); err != nil {
		return nil, err
	}
	if err := s.readBody(); err != nil {
		return nil, err
	}
	return s.readPages()
}
