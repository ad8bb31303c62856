package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/events"
)

// The Go reference semantics the Python binding is checked against: a
// seeded random engine loop (adds from prompt families that share
// prefixes, chunked prefill and decode steps, forks, preemptions under
// memory pressure, resumes, releases, aborted steps, evictions, pins, and
// calls that must fail) runs on pagedkv.Manager directly, and every
// operation and its result (error class, matched tokens, the plan's arrays
// and cascade levels, Stats) is written to testdata/trace.json.
// python/tests/test_trace.py replays the operations through libpagedkv and
// must see exactly the same results. TestTrace fails when the committed file
// is stale; `go test ./cabi -run TestTrace -update` rewrites it.

var update = flag.Bool("update", false, "rewrite testdata/trace.json")

type traceFile struct {
	Traces []trace `json:"traces"`
}

type trace struct {
	Name   string           `json:"name"`
	Config map[string]int64 `json:"config"` // pagedkv.Config with pagedkv_config's field names
	// Groups are a hybrid trace's layer groups, pagedkv_layer_group's fields.
	Groups []map[string]int64 `json:"groups,omitempty"`
	// Tiers are a tier trace's pagedkv_tier_config fields (format_*: its
	// pagedkv_page_format's); Redis says a Redis server is below the host
	// tier (namespace "trace"; the replay starts its own empty server).
	Tiers map[string]int64 `json:"tiers,omitempty"`
	Redis bool             `json:"redis,omitempty"`
	// Events: the manager has KV events (default queue).
	Events bool      `json:"events,omitempty"`
	Ops    []traceOp `json:"ops"`
}

type traceOp struct {
	Op       string               `json:"op"`
	ID       uint64               `json:"id,omitempty"`
	Child    uint64               `json:"child,omitempty"`
	Tokens   []int32              `json:"tokens,omitempty"`
	Tenant   string               `json:"tenant,omitempty"`
	Priority int                  `json:"priority,omitempty"`
	IDs      []uint64             `json:"ids,omitempty"`
	NTokens  []int32              `json:"ntokens,omitempty"`
	Sampled  []int32              `json:"sampled,omitempty"`
	Drafts   [][]int32            `json:"drafts,omitempty"`
	Accepted []int32              `json:"accepted,omitempty"`
	N        int                  `json:"n,omitempty"`
	Want     traceResult          `json:"want"`
	Plan     map[string][]int32   `json:"plan,omitempty"`
	Cascade  []map[string][]int32 `json:"cascade,omitempty"`
	// Groups are a hybrid step's group plans (Plan then holds only the
	// pool-wide copies).
	Groups []traceGroup `json:"groups,omitempty"`
	// Medium is cached_hashes' PAGEDKV_MEDIUM_*.
	Medium int `json:"medium,omitempty"`
	// CompleteIDs are complete_tier_copies' ids.
	CompleteIDs []uint64 `json:"complete_ids,omitempty"`
}

// traceGroup is one group's plan of a hybrid step: the dense plan's arrays
// plus cascade_window_left and the chunked attention's attn_* arrays.
type traceGroup struct {
	Plan    map[string][]int32   `json:"plan"`
	Cascade []map[string][]int32 `json:"cascade,omitempty"`
}

type traceResult struct {
	Err   string  `json:"err,omitempty"`
	Value int64   `json:"value,omitempty"`
	Stats []int64 `json:"stats"` // pagedkv_stats field order
	// GroupStats are a hybrid manager's per-group numbers, pagedkv_group_stats order.
	GroupStats [][]int64 `json:"group_stats,omitempty"`
	// TierStats are pagedkv_tier_stats, with tiers.
	TierStats []int64 `json:"tier_stats,omitempty"`
	// Copies are tier_copies' results, one [id, dir, device page, host
	// page] each.
	Copies [][4]uint64 `json:"copies,omitempty"`
	// Events are drain_events' payloads in hex, the timestamp's 8 bytes
	// (offset 2) zeroed.
	Events []string `json:"events,omitempty"`
	// Hashes are cached_hashes' result.
	Hashes []uint64 `json:"hashes,omitempty"`
}

