package handoff

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/tier"
)

var testFormat = tier.PageFormat{Layout: layout.HND, DType: layout.BF16, PageSize: 4, NumKVHeads: 2, HeadDim: 8, Layers: 2}

func testConfig() Config { return Config{Namespace: "model-a", Format: testFormat} }

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

func TestPlan(t *testing.T) {
	for _, c := range []struct {
		pages []int32
		runs  []Run
	}{
		{nil, nil},
		{[]int32{7}, []Run{{7, 1}}},
		{[]int32{3, 4, 5, 6}, []Run{{3, 4}}},
		{[]int32{3, 4, 9, 10, 11, 2}, []Run{{3, 2}, {9, 3}, {2, 1}}},
		{[]int32{5, 4, 3}, []Run{{5, 1}, {4, 1}, {3, 1}}}, // descending is not contiguous in token order
	} {
		require.Equal(t, c.runs, Plan(nil, c.pages), "%v", c.pages)
	}
}

func encode(t testing.TB, cfg Config, r *Request) []byte {
	var b bytes.Buffer
	require.NoError(t, WriteRequest(&b, cfg, r))
	require.EqualValues(t, cfg.StreamBytes(r), b.Len())
	return b.Bytes()
}

func TestRoundTripAndAdmit(t *testing.T) {
	cfg := testConfig()
	r := testRequest(1, 5, []int32{10, 11, 12, 40, 41})
	got, err := ReadRequest(bytes.NewReader(encode(t, cfg, r)), cfg)
	require.NoError(t, err)
	require.Equal(t, r.Tokens, got.Tokens)
	require.Equal(t, []Run{{10, 3}, {40, 2}}, got.Runs)
	require.Len(t, got.Pages, 5)
	parent := tier.NamespaceRoot("acme", "sql", "")
	for i, p := range got.Pages {
		require.Equal(t, r.Pages[i], p.Data)
		require.Equal(t, parent, p.Parent)
		require.Equal(t, tier.Next(nil, parent, r.Tokens[4*i:4*i+4]), p.Digest)
		parent = p.Digest
	}

	st, err := NewStore(cfg, 8)
	require.NoError(t, err)
	id, err := st.Admit(got)
	require.NoError(t, err)
	// A decode Manager's lookup: the chain, with fresh buffers.
	want := make([]tier.RemotePage, 5)
	for i := range want {
		want[i] = tier.RemotePage{Digest: got.Pages[i].Digest, Parent: got.Pages[i].Parent, Tokens: r.Tokens[4*i : 4*i+4], Data: make([]byte, testFormat.PageBytes())}
	}
	require.Equal(t, 5, st.Fetch(context.Background(), want))
	for i := range want {
		require.Equal(t, r.Pages[i], want[i].Data)
	}
	// Another request sharing nothing does not fit next to it: refused,
	// nothing admitted.
	other, err := ReadRequest(bytes.NewReader(encode(t, cfg, testRequest(2, 4, []int32{0, 1, 2, 3}))), cfg)
	require.NoError(t, err)
	_, err = st.Admit(other)
	require.ErrorIs(t, err, ErrFull)
	require.Equal(t, 5, st.Held())
	require.NoError(t, st.CheckInvariants())
	require.True(t, st.Forget(id))
	require.False(t, st.Forget(id))
	require.Zero(t, st.Held())
	require.Zero(t, st.Fetch(context.Background(), want[:1]))
	require.NoError(t, st.CheckInvariants())
}

// Every truncation and every single-byte change of a stream is refused:
// nothing is returned to admit.
func TestEveryByteIsChecked(t *testing.T) {
	cfg := testConfig()
	b := encode(t, cfg, testRequest(3, 3, []int32{1, 2, 3}))
	for n := range len(b) {
		_, err := ReadRequest(bytes.NewReader(b[:n]), cfg)
		require.ErrorIs(t, err, ErrBadStream, "truncated to %d of %d bytes", n, len(b))
	}
	for i := range b {
		bad := bytes.Clone(b)
		bad[i] ^= 0x10
		_, err := ReadRequest(bytes.NewReader(bad), cfg)
		require.ErrorIs(t, err, ErrBadStream, "byte %d of %d changed", i, len(b))
	}
}

