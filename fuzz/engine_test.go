package fuzz

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/appendkv"
	"github.com/pagedkv/pagedkv/internal/reference"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/pagetable"
)

// engineOps are the commands of FuzzEngine. Arguments:
//
//	add      a%3: prompt family, a>>2%2: namespace, a>>3%8 == 7: reuse a
//	         live ID (must fail), b: prompt length 1..4*pageSize,
//	         c%priorities: priority, c&0x80: NoCache
//	step     a: first member of 1+c%4 requests (any state, so errors are
//	         exercised), b: chunk of uncomputed tokens per request
//	         (0..2*pageSize), c&0x80: commit without sampled tokens
//	abort    as step, but the step is aborted after its copies and appends
//	fork     a: parent, b%4 == 3: to a live ID (must fail)
//	extend   a: request, b: tokens 1..pageSize
//	release  a: request
//	preempt  a: request
//	resume   a: request
//	evict    a: pages wanted 1..8
//	pin      a%3: prompt family, a>>2%2: namespace, b: length
//	unpin    a: pin (255: unknown)
//	spec     as step, but each request whose chunk reaches the end of its
//	         known tokens adds 0..3 drafts (ReserveSpec); a random prefix
//	         of them is accepted (CommitSpec), c&0x40: abort instead
//	truncate a: request, b: tokens cut 0..2*pageSize (past 0: must fail)
var engineOps = OpSet{"add", "step", "abort", "fork", "extend", "release", "preempt", "resume", "evict", "pin", "unpin",
	"spec", "truncate"}

// engineGeom is the header of a FuzzEngine input.
type engineGeom struct {
	// Flags: bit 0 HND, bit 1 split, bits 2-4 the cache dtype
	// (appendCacheDTypes[x%5]), bit 5 a sliding window of pageSize+1
	// tokens, bit 6 a hash that always collides, bit 7 no cascade plans.
	Flags       uint8
	PageSize    uint8 // 1+%8
	NumPagesArg uint8 // 2+%30
	// Shape: bit 0 two KV heads (else one), bits 1-2 head dim 1..4.
	Shape uint8
}

// engineNamespaces are the namespaces requests draw from.
var engineNamespaces = []pagedkv.Namespace{{}, {Tenant: "t", LoRA: "x"}}

