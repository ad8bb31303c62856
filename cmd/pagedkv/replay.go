package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/evict"
	"github.com/pagedkv/pagedkv/internal/replay"
	"github.com/pagedkv/pagedkv/internal/sim"
	"github.com/pagedkv/pagedkv/tier"
	"github.com/pagedkv/pagedkv/tier/redis"
)

func init() {
	register(&command{
		name:    "replay",
		summary: "replay a production trace through the Manager (metadata only): hit ratio per eviction policy and capacity against Belady",
		usage:   "pagedkv replay --trace FILE [--format mooncake|sim] [flags]",
		run:     runReplay,
	})
}

const replayHelp = `
Replays a request trace through pagedkv.Manager with no K/V storage (the
Manager only keeps its books) at several pool capacities under several
eviction policies, and prints per capacity and policy the prefix hit ratio,
its share of Belady's offline optimum over the same block reference
stream, prefill and recomputed tokens, evictions, preemptions, peak pages
and wall time per simulated hour; then the unlimited-capacity ratio
(docs/replay.md).

--format mooncake (the default) reads Mooncake's JSON lines (timestamp ms,
input_length, output_length, hash_ids of 512-token blocks; .gz is read
transparently), e.g. testdata/traces/mooncake_conversation_trace.jsonl.gz.
--format sim reads the project's own trace format (docs/simulate.md), cut
into blocks of --block-tokens tokens.

Without --service, requests are replayed one at a time with no outputs (the
setting of the trace's published figures); capacities are the prefix
cache's room. With --service, requests arrive at their times and run
through the service model (--prefill-rate, --decode-rate, --max-batch,
--step-tokens); capacities are the whole pool, running requests included.

--plot FILE writes hit ratio against capacity per policy, with Belady and
the unlimited line (.png or .svg).

Totals are checked before any work, and a run over one is refused with the
value named: the simulated work over every capacity and policy (or router)
against --max-work, --replicas (at most 1024) and their pools, --max-batch;
the --plot file is opened before the trace is read (docs/replay.md,
"Limits of a replay").

Flags:
`

