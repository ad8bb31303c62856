package prefixcache

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/evict"
)

// TestRetainLapsesAndOrdersEvictionUnderEveryPolicy: a page retained at a
// higher level outlives every lower-level page under each policy until its
// lapse passes (counted from when it became idle, restarted by a use),
// and then goes first as a level-0 page.
func TestRetainLapsesAndOrdersEvictionUnderEveryPolicy(t *testing.T) {
	for _, policy := range evict.Names() {
		t.Run(policy, func(t *testing.T) {
			f := newFixture(t, 8, func(c *Config) { c.Priorities = 3; c.Eviction = policy })
			keep := f.prefill(f.key, 0, 1, 2, 3, 4)
			other := f.prefill(f.key, 1, 9, 9, 9, 9)
			require.NoError(t, f.c.Retain(2, 10*time.Second, keep...))
			f.c.Advance(5 * time.Second)
			f.release(keep...) // idle at 5 s: lapses at 15 s
			f.release(other...)
			require.NoError(t, f.c.CheckInvariants())
			f.c.Advance(14 * time.Second)
			require.Equal(t, Priority(2), f.c.Priority(keep[0]))
			require.Equal(t, 1, f.c.Evict(1))
			require.False(t, f.c.Cached(other[0]), "the level-1 page goes before the retained one")
			require.True(t, f.c.Cached(keep[0]))

			pages, lapsed := f.c.Advance(15 * time.Second)
			require.Equal(t, [2]int{1, 0}, [2]int{pages, lapsed})
			require.Equal(t, Priority(0), f.c.Priority(keep[0]))
			require.Zero(t, f.c.Lapse(keep[0]), "a lapsed retention is spent")
			require.NoError(t, f.c.CheckInvariants())
		})
	}
}

func TestRetainRefusesBadArguments(t *testing.T) {
	f := newFixture(t, 4, func(c *Config) { c.Priorities = 2 })
	p := f.prefill(f.key, 0, 1, 2, 3, 4)
	require.ErrorIs(t, f.c.Retain(2, 0, p...), ErrBadArgument)
	require.ErrorContains(t, f.c.Retain(2, 0, p...), "priority 2, want 0..1")
	require.ErrorIs(t, f.c.Retain(1, -time.Second, p...), ErrBadArgument)
	require.ErrorContains(t, f.c.Retain(1, -time.Second, p...), "-1s")
	require.Equal(t, Priority(0), f.c.Priority(p[0]), "a refused retention changes nothing")
	_, _, err := f.c.PinFor(f.key, []int32{1, 2, 3, 4}, -time.Second)
	require.ErrorIs(t, err, ErrBadArgument)
}

// TestTTLPinLapsesRefreshesOnHitAndKeepsTheBudget: a TTL pin lapses by
// itself at the first Advance past its lifetime, a hit on its last page
// restarts the lifetime, and a pin past the budget is refused by name.
func TestTTLPinLapsesRefreshesOnHitAndKeepsTheBudget(t *testing.T) {
	f := newFixture(t, 10, func(c *Config) { c.PinBudget = 0.25 }) // 2 pages
	a := f.prefill(f.key, 0, 1, 2, 3, 4, 5, 6, 7, 8)
	b := f.prefill(f.key, 0, 9, 9, 9, 9)
	f.release(a...)
	f.release(b...)
	id, n, err := f.c.PinFor(f.key, []int32{1, 2, 3, 4, 5, 6, 7, 8}, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, 2, f.c.PinBudget())
	_, _, err = f.c.Pin(f.key, []int32{9, 9, 9, 9})
	require.ErrorIs(t, err, ErrPinLimit)
	require.ErrorContains(t, err, "pinning 1 more pages would make 3 pinned, over the pin budget of 2 pages (0.25 of 10)")

	f.c.Advance(8 * time.Second)
	got := f.match(f.key, 1, 2, 3, 4, 5, 6, 7, 8)
	f.c.Hit(got...) // refreshes: lapses at 18 s
	f.release(got...)
	at, ok := f.c.PinDeadline(id)
	require.True(t, ok)
	require.Equal(t, 18*time.Second, at)
	_, lapsed := f.c.Advance(17 * time.Second)
	require.Zero(t, lapsed)
	require.Equal(t, 2, f.c.Pinned())
	_, lapsed = f.c.Advance(18 * time.Second)
	require.Equal(t, 1, lapsed)
	require.Zero(t, f.c.Pinned())
	require.ErrorIs(t, f.c.Unpin(id), ErrUnknownPin, "a lapsed pin is gone")
	_, _, err = f.c.Pin(f.key, []int32{9, 9, 9, 9})
	require.NoError(t, err, "the lapsed pin gave its budget back")
	require.NoError(t, f.c.CheckInvariants())
}
