package replay

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/evict"
	"github.com/pagedkv/pagedkv/internal/sim"
	"github.com/pagedkv/pagedkv/kvindex"
	"github.com/pagedkv/pagedkv/prefixcache"
)

// Routers of a fleet replay.
const (
	// RouterPrefix sends a request to the replica with the longest cached
	// prefix among those with load <= least load + LoadSlack (the rule of
	// `pagedkv simulate --replicas`, sim.RouteByPrefix), read from a
	// kvindex.Index fed with every replica's KV events.
	RouterPrefix = "prefix"
	// RouterRoundRobin sends request i to replica i mod N.
	RouterRoundRobin = "round-robin"
	// RouterLeastLoaded sends a request to the replica with the fewest
	// requests running or waiting (the lower number on ties).
	RouterLeastLoaded = "least-loaded"
)

// Routers lists the routers in report order.
var Routers = []string{RouterPrefix, RouterRoundRobin, RouterLeastLoaded}

// FleetConfig describes a replay over replicas: N Managers, each under the
// service model with a pool of CapacityPages, behind one router.
type FleetConfig struct {
	Replicas      int
	Router        string
	LoadSlack     int
	CapacityPages int
	Eviction      string
	Service       Service
	Progress      func(finished int)
	// MaxWork bounds the replay's simulated work ([Work] of the trace
	// under the service model; 0: DefaultMaxWork), checked with the
	// replicas and their pools ([CheckFleet]) before any work.
	MaxWork int64
}

// FleetResult is one fleet replay: each replica's result (Stream included)
// and the requests it was sent.
type FleetResult struct {
	Router   string
	Replicas []*Result
	Routed   []int
	Wall     time.Duration
}

// HitBlocks and Blocks sum the replicas'.
func (f *FleetResult) HitBlocks() (hits, blocks int64) {
	for _, r := range f.Replicas {
		hits += r.HitBlocks
		blocks += r.Blocks
	}
	return hits, blocks
}

// Imbalance is the most requests a replica was sent over the mean (1 is a
// perfect balance).
func (f *FleetResult) Imbalance() float64 {
	most, sum := 0, 0
	for _, n := range f.Routed {
		most = max(most, n)
		sum += n
	}
	if sum == 0 {
		return 1
	}
	return float64(most) * float64(len(f.Routed)) / float64(sum)
}

// indexSink feeds one replica's prefix-cache changes to the router's index
// as KV events, in process (the wire format and ZeroMQ are
// `simulate --replicas`' part; here the router's index is what matters).
type indexSink struct {
	ix      *kvindex.Index
	replica int
	batch   kvindex.Batch
	hash    [1]uint64
	err     error
}

func newIndexSink(ix *kvindex.Index, replica, pageSize int) *indexSink {
	s := &indexSink{ix: ix, replica: replica}
	s.batch.Events = []kvindex.Event{{Hashes: s.hash[:], BlockSize: pageSize}}
	return s
}

func (s *indexSink) apply(kind kvindex.Kind, hash uint64) {
	s.hash[0] = hash
	s.batch.Events[0].Kind = kind
	if err := s.ix.Apply(s.replica, &s.batch); err != nil && s.err == nil {
		s.err = err
	}
}

func (s *indexSink) PageStored(_ prefixcache.PageID, hash uint64, _ prefixcache.PageID, _ uint64, _ prefixcache.Key, _ []int32) {
	s.apply(kvindex.BlockStored, hash)
}
func (s *indexSink) PageRemoved(_ prefixcache.PageID, hash uint64) {
	s.apply(kvindex.BlockRemoved, hash)
}

