package main

import (
	"context"
	"encoding/hex"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/internal/redistest"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/tier"
	"github.com/pagedkv/pagedkv/tier/redis"
)

// The tier traces: TestTrace's engine loop on a Manager with a host tier
// (and, in the second, a Redis server below it) and KV events, plus the
// tier operations an engine does: take the planned tier copies, complete
// some of them (in any order, leaving others in flight, so that steps of
// loading requests fail with ErrLoading), drain the KV event batches, and
// list the cached hashes of either medium. Every operation records the
// tier stats too. python/tests/test_tier_trace.py replays
// testdata/tier_trace.json through libpagedkv, running the copies on
// simulated device and host memory, and must see exactly these results.

// traceFormat is the tier traces' page format: 4 tokens of one K/V head of
// one f32 element, one layer (32 bytes a page: K plane then V plane).
var traceFormat = tier.PageFormat{Layout: layout.NHD, DType: layout.F32, PageSize: 4, NumKVHeads: 1, HeadDim: 1, Layers: 1}

// traceTiers is the tier traces' tier config (Remote set per trace) and
// its pagedkv_tier_config fields for the trace file.
var traceTiers = pagedkv.TierConfig{HostPages: 24, Format: traceFormat, OffloadFreePages: 4, RemoteDeadline: 10 * time.Second}

func tierFields(tc pagedkv.TierConfig) map[string]int64 {
	return map[string]int64{
		"host_pages": int64(tc.HostPages), "offload_free_pages": int64(tc.OffloadFreePages),
		"write_through": map[bool]int64{false: 0, true: 1}[tc.WriteThrough], "remote_deadline_us": tc.RemoteDeadline.Microseconds(),
		"format_kv_layout": int64(tc.Format.Layout), "format_dtype": int64(tc.Format.DType), "format_num_kv_heads": int64(tc.Format.NumKVHeads),
		"format_head_dim": int64(tc.Format.HeadDim), "format_num_layers": int64(tc.Format.Layers),
	}
}

// tierOp is one tier operation of the engine loop.
func (g *traceGen) tierOp() {
	switch k := g.rng.IntN(10); {
	case k < 4:
		copies := g.tm.TierCopies(nil)
		op := traceOp{Op: "tier_copies"}
		for _, c := range copies {
			op.Want.Copies = append(op.Want.Copies, [4]uint64{c.ID, uint64(c.Dir), uint64(c.Device), uint64(c.Host)})
			g.inflight = append(g.inflight, c.ID)
		}
		g.record(op, int64(len(copies)), nil)
	case k < 7:
		// Complete a random part of the copies in flight, in random order;
		// sometimes with an id that must be refused (repeated or unknown).
		g.rng.Shuffle(len(g.inflight), func(i, j int) { g.inflight[i], g.inflight[j] = g.inflight[j], g.inflight[i] })
		n := 0
		if len(g.inflight) > 0 {
			n = 1 + g.rng.IntN(len(g.inflight))
		}
		op := traceOp{Op: "complete", CompleteIDs: slices.Clone(g.inflight[:n])}
		if g.rng.IntN(8) == 0 {
			bad := uint64(1<<40 + 7)
			if n > 0 {
				bad = op.CompleteIDs[0]
			}
			op.CompleteIDs = append(op.CompleteIDs, bad)
		}
		err := g.tm.CompleteTierCopies(op.CompleteIDs...)
		if err == nil {
			g.inflight = slices.Delete(g.inflight, 0, n)
		}
		g.record(op, 0, err)
	case k < 9 && g.rec != nil:
		g.drainOp()
	default:
		// A hybrid manager lists host hashes only (its device caches are
		// per group).
		op := traceOp{Op: "cached_hashes", Medium: 1}
		if g.dense != nil {
			op.Medium = g.rng.IntN(2)
		}
		if op.Medium == 0 {
			op.Want.Hashes = g.dense.CachedHashes(nil)
		} else {
			op.Want.Hashes = g.tm.HostCachedHashes(nil)
		}
		g.record(op, int64(len(op.Want.Hashes)), nil)
	}
}

// drainOp drains the KV event batches, as pagedkv_drain_events does.
func (g *traceGen) drainOp() {
	op := traceOp{Op: "drain_events"}
	for b := nextBatch(g.rec, g.evq); b != nil; b = nextBatch(g.rec, g.evq) {
		p := g.enc.AppendBatch(nil, b, 0)
		g.evq.Done(b)
		clear(p[2:10]) // [0x93, 0xcb, float64 ts, ...]
		op.Want.Events = append(op.Want.Events, hex.EncodeToString(p))
	}
	g.record(op, int64(len(op.Want.Events)), nil)
}

func makeTierTraces(t *testing.T, withRedis bool) traceFile {
	cfg := pagedkv.Config{NumPages: 24, PageSize: 4, HashSeed: 13, CascadeMinSavedPages: 2, Tiers: traceTiers}
	name, flush := withTraceRedis(t, &cfg, withRedis, 8, 17, "host tier, KV events", "host tier, Redis, KV events")
	rec, q, err := newRecorder(recorderConfig(cfg, nil), DefaultEventBatches)
	if err != nil {
		t.Fatal(err)
	}
	cfg.CacheEvents = rec
	m, err := pagedkv.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g := &traceGen{t: t, m: m, dense: m, rng: rand.New(rand.NewPCG(uint64(cfg.HashSeed), 29)), promptScale: 1, maxChunk: 12,
		tiers: true, tm: m, rec: rec, evq: q, enc: events.NewEncoder(), flush: flush}
	g.run(400)
	tr := trace{Name: name, Ops: g.ops, Tiers: tierFields(cfg.Tiers), Redis: withRedis, Events: true, Config: map[string]int64{
		"num_pages": int64(cfg.NumPages), "page_size": int64(cfg.PageSize), "hash_seed": int64(cfg.HashSeed),
		"cascade_min_saved_pages": int64(cfg.CascadeMinSavedPages),
	}}
	return traceFile{Traces: []trace{tr}}
}

