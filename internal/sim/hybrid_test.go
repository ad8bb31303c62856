package sim

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pagedkv "github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/internal/vllmwire"
)

// hybridConfig is smallConfig with preset name's groups, two samples per
// group verified every step.
func hybridConfig(t *testing.T, name string) Config {
	t.Helper()
	p, err := Preset(name)
	require.NoError(t, err)
	cfg := smallConfig()
	cfg.Model.Layers = p.Layers
	cfg.Model.Sinks = p.Sinks
	cfg.Groups, err = p.Groups(p.Layers)
	require.NoError(t, err)
	cfg.VerifyEvery, cfg.VerifySamples = 1, 2
	return cfg
}

// smallHybridConfig is hybridConfig of name's preset on a 64-page pool,
// verified every 4 steps; a name ending in "/host" adds a 32-page host
// tier.
func smallHybridConfig(t *testing.T, name string) Config {
	t.Helper()
	preset, host := strings.CutSuffix(name, "/host")
	cfg := hybridConfig(t, preset)
	cfg.NumPages, cfg.VerifyEvery = 64, 4
	if host {
		cfg.HostPages = 32
	}
	return cfg
}

// TestHybridPresets runs each hybrid preset with drafts on a pool small
// enough for eviction and preemption: every group's outputs are verified
// against dense attention under its own window or chunk, and the
// per-group numbers agree with each other and with the pool's (the sum of
// the groups' held pages equals the pool's pages in use is checked by the
// run itself, every step).
func TestHybridPresets(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"gpt-oss-like", "gemma-3-like", "llama-4-like"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := hybridConfig(t, name)
			cfg.SpecTokens = 3
			cfg.NumPages, cfg.VerifyEvery = 64, 2
			sum := run(t, cfg, smallWorkload(t, 8))
			st := sum.Stats
			require.Len(t, sum.Groups, len(cfg.Groups))
			assert.Positive(t, st.Preemptions, "the small pool preempts")
			assert.Positive(t, st.EvictedPages, "the small pool evicts")
			assert.Positive(t, st.AcceptedDraftTokens)
			assert.Less(t, st.AcceptedDraftTokens, st.DraftTokens)
			assert.Positive(t, sum.Verified.DraftOutputs)
			hits := st.PromptHitTokens + st.ResumeHitTokens
			assert.Positive(t, hits)
			full := sum.Groups[len(sum.Groups)-1]
			require.Equal(t, pagedkv.FullAttention, full.Spec.Kind)
			assert.Zero(t, full.Stats.WindowReleasedPages)
			var outputs int64
			for g, gs := range sum.Groups {
				assert.Equal(t, cfg.Groups[g], gs.Spec)
				assert.Positive(t, gs.Outputs, "group %d verified", g)
				outputs += gs.Outputs
				// The hit every group could serve is never longer than
				// what one group's cache could.
				assert.GreaterOrEqual(t, gs.Stats.ServableTokens, hits, "group %d", g)
				assert.LessOrEqual(t, gs.PeakPages, sum.PeakUsedPages)
				if gs.Spec.Kind != pagedkv.FullAttention {
					assert.Positive(t, gs.Stats.WindowReleasedPages, "group %d releases", g)
					assert.Less(t, gs.PeakPages, full.PeakPages, "group %d holds fewer pages than the full group", g)
					assert.Less(t, gs.MeanPages(sum.Steps), full.MeanPages(sum.Steps), "group %d", g)
				}
			}
			assert.Equal(t, sum.Verified.Outputs, outputs)

			var b strings.Builder
			sum.Format(&b, &cfg)
			out := b.String()
			assert.Contains(t, out, "layer groups:")
			assert.Contains(t, out, "group 0:")
			assert.Contains(t, out, "speculative:")
			assert.Contains(t, out, "verification:  passed")
		})
	}
}