// FuzzEngine drives a pagedkv.Manager the way an engine does, with real K/V
// storage: requests are added (on cached prefixes), stepped (Reserve, the
// plan's copy-on-write copies performed on the cache, the plan's rows
// appended through appendkv on kernels/cpu, Commit with sampled tokens),
// aborted, forked, extended, preempted, resumed and released; the pool is
// evicted and pinned. Every command also runs on reference.ManagerModel,
// which must agree on every error class, every matched-token count, every
// request's tokens, computed count, start and page count, and the page
// partition of Stats.
//
// A token's K and V are a function of its namespace and every token up to
// it (as a real model's are), so a request reading K/V from a page that
// another request computed (a prefix-cache hit, a fork, a resume) must find
// exactly its own values. After every command Audit must pass and every
// running request's computed tokens, read back from the cache through its
// pages with the first-principles formula (reference.GatherBytes), must
// equal that function. Each step's plan must also be a valid CSR
// (ValidateCSR and CheckCSRSlow), its batch_indices/positions must match
// appendkv's plan and the slow COO expansion, its cascade layout (when
// there is one) must list each request's pages in the same order as the
// flat table, and its append must change exactly the bytes the reference
// append changes.
func FuzzEngine(f *testing.F) {
	ops := engineOps
	for _, s := range []struct {
		g    engineGeom
		prog []byte
	}{
		{engineGeom{0, 3, 14, 0}, nil},
		// Empty request (prompt of 1 token, never stepped) next to one that
		// fills its pages exactly (last_page_len == page_size), and a second
		// request hitting the first one's cached pages.
		{engineGeom{0, 3, 14, 3}, ops.Prog("add", 0, 0, 0, "add", 0, 7, 0, "step", 1, 7, 0, "step", 1, 1, 0, "add", 0, 11, 0, "step", 2, 7, 1)},
		// Page size 1, HND split f16.
		{engineGeom{0x07, 0, 10, 1}, ops.Prog("add", 1, 3, 0, "step", 0, 2, 0, "step", 0, 2, 0, "fork", 0, 0, 0, "step", 0, 1, 1, "release", 0, 0, 0)},
		// Full pool: prompts past the pool, preemption, resume on what the
		// cache kept.
		{engineGeom{0x08, 1, 4, 0}, ops.Prog("add", 0, 7, 0, "step", 0, 3, 0, "add", 1, 7, 0, "step", 1, 3, 1, "preempt", 0, 0, 0, "step", 1, 3, 0, "resume", 0, 0, 0, "evict", 7, 0, 0, "resume", 0, 0, 0, "step", 0, 3, 0)},
		// Sliding window (pageSize+1 tokens) with decode past it.
		{engineGeom{0x20, 1, 14, 2}, ops.Prog("add", 0, 6, 0, "step", 0, 7, 0, "extend", 0, 3, 0, "step", 0, 3, 0, "step", 0, 3, 0, "pin", 0, 7, 0, "release", 0, 0, 0, "evict", 3, 0, 0, "unpin", 0, 0, 0)},
		// Fork of a partial page, both branches in one step (copy-on-write),
		// an aborted step, cascade plans on a colliding hash.
		{engineGeom{0x4c, 3, 20, 1}, ops.Prog("add", 0, 9, 0, "step", 0, 9, 0, "step", 0, 1, 0, "fork", 0, 0, 0, "fork", 0, 0, 0, "step", 0, 1, 2, "abort", 1, 1, 1, "step", 0, 1, 2)},
		// Speculative steps after a fork (both branches share a partial
		// page), a truncation into a cached page, an aborted speculative step.
		{engineGeom{0x00, 3, 20, 1}, ops.Prog("add", 0, 9, 0, "step", 0, 9, 0, "fork", 0, 0, 0, "spec", 0, 1, 1, "spec", 0, 1, 1,
			"truncate", 0, 5, 0, "spec", 0, 3, 0x41, "spec", 0, 3, 0, "truncate", 1, 1, 0, "spec", 0, 0, 1)},
		// Two namespaces on one prompt never share pages; NoCache requests.
		{engineGeom{0x10, 2, 20, 0}, ops.Prog("add", 0, 8, 0, "step", 0, 8, 0, "add", 4, 8, 0, "step", 1, 8, 0, "add", 0, 8, 0x80, "step", 2, 8, 0, "add", 4, 8, 0, "step", 3, 8, 0)},
	} {
		f.Add(s.g.Flags, s.g.PageSize, s.g.NumPagesArg, s.g.Shape, s.prog)
	}
	backend := cpu.New(cpu.Config{Workers: 1})
	f.Fuzz(func(t *testing.T, flags, pageSize, numPages, shape uint8, prog []byte) {
		h := newEngineHarness(t, backend, engineGeom{flags, pageSize, numPages, shape})
		h.prog = Decode(nil, prog, len(engineOps))
		if len(h.prog) > maxCmds {
			h.prog = h.prog[:maxCmds]
		}
		h.runProgram()
	})
}

type engineHarness struct {
	t       *testing.T
	g       layout.Paged
	window  int
	prios   int
	backend kernels.Backend

	m     *pagedkv.Manager
	ref   *reference.ManagerModel
	cache kernels.PagedKVCache
	ap    appendkv.Plan
	bases [3][]int32

	ids    []pagedkv.RequestID // every request ever added that still exists
	ns     map[pagedkv.RequestID]int
	nextID pagedkv.RequestID
	pins   [][2]uint64 // real PinID, model pin

	prog []Cmd
	step int
	seen map[string]int
}

