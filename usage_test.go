package pagedkv

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Released requests' usage is kept until read, at most KeptCacheUsages of
// them: past that the oldest unread is forgotten and counted; an Add that
// reuses a released ID forgets the old request's usage; a refused Release
// (a step pending) keeps the request and its usage live.
func TestCacheUsageKeptAfterRelease(t *testing.T) {
	m := mustNew(t, Config{NumPages: 8, PageSize: 4, HashSeed: 1})
	prompt := seqTokens(3, 9) // 2 full pages cached by the first request
	_, err := m.Add(1, Request{Prompt: prompt})
	require.NoError(t, err)
	_, err = m.Reserve([]RequestID{1}, []int32{9})
	require.NoError(t, err)
	require.ErrorIs(t, m.Release(1), ErrStepPending)
	require.NoError(t, m.Commit([]int32{5}))
	u, ok := m.CacheUsage(1)
	require.True(t, ok)
	require.Equal(t, CacheUsage{WriteTokens: 8}, u)
	require.NoError(t, m.Release(1))

	const extra = 5
	for id := RequestID(2); id < 2+KeptCacheUsages+extra; id++ {
		matched, err := m.Add(id, Request{Prompt: prompt})
		require.NoError(t, err)
		require.Equal(t, 8, matched)
		require.NoError(t, m.Release(id))
	}
	st := m.Stats()
	require.EqualValues(t, extra+1, st.CacheUsageDropped, "request 1 and the first %d of the rest were forgotten", extra)
	require.Equal(t, CacheUsage{DeviceReadTokens: 8 * (KeptCacheUsages + extra), WriteTokens: 8}, st.CacheUsage)
	for id := RequestID(1); id < 2+extra; id++ {
		_, ok := m.CacheUsage(id)
		require.False(t, ok, "request %d should be forgotten", id)
	}
	last := RequestID(1 + KeptCacheUsages + extra)
	u, ok = m.CacheUsage(last)
	require.True(t, ok)
	require.Equal(t, CacheUsage{DeviceReadTokens: 8}, u)
	_, ok = m.CacheUsage(last)
	require.False(t, ok, "read once")

	// A reused ID names the new request.
	reuse := last - 1
	_, err = m.Add(reuse, Request{Prompt: prompt, NoCache: true})
	require.NoError(t, err)
	u, ok = m.CacheUsage(reuse)
	require.True(t, ok)
	require.Equal(t, CacheUsage{}, u, "the new request %d read nothing (NoCache)", reuse)
	require.NoError(t, m.Release(reuse))
	u, ok = m.CacheUsage(reuse)
	require.True(t, ok)
	require.Equal(t, CacheUsage{}, u)
	require.NoError(t, m.Audit())
}
