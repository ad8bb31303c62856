package replay

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pagedkv/pagedkv/evict"
	"github.com/pagedkv/pagedkv/tier"
)

// DefaultFractions are the capacities docs/replay.md reports, as fractions
// of the trace's distinct blocks.
var DefaultFractions = []float64{0.02, 0.05, 0.10, 0.25, 0.50}

// DefaultPolicies are the policies `pagedkv replay` sweeps by default: the
// fixed-rule ones and ARC. "adaptive" is asked for by name (with
// --hint-accuracy it adds a replay per accuracy), so that the default
// sweep under the service model stays within DefaultMaxWork.
var DefaultPolicies = []string{evict.LRU, evict.SLRU, evict.SRRIP, evict.ARC}

// Point is one capacity of a sweep: every policy's replay and the limits
// over the block reference stream of the first policy's replay.
type Point struct {
	Fraction      float64
	CapacityPages int
	Results       []*Result // in the order of the sweep's policies
	// BeladyHits is Belady's optimum over Results[0].Stream at this
	// capacity (plus the host tier's, if any); BeladyOwn[i] over Results[i].Stream (equal to BeladyHits
	// in sequential replays, where every stream is the trace's).
	BeladyHits int64
	BeladyOwn  []int64
	// CurveTrue are, with SweepConfig.CurveRate, LRU's true hit ratios at
	// ½×, 2× and 4× this capacity (replayed) and the unlimited ratio:
	// what Results[0].Curve estimated.
	CurveTrue [4]float64
}

// Sweep is a replay of one trace at several capacities under several
// policies.
type Sweep struct {
	Policies      []string
	Service       *Service
	HostPages     int
	BytesPerToken int64
	Remote        bool
	// StateCheckpointPages is SweepConfig's (printed with the checkpoints).
	StateCheckpointPages int
	Points               []Point
	// UnlimitedHits / Blocks is the unlimited-capacity ratio over the
	// trace's own reference stream (one admission per request, in order).
	UnlimitedHits, Blocks int64
	Wall                  time.Duration
}

// SweepConfig describes a sweep.
type SweepConfig struct {
	// Fractions are the capacities, as fractions of the trace's distinct
	// blocks (each at least the trace's MinPoolPages).
	Fractions []float64
	// Policies are the eviction policies, each replayed at each capacity.
	Policies []string
	// Service, PageTokens, Model and StateCheckpointPages are as in [Config].
	Service              *Service
	PageTokens           int
	Model                string
	StateCheckpointPages int
	// HostPages is the host tier below every pool (0: none), and
	// BytesPerToken the stated model's K/V bytes per token, which turns
	// the pages the tiers moved into bytes.
	HostPages     int
	BytesPerToken int64
	// OpenRemote, when not nil, opens a fresh remote store below the host
	// tier for each run (run names it uniquely within the sweep, so no run
	// sees another's pages), with the store's flush and close.
	OpenRemote func(run string, f tier.PageFormat) (store tier.RemoteStore, flush, close func() error, err error)
	// HintAccuracies, each > 0, replay every policy that reads
	// continuation hints (evict.ReadsHints) once more per accuracy, fed
	// by the oracle of [Hints] (HintHorizon, HintSeed).
	HintAccuracies []float64
	HintHorizon    int64
	HintSeed       uint64
	// CurveRate, when > 0, keeps the live miss-ratio curve in every
	// replay (Config.CurveRate) and replays LRU at ½×, 2× and 4× each
	// capacity to check the first policy's estimates (Point.CurveTrue).
	CurveRate float64
	// Progress, when not nil, is called as requests finish, with the
	// number finished over the whole sweep.
	Progress func(finished int)
	// MaxWork bounds the sweep's simulated work ([Work] of one replay ×
	// capacities × policies × layer groups; 0: DefaultMaxWork): a sweep
	// over it is refused before any work.
	MaxWork int64
}

