package handoff

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/doclimits"
	"github.com/pagedkv/pagedkv/internal/heaptest"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/tier"
)

var testFormat = tier.PageFormat{Layout: layout.HND, DType: layout.BF16, PageSize: 4, NumKVHeads: 2, HeadDim: 8, Layers: 2}

// testKey is the test deployment's handoff key.
var testKey = []byte("handoff test key: 32 bytes long!")

func testConfig() Config { return Config{Namespace: "model-a", Format: testFormat, Key: testKey} }

// testNonce is a fixed nonce for streams read offline.
var testNonce = Nonce{1, 2, 3}

// testRequest is a request of npages full pages on device pages pages,
// its K/V derived from a seed.
func testRequest(seed uint64, npages int, pages []int32) *Request {
	rng := rand.New(rand.NewPCG(seed, 3))
	r := &Request{Tenant: "acme", LoRA: "sql", Runs: Plan(nil, pages)}
	for range npages * testFormat.PageSize {
		r.Tokens = append(r.Tokens, int32(rng.IntN(50000)))
	}
	for range npages {
		b := make([]byte, testFormat.PageBytes())
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		r.Pages = append(r.Pages, b)
	}
	return r
}

// seq is the page IDs 0..n-1.
func seq(n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(i)
	}
	return out
}

func TestPlan(t *testing.T) {
	for _, c := range []struct {
		pages []int32
		runs  []Run
	}{
		{nil, nil},
		{[]int32{7}, []Run{{7, 1}}},
		{[]int32{3, 4, 5, 6}, []Run{{3, 4}}},
		{[]int32{3, 4, 9, 10, 11, 2}, []Run{{3, 2}, {9, 3}, {2, 1}}},
		{[]int32{5, 4, 3}, []Run{{5, 1}, {4, 1}, {3, 1}}},                    // descending is not contiguous in token order
		{[]int32{1<<31 - 1, -1 << 31}, []Run{{1<<31 - 1, 1}, {-1 << 31, 1}}}, // no int32 wrap
	} {
		require.Equal(t, c.runs, Plan(nil, c.pages), "%v", c.pages)
	}
}

func encode(t testing.TB, cfg Config, nonce Nonce, r *Request) []byte {
	var b bytes.Buffer
	require.NoError(t, WriteRequest(&b, cfg, nonce, r))
	require.EqualValues(t, cfg.StreamBytes(r), b.Len())
	return b.Bytes()
}

func TestRoundTripAndAdmit(t *testing.T) {
	cfg := testConfig()
	r := testRequest(1, 5, []int32{10, 11, 12, 40, 41})
	got, err := ReadRequest(bytes.NewReader(encode(t, cfg, testNonce, r)), cfg, testNonce)
	require.NoError(t, err)
	require.Equal(t, r.Tokens, got.Tokens)
	require.Equal(t, []Run{{10, 3}, {40, 2}}, got.Runs)
	require.Len(t, got.Pages, 5)
	parent := tier.NamespaceRoot("acme", "sql", "")
	for i, p := range got.Pages {
		require.Equal(t, r.Pages[i], p.Data)
		require.Equal(t, parent, p.Parent)
		require.Equal(t, tier.Next(nil, parent, r.Tokens[4*i:4*i+4]), p.Digest)
		require.Equal(t, got.Pages[0].Digest, p.Chain)
		parent = p.Digest
	}

	st, err := NewStore(cfg, 8)
	require.NoError(t, err)
	a, err := st.Admit(got)
	require.NoError(t, err)
	require.Equal(t, Admission{ID: a.ID, Pages: 5, Fresh: 5}, a)
	// A decode Manager's lookup: the chain, with fresh buffers.
	want := fetchable(got)
	require.Equal(t, 5, st.Fetch(context.Background(), want))
	for i := range want {
		require.Equal(t, r.Pages[i], want[i].Data)
	}
	// Another request sharing nothing does not fit next to it: refused,
	// nothing admitted.
	other, err := ReadRequest(bytes.NewReader(encode(t, cfg, testNonce, testRequest(2, 4, []int32{0, 1, 2, 3}))), cfg, testNonce)
	require.NoError(t, err)
	_, err = st.Admit(other)
	require.ErrorIs(t, err, ErrFull)
	require.Equal(t, 5, st.Held())
	require.NoError(t, st.CheckInvariants())
	require.Equal(t, AdmitStats{Admissions: 1, Refused: 1, FreshPages: 5}, st.AdmitStats())
	require.True(t, st.Forget(a.ID))
	require.False(t, st.Forget(a.ID))
	require.Zero(t, st.Held())
	require.Zero(t, st.Fetch(context.Background(), want[:1]))
	require.NoError(t, st.CheckInvariants())
}

// fetchable is a decode Manager's lookup of r's chain, with fresh buffers.
func fetchable(r *Received) []tier.RemotePage {
	out := make([]tier.RemotePage, len(r.Pages))
	for i, p := range r.Pages {
		out[i] = tier.RemotePage{Digest: p.Digest, Parent: p.Parent, Tokens: p.Tokens, Data: make([]byte, len(p.Data))}
	}
	return out
}

