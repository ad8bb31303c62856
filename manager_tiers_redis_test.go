package pagedkv

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/redistest"
	"github.com/pagedkv/pagedkv/tier"
	"github.com/pagedkv/pagedkv/tier/redis"
)

// These tests run Managers over a real redis-server (internal/redistest):
// two replicas sharing prefixes, bad values recomputed, the server killed
// or paused under a workload.

func newRedisStore(t testing.TB, srv *redistest.Server) *redis.Store {
	t.Helper()
	// Generous write and dial timeouts: under -race on a loaded machine a
	// batch may be slow, and only the tests that break the server expect
	// errors.
	s, err := redis.New(redis.Config{Addr: srv.Addr(), Namespace: "test-model", Format: tierFormat(4),
		DialTimeout: time.Second, WriteTimeout: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func flushStore(t testing.TB, s *redis.Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, s.Flush(ctx))
}

// replica is one Manager with its own engine and its own client of the
// shared store.
// writeThrough has e compute prompt as request 1 in one chunk and
// complete its copies, and waits until s has written them to Redis.
func writeThrough(t testing.TB, e *tierEngine, s *redis.Store, prompt []int32) {
	t.Helper()
	_, err := e.add(1, Request{Prompt: prompt})
	require.NoError(t, err)
	e.prefill(len(prompt), 1)
	e.complete(nil)
	flushStore(t, s)
}

func replica(t testing.TB, srv *redistest.Server, deadline time.Duration) (*Manager, *tierEngine, *redis.Store) {
	s := newRedisStore(t, srv)
	m, e := newTierManager(t, 16, 16, TierConfig{Remote: s, RemoteDeadline: deadline})
	return m, e, s
}

// One replica computes a prefix, the other is served it from Redis,
// bit for bit.
func TestTwoManagersShareAPrefixThroughRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a, ea, sa := replica(t, srv, 5*time.Second)
	b, eb, sb := replica(t, srv, 5*time.Second)
	prompt := seqTokens(7, 21) // 5 full pages + 1 token
	ns := Namespace{Tenant: "acme"}

	n, err := ea.add(1, Request{Namespace: ns, Prompt: prompt})
	require.NoError(t, err)
	require.Zero(t, n)
	ea.prefill(8, 1)
	ea.complete(nil) // write-through: the published pages go to host, then to Redis
	flushStore(t, sa)
	require.EqualValues(t, 5, sa.Stats().Stored)

	n, err = eb.add(1, Request{Namespace: ns, Prompt: prompt})
	require.NoError(t, err)
	require.Equal(t, 20, n, "every full page from Redis")
	require.True(t, b.Loading(1))
	eb.complete(nil)
	eb.check("replica b after onload")
	st := b.Stats()
	require.EqualValues(t, 20, st.Tiers.RemoteHitTokens)
	require.EqualValues(t, 5, st.Tiers.RemoteFetched)
	require.EqualValues(t, 5, sb.Stats().Hits)
	eb.prefill(8, 1)
	eb.check("replica b after its prefill")

	// Another namespace shares nothing.
	n, err = eb.add(2, Request{Namespace: Namespace{Tenant: "other"}, Prompt: prompt})
	require.NoError(t, err)
	require.Zero(t, n)
	require.NoError(t, a.Audit())
	require.NoError(t, b.Audit())
	ea.drain()
	eb.drain()
}

// A damaged or foreign value in the middle of a prefix ends the hit there:
// the rest is recomputed, nothing wrong is served.
func TestBadRemoteValuesAreRecomputed(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	_, ea, sa := replica(t, srv, 5*time.Second)
	prompt := seqTokens(40, 21)
	writeThrough(t, ea, sa, prompt)

	d := tier.NamespaceRoot("", "", "")
	var pages []tier.RemotePage
	for i := range 5 {
		nd := tier.Next(nil, d, prompt[4*i:4*i+4])
		pages = append(pages, tier.RemotePage{Digest: nd, Parent: d, Tokens: prompt[4*i : 4*i+4]})
		d = nd
	}
	ctx := context.Background()
	key := sa.Key(&pages[2])
	val, err := sa.Client().Get(ctx, key).Bytes()
	require.NoError(t, err)
	// Another deployment's value for the same page, under this key.
	foreign, err := redis.Encode(nil, tierFormat(4), "other-model", redis.DefaultGroup,
		&tier.RemotePage{Digest: pages[2].Digest, Parent: pages[2].Parent, Tokens: pages[2].Tokens, Data: make([]byte, tierFormat(4).PageBytes())})
	require.NoError(t, err)
	flipped := append([]byte(nil), val...)
	flipped[60] ^= 1
	for name, bad := range map[string][]byte{"truncated": val[:len(val)-1], "corrupted": flipped, "foreign": foreign} {
		require.NoError(t, sa.Client().Set(ctx, key, bad, 0).Err())
		b, eb, sb := replica(t, srv, 5*time.Second) // a fresh replica: empty host tier
		n, err := eb.add(1, Request{Prompt: prompt})
		require.NoError(t, err)
		require.Equal(t, 8, n, "%s: pages 0 and 1 served, page 2 rejected", name)
		require.EqualValues(t, 1, sb.Stats().Rejected, name)
		eb.complete(nil)
		eb.check(name + ": after a rejected value")
		eb.prefill(21, 1)
		eb.check(name + ": after recomputing")
		require.NoError(t, b.Audit())
		eb.drain()
		flushStore(t, sb) // b wrote the recomputed page back
	}
}

// A paused server: Add returns by the deadline, serving nothing remote,
// and counts the timeout.
func TestRemoteDeadlineHoldsInAdd(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	_, ea, sa := replica(t, srv, 5*time.Second)
	b, eb, sb := replica(t, srv, 30*time.Millisecond)
	prompt := seqTokens(90, 13)
	writeThrough(t, ea, sa, prompt)
	// Warm b's connection with a lookup that misses.
	_, err := eb.add(9, Request{Prompt: seqTokens(500, 9)})
	require.NoError(t, err)

	r, err := srv.Do("CLIENT", "PAUSE", "3000", "ALL")
	require.NoError(t, err)
	require.Equal(t, "+OK", r)
	start := time.Now()
	n, err := eb.add(1, Request{Prompt: prompt})
	took := time.Since(start)
	require.NoError(t, err)
	require.Zero(t, n)
	// The deadline is 30 ms and the pause 3 s: returning well before the
	// pause ends shows the deadline ended the lookup.
	require.Less(t, took, 2*time.Second, "Add waited for the paused server")
	require.Positive(t, sb.Stats().Timeouts)
	require.NoError(t, b.Audit())
	eb.prefill(13, 1)
	eb.check("computed instead")
	ea.drain()
	eb.drain()
}

// The randomized workload with both tiers on a real server, twice: the
// second Manager (a replica) is served what the first stored. Then again
// with the server killed half way: the Manager goes on, serves nothing
// wrong, and the error counters show it.
func TestTiersMatchModelWithRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	var remoteHits int64
	for seed := range uint64(4) {
		s := newRedisStore(t, srv)
		m := runTierModel(t, tierModelConfig{seed: seed, ops: 800, numPages: 16, hostPages: 8 + int(seed)*4,
			ahead: int(seed % 3), remote: s, deadline: 5 * time.Second, events: seed%2 == 1})
		remoteHits += m.Stats().Tiers.RemoteHitTokens
		flushStore(t, s)
		rs := s.Stats()
		require.Zero(t, rs.Rejected, "%+v", rs)
		if rs.Errors > 0 { // a write batch past its timeout on a loaded machine: no wrong page, only a lost one
			t.Logf("seed %d: %d remote errors: %+v", seed, rs.Errors, rs)
		}
	}
	require.Positive(t, remoteHits, "no page was ever served from Redis")

	s := newRedisStore(t, srv)
	m := runTierModel(t, tierModelConfig{seed: 99, ops: 800, numPages: 16, hostPages: 12, ahead: 1, remote: s, deadline: time.Second,
		hook: func(op int) {
			if op == 400 {
				srv.Kill()
			}
		}})
	rs := m.Stats().Tiers.Remote
	require.Positive(t, rs.Errors, "the killed server left no trace in the counters: %+v", rs)
	require.Zero(t, rs.Rejected)
}
