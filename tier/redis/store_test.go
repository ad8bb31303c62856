package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/redistest"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/tier"
)

func format(dt layout.DType, kl layout.KVLayout) tier.PageFormat {
	return tier.PageFormat{Layout: kl, DType: dt, PageSize: 4, NumKVHeads: 2, HeadDim: 8, Layers: 3}
}

// chain returns n pages of a random prefix in format f with random bytes.
func chain(rng *rand.Rand, f tier.PageFormat, ns string, n int) []tier.RemotePage {
	d := tier.NamespaceRoot(ns, "", "")
	var first tier.Digest
	out := make([]tier.RemotePage, n)
	for i := range out {
		toks := make([]int32, f.PageSize)
		for j := range toks {
			toks[j] = int32(rng.IntN(1000))
		}
		nd := tier.Next(nil, d, toks)
		if i == 0 {
			first = nd
		}
		data := make([]byte, f.PageBytes())
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		out[i] = tier.RemotePage{Digest: nd, Parent: d, Chain: first, Tokens: toks, Data: data}
		d = nd
	}
	return out
}

// asked returns the lookup of pages: same identities, zeroed buffers.
func asked(pages []tier.RemotePage) []tier.RemotePage {
	out := make([]tier.RemotePage, len(pages))
	for i, p := range pages {
		out[i] = p
		out[i].Data = make([]byte, len(p.Data))
	}
	return out
}

func newStore(t testing.TB, srv *redistest.Server, cfg Config) *Store {
	t.Helper()
	cfg.Addr = srv.Addr()
	if cfg.Namespace == "" {
		cfg.Namespace = "model-a"
	}
	if cfg.Format.Layers == 0 {
		cfg.Format = format(layout.F16, layout.NHD)
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = 10 * time.Second // -race on a loaded machine: no spurious write errors
	}
	s, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func flush(t testing.TB, s *Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, s.Flush(ctx))
}

func fetch(s *Store, pages []tier.RemotePage) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return s.Fetch(ctx, pages)
}

// Every dtype and layout round-trips bit for bit through a real server,
// with keys grouped by chain or spread by page.
func TestRoundTripEveryFormat(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, dt := range []layout.DType{layout.F32, layout.F16, layout.BF16, layout.E4M3, layout.E5M2} {
		for _, kl := range []layout.KVLayout{layout.NHD, layout.HND} {
			for _, byChain := range []bool{false, true} {
				f := format(dt, kl)
				s := newStore(t, srv, Config{Format: f, TagByChain: byChain})
				pages := chain(rng, f, "t", 5)
				for i := range pages {
					require.True(t, s.Store(&pages[i]))
				}
				flush(t, s)
				got := asked(pages)
				require.Equal(t, 5, fetch(s, got), "%v %v", dt, kl)
				for i := range pages {
					require.Equal(t, pages[i].Data, got[i].Data, "%v %v page %d", dt, kl, i)
				}
				// A prefix that diverges after 3 pages gets 3.
				other := asked(pages)
				other[3].Tokens = append([]int32{-5}, other[3].Tokens[1:]...)
				other[3].Digest = tier.Next(nil, other[3].Parent, other[3].Tokens)
				require.Equal(t, 3, fetch(s, other))
				st := s.Stats()
				require.EqualValues(t, 5, st.Stored)
				require.EqualValues(t, 8, st.Hits)
				require.EqualValues(t, 1, st.Misses)
				require.Zero(t, st.Errors+st.Rejected)
			}
		}
	}
}

// Values that are damaged, cut short, of another deployment or of another
// page are rejected, counted, and never copied into the caller's buffer.
func TestBadValuesAreRejected(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rng := rand.New(rand.NewPCG(3, 4))
	f := format(layout.BF16, layout.HND)
	s := newStore(t, srv, Config{Format: f})
	pages := chain(rng, f, "", 2)
	good, err := Encode(nil, f, "model-a", DefaultGroup, &pages[0])
	require.NoError(t, err)
	set := func(key string, val []byte) {
		require.NoError(t, s.Client().Set(context.Background(), key, val, 0).Err())
	}
	foreign, _ := Encode(nil, f, "model-b", DefaultGroup, &pages[0])
	otherGroup, _ := Encode(nil, f, "model-a", "layers-0-15", &pages[0])
	otherFormat := f
	otherFormat.DType = layout.F16
	wrongFormat, _ := Encode(nil, otherFormat, "model-a", DefaultGroup, &pages[0])
	stale, _ := Encode(nil, f, "model-a", DefaultGroup, &pages[1]) // another page's value under this key
	flipped := append([]byte(nil), good...)
	flipped[len(flipped)/2] ^= 0x10
	for name, val := range map[string][]byte{
		"truncated":     good[:len(good)-9],
		"empty":         {},
		"bit flip":      flipped,
		"trailing":      append(append([]byte(nil), good...), 0),
		"foreign":       foreign,
		"other group":   otherGroup,
		"other format":  wrongFormat,
		"stale":         stale,
		"not a value":   []byte("hello"),
		"cut in header": good[:10],
	} {
		set(s.Key(&pages[0]), val)
		got := asked(pages[:1])
		before := s.Stats().Rejected
		require.Zero(t, fetch(s, got), name)
		require.Equal(t, before+1, s.Stats().Rejected, name)
		require.Equal(t, make([]byte, f.PageBytes()), got[0].Data, "%s: bytes copied from a rejected value", name)
	}
	set(s.Key(&pages[0]), good)
	require.Equal(t, 1, fetch(s, asked(pages[:1])))
}