func newEngineHarness(t *testing.T, b kernels.Backend, eg engineGeom) *engineHarness {
	g := layout.Paged{
		Layout: layout.KVLayout(eg.Flags & 1), Form: layout.TensorForm(eg.Flags >> 1 & 1),
		DType:    appendCacheDTypes[int(eg.Flags>>2&7)%len(appendCacheDTypes)],
		NumPages: 2 + int(eg.NumPagesArg)%30, PageSize: 1 + int(eg.PageSize)%8,
		NumKVHeads: 1 + int(eg.Shape&1), HeadDim: 1 + int(eg.Shape>>1&3),
	}
	h := &engineHarness{t: t, g: g, prios: 3, backend: b, ns: map[pagedkv.RequestID]int{}, nextID: 1, seen: map[string]int{}}
	if eg.Flags&0x20 != 0 {
		h.window = g.PageSize + 1
	}
	cfg := pagedkv.Config{NumPages: g.NumPages, PageSize: g.PageSize, WindowTokens: h.window, Priorities: h.prios,
		MaxPinnedPages: g.NumPages / 2, HashSeed: 5, CascadeMinSavedPages: 1}
	if eg.Flags&0x40 != 0 {
		cfg.Hash = func(uint64, []int32) uint64 { return 3 }
	}
	if eg.Flags&0x80 != 0 {
		cfg.CascadeMinSavedPages = -1
	}
	var err error
	h.m, err = pagedkv.New(cfg)
	require.NoError(t, err)
	h.ref = reference.NewManagerModel(reference.ManagerModelConfig{NumPages: g.NumPages, PageSize: g.PageSize,
		WindowTokens: h.window, Priorities: h.prios, MaxPinnedPages: cfg.MaxPinnedPages})
	h.cache, err = kernels.NewPagedKVCache(g)
	require.NoError(t, err)
	fillGarbage(&h.cache, 29, 3)
	// Prompt families over three tokens: family 1 shares family 0's first
	// page, family 2 shares nothing by design (but may by chance).
	r := chooser{x: uint64(eg.PageSize)<<8 | uint64(eg.NumPagesArg)}
	for f := range h.bases {
		h.bases[f] = make([]int32, 4*g.PageSize)
		for i := range h.bases[f] {
			h.bases[f][i] = int32(r.intn(3))
		}
	}
	copy(h.bases[1], h.bases[0][:g.PageSize])
	return h
}

func (h *engineHarness) runProgram() {
	h.verify()
	for h.step = range h.prog {
		h.run(h.prog[h.step])
		h.verify()
	}
}

func (h *engineHarness) fatalf(format string, args ...any) {
	h.t.Helper()
	h.t.Fatalf("%s\ngeometry %+v window %d; command %d of:\n%s", fmt.Sprintf(format, args...),
		h.g, h.window, h.step, engineOps.Format(h.prog))
}

// managerErrors pairs the Manager's sentinels with the model's.
var managerErrors = []errorPair{
	{pagedkv.ErrOutOfPages, reference.ErrMgrOutOfPages},
	{pagedkv.ErrUnknownRequest, reference.ErrMgrUnknownRequest},
	{pagedkv.ErrRequestExists, reference.ErrMgrRequestExists},
	{pagedkv.ErrPreempted, reference.ErrMgrPreempted},
	{pagedkv.ErrNotPreempted, reference.ErrMgrNotPreempted},
	{pagedkv.ErrStepPending, reference.ErrMgrStepPending},
	{pagedkv.ErrNoStep, reference.ErrMgrNoStep},
	{pagedkv.ErrBadArgument, reference.ErrMgrBadArgument},
	{pagedkv.ErrNotCached, reference.ErrMgrNotCached},
	{pagedkv.ErrPinLimit, reference.ErrMgrPinLimit},
	{pagedkv.ErrUnknownPin, reference.ErrMgrUnknownPin},
}

// sameClass fails unless the real and model errors are both nil or of the
// same class, and reports whether the call succeeded.
func (h *engineHarness) sameClass(what string, err, merr error) bool {
	h.t.Helper()
	return matchErrors(h.fatalf, h.seen, managerErrors, pagedkv.ErrOutOfPages, what, err, merr)
}

// pick returns the live request a selects, or an unknown ID.
func (h *engineHarness) pick(a uint8) pagedkv.RequestID {
	return pickLive(h.ids, a)
}

func nsName(i int) string { return fmt.Sprintf("ns%d", i) }

