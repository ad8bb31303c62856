package sim

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSimulateStateHostTier runs the state-group presets with a host tier
// below a small pool: state checkpoints are offloaded when evicted and
// onloaded into fresh slots at admission, and every sampled output, those
// after a host-tier round trip of their state included, equals recomputing
// the request from token 0 bit for bit.
func TestSimulateStateHostTier(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"qwen3-next-like", "nemotron-h-like"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := stateConfig(t, name)
			cfg.HostPages = 64
			n := 16
			if name == "nemotron-h-like" {
				n = 10
			}
			sum := run(t, cfg, stateWorkload(t, n))
			gs := sum.Groups[0].Stats // a state group's: its checkpoints' tier traffic
			assert.Positive(t, gs.OffloadedPages, "state checkpoints offloaded to the host tier")
			assert.Positive(t, gs.OnloadedPages, "state checkpoints onloaded from the host tier")
			assert.Positive(t, gs.HostHitTokens, "hits served by a checkpoint from the host tier")
			assert.Positive(t, sum.Verified.RestoredOutputs, "recurrent outputs verified after a restore")
			assert.Positive(t, sum.Stats.Preemptions, "preemptions")
			assert.Positive(t, gs.EvictedPages, "state checkpoints evicted")
			t.Logf("state checkpoints: %d pages offloaded, %d onloaded, %d host hit tokens (per state group); %d restores, %d outputs verified (%d after a restore)",
				gs.OffloadedPages, gs.OnloadedPages, gs.HostHitTokens, sum.StateHits, sum.Verified.Outputs, sum.Verified.RestoredOutputs)
		})
	}
}

// TestSimulateStateHostTierSkippedOnloads: the same run with the engine
// completing onload copies without their bytes fails verification at a
// recurrent output resumed from a checkpoint the host tier held.
func TestSimulateStateHostTierSkippedOnloads(t *testing.T) {
	t.Parallel()
	cfg := stateConfig(t, "qwen3-next-like")
	cfg.HostPages = 64
	s, err := New(cfg, stateWorkload(t, 16))
	require.NoError(t, err)
	s.eng.skipOnloads = true
	_, err = s.Run()
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrVerify), "%v", err)
	assert.Contains(t, err.Error(), "recurrent output") // a restored state, before any attention output
}
