package main

import (
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/pagedkv/pagedkv/internal/sim"
	"github.com/pagedkv/pagedkv/tier"
	"github.com/pagedkv/pagedkv/tier/redis"
)

// openRedis opens the remote tier on the Redis server at addr (which the
// user runs: simulate starts nothing). Pages are keyed by the model the
// run simulates, so runs of different models never share values.
// Credentials come from $PAGEDKV_REDIS_USERNAME and $PAGEDKV_REDIS_PASSWORD.
func openRedis(addr string, cfg *sim.Config) (*redis.Store, error) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("address %q: %w", addr, err)
	}
	m := &cfg.Model
	return redis.New(redis.Config{
		Addr:      addr,
		Namespace: fmt.Sprintf("simulate-model-seed%d", m.Seed),
		Format: tier.PageFormat{Layout: cfg.KVLayout, DType: m.DType, PageSize: cfg.PageSize,
			NumKVHeads: m.NumKVHeads, HeadDim: m.HeadDim, Layers: m.Layers},
	}.FromEnv())
}

// runDisaggregated is simulate --disaggregated: it refuses the flags of
// runs it does not combine with (one decode replica, its remote tier is
// the handoff).
func runDisaggregated(cfg sim.Config, workload []sim.Request, replicas int, kvAddr, metricsAddr, redisAddr string,
	prog *progress, stdout io.Writer, fail func(int, string, ...any) int) int {
	for _, c := range []struct {
		set  bool
		flag string
	}{{replicas != 1, "--replicas"}, {kvAddr != "", "--kv-events"}, {metricsAddr != "", "--metrics-addr"}, {redisAddr != "", "--redis"}} {
		if c.set {
			return fail(exitUsage, "--disaggregated does not combine with %s", c.flag)
		}
	}
	d, err := sim.RunDisaggregated(cfg, workload)
	if prog != nil {
		prog.done()
	}
	switch {
	case errors.Is(err, sim.ErrBadConfig):
		return fail(exitUsage, "--disaggregated: %v", err)
	case err != nil:
		return fail(exitFailure, "%v", err)
	}
	d.Format(stdout, &cfg)
	return exitOK
}
