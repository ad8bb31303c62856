package pagedkv

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// HintContinuation refuses, by value and changing nothing, an unknown
// request, a hint outside the known ones and a call during a step; it
// accepts hints for a request's pages, more hints than pages included.
func TestHintContinuationErrors(t *testing.T) {
	m, err := New(Config{NumPages: 16, PageSize: 2, HashSeed: 1, Eviction: "adaptive", CascadeMinSavedPages: -1})
	require.NoError(t, err)
	require.ErrorIs(t, m.HintContinuation(7, []Hint{HintReuse}), ErrUnknownRequest)
	_, err = m.Add(1, Request{Prompt: []int32{1, 2, 3, 4, 5, 6, 7}, CapacityTokens: 8})
	require.NoError(t, err)
	err = m.HintContinuation(1, []Hint{HintReuse, 9})
	require.ErrorIs(t, err, ErrBadArgument)
	require.ErrorContains(t, err, "hint 9 of request 1's page 1")
	_, err = m.ReserveStep([]RequestID{1}, []int32{7}, nil)
	require.NoError(t, err)
	require.ErrorIs(t, m.HintContinuation(1, []Hint{HintReuse}), ErrStepPending)
	require.NoError(t, m.Commit(nil))
	require.NoError(t, m.HintContinuation(1, []Hint{HintNoReuse, HintReuse, HintNoReuse, HintNoReuse, HintReuse}))
	require.NoError(t, m.Release(1))
	require.NoError(t, m.Audit())
}
