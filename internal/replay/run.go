package replay

import (
	"errors"
	"fmt"
	"time"

	"github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/evict"
	"github.com/pagedkv/pagedkv/internal/sim"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/tier"
)

// Service is the service model: an engine that runs steps back to back,
// each step computing up to StepTokens tokens of at most MaxBatch running
// requests (decode tokens first, then prefill chunks in admission order),
// and taking prefill tokens / PrefillTokensPerSec + decode tokens /
// DecodeTokensPerSec seconds. Requests wait in arrival order; a step that
// finds no pages preempts the most recently admitted running request
// (vLLM's rule) and retries; preempted requests resume first.
type Service struct {
	PrefillTokensPerSec float64
	DecodeTokensPerSec  float64
	MaxBatch            int
	StepTokens          int
}

// DefaultService is a model of one inference node for the Mooncake trace:
// 64k prefill tokens/s, 4k decode tokens/s over the batch, 64 running
// requests, 16k tokens per step. The trace needs about 40k prompt tokens/s
// before hits, so the node keeps up only by its prefix cache.
func DefaultService() Service {
	return Service{PrefillTokensPerSec: 64_000, DecodeTokensPerSec: 4_000, MaxBatch: 64, StepTokens: 16_384}
}

func (s *Service) validate() error {
	switch {
	case !(s.PrefillTokensPerSec > 0) || !(s.DecodeTokensPerSec > 0):
		return fmt.Errorf("%w: service rates %g prefill and %g decode tokens/s, want > 0", ErrBadConfig, s.PrefillTokensPerSec, s.DecodeTokensPerSec)
	case s.MaxBatch < 1 || s.MaxBatch > MaxServiceBatch:
		return fmt.Errorf("%w: service MaxBatch %d, want 1..%d (MaxServiceBatch)", ErrBadConfig, s.MaxBatch, MaxServiceBatch)
	case s.StepTokens < 1:
		return fmt.Errorf("%w: service StepTokens %d, want >= 1", ErrBadConfig, s.StepTokens)
	}
	return nil
}

// ErrBadConfig reports an invalid [Config]; the message names the value.
var ErrBadConfig = errors.New("replay: bad config")

// Config describes one replay.
type Config struct {
	// CapacityPages is the prefix cache's room in pages (one page per
	// block). Sequentially the pool has one more page (the prompt's query
	// token), so the cache holds CapacityPages blocks beside nothing else;
	// with a service model the pool is CapacityPages pages, running
	// requests included.
	CapacityPages int
	// Eviction names the prefix cache's eviction policy ("" is LRU).
	Eviction string
	// Service, when not nil, runs the service model; nil replays one
	// request at a time without outputs.
	Service *Service
	// PageTokens is the number of tokens synthesized per block page: 0
	// means the trace's BlockTokens (every token of the real prompt). A
	// smaller page (sequential replays only) gives the Manager the same
	// blocks, ids and hit decisions with less token work per block: the
	// measured figures are the same (a test checks it), and token counts
	// are still reported in the trace's tokens.
	PageTokens int
	// HostPages, when > 0, puts a host tier of that many pages below the
	// pool (write-through: every published page is copied down, and a
	// prefix hit on the host tier is copied back up). Copies complete at
	// once: the replay moves no bytes, it counts pages.
	HostPages int
	// Remote, when not nil, is a shared store below the host tier (it
	// needs HostPages, and its page format must be RemoteFormat(PageTokens)):
	// every published page is written to it through the host tier, and a
	// prefix the pool and the host tier lack is looked up in it. Flush,
	// when not nil, waits for the store's queued writes; the replay calls
	// it after every request (sequential) or step (service model), so every
	// write lands before the next admission.
	Remote tier.RemoteStore
	Flush  func() error
	// Model names a `simulate --model` preset (internal/sim): "" or
	// "dense" is one Manager; a hybrid preset runs a HybridManager, its
	// layer groups on one pool (CapacityPages pages for all groups, so a
	// block takes a page per group that keeps it), a hit only where every
	// group serves the prefix. The presets' windows and chunks are in
	// tokens of the synthesized pages. The replay runs a hybrid model
	// without tiers (HostPages > 0 with one is ErrBadConfig), although a
	// HybridManager has them.
	Model string
	// StateCheckpointPages is, for a preset with state groups, the
	// interval of their prefix checkpoints in pages
	// (pagedkv.HybridConfig.StateCheckpointEvery in pages; 0: only the
	// prompt's last whole page and the shared-prefix junction).
	StateCheckpointPages int
	// Hints, when its Accuracy is > 0, feeds continuation hints from an
	// oracle of the trace's future (see [Hints]; a dense Manager only).
	Hints Hints
	// CurveRate, when > 0, keeps the Manager's live miss-ratio curve at
	// that sampling rate (pagedkv.Config.MissRatioSampling); its final
	// estimates land in Result.Curve.
	CurveRate float64
	// Progress, when not nil, is called as requests finish, with the
	// number finished.
	Progress func(finished int)
}

