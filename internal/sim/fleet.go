package sim

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	pagedkv "github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/kvindex"
)

// Policy is how a fleet routes requests to replicas.
type Policy uint8

const (
	// PrefixAware sends a request to the replica with the longest cached
	// prefix of its prompt, as the router's index knows it from the
	// replicas' KV events. Only replicas whose load (requests running or
	// waiting) is at most the least loaded replica's plus
	// FleetConfig.LoadSlack are candidates, so that one popular prefix
	// cannot pile every request on one replica. Ties go to the less loaded
	// replica, then the lower number.
	PrefixAware Policy = iota
	// RoundRobin sends request n to replica n mod R.
	RoundRobin
)

func (p Policy) String() string {
	if p == RoundRobin {
		return "round-robin"
	}
	return "prefix-aware"
}

// DefaultLoadSlack is the LoadSlack `pagedkv simulate --replicas` uses.
const DefaultLoadSlack = 4

// FleetConfig describes a run over several replicas.
type FleetConfig struct {
	Replicas int
	Policy   Policy
	// LoadSlack: a replica is a prefix-aware candidate while its load is
	// at most the minimum load plus LoadSlack (0: only the least loaded;
	// negative: no cap).
	LoadSlack int
	// EventTimeout bounds the wait for a step's events to be indexed (0:
	// 30s).
	EventTimeout time.Duration
}

// FleetSummary is what a fleet run did.
type FleetSummary struct {
	Policy   Policy
	Replicas []Summary // one per replica
	Routed   []int     // requests routed to each replica
	// Totals over the replicas.
	PromptTokens, PromptHitTokens, ComputedTokens, RecomputedTokens int64
	Preemptions, EvictedPages                                       int64
	Steps                                                           int // the longest replica's steps
	Verified                                                        struct {
		Checks          int
		Outputs, KVRows int64
		MaxErr          float64
	}
	// Routing: requests whose chosen replica had a cached prefix, and the
	// cached tokens the index promised at routing time.
	RoutedHits, PredictedHitTokens int64
	Events                         FleetEvents
	Wall                           time.Duration
	Err                            error
}

// FleetEvents counts the KV events behind the routing.
type FleetEvents struct {
	Batches, Events, Pages, Bytes int64 // published by all replicas
	Dropped                       int64 // steps the publishers' queues dropped
	Indexed                       int64 // batches the router's index applied
	Gaps, Replays                 int64
	// Groups is the most KV-cache groups (group_idx values) the index saw
	// in one replica's events: 1 for a dense model, a hybrid model's
	// layer groups once each group has stored a block.
	Groups int
}

// HitRate is the fleet's prefix hit rate over prompt tokens.
func (f *FleetSummary) HitRate() float64 {
	if f.PromptTokens == 0 {
		return 0
	}
	return float64(f.PromptHitTokens) / float64(f.PromptTokens)
}

// replicaRun is one replica of a fleet.
type replicaRun struct {
	s   *Sim
	pub *events.Publisher
	rec *events.Recorder
}

func (r *replicaRun) load() int { return len(r.s.running) + len(r.s.waiting) }
func (r *replicaRun) busy() bool {
	return len(r.s.running) > 0 || len(r.s.waiting) > 0
}