// errName is the Python exception class of a Go error.
func errName(err error) string {
	if err == nil {
		return ""
	}
	names := []struct {
		err  error
		name string
	}{
		{pagedkv.ErrOutOfPages, "OutOfPages"}, {pagedkv.ErrUnknownRequest, "UnknownRequest"},
		{pagedkv.ErrRequestExists, "RequestExists"}, {pagedkv.ErrPreempted, "Preempted"},
		{pagedkv.ErrNotPreempted, "NotPreempted"}, {pagedkv.ErrStepPending, "StepPending"},
		{pagedkv.ErrNoStep, "NoStep"}, {pagedkv.ErrBadArgument, "BadArgument"},
		{pagedkv.ErrNotCached, "NotCached"}, {pagedkv.ErrPinLimit, "PinLimit"}, {pagedkv.ErrUnknownPin, "UnknownPin"},
		{pagedkv.ErrLoading, "Loading"},
	}
	for _, n := range names {
		if errors.Is(err, n.err) {
			return n.name
		}
	}
	return "Unclassified: " + err.Error()
}

// statsList is s in pagedkv_stats' field order.
func statsList(s pagedkv.Stats) []int64 {
	return []int64{
		int64(s.TotalPages), int64(s.FreePages), int64(s.UsedPages), int64(s.EvictablePages), int64(s.PinnedIdlePages),
		int64(s.CachedPages), int64(s.PinnedPages), int64(s.SharedPages),
		int64(s.Requests), int64(s.PreemptedRequests),
		s.PromptTokens, s.PromptHitTokens, s.ComputedTokens, s.ResumedTokens, s.ResumeHitTokens,
		s.Steps, s.Preemptions, s.CopiedPages, s.PublishedPages, s.DuplicatePages,
		s.EvictedPages, s.EvictionFreedPages, s.InnerVictims, s.WindowReleasedPages, s.ChainsCut,
		s.DraftTokens, s.AcceptedDraftTokens,
	}
}

// family returns n tokens of prompt family f: all families share 8 tokens,
// pairs of families 16, and each family has its own tail.
func family(f, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		switch {
		case i < 8:
			out[i] = int32(10 + i)
		case i < 16:
			out[i] = int32(100 + 10*(f/2) + i)
		default:
			out[i] = int32(1000 + 100*f + i)
		}
	}
	return out
}

type traceGen struct {
	t testing.TB
	// m is the manager under test; dense is it as a Manager (nil for a
	// hybrid one, which gets no pins), hybrid as a HybridManager.
	m      pagedkv.KVManager
	dense  *pagedkv.Manager
	hybrid *pagedkv.HybridManager
	rng    *rand.Rand
	ops    []traceOp
	next   uint64
	pins   []uint64
	// promptScale multiplies prompt lengths and maxChunk bounds a step's
	// tokens per request: hybrid traces need requests past their windows.
	promptScale, maxChunk int
	// A tier trace's: tiers on, copies taken and not completed, the KV
	// event recorder, and flush, which waits for the remote store's writes
	// (nil without one) so that every recorded result is deterministic.
	// tm is the manager's tier calls (either kind).
	tiers    bool
	tm       pagedkv.KVManager
	inflight []uint64
	rec      *events.Recorder
	evq      *events.Queue
	enc      *events.Encoder
	flush    func()
	// stateCut: the model has state groups; most prefill chunks end at
	// the request's next state checkpoint, recorded as an op
	// (state_trace_test.go).
	stateCut bool
}

func (g *traceGen) stats() pagedkv.Stats {
	if g.hybrid != nil {
		return g.hybrid.Stats().Stats
	}
	return g.dense.Stats()
}

