package pagedkv

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/redistest"
	"github.com/pagedkv/pagedkv/tier"
	"github.com/pagedkv/pagedkv/tier/disk"
)

// These tests run Managers over the disk tier (tier/disk) as their store
// below the host tier, alone and chained above Redis.

func openDiskStore(t testing.TB, dir string, pages int) *disk.Store {
	t.Helper()
	s, err := disk.Open(disk.Config{Dir: dir, Namespace: "test-model", Format: tierFormat(4), Pages: pages, SegmentPages: 16})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func closeDiskStore(t testing.TB, s *disk.Store) {
	t.Helper()
	require.NoError(t, s.CheckInvariants())
	require.NoError(t, s.Close())
}

// A Manager computes a prefix and exits; a new Manager (a restarted
// process) on the same directory is served the prefix from disk, bit for
// bit.
func TestPrefixSurvivesRestartOnDisk(t *testing.T) {
	dir := t.TempDir()
	sa := openDiskStore(t, dir, 64)
	a, ea := newTierManager(t, 16, 16, TierConfig{Remote: sa})
	prompt := seqTokens(7, 21) // 5 full pages + 1 token
	n, err := ea.add(1, Request{Prompt: prompt})
	require.NoError(t, err)
	require.Zero(t, n)
	ea.prefill(8, 1)
	ea.complete(nil) // write-through: published pages go to host, then to disk
	ea.drain()
	require.NoError(t, a.Audit())
	closeDiskStore(t, sa)

	sb := openDiskStore(t, dir, 64)
	require.Equal(t, 5, sb.Recovery().Recovered)
	b, eb := newTierManager(t, 16, 16, TierConfig{Remote: sb, RemoteDeadline: 5 * time.Second})
	n, err = eb.add(1, Request{Prompt: prompt})
	require.NoError(t, err)
	require.Equal(t, 20, n, "every full page from disk")
	eb.complete(nil)
	eb.check("after onload from disk")
	require.EqualValues(t, 20, b.Stats().Tiers.RemoteHitTokens)
	require.EqualValues(t, 5, sb.Stats().Hits)
	eb.prefill(8, 1)
	eb.check("after prefill")
	require.NoError(t, b.Audit())
	eb.drain()
}

// The randomized tier workload over the disk tier: each seed's Manager
// starts on the directory the last one left (a restart), so later seeds
// are served pages the earlier ones wrote; every page attention reads is
// checked.
func TestTiersMatchModelWithDisk(t *testing.T) {
	dir := t.TempDir()
	var diskHits int64
	for seed := range uint64(4) {
		s := openDiskStore(t, dir, 24)
		m := runTierModel(t, tierModelConfig{seed: seed, ops: 600, numPages: 16, hostPages: 8 + int(seed)*4,
			ahead: int(seed % 3), remote: s, deadline: 5 * time.Second})
		diskHits += m.Stats().Tiers.RemoteHitTokens
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		require.NoError(t, s.Flush(ctx, false))
		cancel()
		st := s.DiskStats()
		require.Zero(t, st.Remote.Rejected+st.Remote.Errors, "%+v", st)
		closeDiskStore(t, s)
	}
	require.Positive(t, diskHits, "no page was ever served from disk")
}

// The store chain host → disk → Redis (tier.Chain): the randomized
// workload, twice on one server, with a disk too small to hold the
// working set, so hits come from both levels.
func TestTiersMatchModelWithDiskOverRedis(t *testing.T) {
	srv := redistest.Start(t)
	d := openDiskStore(t, t.TempDir(), 8) // small: most hits come from Redis
	r := newRedisStore(t, srv)
	for seed := range uint64(2) {
		m := runTierModel(t, tierModelConfig{seed: 10 + seed, ops: 600, numPages: 16, hostPages: 8, ahead: 1,
			remote: tier.Chain(d, r), deadline: 5 * time.Second})
		flushStore(t, r)
		t.Logf("chain seed %d: %d remote hit tokens, disk %+v, redis %+v", seed, m.Stats().Tiers.RemoteHitTokens, d.Stats(), r.Stats())
	}
	require.Zero(t, d.Stats().Rejected+r.Stats().Rejected)
	require.NoError(t, d.CheckInvariants())
}
