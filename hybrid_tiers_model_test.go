package pagedkv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/redistest"
	"github.com/pagedkv/pagedkv/layergroup"
	"github.com/pagedkv/pagedkv/tier"
	"github.com/pagedkv/pagedkv/tier/disk"
	"github.com/pagedkv/pagedkv/tier/redis"
)

// TestHybridTiersMatchModel drives HybridManagers with a host tier (and,
// in its "redis" and "disk" subtests, replicas over a real redis-server or
// a disk store below it) and pins through
// 10^5 random operations in all (a tenth under -race or -short): adds and
// resumes over shared prompts in two namespaces, plain and speculative
// steps, aborts, forks, truncation, extension, preemption, release,
// evictions that offload to the host tier, pins and unpins, and tier
// copies completed in random subsets at random times (plus IDs never
// issued, which must be refused without a change). The pools are small, so
// steps evict, host pages are reclaimed and onloads compete for pages.
//
// The slow reference model (htModel) is the requests as the engine sees
// them: every request's tokens, computed count and state follow from the
// operations alone, and so do the pool's request and token counters. A hit
// (Add, Resume) is the one thing a cache decides; the model checks it:
// page aligned, at most every full page before the last token, every page
// of it computed before in that namespace (no page is served that was
// never computed), and at least every live pin's prefix the tokens start
// with (pins hold their pages in every group). Every live pin's pages stay
// cached in every group. After every operation: Audit (every group, the
// pool's reference counts with the tier copies, the host tier, each
// request's loading count), the model's checks, and the K/V of every page
// any group's attention may read, whatever tier it came from: each value
// depends on the namespace, every token up to it and the group, so a page
// served to the wrong prefix or to another group shows up. A run ends by
// draining: no device page, host page or copy may be left.
func TestHybridTiersMatchModel(t *testing.T) {
	t.Parallel()
	// 4 configs of 6 runs of 4000 operations, and 4 replicas of 500 over
	// Redis and 4 over a disk store: 10^5 operations.
	const runs, replicas = 6, 4
	perRun, perReplica := 4000, 500
	if testing.Short() || raceEnabled {
		perRun, perReplica = perRun/10, perReplica/10
	}
	configs := hybridConfigs()
	names := slices.Sorted(maps.Keys(configs))
	for _, name := range names {
		groups := configs[name]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var sum htSums
			for run := range runs {
				x := newHTHarness(t, groups, htConfig{seed: uint64(run), hostPages: 8 + 4*(run%3), ahead: run % 3,
					writeThrough: run%2 == 1, events: run%3 == 0})
				x.run(perRun)
				sum.add(x)
			}
			sum.require(t)
			t.Logf("%d runs of %d ops: %s", runs, perRun, sum)
		})
	}
	// Replicas one after another over one store: each starts with an empty
	// host tier and is served what the ones before stored, so the model's
	// record of computed prefixes carries over.
	replicated := func(t *testing.T, open func(run int) tier.RemoteStore, flush func(tier.RemoteStore)) {
		var sum htSums
		var computed map[string]bool
		for run := range replicas {
			s := open(run)
			x := newHTHarness(t, configs["gpt-oss-like"], htConfig{seed: 100 + uint64(run), hostPages: 8, ahead: run % 2, remote: s, computed: computed,
				events: run%2 == 0})
			x.run(perReplica)
			computed = x.model.computed
			flush(s)
			require.Zero(t, s.Stats().Rejected, "%+v", s.Stats())
			sum.add(x)
		}
		require.Positive(t, sum.remoteHits, "no page was ever served from the store")
		for g, n := range sum.hostEvents {
			require.Positive(t, n, "group %d announced no host page", g)
		}
		t.Logf("%d replicas of %d ops: %s", replicas, perReplica, sum)
	}
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		replicated(t, func(int) tier.RemoteStore { return newRedisStore(t, srv) },
			func(s tier.RemoteStore) { flushStore(t, s.(*redis.Store)) })
	})
	t.Run("disk", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		// A replica is a restarted process: it reopens the directory.
		replicated(t, func(int) tier.RemoteStore { return openDiskStore(t, dir, 256) },
			func(s tier.RemoteStore) { closeDiskStore(t, s.(*disk.Store)) })
	})
}

