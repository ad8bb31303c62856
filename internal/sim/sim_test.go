package sim

import (
	"errors"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/layout"
)

// smallConfig is DefaultConfig with a smaller model, so that tests run in
// seconds under -race.
func smallConfig() Config {
	cfg := DefaultConfig()
	cfg.Model = Model{Layers: 2, NumQOHeads: 4, NumKVHeads: 2, HeadDim: 16, DType: layout.F16, Seed: 5}
	cfg.VerifyEvery, cfg.VerifySamples = 2, 4
	return cfg
}

// smallWorkload is the default workload's shape, scaled down.
func smallWorkload(t *testing.T, n int) []Request {
	w := DefaultWorkloadConfig()
	w.Requests = n
	reqs, err := Workload(w)
	require.NoError(t, err)
	return reqs
}

func run(t *testing.T, cfg Config, reqs []Request) Summary {
	t.Helper()
	s, err := New(cfg, reqs)
	require.NoError(t, err)
	sum, err := s.Run()
	if err != nil {
		var b strings.Builder
		sum.Format(&b, &cfg)
		t.Fatalf("run failed: %v\n%s", err, b.String())
	}
	return sum
}

// TestTraceSummary runs testdata/traces/shared-prefix.jsonl (pages of 16
// tokens, a pool far larger than the trace) and checks the summary against
// what the trace implies, worked out by hand:
//
//	line  arrival  prompt                           matched at Add
//	1     0        sys[0:64] + 16 own               0   (nothing cached)
//	2     1        sys[0:64] + 6 own                64  (line 1's pages 0-3; at most (70-1)/16 = 4 pages)
//	3     2        sys[0:40] + 60 own               32  (pages 0-1; page 2 differs from token 40 on)
//	4     3        like line 1, namespace "other"   0   (namespaces never share)
//	5     4        sys[0:64]                        48  (at most (64-1)/16 = 3 pages: one token is left to compute)
//	6     5        tokens 101..120                  0
//	7     6        tokens 101..120, 3 samples       16  (line 6's page 0)
//	8     7        like line 4                      64  (line 4's pages, in "other")
//
// Each line's prefill finishes within its arrival step (the step budget is
// 256 tokens), so its pages are published before the next line arrives.
func TestTraceSummary(t *testing.T) {
	f, err := os.Open("../../testdata/traces/shared-prefix.jsonl")
	require.NoError(t, err)
	defer f.Close()
	reqs, err := ParseTrace(f)
	require.NoError(t, err)
	sum := run(t, smallConfig(), reqs)

	prompts := []int{80, 70, 100, 80, 64, 20, 20, 80}
	matched := []int{0, 64, 32, 0, 48, 0, 16, 64}
	outputs := []int{4, 4, 4, 4, 4, 2, 2, 4}
	samples := []int{1, 1, 1, 1, 1, 1, 3, 1}
	var promptTokens, hit, computed, out int
	for i := range prompts {
		promptTokens += prompts[i]
		hit += matched[i]
		out += samples[i] * outputs[i]
		// The prompt's unmatched tokens, then every branch computes the
		// K/V of each sampled token but its last.
		computed += prompts[i] - matched[i] + samples[i]*(outputs[i]-1)
	}
	assert.Equal(t, 8, sum.Requests)
	assert.Equal(t, 2, sum.Forks)
	assert.EqualValues(t, promptTokens, sum.PromptTokens)
	assert.EqualValues(t, out, sum.OutputTokens)
	st := sum.Stats
	assert.EqualValues(t, promptTokens, st.PromptTokens)
	assert.EqualValues(t, hit, st.PromptHitTokens, "prefix hit tokens")
	assert.InDelta(t, float64(224)/514, st.HitRate(), 1e-12)
	assert.EqualValues(t, computed, st.ComputedTokens)
	assert.Zero(t, st.Preemptions)
	assert.Zero(t, st.EvictedPages)
	// Line 7's three branches share its partial page 1 (tokens 16..19):
	// the first decode step copies it for two of them, the third writes
	// in place.
	assert.EqualValues(t, 2, st.CopiedPages)
	// Line 5 computes page 3 of sys (tokens 48..63), which line 1 had
	// published: a duplicate, kept private.
	assert.EqualValues(t, 1, st.DuplicatePages)
	assert.Zero(t, st.Requests, "every request released")
	assert.Equal(t, 0, st.UsedPages)
	assert.Greater(t, sum.Verified.Outputs, int64(0))
	assert.Greater(t, sum.Verified.KVTokens, int64(0))
	require.NoError(t, sum.Err)
}