// RunFleet replays t over cfg.Replicas replicas: each request is routed at
// its arrival time, after every replica has run up to that time.
func RunFleet(t *Trace, cfg FleetConfig) (*FleetResult, error) {
	if err := CheckFleet(t, cfg, 1); err != nil {
		return nil, err
	}
	switch cfg.Router {
	case RouterPrefix, RouterRoundRobin, RouterLeastLoaded:
	default:
		return nil, fmt.Errorf("%w: router %q, want one of %s", ErrBadConfig, cfg.Router, strings.Join(Routers, ", "))
	}
	const seed = 1
	ix, err := kvindex.New(kvindex.Config{PageSize: t.BlockTokens, Seed: seed})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	start := time.Now()
	f := &FleetResult{Router: cfg.Router, Routed: make([]int, cfg.Replicas)}
	engines := make([]*engine, cfg.Replicas)
	sinks := make([]*indexSink, cfg.Replicas)
	finished := 0
	onFinish := func() {
		finished++
		if cfg.Progress != nil {
			cfg.Progress(finished)
		}
	}
	for i := range engines {
		sinks[i] = newIndexSink(ix, ix.AddReplica(fmt.Sprint("replica-", i)), t.BlockTokens)
		m, err := pagedkv.New(pagedkv.Config{NumPages: cfg.CapacityPages, PageSize: t.BlockTokens, HashSeed: seed,
			Eviction: cfg.Eviction, CascadeMinSavedPages: -1, CacheEvents: sinks[i]})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
		}
		rc := Config{CapacityPages: cfg.CapacityPages, Eviction: cfg.Eviction, Service: &cfg.Service, PageTokens: t.BlockTokens}
		r := &runner{t: t, cfg: rc, m: m, res: &Result{Eviction: policyName(cfg.Eviction), CapacityPages: cfg.CapacityPages}}
		engines[i] = newEngine(r, &cfg.Service, onFinish)
		f.Replicas = append(f.Replicas, r.res)
	}
	matched := make([]int, 0, cfg.Replicas)
	loads := make([]int, cfg.Replicas)
	noPrefix := make([]int, cfg.Replicas)
	var chain []uint64
	for i := range t.Requests {
		at := float64(t.Requests[i].ArrivalMs)
		for k, e := range engines {
			if err := e.advance(at); err != nil {
				return nil, fmt.Errorf("replica %d: %w", k, err)
			}
			if sinks[k].err != nil {
				return nil, fmt.Errorf("replica %d: events: %w", k, sinks[k].err)
			}
			loads[k] = e.load()
		}
		var to int
		switch cfg.Router {
		case RouterPrefix:
			chain = ix.Hashes(chain[:0], prefixcache.Namespace{}, engines[0].r.promptOf(&t.Requests[i]))
			matched = ix.MatchHashes(matched[:0], chain)
			to = sim.RouteByPrefix(matched, loads, cfg.LoadSlack)
		case RouterRoundRobin:
			to = i % cfg.Replicas
		case RouterLeastLoaded:
			to = sim.RouteByPrefix(noPrefix, loads, 0) // no prefix: the least loaded, the lower number
		}
		f.Routed[to]++
		engines[to].arrive(i)
	}
	for k, e := range engines {
		if err := e.advance(inf); err != nil {
			return nil, fmt.Errorf("replica %d: %w", k, err)
		}
		s := e.r.m.PoolStats()
		res := f.Replicas[k]
		res.Requests = f.Routed[k]
		res.PrefillTokens = s.PromptTokens - s.PromptHitTokens
		res.RecomputedTokens = s.ResumedTokens - s.ResumeHitTokens
		res.EvictedPages, res.Preemptions = s.EvictedPages, s.Preemptions
	}
	f.Wall = time.Since(start)
	return f, nil
}

func policyName(p string) string {
	if p == "" {
		return evict.LRU
	}
	return p
}

// FormatFleet writes one line per router: the fleet's hit ratio, the
// requests per replica and their imbalance, prefill tokens, preemptions,
// the slowest replica's finish and peak pages.
func FormatFleet(w io.Writer, cfg FleetConfig, runs []*FleetResult) {
	fmt.Fprintf(w, "replicas: %d of %d pages each, eviction %s, prefix router slack %d\n",
		cfg.Replicas, cfg.CapacityPages, policyName(cfg.Eviction), cfg.LoadSlack)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "router\thit\trequests per replica\timbalance\tprefill tokens\tpreempted\tlast finish\tpeak pages\t")
	for _, f := range runs {
		hits, blocks := f.HitBlocks()
		var prefill, preempted int64
		var finish float64
		peak := 0
		for _, r := range f.Replicas {
			prefill += r.PrefillTokens
			preempted += r.Preemptions
			finish = max(finish, r.SimulatedMs)
			peak = max(peak, r.PeakPages)
		}
		routed := make([]string, len(f.Routed))
		for i, n := range f.Routed {
			routed[i] = fmt.Sprint(n)
		}
		fmt.Fprintf(tw, "%s\t%.1f%%\t%s\t%.2f\t%d\t%d\t%.1f s\t%d\t\n", f.Router, 100*ratio(hits, blocks),
			strings.Join(routed, "/"), f.Imbalance(), prefill, preempted, finish/1000, peak)
	}
	tw.Flush()
}
