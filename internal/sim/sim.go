package sim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	pagedkv "github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/tier"
)

// ErrBadConfig is wrapped by invalid [Config] and [WorkloadConfig] errors.
var ErrBadConfig = errors.New("sim: bad config")

// ErrStuck is returned when the pool cannot hold a request on its own, or
// the run makes no progress within Config.MaxSteps.
var ErrStuck = errors.New("sim: cannot make progress")

// Config describes a simulation.
type Config struct {
	Model Model
	// KVLayout is the cache layout (NHD or HND).
	KVLayout layout.KVLayout
	// PageSize, NumPages, WindowTokens and CascadeMinSavedPages configure
	// the Manager (see pagedkv.Config).
	PageSize, NumPages, WindowTokens, CascadeMinSavedPages int
	// MaxStepTokens is the step's token budget: decode tokens first, then
	// prefill chunks (chunked prefill). MaxRunning caps running requests.
	MaxStepTokens, MaxRunning int
	// VerifyEvery: every this many steps, VerifySamples outputs
	// (request, layer, head, query row) and the paged K/V of their
	// requests are checked against the dense model, and the Manager is
	// audited. Must be >= 1.
	VerifyEvery, VerifySamples int
	// Seed chooses the verified samples.
	Seed uint64
	// Backend runs append and attention; nil means kernels/cpu.
	Backend kernels.Backend
	// MaxSteps bounds the run (0 means 1,000,000).
	MaxSteps int
	// HostPages is the size of the host tier below the pool (0: none).
	// Evicted prefix pages are offloaded to it and prefix hits on it are
	// onloaded; the engine runs the tier copies on the CPU at the start of
	// the step after the one that planned them (asynchronous by a step).
	HostPages int
	// Remote is a remote store shared with other Managers (needs
	// HostPages); nil means none.
	Remote tier.RemoteStore
	// RemoteDeadline bounds each remote lookup (0: the Manager's default).
	RemoteDeadline time.Duration
	// Progress, when not nil, is called after every step.
	Progress func(Progress)
	// SpecTokens is the draft tokens each decoding request proposes per
	// step (speculative decoding; 0: off, at most MaxSpecTokens). Drafts
	// come from Model.Draft; the longest prefix equal to Model.Sample's
	// tokens is accepted, then one token is sampled after it.
	SpecTokens int
	// Groups, when not nil, makes the model hybrid: its layer groups (see
	// [ModelPreset.Groups]), driven by a pagedkv.HybridManager, each group
	// verified under its own attention. Model.Layers must be their layers
	// together; WindowTokens and tiers must be off, Backend a host
	// backend, and Events, if set, a Recorder of one group per layer group.
	Groups []pagedkv.LayerGroup
	// Eviction names the prefix cache's eviction policy
	// (pagedkv.Config.Eviction; "" is LRU).
	Eviction string
	// CurveRate keeps the live miss-ratio curve at that sampling rate
	// (pagedkv.Config.MissRatioSampling; 0: none).
	CurveRate float64
	// Events, when not nil, records the Manager's prefix-cache changes
	// (pagedkv.Config.CacheEvents) and is flushed after every step: one
	// KV-event batch per step. Build it with [RecorderConfig]: with Groups,
	// it needs one group per layer group (group g's events carry group_idx
	// g); the HybridManager refuses another.
	Events *events.Recorder
}

// DefaultConfig is the configuration `pagedkv simulate` runs: a small
// model (4 layers, 8 query heads, 2 kv heads, head dim 64, f16, pages of
// 16 tokens) on a pool of 128 pages, too small for the default workload's
// peak, so that eviction and preemption happen.
func DefaultConfig() Config {
	return Config{
		Model:         Model{Layers: 4, NumQOHeads: 8, NumKVHeads: 2, HeadDim: 64, DType: layout.F16, Seed: 1},
		KVLayout:      layout.NHD,
		PageSize:      16,
		NumPages:      128,
		MaxStepTokens: 256,
		MaxRunning:    32,
		VerifyEvery:   4,
		VerifySamples: 8,
		Seed:          1,
	}
}

