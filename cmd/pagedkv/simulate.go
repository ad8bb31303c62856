package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/pagedkv/pagedkv/evict"
	"github.com/pagedkv/pagedkv/internal/sim"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/metrics"
)

func init() {
	register(&command{
		name:    "simulate",
		summary: "drive a serving workload through the Manager with real append and attention, verifying as it goes",
		usage:   "pagedkv simulate [--trace FILE] [flags]",
		run:     runSimulate,
	})
}

const simulateHelp = `
Runs a serving workload through a pagedkv.Manager: requests arrive, are
admitted on cached prefixes, prefilled in chunks, decoded, preempted when
the pool runs short, forked for parallel samples, and finished. Every step
appends K/V and computes attention (decode, prefill or cascade) on the
backend, and every --verify-every steps sampled outputs and the paged K/V
behind them are checked against float64 attention over dense K/V rebuilt
from the token ids. Prints a summary; exits 0 only if every check passed
(1 on a failed check, 2 on bad flags or a bad trace).

Without --trace it runs the built-in workload (--requests requests behind a
few shared system prompts, in two namespaces). A trace is JSONL, one
request per line (docs/simulate.md):

  {"arrival": 0, "prompt_len": 96, "prefix": "sys", "prefix_len": 64, "output": 32}
  {"arrival": 2, "prompt": [1, 2, 3], "output": 8, "namespace": "tenant-b", "samples": 2}

KV events (docs/events.md): --kv-events ADDR publishes every change of the
prefix cache in vLLM's KV-event format on a ZeroMQ PUB socket at ADDR (e.g.
tcp://127.0.0.1:5557): after every step one message of three frames, the
topic (--kv-events-topic, default "kv-events"), the sequence number (0, 1,
2, ...) as 8 bytes big-endian, and the msgpack payload of a KVEventBatch:
the array [ts float64, events, data_parallel_rank 0], each event a map
tagged "type": BlockStored {block_hashes, parent_block_hash, token_ids,
block_size, lora_id, medium, lora_name}, BlockRemoved {block_hashes,
medium} or AllBlocksCleared; medium is "GPU" for the device prefix cache and
"CPU" for pages of the host tier (--host-pages). Block hashes are the Manager's 64-bit prefix
chain hashes (seeded with --seed|1). The run waits up to --kv-events-wait
for a subscriber first and serves replays (--kv-events-replay ADDR, vLLM's
ROUTER protocol) for --kv-events-linger after it.

--spec-tokens K turns on speculative decoding: every decoding request
proposes K draft tokens per step (a deterministic draft model that agrees
with the target three times in four), the step computes K/V and attention
for its last token and the drafts (prefill rows), the longest prefix of
drafts equal to what the target samples is accepted, and one more token is
sampled after it (Manager.ReserveSpec / CommitSpec). The tokens generated
are the same as without drafts; draft rows are verified like any other, and
rejected drafts' K/V is rolled back before the next step.

--model NAME picks the model's attention (docs/simulate.md): dense (the
default: every layer full attention, or --window W) or a hybrid model whose
layers form groups with their own attention on one page pool, driven by a
pagedkv.HybridManager: gpt-oss-like (sliding window 128 and full attention,
alternating), gemma-3-like (five sliding-window-64 layers to one full),
llama-4-like (chunked attention of 128 tokens on three layers of four, full
on the fourth). Windows and chunks are scaled to the simulator's sequences
(docs/simulate.md says how). Every group's outputs are checked against
float64 attention over the whole sequence under that group's window or
chunk, and the summary reports each group's pages, prefix-cache numbers and
verified outputs. Hybrid models run on host backends, with --spec-tokens,
preemption, eviction, --kv-events (every event carries its group's
group_idx, BlockStored its kv_cache_spec_kind) and --replicas, but not with
--window, --host-pages or --redis.

--replicas R runs R replicas (each its own Manager, or HybridManager with a
hybrid --model, and verified attention) connected to a router only by their
KV events over loopback ZeroMQ; each arriving request goes to the replica
with the longest cached prefix among those with load (running + waiting) <=
least load + --route-slack, ties to the less loaded, then the lower number.
With a hybrid model the events carry their group_idx and a replica's cached
prefix is the one every layer group holds (the HybridManager's admission
rule). The same workload then runs with round robin, and the summary
compares prefix hits and recomputed tokens.

--disaggregated runs a prefill side and a decode side in one process
(docs/tiers.md): the prefill side computes each prompt, exports the
request's full pages (coalesced into runs of consecutive device pages) over
a loopback TCP stream that the decode side verifies before admitting; the
decode side is served them as prefix hits, computes the rest and the
output, and is verified as any run; its tokens must equal a single-process
run's. The summary reports the pages, descriptors and bytes handed off.

Flags:
`

