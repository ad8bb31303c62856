package sim

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/invariants"
	"github.com/pagedkv/pagedkv/layout"
)

// The default workload, disaggregated: every request's full prompt pages
// go over loopback to the decode side, which is served them as prefix hits
// and verifies its attention outputs; its tokens equal a single-process
// run's. Under -race (invariants on) one layout and 6 requests: three
// simulations run per layout.
func TestDisaggregated(t *testing.T) {
	layouts, requests := []layout.KVLayout{layout.NHD, layout.HND}, 24
	if testing.Short() || invariants.Enabled {
		layouts, requests = layouts[1:], 6
	}
	for _, kl := range layouts {
		cfg := DefaultConfig()
		cfg.KVLayout = kl
		wcfg := DefaultWorkloadConfig()
		wcfg.Requests = requests
		wl, err := Workload(wcfg)
		require.NoError(t, err)
		d, err := RunDisaggregated(cfg, wl)
		require.NoError(t, err)
		require.Zero(t, d.Refused)
		require.Zero(t, d.AlreadyHeld, "a shared prefix's pages are computed alike: equal bytes, taken")
		require.Positive(t, d.Requests)
		require.Positive(t, d.Decode.Verified.Outputs)
		require.Positive(t, d.Decode.Stats.Tiers.RemoteHitTokens)
		require.GreaterOrEqual(t, d.Decode.Stats.Tiers.RemoteHitTokens+d.Decode.Stats.PromptHitTokens, int64(d.Pages*cfg.PageSize)/2)
		var b bytes.Buffer
		d.Format(&b, &cfg)
		t.Logf("%v:\n%s", kl, b.String())
	}
}

func TestDisaggregatedRefusesWhatItCannotRun(t *testing.T) {
	wl, err := Workload(DefaultWorkloadConfig())
	require.NoError(t, err)
	cfg := DefaultConfig()
	cfg.WindowTokens = 64
	_, err = RunDisaggregated(cfg, wl)
	require.ErrorIs(t, err, ErrBadConfig)
}