// MaxCacheBytes bounds the K/V caches of every layer together: a
// configuration past it (a mistyped --pages or --head-dim) fails fast with
// ErrBadConfig instead of running out of memory.
const MaxCacheBytes = 8 << 30

// MaxSpecTokens bounds Config.SpecTokens.
const MaxSpecTokens = 16

// maxVerifySamples bounds VerifySamples: each sample rebuilds its request's
// dense K/V, so a mistyped count would stall every checked step.
const maxVerifySamples = 1 << 12

// Validate checks the configuration (the Manager checks its own part) and
// that the caches fit MaxCacheBytes.
func (c *Config) Validate() error {
	if err := c.Model.Validate(); err != nil {
		return err
	}
	// In float64: the factors are bounded but their product may not fit
	// int64; the comparison only needs to be right near the bound.
	if c.PageSize > 0 && c.NumPages > 0 {
		// One cache tensor per layer, or per layer of a group for a hybrid
		// model (its groups share the tensors page by page).
		tensors := c.Model.Layers
		if len(c.Groups) > 0 {
			tensors = max(1, tensors/len(c.Groups))
		}
		bytes := float64(tensors) * float64(c.NumPages) * float64(c.PageSize) * float64(c.Model.KVBytesPerToken())
		if bytes > MaxCacheBytes {
			return fmt.Errorf("%w: %d layers x %d pages x %d tokens x %d bytes of K and V per token (%d kv heads, head dim %d, %v) = %.4g bytes of K/V cache, more than the simulator's %d",
				ErrBadConfig, tensors, c.NumPages, c.PageSize, c.Model.KVBytesPerToken(), c.Model.NumKVHeads, c.Model.HeadDim, c.Model.CacheDType(), bytes, int64(MaxCacheBytes))
		}
	}
	switch {
	case c.MaxRunning < 1 || c.MaxStepTokens < c.MaxRunning:
		return fmt.Errorf("%w: max running %d, step tokens %d: want 1 <= max running <= step tokens", ErrBadConfig, c.MaxRunning, c.MaxStepTokens)
	case c.VerifyEvery < 1 || c.VerifySamples < 1 || c.VerifySamples > maxVerifySamples:
		return fmt.Errorf("%w: verify every %d steps, %d samples: want >= 1 each, at most %d samples", ErrBadConfig, c.VerifyEvery, c.VerifySamples, maxVerifySamples)
	case c.SpecTokens < 0 || c.SpecTokens > MaxSpecTokens:
		return fmt.Errorf("%w: spec tokens %d: want 0..%d", ErrBadConfig, c.SpecTokens, MaxSpecTokens)
	case c.MaxSteps < 0:
		return fmt.Errorf("%w: max steps %d < 0", ErrBadConfig, c.MaxSteps)
	case c.HostPages < 0:
		return fmt.Errorf("%w: host pages %d < 0", ErrBadConfig, c.HostPages)
	case c.Remote != nil && c.HostPages == 0:
		return fmt.Errorf("%w: a remote store needs host pages (fetched pages land there)", ErrBadConfig)
	}
	return c.validateGroups()
}

// Progress is reported after every step.
type Progress struct {
	Step                        int // steps run
	Finished, Total             int // request branches (forks count)
	Running, Waiting, Preempted int
}

// phase is where a request is.
type phase uint8

const (
	arriving phase = iota // not yet arrived
	waiting               // arrived (or preempted), not admitted
	running
	finished
)

// reqState is the simulator's own record of one request branch: its tokens
// and their context hashes, kept apart from the Manager's so that every
// step can be checked against it.
type reqState struct {
	spec     *Request
	id       pagedkv.RequestID
	branch   int // 0 for the request itself, k for its k-th parallel sample
	ns       string
	tokens   []int32  // prompt, then sampled tokens
	ctx      []uint64 // context hash after each token
	computed int      // tokens with K/V (mirrors Manager.Computed)
	sampled  int      // output tokens sampled so far
	phase    phase
	admitted bool // added to the Manager (a waiting one is preempted)
	forked   bool
	// restored is the tokens of the state checkpoint the request resumed
	// from at its last admission (0: none, or no state groups).
	restored int
	// hit is the prefix-hit tokens of its last admission.
	hit int

	// The drafts of the step being built and the context hash after each
	// (buffers reused across steps).
	draft    []int32
	draftCtx []uint64
}