// FuzzHybridTiers drives TestHybridTiersMatchModel's workload from raw
// bytes: the first byte picks the config, the host pool, evict-ahead and
// write-through, the rest are the operations' random draws (read by
// hybrid_test.go's byteSource); an odd-length input also records KV events
// of the device and host pages, checked per (group, medium) after every
// operation. The model's checks, Audit and every
// group's K/V run after every operation; the run must drain without a leak
// in any tier. Inputs are cut at 1024 bytes (memory and time bounded).
func FuzzHybridTiers(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	f.Add(make([]byte, 64))
	f.Add([]byte("\x13 hybrid tiers: add, step, evict, pin, complete, onload, release"))
	configs := hybridConfigs()
	maps.Copy(configs, aliasConfigs()) // indexer and shared-KV groups too
	names := slices.Sorted(maps.Keys(configs))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		data = data[:min(len(data), 1024)]
		h := data[0]
		x := newHTHarness(t, configs[names[int(h)%len(names)]], htConfig{hostPages: 4 + 4*int(h>>2%4), ahead: int(h >> 4 % 3),
			writeThrough: h&0x80 != 0, events: len(data)%2 == 1, src: &byteSource{data: data[1:]}})
		x.run(len(data) / 3)
	})
}

// htConfig is one run.
type htConfig struct {
	seed         uint64
	hostPages    int
	ahead        int
	writeThrough bool
	remote       tier.RemoteStore
	events       bool
	computed     map[string]bool // the model's computed prefixes so far (a replica's)
	src          rand.Source     // the operations' randomness; nil: PCG(seed)
}

// htHarness is a HybridManager with tiers, its fake engine and the model.
type htHarness struct {
	t   *testing.T
	rng *rand.Rand
	h   *HybridManager
	ps  int
	kv  []uint64 // device K per [page*ps+entry]
	fmt tier.PageFormat
	idx []uint64 // device indexer K per [page*ps+entry] (indexer groups' tensor)
	// dropIndexer: tier copies leave the indexer pages behind (what
	// SGLang #38031 did), for the test that shows check catches it.
	dropIndexer bool
	issue       []TierCopy
	buf         []TierCopy
	ev          *hybridEvents // nil: no KV events
	model       *htModel
	pins        []PinID
	next        RequestID

	pinned, onloadChecks int
}

const htPageSize, htMaxPinned = 4, 2

func newHTHarness(t *testing.T, groups []LayerGroup, c htConfig) *htHarness {
	owners := layergroup.NumOwners(groups)
	numPages := 10 + 6*owners
	tc := TierConfig{HostPages: c.hostPages, Format: htFormat(groups), OffloadFreePages: c.ahead,
		WriteThrough: c.writeThrough, Remote: c.remote, RemoteDeadline: 5 * time.Second}
	cfg := HybridConfig{Config: Config{NumPages: numPages, PageSize: htPageSize, HashSeed: 5, MaxPinnedPages: htMaxPinned, Tiers: tc},
		Groups: groups}
	src := c.src
	if src == nil {
		src = rand.NewPCG(c.seed, 41)
	}
	x := &htHarness{t: t, rng: rand.New(src), ps: htPageSize, kv: make([]uint64, numPages*htPageSize), idx: make([]uint64, numPages*htPageSize), fmt: tc.Format,
		model: newHTModel(htPageSize, c.computed), next: 1}
	if c.events {
		// Only the groups that own pages have KV events of their own.
		x.ev = newHybridEvents(t, groups[:owners], numPages, htPageSize, c.hostPages)
		cfg.CacheEvents = x.ev.rec
	}
	h, err := NewHybrid(cfg)
	require.NoError(t, err)
	x.h = h
	return x
}