// Every truncation and every single-byte change of a stream is refused:
// nothing is returned to admit. So is the stream under another key or
// none, and on another connection (another nonce): a recorded stream does
// not replay.
func TestEveryByteIsChecked(t *testing.T) {
	cfg := testConfig()
	b := encode(t, cfg, testNonce, testRequest(3, 3, []int32{1, 2, 3}))
	for n := range len(b) {
		_, err := ReadRequest(bytes.NewReader(b[:n]), cfg, testNonce)
		require.ErrorIs(t, err, ErrBadStream, "truncated to %d of %d bytes", n, len(b))
	}
	for i := range b {
		bad := bytes.Clone(b)
		bad[i] ^= 0x10
		_, err := ReadRequest(bytes.NewReader(bad), cfg, testNonce)
		require.ErrorIs(t, err, ErrBadStream, "byte %d of %d changed", i, len(b))
	}
	_, err := ReadRequest(bytes.NewReader(b), cfg, Nonce{9})
	require.ErrorIs(t, err, ErrAuth, "another connection's nonce: a replay")
	other := testConfig()
	other.Key = []byte("another deployment's handoff key")
	_, err = ReadRequest(bytes.NewReader(b), other, testNonce)
	require.ErrorIs(t, err, ErrAuth)
	require.ErrorContains(t, err, "the head's MAC does not verify")
	insecure := testConfig()
	insecure.Key, insecure.Insecure = nil, true
	_, err = ReadRequest(bytes.NewReader(b), insecure, testNonce)
	require.ErrorIs(t, err, ErrAuth)
	// And the other way: an unauthenticated stream is refused by a keyed
	// reader.
	_, err = ReadRequest(bytes.NewReader(encode(t, insecure, testNonce, testRequest(3, 3, []int32{1, 2, 3}))), cfg, testNonce)
	require.ErrorIs(t, err, ErrAuth)
}

func TestConfigNeedsKeyOrInsecure(t *testing.T) {
	cfg := testConfig()
	cfg.Key = nil
	_, err := NewStore(cfg, 4)
	require.ErrorIs(t, err, ErrBadConfig)
	require.ErrorContains(t, err, "Config.Key is empty")
	require.ErrorContains(t, err, "Config.Insecure")
	cfg.Key = []byte("short")
	_, err = NewStore(cfg, 4)
	require.ErrorContains(t, err, "Config.Key of 5 bytes: want at least 16")
	cfg.Key, cfg.Insecure = testKey, true
	_, err = NewStore(cfg, 4)
	require.ErrorContains(t, err, "both set")
	cfg.Key = nil
	_, err = NewStore(cfg, 4)
	require.NoError(t, err)
	require.ErrorIs(t, WriteRequest(io.Discard, Config{Namespace: "m", Format: testFormat}, testNonce, testRequest(1, 1, []int32{0})), ErrBadConfig)
	require.ErrorIs(t, Send(context.Background(), "127.0.0.1:1", Config{Namespace: "m", Format: testFormat}, testRequest(1, 1, []int32{0})), ErrBadConfig)
}

// signedStream is the start of a stream on the connection of nonce: the
// prelude and a head of the given counts with a valid tag, then body. It
// is what a holder of cfg's key could send, right or wrong.
func signedStream(cfg Config, nonce Nonce, tokens, runs, pages uint32, lens [3]uint16, body []byte) []byte {
	var b bytes.Buffer
	s := newStreamWriter(&b, &cfg, &nonce)
	s.prelude()
	var h [headBytes]byte
	for i, l := range lens {
		binary.LittleEndian.PutUint16(h[2*i:], l)
	}
	binary.LittleEndian.PutUint32(h[8:], tokens)
	binary.LittleEndian.PutUint32(h[12:], runs)
	binary.LittleEndian.PutUint32(h[16:], pages)
	s.write(h[:])
	s.checkpoint(tagHead)
	s.write(body)
	s.flush()
	return b.Bytes()
}

