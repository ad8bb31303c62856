package sim

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/invariants"
)

// fakeReplicas returns replicas whose loads are the given numbers of
// waiting requests.
func fakeReplicas(loads ...int) []*replicaRun {
	var out []*replicaRun
	for _, l := range loads {
		s := &Sim{}
		for range l {
			s.waiting = append(s.waiting, &reqState{})
		}
		out = append(out, &replicaRun{s: s})
	}
	return out
}

// TestRoutePolicy pins the documented policy: the longest cached prefix
// among replicas within the load slack, ties to the less loaded, then the
// lower number.
func TestRoutePolicy(t *testing.T) {
	for _, c := range []struct {
		matched, loads []int
		slack, want    int
	}{
		{[]int{0, 32, 16}, []int{0, 0, 0}, 4, 1},   // longest prefix
		{[]int{16, 16, 16}, []int{3, 1, 2}, 4, 1},  // tie: least loaded
		{[]int{16, 16, 0}, []int{2, 2, 0}, 4, 0},   // tie on both: lower number
		{[]int{0, 64, 0}, []int{0, 5, 1}, 4, 0},    // replica 1 over the cap; 0 and 2 tie, 0 is less loaded
		{[]int{0, 64, 32}, []int{0, 5, 4}, 4, 2},   // the best within the cap
		{[]int{0, 64, 32}, []int{0, 50, 4}, -1, 1}, // no cap
		{[]int{0, 64, 32}, []int{0, 1, 0}, 0, 2},   // slack 0: only the least loaded
	} {
		if got := route(c.matched, fakeReplicas(c.loads...), c.slack); got != c.want {
			t.Errorf("matched %v loads %v slack %d: routed to %d, want %d", c.matched, c.loads, c.slack, got, c.want)
		}
	}
}

func TestRunFleetBadConfig(t *testing.T) {
	wl, err := Workload(DefaultWorkloadConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, fc := range []FleetConfig{{Replicas: 0}, {Replicas: 65}, {Replicas: 2, Policy: 7}} {
		if _, err := RunFleet(DefaultConfig(), wl, fc); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%+v: err = %v, want ErrBadConfig", fc, err)
		}
	}
	if _, err := RunFleet(DefaultConfig(), nil, FleetConfig{Replicas: 2}); !errors.Is(err, ErrBadConfig) {
		t.Errorf("empty workload: err = %v", err)
	}
}

// TestRunFleetHybrid runs each hybrid preset over two replicas under both
// policies on a pool small enough for eviction: every replica runs the
// HybridManager and verifies every group's outputs, the router's index
// applies every published batch without a gap and sees each replica's
// events in all of the model's groups, and prefix-aware routing sends
// requests to prefixes the index holds in every group. The "/host" run
// gives each replica a host tier whose pages its events announce too
// (medium "CPU", per group).
func TestRunFleetHybrid(t *testing.T) {
	t.Parallel()
	n := 16
	if invariants.Enabled {
		n = 8
	}
	for _, name := range []string{"gpt-oss-like", "gemma-3-like", "llama-4-like", "gpt-oss-like/host"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg, host := smallHybridConfig(t, name), strings.HasSuffix(name, "/host")
			wl := smallWorkload(t, n)
			for _, p := range []Policy{PrefixAware, RoundRobin} {
				f, err := RunFleet(cfg, wl, FleetConfig{Replicas: 2, Policy: p, LoadSlack: DefaultLoadSlack})
				require.NoError(t, err, p)
				require.Len(t, f.Replicas, 2)
				assert.Equal(t, n, f.Routed[0]+f.Routed[1], p)
				offloaded := int64(0)
				for i, sum := range f.Replicas {
					offloaded += sum.Stats.Tiers.OffloadedPages
					require.Len(t, sum.Groups, len(cfg.Groups), "%v replica %d", p, i)
					for g, gs := range sum.Groups {
						assert.Equal(t, cfg.Groups[g], gs.Spec)
						if sum.Requests > 0 {
							assert.Positive(t, gs.Outputs, "%v replica %d group %d outputs verified", p, i, g)
						}
					}
				}
				if host {
					assert.Positive(t, offloaded, "%v: no page reached a host tier", p)
				}
				assert.Positive(t, f.Verified.Checks, p)
				assert.Positive(t, f.Events.Batches, p)
				assert.Equal(t, f.Events.Batches, f.Events.Indexed, "%v: batches published, indexed", p)
				assert.Zero(t, f.Events.Gaps+f.Events.Dropped, p)
				assert.Equal(t, len(cfg.Groups), f.Events.Groups, "%v: groups the index saw per replica", p)
				if p == PrefixAware {
					assert.Positive(t, f.RoutedHits, "requests routed to a cached prefix")
					assert.Positive(t, f.PromptHitTokens)
				}
			}
		})
	}
}