// RunSweep replays t at each capacity under each policy of cfg.
func RunSweep(t *Trace, cfg SweepConfig) (*Sweep, error) {
	start := time.Now()
	fractions, policies, svc, progress := cfg.Fractions, cfg.Policies, cfg.Service, cfg.Progress
	sw := &Sweep{Policies: policies, Service: svc, HostPages: cfg.HostPages, BytesPerToken: cfg.BytesPerToken, Remote: cfg.OpenRemote != nil, StateCheckpointPages: cfg.StateCheckpointPages}
	groups, err := modelGroups(cfg.Model)
	if err != nil {
		return nil, err
	}
	if svc != nil {
		if err := svc.validate(); err != nil {
			return nil, err
		}
	}
	if err := checkSweep(t, cfg, len(groups)); err != nil {
		return nil, err
	}
	sw.UnlimitedHits, sw.Blocks = Unlimited(TraceStream(t))
	least := t.MinPoolPages() * max(len(groups), 1) // a page per group
	done := 0
	for _, f := range fractions {
		if !(f > 0) {
			return nil, fmt.Errorf("%w: capacity fraction %g, want > 0", ErrBadConfig, f)
		}
		pt := Point{Fraction: f, CapacityPages: max(int(f*float64(t.DistinctBlocks)), least)}
		for _, run := range sweepRuns(policies, cfg.HintAccuracies) {
			rc := Config{CapacityPages: pt.CapacityPages, Eviction: run.policy, Service: svc, PageTokens: cfg.PageTokens, HostPages: cfg.HostPages, Model: cfg.Model,
				StateCheckpointPages: cfg.StateCheckpointPages, Hints: Hints{Accuracy: run.acc, Horizon: cfg.HintHorizon, Seed: cfg.HintSeed}, CurveRate: cfg.CurveRate}
			if progress != nil {
				base := done
				rc.Progress = func(n int) { progress(base + n) }
			}
			res, err := runWithRemote(t, rc, cfg.OpenRemote, fmt.Sprintf("%s-%g-%g", run.policy, run.acc, f))
			if err != nil {
				return nil, fmt.Errorf("capacity %.0f%% (%d pages), policy %s: %w", 100*f, pt.CapacityPages, res.labelOf(run.policy, run.acc), err)
			}
			done += len(t.Requests)
			pt.Results = append(pt.Results, res)
			// With a host tier the bound is Belady over both tiers' room.
			pt.BeladyOwn = append(pt.BeladyOwn, Belady(&res.Stream, pt.CapacityPages+cfg.HostPages))
		}
		if len(pt.Results) > 0 {
			pt.BeladyHits = pt.BeladyOwn[0]
		}
		if cfg.CurveRate > 0 {
			for i, m := range [...]float64{0.5, 2, 4} {
				res, err := Run(t, Config{CapacityPages: max(int(m*float64(pt.CapacityPages)), least), Eviction: evict.LRU,
					Service: svc, PageTokens: cfg.PageTokens, HostPages: cfg.HostPages, Model: cfg.Model, StateCheckpointPages: cfg.StateCheckpointPages})
				if err != nil {
					return nil, fmt.Errorf("capacity %.0f%% × %g, the curve's truth: %w", 100*f, m, err)
				}
				pt.CurveTrue[i] = res.HitRatio()
			}
			pt.CurveTrue[3] = ratio(sw.UnlimitedHits, sw.Blocks)
		}
		sw.Points = append(sw.Points, pt)
	}
	sw.Wall = time.Since(start)
	return sw, nil
}

type sweepRun struct {
	policy string
	acc    float64
}

// sweepRuns lists a capacity's replays: every policy without hints, then
// every policy that reads hints at each accuracy.
func sweepRuns(policies []string, accs []float64) []sweepRun {
	var runs []sweepRun
	for _, p := range policies {
		runs = append(runs, sweepRun{p, 0})
	}
	for _, a := range accs {
		for _, p := range policies {
			if evict.ReadsHints(p) {
				runs = append(runs, sweepRun{p, a})
			}
		}
	}
	return runs
}

// Label names the run: the policy, and the hints' accuracy if any.
func (r *Result) Label() string { return r.labelOf(r.Eviction, r.HintAccuracy) }

func (*Result) labelOf(policy string, acc float64) string {
	if acc == 0 {
		return policy
	}
	return fmt.Sprintf("%s+hints %.0f%%", policy, 100*acc)
}

// TraceStream is t's own reference stream: each request's blocks once, in
// arrival order.
func TraceStream(t *Trace) *Stream {
	s := &Stream{Admissions: make([][]int32, len(t.Requests))}
	for i := range t.Requests {
		s.Admissions[i] = t.Requests[i].Blocks
	}
	return s
}

