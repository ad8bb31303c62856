package replay

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/redistest"
	"github.com/pagedkv/pagedkv/tier/redis"
)

// A real redis-server below a small pool and host tier: requests served by
// neither come back from Redis, every published page is written to it,
// and the three tiers together stay under Belady over their room.
func TestRedisTier(t *testing.T) {
	tr := prefix(conversation(t), 1500)
	if raceEnabled {
		tr = prefix(tr, 400)
	}
	const pageTokens = 16
	pool := max(tr.DistinctBlocks/50, tr.MinPoolPages())
	host := tr.DistinctBlocks / 50
	srv := redistest.Start(t)
	store, err := redis.New(redis.Config{Addr: srv.Addr(), Namespace: "replay-test", Format: RemoteFormat(pageTokens)})
	require.NoError(t, err)
	defer store.Close()
	flush := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return store.Flush(ctx)
	}
	hostOnly, err := Run(tr, Config{CapacityPages: pool, HostPages: host, PageTokens: pageTokens})
	require.NoError(t, err)
	res, err := Run(tr, Config{CapacityPages: pool, HostPages: host, PageTokens: pageTokens, Remote: store, Flush: flush})
	require.NoError(t, err)
	require.Positive(t, res.RemoteHitBlocks)
	require.Greater(t, res.HitBlocks, hostOnly.HitBlocks)
	require.Positive(t, res.RemoteStored)
	require.GreaterOrEqual(t, res.RemoteFetched, res.RemoteHitBlocks)
	s := store.Stats()
	require.Zero(t, s.Errors+s.Rejected+s.Dropped, "store errors, rejected values or dropped writes: %+v", s)

	_, err = Run(tr, Config{CapacityPages: pool, PageTokens: pageTokens, Remote: store})
	require.ErrorContains(t, err, "needs a host tier")
}