// remoteLookupDeadline bounds a remote lookup in the replay (the
// Manager's default, 20 ms, is an engine's latency budget).
const remoteLookupDeadline = 10 * time.Second

// newBookkeeper makes the Manager, or the HybridManager a hybrid preset
// asks for.
func newBookkeeper(mcfg pagedkv.Config, model string, checkpointPages int) (pagedkv.KVManager, error) {
	groups, err := modelGroups(model)
	if err != nil {
		return nil, err
	}
	if groups == nil {
		m, err := pagedkv.New(mcfg)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
		}
		return m, nil
	}
	if mcfg.Tiers.HostPages > 0 {
		return nil, fmt.Errorf("%w: model %q with a host or remote tier: the replay runs tiers with one Manager only", ErrBadConfig, model)
	}
	if checkpointPages < 0 {
		return nil, fmt.Errorf("%w: StateCheckpointPages %d, want >= 0", ErrBadConfig, checkpointPages)
	}
	h, err := pagedkv.NewHybrid(pagedkv.HybridConfig{Config: mcfg, Groups: groups, StateCheckpointEvery: checkpointPages * mcfg.PageSize})
	if err != nil {
		return nil, fmt.Errorf("%w: model %q: %w", ErrBadConfig, model, err)
	}
	return h, nil
}

// modelGroups returns the layer groups of a preset (nil for a dense one).
func modelGroups(model string) ([]pagedkv.LayerGroup, error) {
	if model == "" {
		return nil, nil
	}
	p, err := sim.Preset(model)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	groups, err := p.Groups(p.Layers)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	return groups, nil
}

// RemoteFormat is the page format the replay gives a remote store: the
// smallest page (one layer, one K/V head of one f16 element per token) of
// pageTokens tokens. The replay moves no K/V; a remote store still carries
// real values of this size, and bytes at a model's size are computed from
// the pages moved.
func RemoteFormat(pageTokens int) tier.PageFormat {
	return tier.PageFormat{Layout: layout.NHD, DType: layout.F16, PageSize: pageTokens, NumKVHeads: 1, HeadDim: 1, Layers: 1}
}