func TestForeignAndOversizedStreams(t *testing.T) {
	cfg := testConfig()
	b := encode(t, cfg, testNonce, testRequest(4, 3, []int32{1, 2, 3}))
	other := testConfig()
	other.Namespace = "model-b"
	_, err := ReadRequest(bytes.NewReader(b), other, testNonce)
	require.ErrorIs(t, err, tier.ErrForeignValue)
	require.ErrorContains(t, err, `namespace "model-a"`)
	fmtOther := testConfig()
	fmtOther.Format.DType = layout.F16
	_, err = ReadRequest(bytes.NewReader(b), fmtOther, testNonce)
	require.ErrorIs(t, err, ErrBadStream)

	small := testConfig()
	small.Limits.MaxPages = 2
	_, err = ReadRequest(bytes.NewReader(b), small, testNonce)
	require.ErrorContains(t, err, "3 pages: at most 2 (Limits.MaxPages)")
	small = testConfig()
	small.Limits.MaxBytes = int64(testFormat.PageBytes())
	_, err = ReadRequest(bytes.NewReader(b), small, testNonce)
	require.ErrorContains(t, err, "exceed the limit")

	// A head claiming 2^32-1 tokens and pages: without the key, refused at
	// its tag; with it, at the limits; allocating nothing either way.
	ns := [3]uint16{4, 3, 0}
	for _, key := range [][]byte{[]byte("a stranger's key, 32 bytes long!"), testKey} {
		signer := testConfig()
		signer.Key = key
		huge := signedStream(signer, testNonce, 0xffffffff, 0xffffffff, 0xffffffff, ns, nil)
		grew := heaptest.Growth(func() {
			_, err = ReadRequest(bytes.NewReader(huge), cfg, testNonce)
		})
		require.ErrorIs(t, err, ErrBadStream)
		require.Less(t, grew, uint64(64<<10), "%v", err)
	}
	require.ErrorContains(t, err, "4294967295 pages: at most 65536")

	// A key holder's head at the limits (65536 pages: 256 Ki tokens, 64
	// MiB of pages) and nothing after it: memory follows the bytes that
	// arrived, not the head (the old reader allocated 4 bytes a token
	// before its checksum).
	atLimits := signedStream(cfg, testNonce, DefaultMaxPages*4, DefaultMaxPages, DefaultMaxPages, ns, []byte("acmesql"))
	grew := heaptest.Growth(func() {
		_, err = ReadRequest(bytes.NewReader(atLimits), cfg, testNonce)
	})
	require.ErrorContains(t, err, "reading the tokens: EOF")
	require.Less(t, grew, uint64(64<<10))

	// The writer refuses an inconsistent request.
	r := testRequest(5, 2, []int32{1, 2})
	r.Tokens = r.Tokens[:5]
	require.Error(t, WriteRequest(&bytes.Buffer{}, cfg, testNonce, r))
}

// rawStream writes r's stream as WriteRequest does but with runs as given
// (WriteRequest refuses bad ones): what a key holder could send.
func rawStream(cfg Config, nonce Nonce, r *Request) []byte {
	cfg.check()
	var b bytes.Buffer
	s := newStreamWriter(&b, &cfg, &nonce)
	s.prelude()
	s.header(r)
	s.pages(r)
	s.flush()
	return b.Bytes()
}

// Runs that name a page twice or wrap int32 are refused, naming the run,
// by the reader and the writer.
func TestBadRunsRefused(t *testing.T) {
	cfg := testConfig()
	for _, c := range []struct {
		runs []Run
		want string
	}{
		{[]Run{{5, 1}, {5, 1}}, "run 0 {5 1} and run 1 {5 1} both name page 5"},
		{[]Run{{2147483647, 2}}, "run 0 {2147483647 2}: its end, page 2147483649, is past int32"},
		{[]Run{{2147483647, 1}, {0, 1}}, "run 0 {2147483647 1}: its end, page 2147483648, is past int32"},
		{[]Run{{9, 1}, {3, 3}, {4, 1}}, "run 1 {3 3} and run 2 {4 1} both name page 4"},
		{[]Run{{0, 1}, {-3, 1}}, "run 1 {-3 1}: want a page >= 0"},
		{[]Run{{0, 3}, {7, -1}}, "run 1 {7 -1}: want a page >= 0 and >= 1 pages"},
		{[]Run{{0, 1}}, "the runs cover 1 pages, the request has 2"},
	} {
		r := testRequest(6, 2, nil)
		if len(c.runs) == 3 {
			r = testRequest(6, 5, nil)
		}
		r.Runs = c.runs
		_, err := ReadRequest(bytes.NewReader(rawStream(cfg, testNonce, r)), cfg, testNonce)
		require.ErrorIs(t, err, ErrBadStream, "%v", c.runs)
		require.ErrorContains(t, err, c.want)
		err = WriteRequest(io.Discard, cfg, testNonce, r)
		require.ErrorContains(t, err, c.want)
	}
}

// serve starts a receiver on a loopback port with short limits for tests.
func serve(t *testing.T, st *Store, sc ServerConfig) (*Server, string) {
	if sc.IdleTimeout == 0 {
		sc.IdleTimeout = 5 * time.Second
	}
	s, err := Listen(st, sc)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s, s.Addr().String()
}