func (r *reqState) name() string {
	if r.branch == 0 {
		return r.spec.Name
	}
	return fmt.Sprintf("%s sample %d", r.spec.Name, r.branch)
}

// remaining is the number of known tokens without K/V.
func (r *reqState) remaining() int { return len(r.tokens) - r.computed }

// Sim is one simulation run: a workload driven through a pagedkv.Manager
// with real append and attention on a backend. It is not safe for
// concurrent use, except that Manager().Stats may be read from any
// goroutine while Run runs.
type Sim struct {
	cfg  Config
	kv   pagedkv.KVManager // a Manager, or a HybridManager for Config.Groups
	mark []bool            // [NumPages] scratch of groupPages
	// stateful: the model has state groups (prefill chunks end at state
	// checkpoint boundaries, hits are state restores).
	stateful bool
	eng      *engine
	ver      *verifier
	rng      *rand.Rand
	specs    []Request

	arrivals []*reqState // arriving, in arrival order
	waiting  []*reqState // FIFO; preempted requests go to the front
	running  []*reqState // admission order
	total    int         // branches, forks included
	done     int
	finished []*reqState // in finishing order
	nextID   pagedkv.RequestID

	// The step being built.
	batch   []*reqState
	ids     []pagedkv.RequestID
	ntokens []int32
	drafts  [][]int32 // [batch] the step's drafts (nil: none); SpecTokens > 0 only
	accept  []int32   // [batch] drafts accepted at commit
	sampled []int32
	samples []sample
	copies  []pagedkv.TierCopy
	copyIDs []uint64

	// beforeRelease, when set, sees each finished request while it still
	// holds its pages (the prefill side of a disaggregated run exports
	// them).
	beforeRelease func(r *reqState) error

	sum Summary
}

// New prepares a run of workload under cfg.
func New(cfg Config, workload []Request) (*Sim, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(workload) == 0 {
		return nil, fmt.Errorf("%w: empty workload", ErrBadConfig)
	}
	s, err := newSim(cfg)
	if err != nil {
		return nil, err
	}
	s.specs = slices.Clone(workload)
	slices.SortStableFunc(s.specs, func(a, b Request) int { return a.Arrival - b.Arrival })
	for i := range s.specs {
		r, err := s.track(&s.specs[i])
		if err != nil {
			return nil, err
		}
		s.arrivals = append(s.arrivals, r)
	}
	return s, nil
}

// newSim prepares a run with no requests yet (the fleet hands them over as
// its router decides).
func newSim(cfg Config) (*Sim, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxSteps == 0 {
		cfg.MaxSteps = 1_000_000
	}
	mcfg := pagedkv.Config{NumPages: cfg.NumPages, PageSize: cfg.PageSize,
		WindowTokens: cfg.WindowTokens, CascadeMinSavedPages: cfg.CascadeMinSavedPages, HashSeed: HashSeed(&cfg),
		Eviction: cfg.Eviction, MissRatioSampling: cfg.CurveRate}
	if cfg.Events != nil {
		mcfg.CacheEvents = cfg.Events
	}
	if cfg.HostPages > 0 {
		mcfg.Tiers = pagedkv.TierConfig{HostPages: cfg.HostPages, Remote: cfg.Remote, RemoteDeadline: cfg.RemoteDeadline,
			Format: tierFormat(&cfg), OffloadFreePages: max(1, cfg.NumPages/16)}
	}
	s := &Sim{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0xc4ec4))}
	specs := []pagedkv.LayerGroup{{Kind: pagedkv.FullAttention, NumLayers: cfg.Model.Layers}}
	if cfg.WindowTokens > 0 {
		specs[0] = pagedkv.LayerGroup{Kind: pagedkv.SlidingAttention, WindowTokens: cfg.WindowTokens, NumLayers: cfg.Model.Layers}
	}
	if cfg.Groups != nil {
		// A state group's page is the engine's: one layer's K and V of a page.
		cfg.Groups = slices.Clone(cfg.Groups)
		for g := range cfg.Groups {
			if cfg.Groups[g].Kind == pagedkv.StateLayers {
				cfg.Groups[g].State.PageBytes = cfg.PageSize * int(cfg.Model.KVBytesPerToken())
				s.stateful = true
			}
		}
		s.cfg.Groups = cfg.Groups
		h, err := pagedkv.NewHybrid(pagedkv.HybridConfig{Config: mcfg, Groups: cfg.Groups})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
		}
		s.kv, specs = h, slices.Clone(cfg.Groups)
		s.mark = make([]bool, cfg.NumPages)
		s.sum.Groups = make([]GroupSummary, len(specs))
		for g := range specs {
			s.sum.Groups[g].Spec = specs[g]
		}
	} else {
		m, err := pagedkv.New(mcfg)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
		}
		s.kv = m
	}
	b := cfg.Backend
	if b == nil {
		b = cpu.New(cpu.Config{})
	}
	eng, err := newEngine(cfg.Model, b, cfg.KVLayout, cfg.NumPages, cfg.PageSize, len(specs))
	if err != nil {
		return nil, err
	}
	if hasMLA(specs) {
		if eng.mla, err = newMLAEngine(&cfg, len(eng.caches)); err != nil {
			return nil, err
		}
	}
	s.eng = eng
	s.ver = newVerifier(&s.eng.model, specs)
	s.sum.Pages = cfg.NumPages
	s.sum.CacheBytes = eng.cacheBytes()
	if eng.mla != nil {
		s.sum.CacheBytes = eng.mla.cacheBytes()
	}
	return s, nil
}

