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

// TestDisaggregatedMLA runs the deepseek-v3.2-like preset disaggregated:
// the prefill side hands off each request's MLA pages, each tier value
// carrying the page's indexer pages (tier.PageFormat, flags 0x01); the
// decode side resumes on those hits, verifies its MLA outputs against
// float64 MLA and reads every indexer entry back through the MLA pages,
// the handed-off ones included, and generates the single-process run's
// tokens. The same run with a sender that leaves the indexer pages out of
// the values it hands off fails on the decode side's indexer read-back.
func TestDisaggregatedMLA(t *testing.T) {
	t.Parallel()
	cfg := mlaConfig(t, 0)
	cfg.NumPages = 64
	wl := stateWorkload(t, 12)
	d, err := RunDisaggregated(cfg, wl)
	require.NoError(t, err)
	assert.Zero(t, d.Refused)
	assert.Positive(t, d.Pages, "MLA pages handed off")
	st, v := d.Decode.Stats, d.Decode.Verified
	assert.Positive(t, st.Tiers.RemoteHitTokens, "decode-side hits served by the handoff")
	assert.Positive(t, st.Tiers.OnloadedPages)
	assert.Positive(t, v.HitOutputs, "MLA outputs of requests admitted on a hit")
	assert.Positive(t, v.IndexerHitTokens, "indexer entries read back at positions a hit served")
	t.Logf("%d handoff requests, %d MLA pages; decode side: %d remote hit tokens, %d MLA outputs (%d after a hit), %d indexer entries (%d at hit positions)",
		d.Requests, d.Pages, st.Tiers.RemoteHitTokens, v.MLAOutputs, v.HitOutputs, v.IndexerTokens, v.IndexerHitTokens)

	// A sender that drops the indexer pages: its tier values carry zeros
	// where the indexer pages go.
	_, err = runDisaggregated(cfg, wl, func(p *Sim) { p.eng.mla.skipIndexerTier = true })
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrVerify)
	assert.Contains(t, err.Error(), "decode side")
	assert.Contains(t, err.Error(), "indexer entry")
	t.Logf("indexer pages dropped: %v", err)
}