func newStore(t testing.TB, cfg Config, pages int) *Store {
	st, err := NewStore(cfg, pages)
	require.NoError(t, err)
	return st
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// dialRaw opens a connection as a sender would and reads the hello.
func dialRaw(t *testing.T, addr string) (net.Conn, *bufio.Reader, Nonce) {
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	_, err = c.Write(prelude[:])
	require.NoError(t, err)
	br := bufio.NewReader(c)
	var h [helloBytes]byte
	_, err = io.ReadFull(br, h[:])
	require.NoError(t, err)
	var n Nonce
	copy(n[:], h[preludeBytes:])
	return c, br, n
}

// rawReply reads a reply off a raw connection, checking its tag under cfg.
func rawReply(t *testing.T, br *bufio.Reader, cfg Config, nonce Nonce, seq byte) (byte, string) {
	cfg.check()
	status, msg, err := readReply(br, &cfg, &nonce, seq)
	require.NoError(t, err)
	return status, msg
}

// eventually waits for cond.
func eventually(t *testing.T, cond func() bool, what string) {
	t.Helper()
	require.Eventually(t, cond, 10*time.Second, time.Millisecond, what)
}

func TestSendOverLoopback(t *testing.T) {
	cfg := testConfig()
	st := newStore(t, cfg, 6)
	srv, addr := serve(t, st, ServerConfig{})
	ctx := testCtx(t)
	require.NoError(t, Send(ctx, addr, cfg, testRequest(6, 4, []int32{4, 5, 6, 7})))
	require.Equal(t, 4, st.Held())

	// Refused (full): the sender hears why; nothing more is held.
	err := Send(ctx, addr, cfg, testRequest(7, 4, []int32{0, 1, 2, 3}))
	require.ErrorIs(t, err, ErrRefused)
	require.ErrorContains(t, err, "store full")
	require.Equal(t, 4, st.Held())
	// Larger than the store could ever hold: refused on the header,
	// before the pages are sent.
	err = Send(ctx, addr, cfg, testRequest(7, 7, []int32{0, 1, 2, 3, 4, 5, 6}))
	require.ErrorIs(t, err, ErrRefused)
	require.ErrorContains(t, err, "store full: 7 pages, the store holds at most 6")

	// A transfer cut half way: the receiver admits nothing.
	c, br, nonce := dialRaw(t, addr)
	b := encode(t, cfg, nonce, testRequest(8, 1, []int32{9}))
	_, err = c.Write(b[preludeBytes : len(b)-100])
	require.NoError(t, err)
	require.NoError(t, c.(*net.TCPConn).CloseWrite())
	status, _ := rawReply(t, br, cfg, nonce, replyVerdict)
	require.EqualValues(t, ackContinue, status)
	status, msg := rawReply(t, br, cfg, nonce, replyAck)
	require.EqualValues(t, ackRefused, status)
	require.Contains(t, msg, "EOF")
	require.Equal(t, 4, st.Held())
	require.NoError(t, st.CheckInvariants())

	// Nobody listening: an error, so the sender keeps its request.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	ln.Close()
	require.Error(t, Send(ctx, dead, cfg, testRequest(9, 1, []int32{0})))

	eventually(t, func() bool { return srv.Stats().Open == 0 }, "connections closed")
	s := srv.Stats()
	require.Equal(t, ServerStats{Accepted: 4, Admitted: 1, Refused: 2, BadStreams: 1, BytesRead: s.BytesRead}, s)
}

// Finding 1: a stranger (another key, or none) cannot admit anything, not
// even a prefix of another tenant's; the real sender's transfer is then
// admitted and its bytes are what the store serves.
func TestStrangerIsRefused(t *testing.T) {
	cfg := testConfig()
	st := newStore(t, cfg, 16)
	srv, addr := serve(t, st, ServerConfig{})
	ctx := testCtx(t)
	real := testRequest(10, 3, []int32{1, 2, 3})
	forged := testRequest(11, 3, []int32{1, 2, 3})
	forged.Tokens = real.Tokens // the same prefix, the stranger's K/V

	stranger := testConfig()
	stranger.Key = []byte("guessed key, also 32 bytes long!")
	err := Send(ctx, addr, stranger, forged)
	require.ErrorIs(t, err, ErrAuth)
	require.ErrorContains(t, err, "the receiver's reply does not verify")
	noKey := testConfig()
	noKey.Key, noKey.Insecure = nil, true
	err = Send(ctx, addr, noKey, forged)
	require.ErrorIs(t, err, ErrAuth)
	require.ErrorContains(t, err, "the receiver requires authentication")
	// A stranger writing the stream by hand under the public insecure key
	// is refused at the head's tag.
	c, br, nonce := dialRaw(t, addr)
	_, err = c.Write(rawStream(noKey, nonce, forged)[preludeBytes:])
	require.NoError(t, err)
	var h [3]byte
	_, err = io.ReadFull(br, h[:])
	require.NoError(t, err)
	require.EqualValues(t, ackRefused, h[0])
	c.Close()
	// A recorded genuine stream replayed on another connection: refused.
	c, br, _ = dialRaw(t, addr)
	_, err = c.Write(rawStream(cfg, Nonce{7}, forged)[preludeBytes:])
	require.NoError(t, err)
	_, err = io.ReadFull(br, h[:])
	require.NoError(t, err)
	require.EqualValues(t, ackRefused, h[0])
	c.Close()
	require.Zero(t, st.Held(), "nothing admitted")

	require.NoError(t, Send(ctx, addr, cfg, real))
	rec, err := ReadRequest(bytes.NewReader(encode(t, cfg, testNonce, real)), cfg, testNonce)
	require.NoError(t, err)
	want := fetchable(rec)
	require.Equal(t, 3, st.Fetch(ctx, want))
	for i := range want {
		require.Equal(t, real.Pages[i], want[i].Data)
	}
	eventually(t, func() bool { return srv.Stats().Open == 0 }, "connections closed")
	s := srv.Stats()
	require.EqualValues(t, 3, s.AuthFailures, "the wrong key, the hand-made stream, the replay")
	require.EqualValues(t, 1, s.BadStreams, "the keyless sender hung up after the hello")
	require.EqualValues(t, 1, s.Admitted)
}

// A sender does not take a receiver's word for it: a receiver without the
// key (or one that runs without authentication) is found out.
func TestSenderAuthenticatesTheReceiver(t *testing.T) {
	cfg := testConfig()
	ctx := testCtx(t)
	// A fake receiver that says "admitted" without the key.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	fakeCfg := testConfig()
	fakeCfg.Key = []byte("not the deployment's key (32 b).")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var p [preludeBytes]byte
				io.ReadFull(c, p[:])
				nonce := NewNonce()
				c.Write(append([]byte{'P', 'K', 'V', 'H', StreamVersion, helloAuth, 0, 0}, nonce[:]...))
				c.Write(appendReply(nil, &fakeCfg, &nonce, replyVerdict, ackContinue, ""))
				io.Copy(io.Discard, io.LimitReader(c, 1<<20))
			}()
		}
	}()
	err = Send(ctx, ln.Addr().String(), cfg, testRequest(12, 1, []int32{0}))
	require.ErrorIs(t, err, ErrAuth)

	insecure := testConfig()
	insecure.Key, insecure.Insecure = nil, true
	st := newStore(t, insecure, 4)
	_, addr := serve(t, st, ServerConfig{})
	err = Send(ctx, addr, cfg, testRequest(12, 1, []int32{0}))
	require.ErrorIs(t, err, ErrAuth)
	require.ErrorContains(t, err, "runs without authentication")
	require.Zero(t, st.Held())
	// Insecure on both sides, as the operator asked: admitted.
	require.NoError(t, Send(ctx, addr, insecure, testRequest(12, 1, []int32{0})))
	require.Equal(t, 1, st.Held())
}