// metricsServed, when not nil, is called with the metrics URL after the run
// and before the metrics server stops (tests scrape it there).
var metricsServed func(url string)

func runSimulate(args []string, stdout, stderr io.Writer) int {
	cfg := sim.DefaultConfig()
	wl := sim.DefaultWorkloadConfig()
	fs := newFlagSet("simulate", simulateHelp, stderr)
	trace := fs.String("trace", "", "JSONL trace of requests (- for stdin); default: the built-in workload")
	lim := sim.DefaultTraceLimits()
	fs.IntVar(&lim.MaxRequests, "trace-max-requests", lim.MaxRequests, "most requests a trace may hold")
	fs.Int64Var(&lim.MaxTokens, "trace-max-tokens", lim.MaxTokens, "most tokens a trace may hold (every prompt plus samples*output)")
	fs.IntVar(&wl.Requests, "requests", wl.Requests, "requests of the built-in workload")
	curveRate := fs.Float64("curve-rate", 0, "keep the live miss-ratio curve at this sampling rate in percent (e.g. 12.5; 0: none) and print it")
	fs.StringVar(&cfg.Eviction, "eviction", evict.LRU, "prefix-cache eviction policy: "+strings.Join(evict.Names(), ", ")+" (docs/replay.md)")
	fs.Uint64Var(&wl.Seed, "workload-seed", wl.Seed, "seed of the built-in workload")
	model := fs.String("model", "dense", "model: "+strings.Join(sim.ModelNames(), ", ")+" (hybrid attention presets, docs/simulate.md)")
	fs.IntVar(&cfg.Model.Layers, "layers", cfg.Model.Layers, "model layers; when not given, the --model preset's: 6 (one pattern) for gemma-3-like, else")
	fs.IntVar(&cfg.Model.NumQOHeads, "qo-heads", cfg.Model.NumQOHeads, "query heads (Hq)")
	fs.IntVar(&cfg.Model.NumKVHeads, "kv-heads", cfg.Model.NumKVHeads, "K/V heads (Hkv)")
	fs.IntVar(&cfg.Model.HeadDim, "head-dim", cfg.Model.HeadDim, "head dimension (D)")
	dtype := fs.String("dtype", cfg.Model.DType.String(), "cache, query and output dtype: f16, bf16, f32")
	kvDType := fs.String("kv-dtype", "", "cache dtype when it differs from --dtype: nvfp4 (FlashInfer's NVFP4 pages, quantised on append; cpu backend; head dim a multiple of 16)")
	kvLayout := fs.String("kv-layout", cfg.KVLayout.String(), "cache layout: NHD or HND")
	fs.IntVar(&cfg.PageSize, "page-size", cfg.PageSize, "tokens per page")
	fs.IntVar(&cfg.NumPages, "pages", cfg.NumPages, "pages in the pool")
	fs.IntVar(&cfg.WindowTokens, "window", 0, "sliding window in tokens (0: full attention)")
	fs.IntVar(&cfg.CascadeMinSavedPages, "cascade-min-saved", 0, "page reads a cascade level must save per step (0: the Manager's default, <0: never cascade)")
	fs.IntVar(&cfg.MaxStepTokens, "step-tokens", cfg.MaxStepTokens, "token budget of a step (chunked prefill)")
	fs.IntVar(&cfg.MaxRunning, "max-running", cfg.MaxRunning, "most requests running at once")
	fs.IntVar(&cfg.SpecTokens, "spec-tokens", 0, fmt.Sprintf("draft tokens each decoding request proposes per step, 0..%d (0: no speculative decoding)", sim.MaxSpecTokens))
	fs.IntVar(&cfg.VerifyEvery, "verify-every", cfg.VerifyEvery, "check outputs, paged K/V and the Manager every N steps")
	fs.IntVar(&cfg.VerifySamples, "verify-samples", cfg.VerifySamples, "outputs checked per checked step")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the model's K/V/Q and the checked samples")
	fs.IntVar(&cfg.HostPages, "host-pages", 0, "pages of the host tier below the pool: evicted prefix pages are offloaded there and served back (0: none)")
	redisAddr := fs.String("redis", "", "share prefix pages through the Redis server at ADDR (host:port; needs --host-pages; starts nothing)")
	redisDeadline := fs.Duration("redis-deadline", 0, "deadline of a Redis lookup (0: the Manager's default)")
	backendName := fs.String("backend", "cpu", "backend: "+strings.Join(backendNames(), ", "))
	metricsAddr := fs.String("metrics-addr", "", "serve Prometheus metrics at http://ADDR/metrics while running (e.g. 127.0.0.1:9090); off by default")
	quiet := fs.Bool("quiet", false, "no progress output")
	kv := kvEventFlags(fs)
	replicas := fs.Int("replicas", 1, "run R replicas behind a prefix-aware router fed only by their KV events over loopback ZeroMQ, and compare with round robin on the same workload (docs/events.md)")
	disaggregated := fs.Bool("disaggregated", false, "run a prefill process and a decode process in one process, handing each request's KV over loopback TCP, and compare with a single-process run (docs/tiers.md)")
	slack := fs.Int("route-slack", sim.DefaultLoadSlack, "with --replicas: a replica is a routing candidate while its load (requests running or waiting) is at most the least load plus this (<0: no cap)")
	if code, ok := parseFlagsOnly(fs, args, stderr); !ok {
		return code
	}
	fail := func(code int, format string, args ...any) int {
		fmt.Fprintf(stderr, "pagedkv simulate: "+format+"\n", args...)
		return code
	}
	if !(*curveRate >= 0 && *curveRate <= 100) {
		return fail(exitUsage, "--curve-rate %g: want 0..100 percent", *curveRate)
	}
	cfg.CurveRate = *curveRate / 100
	var err error
	if cfg.Model.DType, err = layout.ParseDType(*dtype); err != nil {
		return fail(exitUsage, "--dtype: %v", err)
	}
	if *kvDType != "" {
		if cfg.Model.KVDType, err = layout.ParseDType(*kvDType); err != nil {
			return fail(exitUsage, "--kv-dtype: %v", err)
		}
	}
	if cfg.KVLayout, err = layout.ParseKVLayout(strings.ToUpper(*kvLayout)); err != nil {
		return fail(exitUsage, "--kv-layout: %v", err)
	}
	if cfg.Backend, err = openBackend(*backendName); err != nil {
		return fail(usageOr(err, exitFailure), "%v", err)
	}
	cfg.Model.Seed = cfg.Seed
	if code, ok := hybridFlags(fs, &cfg, *model, *redisAddr, fail); !ok {
		return code
	}
	if cfg.SpecTokens < 0 || cfg.SpecTokens > sim.MaxSpecTokens {
		return fail(exitUsage, "--spec-tokens: %d is out of range 0..%d", cfg.SpecTokens, sim.MaxSpecTokens)
	}
	if cfg.HostPages < 0 {
		return fail(exitUsage, "--host-pages: %d is negative", cfg.HostPages)
	}
	if *redisDeadline < 0 {
		return fail(exitUsage, "--redis-deadline: %v is negative", *redisDeadline)
	}
	cfg.RemoteDeadline = *redisDeadline
	if *redisAddr != "" {
		if cfg.HostPages == 0 {
			return fail(exitUsage, "--redis needs --host-pages (fetched pages land in host pages)")
		}
		store, err := openRedis(*redisAddr, &cfg)
		if err != nil {
			return fail(exitUsage, "--redis: %v", err)
		}
		defer store.Close()
		cfg.Remote = store
	}

	var workload []sim.Request
	if *trace != "" {
		workload, err = readTrace(*trace, lim)
	} else {
		workload, err = sim.Workload(wl)
	}
	if err != nil {
		return fail(exitUsage, "%v", err)
	}
	var prog *progress
	if !*quiet {
		prog = newProgress(stderr)
		cfg.Progress = prog.update
	}
	if *disaggregated {
		return runDisaggregated(cfg, workload, *replicas, *kv.addr, *metricsAddr, *redisAddr, prog, stdout, fail)
	}
	if *replicas != 1 {
		if *kv.addr != "" {
			return fail(exitUsage, "--kv-events publishes a single-replica run; drop it or --replicas %d", *replicas)
		}
		if *metricsAddr != "" {
			return fail(exitUsage, "--metrics-addr serves a single-replica run; drop it or --replicas %d", *replicas)
		}
		return runFleet(cfg, workload, sim.FleetConfig{Replicas: *replicas, LoadSlack: *slack}, stdout, stderr, *quiet)
	}
	if *kv.addr != "" {
		pub, rec, err := kv.open(&cfg, stderr)
		if err != nil {
			return fail(exitFailure, "%v", err)
		}
		cfg.Events = rec
		defer func() {
			pub.Close() // sends what is queued, serves replays for --kv-events-linger
			kv.report(stdout, pub, rec)
		}()
	}
	s, err := sim.New(cfg, workload)
	if err != nil {
		return fail(exitUsage, "%v", err)
	}

	if *metricsAddr != "" {
		url, stop, err := serveMetrics(*metricsAddr, metrics.NewCollector(s.Stats, metrics.Options{}))
		if err != nil {
			return fail(exitFailure, "--metrics-addr: %v", err)
		}
		defer stop()
		fmt.Fprintf(stderr, "simulate: serving metrics at %s\n", url)
		if metricsServed != nil {
			defer metricsServed(url) // runs before stop
		}
	}
	sum, err := s.Run()
	if prog != nil {
		prog.done() // clear the bar before the summary
	}
	sum.Format(stdout, &cfg)
	if err != nil {
		fmt.Fprintf(stderr, "pagedkv simulate: %v\n", err)
		return exitFailure
	}
	return exitOK
}