// TestHybridVerificationFails proves the per-group check can fail: an
// engine that attends every group with window_left -1 over its append
// table (dropping the sliding group's window and the chunked group's
// per-chunk entries) is caught by the dense comparison of that group, on
// a run that passes without the fault.
func TestHybridVerificationFails(t *testing.T) {
	t.Parallel()
	for name, tag := range map[string]string{"gpt-oss-like": "(sliding 128)", "llama-4-like": "(chunked 128)"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := hybridConfig(t, name)
			cfg.NumPages, cfg.VerifySamples = 256, 8
			// Prompts of 100-270 tokens: prefill rows past the first
			// chunk's end, which must not see the first chunk.
			w := DefaultWorkloadConfig()
			w.Requests, w.SuffixTokens, w.OutputTokens = 3, [2]int{36, 160}, [2]int{4, 8}
			reqs, err := Workload(w)
			require.NoError(t, err)
			run(t, cfg, reqs) // passes as it is
			s, err := New(cfg, reqs)
			require.NoError(t, err)
			s.eng.ignoreWindows = true
			sum, err := s.Run()
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrVerify), "%v", err)
			assert.Contains(t, err.Error(), tag)
			assert.Equal(t, err, sum.Err)
			t.Log(err)
		})
	}
}

func TestPresets(t *testing.T) {
	for _, name := range ModelNames() {
		p, err := Preset(name)
		require.NoError(t, err)
		groups, err := p.Groups(p.Layers)
		require.NoError(t, err)
		if name == "dense" {
			assert.Nil(t, groups)
			continue
		}
		_, err = pagedkv.NewHybrid(pagedkv.HybridConfig{Config: pagedkv.Config{NumPages: 16, PageSize: DefaultConfig().PageSize}, Groups: groups})
		require.NoError(t, err, name)
		_, err = p.Groups(p.Layers + 1)
		assert.ErrorIs(t, err, ErrBadConfig)
	}
	_, err := Preset("nope")
	require.ErrorIs(t, err, ErrUnknownModel)
	for _, name := range ModelNames() {
		assert.Contains(t, err.Error(), name)
	}
	_, err = Preset("mla")
	require.ErrorIs(t, err, ErrNotSimulated)
	assert.Contains(t, err.Error(), "MLA")
}

// TestHybridEvents runs each hybrid preset with KV events (a Recorder of
// RecorderConfig, drained after every step as vLLM's strict decoder reads
// it): every event decodes, every BlockStored and BlockRemoved carries its
// group's group_idx and BlockStored its group's spec, each group's
// reconstructed set is a consistent stream whose size is the group's
// cached pages at the end, and the Recorder's per-group counts are the
// events and pages seen. With a host tier ("/host" runs) each group also
// announces its host pages (medium "CPU", its group_idx and spec), a
// consistent stream per group and medium that ends with the host tier's
// pages in use. An indexer group (deepseek-v3.2-like) announces nothing:
// its MLA group's events carry its pages.
func TestHybridEvents(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"gpt-oss-like", "gemma-3-like", "llama-4-like", "gpt-oss-like/host", "llama-4-like/host", "deepseek-v3.2-like", "deepseek-v3.2-like/host"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg, host := smallHybridConfig(t, name), strings.HasSuffix(name, "/host")
			q, err := events.NewQueue(4)
			require.NoError(t, err)
			rec, err := events.NewRecorder(RecorderConfig(&cfg), q)
			require.NoError(t, err)
			cfg.Events = rec
			enc := events.NewEncoder()
			sets := vllmwire.GroupMedia{}
			seen := make([]events.GroupStats, len(cfg.Groups))
			hostSeen := make([]int, len(cfg.Groups))
			var decodeErr error
			cfg.Progress = func(Progress) {
				for b := q.TryNext(); b != nil && decodeErr == nil; b = q.TryNext() {
					dec, err := vllmwire.Decode(enc.AppendBatch(nil, b, 0))
					q.Done(b)
					if err == nil {
						err = sets.Apply(dec)
					}
					for i := range dec.Events {
						e := &dec.Events[i]
						if err != nil || e.Type == "AllBlocksCleared" {
							continue
						}
						g := int(*e.GroupIdx) // Apply checked it is there
						if g < 0 || g >= len(cfg.Groups) {
							err = fmt.Errorf("event %d: group_idx %d of %d groups", i, g, len(cfg.Groups))
							break
						}
						kind, window := pagedkv.KVEventSpec(cfg.Groups[g])
						if e.Medium == nil || *e.Medium != events.MediumGPU {
							if !host || *e.Medium != events.MediumCPU {
								err = fmt.Errorf("event %d of group %d: medium %v", i, g, e.Medium)
								break
							}
							if e.Type == "BlockRemoved" {
								seen[g].HostRemoved++
								seen[g].HostRemovedPages += int64(len(e.BlockHashes))
							}
							if e.Type == "BlockStored" {
								hostSeen[g] += len(e.BlockHashes)
								seen[g].HostStored++
								seen[g].HostStoredPages += int64(len(e.BlockHashes))
								if e.SpecKind == nil || *e.SpecKind != kind {
									err = fmt.Errorf("event %d of group %d (CPU): spec %v, want %q", i, g, e.SpecKind, kind)
								}
							}
							continue
						}
						switch e.Type {
						case "BlockStored":
							seen[g].Stored++
							seen[g].StoredPages += int64(len(e.BlockHashes))
							if e.SpecKind == nil || *e.SpecKind != kind || (window == 0) != (e.SlidingWindow == nil) ||
								(window != 0 && *e.SlidingWindow != int64(window)) {
								err = fmt.Errorf("event %d of group %d: spec %v window %v, want %q %d", i, g, e.SpecKind, e.SlidingWindow, kind, window)
							}
						case "BlockRemoved":
							seen[g].Removed++
							seen[g].RemovedPages += int64(len(e.BlockHashes))
						}
					}
					decodeErr = err
				}
			}
			sum := run(t, cfg, smallWorkload(t, 8))
			require.NoError(t, decodeErr)
			assert.Zero(t, rec.Stats().DroppedSteps)
			cpu := 0
			for g := range sum.Groups {
				cpu += len(sets[int64(g)]["CPU"])
			}
			assert.Equal(t, sum.Stats.Tiers.HostUsedPages-sum.Stats.Tiers.InFlight, cpu, "CPU pages announced and host pages in use (less copies in flight)")
			for g, gs := range sum.Groups {
				if !gs.Spec.OwnsPages() { // an indexer: announced by its MLA group
					assert.Empty(t, sets[int64(g)], "group %d", g)
					continue
				}
				assert.Len(t, sets[int64(g)]["GPU"], gs.Stats.CachedPages, "group %d: reconstructed set and cached pages", g)
				if host {
					assert.Positive(t, hostSeen[g], "group %d announced no host page", g)
				} else {
					assert.Empty(t, sets[int64(g)]["CPU"], "group %d", g)
				}
				assert.Equal(t, gs.Stats.PublishedPages, seen[g].StoredPages, "group %d", g)
				assert.Positive(t, seen[g].Stored, "group %d", g)
				assert.Equal(t, seen[g], rec.GroupStats(g), "group %d", g)
			}
		})
	}
}

