package sim

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/redistest"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/tier/redis"
)

// Two runs of one workload on one real redis-server, for every cache dtype
// and layout the simulator supports: the second run (a fresh Manager, a
// fresh host tier: another replica) is served prefixes the first stored,
// and every checked K/V row of it, onloaded ones included, is bit-exact.
func TestTwoRunsShareThroughRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	wl := DefaultWorkloadConfig()
	wl.Requests = 10
	wl.ArrivalsPerStep = 4
	wl.OutputTokens = [2]int{2, 6}
	workload, err := Workload(wl)
	require.NoError(t, err)
	for _, dt := range []layout.DType{layout.F16, layout.BF16, layout.F32} {
		for _, kl := range []layout.KVLayout{layout.NHD, layout.HND} {
			name := fmt.Sprintf("%v-%v", dt, kl)
			cfg := DefaultConfig()
			cfg.Model = Model{Layers: 2, NumQOHeads: 4, NumKVHeads: 2, HeadDim: 16, DType: dt, Seed: 1}
			cfg.KVLayout, cfg.NumPages, cfg.HostPages, cfg.VerifyEvery = kl, 96, 64, 1
			cfg.RemoteDeadline = 5 * time.Second // the point here is sharing, not the deadline
			var sums []Summary
			for range 2 {
				store, err := redis.New(redis.Config{Addr: srv.Addr(), Namespace: "sim-" + name, Format: tierFormat(&cfg),
					WriteTimeout: 10 * time.Second})
				require.NoError(t, err)
				cfg.Remote = store
				s, err := New(cfg, workload)
				require.NoError(t, err)
				sum, err := s.Run()
				require.NoError(t, err, name)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				require.NoError(t, store.Flush(ctx))
				cancel()
				require.NoError(t, store.Close())
				sums = append(sums, sum)
			}
			first, second := sums[0].Stats.Tiers, sums[1].Stats.Tiers
			require.Positive(t, first.RemoteStored, "%s: the first run stored nothing", name)
			require.Positive(t, second.RemoteHitTokens, "%s: the second run was served nothing from Redis", name)
			require.Zero(t, second.Remote.Rejected, name)
			require.Greater(t, sums[1].Stats.PromptHitTokens, sums[0].Stats.PromptHitTokens, name)
			require.Positive(t, sums[1].Verified.KVTokens, name)
		}
	}
}