// Format writes the sweep as a table: per capacity and policy the hit
// ratio, its share of Belady's hits on the same stream, recomputed and
// prefill tokens, evictions, preemptions, peak pages and wall time per
// simulated hour; then the limits.
func (sw *Sweep) Format(w io.Writer, t *Trace) {
	mode := "sequential (one request at a time, no outputs)"
	if s := sw.Service; s != nil {
		mode = fmt.Sprintf("service model (prefill %.0f tok/s, decode %.0f tok/s, batch %d, %d tokens/step)",
			s.PrefillTokensPerSec, s.DecodeTokensPerSec, s.MaxBatch, s.StepTokens)
	}
	fmt.Fprintf(w, "trace: %d requests, %d block references, %d distinct blocks of %d tokens\n",
		len(t.Requests), t.References, t.DistinctBlocks, t.BlockTokens)
	fmt.Fprintf(w, "mode: %s\n\n", mode)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "capacity\tpages\tpolicy\thit\tof belady\tprefill tokens\trecomputed\tevicted\tpreempted\tpeak pages\twall/sim hour\t")
	for _, pt := range sw.Points {
		for i, r := range pt.Results {
			bel := pt.BeladyOwn[i]
			perHour := "-"
			if r.SimulatedMs > 0 {
				perHour = (time.Duration(float64(r.Wall) * 3.6e6 / r.SimulatedMs)).Round(time.Millisecond).String()
			}
			fmt.Fprintf(tw, "%.0f%%\t%d\t%s\t%.1f%%\t%.1f%%\t%d\t%d\t%d\t%d\t%d\t%s\t\n",
				100*pt.Fraction, pt.CapacityPages, r.Label(), 100*r.HitRatio(), 100*ratio(r.HitBlocks, bel),
				r.PrefillTokens, r.RecomputedTokens, r.EvictedPages, r.Preemptions, r.PeakPages, perHour)
		}
		if len(pt.Results) > 0 {
			fmt.Fprintf(tw, "%.0f%%\t%d\t%s\t%.1f%%\t\t\t\t\t\t\t\t\n", 100*pt.Fraction, pt.CapacityPages, "belady",
				100*ratio(pt.BeladyHits, pt.Results[0].Blocks))
		}
	}
	tw.Flush()
	sw.formatCheckpoints(w)
	if sw.HostPages > 0 {
		sw.formatTiers(w, t)
	}
	sw.formatUsage(w)
	if len(sw.Points) > 0 && len(sw.Points[0].Results) > 0 && sw.Points[0].Results[0].Curve.SampledReferences > 0 {
		sw.formatCurve(w)
	}
	fmt.Fprintf(w, "\nunlimited capacity: %.2f%% (%d of %d blocks; no concurrency)\n",
		100*ratio(sw.UnlimitedHits, sw.Blocks), sw.UnlimitedHits, sw.Blocks)
	best := sw.bestOnline()
	if len(best) > 0 {
		fmt.Fprintf(w, "best online policy per capacity (share of Belady's hits): %s\n", strings.Join(best, ", "))
	}
	fmt.Fprintf(w, "wall time: %s\n", sw.Wall.Round(time.Millisecond))
}

// formatCheckpoints writes, for a model with state groups, the most pool
// pages their prefix checkpoints held in each run.
func (sw *Sweep) formatCheckpoints(w io.Writer) {
	var parts []string
	for _, pt := range sw.Points {
		for _, r := range pt.Results {
			if r.PeakCheckpointPages > 0 {
				parts = append(parts, fmt.Sprintf("%g%% %s %d (%.1f%% of the pool)", 100*pt.Fraction, r.Label(), r.PeakCheckpointPages,
					100*float64(r.PeakCheckpointPages)/float64(pt.CapacityPages)))
			}
		}
	}
	if len(parts) > 0 {
		every := "at prompt ends and junctions only"
		if sw.StateCheckpointPages > 0 {
			every = fmt.Sprintf("every %d pages, at prompt ends and junctions", sw.StateCheckpointPages)
		}
		fmt.Fprintf(w, "\nstate checkpoints (%s), peak pool pages held: %s\n", every, strings.Join(parts, ", "))
	}
}

