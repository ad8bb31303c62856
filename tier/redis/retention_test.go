package redis

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/redistest"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/tier"
)

// A page's retention rides in its value through a real server: a fetch
// gets what is left of it on the store's clock (level 0 once the deadline
// has passed), the key's TTL is Expiry plus what is left, a page without
// retention is written without the field, and an old reader's length
// check does not refuse the longer value.
func TestRetentionRidesInTheValue(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	now := time.Unix(1_800_000_000, 0)
	s := newStore(t, srv, Config{Expiry: time.Hour, Clock: func() time.Time { return now }})
	pages := chain(rand.New(rand.NewPCG(3, 4)), format(layout.F16, layout.NHD), "t", 3)
	pages[0].Retention = tier.Retention{Priority: 3, Hint: 1, Duration: time.Minute, Left: 50 * time.Second}
	pages[1].Retention = tier.Retention{Priority: 2} // no lapse
	for i := range pages {
		require.True(t, s.Store(&pages[i]))
	}
	flush(t, s)

	ctx := context.Background()
	ttl0, err := s.Client().PTTL(ctx, s.Key(&pages[0])).Result()
	require.NoError(t, err)
	require.InDelta(t, float64(time.Hour+50*time.Second), float64(ttl0), float64(5*time.Second), "TTL = Expiry + what is left")
	ttl2, err := s.Client().PTTL(ctx, s.Key(&pages[2])).Result()
	require.NoError(t, err)
	require.InDelta(t, float64(time.Hour), float64(ttl2), float64(5*time.Second))
	n, err := s.Client().StrLen(ctx, s.Key(&pages[2])).Result()
	require.NoError(t, err)
	require.EqualValues(t, s.valueLen, n, "no retention, no field")
	n, err = s.Client().StrLen(ctx, s.Key(&pages[0])).Result()
	require.NoError(t, err)
	require.EqualValues(t, s.valueLen+tier.RetentionFieldBytes, n)

	now = now.Add(20 * time.Second)
	got := asked(pages)
	require.Equal(t, 3, fetch(s, got))
	require.Equal(t, tier.Retention{Priority: 3, Hint: 1, Duration: time.Minute, Left: 30 * time.Second}, got[0].Retention)
	require.Equal(t, tier.Retention{Priority: 2}, got[1].Retention)
	require.Zero(t, got[2].Retention)
	require.Equal(t, pages[0].Data, got[0].Data)

	now = now.Add(30 * time.Second)
	got = asked(pages)
	require.Equal(t, 3, fetch(s, got))
	require.Equal(t, tier.Retention{Hint: 1}, got[0].Retention, "lapsed at the deadline")

	// Without Expiry no TTL is set, hinted or not.
	s2 := newStore(t, srv, Config{Namespace: "model-b", Clock: func() time.Time { return now }})
	pages[0].Retention = tier.Retention{Priority: 3, Duration: time.Minute, Left: time.Minute}
	require.True(t, s2.Store(&pages[0]))
	flush(t, s2)
	ttl, err := s2.Client().PTTL(ctx, s2.Key(&pages[0])).Result()
	require.NoError(t, err)
	require.Equal(t, time.Duration(-1), ttl, "no TTL")
	require.Zero(t, s.Stats().Rejected+s2.Stats().Rejected)
}