// TestPressure runs a scaled-down default workload on a small pool: it must
// verify while evicting, preempting, copying on write and running cascade
// steps.
func TestPressure(t *testing.T) {
	cfg := smallConfig()
	cfg.NumPages = 40
	sum := run(t, cfg, smallWorkload(t, 24))
	st := sum.Stats
	var b strings.Builder
	sum.Format(&b, &cfg)
	t.Log("\n" + b.String())
	assert.Greater(t, st.PromptHitTokens, int64(0), "prefix hits")
	assert.Greater(t, st.EvictedPages, int64(0), "evictions")
	assert.Greater(t, st.Preemptions, int64(0), "preemptions")
	assert.Greater(t, st.ResumeHitTokens, int64(0), "resumed from the cache")
	assert.Greater(t, st.CopiedPages, int64(0), "copy-on-write")
	assert.Greater(t, sum.CascadeSteps(), 0, "cascade steps")
	assert.Greater(t, sum.CascadeSavedBytes(), int64(0))
	assert.Equal(t, cfg.NumPages, sum.PeakUsedPages, "the pool ran full")
	assert.Equal(t, sum.Steps/2, sum.Verified.Checks, "every second step checked")
}

// TestWindow runs with a sliding window shorter than most requests.
func TestWindow(t *testing.T) {
	cfg := smallConfig()
	cfg.NumPages, cfg.WindowTokens = 40, 40
	sum := run(t, cfg, smallWorkload(t, 16))
	assert.Greater(t, sum.Stats.WindowReleasedPages, int64(0))
	assert.Zero(t, sum.CascadeSteps(), "the Manager plans no cascade with a window")
	assert.Greater(t, sum.Verified.Outputs, int64(0))
}

func TestLayoutsAndDTypes(t *testing.T) {
	for _, tc := range []struct {
		kv layout.KVLayout
		dt layout.DType
	}{{layout.HND, layout.F16}, {layout.NHD, layout.BF16}, {layout.HND, layout.F32}} {
		cfg := smallConfig()
		cfg.KVLayout, cfg.Model.DType = tc.kv, tc.dt
		cfg.NumPages = 24
		w := DefaultWorkloadConfig()
		w.Requests, w.PrefixTokens, w.SuffixTokens, w.OutputTokens = 12, [2]int{16, 40}, [2]int{4, 16}, [2]int{4, 24}
		reqs, err := Workload(w)
		require.NoError(t, err)
		sum := run(t, cfg, reqs)
		assert.Greater(t, sum.Verified.Outputs, int64(0), "%v %v", tc.kv, tc.dt)
	}
}

// faultyBackend is the CPU backend with one deliberate bug.
type faultyBackend struct {
	kernels.Backend
	corruptAppend bool // flip a value of every append's first row in the cache
	ignoreWindow  bool // attend every key, whatever window_left says
	nonCausal     bool // prefill without the causal mask
	nanOutputs    bool // every attention output (and merged state) NaN
}

// nanFill overwrites every element of t with NaN.
func nanFill(t kernels.Tensor) {
	vals := make([]float32, t.NumElements())
	for i := range vals {
		vals[i] = float32(math.NaN())
	}
	layout.StoreRowF32(t.Data, t.DType, vals)
}

func (f *faultyBackend) MergeState(p *kernels.MergeStateParams) error {
	if err := f.Backend.MergeState(p); err != nil || !f.nanOutputs {
		return err
	}
	nanFill(p.V)
	return nil
}

func (f *faultyBackend) AppendPagedKVCache(p *kernels.AppendParams) error {
	if err := f.Backend.AppendPagedKVCache(p); err != nil || !f.corruptAppend {
		return err
	}
	page, entry, err := p.Table.Locate(int(p.BatchIndices[0]), int(p.Positions[0]), p.Cache.Geometry.PageSize)
	if err != nil {
		return err
	}
	g := p.Cache.Geometry
	off := g.KOffset(page, entry, 0, 3)
	layout.StoreF32(g.DType, p.Cache.KBuf(), int(off), layout.LoadF32(g.DType, p.Cache.KBuf(), int(off))+0.5)
	return nil
}

func (f *faultyBackend) BatchPrefill(p *kernels.PrefillParams) error {
	q := *p
	if f.ignoreWindow {
		q.WindowLeft = -1
	}
	if f.nonCausal {
		q.Causal = false
	}
	if err := f.Backend.BatchPrefill(&q); err != nil || !f.nanOutputs {
		return err
	}
	nanFill(q.O)
	return nil
}

func (f *faultyBackend) BatchDecode(p *kernels.DecodeParams) error {
	q := *p
	if f.ignoreWindow {
		q.WindowLeft = -1
	}
	if err := f.Backend.BatchDecode(&q); err != nil || !f.nanOutputs {
		return err
	}
	nanFill(q.O)
	return nil
}