// ctxKVs returns the fake K of every token of tokens in ns in group g: a
// hash of the namespace, every token up to it and the group.
func ctxKVs(g int, ns Namespace, tokens []int32) []uint64 {
	h := uint64(0x9e3779b97f4a7c15) ^ uint64(g+1)*0xff51afd7ed558ccd
	for _, s := range []string{ns.Tenant, ns.LoRA, ns.Salt} {
		for _, c := range []byte(s) {
			h = (h ^ uint64(c)) * 0x100000001b3
		}
		h = (h ^ 0xff) * 0x100000001b3
	}
	out := make([]uint64, len(tokens))
	for i, tk := range tokens {
		h = (h ^ uint64(uint32(tk))) * 0x100000001b3
		h ^= h >> 29
		out[i] = h | 1
	}
	return out
}

func (x *htHarness) run(ops int) {
	for op := range ops {
		what := x.op()
		x.check(op, what)
	}
	x.drain()
}

// pick returns a random live request for which want holds.
func (x *htHarness) pick(want func(RequestID) bool) (RequestID, bool) {
	var ids []RequestID
	for _, id := range x.model.ids() {
		if want(id) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return 0, false
	}
	return ids[x.rng.IntN(len(ids))], true
}

func (x *htHarness) runnable(id RequestID) bool { return x.h.Running(id) && !x.h.Loading(id) }

var htSpaces = []Namespace{{}, {Tenant: "b"}}

func (x *htHarness) op() string {
	r, h, m, t := x.rng, x.h, x.model, x.t
	// Few requests, none very long: the pool is small.
	for _, id := range m.ids() {
		if len(m.reqs[id].tokens) > 60 || len(m.reqs) > 8 {
			require.NoError(t, h.Release(id))
			m.release(id)
		}
	}
	switch k := r.IntN(40); {
	case k < 6:
		id := x.next
		x.next++
		ns := htSpaces[r.IntN(len(htSpaces))]
		prompt := promptOf(r.IntN(8), 1+r.IntN(26))
		hit, err := h.Add(id, Request{Namespace: ns, Prompt: prompt})
		require.NoError(t, err)
		m.add(t, id, ns, prompt, hit)
		return "add"
	case k < 18:
		x.step()
		return "step"
	case k < 20:
		if id, ok := x.pick(func(RequestID) bool { return true }); ok {
			require.NoError(t, h.Release(id))
			m.release(id)
		}
		return "release"
	case k < 22:
		if id, ok := x.pick(h.Running); ok {
			require.NoError(t, h.Preempt(id))
			m.preempt(id)
		}
		return "preempt"
	case k < 24:
		if id, ok := x.pick(func(id RequestID) bool { return !h.Running(id) }); ok {
			hit, err := h.Resume(id)
			require.NoError(t, err)
			m.resume(t, id, hit)
		}
		return "resume"
	case k < 26:
		h.Evict(1 + r.IntN(6))
		return "evict"
	case k < 27:
		if id, ok := x.pick(func(RequestID) bool { return true }); ok {
			tokens := promptOf(r.IntN(8), 1+r.IntN(5))
			require.NoError(t, h.Extend(id, tokens...))
			m.reqs[id].tokens = append(m.reqs[id].tokens, tokens...)
		}
		return "extend"
	case k < 28:
		if id, ok := x.pick(func(id RequestID) bool { return !h.Loading(id) }); ok {
			n := max(0, len(m.reqs[id].tokens)-r.IntN(10))
			if err := h.Truncate(id, n); err != nil {
				// A window or chunked group whose next query would read
				// released keys refuses; nothing changed.
				require.ErrorIs(t, err, ErrBadArgument)
			} else {
				m.truncate(id, n)
			}
		}
		return "truncate"
	case k < 29:
		if p, ok := x.pick(x.runnable); ok {
			id := x.next
			x.next++
			require.NoError(t, h.Fork(p, id))
			m.fork(p, id)
		}
		return "fork"
	case k < 30:
		// A request that waits for onloads in any group may not fork or
		// step, and says so.
		if id, ok := x.pick(h.Loading); ok {
			require.ErrorIs(t, h.Fork(id, x.next), ErrLoading)
			_, err := h.Reserve([]RequestID{id}, []int32{0})
			require.ErrorIs(t, err, ErrLoading)
			x.onloadChecks++
		}
		return "loading"
	case k < 32:
		x.pin()
		return "pin"
	case k < 33:
		x.unpin()
		return "unpin"
	case k < 34:
		// IDs never issued are refused without a change.
		ids := []uint64{r.Uint64(), r.Uint64() & 0xffff_ffff}
		before := hybridOwnStats(h)
		require.Error(t, h.CompleteTierCopies(ids...))
		require.Equal(t, before, hybridOwnStats(h))
		return "complete bad ids"
	default:
		x.complete(func() bool { return r.IntN(2) == 0 })
		return "complete"
	}
}

