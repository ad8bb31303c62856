package main

import (
	"math/rand/v2"
	"testing"

	"github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/layergroup"
)

// TestStateTrace is TestHybridTrace for the group kinds of 2026 (state,
// indexer and shared-KV groups; docs/state-groups.md,
// docs/indexer-shared-kv.md) into testdata/state_trace.json, which
// python/tests/test_state_trace.py replays: every step's group plans with
// each state group's state_indices and copies, next_state_checkpoint
// results, GroupStats and the KV events (the checkpoints' "mamba"
// blocks) byte for byte. In a model with state groups every hit is a
// checkpoint hit, and the "state copies" are the copies of a frozen slot
// (a checkpoint or a fork's) into a fresh one.
func TestStateTrace(t *testing.T) {
	f := makeStateTraces(t)
	checkGolden(t, "state_trace.json", f)
	checkCoverage(t, f, "add", "reserve", "commit", "abort", "fork", "release", "preempt", "resume", "extend",
		"evict", "copies", "error OutOfPages", "error BadArgument", "error UnknownRequest", "truncate", "pin", "unpin",
		"drain_events", "events", "next_state_checkpoint", "state indices", "state copies", "hits")
}

// stateTraceConfigs: a Qwen3-Next-like model (3 Gated-DeltaNet-like state
// groups : 1 full, with shared-KV layers on the full group, a checkpoint
// every 8 tokens) and one of every kind (state groups between a full and
// an MLA group, a DeepSeek-V3.2-like indexer on the MLA group, shared-KV
// layers on both; prompt ends only).
func stateTraceConfigs() []struct {
	name string
	cfg  pagedkv.HybridConfig
} {
	st := pagedkv.LayerGroup{Kind: pagedkv.StateLayers, NumLayers: 1, State: layergroup.StateShape{
		ConvShape: [2]int{8, 3}, ConvDType: layergroup.StateBF16, SSMShape: [3]int{2, 4, 8}, SSMDType: layergroup.StateF32, PageBytes: 4096}}
	full := pagedkv.LayerGroup{Kind: pagedkv.FullAttention, NumLayers: 1}
	mla := pagedkv.LayerGroup{Kind: pagedkv.MLAAttention, NumLayers: 1}
	shared := func(target int) pagedkv.LayerGroup {
		return pagedkv.LayerGroup{Kind: pagedkv.SharedKVAttention, Target: target, NumLayers: 2}
	}
	idx := pagedkv.LayerGroup{Kind: pagedkv.IndexerAttention, Target: 3, NumLayers: 1, IndexerHeadDim: 128, IndexerQuantBlock: 64}
	return []struct {
		name string
		cfg  pagedkv.HybridConfig
	}{
		{"qwen3-next-like: 3 state : 1 full, shared-KV", pagedkv.HybridConfig{
			Config: pagedkv.Config{NumPages: 96, PageSize: 4, HashSeed: 17, CascadeMinSavedPages: 2},
			Groups: []pagedkv.LayerGroup{st, st, st, full, shared(3)}, StateCheckpointEvery: 8}},
		{"every kind: state, full, mla, indexer, shared-KV", pagedkv.HybridConfig{
			Config: pagedkv.Config{NumPages: 80, PageSize: 4, HashSeed: 19, Priorities: 2},
			Groups: []pagedkv.LayerGroup{st, full, st, mla, st, shared(1), idx, shared(3)}}},
	}
}

func makeStateTraces(t testing.TB) traceFile {
	var f traceFile
	for i, c := range stateTraceConfigs() {
		rec, q, err := newRecorder(recorderConfig(c.cfg.Config, c.cfg.Groups), DefaultEventBatches)
		if err != nil {
			t.Fatal(err)
		}
		cfg := c.cfg
		cfg.CacheEvents = rec
		m, err := pagedkv.NewHybrid(cfg)
		if err != nil {
			t.Fatal(err)
		}
		g := &traceGen{t: t, m: m, hybrid: m, rng: rand.New(rand.NewPCG(uint64(i), 31)), promptScale: 1, maxChunk: 12,
			rec: rec, evq: q, enc: events.NewEncoder(), stateCut: true}
		g.run(500)
		tr := trace{Name: c.name, Ops: g.ops, Events: true, Config: map[string]int64{
			"num_pages": int64(c.cfg.NumPages), "page_size": int64(c.cfg.PageSize), "priorities": int64(c.cfg.Priorities),
			"hash_seed": int64(c.cfg.HashSeed), "cascade_min_saved_pages": int64(c.cfg.CascadeMinSavedPages),
			"state_checkpoint_every": int64(c.cfg.StateCheckpointEvery),
		}}
		for _, gr := range c.cfg.Groups {
			s := gr.State
			tr.Groups = append(tr.Groups, map[string]int64{"kind": int64(gr.Kind), "window_tokens": int64(gr.WindowTokens),
				"chunk_tokens": int64(gr.ChunkTokens), "num_layers": int64(gr.NumLayers), "target": int64(gr.Target),
				"indexer_head_dim": int64(gr.IndexerHeadDim), "indexer_quant_block": int64(gr.IndexerQuantBlock),
				"conv_shape0": int64(s.ConvShape[0]), "conv_shape1": int64(s.ConvShape[1]), "conv_dtype": int64(s.ConvDType),
				"ssm_shape0": int64(s.SSMShape[0]), "ssm_shape1": int64(s.SSMShape[1]), "ssm_shape2": int64(s.SSMShape[2]),
				"ssm_dtype": int64(s.SSMDType), "page_bytes": int64(s.PageBytes)})
		}
		f.Traces = append(f.Traces, tr)
	}
	return f
}

// cutAtCheckpoint ends request id's chunk of n tokens at its next state
// checkpoint, most of the time (as an engine does so that the state there
// is published), recording the next_state_checkpoint call.
func (g *traceGen) cutAtCheckpoint(id uint64, n int) int {
	if g.rng.IntN(5) == 0 {
		return n
	}
	r := pagedkv.RequestID(id)
	next := g.hybrid.NextStateCheckpoint(r)
	if next == 0 { // none left (decoding): not recorded, there are many
		return n
	}
	g.record(traceOp{Op: "next_state_checkpoint", ID: id}, int64(next), nil)
	return min(n, next-g.m.Computed(r))
}