// record runs op's effect (already done by the caller) into the trace.
func (g *traceGen) record(op traceOp, value int64, err error) {
	if g.flush != nil {
		g.flush()
	}
	op.Want.Err, op.Want.Value, op.Want.Stats = errName(err), value, statsList(g.stats())
	if g.hybrid != nil {
		for _, gs := range g.hybrid.Stats().Groups {
			op.Want.GroupStats = append(op.Want.GroupStats, []int64{int64(gs.Kind), int64(gs.CachedPages), int64(gs.EvictablePages),
				gs.ServableTokens, gs.PublishedPages, gs.EvictedPages, gs.CopiedPages, gs.WindowReleasedPages, int64(gs.PinnedPages),
				gs.HostHitTokens, gs.RemoteHitTokens, gs.OffloadedPages, gs.OnloadedPages})
		}
	}
	if g.tiers {
		op.Want.TierStats = tierStatsList(g.stats().Tiers)
	}
	if strings.HasPrefix(op.Want.Err, "Unclassified") {
		g.t.Fatalf("op %s: %v", op.Op, err)
	}
	if err := g.m.Audit(); err != nil {
		g.t.Fatalf("after %s: %v", op.Op, err)
	}
	g.ops = append(g.ops, op)
}

func (g *traceGen) ids(running bool) []uint64 {
	var out []uint64
	for id := uint64(1); id <= g.next; id++ {
		if g.m.Has(pagedkv.RequestID(id)) && g.m.Running(pagedkv.RequestID(id)) == running {
			out = append(out, id)
		}
	}
	return out
}

func (g *traceGen) pick(ids []uint64) uint64 {
	if len(ids) == 0 {
		return g.next + 1000 // unknown
	}
	return ids[g.rng.IntN(len(ids))]
}

func (g *traceGen) step() {
	var ids []uint64
	var nt []int32
	for _, id := range g.ids(true) {
		r := pagedkv.RequestID(id)
		left := len(g.m.Tokens(r)) - g.m.Computed(r)
		if left == 0 || g.rng.IntN(5) == 0 {
			continue
		}
		if g.tiers && g.tm.Loading(r) && g.rng.IntN(4) > 0 { // a scheduler waits for its onloads, mostly
			continue
		}
		n := min(left, 1+g.rng.IntN(g.maxChunk))
		if g.stateCut {
			n = g.cutAtCheckpoint(id, n)
		}
		ids, nt = append(ids, id), append(nt, int32(n))
	}
	if g.rng.IntN(20) == 0 && len(ids) > 0 { // a bad step: too many tokens
		nt[0] += 50
	}
	op := traceOp{Op: "reserve", IDs: ids, NTokens: nt}
	rids := make([]pagedkv.RequestID, len(ids))
	for i, id := range ids {
		rids[i] = pagedkv.RequestID(id)
	}
	spec := g.rng.IntN(4) == 0
	if spec {
		// Drafts for the requests whose step reaches their last known token.
		op.Op, op.Drafts = "reserve_spec", make([][]int32, len(ids))
		for i, id := range ids {
			r := pagedkv.RequestID(id)
			if g.m.Computed(r)+int(nt[i]) == len(g.m.Tokens(r)) {
				for range g.rng.IntN(4) {
					op.Drafts[i] = append(op.Drafts[i], int32(g.rng.IntN(50)))
				}
			}
		}
	}
	err := g.reserve(&op, rids, nt)
	g.record(op, 0, err)
	if errors.Is(err, pagedkv.ErrOutOfPages) {
		id := g.pick(g.ids(true))
		err := g.m.Preempt(pagedkv.RequestID(id))
		g.record(traceOp{Op: "preempt", ID: id}, 0, err)
		return
	}
	if err != nil {
		return
	}
	if g.rng.IntN(10) == 0 {
		g.record(traceOp{Op: "abort"}, 0, g.m.Abort())
		return
	}
	if g.rng.IntN(15) == 0 { // a bad commit: a token for a request still prefilling, or the wrong count
		bad := make([]int32, len(ids)+1)
		g.record(traceOp{Op: "commit", Sampled: bad}, 0, g.m.Commit(bad))
	}
	sampled := make([]int32, len(ids))
	for b, id := range ids {
		r := pagedkv.RequestID(id)
		sampled[b] = pagedkv.NoToken
		// During a speculative step Tokens ends with the drafts.
		if g.m.Computed(r)+int(nt[b])+len(dr(op.Drafts, b)) == len(g.m.Tokens(r)) {
			sampled[b] = int32(g.rng.IntN(50))
		}
	}
	if spec {
		accepted := make([]int32, len(ids))
		for b := range accepted {
			accepted[b] = int32(g.rng.IntN(len(dr(op.Drafts, b)) + 1))
		}
		g.record(traceOp{Op: "commit_spec", Accepted: accepted, Sampled: sampled}, 0, g.committed(g.m.CommitSpec(accepted, sampled)))
		return
	}
	g.record(traceOp{Op: "commit", Sampled: sampled}, 0, g.committed(g.m.Commit(sampled)))
}

