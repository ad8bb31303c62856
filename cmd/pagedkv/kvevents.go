package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/internal/sim"
)

// kvFlags are simulate's KV-event flags (docs/events.md).
type kvFlags struct {
	addr, replay, topic *string
	wait, linger        *time.Duration
}

func kvEventFlags(fs *flag.FlagSet) kvFlags {
	return kvFlags{
		addr: fs.String("kv-events", "", "publish the run's KV events in vLLM's format on this ZeroMQ PUB address, e.g. tcp://127.0.0.1:5557 "+
			"(bound; connected to instead if a subscriber bound it first): one [topic, 8-byte big-endian seq, msgpack KVEventBatch] message per step (docs/events.md)"),
		replay: fs.String("kv-events-replay", "", "with --kv-events: serve replays on this ZeroMQ ROUTER address (vLLM's replay protocol)"),
		topic:  fs.String("kv-events-topic", "kv-events", "with --kv-events: the topic frame of every message"),
		wait:   fs.Duration("kv-events-wait", 5*time.Second, "with --kv-events: wait this long for a first subscriber before running (PUB drops what nobody receives)"),
		linger: fs.Duration("kv-events-linger", time.Second, "with --kv-events: keep publishing queued batches and serving replays this long after the run"),
	}
}

// open starts the publisher and its Recorder for a run of cfg.
func (kv kvFlags) open(cfg *sim.Config, stderr io.Writer) (*events.Publisher, *events.Recorder, error) {
	if *kv.wait < 0 || *kv.linger < 0 {
		return nil, nil, fmt.Errorf("--kv-events-wait %v, --kv-events-linger %v: want >= 0", *kv.wait, *kv.linger)
	}
	pub, err := events.NewPublisher(events.PublisherConfig{Endpoint: *kv.addr, Mode: events.BindOrConnect,
		ReplayEndpoint: *kv.replay, Topic: *kv.topic, Linger: *kv.linger})
	if err != nil {
		return nil, nil, fmt.Errorf("--kv-events: %w", err)
	}
	rec, err := pub.NewRecorder(sim.RecorderConfig(cfg)) // a hybrid model's: one group per layer group
	if err != nil {
		pub.Close()
		return nil, nil, fmt.Errorf("--kv-events: %w", err)
	}
	fmt.Fprintf(stderr, "simulate: publishing KV events on %s", pub.Endpoint())
	if pub.ReplayEndpoint() != "" {
		fmt.Fprintf(stderr, " (replay %s)", pub.ReplayEndpoint())
	}
	fmt.Fprintf(stderr, ", topic %q, page size %d, hash seed %d\n", *kv.topic, cfg.PageSize, sim.HashSeed(cfg))
	if *kv.wait > 0 && !pub.WaitSubscribed(*kv.wait) {
		fmt.Fprintf(stderr, "simulate: no KV-event subscriber after %v; running anyway\n", *kv.wait)
	}
	return pub, rec, nil
}

// report prints what was published.
func (kv kvFlags) report(w io.Writer, pub *events.Publisher, rec *events.Recorder) {
	ps, rs := pub.Stats(), rec.Stats()
	fmt.Fprintf(w, "%-14s %d batches (seq 0..%d), %d events, %d pages, %d bytes; %d steps dropped (%d events), %d resyncs; %d replays served\n",
		"kv events:", ps.Batches, ps.LastSeq, ps.Events, ps.Pages, ps.Bytes, rs.DroppedSteps, rs.DroppedEvents, rs.Resyncs, ps.Replays)
	for g := range rec.NumGroups() {
		kind, window := rec.GroupSpec(g)
		if window != 0 {
			kind = fmt.Sprintf("%s %d", kind, window)
		}
		gs := rec.GroupStats(g)
		host := ""
		if rec.HostPages() > 0 {
			host = fmt.Sprintf("; host pages (medium CPU): %d BlockStored (%d pages), %d BlockRemoved (%d pages)",
				gs.HostStored, gs.HostStoredPages, gs.HostRemoved, gs.HostRemovedPages)
		}
		fmt.Fprintf(w, "%-14s group_idx %d, %s: %d BlockStored (%d pages), %d BlockRemoved (%d pages)%s\n",
			fmt.Sprintf("kv group %d:", g), g, kind, gs.Stored, gs.StoredPages, gs.Removed, gs.RemovedPages, host)
	}
}

// runFleet runs the workload over fc.Replicas replicas with prefix-aware
// routing, then with round robin, and prints the comparison.
func runFleet(cfg sim.Config, workload []sim.Request, fc sim.FleetConfig, stdout, stderr io.Writer, quiet bool) int {
	if fc.Replicas < 1 || fc.Replicas > 64 {
		fmt.Fprintf(stderr, "pagedkv simulate: --replicas %d: want 1..64\n", fc.Replicas)
		return exitUsage
	}
	cfg.Progress = nil
	var runs []*sim.FleetSummary
	code := exitOK
	for _, p := range []sim.Policy{sim.PrefixAware, sim.RoundRobin} {
		fc.Policy = p
		if !quiet {
			fmt.Fprintf(stderr, "simulate: %d replicas, %v routing...\n", fc.Replicas, p)
		}
		f, err := sim.RunFleet(cfg, workload, fc)
		if err != nil {
			fmt.Fprintf(stderr, "pagedkv simulate: %v routing: %v\n", p, err)
			if errors.Is(err, sim.ErrBadConfig) {
				return exitUsage
			}
			code = exitFailure
		}
		runs = append(runs, &f)
	}
	sim.FormatFleet(stdout, &cfg, fc, runs...)
	return code
}