// Finding 1, the other half: a second transfer of a held digest with
// other bytes is answered "already held", not "admitted"; the store
// serves the first bytes. Equal bytes are admitted.
func TestAlreadyHeld(t *testing.T) {
	cfg := testConfig()
	st := newStore(t, cfg, 16)
	var admissions []Admission
	srv, addr := serve(t, st, ServerConfig{Admitted: func(a Admission, _ *Received) { admissions = append(admissions, a) }})
	ctx := testCtx(t)
	first := testRequest(13, 3, []int32{1, 2, 3})
	require.NoError(t, Send(ctx, addr, cfg, first))
	second := testRequest(14, 4, []int32{7, 8, 9, 10})
	second.Tokens = append(append([]int32(nil), first.Tokens...), second.Tokens[12:]...) // the same 3-page prefix, a 4th page
	err := Send(ctx, addr, cfg, second)
	require.ErrorIs(t, err, ErrAlreadyHeld)
	require.NotErrorIs(t, err, ErrRefused)
	require.ErrorContains(t, err, "3 of 4 pages were already held with other bytes")
	// The same bytes again: taken (the store serves exactly them).
	require.NoError(t, Send(ctx, addr, cfg, first))
	require.Equal(t, []Admission{
		{ID: 1, Pages: 3, Fresh: 3},
		{ID: 2, Pages: 4, Fresh: 1, Held: 3},
		{ID: 3, Pages: 3, Same: 3},
	}, admissions)
	require.Equal(t, 4, st.Held())

	rec, err := ReadRequest(bytes.NewReader(encode(t, cfg, testNonce, second)), cfg, testNonce)
	require.NoError(t, err)
	want := fetchable(rec)
	require.Equal(t, 4, st.Fetch(ctx, want))
	for i := range 3 {
		require.Equal(t, first.Pages[i], want[i].Data, "the first transfer's bytes")
	}
	require.Equal(t, second.Pages[3], want[3].Data)
	require.Equal(t, AdmitStats{Admissions: 3, AlreadyHeld: 1, FreshPages: 4, SamePages: 3, HeldPages: 3}, st.AdmitStats())
	eventually(t, func() bool { return srv.Stats().Open == 0 }, "connections closed")
	require.EqualValues(t, 1, srv.Stats().AlreadyHeld)
	require.EqualValues(t, 2, srv.Stats().Admitted)
	require.NoError(t, st.CheckInvariants())
}

// Finding 2: silent connections past MaxConns are answered busy and
// closed at once; those served hold no read buffer before they send, and
// are closed at the idle deadline.
func TestSilentConnections(t *testing.T) {
	cfg := testConfig()
	st := newStore(t, cfg, 4)
	const maxConns, dial = 8, 40
	srv, addr := serve(t, st, ServerConfig{MaxConns: maxConns, IdleTimeout: 300 * time.Millisecond})
	var conns []net.Conn
	grew := heaptest.Growth(func() {
		for range dial {
			c, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			conns = append(conns, c)
		}
		eventually(t, func() bool { return srv.Stats().Accepted == dial }, "all accepted")
	})
	s := srv.Stats()
	require.EqualValues(t, maxConns, s.Open)
	require.EqualValues(t, dial-maxConns, s.RefusedConns)
	require.Less(t, grew, uint64(2<<20), "40 silent connections (the old server: a 1 MiB buffer each)")
	busy := 0
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, _ := io.ReadAll(c) // the busy ones: the refusal; the others: nothing, closed at the deadline
		if len(b) > 0 {
			require.Contains(t, string(b), "connections open (MaxConns)")
			busy++
		}
		c.Close()
	}
	require.Equal(t, dial-maxConns, busy)
	eventually(t, func() bool { return srv.Stats().Open == 0 }, "closed at the idle deadline")
	require.EqualValues(t, maxConns, srv.Stats().TimedOut)

	// A sender that keeps writing, slowly, is cut at the request deadline.
	srv, addr = serve(t, st, ServerConfig{IdleTimeout: time.Second, RequestTimeout: 200 * time.Millisecond})
	c, br, _ := dialRaw(t, addr)
	start := time.Now()
	for time.Since(start) < 2*time.Second {
		if _, err := c.Write([]byte{0}); err != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.Less(t, time.Since(start), 2*time.Second)
	io.ReadAll(br)
	eventually(t, func() bool { return srv.Stats().Open == 0 }, "closed")
	require.EqualValues(t, 1, srv.Stats().TimedOut)
}