// RunFleet runs workload over fc.Replicas replicas, each a Sim (own
// Manager, or HybridManager with Config.Groups, backend and verification)
// publishing its KV events over loopback ZeroMQ (a hybrid model's grouped,
// as [RecorderConfig] builds them). A router subscribed to all of them keeps a kvindex.Index
// and routes each arriving request by fc.Policy (for a hybrid model the
// index's match is the prefix every group holds, the HybridManager's
// admission rule); the replicas share nothing else. The replicas step in lockstep: each global step, arrivals are
// routed, every replica with work runs one step and flushes its events, and
// the router waits until it has indexed every replica's events before the
// next step, so routing is deterministic.
func RunFleet(cfg Config, workload []Request, fc FleetConfig) (FleetSummary, error) {
	if fc.Replicas < 1 || fc.Replicas > 64 {
		return FleetSummary{}, fmt.Errorf("%w: %d replicas, want 1..64", ErrBadConfig, fc.Replicas)
	}
	if fc.Policy > RoundRobin {
		return FleetSummary{}, fmt.Errorf("%w: policy %d", ErrBadConfig, fc.Policy)
	}
	if fc.EventTimeout == 0 {
		fc.EventTimeout = 30 * time.Second
	}
	if err := cfg.Validate(); err != nil {
		return FleetSummary{}, err
	}
	if len(workload) == 0 {
		return FleetSummary{}, fmt.Errorf("%w: empty workload", ErrBadConfig)
	}
	specs := slices.Clone(workload)
	slices.SortStableFunc(specs, func(a, b Request) int { return a.Arrival - b.Arrival })

	f := FleetSummary{Policy: fc.Policy, Routed: make([]int, fc.Replicas)}
	reps := make([]*replicaRun, fc.Replicas)
	defer func() {
		for _, r := range reps {
			if r != nil {
				r.pub.Close()
			}
		}
	}()
	var srcs []kvindex.Source
	for i := range reps {
		pub, err := events.NewPublisher(events.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Mode: events.Bind,
			ReplayEndpoint: "tcp://127.0.0.1:0", Topic: fmt.Sprintf("kv@replica-%d", i)})
		if err != nil {
			return f, err
		}
		rec, err := pub.NewRecorder(RecorderConfig(&cfg)) // a hybrid model's events carry their group_idx
		if err != nil {
			pub.Close()
			return f, err
		}
		rc := cfg
		rc.Events, rc.Progress = rec, nil
		s, err := newSim(rc)
		if err != nil {
			pub.Close()
			return f, err
		}
		reps[i] = &replicaRun{s: s, pub: pub, rec: rec}
		srcs = append(srcs, kvindex.Source{Name: fmt.Sprintf("replica-%d", i), Endpoint: pub.Endpoint(), ReplayEndpoint: pub.ReplayEndpoint()})
	}
	ix, err := kvindex.New(kvindex.Config{PageSize: cfg.PageSize, Seed: HashSeed(&cfg)})
	if err != nil {
		return f, err
	}
	sub, err := kvindex.NewSubscriber(ix, kvindex.SubscriberConfig{Topic: "kv@"}, srcs...)
	if err != nil {
		return f, err
	}
	defer sub.Close()
	for i, r := range reps {
		if !r.pub.WaitSubscribed(fc.EventTimeout) {
			return f, fmt.Errorf("sim: the router's subscription did not reach replica %d", i)
		}
	}

	start := time.Now()
	err = runFleet(&f, cfg, fc, specs, reps, ix, sub)
	f.Wall = time.Since(start)
	for i, r := range reps {
		sum, _ := r.s.finish(f.Wall, err)
		f.Replicas = append(f.Replicas, sum)
		st := &sum.Stats
		f.PromptTokens += st.PromptTokens
		f.PromptHitTokens += st.PromptHitTokens
		f.ComputedTokens += st.ComputedTokens
		f.RecomputedTokens += st.RecomputedTokens()
		f.Preemptions += st.Preemptions
		f.EvictedPages += st.EvictedPages
		f.Steps = max(f.Steps, sum.Steps)
		f.Verified.Checks += sum.Verified.Checks
		f.Verified.Outputs += sum.Verified.Outputs
		f.Verified.KVRows += sum.Verified.KVTokens
		f.Verified.MaxErr = max(f.Verified.MaxErr, sum.Verified.MaxErr)
		ps, rs := r.pub.Stats(), r.rec.Stats()
		f.Events.Batches += ps.Batches
		f.Events.Events += ps.Events
		f.Events.Pages += ps.Pages
		f.Events.Bytes += ps.Bytes
		f.Events.Dropped += rs.DroppedSteps
		ss := sub.Stats(i)
		f.Events.Gaps += ss.Gaps
		f.Events.Replays += ss.Replays
		is := ix.Stats(sub.Replica(i))
		f.Events.Indexed += is.Batches
		f.Events.Groups = max(f.Events.Groups, is.Groups)
	}
	f.Err = err
	return f, err
}

