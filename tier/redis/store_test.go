package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

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
				require.Equal(t, tier.Remote, tier.StoreMedium(s), "a Manager accounts the store's pages as remote reads")
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
// page are rejected, counted by reason, logged with their key, and never
// copied into the caller's buffer.
func TestBadValuesAreRejected(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rng := rand.New(rand.NewPCG(3, 4))
	f := format(layout.BF16, layout.HND)
	s := newStore(t, srv, Config{Format: f})
	pages := chain(rng, f, "", 2)
	key := s.Key(&pages[0])
	good, err := Encode(nil, f, "model-a", DefaultGroup, &pages[0])
	require.NoError(t, err)
	set := func(val []byte) {
		require.NoError(t, s.Client().Set(context.Background(), key, val, 0).Err())
	}
	foreign, _ := Encode(nil, f, "model-b", DefaultGroup, &pages[0])
	otherGroup, _ := Encode(nil, f, "model-a", "layers-0-15", &pages[0])
	sameLenGroup, _ := Encode(nil, f, "model-a", "one", &pages[0])
	otherFormat := f
	otherFormat.DType = layout.F16
	wrongFormat, _ := Encode(nil, otherFormat, "model-a", DefaultGroup, &pages[0])
	stale, _ := Encode(nil, f, "model-a", DefaultGroup, &pages[1]) // another page's value under this key
	flipped := append([]byte(nil), good...)
	flipped[len(flipped)/2] ^= 0x10
	for name, tc := range map[string]struct {
		val    []byte
		reason tier.RejectReason
		detail string
	}{
		"truncated":         {good[:len(good)-9], tier.RejectSize, fmt.Sprintf("value of %d bytes, want %d", len(good)-9, len(good))},
		"empty":             {[]byte{}, tier.RejectSize, fmt.Sprintf("value of 0 bytes, want %d", len(good))},
		"bit flip":          {flipped, tier.RejectCorrupt, "checksum"},
		"trailing":          {append(append([]byte(nil), good...), 0), tier.RejectSize, fmt.Sprintf("value of more than %d bytes", len(good))},
		"foreign":           {foreign, tier.RejectForeign, `namespace "model-b"`},
		"other group":       {otherGroup, tier.RejectSize, fmt.Sprintf("value of more than %d bytes", len(good))}, // a group name of another length
		"same-length group": {sameLenGroup, tier.RejectForeign, `group "one"`},
		"other format":      {wrongFormat, tier.RejectForeign, "format"},
		"stale":             {stale, tier.RejectStale, "digest"},
		"not a value":       {[]byte("hello"), tier.RejectSize, "value of 5 bytes"},
		"cut in header":     {good[:10], tier.RejectSize, "value of 10 bytes"},
	} {
		set(tc.val)
		got := asked(pages[:1])
		before := s.Stats()
		require.Zero(t, fetch(s, got), name)
		st := s.Stats()
		require.Equal(t, before.Rejected+1, st.Rejected, name)
		require.Equal(t, before.RejectedBy[tc.reason]+1, st.RejectedBy[tc.reason], name)
		require.Zero(t, st.Errors+st.Misses, name)
		require.Equal(t, key, st.Recent[0].Key, name)
		require.Equal(t, tc.reason, st.Recent[0].Reason, name)
		require.Contains(t, st.Recent[0].Detail, tc.detail, name)
		require.Equal(t, make([]byte, f.PageBytes()), got[0].Data, "%s: bytes copied from a rejected value", name)
	}
	// One key, five reasons: five entries; repeats bump their counts.
	st := s.Stats()
	require.EqualValues(t, 11, st.Rejected)
	require.Equal(t, [tier.NumRejectReasons]int64{tier.RejectCorrupt: 1, tier.RejectSize: 6, tier.RejectForeign: 3, tier.RejectStale: 1}, st.RejectedBy)
	entries := int64(0)
	for _, e := range st.Recent {
		entries += e.Count
	}
	require.EqualValues(t, 11, entries, "every rejection of the one key is in the log: %+v", st.Recent)
	set(good)
	require.Equal(t, 1, fetch(s, asked(pages[:1])))
}

// storedChain starts a server and a store of format f, and stores n
// pages of a random chain (seeded by seed) in it.
func storedChain(t *testing.T, seed uint64, f tier.PageFormat, n int) (*Store, []tier.RemotePage) {
	t.Helper()
	s := newStore(t, redistest.Start(t), Config{Format: f})
	pages := chain(rand.New(rand.NewPCG(28, seed)), f, "", n)
	for i := range pages {
		require.True(t, s.Store(&pages[i]))
	}
	flush(t, s)
	return s, pages
}

