package handoff

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

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
		if n := len(dst); n > 0 && dst[n-1].Page+dst[n-1].Pages == p {
			dst[n-1].Pages++
			continue
		}
		dst = append(dst, Run{Page: p, Pages: 1})
	}
	return dst
}

// Errors.
var (
	// ErrBadConfig reports an invalid [Config].
	ErrBadConfig = errors.New("handoff: bad config")
	// ErrBadStream: the bytes are not a request this version writes, or
	// are past the limits; nothing was admitted.
	ErrBadStream = errors.New("handoff: bad stream")
	// ErrRefused: the receiver refused the request (see the message).
	ErrRefused = errors.New("handoff: refused by the receiver")
	// ErrFull: the store cannot hold the request's pages.
	ErrFull = errors.New("handoff: store full")
)

// Config is what both sides agree on: the deployment (namespace and
// layer group, as in the Redis and disk tiers) and the page format.
type Config struct {
	Namespace string
	Group     string // "" means "all"
	Format    tier.PageFormat
	Limits    Limits
}

// Limits bound what a receiver accepts from one stream.
type Limits struct {
	// MaxPages bounds the pages of one request (0: DefaultMaxPages).
	MaxPages int
	// MaxBytes bounds the page bytes of one request (0: DefaultMaxBytes).
	MaxBytes int64
}

// Defaults.
const (
	DefaultMaxPages       = 1 << 16
	DefaultMaxBytes int64 = 4 << 30
	maxString             = 1024
	streamMagic           = "PKVH"
	streamVersion         = 1
)

