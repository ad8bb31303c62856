package sim

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// outputs runs reqs under cfg and returns every finished branch's tokens
// by name.
func outputs(t *testing.T, cfg Config, reqs []Request) (map[string][]int32, Summary) {
	t.Helper()
	s, err := New(cfg, reqs)
	require.NoError(t, err)
	sum, err := s.Run()
	require.NoError(t, err)
	out := map[string][]int32{}
	for _, r := range s.finished {
		out[r.name()] = r.tokens
	}
	return out, sum
}

// TestSpeculativeMatchesPlain: with drafts the run verifies every checked
// output (draft rows included) and paged K/V, accepts some drafts but not
// all, and ends with exactly the tokens of the same workload run without
// drafts, preemptions and parallel samples included (the small pool
// forces both).
func TestSpeculativeMatchesPlain(t *testing.T) {
	t.Parallel()
	cfg := smallConfig()
	cfg.NumPages, cfg.VerifyEvery = 40, 1
	reqs := smallWorkload(t, 12)
	plain, psum := outputs(t, cfg, reqs)
	cfg.SpecTokens = 4
	spec, ssum := outputs(t, cfg, reqs)

	st := ssum.Stats
	t.Logf("drafts %d, accepted %d; steps %d plain, %d speculative; preemptions %d", st.DraftTokens, st.AcceptedDraftTokens, psum.Steps, ssum.Steps, st.Preemptions)
	assert.Positive(t, st.AcceptedDraftTokens)
	assert.Less(t, st.AcceptedDraftTokens, st.DraftTokens)
	assert.Less(t, ssum.Steps, psum.Steps, "accepted drafts save decode steps")
	assert.Positive(t, ssum.Verified.Outputs)
	assert.Positive(t, ssum.Verified.DraftOutputs, "draft rows are checked against float64 attention")
	assert.Zero(t, psum.Stats.DraftTokens)
	require.Len(t, spec, len(plain))
	for name, toks := range plain {
		assert.Equal(t, toks, spec[name], name)
	}
}

// TestSpecTokensBad: an out-of-range draft count is a config error naming it.
func TestSpecTokensBad(t *testing.T) {
	for _, k := range []int{-1, MaxSpecTokens + 1} {
		cfg := smallConfig()
		cfg.SpecTokens = k
		_, err := New(cfg, smallWorkload(t, 2))
		require.Error(t, err)
		assert.True(t, errors.Is(err, ErrBadConfig))
		assert.Contains(t, err.Error(), "spec tokens")
	}
}