// Finding 2: heads declaring huge requests hold nothing unless they
// verify, and those that verify reserve their share of MaxInflightBytes
// (refused busy past it) and release it when their connection ends.
func TestInflightBytesBounded(t *testing.T) {
	cfg := testConfig()
	require.NoError(t, cfg.check())
	st := newStore(t, cfg, DefaultMaxPages)
	ns := [3]uint16{4, 3, 0}
	full := &head{lens: [4]int{4, 3, 0, 0}, tokens: DefaultMaxPages * 4, runs: DefaultMaxPages, npages: DefaultMaxPages}
	mem := full.memory(&cfg)
	srv, addr := serve(t, st, ServerConfig{MaxInflightBytes: mem + 100<<10, IdleTimeout: 300 * time.Millisecond})

	grew := heaptest.Growth(func() {
		// Four strangers' heads at the limits: refused at their tags.
		stranger := testConfig()
		stranger.Key = []byte("a stranger's key, 32 bytes long!")
		for range 4 {
			c, br, nonce := dialRaw(t, addr)
			_, err := c.Write(signedStream(stranger, nonce, DefaultMaxPages*4, DefaultMaxPages, DefaultMaxPages, ns, nil)[preludeBytes:])
			require.NoError(t, err)
			var h [3]byte
			_, err = io.ReadFull(br, h[:])
			require.NoError(t, err)
			require.EqualValues(t, ackRefused, h[0])
		}
		// A key holder's: reserved, nothing allocated for it yet.
		c, _, nonce := dialRaw(t, addr)
		_, err := c.Write(signedStream(cfg, nonce, DefaultMaxPages*4, DefaultMaxPages, DefaultMaxPages, ns, nil)[preludeBytes:])
		require.NoError(t, err)
		eventually(t, func() bool { return srv.Stats().BytesInFlight == mem }, "reserved")
		// A second one does not fit: refused busy.
		c, br, nonce := dialRaw(t, addr)
		_, err = c.Write(signedStream(cfg, nonce, DefaultMaxPages*4, DefaultMaxPages, DefaultMaxPages, ns, nil)[preludeBytes:])
		require.NoError(t, err)
		status, msg := rawReply(t, br, cfg, nonce, replyVerdict)
		require.EqualValues(t, ackBusy, status)
		require.Contains(t, msg, "MaxInflightBytes")
		err = Send(testCtx(t), addr, cfg, testRequest(15, 200, seq(200)))
		require.ErrorIs(t, err, ErrBusy)
		require.ErrorIs(t, err, ErrRefused)
	})
	require.Less(t, grew, uint64(4<<20), "%d bytes reserved; the busy Send's own request and buffers", mem)
	// A small request still fits next to the reservation.
	require.NoError(t, Send(testCtx(t), addr, cfg, testRequest(16, 2, []int32{0, 1})))
	eventually(t, func() bool { s := srv.Stats(); return s.Open == 0 && s.BytesInFlight == 0 }, "released at the idle deadline")
	s := srv.Stats()
	require.EqualValues(t, 4, s.AuthFailures)
	require.EqualValues(t, 2, s.RefusedBusy)
	require.EqualValues(t, 1, s.TimedOut)
	require.EqualValues(t, 1, s.Admitted)
}

// A stream of version 1 is refused by name, in version 1's format (what a
// version 1 sender reads).
func TestOldVersionRefusedByName(t *testing.T) {
	cfg := testConfig()
	st := newStore(t, cfg, 4)
	srv, addr := serve(t, st, ServerConfig{})
	v1 := append([]byte("PKVH\x01\x00\x00\x00\x04\x00acme"), make([]byte, 64)...)
	_, err := ReadRequest(bytes.NewReader(v1), cfg, testNonce)
	require.ErrorContains(t, err, "stream version 1: this receiver reads version 3 only")
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write(v1)
	require.NoError(t, err)
	require.NoError(t, c.(*net.TCPConn).CloseWrite())
	b, err := io.ReadAll(c)
	require.NoError(t, err)
	require.EqualValues(t, ackRefused, b[0])
	require.EqualValues(t, len(b)-3, binary.LittleEndian.Uint16(b[1:]))
	require.Contains(t, string(b[3:]), "stream version 1: this receiver reads version 3 only")
	eventually(t, func() bool { return srv.Stats().BadStreams == 1 }, "counted")

	// A version 2 sender at a version 1 receiver (which answers a version
	// 2 prelude with a version 1 refusal) hears it as a refusal.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var p [preludeBytes]byte
		io.ReadFull(c, p[:])
		c.Write(appendRefusal(nil, `handoff: bad stream: magic "PKVH" version 2 (want "PKVH" version 1)`))
	}()
	err = Send(testCtx(t), ln.Addr().String(), cfg, testRequest(17, 1, []int32{0}))
	require.ErrorIs(t, err, ErrRefused)
	require.ErrorContains(t, err, "version 2 (want")
}