// A killed server costs errors, not waits or wrong pages; a restarted one
// serves again.
func TestServerKilled(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rng := rand.New(rand.NewPCG(5, 6))
	f := format(layout.F32, layout.NHD)
	s := newStore(t, srv, Config{Format: f, DialTimeout: 200 * time.Millisecond})
	pages := chain(rng, f, "", 3)
	for i := range pages {
		s.Store(&pages[i])
	}
	flush(t, s)
	srv.Kill()
	start := time.Now()
	require.Zero(t, fetch(s, asked(pages)))
	require.Less(t, time.Since(start), 3*time.Second)
	require.Positive(t, s.Stats().Errors)
	for i := range pages {
		s.Store(&pages[i])
	}
	flush(t, s)
	require.Positive(t, s.Stats().Errors)
	srv.Restart()
	require.Zero(t, fetch(s, asked(pages)), "a fresh server is empty")
	for i := range pages {
		s.Store(&pages[i])
	}
	flush(t, s)
	require.Equal(t, 3, fetch(s, asked(pages)))
}

// A paused server: the lookup returns by its deadline with nothing and
// counts a timeout.
func TestDeadlineHolds(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rng := rand.New(rand.NewPCG(7, 8))
	f := format(layout.F16, layout.NHD)
	s := newStore(t, srv, Config{Format: f})
	pages := chain(rng, f, "", 4)
	for i := range pages {
		s.Store(&pages[i])
	}
	flush(t, s)
	require.Equal(t, 4, fetch(s, asked(pages)), "warm: the connection is open")
	r, err := srv.Do("CLIENT", "PAUSE", "3000", "ALL")
	require.NoError(t, err)
	require.Equal(t, "+OK", r)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	start := time.Now()
	n := s.Fetch(ctx, asked(pages))
	took := time.Since(start)
	cancel()
	require.Zero(t, n)
	// The deadline is 50 ms and the pause 3 s: returning well before the
	// pause ends shows the deadline, not the server, ended the lookup.
	require.Less(t, took, 2*time.Second)
	st := s.Stats()
	require.Positive(t, st.Timeouts)
	require.Positive(t, st.Errors)
	require.Equal(t, 4, fetch(s, asked(pages)), "served again once the pause ends")
}

// A full queue drops pages and counts them; nothing blocks.
func TestQueueBound(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rng := rand.New(rand.NewPCG(9, 10))
	f := format(layout.F16, layout.NHD)
	s := newStore(t, srv, Config{Format: f, QueueLen: 2})
	_, err := srv.Do("CLIENT", "PAUSE", "500", "WRITE")
	require.NoError(t, err)
	pages := chain(rng, f, "", 50)
	ok := 0
	for i := range pages {
		if s.Store(&pages[i]) {
			ok++
		}
	}
	require.Less(t, ok, 50)
	flush(t, s)
	st := s.Stats()
	require.EqualValues(t, 50-ok, st.Dropped)
	require.EqualValues(t, ok, st.Stored+st.Errors)
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	f := format(layout.F16, layout.NHD)
	for name, c := range map[string]Config{
		"no addr":      {Namespace: "a", Format: f},
		"no namespace": {Addr: "x:1", Format: f},
		"braces":       {Addr: "x:1", Namespace: "a{b}", Format: f},
		"bad format":   {Addr: "x:1", Namespace: "a"},
		"negative":     {Addr: "x:1", Namespace: "a", Format: f, QueueLen: -1},
		// Issue 28: geometry whose byte count wraps int64: 0 bytes with 16
		// layers was accepted; -2^63 with 3 panicked in makeslice.
		"format wraps to 0":    {Addr: "x:1", Namespace: "a", Format: tier.PageFormat{Layout: layout.NHD, DType: layout.F16, PageSize: 1, NumKVHeads: 1 << 30, HeadDim: 1 << 30, Layers: 16}},
		"format wraps below 0": {Addr: "x:1", Namespace: "a", Format: tier.PageFormat{Layout: layout.NHD, DType: layout.F16, PageSize: 2, NumKVHeads: 1 << 29, HeadDim: 1 << 30, Layers: 3}},
	} {
		var err error
		require.NotPanics(t, func() { _, err = New(c) }, name)
		require.True(t, errors.Is(err, ErrBadConfig), "%s: %v", name, err)
		if c.Format.HeadDim == 1<<30 {
			require.ErrorContains(t, err, fmt.Sprintf("layers %d", c.Format.Layers), name)
		}
	}
}