func runFleet(f *FleetSummary, cfg Config, fc FleetConfig, specs []Request, reps []*replicaRun, ix *kvindex.Index, sub *kvindex.Subscriber) error {
	var (
		next    int // next spec to arrive
		matched []int
		chain   []uint64
	)
	busy := func() bool {
		for _, r := range reps {
			if r.busy() {
				return true
			}
		}
		return false
	}
	maxSteps := cfg.MaxSteps
	if maxSteps == 0 {
		maxSteps = 1_000_000
	}
	for clock, iter := 0, 0; next < len(specs) || busy(); clock, iter = clock+1, iter+1 {
		if iter >= 2*maxSteps {
			return fmt.Errorf("%w: fleet unfinished after %d steps", ErrStuck, iter)
		}
		if !busy() {
			clock = max(clock, specs[next].Arrival) // idle until the next arrival
		}
		for ; next < len(specs) && specs[next].Arrival <= clock; next++ {
			q := &specs[next]
			var to int
			switch fc.Policy {
			case RoundRobin:
				to = next % len(reps)
			case PrefixAware:
				chain = ix.Hashes(chain[:0], pagedkv.Namespace{Tenant: q.Namespace}, q.Prompt)
				matched = ix.MatchHashes(matched[:0], chain)
				to = route(matched, reps, fc.LoadSlack)
				if matched[to] > 0 {
					f.RoutedHits++
					f.PredictedHitTokens += int64(matched[to])
				}
			}
			r := reps[to]
			st, err := r.s.track(q)
			if err != nil {
				return err
			}
			st.phase = waiting
			r.s.waiting = append(r.s.waiting, st)
			f.Routed[to]++
		}
		for i, r := range reps {
			if !r.busy() {
				continue
			}
			if r.s.sum.Steps >= maxSteps {
				return fmt.Errorf("%w: replica %d: %d requests unfinished after %d steps", ErrStuck, i, r.s.total-r.s.done, r.s.sum.Steps)
			}
			if err := r.s.step(); err != nil {
				return fmt.Errorf("replica %d: %w", i, err)
			}
			r.rec.Flush()
		}
		// The barrier: the router sees every replica's events of this step
		// before it routes the next arrivals.
		for i, r := range reps {
			if !r.pub.WaitSent(fc.EventTimeout) {
				return fmt.Errorf("sim: replica %d's publisher did not send within %v", i, fc.EventTimeout)
			}
			if seq := r.pub.Stats().LastSeq; !sub.WaitApplied(i, seq, fc.EventTimeout) {
				return fmt.Errorf("sim: the router indexed replica %d up to sequence %d of %d within %v", i, sub.Applied(i), seq, fc.EventTimeout)
			}
		}
	}
	return nil
}

// route picks the replica for a prefix-aware request (see RouteByPrefix).
func route(matched []int, reps []*replicaRun, slack int) int {
	loads := make([]int, len(reps))
	for i, r := range reps {
		loads[i] = r.load()
	}
	return RouteByPrefix(matched, loads, slack)
}

// RouteByPrefix is the prefix-aware router's rule: among replicas whose
// load is at most the minimum plus slack (every replica if slack < 0), the
// longest cached prefix matched[i], then the lower load, then the lower
// number. matched and loads have one entry per replica, at least one.
func RouteByPrefix(matched, loads []int, slack int) int {
	minLoad := slices.Min(loads)
	best := -1
	for i, l := range loads {
		if slack >= 0 && l > minLoad+slack {
			continue
		}
		if best < 0 || matched[i] > matched[best] || matched[i] == matched[best] && l < loads[best] {
			best = i
		}
	}
	return best
}