func TestListenLoopbackOnly(t *testing.T) {
	cfg := testConfig()
	st := newStore(t, cfg, 4)
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0", "example.com:0", "10.1.2.3:7000"} {
		_, err := Listen(st, ServerConfig{Addr: addr})
		require.ErrorIs(t, err, ErrBadConfig, addr)
		require.ErrorContains(t, err, "AllowRemote", addr)
	}
	for _, addr := range []string{"", "127.0.0.1:0", "localhost:0"} {
		s, err := Listen(st, ServerConfig{Addr: addr})
		require.NoError(t, err, addr)
		require.True(t, s.Addr().(*net.TCPAddr).IP.IsLoopback())
		s.Close()
	}
	s, err := Listen(st, ServerConfig{Addr: "0.0.0.0:0", AllowRemote: true})
	require.NoError(t, err)
	s.Close()
	// Serve checks the listener it is given.
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	require.NoError(t, err)
	defer ln.Close()
	s, err = NewServer(st, ServerConfig{})
	require.NoError(t, err)
	require.ErrorContains(t, s.Serve(ln), "not a loopback address")
}

func TestServerConfigChecked(t *testing.T) {
	cfg := testConfig()
	st := newStore(t, cfg, 4)
	for _, c := range []struct {
		sc   ServerConfig
		want string
	}{
		{ServerConfig{MaxConns: -1}, "MaxConns -1"},
		{ServerConfig{IdleTimeout: -time.Second}, "want >= 0"},
		{ServerConfig{ReadBuffer: 1 << 30}, "ReadBuffer 1073741824: at most 1048576"},
		{ServerConfig{MaxInflightBytes: 1 << 20}, "MaxInflightBytes 1048576 cannot hold one request of Limits.MaxPages 65536"},
	} {
		_, err := NewServer(st, c.sc)
		require.ErrorIs(t, err, ErrBadConfig)
		require.ErrorContains(t, err, c.want)
	}
	// 0 is the default, never "no limit".
	s, err := NewServer(st, ServerConfig{})
	require.NoError(t, err)
	require.Equal(t, ServerConfig{Addr: DefaultAddr, MaxConns: DefaultMaxConns, MaxInflightBytes: DefaultMaxInflightBytes,
		ReadBuffer: DefaultReadBuffer, IdleTimeout: DefaultIdleTimeout, RequestTimeout: DefaultRequestTimeout}, s.cfg)
}