func runReplay(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("replay", replayHelp, stderr)
	tracePath := fs.String("trace", "", "trace file (required)")
	format := fs.String("format", "mooncake", "trace format: mooncake or sim")
	blockTokens := fs.Int("block-tokens", 16, "--format sim: tokens per block (page)")
	policies := fs.String("policies", strings.Join(replay.DefaultPolicies, ","), "comma-separated eviction policies: "+strings.Join(evict.Names(), ", "))
	capacities := fs.String("capacities", "2,5,10,25,50", "comma-separated capacities in percent of the trace's distinct blocks")
	service := fs.Bool("service", false, "run the service model instead of one request at a time")
	pageTokens := 0
	fs.Func("page-tokens", "tokens synthesized per block page, 1..the trace's block; default 16 in sequential replays (the same hits at a fraction of the token work; docs/replay.md), the whole block with --service", func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fmt.Errorf("want a positive integer, got %q", v)
		}
		pageTokens = n
		return nil
	})
	hintAcc := fs.String("hint-accuracy", "", "comma-separated accuracies in percent (e.g. 100,90,70): replay each policy that reads continuation hints (adaptive) once more per accuracy, hinted by an oracle of the trace's future, each request's hints inverted with probability 1 - accuracy (docs/replay.md)")
	hintHorizon := fs.Int64("hint-horizon", 0, "--hint-accuracy: a block is hinted reused when referenced again within this many block references (0: at all)")
	hintSeed := fs.Uint64("hint-seed", 1, "--hint-accuracy: the seed of the hints' errors")
	curve := fs.Float64("curve-rate", 0, "keep the live miss-ratio curve at this sampling rate in percent (e.g. 12.5; 0: none) and check it against LRU replayed at 1/2x, 2x and 4x each capacity")
	first := fs.Int("first", 0, "replay only the trace's first N requests, reading no further (0: all)")
	svc := replay.DefaultService()
	fs.Float64Var(&svc.PrefillTokensPerSec, "prefill-rate", svc.PrefillTokensPerSec, "--service: prefill tokens per second")
	fs.Float64Var(&svc.DecodeTokensPerSec, "decode-rate", svc.DecodeTokensPerSec, "--service: decode tokens per second (whole batch)")
	fs.IntVar(&svc.MaxBatch, "max-batch", svc.MaxBatch, "--service: most running requests")
	fs.IntVar(&svc.StepTokens, "step-tokens", svc.StepTokens, "--service: token budget per step")
	plotPath := fs.String("plot", "", "write the hit-ratio plot to this .png or .svg file")
	hostPct := fs.Float64("host-capacity", 0, "a host tier below every pool, in percent of the trace's distinct blocks (0: none)")
	redisAddr := fs.String("redis", "", "with --host-capacity: a Redis server (host:port, which you run, e.g. with --maxmemory and --maxmemory-policy allkeys-lru for its capacity) as the remote tier below the host tier; each run writes under its own namespace")
	model := fs.String("model", "", "a `simulate --model` preset to replay through a HybridManager ("+strings.Join(sim.ModelNames(), ", ")+"); the pool is shared by its layer groups")
	ckptEvery := fs.Int("state-checkpoint-every", 8, "with a --model of state groups (qwen3-next-like, nemotron-h-like): a prefix checkpoint of their state every N pages of a prompt, vLLM's retention interval (8, the default, hit most of 2, 4, 8 and 16 on the Mooncake trace; 0: only each prompt's last whole page and shared-prefix junctions)")
	bytesPerToken := fs.Int64("bytes-per-token", 327_680, "the stated model's K/V bytes per token for the tiers' bytes moved (default: 80 layers x 8 K/V heads x 128 dims x K and V x bf16, a Llama-3-70B-like model)")
	replicas := fs.Int("replicas", 0, "instead of the sweep, run N replicas (at most 1024) under the service model behind each router (prefix, round-robin, least-loaded), each with a pool of the first --capacities value (at least the largest request) and the first --policies policy")
	slack := fs.Int("router-slack", 4, "--replicas: the prefix router picks among replicas with load <= least load + this (-1: any)")
	maxWork := fs.Int64("max-work", replay.DefaultMaxWork, "most simulated work a run may ask for, in units of a prompt token (an output token counts 64 under the service model), over every capacity and policy (or router); refused before any work (docs/replay.md)")
	lim := replay.DefaultLimits()
	fs.IntVar(&lim.MaxRequests, "max-requests", lim.MaxRequests, "most requests a trace may hold")
	fs.IntVar(&lim.MaxBlocks, "max-blocks", lim.MaxBlocks, "most block references a trace may hold")
	if code, ok := parseFlagsOnly(fs, args, stderr); !ok {
		return code
	}
	plotWritten := false
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "pagedkv replay: "+format+"\n", a...)
		return exitUsage
	}
	if *tracePath == "" {
		return usageErr("--trace is required")
	}
	fractions, err := parsePercents(*capacities, "capacity")
	if err != nil {
		return usageErr("--capacities: %v", err)
	}
	var accs []float64
	if *hintAcc != "" {
		if accs, err = parsePercents(*hintAcc, "accuracy"); err != nil {
			return usageErr("--hint-accuracy: %v", err)
		}
	}
	if !(*curve >= 0 && *curve <= 100) {
		return usageErr("--curve-rate %g: want 0..100 percent", *curve)
	}
	if *hintHorizon < 0 {
		return usageErr("--hint-horizon %d: want >= 0", *hintHorizon)
	}
	names := strings.Split(*policies, ",")
	for _, n := range names {
		if _, err := evict.New(n); err != nil {
			return usageErr("--policies: %v", err)
		}
	}
	if *plotPath != "" && !strings.HasSuffix(*plotPath, ".png") && !strings.HasSuffix(*plotPath, ".svg") {
		return usageErr("--plot %q: want a .png or .svg file", *plotPath)
	}
	if *replicas < 0 || *replicas > replay.MaxReplicas {
		return usageErr("--replicas %d: want 1..%d (0: the sweep)", *replicas, replay.MaxReplicas)
	}
	if *maxWork < 1 {
		return usageErr("--max-work %d: want >= 1", *maxWork)
	}
	if *hostPct < 0 || *hostPct > 100 || *bytesPerToken < 1 {
		return usageErr("--host-capacity %g, --bytes-per-token %d: want a percentage in [0, 100] and >= 1 byte", *hostPct, *bytesPerToken)
	}
	if *redisAddr != "" && *hostPct == 0 {
		return usageErr("--redis needs --host-capacity (the remote tier sits below the host tier)")
	}
	if *first < 0 {
		return usageErr("--first %d, want >= 0", *first)
	}
	ckptSet := false
	fs.Visit(func(f *flag.Flag) { ckptSet = ckptSet || f.Name == "state-checkpoint-every" })
	if *model != "" {
		p, err := sim.Preset(*model)
		if err != nil {
			return usageErr("--model: %v", err)
		}
		if !ckptSet && !slices.ContainsFunc(p.Pattern, func(g pagedkv.LayerGroup) bool { return g.Kind == pagedkv.StateLayers }) {
			*ckptEvery = 0 // the default interval is for models with state groups
		}
	} else if !ckptSet {
		*ckptEvery = 0
	}
	if *ckptEvery < 0 {
		return usageErr("--state-checkpoint-every %d, want >= 0", *ckptEvery)
	}
	if *plotPath != "" {
		// The plot file is opened for writing now, so a path that cannot
		// be written is refused before the sweep, not after it; a file
		// created here is removed again if the run fails before the plot.
		created, err := createPlotFile(*plotPath)
		if err != nil {
			return usageErr("--plot %q: %v", *plotPath, err)
		}
		defer func() {
			if created && !plotWritten {
				os.Remove(*plotPath)
			}
		}()
	}
	var t *replay.Trace
	switch *format {
	case "mooncake":
		lim.First = *first // the requests past --first are not even read
		t, err = replay.OpenMooncake(*tracePath, lim)
	case "sim":
		t, err = readSimTrace(*tracePath, *blockTokens, lim)
	default:
		return usageErr("--format %q: want mooncake or sim", *format)
	}
	if err != nil {
		return usageErr("%v", err)
	}
	if *first > 0 {
		t = t.Prefix(*first)
	}
	var svcp *replay.Service
	if *service {
		svcp = &svc
	} else if pageTokens == 0 {
		pageTokens = min(16, t.BlockTokens)
	}
	p := newProgress(stderr)
	p.label = "replay"
	if *replicas != 0 {
		cfg := replay.FleetConfig{Replicas: *replicas, LoadSlack: *slack, Eviction: names[0], Service: svc, MaxWork: *maxWork,
			CapacityPages: max(int(fractions[0]*float64(t.DistinctBlocks)), t.MinPoolPages())}
		if err := replay.CheckFleet(t, cfg, len(replay.Routers)); err != nil {
			return usageErr("--replicas %d: %v", *replicas, err)
		}
		return runReplayFleet(t, cfg, p, stdout, stderr)
	}
	runs := len(names)
	for range accs {
		for _, n := range names {
			if evict.ReadsHints(n) {
				runs++
			}
		}
	}
	total := len(t.Requests) * len(fractions) * runs
	sw, err := replay.RunSweep(t, replay.SweepConfig{Fractions: fractions, Policies: names, Service: svcp, PageTokens: pageTokens,
		HintAccuracies: accs, HintHorizon: *hintHorizon, HintSeed: *hintSeed, CurveRate: *curve / 100,
		HostPages: int(*hostPct / 100 * float64(t.DistinctBlocks)), BytesPerToken: *bytesPerToken, OpenRemote: redisOpener(*redisAddr), Model: *model,
		StateCheckpointPages: *ckptEvery,
		MaxWork:              *maxWork, Progress: func(n int) { p.update(sim.Progress{Finished: n, Total: total}) }})
	p.done()
	if err != nil {
		fmt.Fprintf(stderr, "pagedkv replay: %v\n", err)
		if errors.Is(err, replay.ErrBadConfig) {
			return exitUsage
		}
		return exitFailure
	}
	sw.Format(stdout, t)
	if *plotPath != "" {
		title := "prefix hit ratio by capacity, sequential"
		if svcp != nil {
			title = "prefix hit ratio by capacity, service model"
		}
		if err := sw.WritePlot(*plotPath, title); err != nil {
			fmt.Fprintf(stderr, "pagedkv replay: plot: %v\n", err)
			return exitFailure
		}
		plotWritten = true
		fmt.Fprintf(stdout, "plot: %s\n", *plotPath)
	}
	return exitOK
}