// hybridOwnStats is h's Stats less the remote store's counters, which its
// writer moves in the background.
func hybridOwnStats(h *HybridManager) HybridStats {
	s := h.Stats()
	s.Tiers.Remote = tier.RemoteStats{}
	return s
}

// pin pins a prompt the adds draw, in both namespaces.
func (x *htHarness) pin() {
	r, h, t := x.rng, x.h, x.t
	ns := htSpaces[r.IntN(len(htSpaces))]
	tokens := promptOf(r.IntN(8), 1+r.IntN(26))
	id, n, err := h.Pin(ns, tokens)
	switch {
	case errors.Is(err, ErrNotCached), errors.Is(err, ErrPinLimit):
		return
	case err != nil:
		require.NoError(t, err, "pin")
	}
	x.model.pin(t, id, ns, tokens, n)
	x.pins = append(x.pins, id)
	x.pinned++
}

// unpin removes a live pin, or one that never was (refused).
func (x *htHarness) unpin() {
	r, t := x.rng, x.t
	if len(x.pins) == 0 || r.IntN(6) == 0 {
		err := x.h.Unpin(PinID(1 << 40))
		require.ErrorIs(t, err, ErrUnknownPin)
		return
	}
	i := r.IntN(len(x.pins))
	require.NoError(t, x.h.Unpin(x.pins[i]))
	delete(x.model.pins, x.pins[i])
	x.pins = slices.Delete(x.pins, i, i+1)
}

// step reserves a step of runnable requests (speculative at times), writes
// every group's rows and commits or aborts it; out of pages, it preempts.
func (x *htHarness) step() {
	r, h, m, t := x.rng, x.h, x.model, x.t
	var cand []RequestID
	for _, id := range m.ids() {
		if x.runnable(id) {
			cand = append(cand, id)
		}
	}
	ids, nt, drafts := stepDraw{minNew: 1, newSpan: 7, draftSpan: 4, spec: r.IntN(2) == 0}.draw(r, h, cand)
	if len(ids) == 0 {
		return
	}
	p, err := h.ReserveSpec(ids, nt, drafts)
	if errors.Is(err, ErrOutOfPages) {
		id := ids[r.IntN(len(ids))]
		require.NoError(t, h.Preempt(id))
		m.preempt(id)
		return
	}
	require.NoError(t, err)
	x.take()
	x.engine(p)
	if r.IntN(10) == 0 {
		require.NoError(t, h.Abort())
		return
	}
	accepted, sampled := drawCommit(r, h, ids, nt, drafts)
	require.NoError(t, h.CommitSpec(accepted, sampled))
	m.commit(ids, nt, drafts, accepted, sampled)
}