// Result is what one replay measured.
type Result struct {
	Eviction      string
	CapacityPages int
	// HintAccuracy is the oracle's accuracy (0: no hints).
	HintAccuracy float64
	Requests     int
	// Blocks are the prompt blocks of every admission (Add), HitBlocks
	// those the prefix cache served.
	Blocks, HitBlocks int64
	// PrefillTokens are prompt tokens computed (not served by the cache);
	// RecomputedTokens are computed tokens preemption discarded and the
	// cache could not serve back at Resume.
	PrefillTokens, RecomputedTokens int64
	DecodeTokens                    int64
	EvictedPages                    int64
	Preemptions                     int64
	PeakPages                       int
	// PeakCheckpointPages is, for a model with state groups, the most
	// pool pages its state checkpoints held after a step (a checkpoint is
	// one page per state group).
	PeakCheckpointPages int
	// SimulatedMs is the simulated time the trace took (the last
	// request's finish; sequential replays count the trace's span).
	SimulatedMs float64
	Wall        time.Duration
	// HostHitBlocks are the hit blocks the host tier served (copied up);
	// Offloaded and Onloaded count the pages copied down and up.
	HostHitBlocks, Offloaded, Onloaded int64
	// RemoteHitBlocks are the hit blocks the remote store served;
	// RemoteStored and RemoteFetched count the pages written to it and
	// read from it.
	RemoteHitBlocks, RemoteStored, RemoteFetched int64
	// Curve is the live miss-ratio curve's final estimate (Config.CurveRate).
	Curve pagedkv.MissRatioCurve
	// Usage is every request's cache reads and writes, in tokens
	// (Stats.CacheUsage; docs/cache-usage.md).
	Usage pagedkv.CacheUsage
	// Stream is the block reference stream: the prompt blocks of every
	// admission and resumption, in order (the input of the limits).
	Stream Stream
}

// HitRatio is HitBlocks / Blocks.
func (r *Result) HitRatio() float64 { return ratio(r.HitBlocks, r.Blocks) }

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// Stream is a block reference stream: Admissions[i] lists the blocks of
// the i-th admission (shared with the trace).
type Stream struct {
	Admissions [][]int32
}