// committed ends the step's batch of KV events after a successful commit,
// as the C ABI does, and returns err.
func (g *traceGen) committed(err error) error {
	if err == nil && g.rec != nil {
		g.rec.Flush()
	}
	return err
}

// reserve reserves op's step (with op.Drafts when it is a reserve_spec)
// and records its plan in op.
func (g *traceGen) reserve(op *traceOp, rids []pagedkv.RequestID, nt []int32) error {
	var drafts [][]int32
	if op.Op == "reserve_spec" {
		drafts = op.Drafts
	}
	if g.hybrid != nil {
		plan, err := g.hybrid.ReserveSpec(rids, nt, drafts)
		if err != nil {
			return err
		}
		op.Plan = map[string][]int32{"copies": copyList(plan.Copies)} // pool-wide
		for _, gp := range plan.Groups {
			tg := traceGroup{}
			tg.Plan, tg.Cascade = planRecord(gp)
			tg.Plan["attn_qo_indptr"], tg.Plan["attn_kv_indptr"] = slices.Clone(gp.AttnQOIndptr), slices.Clone(gp.AttnKVIndptr)
			tg.Plan["attn_kv_page_indices"], tg.Plan["attn_kv_last_page_len"] = slices.Clone(gp.AttnKVPageIndices), slices.Clone(gp.AttnKVLastPageLen)
			tg.Plan["attn_requests"] = slices.Clone(gp.AttnRequests)
			if len(gp.StateIndices) > 0 {
				tg.Plan["state_indices"] = slices.Clone(gp.StateIndices)
			}
			for _, w := range gp.CascadeWindowLeft {
				tg.Plan["cascade_window_left"] = append(tg.Plan["cascade_window_left"], int32(w))
			}
			op.Groups = append(op.Groups, tg)
		}
		return nil
	}
	var plan *pagedkv.Plan
	var err error
	if drafts != nil {
		plan, err = g.dense.ReserveSpec(rids, nt, drafts)
	} else {
		plan, err = g.dense.Reserve(rids, nt)
	}
	if err == nil {
		op.Plan, op.Cascade = planRecord(plan)
	}
	return err
}

// copyList is copies as int32 triples (nil when empty).
func copyList(copies []pagedkv.CopyOp) []int32 {
	var out []int32
	for _, c := range copies {
		out = append(out, int32(c.Src), int32(c.Dst), c.Entries)
	}
	return out
}

// planRecord copies plan's arrays and cascade levels for the trace.
func planRecord(plan *pagedkv.Plan) (map[string][]int32, []map[string][]int32) {
	rec := map[string][]int32{
		"drafts": plan.Drafts, "qo_indptr": plan.QOIndptr, "batch_indices": plan.BatchIndices, "positions": plan.Positions,
		"token_ids": plan.TokenIDs, "token_positions": plan.TokenPositions, "kv_indptr": plan.KVIndptr,
		"kv_page_indices": plan.KVPageIndices, "kv_last_page_len": plan.KVLastPageLen, "seq_lens": plan.SeqLens,
		"window_left": {int32(plan.WindowLeft)},
	}
	for k, v := range rec {
		rec[k] = slices.Clone(v)
	}
	if len(plan.Copies) > 0 {
		rec["copies"] = copyList(plan.Copies)
	}
	var levels []map[string][]int32
	if l := plan.Cascade; l != nil {
		rec["query_rows"] = l.QueryRows()
		for _, lv := range l.Levels {
			levels = append(levels, map[string][]int32{
				"qo_indptr": slices.Clone(lv.QOIndptr), "kv_indptr": slices.Clone(lv.KVIndptr),
				"kv_indices": slices.Clone(lv.KVPageIndices), "kv_last_page_len": slices.Clone(lv.KVLastPageLen),
			})
		}
	}
	return rec, levels
}