// engine performs a plan's copies and writes every group's rows.
func (x *htHarness) engine(p *HybridPlan) {
	ps := x.ps
	for _, c := range p.Copies {
		// A copy copies the page in every tensor, the indexer's included.
		copy(x.kv[int(c.Dst)*ps:int(c.Dst)*ps+int(c.Entries)], x.kv[int(c.Src)*ps:])
		copy(x.idx[int(c.Dst)*ps:int(c.Dst)*ps+int(c.Entries)], x.idx[int(c.Src)*ps:])
	}
	for g, gp := range p.Groups {
		dst := x.kv
		switch spec := x.h.Group(g); spec.Kind {
		case SharedKVAttention:
			// Reads its target's KV, writes nothing: its Plan is the target's.
			require.Same(x.t, p.Groups[spec.Target], gp, "shared-KV group %d's plan", g)
			continue
		case IndexerAttention:
			checkIndexerPlan(x.t, p, g, spec.Target)
			require.NoError(x.t, x.h.auditAliases())
			dst = x.idx
		}
		for b, id := range gp.Requests {
			kvs := ctxKVs(g, x.model.reqs[id].ns, x.h.Tokens(id))
			for i := gp.QOIndptr[b]; i < gp.QOIndptr[b+1]; i++ {
				pos := gp.Positions[i]
				page := gp.KVPageIndices[gp.KVIndptr[b]+pos/int32(ps)]
				dst[int(page)*ps+int(pos)%ps] = kvs[gp.TokenPositions[i]]
			}
		}
	}
}

// take moves newly planned tier copies to the issued list.
func (x *htHarness) take() {
	x.buf = x.h.TierCopies(x.buf[:0])
	x.issue = append(x.issue, x.buf...)
}

// complete runs and completes the issued copies pick chooses (every one
// when pick is nil), each as late as an engine may: at completion.
func (x *htHarness) complete(pick func() bool) {
	x.take()
	f := x.fmt
	plane := f.PlaneBytes()
	var ids []uint64
	kept := x.issue[:0]
	for _, c := range x.issue {
		if pick != nil && !pick() {
			kept = append(kept, c)
			continue
		}
		hp := x.h.HostPage(c.Host)
		require.Len(x.t, hp, f.PageBytes(), "host page %d", c.Host)
		for e := range x.ps {
			slot := &x.kv[int(c.Device)*x.ps+e]
			if c.Dir == tier.ToHost {
				binary.LittleEndian.PutUint64(hp[e*8:], *slot)
				binary.LittleEndian.PutUint64(hp[plane+e*8:], ^*slot)
			} else {
				k, v := binary.LittleEndian.Uint64(hp[e*8:]), binary.LittleEndian.Uint64(hp[plane+e*8:])
				require.Equal(x.t, ^k, v, "host page %d entry %d: V is not K's complement", c.Host, e)
				*slot = k
			}
		}
		if f.IndexerLayers > 0 && !x.dropIndexer {
			htIndexerCopy(c, hp, f, x.idx[int(c.Device)*x.ps:(int(c.Device)+1)*x.ps])
		}
		ids = append(ids, c.ID)
	}
	x.issue = kept
	require.NoError(x.t, x.h.CompleteTierCopies(ids...))
}