// TestVerificationCatches: each deliberate backend bug ends the run with
// ErrVerify and a message that names what differed.
func TestVerificationCatches(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fault  faultyBackend
		window int
		want   string
	}{
		{"corrupted K", faultyBackend{corruptAppend: true}, 0, "paged K of token"},
		{"window ignored", faultyBackend{ignoreWindow: true}, 32, "dense float64 attention gives"},
		{"prefill not causal", faultyBackend{nonCausal: true}, 0, "dense float64 attention gives"},
		// NaN compares false with everything: a check written diff > tol
		// passed it (the audit saw 388 NaN outputs "verified").
		{"NaN outputs", faultyBackend{nanOutputs: true}, 0, "is NaN, dense float64 attention gives"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := smallConfig()
			cfg.WindowTokens = tc.window
			b := tc.fault
			b.Backend = cpu.New(cpu.Config{})
			cfg.Backend = &b
			cfg.VerifyEvery = 1
			s, err := New(cfg, smallWorkload(t, 16))
			require.NoError(t, err)
			sum, err := s.Run()
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrVerify), "want ErrVerify, got %v", err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Equal(t, err, sum.Err)
			var out strings.Builder
			sum.Format(&out, &cfg)
			assert.Contains(t, out.String(), "verification:  FAILED: ")
		})
	}
}

// TestVerificationCatchesMissingCopy: forked branches that append into
// their shared partial page without the plan's copy-on-write copy read a
// stale page.
func TestVerificationCatchesMissingCopy(t *testing.T) {
	cfg := smallConfig()
	cfg.VerifyEvery, cfg.VerifySamples = 1, 32
	prompt := PromptTokens("", 0, "fork", 20) // page 1 holds 4 tokens
	reqs := []Request{
		{Name: "filler", Prompt: PromptTokens("", 0, "filler", 64), Output: 2, Samples: 1}, // leaves stale K/V in the pool
		{Name: "forked", Arrival: 2, Prompt: prompt, Output: 6, Samples: 3},
	}
	s, err := New(cfg, reqs)
	require.NoError(t, err)
	s.eng.skipCopies = true
	sum, err := s.Run()
	require.ErrorIs(t, err, ErrVerify)
	assert.Contains(t, err.Error(), "request forked")
	assert.Positive(t, sum.Stats.CopiedPages)

	s, err = New(cfg, reqs) // with the copies it verifies
	require.NoError(t, err)
	_, err = s.Run()
	require.NoError(t, err)
}

// A request that alone needs more pages than the pool holds, with full
// attention, is a configuration that can never run: New refuses it with
// the numbers, before any step (pagedkv simulate exits 2).
func TestRequestLargerThanThePoolIsABadConfig(t *testing.T) {
	cfg := smallConfig()
	cfg.NumPages = 8 // 128 tokens
	reqs := []Request{{Name: "long", Prompt: PromptTokens("", 0, "long", 200), Output: 1, Samples: 1}}
	_, err := New(cfg, reqs)
	require.ErrorIs(t, err, ErrBadConfig)
	assert.EqualError(t, err, "sim: bad config: long can never run: its 200 tokens (prompt 200 + output 1 - 1) need at least 13 pages of 16 tokens, and the pool has 8")
	// One token less than the pool: accepted (the bound is a lower bound,
	// never a refusal of a run that fits).
	reqs[0].Prompt = PromptTokens("", 0, "long", 128)
	_, err = New(cfg, reqs)
	require.NoError(t, err)
}

// A run that has no static bound (a sliding window) and still cannot hold
// a request stops with ErrStuck.
func TestStuck(t *testing.T) {
	cfg := smallConfig()
	cfg.NumPages = 8 // 128 tokens
	cfg.WindowTokens = 1000
	reqs := []Request{{Name: "long", Prompt: PromptTokens("", 0, "long", 200), Output: 1, Samples: 1}}
	s, err := New(cfg, reqs)
	require.NoError(t, err)
	_, err = s.Run()
	require.ErrorIs(t, err, ErrStuck)
	assert.Contains(t, err.Error(), "long alone needs more pages than the pool of 8 has")
}

func TestConfigValidate(t *testing.T) {
	for _, bad := range []func(*Config){
		func(c *Config) { c.MaxRunning = 0 },
		func(c *Config) { c.MaxStepTokens = c.MaxRunning - 1 },
		func(c *Config) { c.VerifyEvery = 0 },
		func(c *Config) { c.VerifySamples = 0 },
		func(c *Config) { c.Model.HeadDim = 0 },
		func(c *Config) { c.NumPages = 0 }, // the Manager's check
	} {
		cfg := DefaultConfig()
		bad(&cfg)
		_, err := New(cfg, smallWorkload(t, 1))
		assert.ErrorIs(t, err, ErrBadConfig, "%+v", cfg)
	}
}