// createPlotFile opens the plot file at path for writing, creating it if
// missing (an existing file keeps its bytes until the plot replaces
// them), so that a path that cannot be written fails before any work;
// created says it did not exist before.
func createPlotFile(path string) (created bool, err error) {
	_, statErr := os.Lstat(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return false, err
	}
	return errors.Is(statErr, os.ErrNotExist), f.Close()
}

// parsePercents parses "2,5,10" into fractions, each in (0, 100].
func parsePercents(s, what string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(v > 0 && v <= 100) {
			return nil, fmt.Errorf("%s %q, want a percentage in (0, 100]", what, f)
		}
		out = append(out, v/100)
	}
	return out, nil
}

// readSimTrace reads the project's own trace format as blocks.
func readSimTrace(path string, blockTokens int, lim replay.Limits) (*replay.Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	reqs, err := sim.ParseTraceLimits(f, sim.TraceLimits{MaxRequests: lim.MaxRequests, MaxTokens: int64(lim.MaxBlocks) * int64(max(blockTokens, 1))})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return replay.FromSim(reqs, blockTokens)
}

// runReplayFleet runs the replicas under every router and prints the
// comparison.
func runReplayFleet(t *replay.Trace, cfg replay.FleetConfig, p *progress, stdout, stderr io.Writer) int {
	var runs []*replay.FleetResult
	for k, router := range replay.Routers {
		cfg.Router = router
		cfg.Progress = func(n int) {
			p.update(sim.Progress{Finished: k*len(t.Requests) + n, Total: len(replay.Routers) * len(t.Requests)})
		}
		f, err := replay.RunFleet(t, cfg)
		if err != nil {
			p.done()
			fmt.Fprintf(stderr, "pagedkv replay: %s router: %v\n", router, err)
			if errors.Is(err, replay.ErrBadConfig) {
				return exitUsage
			}
			return exitFailure
		}
		runs = append(runs, f)
	}
	p.done()
	fmt.Fprintf(stdout, "trace: %d requests, %d block references, %d distinct blocks of %d tokens\n",
		len(t.Requests), t.References, t.DistinctBlocks, t.BlockTokens)
	replay.FormatFleet(stdout, cfg, runs)
	return exitOK
}

// redisOpener opens a store on the Redis server at addr per run, under a
// namespace of its own (nil without an address).
func redisOpener(addr string) func(string, tier.PageFormat) (tier.RemoteStore, func() error, func() error, error) {
	if addr == "" {
		return nil
	}
	session := time.Now().UnixNano()
	return func(run string, f tier.PageFormat) (tier.RemoteStore, func() error, func() error, error) {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, nil, nil, fmt.Errorf("--redis %q: %w", addr, err)
		}
		store, err := redis.New(redis.Config{Addr: addr, Namespace: fmt.Sprintf("pagedkv-replay-%d-%s", session, run), Format: f}.FromEnv())
		if err != nil {
			return nil, nil, nil, err
		}
		flush := func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			return store.Flush(ctx)
		}
		return store, flush, store.Close, nil
	}
}