// dr is drafts[b], or nil.
func dr(drafts [][]int32, b int) []int32 {
	if drafts == nil {
		return nil
	}
	return drafts[b]
}

func (g *traceGen) run(nops int) {
	for len(g.ops) < nops {
		if g.tiers && g.rng.IntN(4) == 0 {
			g.tierOp()
			continue
		}
		if !g.tiers && g.rec != nil && g.rng.IntN(10) == 0 {
			g.drainOp()
			continue
		}
		switch k := g.rng.IntN(100); {
		case k < 15:
			g.next++
			f := g.rng.IntN(6)
			op := traceOp{Op: "add", ID: g.next, Tokens: family(f, (4+g.rng.IntN(30))*g.promptScale), Priority: g.rng.IntN(2)}
			if g.rng.IntN(8) == 0 {
				op.Tenant = "t"
			}
			n, err := g.m.Add(pagedkv.RequestID(op.ID), pagedkv.Request{
				Namespace: pagedkv.Namespace{Tenant: op.Tenant}, Prompt: op.Tokens, Priority: pagedkv.Priority(op.Priority)})
			g.record(op, int64(n), err)
		case k < 60:
			g.step()
		case k < 66:
			op := traceOp{Op: "fork", ID: g.pick(g.ids(true))}
			g.next++
			op.Child = g.next
			g.record(op, 0, g.m.Fork(pagedkv.RequestID(op.ID), pagedkv.RequestID(op.Child)))
		case k < 72:
			op := traceOp{Op: "release", ID: g.pick(append(g.ids(true), g.ids(false)...))}
			g.record(op, 0, g.m.Release(pagedkv.RequestID(op.ID)))
		case k < 77:
			op := traceOp{Op: "preempt", ID: g.pick(g.ids(true))}
			g.record(op, 0, g.m.Preempt(pagedkv.RequestID(op.ID)))
		case k < 84:
			op := traceOp{Op: "resume", ID: g.pick(g.ids(false))}
			n, err := g.m.Resume(pagedkv.RequestID(op.ID))
			g.record(op, int64(n), err)
		case k < 88:
			op := traceOp{Op: "extend", ID: g.pick(g.ids(true)), Tokens: []int32{int32(g.rng.IntN(50)), 3}}
			g.record(op, 0, g.m.Extend(pagedkv.RequestID(op.ID), op.Tokens...))
		case k < 89:
			op := traceOp{Op: "truncate", ID: g.pick(append(g.ids(true), g.ids(false)...))}
			op.N = max(0, len(g.m.Tokens(pagedkv.RequestID(op.ID)))-g.rng.IntN(6))
			g.record(op, 0, g.m.Truncate(pagedkv.RequestID(op.ID), op.N))
		case k < 91:
			op := traceOp{Op: "evict", N: g.rng.IntN(4)}
			g.record(op, int64(g.m.Evict(op.N)), nil)
		case k < 95:
			op := traceOp{Op: "pin", Tokens: family(g.rng.IntN(6), (8+g.rng.IntN(12))*g.promptScale)}
			pin, n, err := g.m.Pin(pagedkv.Namespace{}, op.Tokens)
			if err == nil {
				g.pins = append(g.pins, uint64(pin))
			}
			g.record(op, int64(n), err)
		case k < 98:
			op := traceOp{Op: "unpin", ID: 999}
			if len(g.pins) > 0 && g.rng.IntN(4) > 0 {
				i := g.rng.IntN(len(g.pins))
				op.ID = g.pins[i]
				g.pins = slices.Delete(g.pins, i, i+1)
			}
			g.record(op, 0, g.m.Unpin(pagedkv.PinID(op.ID)))
		default: // a call that must fail
			g.next++
			op := traceOp{Op: "add", ID: g.next, Tokens: []int32{1, -2}}
			_, err := g.m.Add(pagedkv.RequestID(op.ID), pagedkv.Request{Prompt: op.Tokens})
			g.record(op, 0, err)
		}
	}
}