// check runs the checks after an operation.
func (x *htHarness) check(op int, what string) {
	t, h, m, ps := x.t, x.h, x.model, x.ps
	if err := h.Audit(); err != nil {
		t.Fatalf("op %d (%s): %v", op, what, err)
	}
	if x.ev != nil {
		x.ev.check(h, fmt.Sprintf("op %d (%s)", op, what))
	}
	s := h.Stats()
	got := [...]int64{s.PromptTokens, s.PromptHitTokens, s.ComputedTokens, s.Steps, s.Preemptions, s.ResumedTokens, s.ResumeHitTokens,
		s.DraftTokens, s.AcceptedDraftTokens, int64(s.Requests), int64(s.PreemptedRequests)}
	preempted := 0
	for _, r := range m.reqs {
		if !r.running {
			preempted++
		}
	}
	c := &m.st
	want := [...]int64{c.promptTokens, c.promptHitTokens, c.computedTokens, c.steps, c.preemptions, c.resumedTokens, c.resumeHitTokens,
		c.draftTokens, c.acceptedDraftTokens, int64(len(m.reqs)), int64(preempted)}
	if got != want {
		t.Fatalf("op %d (%s): counters %v, model %v", op, what, got, want)
	}
	require.Equal(t, h.TierCopiesInFlight(), s.Tiers.InFlight)
	// The groups' tier counters add up to the pool's.
	var gt [4]int64
	for _, gs := range s.Groups {
		gt[0], gt[1], gt[2], gt[3] = gt[0]+gs.HostHitTokens, gt[1]+gs.RemoteHitTokens, gt[2]+gs.OffloadedPages, gt[3]+gs.OnloadedPages
	}
	if pt := [4]int64{s.Tiers.HostHitTokens, s.Tiers.RemoteHitTokens, s.Tiers.OffloadedPages, s.Tiers.OnloadedPages}; gt != pt {
		t.Fatalf("op %d (%s): the groups' tier counters %v do not add up to the pool's %v", op, what, gt, pt)
	}
	for _, id := range m.ids() {
		r := m.reqs[id]
		if !slices.Equal(h.Tokens(id), r.tokens) || h.Computed(id) != r.computed || h.Running(id) != r.running {
			t.Fatalf("op %d (%s): request %d: %d tokens, %d computed, running %v; model %d %d %v",
				op, what, id, len(h.Tokens(id)), h.Computed(id), h.Running(id), len(r.tokens), r.computed, r.running)
		}
		if !r.running || h.Loading(id) {
			continue
		}
		for g := range h.NumGroups() {
			spec := h.Group(g)
			pages, start := h.Pages(g, id)
			if start != spec.KeepFrom(r.computed, ps) {
				t.Fatalf("op %d (%s): request %d group %d starts at %d, want %d", op, what, id, g, start, spec.KeepFrom(r.computed, ps))
			}
			src, kvs := x.kv, ctxKVs(g, r.ns, r.tokens)
			switch spec.Kind {
			case SharedKVAttention:
				kvs = ctxKVs(spec.Target, r.ns, r.tokens) // the target's KV
			case IndexerAttention:
				if err := x.indexerMismatch(id, g); err != nil {
					t.Fatalf("op %d (%s): %v", op, what, err)
				}
				continue
			}
			for tk := start; tk < r.computed; tk++ {
				if got := src[int(pages[(tk-start)/ps])*ps+(tk-start)%ps]; got != kvs[tk] {
					t.Fatalf("op %d (%s): request %d group %d token %d on page %d reads %#x, want %#x",
						op, what, id, g, tk, pages[(tk-start)/ps], got, kvs[tk])
				}
			}
		}
	}
	// Every live pin's pages stay cached in every group.
	for id, p := range m.pins {
		for g, gm := range h.core.groups {
			pages, _ := gm.cache.Match(nil, gm.cache.Key(p.ns), p.tokens, len(p.tokens)/ps)
			if len(pages)*ps < len(p.tokens) {
				t.Fatalf("op %d (%s): pin %d of %d tokens: group %d holds %d", op, what, id, len(p.tokens), g, len(pages)*ps)
			}
		}
	}
}

// drain completes every copy, releases every request, unpins and evicts
// everything: every device page must then be free, no copy in flight and
// no host page writing or read.
func (x *htHarness) drain() {
	t, h := x.t, x.h
	x.complete(nil)
	for _, id := range x.model.ids() {
		require.NoError(t, h.Release(id))
		x.model.release(id)
	}
	for _, id := range x.pins {
		require.NoError(t, h.Unpin(id))
	}
	x.pins, x.model.pins = nil, map[PinID]htPin{}
	x.complete(nil)
	for h.Evict(h.core.alloc.NumPages()) > 0 {
		x.complete(nil)
	}
	x.complete(nil)
	require.NoError(t, h.Audit())
	s := h.Stats()
	require.Equal(t, s.TotalPages, s.FreePages, "device pages leaked: %+v", s.Stats)
	require.Zero(t, s.Tiers.InFlight, "tier copies left in flight")
	free, writing, ready, reclaimable := h.core.tiers.host.Usage()
	require.Zero(t, writing, "host pages left writing")
	require.Equal(t, ready, reclaimable, "host pages left with readers")
	require.Equal(t, h.core.tiers.host.NumPages(), free+ready, "host pages leaked")
}

