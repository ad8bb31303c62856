package replay

import (
	"fmt"
	"math"
	"math/bits"
)

// Totals. A trace's limits bound each request and the trace; these bound
// what a replay of it costs in time and memory, and are checked before any
// work (docs/replay.md, "Limits of a replay").
const (
	// DefaultMaxWork is the most simulated work a sweep or a fleet replay
	// may ask for, in units of [Work]: twice the whole Mooncake trace
	// under the service model at the default five capacities and four
	// policies (8.58e9).
	DefaultMaxWork int64 = 1 << 34
	// DecodeTokenWork is what one output token counts in [Work]: a decode
	// token is a step of its request (about 1 µs), a prompt token a
	// fraction of one page's work (about 20 ns at 512-token pages:
	// docs/replay.md, "Cost").
	DecodeTokenWork = 64
	// RunWork is what each replay (capacity and policy, or router) of a
	// sweep counts in [Work] beside its tokens: a Manager made, its pool's
	// pages (× their tokens) set up, a report line (about 1 ms).
	RunWork = 1 << 16
	// MaxReplicas bounds FleetConfig.Replicas (`--replicas`).
	MaxReplicas = 1024
	// MaxPoolTokens bounds the tokens a replay's pools hold at once (a
	// Manager's pool keeps its pages' tokens: about 4 bytes a token, 2 KiB
	// a 512-token page): a sweep's pool and host tier at its largest
	// capacity ((CapacityPages + HostPages) × tokens per page), a fleet's
	// pools together (Replicas × CapacityPages × the trace's BlockTokens).
	// 2^29 is 5.7 times the whole trace's every block in one pool at 512
	// tokens a page, 29 times the four replicas of 5% docs/replay.md
	// reports.
	MaxPoolTokens = 1 << 29
	// MaxBlockTokens bounds a trace's tokens per block (`--block-tokens`
	// of a sim trace; Mooncake's are 512): a page holds a block.
	MaxBlockTokens = 1 << 16
	// MaxServiceBatch bounds Service.MaxBatch (`--max-batch`), which
	// each engine allocates for.
	MaxServiceBatch = 1 << 16
	// MaxPreemptionsPerRequest bounds the preemptions of one replay under
	// the service model (or of one replica) to this many times the
	// trace's requests: a pool that fits only a few requests admits the
	// rest, preempts them and resumes them again every step (each
	// resumption recorded in the reference stream), so work and memory
	// grow with steps × batch. Past it the replay stops with ErrBadConfig
	// naming the pool. The whole Mooncake trace preempts nothing at the
	// capacities docs/replay.md reports; the tests' replays under
	// pressure preempt up to 180 times a request.
	MaxPreemptionsPerRequest = 4096
)

// Work is the simulated work of one replay of t, in units of one prompt
// token synthesized and checked by the Manager: per request its blocks ×
// pageTokens + 1 (the query token), and with the service model its output
// tokens × DecodeTokenWork. It saturates at math.MaxInt64.
func Work(t *Trace, pageTokens int, service bool) int64 {
	var w int64
	for i := range t.Requests {
		q := &t.Requests[i]
		w = addSat(w, addSat(mulSat(int64(len(q.Blocks)), int64(pageTokens)), 1))
		if service {
			w = addSat(w, mulSat(int64(q.OutputTokens), DecodeTokenWork))
		}
	}
	return w
}

// checkWork refuses work above limit (0: DefaultMaxWork), naming both and
// what made it up.
func checkWork(work, limit int64, what string) error {
	if limit == 0 {
		limit = DefaultMaxWork
	}
	if work > limit {
		return fmt.Errorf("%w: %s: %d units of work, over the limit of %d (MaxWork, --max-work); replay fewer requests (--first), capacities or policies, or raise the limit",
			ErrBadConfig, what, work, limit)
	}
	return nil
}