// TestHybridConfigBad: the features the simulator does not combine with
// layer groups are config errors naming them.
func TestHybridConfigBad(t *testing.T) {
	for want, edit := range map[string]func(*Config){
		"window": func(c *Config) { c.WindowTokens = 32 },
		// A Recorder without one group per layer group.
		"GroupEventSink": func(c *Config) { c.Events = &events.Recorder{} },
		"groups have":    func(c *Config) { c.Model.Layers = 8 },
	} {
		cfg := hybridConfig(t, "gpt-oss-like")
		edit(&cfg)
		_, err := New(cfg, smallWorkload(t, 2))
		require.ErrorIs(t, err, ErrBadConfig, want)
		assert.Contains(t, err.Error(), want)
	}
}

// TestSinksVerificationFails: the gpt-oss-like preset attends with its
// sinks and the dense check includes them, so an engine that drops the
// sinks (FlashInfer accepting sinks and ignoring them, vLLM PR #52148) or
// counts them twice fails verification on a run that passes as it is.
func TestSinksVerificationFails(t *testing.T) {
	t.Parallel()
	cfg := hybridConfig(t, "gpt-oss-like")
	require.True(t, cfg.Model.Sinks)
	reqs := smallWorkload(t, 4)
	run(t, cfg, reqs) // passes as it is
	for name, fault := range map[string]func(e *engine){
		"dropped": func(e *engine) { e.sinks = nil },
		"twice": func(e *engine) { // e^(s+ln 2) = 2 e^s
			for h := range e.sinks {
				e.sinks[h] += math.Ln2
			}
		},
	} {
		s, err := New(cfg, reqs)
		require.NoError(t, err)
		fault(s.eng)
		_, err = s.Run()
		require.ErrorIs(t, err, ErrVerify, name)
		t.Logf("%s: %v", name, err)
	}
}