func TestForeignAndOversizedStreams(t *testing.T) {
	cfg := testConfig()
	b := encode(t, cfg, testRequest(4, 3, []int32{1, 2, 3}))
	other := testConfig()
	other.Namespace = "model-b"
	_, err := ReadRequest(bytes.NewReader(b), other)
	require.ErrorIs(t, err, tier.ErrForeignValue)
	require.ErrorContains(t, err, `namespace "model-a"`)
	fmtOther := testConfig()
	fmtOther.Format.DType = layout.F16
	_, err = ReadRequest(bytes.NewReader(b), fmtOther)
	require.ErrorIs(t, err, ErrBadStream)

	small := testConfig()
	small.Limits.MaxPages = 2
	_, err = ReadRequest(bytes.NewReader(b), small)
	require.ErrorContains(t, err, "at most 8")
	small = testConfig()
	small.Limits.MaxBytes = int64(testFormat.PageBytes())
	_, err = ReadRequest(bytes.NewReader(b), small)
	require.ErrorContains(t, err, "exceed the limit")

	// A header claiming 2^32-1 tokens is refused before any allocation
	// (and long before its checksum is read).
	huge := bytes.Clone(b[:8+2+4+2+3+2]) // through the salt: "acme", "sql", ""
	huge = binary.LittleEndian.AppendUint32(huge, 0xffffffff)
	_, err = ReadRequest(bytes.NewReader(huge), cfg)
	require.ErrorContains(t, err, "4294967295 tokens")

	// The writer refuses an inconsistent request.
	r := testRequest(5, 2, []int32{1, 2})
	r.Tokens = r.Tokens[:5]
	require.Error(t, WriteRequest(&bytes.Buffer{}, cfg, r))
}

// serve starts a receiver on a loopback port.
func serve(t *testing.T, st *Store) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go Serve(ln, st, 10*time.Second, nil)
	return ln.Addr().String()
}

func TestSendOverLoopback(t *testing.T) {
	cfg := testConfig()
	st, err := NewStore(cfg, 6)
	require.NoError(t, err)
	addr := serve(t, st)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, Send(ctx, addr, cfg, testRequest(6, 4, []int32{4, 5, 6, 7})))
	require.Equal(t, 4, st.Held())

	// Refused (full): the sender hears why; nothing more is held.
	err = Send(ctx, addr, cfg, testRequest(7, 4, []int32{0, 1, 2, 3}))
	require.ErrorIs(t, err, ErrRefused)
	require.ErrorContains(t, err, "store full")
	require.Equal(t, 4, st.Held())

	// A transfer cut half way: the receiver admits nothing.
	b := encode(t, cfg, testRequest(8, 1, []int32{9}))
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	_, err = c.Write(b[:len(b)/2])
	require.NoError(t, err)
	require.NoError(t, c.(*net.TCPConn).CloseWrite())
	ack := make([]byte, 3)
	_, err = c.Read(ack)
	require.NoError(t, err)
	require.EqualValues(t, ackRefused, ack[0])
	c.Close()
	require.Equal(t, 4, st.Held())
	require.NoError(t, st.CheckInvariants())

	// Nobody listening: an error, so the sender keeps its request.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	ln.Close()
	require.Error(t, Send(ctx, dead, cfg, testRequest(9, 1, []int32{0})))
}

// The sender is another process: the test binary re-executed.
const childAddr = "PAGEDKV_HANDOFF_SEND_TO"

func TestMain(m *testing.M) {
	if addr := os.Getenv(childAddr); addr != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := Send(ctx, addr, testConfig(), testRequest(42, 6, []int32{8, 9, 10, 30, 31, 2})); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestSendBetweenProcesses(t *testing.T) {
	cfg := testConfig()
	st, err := NewStore(cfg, 16)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	got := make(chan *Received, 1)
	go Serve(ln, st, 20*time.Second, func(_ uint64, r *Received) { got <- r })
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childAddr+"="+ln.Addr().String())
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
}