// htSums adds up what the runs exercised.
type htSums struct {
	hostHits, remoteHits, offloaded, onloaded, evicted, hits, pinned, onloadChecks, steps int64
	hostEvents                                                                            []int64 // CPU pages announced per group (runs with events)
}

func (s *htSums) add(x *htHarness) {
	if x.ev != nil {
		for g, n := range x.ev.hostSeen {
			if g >= len(s.hostEvents) {
				s.hostEvents = append(s.hostEvents, 0)
			}
			s.hostEvents[g] += int64(n)
		}
	}
	st := x.h.Stats()
	s.hostHits += st.Tiers.HostHitTokens
	s.remoteHits += st.Tiers.RemoteHitTokens
	s.offloaded += st.Tiers.OffloadedPages
	s.onloaded += st.Tiers.OnloadedPages
	s.evicted += st.EvictedPages
	s.hits += st.PromptHitTokens
	s.steps += st.Steps
	s.pinned += int64(x.pinned)
	s.onloadChecks += int64(x.onloadChecks)
}

func (s htSums) require(t *testing.T) {
	require.Positive(t, s.hostHits, "the workload never hit the host tier")
	for g, n := range s.hostEvents {
		require.Positive(t, n, "group %d announced no host page", g)
	}
	require.Positive(t, s.offloaded)
	require.Positive(t, s.onloaded)
	require.Positive(t, s.evicted)
	require.Positive(t, s.pinned)
	require.Positive(t, s.onloadChecks, "no step or fork of a loading request was tried")
}

func (s htSums) String() string {
	return fmt.Sprintf("%d steps, %d hit tokens (%d from host pages, %d from the remote store), %d pages offloaded, %d onloaded, %d evicted, %d pins, %d loading refusals",
		s.steps, s.hits, s.hostHits, s.remoteHits, s.offloaded, s.onloaded, s.evicted, s.pinned, s.onloadChecks)
}

// ---- The model ----

// htModel is the slow reference: requests as the engine sees them, the
// prefixes ever computed per namespace, live pins, and the counters.
type htModel struct {
	ps       int
	reqs     map[RequestID]*htReq
	computed map[string]bool // namespace and page-aligned token prefix whose KV some request computed
	pins     map[PinID]htPin
	st       struct {
		promptTokens, promptHitTokens, computedTokens, steps, preemptions, resumedTokens, resumeHitTokens int64
		draftTokens, acceptedDraftTokens                                                                  int64
	}
}

type htReq struct {
	ns       Namespace
	tokens   []int32
	computed int
	running  bool
	lost     int
}

type htPin struct {
	ns     Namespace
	tokens []int32 // the pinned prefix
}

func newHTModel(ps int, computed map[string]bool) *htModel {
	if computed == nil {
		computed = map[string]bool{}
	}
	return &htModel{ps: ps, reqs: map[RequestID]*htReq{}, computed: computed, pins: map[PinID]htPin{}}
}

func htKey(ns Namespace, tokens []int32) string {
	return fmt.Sprintf("%q/%q/%q:%v", ns.Tenant, ns.LoRA, ns.Salt, tokens)
}

func (m *htModel) ids() []RequestID { return slices.Sorted(maps.Keys(m.reqs)) }

// sawComputed records r's computed page-aligned prefixes.
func (m *htModel) sawComputed(r *htReq) {
	for k := m.ps; k <= r.computed; k += m.ps {
		m.computed[htKey(r.ns, r.tokens[:k])] = true
	}
}