// checkSweep refuses a sweep whose work or largest pool is over the
// limits, naming the value.
func checkSweep(t *Trace, cfg SweepConfig, groups int) error {
	pageTokens := cfg.PageTokens
	if pageTokens == 0 {
		pageTokens = t.BlockTokens
	}
	least := int64(t.MinPoolPages() * max(groups, 1))
	for _, f := range cfg.Fractions {
		pool := max(int64(f*float64(t.DistinctBlocks)), least) // as RunSweep sizes it
		if tokens := mulSat(addSat(pool, int64(max(cfg.HostPages, 0))), int64(pageTokens)); tokens > MaxPoolTokens {
			return fmt.Errorf("%w: capacity %g%%: a pool of %d pages and a host tier of %d, × %d tokens = %d tokens, over the limit of %d (MaxPoolTokens)",
				ErrBadConfig, 100*f, pool, cfg.HostPages, pageTokens, tokens, MaxPoolTokens)
		}
	}
	w, what := sweepWork(t, cfg, groups)
	return checkWork(w, cfg.MaxWork, what)
}

// sweepWork is the work of a sweep: one replay per capacity and policy,
// each of the model's layer groups (at least one) doing a Manager's work.
func sweepWork(t *Trace, cfg SweepConfig, groups int) (int64, string) {
	pageTokens := cfg.PageTokens
	if pageTokens == 0 {
		pageTokens = t.BlockTokens
	}
	one := addSat(Work(t, pageTokens, cfg.Service != nil), RunWork)
	var w int64
	least := int64(t.MinPoolPages() * max(groups, 1))
	for _, f := range cfg.Fractions {
		pool := max(int64(f*float64(t.DistinctBlocks)), least) // as RunSweep sizes it
		w = addSat(w, addSat(one, mulSat(pool, int64(pageTokens))))
	}
	runs := len(sweepRuns(cfg.Policies, cfg.HintAccuracies))
	if cfg.CurveRate > 0 {
		runs += 3 // LRU at ½×, 2× and 4×, the curve's truth (counted at 1×: a bound on the runs, not the pools)
	}
	w = mulSat(mulSat(w, int64(runs)), int64(max(groups, 1)))
	what := fmt.Sprintf("%d requests (%d units each replay, and its pool) × %d capacities × %d policies", len(t.Requests), one, len(cfg.Fractions), runs)
	if groups > 1 {
		what += fmt.Sprintf(" × %d layer groups", groups)
	}
	return w, what
}

// CheckFleet refuses a fleet replay whose replicas, pools or work (runs
// replays of the whole trace under the service model: one per router)
// are over the limits, before any work; the error names the value.
func CheckFleet(t *Trace, cfg FleetConfig, runs int) error {
	switch {
	case cfg.Replicas < 1 || cfg.Replicas > MaxReplicas:
		return fmt.Errorf("%w: %d replicas, want 1..%d (MaxReplicas)", ErrBadConfig, cfg.Replicas, MaxReplicas)
	case cfg.CapacityPages < 1:
		return fmt.Errorf("%w: CapacityPages %d, want >= 1", ErrBadConfig, cfg.CapacityPages)
	}
	if tokens := mulSat(mulSat(int64(cfg.Replicas), int64(cfg.CapacityPages)), int64(t.BlockTokens)); tokens > MaxPoolTokens {
		return fmt.Errorf("%w: %d replicas × %d pages × %d tokens = %d tokens of pools, over the limit of %d (MaxPoolTokens)",
			ErrBadConfig, cfg.Replicas, cfg.CapacityPages, t.BlockTokens, tokens, MaxPoolTokens)
	}
	if err := cfg.Service.validate(); err != nil {
		return err
	}
	// Each arrival also advances every replica.
	one := addSat(Work(t, t.BlockTokens, true), mulSat(int64(len(t.Requests)), int64(cfg.Replicas)))
	one = addSat(one, mulSat(RunWork, int64(cfg.Replicas)))
	return checkWork(mulSat(one, int64(runs)), cfg.MaxWork,
		fmt.Sprintf("%d requests to %d replicas (%d units each replay) × %d routers", len(t.Requests), cfg.Replicas, one, runs))
}

func addSat(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxInt64
}

// mulSat multiplies non-negative a and b, saturating at math.MaxInt64.
func mulSat(a, b int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(lo)
}