// FormatFleet writes the comparison of fleet runs on the same workload
// (prefix-aware first, then round robin) as aligned "name: value" lines.
func FormatFleet(w io.Writer, cfg *Config, fc FleetConfig, runs ...*FleetSummary) {
	var b strings.Builder
	line := func(name, format string, args ...any) {
		fmt.Fprintf(&b, "%-14s %s\n", name+":", fmt.Sprintf(format, args...))
	}
	each := func(f func(r *FleetSummary) string) string {
		var parts []string
		for _, r := range runs {
			parts = append(parts, r.Policy.String()+" "+f(r))
		}
		return strings.Join(parts, "; ")
	}
	cap := fmt.Sprintf("among replicas with load <= least load + %d (load: requests running or waiting)", fc.LoadSlack)
	if fc.LoadSlack < 0 {
		cap = "among all replicas"
	}
	m := &cfg.Model
	line("fleet", "%d replicas, each %d layers, Hq %d, Hkv %d, D %d, %v, pool %d pages of %d tokens; connected only by KV events over loopback ZeroMQ",
		fc.Replicas, m.Layers, m.NumQOHeads, m.NumKVHeads, m.HeadDim, m.DType, cfg.NumPages, cfg.PageSize)
	if len(cfg.Groups) > 0 {
		kinds := make([]string, len(cfg.Groups))
		for g, spec := range cfg.Groups {
			kinds[g] = groupString(spec)
		}
		line("layer groups", "%d of %d layers each, layer l in group l %% %d: %s; a replica's match is the prefix every group holds",
			len(cfg.Groups), cfg.Groups[0].NumLayers, len(cfg.Groups), strings.Join(kinds, ", "))
	}
	line("routing", "prefix-aware: the longest cached prefix (from the index) %s, ties to the less loaded, then the lower number; round-robin: request n to replica n mod %d",
		cap, fc.Replicas)
	line("prefix hits", "%s", each(func(r *FleetSummary) string {
		return fmt.Sprintf("%d of %d prompt tokens (%.1f%%)", r.PromptHitTokens, r.PromptTokens, 100*r.HitRate())
	}))
	line("computed", "%s", each(func(r *FleetSummary) string {
		return fmt.Sprintf("%d tokens (%d recomputed after preemption)", r.ComputedTokens, r.RecomputedTokens)
	}))
	line("routed", "%s", each(func(r *FleetSummary) string {
		s := fmt.Sprint(r.Routed)
		if r.Policy == PrefixAware {
			s += fmt.Sprintf(" (%d requests to a cached prefix; the index promised %d tokens)", r.RoutedHits, r.PredictedHitTokens)
		}
		return s
	}))
	line("steps", "%s", each(func(r *FleetSummary) string { return fmt.Sprintf("%d (longest replica)", r.Steps) }))
	line("cache churn", "%s", each(func(r *FleetSummary) string {
		return fmt.Sprintf("%d pages evicted, %d preemptions", r.EvictedPages, r.Preemptions)
	}))
	line("kv events", "%s", each(func(r *FleetSummary) string {
		e := &r.Events
		s := fmt.Sprintf("%d batches, %d events, %d pages, %d bytes published (%d steps dropped); %d batches indexed, %d gaps, %d replays",
			e.Batches, e.Events, e.Pages, e.Bytes, e.Dropped, e.Indexed, e.Gaps, e.Replays)
		if len(cfg.Groups) > 0 {
			s += fmt.Sprintf(", %d groups indexed per replica", e.Groups)
		}
		return s
	}))
	line("wall time", "%s", each(func(r *FleetSummary) string { return roundDuration(r.Wall).String() }))
	failed := false
	for _, r := range runs {
		if r.Err != nil {
			line("verification", "FAILED (%v): %v", r.Policy, r.Err)
			failed = true
		}
	}
	if !failed {
		line("verification", "passed on every replica: %s", each(func(r *FleetSummary) string {
			return fmt.Sprintf("%d outputs in %d checked steps (max |diff| %.2g), %d paged K/V rows bit-exact",
				r.Verified.Outputs, r.Verified.Checks, r.Verified.MaxErr, r.Verified.KVRows)
		}))
	}
	io.WriteString(w, b.String())
}