// track validates request q (which must outlive the run) and counts it in
// the run's totals; it returns its record, not yet arrived.
func (s *Sim) track(q *Request) (*reqState, error) {
	if len(q.Prompt) == 0 || q.Output < 1 || q.Samples < 1 || q.Arrival < 0 {
		return nil, fmt.Errorf("%w: %s: prompt %d tokens, output %d, samples %d, arrival %d", ErrBadConfig,
			q.Name, len(q.Prompt), q.Output, q.Samples, q.Arrival)
	}
	if need := s.cfg.minPages(q); need > s.cfg.NumPages {
		return nil, fmt.Errorf("%w: %s can never run: its %d tokens (prompt %d + output %d - 1) need at least %d pages of %d tokens, and the pool has %d",
			ErrBadConfig, q.Name, len(q.Prompt)+q.Output-1, len(q.Prompt), q.Output, need, s.cfg.PageSize, s.cfg.NumPages)
	}
	r := &reqState{spec: q, ns: q.Namespace, tokens: slices.Clone(q.Prompt)}
	r.ctx = s.cfg.Model.Contexts(nil, q.Namespace, r.tokens)
	s.total += q.Samples
	s.sum.Requests++
	s.sum.Forks += q.Samples - 1
	s.sum.PromptTokens += int64(len(q.Prompt))
	s.sum.OutputTokens += int64(q.Samples * q.Output)
	return r, nil
}

// minPages is a lower bound on the pages request q must hold at once, so
// that a pool smaller than it is a configuration that can never run (a
// bad config, not a failed run). With full attention in some layer group,
// the last step holds every token but the last one sampled (prompt +
// output - 1) in one sequence; windowed and chunked groups hold less, so
// a run of those alone gets no bound (0) rather than a wrong one.
func (c *Config) minPages(q *Request) int {
	full := c.Groups == nil && c.WindowTokens == 0
	for _, g := range c.Groups {
		full = full || g.Kind == pagedkv.FullAttention
	}
	if !full {
		return 0
	}
	return (len(q.Prompt) + q.Output - 1 + c.PageSize - 1) / c.PageSize
}

// HashSeed is the prefix-hash seed a run of cfg gives its Managers: what a
// router computing their hash chains needs (with the page size).
func HashSeed(cfg *Config) uint64 { return cfg.Seed | 1 }

// Manager is the Manager or HybridManager the run drives (for metrics).
func (s *Sim) Manager() pagedkv.KVManager { return s.kv }

// Stats is the Manager's Stats, or the HybridManager's pool-wide part of
// its Stats: like them, safe to call from any goroutine while Run runs.
func (s *Sim) Stats() pagedkv.Stats { return s.kv.PoolStats() }