func (h *engineHarness) run(c Cmd) {
	r := newChooser(c, h.step)
	ps := h.g.PageSize
	switch engineOps[c.Op] {
	case "add":
		id, ns := h.nextID, int(c.A>>2)%2
		if c.A>>3%8 == 7 && len(h.ids) > 0 {
			id = h.pick(c.B)
		}
		prompt := slices.Clone(h.bases[int(c.A)%3][:1+int(c.B)%(4*ps)])
		prio, noCache := int(c.C)%h.prios, c.C&0x80 != 0
		got, err := h.m.Add(id, pagedkv.Request{Namespace: engineNamespaces[ns], Prompt: prompt, Priority: pagedkv.Priority(prio), NoCache: noCache})
		want, merr := h.ref.Add(uint64(id), nsName(ns), prompt, prio, noCache)
		if h.sameClass(fmt.Sprintf("add %d", id), err, merr) {
			if got != want {
				h.fatalf("add %d: %d tokens matched, model %d", id, got, want)
			}
			if got > 0 {
				h.seen["prefix hit"]++
			}
			h.ids = append(h.ids, id)
			h.ns[id] = ns
			h.nextID++
		}
	case "step", "abort":
		h.runStep(c, &r, engineOps[c.Op] == "abort")
	case "spec":
		h.runSpecStep(c, &r)
	case "truncate":
		id := h.pick(c.A)
		n := len(h.m.Tokens(id)) - int(c.B)%(2*ps+1)
		if h.sameClass(fmt.Sprintf("truncate %d to %d", id, n), h.m.Truncate(id, n), h.ref.Truncate(uint64(id), n)) {
			h.seen["truncate"]++
		}
	case "fork":
		parent, child := h.pick(c.A), h.nextID
		if c.B%4 == 3 && len(h.ids) > 0 {
			child = h.pick(c.C)
		}
		if h.sameClass(fmt.Sprintf("fork %d -> %d", parent, child), h.m.Fork(parent, child), h.ref.Fork(uint64(parent), uint64(child))) {
			h.ids = append(h.ids, child)
			h.ns[child] = h.ns[parent]
			h.nextID++
			h.seen["fork"]++
		}
	case "extend":
		id := h.pick(c.A)
		toks := make([]int32, 1+int(c.B)%ps)
		for i := range toks {
			toks[i] = int32(r.intn(3))
		}
		h.sameClass(fmt.Sprintf("extend %d", id), h.m.Extend(id, toks...), h.ref.Extend(uint64(id), toks))
	case "release":
		id := h.pick(c.A)
		if h.sameClass(fmt.Sprintf("release %d", id), h.m.Release(id), h.ref.Release(uint64(id))) {
			h.ids = slices.DeleteFunc(h.ids, func(x pagedkv.RequestID) bool { return x == id })
		}
	case "preempt":
		id := h.pick(c.A)
		if h.sameClass(fmt.Sprintf("preempt %d", id), h.m.Preempt(id), h.ref.Preempt(uint64(id))) {
			h.seen["preempt"]++
		}
	case "resume":
		id := h.pick(c.A)
		got, err := h.m.Resume(id)
		want, merr := h.ref.Resume(uint64(id))
		if h.sameClass(fmt.Sprintf("resume %d", id), err, merr) {
			if got != want {
				h.fatalf("resume %d: %d tokens matched, model %d", id, got, want)
			}
			h.seen["resume"]++
		}
	case "evict":
		n := 1 + int(c.A)%8
		if got, want := h.m.Evict(n), h.ref.Evict(n); got != want {
			h.fatalf("evict %d: %d pages freed, model %d", n, got, want)
		}
	case "pin":
		ns := int(c.A>>2) % 2
		toks := h.bases[int(c.A)%3][:1+int(c.B)%(4*ps)]
		id, n, err := h.m.Pin(engineNamespaces[ns], toks)
		mid, mn, merr := h.ref.Pin(nsName(ns), toks)
		if h.sameClass("pin", err, merr) {
			if n != mn {
				h.fatalf("pin: %d tokens, model %d", n, mn)
			}
			h.pins = append(h.pins, [2]uint64{uint64(id), mid})
			h.seen["pin"]++
		}
	case "unpin":
		pin := [2]uint64{1 << 50, 1 << 50}
		i := -1
		if len(h.pins) > 0 && c.A != 255 {
			i = int(c.A) % len(h.pins)
			pin = h.pins[i]
		}
		if h.sameClass("unpin", h.m.Unpin(pagedkv.PinID(pin[0])), h.ref.Unpin(pin[1])) && i >= 0 {
			h.pins = slices.Delete(h.pins, i, i+1)
		}
	}
}