func makeTraces(t testing.TB) traceFile {
	configs := []struct {
		name string
		cfg  pagedkv.Config
	}{
		{"full attention, cascade plans", pagedkv.Config{NumPages: 64, PageSize: 4, HashSeed: 3, MaxPinnedPages: 6, CascadeMinSavedPages: 2}},
		{"sliding window", pagedkv.Config{NumPages: 48, PageSize: 4, HashSeed: 5, WindowTokens: 10, Priorities: 2}},
	}
	var f traceFile
	for i, c := range configs {
		m, err := pagedkv.New(c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		g := &traceGen{t: t, m: m, dense: m, rng: rand.New(rand.NewPCG(uint64(i), 19)), promptScale: 1, maxChunk: 12}
		g.run(300)
		f.Traces = append(f.Traces, trace{Name: c.name, Ops: g.ops, Config: map[string]int64{
			"num_pages": int64(c.cfg.NumPages), "page_size": int64(c.cfg.PageSize), "window_tokens": int64(c.cfg.WindowTokens),
			"priorities": int64(c.cfg.Priorities), "max_pinned_pages": int64(c.cfg.MaxPinnedPages),
			"hash_seed": int64(c.cfg.HashSeed), "cascade_min_saved_pages": int64(c.cfg.CascadeMinSavedPages),
		}})
	}
	return f
}

func TestTrace(t *testing.T) {
	f := makeTraces(t)
	checkGolden(t, "trace.json", f)
	// The trace must exercise what it claims to.
	checkCoverage(t, f, "add", "reserve", "commit", "abort", "fork", "release", "preempt", "resume", "extend",
		"evict", "pin", "unpin", "cascade", "copies", "error OutOfPages", "error BadArgument", "error UnknownRequest",
		"reserve_spec", "commit_spec", "truncate")
}

// checkGolden fails when testdata/name is not f (with -update, rewrites it).
func checkGolden(t *testing.T, name string, f traceFile) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	if err := enc.Encode(f); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./cabi -run Trace -update)", err)
	}
	if !bytes.Equal(old, buf.Bytes()) {
		t.Fatalf("%s is stale: the Manager's behaviour changed; check the change and run go test ./cabi -run Trace -update", path)
	}
}

// checkCoverage fails unless every trace kind in want occurs in f.
func checkCoverage(t *testing.T, f traceFile, want ...string) {
	seen := map[string]int{}
	for _, tr := range f.Traces {
		for _, op := range tr.Ops {
			seen[op.Op]++
			if op.Want.Err != "" {
				seen["error "+op.Want.Err]++
			}
			if op.Cascade != nil {
				seen["cascade"]++
			}
			if len(op.Plan["copies"]) > 0 {
				seen["copies"]++
			}
			for _, gs := range op.Want.GroupStats {
				if gs[8] > 0 {
					seen["pinned pages"]++
				}
			}
			if len(op.Want.Copies) > 0 {
				seen["tier copies"]++
			}
			if len(op.Want.Events) > 0 {
				seen["events"]++
			}
			if len(op.Want.Hashes) > 0 {
				seen["hashes"]++
			}
			if op.Want.TierStats != nil && op.Want.TierStats[4] > 0 {
				seen["remote hits"]++
			}
			if op.Want.TierStats != nil && op.Want.TierStats[3] > 0 {
				seen["host hits"]++
			}
			if (op.Op == "add" || op.Op == "resume") && op.Want.Value > 0 {
				seen["hits"]++
			}
			for _, g := range op.Groups {
				if len(g.Plan["state_indices"]) > 0 {
					seen["state indices"]++
					if len(g.Plan["copies"]) > 0 {
						seen["state copies"]++
					}
				}
				if g.Cascade != nil {
					seen["group cascade"]++
				}
				if len(g.Plan["attn_qo_indptr"]) > 0 {
					seen["attn"]++
				}
				if len(g.Plan["positions"]) > 0 && !slices.Equal(g.Plan["positions"], g.Plan["token_positions"]) {
					seen["released pages"]++
				}
			}
		}
	}
	for _, k := range want {
		if seen[k] == 0 {
			t.Errorf("the trace has no %q: %v", k, seen)
		}
	}
	t.Logf("trace coverage: %v", seen)
}