// traceRedis is a Redis store of format f on a fresh redis-server (the
// test skips without one, as internal/redistest does) and a flush that
// waits for its writes.
func traceRedis(t *testing.T, f tier.PageFormat) (*redis.Store, func()) {
	srv := redistest.Start(t)
	st, err := redis.New(redis.Config{Addr: srv.Addr(), Namespace: "trace", Format: f})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := st.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// withTraceRedis returns name and a nil flush, or with withRedis puts a
// Redis store below cfg's host tier, with hostPages host pages (few: the
// host tier reclaims, and Redis serves) and hash seed seed, and returns
// redisName and the store's flush.
func withTraceRedis(t *testing.T, cfg *pagedkv.Config, withRedis bool, hostPages int, seed uint64, name, redisName string) (string, func()) {
	if !withRedis {
		return name, nil
	}
	var flush func()
	cfg.Tiers.Remote, flush = traceRedis(t, cfg.Tiers.Format)
	cfg.Tiers.HostPages, cfg.HashSeed = hostPages, seed
	return redisName, flush
}

// hybridTraceFormat is the hybrid tier traces' page format: traceFormat
// with two layers, one per group (64 bytes a page: each layer's K plane
// then V plane).
var hybridTraceFormat = tier.PageFormat{Layout: layout.NHD, DType: layout.F32, PageSize: 4, NumKVHeads: 1, HeadDim: 1, Layers: 2}

// makeHybridTierTraces is makeTierTraces on a HybridManager (sliding
// window 8 + full attention, one layer each) with a host tier (and Redis
// below it), without KV events (TestABIHybridTierEvents and the C test
// check a hybrid host tier's events).
func makeHybridTierTraces(t *testing.T, withRedis bool) traceFile {
	groups := []pagedkv.LayerGroup{{Kind: pagedkv.SlidingAttention, WindowTokens: 8, NumLayers: 1}, {Kind: pagedkv.FullAttention, NumLayers: 1}}
	tc := traceTiers
	tc.Format = hybridTraceFormat
	cfg := pagedkv.Config{NumPages: 20, PageSize: 4, HashSeed: 19, CascadeMinSavedPages: 2, Tiers: tc}
	name, flush := withTraceRedis(t, &cfg, withRedis, 10, 23, "hybrid sliding 8 + full, host tier", "hybrid sliding 8 + full, host tier, Redis")
	m, err := pagedkv.NewHybrid(pagedkv.HybridConfig{Config: cfg, Groups: groups})
	if err != nil {
		t.Fatal(err)
	}
	g := &traceGen{t: t, m: m, hybrid: m, rng: rand.New(rand.NewPCG(uint64(cfg.HashSeed), 31)), promptScale: 2, maxChunk: 12,
		tiers: true, tm: m, flush: flush}
	g.run(400)
	tr := trace{Name: name, Ops: g.ops, Tiers: tierFields(cfg.Tiers), Redis: withRedis, Config: map[string]int64{
		"num_pages": int64(cfg.NumPages), "page_size": int64(cfg.PageSize), "hash_seed": int64(cfg.HashSeed),
		"cascade_min_saved_pages": int64(cfg.CascadeMinSavedPages),
	}}
	for _, gr := range groups {
		tr.Groups = append(tr.Groups, map[string]int64{"kind": int64(gr.Kind), "window_tokens": int64(gr.WindowTokens),
			"chunk_tokens": int64(gr.ChunkTokens), "num_layers": int64(gr.NumLayers)})
	}
	return traceFile{Traces: []trace{tr}}
}

// TestHybridTierTrace writes and checks testdata/hybrid_tier_trace.json
// (host tier) and testdata/hybrid_tier_redis_trace.json (over a real
// redis-server), which python/tests/test_tier_trace.py replays too.
func TestHybridTierTrace(t *testing.T) {
	tierTraces(t, makeHybridTierTraces, "hybrid_tier", "add", "reserve", "commit", "tier_copies", "complete", "cached_hashes",
		"tier copies", "hashes", "host hits", "error Loading", "error BadArgument", "error OutOfPages", "released pages")
}

// TestTierTrace writes and checks testdata/tier_trace.json (host tier) and
// testdata/tier_redis_trace.json (host tier over a real redis-server; it
// skips without one, as internal/redistest does).
func TestTierTrace(t *testing.T) {
	tierTraces(t, makeTierTraces, "tier", "add", "reserve", "commit", "tier_copies", "complete", "drain_events", "cached_hashes",
		"tier copies", "events", "hashes", "host hits", "error Loading", "error BadArgument", "error OutOfPages")
}

// tierTraces makes the traces of mk without and with Redis, checks them
// against testdata/<prefix>_trace.json and <prefix>_redis_trace.json, and
// requires the coverage want (and remote hits with Redis).
func tierTraces(t *testing.T, mk func(*testing.T, bool) traceFile, prefix string, want ...string) {
	t.Run("host", func(t *testing.T) {
		f := mk(t, false)
		checkGolden(t, prefix+"_trace.json", f)
		checkCoverage(t, f, want...)
	})
	t.Run("redis", func(t *testing.T) {
		f := mk(t, true)
		checkGolden(t, prefix+"_redis_trace.json", f)
		checkCoverage(t, f, append(want, "remote hits")...)
	})
}
