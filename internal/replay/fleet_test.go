package replay

import (
	"bytes"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every router serves every request once; the prefix-aware router, which
// reads the replicas' KV events through kvindex, recovers more prefix hits
// than round robin on the conversation trace, and round robin balances
// requests exactly.
func TestFleetRouters(t *testing.T) {
	tr := prefix(conversation(t), 600)
	if raceEnabled {
		tr = prefix(tr, 150)
	}
	cfg := FleetConfig{Replicas: 4, CapacityPages: 1500, LoadSlack: 4, Service: DefaultService()}
	var runs []*FleetResult
	for _, router := range Routers {
		cfg.Router = router
		finished := 0
		cfg.Progress = func(n int) { finished = n }
		f, err := RunFleet(tr, cfg)
		require.NoError(t, err, router)
		require.Equal(t, len(tr.Requests), finished, router)
		sum := 0
		for k, n := range f.Routed {
			sum += n
			require.Equal(t, n, len(f.Replicas[k].Stream.Admissions)-int(f.Replicas[k].Preemptions), "%s replica %d", router, k)
		}
		require.Equal(t, len(tr.Requests), sum, router)
		runs = append(runs, f)
	}
	prefixHits, blocks := runs[0].HitBlocks()
	rrHits, _ := runs[1].HitBlocks()
	require.Equal(t, int64(tr.References), blocks)
	require.Greater(t, prefixHits, rrHits, "prefix-aware routing should beat round robin")
	require.LessOrEqual(t, slices.Max(runs[1].Routed)-slices.Min(runs[1].Routed), 1, "round robin")
	var out bytes.Buffer
	FormatFleet(&out, cfg, runs)
	for _, r := range Routers {
		require.Regexp(t, `(?m)^\s*`+r+`\s+\d+\.\d%`, out.String())
	}

	cfg.Router = "random"
	_, err := RunFleet(tr, cfg)
	require.ErrorContains(t, err, `router "random"`)
	cfg.Router, cfg.Replicas = RouterPrefix, 0
	_, err = RunFleet(tr, cfg)
	require.ErrorContains(t, err, "0 replicas")
}