// Run replays trace under cfg on a fresh Manager.
func Run(t *Trace, cfg Config) (*Result, error) {
	if cfg.CapacityPages < 1 {
		return nil, fmt.Errorf("%w: CapacityPages %d, want >= 1", ErrBadConfig, cfg.CapacityPages)
	}
	if cfg.Service != nil {
		if err := cfg.Service.validate(); err != nil {
			return nil, err
		}
	}
	switch {
	case cfg.PageTokens == 0:
		cfg.PageTokens = t.BlockTokens
	case cfg.PageTokens < 0 || cfg.PageTokens > t.BlockTokens:
		return nil, fmt.Errorf("%w: PageTokens %d, want 1..%d (the trace's block)", ErrBadConfig, cfg.PageTokens, t.BlockTokens)
	case cfg.Service != nil && cfg.PageTokens != t.BlockTokens:
		return nil, fmt.Errorf("%w: PageTokens %d with the service model, want the trace's block of %d tokens (outputs fill pages token by token)",
			ErrBadConfig, cfg.PageTokens, t.BlockTokens)
	}
	numPages := cfg.CapacityPages
	if cfg.Service == nil {
		numPages++ // the query token's page
	}
	if cfg.HostPages < 0 {
		return nil, fmt.Errorf("%w: HostPages %d, want >= 0", ErrBadConfig, cfg.HostPages)
	}
	mcfg := pagedkv.Config{NumPages: numPages, PageSize: cfg.PageTokens, HashSeed: 1,
		Eviction: cfg.Eviction, CascadeMinSavedPages: -1, MissRatioSampling: cfg.CurveRate}
	if cfg.HostPages > 0 {
		mcfg.Tiers = pagedkv.TierConfig{HostPages: cfg.HostPages, WriteThrough: true}
	}
	if cfg.Remote != nil {
		if cfg.HostPages == 0 {
			return nil, fmt.Errorf("%w: a remote store needs a host tier (HostPages 0)", ErrBadConfig)
		}
		mcfg.Tiers.Remote, mcfg.Tiers.Format = cfg.Remote, RemoteFormat(cfg.PageTokens)
		// The replay measures what the tiers hold, not how fast the store
		// answers: a lookup slowed by a loaded machine must not turn into
		// a miss, so the deadline is far above any healthy lookup.
		mcfg.Tiers.RemoteDeadline = remoteLookupDeadline
	}
	m, err := newBookkeeper(mcfg, cfg.Model, cfg.StateCheckpointPages)
	if err != nil {
		return nil, err
	}
	policy := cfg.Eviction
	if policy == "" {
		policy = evict.LRU
	}
	r := &runner{t: t, cfg: cfg, m: m, res: &Result{Eviction: policy, CapacityPages: cfg.CapacityPages, HintAccuracy: cfg.Hints.Accuracy}}
	if err := cfg.Hints.validate(); err != nil {
		return nil, err
	}
	if cfg.Hints.Accuracy > 0 {
		if r.hints, err = newHinter(t, cfg.Hints, m); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	if cfg.Service == nil {
		err = r.sequential()
	} else {
		err = r.serve()
	}
	if err != nil {
		return nil, err
	}
	s := r.m.PoolStats()
	res := r.res
	res.Requests = len(t.Requests)
	// Prompt tokens computed, in the trace's tokens: the missed blocks and
	// each request's query token (with full pages, the Manager's count).
	res.PrefillTokens = (res.Blocks-res.HitBlocks)*int64(t.BlockTokens) + int64(len(t.Requests))
	if cfg.PageTokens == t.BlockTokens && res.PrefillTokens != s.PromptTokens-s.PromptHitTokens {
		return nil, fmt.Errorf("replay: %d prompt tokens computed by block count, %d by the Manager", res.PrefillTokens, s.PromptTokens-s.PromptHitTokens)
	}
	res.RecomputedTokens = s.ResumedTokens - s.ResumeHitTokens
	res.EvictedPages = s.EvictedPages
	res.Preemptions = s.Preemptions
	res.HostHitBlocks = s.Tiers.HostHitTokens / int64(cfg.PageTokens)
	res.Offloaded, res.Onloaded = s.Tiers.OffloadedPages, s.Tiers.OnloadedPages
	res.RemoteHitBlocks = s.Tiers.RemoteHitTokens / int64(cfg.PageTokens)
	res.RemoteStored, res.RemoteFetched = s.Tiers.RemoteStored, s.Tiers.RemoteFetched
	res.Curve = s.MissRatioCurve
	res.Usage = s.CacheUsage
	res.Wall = time.Since(start)
	return res, nil
}

// runner is one replay's state.
type runner struct {
	t      *Trace
	cfg    Config
	m      pagedkv.KVManager // a Manager, or a HybridManager for a hybrid preset
	res    *Result
	prompt []int32
	ids    []pagedkv.RequestID
	counts []int32
	slot   []int // the service model's batch entry -> index in running
	copies []pagedkv.TierCopy
	copyID []uint64
	hints  *hinter // nil: no hints
}

// chunk is the prefill chunk of n tokens request id may take: cut, for a
// model with state groups, to end at its next state checkpoint boundary
// (HybridManager.NextStateCheckpoint), as an engine's scheduler does so
// that the checkpoint is published.
func (r *runner) chunk(id pagedkv.RequestID, n int) int {
	h, ok := r.m.(*pagedkv.HybridManager)
	if !ok {
		return n
	}
	c := r.m.Computed(id)
	if next := h.NextStateCheckpoint(id); next > c && next < c+n {
		return next - c
	}
	return n
}

// release hints request i (if hints are on) and releases it.
func (r *runner) release(i int) error {
	if r.hints != nil {
		if err := r.hints.hint(i); err != nil {
			return err
		}
	}
	if err := r.m.Release(pagedkv.RequestID(i)); err != nil {
		return fmt.Errorf("replay: request %d: %w", i, err)
	}
	return nil
}

// completeCopies completes every tier copy the Manager planned: the replay
// has no bytes to move, so a copy is done as soon as it is planned.
func (r *runner) completeCopies() error {
	r.copies = r.m.TierCopies(r.copies[:0])
	if len(r.copies) == 0 {
		return nil
	}
	r.copyID = r.copyID[:0]
	for _, c := range r.copies {
		r.copyID = append(r.copyID, c.ID)
	}
	if err := r.m.CompleteTierCopies(r.copyID...); err != nil {
		return fmt.Errorf("replay: completing %d tier copies: %w", len(r.copyID), err)
	}
	return nil
}

// flush waits for the remote store's writes.
func (r *runner) flush() error {
	if r.cfg.Flush == nil {
		return nil
	}
	if err := r.cfg.Flush(); err != nil {
		return fmt.Errorf("replay: flushing the remote store: %w", err)
	}
	return nil
}

// promptOf fills r.prompt with request q's synthesized prompt: one full
// page per block, then the query token.
func (r *runner) promptOf(q *Request) []int32 {
	ps := r.cfg.PageTokens
	n := len(q.Blocks)*ps + 1
	if cap(r.prompt) < n {
		r.prompt = make([]int32, n)
	}
	p := r.prompt[:n]
	for i, id := range q.Blocks {
		BlockTokens(p[i*ps:(i+1)*ps], id)
	}
	p[n-1] = queryToken
	return p
}

// admit adds request i and counts its hit blocks.
func (r *runner) admit(i int) error {
	q := &r.t.Requests[i]
	matched, err := r.m.Add(pagedkv.RequestID(i), pagedkv.Request{Prompt: r.promptOf(q),
		CapacityTokens: len(q.Blocks)*r.cfg.PageTokens + 1 + q.OutputTokens})
	if err != nil {
		return fmt.Errorf("replay: admitting request %d: %w", i, err)
	}
	r.res.Blocks += int64(len(q.Blocks))
	r.res.HitBlocks += int64(matched / r.cfg.PageTokens)
	r.res.Stream.Admissions = append(r.res.Stream.Admissions, q.Blocks)
	return r.completeCopies()
}

func (r *runner) notePeak() {
	if u := r.m.PoolStats().UsedPages; u > r.res.PeakPages {
		r.res.PeakPages = u
	}
	if h, ok := r.m.(*pagedkv.HybridManager); ok {
		n := 0
		for g := range h.NumGroups() {
			if h.Group(g).Kind == pagedkv.StateLayers {
				n += h.GroupStats(g).CachedPages
			}
		}
		r.res.PeakCheckpointPages = max(r.res.PeakCheckpointPages, n)
	}
}

// sequential admits, prefills and releases one request at a time.
func (r *runner) sequential() error {
	for i := range r.t.Requests {
		if err := r.admit(i); err != nil {
			return err
		}
		id := pagedkv.RequestID(i)
		// One step, or with state groups one step per chunk ending at a
		// state checkpoint boundary.
		for todo := len(r.m.Tokens(id)) - r.m.Computed(id); todo > 0; todo = len(r.m.Tokens(id)) - r.m.Computed(id) {
			r.ids = append(r.ids[:0], id)
			r.counts = append(r.counts[:0], int32(r.chunk(id, todo)))
			if _, err := r.m.ReserveStep(r.ids, r.counts, nil); err != nil {
				return fmt.Errorf("replay: request %d of %d blocks does not fit a pool of %d pages: %w",
					i, len(r.t.Requests[i].Blocks), r.cfg.CapacityPages+1, err)
			}
			r.notePeak()
			if err := r.m.Commit(nil); err != nil {
				return fmt.Errorf("replay: request %d: %w", i, err)
			}
		}
		if err := r.completeCopies(); err != nil {
			return err
		}
		if err := r.release(i); err != nil {
			return err
		}
		if err := r.flush(); err != nil {
			return err
		}
		if r.cfg.Progress != nil {
			r.cfg.Progress(i + 1)
		}
	}
	if n := len(r.t.Requests); n > 0 {
		r.res.SimulatedMs = float64(r.t.Requests[n-1].ArrivalMs - r.t.Requests[0].ArrivalMs)
	}
	return nil
}