// checkHit checks an admission's hit on tokens in ns.
func (m *htModel) checkHit(t *testing.T, ns Namespace, tokens []int32, hit int) {
	t.Helper()
	cap := 0
	if len(tokens) > 1 {
		cap = (len(tokens) - 1) / m.ps * m.ps
	}
	require.Zero(t, hit%m.ps, "hit %d is not page aligned", hit)
	require.LessOrEqual(t, hit, cap, "hit %d of %d tokens", hit, len(tokens))
	for k := m.ps; k <= hit; k += m.ps {
		require.True(t, m.computed[htKey(ns, tokens[:k])], "hit of %d tokens serves %d tokens never computed", hit, k)
	}
	for id, p := range m.pins {
		if p.ns == ns && len(p.tokens) <= len(tokens) && slices.Equal(p.tokens, tokens[:len(p.tokens)]) {
			require.GreaterOrEqual(t, hit, min(len(p.tokens), cap), "pin %d of %d tokens not served", id, len(p.tokens))
		}
	}
}

func (m *htModel) add(t *testing.T, id RequestID, ns Namespace, prompt []int32, hit int) {
	m.checkHit(t, ns, prompt, hit)
	r := &htReq{ns: ns, tokens: slices.Clone(prompt), computed: hit, running: true}
	m.reqs[id] = r
	m.st.promptTokens += int64(len(prompt))
	m.st.promptHitTokens += int64(hit)
}

func (m *htModel) resume(t *testing.T, id RequestID, hit int) {
	r := m.reqs[id]
	m.checkHit(t, r.ns, r.tokens, hit)
	r.computed, r.running = hit, true
	m.st.resumedTokens += int64(r.lost)
	m.st.resumeHitTokens += int64(min(hit, r.lost))
	r.lost = 0
}

func (m *htModel) release(id RequestID) { delete(m.reqs, id) }

func (m *htModel) preempt(id RequestID) {
	r := m.reqs[id]
	r.lost, r.computed, r.running = r.computed, 0, false
	m.st.preemptions++
}

func (m *htModel) fork(parent, child RequestID) {
	p := *m.reqs[parent]
	p.tokens = slices.Clone(p.tokens)
	m.reqs[child] = &p
}

func (m *htModel) truncate(id RequestID, n int) {
	r := m.reqs[id]
	r.tokens = r.tokens[:n]
	r.computed = min(r.computed, n)
	if !r.running {
		r.lost = min(r.lost, n)
	}
}

func (m *htModel) commit(ids []RequestID, nt []int32, drafts [][]int32, accepted, sampled []int32) {
	for b, id := range ids {
		r := m.reqs[id]
		r.tokens = append(r.tokens, drafts[b][:accepted[b]]...)
		r.computed += int(nt[b] + accepted[b])
		if sampled[b] != NoToken {
			r.tokens = append(r.tokens, sampled[b])
		}
		m.sawComputed(r)
		m.st.computedTokens += int64(nt[b] + accepted[b])
		m.st.draftTokens += int64(len(drafts[b]))
		m.st.acceptedDraftTokens += int64(accepted[b])
	}
	m.st.steps++
}

// pin checks a pin of n tokens of tokens and records it.
func (m *htModel) pin(t *testing.T, id PinID, ns Namespace, tokens []int32, n int) {
	_, dup := m.pins[id]
	require.False(t, dup, "pin %d handed out twice", id)
	require.Zero(t, n%m.ps)
	require.Positive(t, n)
	require.LessOrEqual(t, n, len(tokens))
	for k := m.ps; k <= n; k += m.ps {
		require.True(t, m.computed[htKey(ns, tokens[:k])], "pin of %d tokens covers %d never computed", n, k)
	}
	m.pins[id] = htPin{ns: ns, tokens: slices.Clone(tokens[:n])}
}
