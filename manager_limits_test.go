package pagedkv

import (
	"math"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// The audit's Add(id, Request{Prompt: p, CapacityTokens: math.MaxInt})
// panicked in makeslice. Out-of-range capacities are rejected naming the
// value and the bound; an in-range huge one is a hint capped by the pool.
func TestAddCapacityLimits(t *testing.T) {
	m := mustNew(t, Config{NumPages: 8, PageSize: 4, HashSeed: 1})
	prompt := []int32{1, 2, 3}
	for _, c := range []int{math.MaxInt, MaxRequestTokens + 1, -1, math.MinInt} {
		_, err := m.Add(1, Request{Prompt: prompt, CapacityTokens: c})
		require.ErrorIs(t, err, ErrBadArgument, "CapacityTokens %d", c)
		require.ErrorContains(t, err, "want 0..2147483647")
		require.Equal(t, 0, m.Stats().Requests)
	}
	_, err := m.Add(1, Request{Prompt: prompt, CapacityTokens: MaxRequestTokens})
	require.NoError(t, err)
	// Capped: the prompt plus the pool's 32 token slots.
	require.LessOrEqual(t, cap(m.core.groups[0].reqs[1].tokens), len(prompt)+8*4)
	require.NoError(t, m.Audit())
}

func TestNewRejectsHugeWindow(t *testing.T) {
	_, err := New(Config{NumPages: 8, PageSize: 4, WindowTokens: math.MaxInt32 + 1})
	require.ErrorIs(t, err, ErrBadConfig)
	require.ErrorContains(t, err, "WindowTokens = 2147483648")
}

// Evict(n) frees pages until n are free, as its doc says and an engine
// keeping a reserve expects: with enough pages free already it evicts
// nothing (the audit saw it evict n more with 27 free).
func TestEvictStopsWhenEnoughAreFree(t *testing.T) {
	m := mustNew(t, Config{NumPages: 32, PageSize: 2, HashSeed: 1})
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	_, err := m.Add(1, Request{Prompt: prompt})
	require.NoError(t, err)
	step(t, m, []RequestID{1}, []int32{9}, []int32{10})
	require.NoError(t, m.Release(1))
	s := m.Stats()
	require.Equal(t, 4, s.EvictablePages, "four full pages published")
	require.Equal(t, 28, s.FreePages)

	require.Equal(t, 0, m.Evict(27), "27 pages are free already")
	require.Equal(t, 0, m.Evict(28))
	require.Equal(t, 4, m.Stats().EvictablePages)
	require.Equal(t, 1, m.Evict(29), "one more page to be free")
	require.Equal(t, 3, m.Evict(100), "everything evictable")
	require.Equal(t, 32, m.Stats().FreePages)
	require.NoError(t, m.Audit())
}

// recordTB records a Fatalf instead of failing the test.
type recordTB struct {
	testing.TB
	failed bool
}

func (r *recordTB) Helper() {}
func (r *recordTB) Fatalf(string, ...any) {
	r.failed = true
	runtime.Goexit()
}

// requireClose, the engine tests' comparison, must fail on NaN and ±Inf
// where a finite value is expected (math.Abs(NaN) > tol is false).
func TestRequireCloseFailsOnNonFinite(t *testing.T) {
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), 1} {
		rec := &recordTB{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			requireClose(rec, []float32{0.5, 0.25}, []float32{0.5, bad}, 1e-3, "probe")
		}()
		<-done
		require.True(t, rec.failed, "requireClose accepted %v for 0.25", bad)
	}
	rec := &recordTB{TB: t}
	requireClose(rec, []float32{0.5}, []float32{0.5004}, 1e-3, "probe")
	require.False(t, rec.failed)
}