// A value of any length costs at most the page's value length to look up
// (issue 28: four 48 MiB values, made with SETRANGE, cost 192 MiB in one
// lookup): it is refused from its length, before its bytes are read.
// Not parallel: it measures the process's allocations.
func TestHugeValuesCostNothing(t *testing.T) {
	f := format(layout.F16, layout.NHD)
	s, pages := storedChain(t, 4, f, 4)
	require.Equal(t, 4, fetch(s, asked(pages)), "warm")
	const huge = 48 << 20
	for i := range pages {
		// The page's good value, followed by 48 MiB of zeros.
		require.NoError(t, s.Client().SetRange(context.Background(), s.Key(&pages[i]), huge-1, "\x00").Err())
	}
	before := s.Stats()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	n := fetch(s, asked(pages))
	runtime.ReadMemStats(&m1)
	require.Zero(t, n)
	t.Logf("a lookup of four %d-byte values allocated %d bytes", huge, m1.TotalAlloc-m0.TotalAlloc)
	require.Less(t, m1.TotalAlloc-m0.TotalAlloc, uint64(1<<20), "a lookup of four %d-byte values allocated %d bytes", huge, m1.TotalAlloc-m0.TotalAlloc)
	st := s.Stats()
	valueLen := EncodedLen(f, "model-a", DefaultGroup)
	require.LessOrEqual(t, st.BytesIn-before.BytesIn, int64(valueLen+tier.RetentionFieldBytes+1), "read at most one byte past a page's longest value")
	require.Equal(t, before.RejectedBy[tier.RejectSize]+1, st.RejectedBy[tier.RejectSize], "the first page ends the lookup")
	require.Contains(t, st.Recent[0].Detail, fmt.Sprintf("value of more than %d bytes", valueLen))
}

// A key of another Redis type (a list, a hash, a set) is a rejection of
// that page only: the leading pages are served (issue 28: the WRONGTYPE
// reply failed the whole pipeline, dropping them, and counted an error).
func TestWrongTypeRejectsOnlyThatPage(t *testing.T) {
	t.Parallel()
	f := format(layout.F32, layout.HND)
	s, pages := storedChain(t, 5, f, 4)
	ctx := context.Background()
	key := s.Key(&pages[2])
	for kind, write := range map[string]func() error{
		"list": func() error { return s.Client().RPush(ctx, key, "x").Err() },
		"hash": func() error { return s.Client().HSet(ctx, key, "f", "v").Err() },
		"set":  func() error { return s.Client().SAdd(ctx, key, "m").Err() },
		"zset": func() error { return s.Client().ZAdd(ctx, key, goredis.Z{Score: 1, Member: "m"}).Err() },
	} {
		require.NoError(t, s.Client().Del(ctx, key).Err())
		require.NoError(t, write(), kind)
		before := s.Stats()
		got := asked(pages)
		require.Equal(t, 2, fetch(s, got), kind)
		require.Equal(t, pages[1].Data, got[1].Data, kind)
		st := s.Stats()
		require.Equal(t, before.Errors, st.Errors, "%s: not an error", kind)
		require.Equal(t, before.RejectedBy[tier.RejectWrongType]+1, st.RejectedBy[tier.RejectWrongType], kind)
		require.Equal(t, tier.RemoteRejection{Key: key, Reason: tier.RejectWrongType, Count: st.Recent[0].Count,
			Detail: "the key holds a " + kind + ", not a string"}, st.Recent[0], kind)
	}
	require.EqualValues(t, 4, s.Stats().Recent[0].Count, "one key, one reason: one entry, counted")
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
		"queue past its bound":  {Addr: "x:1", Namespace: "a", Format: f, QueueLen: 1 << 62},
		"batch past its bound":  {Addr: "x:1", Namespace: "a", Format: f, Batch: 1 << 62},
		"queue buffers too big": {Addr: "x:1", Namespace: "a", Format: tier.PageFormat{Layout: layout.NHD, DType: layout.F32, PageSize: 16, NumKVHeads: 64, HeadDim: 256, Layers: 160}}, // 320 MiB pages x 256
		"format wraps to 0":     {Addr: "x:1", Namespace: "a", Format: tier.PageFormat{Layout: layout.NHD, DType: layout.F16, PageSize: 1, NumKVHeads: 1 << 30, HeadDim: 1 << 30, Layers: 16}},
		"format wraps below 0":  {Addr: "x:1", Namespace: "a", Format: tier.PageFormat{Layout: layout.NHD, DType: layout.F16, PageSize: 2, NumKVHeads: 1 << 29, HeadDim: 1 << 30, Layers: 3}},
	} {
		var err error
		require.NotPanics(t, func() { _, err = New(c) }, name)
		require.True(t, errors.Is(err, ErrBadConfig), "%s: %v", name, err)
		if c.Format.HeadDim == 1<<30 {
			require.ErrorContains(t, err, fmt.Sprintf("layers %d", c.Format.Layers), name)
		}
	}
}