// The sender is another process: the test binary re-executed, given the
// address and the key.
const (
	childAddr = "PAGEDKV_HANDOFF_SEND_TO"
	childKey  = "PAGEDKV_HANDOFF_KEY"
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(childAddr); addr != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cfg := testConfig()
		key, err := hex.DecodeString(os.Getenv(childKey))
		if err == nil {
			cfg.Key = key
			err = Send(ctx, addr, cfg, testRequest(42, 6, []int32{8, 9, 10, 30, 31, 2}))
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestSendBetweenProcesses(t *testing.T) {
	cfg := testConfig()
	key := NewNonce() // 32 random bytes: a key for this run
	cfg.Key = key[:]
	st := newStore(t, cfg, 16)
	got := make(chan *Received, 1)
	_, addr := serve(t, st, ServerConfig{RequestTimeout: 20 * time.Second, Admitted: func(_ Admission, r *Received) { got <- r }})
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^$")
	// GORACE: a race-enabled child would otherwise sleep 1 s at a clean exit.
	cmd.Env = append(os.Environ(), childAddr+"="+addr, childKey+"="+hex.EncodeToString(cfg.Key), "GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	r := <-got
	want := testRequest(42, 6, []int32{8, 9, 10, 30, 31, 2})
	require.Equal(t, want.Tokens, r.Tokens)
	require.Equal(t, []Run{{8, 3}, {30, 2}, {2, 1}}, r.Runs)
	for i := range want.Pages {
		require.Equal(t, want.Pages[i], r.Pages[i].Data)
	}
	t.Logf("6 pages in %d runs, %d page bytes, %d stream bytes", len(r.Runs), r.Bytes(), cfg.StreamBytes(want))

	// The same child with another key: refused, nothing more admitted.
	cmd = exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childAddr+"="+addr, childKey+"="+hex.EncodeToString(testKey))
	out, err = cmd.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "authentication failed")
	require.Equal(t, 6, st.Held())
}

// The limits docs/handoff.md publishes are the code's.
func TestDocLimits(t *testing.T) {
	doclimits.Check(t, "docs/handoff.md", map[string]any{
		"handoff.StreamVersion":           StreamVersion,
		"handoff.MinKeyBytes":             MinKeyBytes,
		"handoff.NonceBytes":              NonceBytes,
		"handoff.TagBytes":                TagBytes,
		"handoff.MaxString":               MaxString,
		"handoff.MaxReply":                MaxReply,
		"handoff.DefaultMaxPages":         DefaultMaxPages,
		"handoff.DefaultMaxBytes":         DefaultMaxBytes,
		"handoff.DefaultAddr":             DefaultAddr,
		"handoff.DefaultMaxConns":         DefaultMaxConns,
		"handoff.DefaultMaxInflightBytes": DefaultMaxInflightBytes,
		"handoff.DefaultReadBuffer":       DefaultReadBuffer,
		"handoff.MaxReadBuffer":           MaxReadBuffer,
		"handoff.DefaultIdleTimeout":      DefaultIdleTimeout,
		"handoff.DefaultRequestTimeout":   DefaultRequestTimeout,
		"handoff.DrainTimeout":            DrainTimeout,
		"handoff.DefaultSendTimeout":      DefaultSendTimeout,
	})
}

// A request's retention ranges travel in the header (under tag 2): the
// receiver returns them checked, each page carries the retention they
// give it, and the store serves it with the page. A request without
// ranges has no range bytes (the head's u16 at offset 20 stays 0).
func TestRetentionTravels(t *testing.T) {
	cfg := testConfig()
	r := testRequest(1, 3, []int32{10, 11, 12})
	plain := encode(t, cfg, testNonce, r)
	require.Zero(t, binary.LittleEndian.Uint16(plain[preludeBytes+20:]))
	r.Retention = []RetentionRange{
		{Start: 0, End: 0, Priority: 1},
		{Start: 4, End: 8, Priority: 3, Duration: time.Minute, Session: 2},
		{Start: 9, Ephemeral: true},
	}
	b := encode(t, cfg, testNonce, r)
	require.Equal(t, len(plain)+3*retentionRangeBytes, len(b))
	got, err := ReadRequest(bytes.NewReader(b), cfg, testNonce)
	require.NoError(t, err)
	require.Equal(t, r.Retention, got.Retention)
	want := []tier.Retention{
		{Priority: 1},
		{Priority: 3, Hint: 2, Duration: time.Minute, Left: time.Minute},
		{Priority: 0}, // the ephemeral range is the last to cover page 2 (tokens 8..11): level 0
	}
	for i, p := range got.Pages {
		require.Equal(t, want[i], p.Retention, "page %d", i)
	}
	st, err := NewStore(cfg, 8)
	require.NoError(t, err)
	_, err = st.Admit(got)
	require.NoError(t, err)
	pages := fetchable(got)
	require.Equal(t, 3, st.Fetch(context.Background(), pages))
	for i, p := range pages {
		require.Equal(t, want[i], p.Retention, "served page %d", i)
	}
}

// Bad ranges are refused by name, by the writer and (from a key holder
// that skips the writer's check) by the reader.
func TestBadRetentionRefused(t *testing.T) {
	cfg := testConfig()
	for _, c := range []struct {
		x    RetentionRange
		want string
	}{
		{RetentionRange{Priority: 16}, "retention range 0 has priority 16, want 0..15"},
		{RetentionRange{Duration: -time.Second}, "retention range 0 lasts -1s"},
		{RetentionRange{Duration: 400 * 24 * time.Hour}, "retention range 0 lasts 9600h0m0s"},
		{RetentionRange{Session: 3}, "retention range 0 has session 3"},
		{RetentionRange{Start: 8, End: 4}, "retention range 0 is tokens [8, 4)"},
	} {
		r := testRequest(6, 2, []int32{3, 4})
		r.Retention = []RetentionRange{c.x}
		_, err := ReadRequest(bytes.NewReader(rawStream(cfg, testNonce, r)), cfg, testNonce)
		require.ErrorIs(t, err, ErrBadStream, "%+v", c.x)
		require.ErrorContains(t, err, c.want)
		require.ErrorContains(t, WriteRequest(io.Discard, cfg, testNonce, r), c.want)
	}
	// Too many ranges: refused from the head, before any is read.
	r := testRequest(6, 2, []int32{3, 4})
	r.Retention = make([]RetentionRange, MaxRetentionRanges+1)
	_, err := ReadRequest(bytes.NewReader(rawStream(cfg, testNonce, r)), cfg, testNonce)
	require.ErrorContains(t, err, "65 retention ranges: at most 64")
	require.ErrorContains(t, WriteRequest(io.Discard, cfg, testNonce, r), "65 retention ranges")
	// An ephemeral byte other than 0 or 1, reserved bytes not zero.
	r.Retention = []RetentionRange{{Priority: 1}}
	b := rawStream(cfg, testNonce, r)
	hdr := preludeBytes + headBytes + TagBytes + len(r.Tenant) + len(r.LoRA) + len(r.Salt) + 4*len(r.Tokens) + 8*len(r.Runs)
	for _, c := range []struct {
		at   int
		want string
	}{{10, "ephemeral byte 2"}, {12, "reserved bytes"}} {
		raw := unsign(b)
		raw[hdr-TagBytes+c.at] = 2
		_, err := ReadRequest(bytes.NewReader(signFuzz(cfg, raw)), cfg, testNonce)
		require.ErrorIs(t, err, ErrBadStream)
		require.ErrorContains(t, err, c.want)
	}
}