// loading reports whether request id waits for tier onloads (in any
// group of a hybrid model).
func (s *Sim) loading(id pagedkv.RequestID) bool { return s.kv.Loading(id) }

// Run runs the workload to the end and returns the summary. It stops at
// the first failed check (the error wraps [ErrVerify] or [ErrCheck]); the
// summary then covers the steps run so far and has Err set.
func (s *Sim) Run() (Summary, error) {
	start := time.Now()
	err := s.run()
	return s.finish(time.Since(start), err)
}

// finish completes the summary of a run that took wall and ended with err.
func (s *Sim) finish(wall time.Duration, err error) (Summary, error) {
	s.sum.Wall = wall
	st := s.Stats()
	for g := range s.sum.Groups { // a hybrid model's
		s.sum.Groups[g].Stats = s.kv.GroupStats(g)
		s.sum.Groups[g].Outputs = s.ver.groupOutputs[g]
	}
	s.sum.Stats = st
	s.sum.Steps = int(st.Steps)
	s.sum.Verified.Outputs, s.sum.Verified.KVTokens, s.sum.Verified.MaxErr = s.ver.outputs, s.ver.kvTokens, s.ver.maxErr
	s.sum.Verified.Atol, s.sum.Verified.Rtol = s.ver.atol, s.ver.rtol
	s.sum.Verified.DraftOutputs = s.ver.drafts
	s.sum.Verified.StateOutputs, s.sum.Verified.RestoredOutputs = s.ver.stateOutputs, s.ver.restoredOutputs
	s.sum.Verified.MLAOutputs, s.sum.Verified.HitOutputs, s.sum.Verified.IndexerTokens = s.ver.mlaOutputs, s.ver.hitOutputs, s.ver.indexerTokens
	s.sum.Verified.IndexerHitTokens = s.ver.indexerHitTokens
	s.sum.Err = err
	if d := s.eng.dev; d != nil {
		t := d.traffic
		s.sum.Device = &t
		d.free() // the device caches live as long as the run
		s.eng.dev = nil
	}
	return s.sum, err
}

func (s *Sim) run() error {
	defer s.tierCopies() //nolint:errcheck // the run's error comes first; copies left are completed for the final stats
	for clock, iter := 0, 0; s.done < s.total; clock, iter = clock+1, iter+1 {
		if s.sum.Steps >= s.cfg.MaxSteps || iter >= 2*s.cfg.MaxSteps {
			return fmt.Errorf("%w: %d of %d requests unfinished after %d steps", ErrStuck, s.total-s.done, s.total, s.sum.Steps)
		}
		if len(s.running) == 0 && len(s.waiting) == 0 {
			clock = max(clock, s.arrivals[0].spec.Arrival) // idle until the next arrival
		}
		for len(s.arrivals) > 0 && s.arrivals[0].spec.Arrival <= clock {
			s.arrivals[0].phase = waiting
			s.waiting = append(s.waiting, s.arrivals[0])
			s.arrivals = s.arrivals[1:]
		}
		if err := s.step(); err != nil {
			return err
		}
		if s.cfg.Events != nil {
			s.cfg.Events.Flush()
		}
		if s.cfg.Progress != nil {
			s.cfg.Progress(s.progress())
		}
	}
	return nil
}

func (s *Sim) progress() Progress {
	p := Progress{Step: s.sum.Steps, Finished: s.done, Total: s.total, Running: len(s.running), Waiting: len(s.waiting)}
	for _, r := range s.waiting {
		if r.admitted {
			p.Preempted++
		}
	}
	return p
}

// timed runs f and adds its duration to the Manager's share.
func (s *Sim) timed(f func() error) error {
	t := time.Now()
	err := f()
	s.sum.Time.Manager += time.Since(t)
	return err
}

