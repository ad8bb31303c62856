package sim

import (
	"errors"
	"math/rand/v2"
	"testing"

	pagedkv "github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/internal/invariants"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mlaConfig is the deepseek-v3.2-like preset on a pool small enough for
// preemption and eviction, with a host tier (hostPages, 0: none).
func mlaConfig(t *testing.T, hostPages int) Config {
	t.Helper()
	cfg := hybridConfig(t, "deepseek-v3.2-like")
	cfg.NumPages, cfg.VerifyEvery, cfg.VerifySamples = 20, 2, 4
	cfg.MaxStepTokens, cfg.MaxRunning = 96, 8
	cfg.HostPages = hostPages
	return cfg
}

// TestSimulateMLAIndexer runs the deepseek-v3.2-like preset (an MLA group
// and its indexer group) with shared prefixes, forks, preemption, eviction
// and, in the host case, host-tier round trips: MLA outputs of requests
// admitted on a prefix hit are verified against float64 MLA, and every
// step reads every indexer entry back through the MLA pages. The same run
// with the engine leaving the indexer pages out of its copy-on-write copies
// (device) or out of its host round trips (host: SGLang #38031) fails
// verification on an indexer entry.
func TestSimulateMLAIndexer(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		host int
	}{{"device", 0}, {"host", 32}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cfg := mlaConfig(t, c.host)
			reqs := stateWorkload(t, 24)
			sum := run(t, cfg, reqs)
			st := sum.Stats
			assert.Positive(t, st.PromptHitTokens+st.ResumeHitTokens, "prefix hits")
			assert.Positive(t, st.Preemptions, "preemptions")
			assert.Positive(t, st.EvictedPages, "evictions")
			v := sum.Verified
			assert.Positive(t, v.MLAOutputs)
			assert.Equal(t, v.Outputs, v.MLAOutputs, "every verified output is an MLA output")
			assert.Positive(t, v.HitOutputs, "MLA outputs of requests admitted on a prefix hit")
			assert.Positive(t, v.IndexerTokens)
			require.Len(t, sum.Groups, 2)
			assert.Equal(t, pagedkv.IndexerAttention, sum.Groups[1].Spec.Kind)
			if c.host > 0 {
				assert.Positive(t, st.Tiers.OnloadedPages, "host round trips")
			} else {
				assert.Positive(t, st.CopiedPages, "copy-on-write copies")
			}
			t.Logf("%d hit tokens, %d preemptions, %d evicted, %d copied, %d onloaded; %d MLA outputs (%d after a hit), %d indexer entries",
				st.PromptHitTokens+st.ResumeHitTokens, st.Preemptions, st.EvictedPages, st.CopiedPages, st.Tiers.OnloadedPages,
				v.MLAOutputs, v.HitOutputs, v.IndexerTokens)

			s, err := New(cfg, reqs)
			require.NoError(t, err)
			if c.host > 0 {
				s.eng.mla.skipIndexerTier = true
			} else {
				s.eng.mla.skipIndexerCopies = true
			}
			sum, err = s.Run()
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrVerify), "%v", err)
			assert.Contains(t, err.Error(), "indexer entry")
			assert.Equal(t, err, sum.Err)
		})
	}
}

// TestSimulateMLADrafts: speculative steps on the deepseek-v3.2-like
// preset: draft rows are MLA decodes over the tokens up to them, verified
// like the others, and the indexer entries of rejected drafts are
// overwritten before any step reads them.
func TestSimulateMLADrafts(t *testing.T) {
	t.Parallel()
	cfg := mlaConfig(t, 0)
	cfg.SpecTokens = 3
	sum := run(t, cfg, stateWorkload(t, 12))
	assert.Positive(t, sum.Verified.DraftOutputs)
	assert.Positive(t, sum.Stats.AcceptedDraftTokens)
	assert.Less(t, sum.Stats.AcceptedDraftTokens, sum.Stats.DraftTokens)
	assert.Positive(t, sum.Verified.IndexerTokens)
}

// TestMLAModelRefused: the MLA path keeps the model dtype and takes no
// sinks.
func TestMLAModelRefused(t *testing.T) {
	t.Parallel()
	for name, edit := range map[string]func(*Config){
		"sinks": func(c *Config) { c.Model.Sinks = true },
		"mixed": func(c *Config) {
			c.Groups = append([]pagedkv.LayerGroup{{Kind: pagedkv.FullAttention, NumLayers: 2}}, c.Groups...)
			c.Groups[2].Target = 1
			c.Model.Layers = 6
		},
	} {
		cfg := mlaConfig(t, 0)
		edit(&cfg)
		_, err := New(cfg, stateWorkload(t, 2))
		require.Error(t, err, name)
		assert.True(t, errors.Is(err, ErrBadConfig), "%s: %v", name, err)
		t.Logf("%s: %v", name, err)
	}
}

// decodeMLARun is decodeRun's model, Manager settings and workload on the
// deepseek-v3.2-like groups (MLA and its indexer, the model's layers in
// each), 0-3 draft tokens per decode step, and in half the runs a host
// tier of 4-24 pages.
func decodeMLARun(data []byte) (Config, []Request) {
	r := byteReader(data)
	spec, host := r.next()%4, r.next()%12
	cfg, reqs := decodeRun(r)
	if host >= 6 {
		cfg.HostPages = 4 * (host - 5)
	}
	p, err := Preset("deepseek-v3.2-like")
	if err != nil {
		panic(err)
	}
	cfg.Groups, err = p.Groups(2 * cfg.Model.Layers)
	if err != nil {
		panic(err)
	}
	cfg.Model.Layers *= 2
	cfg.WindowTokens, cfg.SpecTokens = 0, spec
	return cfg, reqs
}

// FuzzSimulateMLA runs tiny deepseek-v3.2-like simulations built from the
// input: an MLA output off float64 MLA, a paged ckv/kpe row or an indexer
// entry that is not its token's, or indexer pages that are not the MLA
// pages, fails.
func FuzzSimulateMLA(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 9, 0, 1, 5, 2, 1, 3, 2, 0, 1, 0, 1, 3, 2, 0, 10, 1, 7, 20, 8, 12, 0, 3, 1, 0, 5, 0, 2, 5, 1, 1, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, reqs := decodeMLARun(data)
		checkRun(t, cfg, reqs)
	})
}

// TestRandomMLARuns is FuzzSimulateMLA's randomized twin: every run
// verifies, and the runs as a whole evict, preempt, hit the cache, accept
// drafts, copy forks' partial pages and offload to the host tier.
func TestRandomMLARuns(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(38, 32))
	runs := 60
	if testing.Short() || invariants.Enabled { // -race
		runs = 40
	}
	var preempted, evicted, hits, accepted, copied, offloaded, indexed int64
	for range runs {
		cfg, reqs := decodeMLARun(randomBytes(rng, 128))
		sum := checkRun(t, cfg, reqs)
		st := sum.Stats
		preempted += st.Preemptions
		evicted += st.EvictedPages
		hits += st.PromptHitTokens
		accepted += st.AcceptedDraftTokens
		copied += st.CopiedPages
		offloaded += st.Tiers.OffloadedPages
		indexed += sum.Verified.IndexerTokens
	}
	for name, n := range map[string]int64{"preemptions": preempted, "evictions": evicted, "prefix hits": hits,
		"accepted drafts": accepted, "copies": copied, "offloads to the host tier": offloaded, "indexer read-backs": indexed} {
		if n == 0 {
			t.Errorf("%d random runs had no %s", runs, name)
		}
	}
}
