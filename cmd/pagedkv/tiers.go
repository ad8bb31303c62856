package main

import (
	"fmt"
	"net"

	"github.com/pagedkv/pagedkv/internal/sim"
	"github.com/pagedkv/pagedkv/tier"
	"github.com/pagedkv/pagedkv/tier/redis"
)

// openRedis opens the remote tier on the Redis server at addr (which the
// user runs: simulate starts nothing). Pages are keyed by the model the
// run simulates, so runs of different models never share values.
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
	})
}