func (c *Config) check() error {
	if err := c.Format.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	switch {
	case c.Namespace == "" || len(c.Namespace) > maxString || len(c.Group) > maxString:
		return fmt.Errorf("%w: namespace of %d bytes, group of %d: want 1..%d and <= %d", ErrBadConfig, len(c.Namespace), len(c.Group), maxString, maxString)
	case c.Limits.MaxPages < 0 || c.Limits.MaxBytes < 0:
		return fmt.Errorf("%w: MaxPages %d, MaxBytes %d: want >= 0", ErrBadConfig, c.Limits.MaxPages, c.Limits.MaxBytes)
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

// Request is one request's KV as it moves: its namespace, the tokens of
// its full pages, the sender's plan and each full page's bytes
// (tier.PageFormat order).
type Request struct {
	Tenant, LoRA, Salt string
	Tokens             []int32
	Runs               []Run
	Pages              [][]byte
}

// StreamBytes is the length of r's stream.
func (c Config) StreamBytes(r *Request) int64 {
	if c.Group == "" {
		c.Group = "all"
	}
	return int64(4+4+6+len(r.Tenant)+len(r.LoRA)+len(r.Salt)+4+4*len(r.Tokens)+4+8*len(r.Runs)+4+4) +
		int64(len(r.Pages))*int64(tier.EncodedValueLen(c.Format, c.Namespace, c.Group))
}

// WriteRequest writes r's stream to w. r must be consistent (tokens of
// len(Pages) full pages, runs covering them, pages of the format's size).
func WriteRequest(w io.Writer, cfg Config, r *Request) error {
	if err := cfg.check(); err != nil {
		return err
	}
	ps := cfg.Format.PageSize
	npages := 0
	for _, run := range r.Runs {
		npages += int(run.Pages)
	}
	switch {
	case len(r.Tokens) != len(r.Pages)*ps:
		return fmt.Errorf("handoff: write: %d tokens for %d pages of %d", len(r.Tokens), len(r.Pages), ps)
	case npages != len(r.Pages):
		return fmt.Errorf("handoff: write: runs cover %d pages, the request has %d", npages, len(r.Pages))
	case len(r.Tenant) > maxString || len(r.LoRA) > maxString || len(r.Salt) > maxString:
		return fmt.Errorf("handoff: write: namespace fields of %d, %d, %d bytes: want <= %d", len(r.Tenant), len(r.LoRA), len(r.Salt), maxString)
	}
	hdr := append([]byte(streamMagic), streamVersion, 0, 0, 0)
	for _, s := range []string{r.Tenant, r.LoRA, r.Salt} {
		hdr = binary.LittleEndian.AppendUint16(hdr, uint16(len(s)))
		hdr = append(hdr, s...)
	}
	hdr = binary.LittleEndian.AppendUint32(hdr, uint32(len(r.Tokens)))
	for _, t := range r.Tokens {
		hdr = binary.LittleEndian.AppendUint32(hdr, uint32(t))
	}
	hdr = binary.LittleEndian.AppendUint32(hdr, uint32(len(r.Runs)))
	for _, run := range r.Runs {
		hdr = binary.LittleEndian.AppendUint32(hdr, uint32(run.Page))
		hdr = binary.LittleEndian.AppendUint32(hdr, uint32(run.Pages))
	}
	hdr = binary.LittleEndian.AppendUint32(hdr, uint32(len(r.Pages)))
	hdr = binary.LittleEndian.AppendUint32(hdr, crc32.Checksum(hdr, tier.CRCTable))
	bw := bufio.NewWriterSize(w, 1<<20)
	if _, err := bw.Write(hdr); err != nil {
		return err
	}
	val := make([]byte, 0, tier.EncodedValueLen(cfg.Format, cfg.Namespace, cfg.Group))
	parent := tier.NamespaceRoot(r.Tenant, r.LoRA, r.Salt)
	scratch := make([]byte, 0, 64+4*ps)
	for i, data := range r.Pages {
		toks := r.Tokens[i*ps : (i+1)*ps]
		d := tier.Next(scratch, parent, toks)
		var err error
		val, err = tier.EncodeValue(val[:0], cfg.Format, cfg.Namespace, cfg.Group, &tier.RemotePage{Digest: d, Parent: parent, Tokens: toks, Data: data})
		if err != nil {
			return fmt.Errorf("handoff: write: page %d: %w", i, err)
		}
		if _, err := bw.Write(val); err != nil {
			return err
		}
		parent = d
	}
	return bw.Flush()
}

// Received is a verified request: its pages as the tiers name them.
type Received struct {
	Tenant, LoRA, Salt string
	Tokens             []int32
	Runs               []Run
	// Pages are the full pages in order, digests chained from the
	// namespace root; their Tokens alias Tokens.
	Pages []tier.RemotePage
}

// Bytes is the page bytes received.
func (r *Received) Bytes() int64 {
	var n int64
	for _, p := range r.Pages {
		n += int64(len(p.Data))
	}
	return n
}

// streamReader reads fields off a stream, remembering the first error.
type streamReader struct {
	r   io.Reader
	err error
	hdr []byte // the header bytes read so far, for its checksum
	buf [8]byte
}

func (s *streamReader) read(b []byte, what string) {
	if s.err != nil {
		return
	}
	if _, err := io.ReadFull(s.r, b); err != nil {
		s.err = fmt.Errorf("%w: reading the %s: %w", ErrBadStream, what, err)
		return
	}
	s.hdr = append(s.hdr, b...)
}

func (s *streamReader) u16(what string) int {
	s.read(s.buf[:2], what)
	return int(binary.LittleEndian.Uint16(s.buf[:2]))
}

func (s *streamReader) u32(what string) uint32 {
	s.read(s.buf[:4], what)
	return binary.LittleEndian.Uint32(s.buf[:4])
}

func (s *streamReader) str(what string) string {
	n := s.u16(what + " length")
	if s.err == nil && n > maxString {
		s.err = fmt.Errorf("%w: %s of %d bytes, more than %d", ErrBadStream, what, n, maxString)
	}
	if s.err != nil {
		return ""
	}
	b := make([]byte, n)
	s.read(b, what)
	return string(b)
}

// ReadRequest reads one request's stream from r and verifies all of it
// (see the package doc); it returns the request only if every byte
// checked out. Memory is bounded by cfg.Limits whatever the stream says.
func ReadRequest(r io.Reader, cfg Config) (*Received, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	s := &streamReader{r: r}
	var magic [8]byte
	s.read(magic[:], "magic")
	if s.err != nil {
		return nil, s.err
	}
	if string(magic[:4]) != streamMagic || magic[4] != streamVersion || magic[5]|magic[6]|magic[7] != 0 {
		return nil, fmt.Errorf("%w: magic %q version %d (want %q version %d)", ErrBadStream, magic[:4], magic[4], streamMagic, streamVersion)
	}
	rec := &Received{Tenant: s.str("tenant"), LoRA: s.str("LoRA"), Salt: s.str("salt")}
	ps := cfg.Format.PageSize
	maxTokens := cfg.Limits.MaxPages * ps
	ntok := int64(s.u32("token count"))
	if s.err == nil && (ntok > int64(maxTokens) || ntok%int64(ps) != 0) {
		return nil, fmt.Errorf("%w: %d tokens: want a multiple of the page size %d, at most %d", ErrBadStream, ntok, ps, maxTokens)
	}
	npages := int(ntok) / ps
	pageBytes := int64(cfg.Format.PageBytes())
	if int64(npages)*pageBytes > cfg.Limits.MaxBytes {
		return nil, fmt.Errorf("%w: %d pages of %d bytes exceed the limit of %d", ErrBadStream, npages, pageBytes, cfg.Limits.MaxBytes)
	}
	if s.err != nil {
		return nil, s.err
	}
	raw := make([]byte, 4*ntok)
	s.read(raw, "tokens")
	nruns := int64(s.u32("run count"))
	if s.err == nil && nruns > int64(npages) {
		return nil, fmt.Errorf("%w: %d runs for %d pages", ErrBadStream, nruns, npages)
	}
	if s.err != nil {
		return nil, s.err
	}
	rec.Runs = make([]Run, nruns)
	covered := int64(0)
	for i := range rec.Runs {
		page, n := int32(s.u32("run page")), int32(s.u32("run length"))
		if s.err == nil && (page < 0 || n < 1) {
			return nil, fmt.Errorf("%w: run %d: page %d, %d pages", ErrBadStream, i, page, n)
		}
		rec.Runs[i] = Run{Page: page, Pages: n}
		covered += int64(n)
	}
	declared := int64(s.u32("page count"))
	sum := crc32.Checksum(s.hdr, tier.CRCTable)
	got := s.u32("header checksum")
	switch {
	case s.err != nil:
		return nil, s.err
	case got != sum:
		return nil, fmt.Errorf("%w: header checksum %#x, computed %#x", ErrBadStream, got, sum)
	case declared != int64(npages) || covered != int64(npages):
		return nil, fmt.Errorf("%w: %d pages declared, %d covered by runs, %d tokens make %d", ErrBadStream, declared, covered, ntok, npages)
	}
	rec.Tokens = make([]int32, ntok)
	for i := range rec.Tokens {
		rec.Tokens[i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	// The pages: each value read, decoded and verified as the page the
	// token chain names before the next is read.
	vlen := tier.EncodedValueLen(cfg.Format, cfg.Namespace, cfg.Group)
	val := make([]byte, vlen)
	rec.Pages = make([]tier.RemotePage, npages)
	parent := tier.NamespaceRoot(rec.Tenant, rec.LoRA, rec.Salt)
	scratch := make([]byte, 0, 64+4*ps)
	var tokens []int32
	for i := range rec.Pages {
		if _, err := io.ReadFull(r, val); err != nil {
			return nil, fmt.Errorf("%w: page %d of %d: %w", ErrBadStream, i, npages, err)
		}
		p := &rec.Pages[i]
		p.Parent, p.Tokens = parent, rec.Tokens[i*ps:(i+1)*ps]
		p.Digest = tier.Next(scratch, parent, p.Tokens)
		p.Data = make([]byte, pageBytes) // as the bytes arrive: memory follows what was sent
		p.Chain = rec.Pages[0].Digest
		v, err := tier.DecodeValueInto(p.Data, val, tokens)
		if err == nil {
			tokens = v.Tokens
			err = v.Verify(cfg.Format, cfg.Namespace, cfg.Group, p)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: page %d of %d: %w", ErrBadStream, i, npages, err)
		}
		parent = p.Digest
	}
	return rec, nil
}