// runStep runs one engine step: Reserve on both, then (if it succeeded)
// the copies, the checks of the plan, the append, and Commit or Abort on
// both.
func (h *engineHarness) runStep(c Cmd, r *chooser, abort bool) {
	ps := h.g.PageSize
	n := 1 + int(c.C)%4
	ids := make([]pagedkv.RequestID, 0, n)
	counts := make([]int32, 0, n)
	for i := range n {
		id := h.pick(c.A + uint8(i))
		if slices.Contains(ids, id) && r.intn(8) != 0 {
			continue // repeats only sometimes (they must fail)
		}
		k := int(c.B) % (2*ps + 1)
		if h.m.Running(id) {
			k = min(k, len(h.m.Tokens(id))-h.m.Computed(id))
		}
		ids, counts = append(ids, id), append(counts, int32(k))
	}
	mids := make([]uint64, len(ids))
	for i, id := range ids {
		mids[i] = uint64(id)
	}
	plan, err := h.m.Reserve(ids, counts)
	mcopies, merr := h.ref.Reserve(mids, counts)
	if !h.sameClass(fmt.Sprintf("reserve %v %v", ids, counts), err, merr) {
		return
	}
	if len(plan.Copies) != mcopies {
		h.fatalf("reserve %v %v: %d copies, model %d", ids, counts, len(plan.Copies), mcopies)
	}
	if !slices.Equal(plan.Requests, ids) {
		h.fatalf("plan lists requests %v, reserved %v", plan.Requests, ids)
	}
	for _, op := range plan.Copies {
		h.copyEntries(op)
		h.seen["copy-on-write"]++
	}
	h.checkPlan(plan)
	h.appendRows(plan)

	if abort {
		if !h.sameClass("abort", h.m.Abort(), h.ref.Abort()) {
			h.fatalf("abort of a reserved step failed")
		}
		h.seen["abort"]++
		return
	}
	// A request samples a token when its step reached the end of its known
	// tokens (c&0x80: commit nothing sampled).
	var sampled []int32
	if c.C&0x80 == 0 {
		sampled = make([]int32, len(ids))
		for b, id := range ids {
			sampled[b] = pagedkv.NoToken
			if h.m.Computed(id)+int(counts[b]) == len(h.m.Tokens(id)) {
				sampled[b] = int32(r.intn(3))
			}
		}
	}
	if !h.sameClass("commit", h.m.Commit(sampled), h.ref.Commit(sampled)) {
		h.fatalf("commit of a reserved step failed")
	}
	h.seen["step"]++
}

// runSpecStep is runStep for a speculative step: requests whose chunk
// reaches the end of their known tokens get 0..3 drafts, the engine
// appends every row (drafts too), and CommitSpec keeps a random prefix of
// each request's drafts. The model's CommitSpec is the plain step of the
// accepted tokens, and verify reads every kept token's K/V back.
func (h *engineHarness) runSpecStep(c Cmd, r *chooser) {
	ps := h.g.PageSize
	n := 1 + int(c.C)%4
	ids := make([]pagedkv.RequestID, 0, n)
	counts := make([]int32, 0, n)
	var drafts [][]int32
	for i := range n {
		id := h.pick(c.A + uint8(i))
		if slices.Contains(ids, id) && r.intn(8) != 0 {
			continue
		}
		k := int(c.B) % (2*ps + 1)
		var d []int32
		if h.m.Running(id) {
			left := len(h.m.Tokens(id)) - h.m.Computed(id)
			k = min(k, left)
			if k == left {
				for range r.intn(4) {
					d = append(d, int32(r.intn(3)))
				}
			}
		}
		ids, counts, drafts = append(ids, id), append(counts, int32(k)), append(drafts, d)
	}
	mids := make([]uint64, len(ids))
	for i, id := range ids {
		mids[i] = uint64(id)
	}
	plan, err := h.m.ReserveSpec(ids, counts, drafts)
	mcopies, merr := h.ref.ReserveSpec(mids, counts, drafts)
	if !h.sameClass(fmt.Sprintf("reserve spec %v %v %v", ids, counts, drafts), err, merr) {
		return
	}
	if len(plan.Copies) != mcopies {
		h.fatalf("reserve spec %v %v %v: %d copies, model %d", ids, counts, drafts, len(plan.Copies), mcopies)
	}
	for _, op := range plan.Copies {
		h.copyEntries(op)
	}
	h.checkPlan(plan)
	h.appendRows(plan)
	if c.C&0x40 != 0 {
		if !h.sameClass("abort", h.m.Abort(), h.ref.Abort()) {
			h.fatalf("abort of a reserved speculative step failed")
		}
		return
	}
	accepted, sampled := make([]int32, len(ids)), make([]int32, len(ids))
	for b, id := range ids {
		accepted[b] = int32(r.intn(len(drafts[b]) + 1))
		sampled[b] = pagedkv.NoToken
		if h.m.Computed(id)+int(counts[b])+len(drafts[b]) == len(h.m.Tokens(id)) {
			sampled[b] = int32(r.intn(3))
		}
		if accepted[b] < int32(len(drafts[b])) {
			h.seen["draft rejected"]++
		}
	}
	if !h.sameClass("commit spec", h.m.CommitSpec(accepted, sampled), h.ref.CommitSpec(accepted, sampled)) {
		h.fatalf("commit of a reserved speculative step failed")
	}
	h.seen["spec step"]++
}