// hybridFlags applies --model to cfg: the preset's layer count unless
// --layers was given, and its layer groups; a hybrid model refuses the
// flags of features the simulator does not combine with layer groups.
func hybridFlags(fs *flag.FlagSet, cfg *sim.Config, model, redisAddr string,
	fail func(int, string, ...any) int) (int, bool) {
	preset, err := sim.Preset(model)
	if err != nil {
		return fail(exitUsage, "--model: %v", err), false
	}
	layersSet := false
	fs.Visit(func(f *flag.Flag) { layersSet = layersSet || f.Name == "layers" })
	if !layersSet {
		cfg.Model.Layers = preset.Layers
	}
	if cfg.Groups, err = preset.Groups(cfg.Model.Layers); err != nil {
		return fail(exitUsage, "--layers: %v", err), false
	}
	cfg.Model.Sinks = preset.Sinks
	if cfg.Groups == nil {
		return 0, true
	}
	for _, c := range []struct {
		set  bool
		flag string
		why  string
	}{
		{cfg.WindowTokens != 0, "--window", "its windows are its groups' (docs/simulate.md)"},
		{sim.DeviceBackend(cfg.Backend), "--backend " + cfg.Backend.Name(), "the device-resident path runs dense models; hybrid models run on host backends (cpu)"},
	} {
		if c.set {
			return fail(exitUsage, "%s is not supported with --model %s: %s", c.flag, model, c.why), false
		}
	}
	return 0, true
}

