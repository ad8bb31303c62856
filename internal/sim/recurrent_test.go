package sim

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stateConfig is a state-group preset on a model whose 16-token pages
// (2 kv heads x 64 dims x f16: 8 KiB per layer) hold the preset's states,
// with a pool small enough for preemption and checkpoint eviction.
func stateConfig(t *testing.T, name string) Config {
	t.Helper()
	cfg := hybridConfig(t, name)
	cfg.Model.NumQOHeads, cfg.Model.NumKVHeads, cfg.Model.HeadDim = 2, 2, 64
	cfg.NumPages, cfg.VerifyEvery, cfg.VerifySamples = 40, 2, 4
	cfg.MaxStepTokens, cfg.MaxRunning = 96, 8
	return cfg
}

// stateWorkload is requests sharing a few system prompts, with forks.
func stateWorkload(t *testing.T, n int) []Request {
	t.Helper()
	w := DefaultWorkloadConfig()
	w.Requests, w.Prefixes, w.PrefixTokens = n, 2, [2]int{40, 70}
	w.SuffixTokens, w.OutputTokens = [2]int{8, 40}, [2]int{2, 10}
	w.ArrivalsPerStep = 2
	reqs, err := Workload(w)
	require.NoError(t, err)
	return reqs
}

// TestSimulateStateRestore runs the state-group presets with shared
// prefixes, forks, preemption and checkpoint eviction: requests resume from state checkpoints
// (hits > 0), and every sampled recurrent output, those after a restore
// included, equals recomputing the request from token 0 bit for bit. The
// same run with the engine skipping the state groups' copies (a restore
// that reads a fresh slot instead of the checkpoint, or a chunk that
// continues after a published checkpoint from a fresh slot) fails
// verification.
func TestSimulateStateRestore(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"qwen3-next-like", "nemotron-h-like"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := stateConfig(t, name)
			n := 12
			if name == "nemotron-h-like" {
				n = 8
			}
			reqs := stateWorkload(t, n)
			sum := run(t, cfg, reqs)
			assert.Positive(t, sum.StateHits, "admissions resumed from a state checkpoint")
			assert.Positive(t, sum.StateHitTokens)
			assert.Positive(t, sum.Verified.RestoredOutputs, "recurrent outputs verified after a restore")
			assert.Positive(t, sum.Stats.Preemptions, "preemptions")
			assert.Positive(t, sum.Groups[0].Stats.EvictedPages, "state checkpoints evicted")
			t.Logf("%d restores (%d tokens), %d state outputs (%d after a restore), %d preemptions",
				sum.StateHits, sum.StateHitTokens, sum.Verified.StateOutputs, sum.Verified.RestoredOutputs, sum.Stats.Preemptions)

			s, err := New(cfg, reqs)
			require.NoError(t, err)
			s.eng.skipStateCopies = true
			sum, err = s.Run()
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrVerify), "%v", err)
			assert.Contains(t, err.Error(), "recurrent output")
			assert.Equal(t, err, sum.Err)
		})
	}
}

// TestStateModelRefused: the recurrent layer's state must fit where the
// engine keeps it, and drafts cannot be rolled back.
func TestStateModelRefused(t *testing.T) {
	t.Parallel()
	reqs := stateWorkload(t, 2)
	for name, edit := range map[string]func(*Config){
		"head dim 8":  func(c *Config) { c.Model.HeadDim = 8 },
		"spec tokens": func(c *Config) { c.SpecTokens = 2 },
		"small pages": func(c *Config) { c.PageSize = 4 },
	} {
		cfg := stateConfig(t, "qwen3-next-like")
		edit(&cfg)
		_, err := New(cfg, reqs)
		require.Error(t, err, name)
		assert.True(t, errors.Is(err, ErrBadConfig), "%s: %v", name, err)
		t.Logf("%s: %v", name, err)
	}
}