// checkPlan checks a step's arrays against the Manager's state, the
// first-principles CSR rules, appendkv's plan and the cascade layout.
func (h *engineHarness) checkPlan(p *pagedkv.Plan) {
	h.t.Helper()
	ps, np := h.g.PageSize, h.g.NumPages
	if err := pagetable.ValidateCSR(p.KVIndptr, p.KVPageIndices, p.KVLastPageLen, ps, np); err != nil {
		h.fatalf("plan fails ValidateCSR: %v", err)
	}
	if err := reference.CheckCSRSlow(p.KVIndptr, p.KVPageIndices, p.KVLastPageLen, ps, np); err != nil {
		h.fatalf("plan fails CheckCSRSlow: %v", err)
	}
	if slow := reference.SeqLensSlow(p.KVIndptr, p.KVLastPageLen, ps); !slices.Equal(slow, p.SeqLens) {
		h.fatalf("plan seq_lens %v, from kv_indptr and kv_last_page_len %v", p.SeqLens, slow)
	}
	require.NoError(h.t, h.ap.Build(p.QOIndptr, p.SeqLens))
	bi, pos := reference.BatchIndicesPositionsSlow(p.QOIndptr, p.SeqLens)
	if !slices.Equal(h.ap.BatchIndices, p.BatchIndices) || !slices.Equal(h.ap.Positions, p.Positions) ||
		!slices.Equal(bi, p.BatchIndices) || !slices.Equal(pos, p.Positions) {
		h.fatalf("plan batch_indices %v positions %v; appendkv %v %v; slow %v %v",
			p.BatchIndices, p.Positions, h.ap.BatchIndices, h.ap.Positions, bi, pos)
	}
	for b, id := range p.Requests {
		pages, start := h.m.Pages(id)
		if got := p.KVPageIndices[p.KVIndptr[b]:p.KVIndptr[b+1]]; !slices.Equal(got, asInt32(pages)) {
			h.fatalf("plan pages of request %d (batch %d) are %v, it holds %v", id, b, got, pages)
		}
		toks := h.m.Tokens(id)
		for i := p.QOIndptr[b]; i < p.QOIndptr[b+1]; i++ {
			if p.TokenPositions[i] != p.Positions[i]+int32(start) || p.TokenIDs[i] != toks[p.TokenPositions[i]] {
				h.fatalf("row %d of request %d: position %d, token position %d, token %d; start %d, tokens %v",
					i, id, p.Positions[i], p.TokenPositions[i], p.TokenIDs[i], start, toks)
			}
		}
	}
	if p.Cascade != nil {
		h.checkCascade(p)
	}
}

func asInt32(pages []pagedkv.PageID) []int32 {
	out := make([]int32, len(pages))
	for i, p := range pages {
		out[i] = int32(p)
	}
	return out
}

// checkCascade requires every request with query rows to see, across the
// cascade's levels, the same pages in the same order and the same number of
// tokens as in the flat table.
func (h *engineHarness) checkCascade(p *pagedkv.Plan) {
	h.t.Helper()
	ps := h.g.PageSize
	l := p.Cascade
	h.seen["cascade"]++
	for k, b := range l.RequestOrder {
		lo, hi := l.RequestQOIndptr[k], l.RequestQOIndptr[k+1]
		if lo == hi {
			continue // no query rows: no group to find it by
		}
		var pages []int32
		tokens := 0
		for li, lv := range l.Levels {
			g, _ := slices.BinarySearch(lv.QOIndptr, lo+1)
			g-- // the group whose rows [QOIndptr[g], QOIndptr[g+1]) contain lo
			if g < 0 || g+1 >= len(lv.QOIndptr) || lv.QOIndptr[g] > lo || lv.QOIndptr[g+1] < hi {
				h.fatalf("cascade level %d has no group holding rows [%d, %d) of batch request %d (qo_indptr %v)", li, lo, hi, b, lv.QOIndptr)
			}
			seg := lv.KVPageIndices[lv.KVIndptr[g]:lv.KVIndptr[g+1]]
			pages = append(pages, seg...)
			if len(seg) > 0 {
				tokens += (len(seg)-1)*ps + int(lv.KVLastPageLen[g])
			}
		}
		flat := p.KVPageIndices[p.KVIndptr[b]:p.KVIndptr[b+1]]
		if !slices.Equal(pages, flat) || tokens != int(p.SeqLens[b]) {
			h.fatalf("cascade gives batch request %d pages %v (%d tokens), the flat table %v (%d tokens)", b, pages, tokens, flat, p.SeqLens[b])
		}
	}
}