// hybridTraceConfigs are the hybrid models the Python binding replays: a
// gpt-oss-like model (sliding window 128 and full attention) and a
// Llama-4-like one (chunked local attention and full attention).
var hybridTraceConfigs = []struct {
	name                  string
	cfg                   pagedkv.HybridConfig
	promptScale, maxChunk int
}{
	{"gpt-oss-like: sliding 128 + full", pagedkv.HybridConfig{
		Config: pagedkv.Config{NumPages: 160, PageSize: 16, HashSeed: 7, Priorities: 2, CascadeMinSavedPages: 2},
		Groups: []pagedkv.LayerGroup{{Kind: pagedkv.SlidingAttention, WindowTokens: 128, NumLayers: 1}, {Kind: pagedkv.FullAttention, NumLayers: 1}},
	}, 8, 48},
	{"llama-4-like: chunked 16 + full", pagedkv.HybridConfig{
		Config: pagedkv.Config{NumPages: 64, PageSize: 4, HashSeed: 11, CascadeMinSavedPages: 2},
		Groups: []pagedkv.LayerGroup{{Kind: pagedkv.ChunkedAttention, ChunkTokens: 16, NumLayers: 1}, {Kind: pagedkv.FullAttention, NumLayers: 1}},
	}, 2, 12},
}

func makeHybridTraces(t testing.TB) traceFile {
	var f traceFile
	for i, c := range hybridTraceConfigs {
		// With KV events: each group's batches carry its group_idx and spec.
		rec, q, err := newRecorder(recorderConfig(c.cfg.Config, c.cfg.Groups), DefaultEventBatches)
		if err != nil {
			t.Fatal(err)
		}
		cfg := c.cfg
		cfg.CacheEvents = rec
		m, err := pagedkv.NewHybrid(cfg)
		if err != nil {
			t.Fatal(err)
		}
		g := &traceGen{t: t, m: m, hybrid: m, rng: rand.New(rand.NewPCG(uint64(i), 23)), promptScale: c.promptScale, maxChunk: c.maxChunk,
			rec: rec, evq: q, enc: events.NewEncoder()}
		g.run(300)
		tr := trace{Name: c.name, Ops: g.ops, Events: true, Config: map[string]int64{
			"num_pages": int64(c.cfg.NumPages), "page_size": int64(c.cfg.PageSize), "priorities": int64(c.cfg.Priorities),
			"hash_seed": int64(c.cfg.HashSeed), "cascade_min_saved_pages": int64(c.cfg.CascadeMinSavedPages),
		}}
		for _, gr := range c.cfg.Groups {
			tr.Groups = append(tr.Groups, map[string]int64{"kind": int64(gr.Kind), "window_tokens": int64(gr.WindowTokens),
				"chunk_tokens": int64(gr.ChunkTokens), "num_layers": int64(gr.NumLayers)})
		}
		f.Traces = append(f.Traces, tr)
	}
	return f
}

// TestHybridTrace is TestTrace for HybridManager: testdata/hybrid_trace.json,
// which python/tests/test_hybrid_trace.py replays.
func TestHybridTrace(t *testing.T) {
	f := makeHybridTraces(t)
	checkGolden(t, "hybrid_trace.json", f)
	checkCoverage(t, f, "add", "reserve", "commit", "abort", "fork", "release", "preempt", "resume", "extend",
		"evict", "group cascade", "copies", "attn", "released pages", "error OutOfPages", "error BadArgument",
		"error UnknownRequest", "reserve_spec", "commit_spec", "truncate", "pin", "unpin", "pinned pages", "drain_events", "events")
}