// step completes the tier copies planned before it, then schedules,
// reserves, runs and commits one step.
func (s *Sim) step() error {
	t0 := time.Now()
	if err := s.tierCopies(); err != nil {
		return err
	}
	if err := s.schedule(); err != nil {
		return err
	}
	var plan *pagedkv.HybridPlan
	for {
		if len(s.ids) == 0 {
			return nil
		}
		var drafts [][]int32
		if s.cfg.SpecTokens > 0 {
			drafts = s.drafts
		}
		err := s.timed(func() (err error) {
			plan, err = s.kv.ReserveStep(s.ids, s.ntokens, drafts)
			return err
		})
		if err == nil {
			break
		}
		if !errors.Is(err, pagedkv.ErrOutOfPages) {
			return fmt.Errorf("reserve: %w", err)
		}
		if err := s.preemptOne(err); err != nil {
			return err
		}
	}
	// The Manager's tokens now end with the drafts: so do the simulator's
	// until the commit keeps the accepted ones.
	for b, d := range s.drafts {
		if r := s.batch[b]; len(d) > 0 {
			r.tokens = append(r.tokens, d...)
			r.ctx = append(r.ctx, r.draftCtx...)
		}
	}
	s.sum.Steps++
	st := s.Stats()
	s.sum.PeakUsedPages = max(s.sum.PeakUsedPages, st.UsedPages)
	if s.sum.Groups != nil {
		if err := s.groupPages(st.UsedPages, plan); err != nil {
			return err
		}
	}

	s.samples = s.samples[:0]
	verify := s.sum.Steps%s.cfg.VerifyEvery == 0
	if verify {
		for g := range plan.Groups {
			s.pickSamples(g, plan.Groups[g])
		}
		s.ver.step = s.sum.Steps
		s.sum.Verified.Checks++
	}
	var times stepTimes
	if err := s.eng.run(plan, s.batch, s.samples, s.ver, &times, &s.sum.cascade); err != nil {
		return err
	}
	s.sum.Time.Model += times.model
	s.sum.Time.Append += times.append
	s.sum.Time.Attention += times.attention
	s.sum.Time.Verify += times.verify
	if err := s.commit(); err != nil {
		return err
	}
	if verify {
		t := time.Now()
		if err := s.kv.Audit(); err != nil {
			return fmt.Errorf("%w: audit after step %d: %w", ErrCheck, s.sum.Steps, err)
		}
		s.sum.Time.Verify += time.Since(t)
	}
	s.sum.Time.Total += time.Since(t0)
	return nil
}