// kvRows returns the K and V rows of every token of tokens in namespace ns:
// row t is a function of ns and tokens[0..t] (a rolling hash expanded into
// H*D elements of the cache dtype).
func (h *engineHarness) kvRows(ns int, tokens []int32) []tokenRow {
	n := h.g.NumKVHeads * h.g.HeadDim * h.g.DType.Size()
	out := make([]tokenRow, len(tokens))
	x := uint64(ns+1) * 0x9e3779b97f4a7c15
	for t, tok := range tokens {
		x = (x ^ uint64(tok+7)) * 0xbf58476d1ce4e5b9
		x ^= x >> 29
		r := chooser{x: x}
		row := make([]byte, 2*n)
		for i := range row {
			row[i] = byte(r.next())
		}
		out[t] = tokenRow{k: row[:n], v: row[n:]}
	}
	return out
}

// appendRows writes the plan's rows (their K/V by kvRows) through appendkv
// on the backend, and requires the cache to change exactly as the
// reference append changes a copy of it.
func (h *engineHarness) appendRows(p *pagedkv.Plan) {
	h.t.Helper()
	nnz := len(p.BatchIndices)
	H, D := h.g.NumKVHeads, h.g.HeadDim
	key, val := kernels.NewTensor(h.g.DType, nnz, H, D), kernels.NewTensor(h.g.DType, nnz, H, D)
	rowBytes := H * D * h.g.DType.Size()
	for b, id := range p.Requests {
		lo, hi := p.QOIndptr[b], p.QOIndptr[b+1]
		if lo == hi {
			continue
		}
		rows := h.kvRows(h.ns[id], h.m.Tokens(id)[:p.TokenPositions[hi-1]+1])
		for i := lo; i < hi; i++ {
			row := rows[p.TokenPositions[i]]
			copy(key.Data[int(i)*rowBytes:], row.k)
			copy(val.Data[int(i)*rowBytes:], row.v)
		}
	}
	want := kernels.PagedKVCache{Geometry: h.g, Data: slices.Clone(h.cache.Data), K: slices.Clone(h.cache.K), V: slices.Clone(h.cache.V)}
	reference.Append(h.view(&want), reference.AppendInput{
		Key: key.Data, Value: val.Data, SrcDType: h.g.DType,
		BatchIndices: p.BatchIndices, Positions: p.Positions, KVIndptr: p.KVIndptr, KVPageIndices: p.KVPageIndices,
	})
	table := kernels.PageTable{KVIndptr: p.KVIndptr, KVPageIndices: p.KVPageIndices, KVLastPageLen: p.KVLastPageLen}
	if err := h.ap.Run(h.backend, appendkv.Input{AppendKey: key, AppendValue: val, Cache: &h.cache, Table: &table}); err != nil {
		h.fatalf("append: %v", err)
	}
	for i, pair := range [][2][]byte{{h.cache.Data, want.Data}, {h.cache.K, want.K}, {h.cache.V, want.V}} {
		if !bytes.Equal(pair[0], pair[1]) {
			k := 0
			for pair[0][k] == pair[1][k] {
				k++
			}
			h.fatalf("append changed byte %d of buffer %s to %#x, the reference append to %#x", k, []string{"Data", "K", "V"}[i], pair[0][k], pair[1][k])
		}
	}
}

func (h *engineHarness) view(c *kernels.PagedKVCache) reference.PagedKV {
	return reference.PagedKV{
		Layout: h.g.Layout, Form: h.g.Form, DType: h.g.DType, NumPages: h.g.NumPages,
		PageSize: h.g.PageSize, NumKVHeads: h.g.NumKVHeads, HeadDim: h.g.HeadDim,
		Data: c.Data, K: c.K, V: c.V,
	}
}

