package sim

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDisaggregatedState runs the state-group presets disaggregated: the
// prefill side hands off each request's full-attention pages (named by
// their group) and, per state group, the checkpoint of the deepest prefix
// the decode side can hit; the decode side resumes from those checkpoints
// (its state groups' remote hits), verifies every sampled output bit for
// bit (recurrent outputs after a restore included) and generates the same
// tokens as a single-process run.
func TestDisaggregatedState(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"qwen3-next-like", "nemotron-h-like"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := stateConfig(t, name)
			cfg.NumPages = 96
			d, err := RunDisaggregated(cfg, stateWorkload(t, 12))
			require.NoError(t, err)
			gs := d.Decode.Groups[0].Stats // a state group's
			assert.Positive(t, d.StatePages, "state checkpoint pages handed off")
			assert.Positive(t, gs.RemoteHitTokens, "decode-side hits resumed from a handed-off checkpoint")
			assert.Positive(t, d.Decode.Verified.RestoredOutputs, "recurrent outputs verified after a restore")
			assert.Zero(t, d.Refused)
			t.Logf("%d handoff requests, %d state pages; decode side: %d state hit tokens from the handoff (per state group), %d outputs verified (%d after a restore)",
				d.Requests, d.StatePages, gs.RemoteHitTokens, d.Decode.Verified.Outputs, d.Decode.Verified.RestoredOutputs)
		})
	}
}