// schedule builds the step: every running request that decodes (one token
// left), then prefill chunks of running requests in admission order, then
// waiting requests admitted in order while the budget, MaxRunning and the
// pool allow.
func (s *Sim) schedule() error {
	s.batch, s.ids, s.ntokens, s.drafts = s.batch[:0], s.ids[:0], s.ntokens[:0], s.drafts[:0]
	budget := s.cfg.MaxStepTokens
	add := func(r *reqState, n int) {
		s.batch = append(s.batch, r)
		s.ids = append(s.ids, r.id)
		s.ntokens = append(s.ntokens, int32(n))
		s.drafts = append(s.drafts, nil)
		budget -= n
	}
	for _, r := range s.running {
		if r.remaining() == 1 && !s.loading(r.id) {
			add(r, 1)
		}
	}
	// Drafts come out of the budget before prefill chunks, never past the
	// request's output (the accepted drafts and the bonus token are
	// output tokens).
	for b, r := range s.batch {
		if n := min(s.cfg.SpecTokens, r.spec.Output-r.sampled-1, budget); n > 0 {
			s.drafts[b] = s.propose(r, n)
			budget -= n
		}
	}
	for _, r := range s.running {
		if n := r.remaining(); n > 1 && budget > 0 && !s.loading(r.id) {
			add(r, s.chunk(r, min(n, budget)))
		}
	}
	for len(s.waiting) > 0 && budget > 0 && len(s.running) < s.cfg.MaxRunning {
		r := s.waiting[0]
		if len(s.running) > 0 && !s.fits(r) {
			break
		}
		s.waiting = s.waiting[1:]
		var matched int
		err := s.timed(func() (err error) {
			if r.admitted {
				matched, err = s.kv.Resume(r.id)
			} else {
				s.nextID++
				r.id = s.nextID
				matched, err = s.kv.Add(r.id, pagedkv.Request{Namespace: pagedkv.Namespace{Tenant: r.ns}, Prompt: r.tokens,
					CapacityTokens: len(r.tokens) + r.spec.Output})
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("admit %s: %w", r.name(), err)
		}
		if matched < 0 || matched >= len(r.tokens) {
			return fmt.Errorf("%w: admitting %s (%d tokens) matched %d tokens, want 0..%d", ErrCheck, r.name(), len(r.tokens), matched, len(r.tokens)-1)
		}
		r.admitted, r.phase, r.computed, r.hit = true, running, matched, matched
		r.restored = 0
		if s.stateful && matched > 0 {
			r.restored = matched
			s.sum.StateHits++
			s.sum.StateHitTokens += int64(matched)
		}
		s.running = append(s.running, r)
		if !s.loading(r.id) { // else it steps once its onloads complete
			add(r, s.chunk(r, min(r.remaining(), budget)))
		}
	}
	return nil
}

// chunk is the prefill chunk of n tokens r may take, cut to end at its next
// state checkpoint boundary (HybridManager.NextStateCheckpoint), as an
// engine's scheduler does so that the checkpoint is published.
func (s *Sim) chunk(r *reqState, n int) int {
	if !s.stateful {
		return n
	}
	if next := s.kv.(*pagedkv.HybridManager).NextStateCheckpoint(r.id); next > r.computed && next < r.computed+n {
		return next - r.computed
	}
	return n
}

// fits reports whether the pool has room for all of r's known tokens and
// the next, counting evictable pages and keeping a reserve of 1/32 of the
// pool for running requests to grow into.
func (s *Sim) fits(r *reqState) bool {
	st := s.Stats()
	need := (len(r.tokens)+1+s.cfg.PageSize-1)/s.cfg.PageSize + max(1, s.cfg.NumPages/32)
	return st.FreePages+st.EvictablePages >= need
}

// preemptOne preempts the most recently admitted running request (its
// published pages stay cached) after Reserve failed with reserveErr.
func (s *Sim) preemptOne(reserveErr error) error {
	if len(s.running) <= 1 {
		r := s.batch[0]
		return fmt.Errorf("%w: %s alone needs more pages than the pool of %d has (%d tokens of %d each): %w",
			ErrStuck, r.name(), s.cfg.NumPages, len(r.tokens)+r.spec.Output, s.cfg.PageSize, reserveErr)
	}
	v := s.running[len(s.running)-1]
	if err := s.timed(func() error { return s.kv.Preempt(v.id) }); err != nil {
		return fmt.Errorf("preempt %s: %w", v.name(), err)
	}
	s.running = s.running[:len(s.running)-1]
	v.phase, v.computed = waiting, 0
	s.waiting = slices.Insert(s.waiting, 0, v)
	if i := slices.Index(s.batch, v); i >= 0 {
		s.batch = slices.Delete(s.batch, i, i+1)
		s.ids = slices.Delete(s.ids, i, i+1)
		s.ntokens = slices.Delete(s.ntokens, i, i+1)
		s.drafts = slices.Delete(s.drafts, i, i+1)
	}
	return nil
}

// propose fills r's draft buffers with n drafts after its known tokens,
// each from Model.Draft at the context of the drafts before it.
func (s *Sim) propose(r *reqState, n int) []int32 {
	m := &s.cfg.Model
	r.draft, r.draftCtx = r.draft[:0], r.draftCtx[:0]
	c := r.ctx[len(r.ctx)-1]
	for i := range n {
		t := m.Draft(c, r.branch)
		c = Next(c, t, len(r.tokens)+i)
		r.draft, r.draftCtx = append(r.draft, t), append(r.draftCtx, c)
	}
	return r.draft
}

// pickSamples chooses VerifySamples (request, row, layer, head) outputs of
// group g's plan at random, among the group's layers (model layers g,
// g+G, g+2G, ... for G groups; every layer for a dense model).
func (s *Sim) pickSamples(g int, plan *pagedkv.Plan) {
	if s.sum.Groups != nil && s.sum.Groups[g].Spec.Kind == pagedkv.IndexerAttention {
		return // the indexer reads back every token of the step (runIndexer)
	}
	m := &s.cfg.Model
	ng := len(s.eng.caches) // layers per group
	G := m.Layers / ng
	for range s.cfg.VerifySamples {
		b := s.rng.IntN(len(plan.Requests))
		lo, hi := int(plan.QOIndptr[b]), int(plan.QOIndptr[b+1])
		if hi == lo {
			continue
		}
		s.samples = append(s.samples, sample{group: g, batch: b, row: lo + s.rng.IntN(hi-lo),
			layer: s.rng.IntN(ng)*G + g, head: s.rng.IntN(m.NumQOHeads)})
	}
}

// commit samples a token for every request whose step reached the end of
// its known tokens, commits, then forks requests that asked for parallel
// samples and releases the finished ones. It checks the Manager's view of
// each request against the simulator's.
func (s *Sim) commit() error {
	s.sampled, s.accept = s.sampled[:0], s.accept[:0]
	for b, r := range s.batch {
		// Accept the longest prefix of drafts that Sample agrees with, and
		// cut the rest from the simulator's tokens (the Manager cuts its
		// own at CommitSpec).
		var acc int
		if d := s.drafts[b]; len(d) > 0 {
			base := len(r.tokens) - len(d)
			for acc < len(d) && d[acc] == s.cfg.Model.Sample(r.ctx[base+acc-1], r.branch) {
				acc++
			}
			r.tokens, r.ctx = r.tokens[:base+acc], r.ctx[:base+acc]
			r.sampled += acc
		}
		s.accept = append(s.accept, int32(acc))
		tok := pagedkv.NoToken
		if r.computed+int(s.ntokens[b])+acc == len(r.tokens) {
			tok = s.cfg.Model.Sample(r.ctx[len(r.ctx)-1], r.branch)
		}
		s.sampled = append(s.sampled, tok)
	}
	err := s.timed(func() error {
		if s.cfg.SpecTokens > 0 {
			return s.kv.CommitSpec(s.accept, s.sampled)
		}
		return s.kv.Commit(s.sampled)
	})
	if err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	for b, r := range s.batch {
		r.computed += int(s.ntokens[b]) + int(s.accept[b])
		if tok := s.sampled[b]; tok != pagedkv.NoToken {
			r.ctx = append(r.ctx, Next(r.ctx[len(r.ctx)-1], tok, len(r.tokens)))
			r.tokens = append(r.tokens, tok)
			r.sampled++
		}
		if got, mt := s.kv.Computed(r.id), s.kv.Tokens(r.id); got != r.computed || !slices.Equal(mt, r.tokens) {
			return fmt.Errorf("%w: after step %d the Manager has %d computed of %d tokens for %s; the simulator %d of %d (or the tokens differ)",
				ErrCheck, s.sum.Steps, got, len(mt), r.name(), r.computed, len(r.tokens))
		}
	}
	for _, r := range s.batch {
		if r.branch == 0 && !r.forked && r.sampled > 0 && r.spec.Samples > 1 {
			if err := s.fork(r); err != nil {
				return err
			}
		}
	}
	// Finished: batch members that sampled their last token, and children
	// forked this step when one token was all they were to sample.
	for _, r := range s.running {
		if r.sampled < r.spec.Output {
			continue
		}
		if s.beforeRelease != nil {
			if err := s.beforeRelease(r); err != nil {
				return err
			}
		}
		if err := s.timed(func() error { return s.kv.Release(r.id) }); err != nil {
			return fmt.Errorf("release %s: %w", r.name(), err)
		}
		r.phase = finished
		s.done++
		s.finished = append(s.finished, r)
	}
	s.running = slices.DeleteFunc(s.running, func(x *reqState) bool { return x.phase == finished })
	return nil
}

// fork adds the parallel samples of r, which has just sampled its first
// token: each shares r's pages (copy-on-write of the partial last page)
// and samples its own tokens from then on.
func (s *Sim) fork(r *reqState) error {
	r.forked = true
	for k := 1; k < r.spec.Samples; k++ {
		s.nextID++
		c := &reqState{spec: r.spec, id: s.nextID, branch: k, ns: r.ns, tokens: slices.Clone(r.tokens), ctx: slices.Clone(r.ctx),
			computed: r.computed, sampled: r.sampled, phase: running, admitted: true, forked: true}
		if err := s.timed(func() error { return s.kv.Fork(r.id, c.id) }); err != nil {
			return fmt.Errorf("fork %s: %w", c.name(), err)
		}
		s.running = append(s.running, c)
	}
	return nil
}