// readTrace parses the trace at path ("-" for stdin) within lim.
func readTrace(path string, lim sim.TraceLimits) ([]sim.Request, error) {
	if path == "-" {
		return sim.ParseTraceLimits(os.Stdin, lim)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	reqs, err := sim.ParseTraceLimits(f, lim)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return reqs, nil
}

// serveMetrics serves c at http://addr/metrics, bound to exactly addr,
// and returns the URL (with the port chosen for ":0") and a stop function.
func serveMetrics(addr string, c prometheus.Collector) (url string, stop func(), err error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(c); err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // returns ErrServerClosed on stop
	return "http://" + ln.Addr().String() + "/metrics", func() { srv.Close() }, nil
}

// progress renders sim.Progress: on a terminal, a bar drawn by
// github.com/schollz/progressbar (it fits the terminal's width, throttles
// redraws and shows an ETA); otherwise, where \r redraws would litter a log,
// a plain line per tenth of the requests.
type progress struct {
	w     io.Writer
	bar   *progressbar.ProgressBar // terminal only; made at the first update
	term  bool
	tenth int // plain mode: tenths of the requests reported so far
	// label, when set, replaces the step description (commands without
	// steps, such as replay, report requests only).
	label string
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.term = true
		}
	}
	return p
}

func (p *progress) update(s sim.Progress) {
	if p.term {
		if p.bar == nil {
			// The full terminal width, unless the terminal does not say
			// (some ptys report 0 columns): then a 30-column bar.
			width := progressbar.OptionSetWidth(30)
			if f, ok := p.w.(*os.File); ok {
				if cols, _, err := term.GetSize(int(f.Fd())); err == nil && cols >= 60 {
					width = progressbar.OptionFullWidth()
				}
			}
			p.bar = progressbar.NewOptions(max(s.Total, 1),
				progressbar.OptionSetWriter(p.w),
				width,
				progressbar.OptionShowCount(),
				progressbar.OptionSetItsString("requests"),
				progressbar.OptionSetPredictTime(true),
				progressbar.OptionSetElapsedTime(true),
				progressbar.OptionThrottle(100*time.Millisecond),
				progressbar.OptionClearOnFinish(),
			)
		}
		if p.label != "" {
			p.bar.Describe(p.label)
		} else {
			p.bar.Describe(fmt.Sprintf("step %d, %d running, %d waiting (%d preempted)", s.Step, s.Running, s.Waiting, s.Preempted))
		}
		_ = p.bar.Set(s.Finished) // a failed write to the terminal is not the run's failure
		return
	}
	if t := 10 * s.Finished / max(s.Total, 1); t > p.tenth {
		p.tenth = t
		if p.label != "" {
			fmt.Fprintf(p.w, "%s: %d/%d requests\n", p.label, s.Finished, s.Total)
			return
		}
		fmt.Fprintf(p.w, "simulate: step %d: %d/%d requests finished, %d running, %d waiting (%d preempted)\n",
			s.Step, s.Finished, s.Total, s.Running, s.Waiting, s.Preempted)
	}
}

// done clears a drawn bar, finished or not, before the summary.
func (p *progress) done() {
	if p.bar != nil {
		_ = p.bar.Clear()
		_ = p.bar.Exit()
		p.bar = nil
	}
}
