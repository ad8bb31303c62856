package replay

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/doclimits"
)

// longOutputs is a trace of n one-block requests of out output tokens.
func longOutputs(n, out int) *Trace {
	t := &Trace{BlockTokens: MooncakeBlockTokens}
	for i := range n {
		t.Requests = append(t.Requests, Request{ArrivalMs: int64(i), InputTokens: 512, OutputTokens: out, Blocks: []int32{int32(i)}})
	}
	t.References, t.DistinctBlocks = n, n
	return t
}

// The whole Mooncake trace runs within the limits in every setting
// docs/replay.md reports (the default sweep sequential and under the
// service model, four replicas at 5%), with room to spare; the hostile
// trace of issue 35 (16 requests of 2^20 output tokens) is refused
// before any work.
func TestWorkLimits(t *testing.T) {
	tr := conversation(t)
	require.Equal(t, int64(1+512*len(tr.Requests[0].Blocks)), Work(prefix(tr, 1), 512, false))
	fractions, policies := DefaultFractions, DefaultPolicies
	for _, svc := range []*Service{nil, new(DefaultService())} {
		w, what := sweepWork(tr, SweepConfig{Fractions: fractions, Policies: policies, Service: svc, PageTokens: map[bool]int{true: 16, false: 0}[svc == nil]}, 0)
		require.LessOrEqual(t, 2*w, DefaultMaxWork, what)
		require.NoError(t, checkWork(w, 0, what))
	}
	// Every block of the trace in one pool (and as many in a host tier)
	// at 512 tokens a page fits too.
	require.NoError(t, checkSweep(tr, SweepConfig{Fractions: []float64{1}, Policies: policies[:1], Service: new(DefaultService()), HostPages: tr.DistinctBlocks}, 0))
	wide := &Trace{BlockTokens: 512, Requests: []Request{{Blocks: make([]int32, 4096)}}, DistinctBlocks: 1 << 20}
	require.NoError(t, checkSweep(wide, SweepConfig{Fractions: []float64{1}, Policies: policies[:1], Service: new(DefaultService())}, 0))
	wide.DistinctBlocks++
	require.ErrorContains(t, checkSweep(wide, SweepConfig{Fractions: []float64{1}, Policies: policies[:1], Service: new(DefaultService())}, 0),
		"a pool of 1048577 pages and a host tier of 0, × 512 tokens = 536871424 tokens, over the limit of 536870912 (MaxPoolTokens)")
	fleet := FleetConfig{Replicas: 4, CapacityPages: 9139, Service: DefaultService()}
	require.NoError(t, CheckFleet(tr, fleet, len(Routers)))

	hostile := longOutputs(16, 1<<20)
	progress := 0
	start := time.Now()
	_, err := RunSweep(hostile, SweepConfig{Fractions: fractions, Policies: policies, Service: new(DefaultService()), Progress: func(n int) { progress = n }})
	require.ErrorIs(t, err, ErrBadConfig)
	require.ErrorContains(t, err, "21497303360 units of work, over the limit of 17179869184")
	require.Zero(t, progress, "work began")
	require.Less(t, time.Since(start), 10*time.Second) // refused, not run (it took minutes)
	// Raised, the limit lets it through the check (not run here).
	w, what := sweepWork(hostile, SweepConfig{Fractions: fractions, Policies: policies, Service: new(DefaultService())}, 0)
	require.NoError(t, checkWork(w, math.MaxInt64, what))

	for _, c := range []struct {
		cfg  FleetConfig
		want string
	}{
		{FleetConfig{Replicas: 100000, CapacityPages: 2050, Service: DefaultService()}, "100000 replicas, want 1..1024"},
		{FleetConfig{Replicas: 0, CapacityPages: 2050, Service: DefaultService()}, "0 replicas"},
		{FleetConfig{Replicas: 1024, CapacityPages: 2050, Service: DefaultService()}, "1074790400 tokens of pools, over the limit of 536870912"},
		{FleetConfig{Replicas: 4, CapacityPages: 2050, Service: Service{PrefillTokensPerSec: 1, DecodeTokensPerSec: 1, MaxBatch: 1 << 40, StepTokens: 1}}, "MaxBatch 1099511627776, want 1..65536"},
		{FleetConfig{Replicas: 4, CapacityPages: 2050, Service: DefaultService(), MaxWork: 1000}, "over the limit of 1000"},
	} {
		_, err := RunFleet(hostile, c.cfg)
		require.ErrorIs(t, err, ErrBadConfig, c.want)
		require.ErrorContains(t, err, c.want)
	}
	require.Equal(t, int64(math.MaxInt64), mulSat(1<<40, 1<<40))
	require.Equal(t, int64(math.MaxInt64), addSat(math.MaxInt64, 1))
}

// A pool that holds one request at a time under the service model
// preempts and resumes the others every step: the replay stops with the
// pool named once MaxPreemptionsPerRequest × requests preemptions are
// spent (before: 16 requests of 2^20 output tokens ran for minutes,
// their resumptions filling memory).
func TestPreemptionThrashStops(t *testing.T) {
	// The budget lowered to 64 a request: the same stop, in a few hundred
	// steps rather than 4096 × 3 (seconds under -race).
	defer func(old int64) { preemptionsPerRequest = old }(preemptionsPerRequest)
	preemptionsPerRequest = 64
	tr := longOutputs(3, 1<<16)
	svc := DefaultService()
	_, err := Run(tr, Config{CapacityPages: tr.MinPoolPages(), Service: &svc})
	require.True(t, errors.Is(err, ErrBadConfig), "%v", err)
	require.ErrorContains(t, err, "more than 192 preemptions (MaxPreemptionsPerRequest 64 × 3 requests)")
	require.ErrorContains(t, err, "the pool of 130 pages")
	// A pool that holds them all preempts nothing.
	preemptionsPerRequest = 0
	res, err := Run(longOutputs(3, 100), Config{CapacityPages: 3 * tr.MinPoolPages(), Service: &svc})
	require.NoError(t, err)
	require.Zero(t, res.Preemptions)
}

// docs/replay.md's limits table is the code's.
func TestReplayLimitsDocumented(t *testing.T) {
	lim := DefaultLimits()
	doclimits.Check(t, "docs/replay.md", map[string]any{
		"replay.DefaultMaxWork":           DefaultMaxWork,
		"replay.DecodeTokenWork":          DecodeTokenWork,
		"replay.RunWork":                  RunWork,
		"replay.MaxReplicas":              MaxReplicas,
		"replay.MaxPoolTokens":            MaxPoolTokens,
		"replay.MaxBlockTokens":           MaxBlockTokens,
		"replay.MaxServiceBatch":          MaxServiceBatch,
		"replay.MaxPreemptionsPerRequest": MaxPreemptionsPerRequest,
		"replay.Limits.MaxRequests":       lim.MaxRequests,
		"replay.Limits.MaxBlocks":         lim.MaxBlocks,
		"replay.Limits.MaxRequestBlocks":  lim.MaxRequestBlocks,
		"replay.Limits.MaxOutputTokens":   lim.MaxOutputTokens,
		"replay.maxLineBytes":             maxLineBytes,
		"replay.MaxBlockID":               MaxBlockID,
	})
}