// formatCurve writes the live miss-ratio curve of each capacity's first
// run against the true LRU figures.
func (sw *Sweep) formatCurve(w io.Writer) {
	r0 := sw.Points[0].Results[0]
	fmt.Fprintf(w, "\nlive miss-ratio curve of %s (LRU shadows, %d of %d page references sampled), estimate / true LRU:\n",
		r0.Label(), r0.Curve.SampledReferences, r0.Blocks)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "capacity\t½×\t2×\t4×\tunlimited\tworst error\t")
	for _, pt := range sw.Points {
		c := pt.Results[0].Curve
		est := [4]float64{c.Half, c.Double, c.Quadruple, c.Unlimited}
		line := fmt.Sprintf("%.0f%%\t", 100*pt.Fraction)
		worst := 0.0
		for i := range est {
			line += fmt.Sprintf("%.1f / %.1f%%\t", 100*est[i], 100*pt.CurveTrue[i])
			worst = max(worst, abs(est[i]-pt.CurveTrue[i]))
		}
		fmt.Fprintf(tw, "%s%.1f pts\t\n", line, 100*worst)
	}
	tw.Flush()
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// bestOnline names the best policy at each capacity.
func (sw *Sweep) bestOnline() []string {
	var out []string
	for _, pt := range sw.Points {
		bi := -1
		for i, r := range pt.Results {
			if r.HintAccuracy > 0 {
				continue // not online: told the future
			}
			if bi < 0 || r.HitBlocks > pt.Results[bi].HitBlocks {
				bi = i
			}
		}
		if bi >= 0 {
			r := pt.Results[bi]
			out = append(out, fmt.Sprintf("%.0f%% %s %.1f%%", 100*pt.Fraction, r.Eviction, 100*ratio(r.HitBlocks, pt.BeladyOwn[bi])))
		}
	}
	return out
}

// formatPct writes a ratio as a percentage with one decimal.
func formatPct(r float64) string { return fmt.Sprintf("%.1f%%", 100*r) }

// formatTiers writes the per-tier figures: hit ratio served by the device
// pool and by the host tier, and the bytes each direction would move at
// the stated model size.
func (sw *Sweep) formatTiers(w io.Writer, t *Trace) {
	pageBytes := sw.BytesPerToken * int64(t.BlockTokens)
	fmt.Fprintf(w, "\ntiers: host tier of %d pages (write-through) below each pool; bytes at %d bytes/token (%.1f MiB per %d-token page)\n",
		sw.HostPages, sw.BytesPerToken, float64(pageBytes)/(1<<20), t.BlockTokens)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "capacity\tpolicy\tdevice hit\thost hit\tremote hit\ttotal hit\tto host\tto device\tto remote\tfrom remote\t")
	tib := func(pages int64) string { return fmt.Sprintf("%.1f TiB", float64(pages*pageBytes)/(1<<40)) }
	for _, pt := range sw.Points {
		for _, r := range pt.Results {
			fmt.Fprintf(tw, "%.0f%%\t%s\t%.1f%%\t%.1f%%\t%.1f%%\t%.1f%%\t%s\t%s\t%s\t%s\t\n", 100*pt.Fraction, r.Eviction,
				100*ratio(r.HitBlocks-r.HostHitBlocks-r.RemoteHitBlocks, r.Blocks), 100*ratio(r.HostHitBlocks, r.Blocks),
				100*ratio(r.RemoteHitBlocks, r.Blocks), 100*r.HitRatio(),
				tib(r.Offloaded), tib(r.Onloaded), tib(r.RemoteStored), tib(r.RemoteFetched))
		}
	}
	tw.Flush()
}

// runWithRemote is Run with a fresh remote store from open (if not nil),
// closed after the run.
func runWithRemote(t *Trace, cfg Config, open func(string, tier.PageFormat) (tier.RemoteStore, func() error, func() error, error), run string) (*Result, error) {
	if open == nil {
		return Run(t, cfg)
	}
	pt := cfg.PageTokens
	if pt == 0 {
		pt = t.BlockTokens
	}
	store, flush, closeStore, err := open(run, RemoteFormat(pt))
	if err != nil {
		return nil, fmt.Errorf("opening the remote store: %w", err)
	}
	cfg.Remote, cfg.Flush = store, flush
	res, err := Run(t, cfg)
	if cerr := closeStore(); err == nil && cerr != nil {
		err = fmt.Errorf("closing the remote store: %w", cerr)
	}
	return res, err
}