// copyEntries performs a copy-on-write copy: entries [0, Entries) of Src to
// Dst, every head, K and V.
func (h *engineHarness) copyEntries(op pagedkv.CopyOp) {
	v, es := h.view(&h.cache), int64(h.g.DType.Size())
	for kv := range 2 {
		for e := range int(op.Entries) {
			for hd := range h.g.NumKVHeads {
				for d := range h.g.HeadDim {
					sb, si := v.Locate(reference.Slot{KV: kv, Page: int(op.Src), Entry: e, Head: hd, Feat: d})
					db, di := v.Locate(reference.Slot{KV: kv, Page: int(op.Dst), Entry: e, Head: hd, Feat: d})
					copy(db[di*es:(di+1)*es], sb[si*es:(si+1)*es])
				}
			}
		}
	}
}

// verify checks, after every command, Audit, the agreement with the model,
// and every running request's K/V read back through its pages.
func (h *engineHarness) verify() {
	h.t.Helper()
	if err := h.m.Audit(); err != nil {
		h.fatalf("audit: %v", err)
	}
	s, ms := h.m.Stats(), h.ref.Stats()
	if s.FreePages != ms.FreePages || s.UsedPages != ms.UsedPages || s.EvictablePages != ms.EvictablePages ||
		s.PinnedIdlePages != ms.PinnedIdlePages || s.CachedPages != ms.CachedPages || s.Requests != ms.Requests {
		h.fatalf("stats %+v\nmodel %+v", s, ms)
	}
	ps := h.g.PageSize
	v := h.view(&h.cache)
	for _, id := range h.ids {
		mr := h.ref.Request(uint64(id))
		toks, computed := h.m.Tokens(id), h.m.Computed(id)
		pages, start := h.m.Pages(id)
		switch {
		case mr == nil:
			h.fatalf("request %d is not in the model", id)
		case h.m.Running(id) != mr.Running || computed != mr.Computed || !slices.Equal(toks, mr.Tokens):
			h.fatalf("request %d: running %v computed %d tokens %v; model %v %d %v", id, h.m.Running(id), computed, toks, mr.Running, mr.Computed, mr.Tokens)
		case mr.Running && (start != mr.Start || len(pages) != len(mr.Pages)):
			h.fatalf("request %d: start %d, %d pages; model %d, %d", id, start, len(pages), mr.Start, len(mr.Pages))
		}
		if !mr.Running {
			continue
		}
		held := computed - start
		if want := (held + ps - 1) / ps; len(pages) != want {
			h.fatalf("request %d holds %d pages for tokens [%d, %d), want %d", id, len(pages), start, computed, want)
		}
		indptr, indices := []int32{0, int32(len(pages))}, asInt32(pages)
		got := reference.GatherBytes(v, indptr, indices, 0, held)
		want := h.kvRows(h.ns[id], toks[:computed])[start:]
		for t := range got {
			if !bytes.Equal(got[t].K, want[t].k) || !bytes.Equal(got[t].V, want[t].v) {
				h.fatalf("request %d token %d (page %d entry %d) reads K %x V %x, want K %x V %x (tokens %v)",
					id, start+t, pages[t/ps], t%ps, got[t].K, got[t].V, want[t].k, want[t].v, toks[:start+t+1])
			}
		}
		h.seen["tokens read back"] += held
	}
}

// TestEngineRandom runs random programs through FuzzEngine's harness and
// insists that they reach the cases it exists for.
func TestEngineRandom(t *testing.T) {
	programs := 500
	if testing.Short() {
		programs = 100
	}
	weighted := []string{"add", "add", "add", "step", "step", "step", "step", "step", "step", "abort",
		"fork", "fork", "extend", "release", "preempt", "resume", "resume", "evict", "pin", "unpin"}
	backend := cpu.New(cpu.Config{Workers: 2})
	seen := map[string]int{}
	r := chooser{x: 44}
	for range programs {
		g := engineGeom{uint8(r.next()), uint8(r.intn(5)), uint8(r.intn(20)), uint8(r.next())}
		var prog []byte
		for range maxCmds {
			prog = append(prog, engineOps.Prog(weighted[r.intn(len(weighted))], r.intn(256), r.intn(256), r.intn(256))...)
		}
		h := newEngineHarness(t, backend, g)
		h.prog = Decode(nil, prog, len(engineOps))
		h.runProgram()
		for k, v := range h.seen {
			seen[k] += v
		}
	}
	t.Logf("events: %v", seen)
	for _, event := range []string{"step", "prefix hit", "copy-on-write", "out of pages", "other error", "fork",
		"preempt", "resume", "abort", "pin", "cascade", "tokens read back"} {
		require.Greater(t, seen[event], 10, "too few %q events for the test to mean much", event)
	}
}
