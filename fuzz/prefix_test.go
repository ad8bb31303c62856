package fuzz

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/pagetable"
	"github.com/pagedkv/pagedkv/prefixcache"
)

// prefixOps are the commands of FuzzPrefixSharing. Arguments:
//
//	admit    a%3: base prompt, a>>2%2: namespace, b: prompt length
//	         (1..4*pageSize), c%4 == 0: one token changed at c>>2
//	decode   a: first member of a batch of 1+c%3, b: tokens each (0..2*pageSize)
//	fork     a: parent (255: unknown)
//	publish  a: request, b: priority
//	release  a: request
//	truncate a: request, b: new length in [Start, Len]
//	window   a: request, b: window tokens in 0..2*pageSize
//	evict    a: pages wanted, 1..8
//	pin      a: request whose tokens to pin, b%4 == 0: a base prompt instead
//	unpin    a: pin (255: unknown)
//	match    a: request, b&1: look it up in the other namespace
var prefixOps = OpSet{"admit", "decode", "fork", "publish", "release", "truncate", "window", "evict", "pin", "unpin", "match"}

// prefixGeom is the header of a FuzzPrefixSharing input.
type prefixGeom struct {
	PageSize, NumPagesArg uint8 // 1+%8, 1+%32
	// Flags: bits 0-1 priorities-1 (1..3, 0 read as 1), bits 2-4 the
	// pinned-page cap (0: none), bit 5 a hash that always collides.
	Flags uint8
}

// FuzzPrefixSharing runs requests over one page pool shared by a
// pagetable.Table and a prefixcache.Cache, as an engine does: admission on
// cached prefixes (Match, AddShared), batched decode with copy-on-write (the
// harness performs the copies), fork, publish of filled pages, release,
// truncate, sliding-window release, eviction under pressure (and on
// ErrOutOfPages, then a retry), pins. A page's contents are modelled as the
// tokens written into its entries. After every command it checks:
//
//   - allocator, table and cache CheckInvariants;
//   - every page's reference count equals its holders in the table plus one
//     if the cache holds it, and the cache's idle pages are exactly the
//     cached pages with count 1;
//   - a cached page's contents never change after it is published, a hit
//     serves pages whose contents equal the prompt's tokens, and a hit in
//     one namespace never serves a page published in another;
//   - every write lands in a page with count 1 (never a cached page), and
//     every request reads its own tokens back through its pages.
func FuzzPrefixSharing(f *testing.F) {
	ops := prefixOps
	for _, s := range []struct {
		g    prefixGeom
		prog []byte
	}{
		{prefixGeom{3, 15, 1}, nil},
		// Two requests share a published prefix; the second's hit is checked.
		{prefixGeom{3, 15, 1}, ops.Prog("admit", 0, 11, 1, "publish", 0, 0, 0, "admit", 0, 13, 1, "match", 1, 0, 0, "decode", 0, 3, 1)},
		// Page size 1; fork and decode both branches (no partial pages).
		{prefixGeom{0, 11, 2}, ops.Prog("admit", 1, 3, 1, "fork", 0, 0, 0, "decode", 0, 2, 1, "publish", 1, 0, 0, "release", 0, 0, 0, "evict", 3, 0, 0)},
		// Full pool: admissions run out of pages and evict idle cached pages.
		{prefixGeom{1, 5, 0}, ops.Prog("admit", 0, 7, 1, "publish", 0, 0, 0, "release", 0, 0, 0, "admit", 1, 7, 1, "admit", 2, 7, 1, "evict", 7, 0, 0)},
		// Window 0 releases published pages while the request runs on.
		{prefixGeom{2, 20, 1}, ops.Prog("admit", 0, 10, 1, "publish", 0, 1, 0, "window", 0, 0, 0, "decode", 0, 4, 0, "publish", 0, 0, 0, "evict", 2, 0, 0)},
		// Truncate into a published page, then decode: copy-on-write.
		{prefixGeom{3, 15, 0x0d}, ops.Prog("admit", 0, 12, 1, "publish", 0, 0, 0, "truncate", 0, 6, 0, "decode", 0, 3, 0, "pin", 0, 0, 0, "evict", 8, 0, 0, "unpin", 0, 0, 0, "evict", 8, 0, 0)},
		// Colliding hash, two namespaces.
		{prefixGeom{1, 25, 0x21}, ops.Prog("admit", 0, 8, 1, "publish", 0, 0, 0, "admit", 4, 8, 1, "publish", 1, 0, 0, "match", 0, 1, 0, "match", 1, 1, 0)},
	} {
		f.Add(s.g.PageSize, s.g.NumPagesArg, s.g.Flags, s.prog)
	}
	f.Fuzz(func(t *testing.T, pageSize, numPages, flags uint8, prog []byte) {
		h := newPrefixHarness(t, prefixGeom{pageSize, numPages, flags})
		h.prog = Decode(nil, prog, len(prefixOps))
		if len(h.prog) > maxCmds {
			h.prog = h.prog[:maxCmds]
		}
		h.runProgram()
	})
}

// preq is the harness's record of one request.
type preq struct {
	tokens []int32 // tokens [0, Len); those before Start are off the pages
	ns     int
	// chain[k] is the cache handle of page k of the request's prefix, for
	// pages published (or matched) so far; page k's parent is chain[k-1].
	chain  []prefixcache.Handle
	broken bool // the chain hit a stale handle or a released page: no more publishing
}

type prefixHarness struct {
	t     *testing.T
	ps    int
	alloc *allocator.Allocator
	tab   *pagetable.Table
	pc    *prefixcache.Cache
	keys  [2]prefixcache.Key
	bases [3][]int32

	// content[p][e] is the token in entry e of page p, -1 when unknown
	// (free pages are poisoned).
	content [][]int32
	// published[p] is what page p held when published, while it is cached,
	// and publishedNS[p] the namespace of the request that published it.
	published   map[allocator.PageID][]int32
	publishedNS map[allocator.PageID]int

	reqs   map[pagetable.SeqID]*preq
	live   []pagetable.SeqID
	nextID pagetable.SeqID
	pins   []prefixcache.PinID
	copies []pagetable.CopyOp

	prog []Cmd
	step int
	seen map[string]int
}

func newPrefixHarness(t *testing.T, g prefixGeom) *prefixHarness {
	ps, np := 1+int(g.PageSize)%8, 1+int(g.NumPagesArg)%32
	h := &prefixHarness{
		t: t, ps: ps, content: make([][]int32, np),
		published: map[allocator.PageID][]int32{}, publishedNS: map[allocator.PageID]int{},
		reqs: map[pagetable.SeqID]*preq{}, nextID: 1, seen: map[string]int{},
	}
	var err error
	h.alloc, err = allocator.New(allocator.Config{NumPages: np})
	require.NoError(t, err)
	h.tab, err = pagetable.New(pagetable.Config{PageSize: ps, Allocator: h.alloc})
	require.NoError(t, err)
	cfg := prefixcache.Config{NumPages: np, PageSize: ps, Refs: h.alloc, Seed: 7,
		Priorities: max(int(g.Flags&3), 1), MaxPinnedPages: int(g.Flags >> 2 & 7)}
	if g.Flags&0x20 != 0 {
		cfg.Hash = func(uint64, []int32) uint64 { return 1 }
	}
	h.pc, err = prefixcache.New(cfg)
	require.NoError(t, err)
	h.keys = [2]prefixcache.Key{h.pc.Key(prefixcache.Namespace{}), h.pc.Key(prefixcache.Namespace{Tenant: "b"})}
	for p := range h.content {
		h.content[p] = slices.Repeat([]int32{-1}, ps)
	}
	// Base prompts over a two-token alphabet, so that different prompts
	// share leading pages often; base 2 is base 0 with its second page
	// changed.
	r := chooser{x: uint64(g.PageSize)<<8 | uint64(g.NumPagesArg)}
	for b := range h.bases {
		h.bases[b] = make([]int32, 4*ps)
		for i := range h.bases[b] {
			h.bases[b][i] = int32(r.intn(2))
		}
	}
	copy(h.bases[2], h.bases[0][:ps])
	return h
}

func (h *prefixHarness) runProgram() {
	h.verify()
	for h.step = range h.prog {
		h.run(h.prog[h.step])
		h.verify()
	}
}

func (h *prefixHarness) fatalf(format string, args ...any) {
	h.t.Helper()
	h.t.Fatalf("%s\npage size %d, %d pages; command %d of:\n%s", fmt.Sprintf(format, args...),
		h.ps, len(h.content), h.step, prefixOps.Format(h.prog))
}

func (h *prefixHarness) noErr(what string, err error) {
	h.t.Helper()
	if err != nil {
		h.fatalf("%s: %v", what, err)
	}
}

func (h *prefixHarness) pick(a uint8) pagetable.SeqID {
	return pickLive(h.live, a)
}

// recheckDeepestFirst tells the cache that pages (in token order) lost a
// holder, later pages first so that they become evictable before earlier
// ones.
func (h *prefixHarness) recheckDeepestFirst(pages []allocator.PageID) {
	r := slices.Clone(pages)
	slices.Reverse(r)
	h.pc.Recheck(r...)
}

func (h *prefixHarness) run(c Cmd) {
	r := newChooser(c, h.step)
	switch prefixOps[c.Op] {
	case "admit":
		h.admit(c)
	case "decode":
		n := 1 + int(c.C)%3
		var ids []pagetable.SeqID
		var toks [][]int32
		for i := range n {
			id := h.pick(c.A + uint8(i))
			if _, ok := h.reqs[id]; !ok || slices.Contains(ids, id) {
				continue
			}
			t := make([]int32, int(c.B)%(2*h.ps+1))
			for k := range t {
				t[k] = int32(r.intn(2))
			}
			ids, toks = append(ids, id), append(toks, t)
		}
		h.extend(ids, toks)
	case "fork":
		parent, child := h.pick(c.A), h.nextID
		err := h.tab.Fork(parent, child)
		p, ok := h.reqs[parent]
		if !ok {
			if !errors.Is(err, pagetable.ErrUnknownSeq) {
				h.fatalf("fork of unknown %d: %v", parent, err)
			}
			return
		}
		h.noErr("fork", err)
		h.reqs[child] = &preq{tokens: slices.Clone(p.tokens), ns: p.ns, chain: slices.Clone(p.chain), broken: p.broken}
		h.live = append(h.live, child)
		h.nextID++
		h.seen["fork"]++
	case "publish":
		h.publish(h.pick(c.A), prefixcache.Priority(int(c.B)%h.pc.NumPriorities()))
	case "release":
		id := h.pick(c.A)
		if _, ok := h.reqs[id]; !ok {
			return
		}
		pages := slices.Clone(h.tab.Pages(id))
		h.noErr("release", h.tab.Release(id))
		h.recheckDeepestFirst(pages)
		delete(h.reqs, id)
		h.live = slices.DeleteFunc(h.live, func(x pagetable.SeqID) bool { return x == id })
	case "truncate":
		id := h.pick(c.A)
		q, ok := h.reqs[id]
		if !ok {
			return
		}
		start := h.tab.Start(id)
		n := start + int(c.B)%(len(q.tokens)-start+1)
		pages := slices.Clone(h.tab.Pages(id))
		h.noErr("truncate", h.tab.Truncate(id, n))
		h.recheckDeepestFirst(pages[len(h.tab.Pages(id)):])
		q.tokens = q.tokens[:n]
		q.chain = q.chain[:min(len(q.chain), n/h.ps)]
		h.seen["truncate"]++
	case "window":
		id := h.pick(c.A)
		if _, ok := h.reqs[id]; !ok {
			return
		}
		pages := slices.Clone(h.tab.Pages(id))
		k, err := h.tab.ReleaseWindow(id, int(c.B)%(2*h.ps+1))
		h.noErr("window", err)
		h.recheckDeepestFirst(pages[:k])
		if k > 0 {
			h.seen["window pages released"]++
		}
	case "evict":
		h.evict(1 + int(c.A)%8)
	case "pin":
		var key prefixcache.Key
		var toks []int32
		if q, ok := h.reqs[h.pick(c.A)]; ok && c.B%4 != 0 {
			key, toks = h.keys[q.ns], q.tokens
		} else {
			key, toks = h.keys[0], h.bases[int(c.A)%3]
		}
		matched, _ := h.pc.Match(nil, key, toks, len(toks)/h.ps)
		id, npages, err := h.pc.Pin(key, toks)
		switch {
		case len(matched) == 0:
			if !errors.Is(err, prefixcache.ErrNotCached) {
				h.fatalf("pin of an uncached prefix: %v", err)
			}
		case errors.Is(err, prefixcache.ErrPinLimit):
			h.seen["pin limit"]++
		case err != nil || npages != len(matched):
			h.fatalf("pin of %d cached pages: pinned %d, %v", len(matched), npages, err)
		default:
			h.pins = append(h.pins, id)
			h.seen["pin"]++
		}
	case "unpin":
		if len(h.pins) == 0 || c.A == 255 {
			if err := h.pc.Unpin(1 << 60); !errors.Is(err, prefixcache.ErrUnknownPin) {
				h.fatalf("unpin of an unknown pin: %v", err)
			}
			return
		}
		i := int(c.A) % len(h.pins)
		h.noErr("unpin", h.pc.Unpin(h.pins[i]))
		h.pins = slices.Delete(h.pins, i, i+1)
	case "match":
		q, ok := h.reqs[h.pick(c.A)]
		if !ok {
			return
		}
		ns := q.ns ^ int(c.B&1)
		matched, _ := h.pc.Match(nil, h.keys[ns], q.tokens, len(q.tokens)/h.ps)
		h.checkHit(matched, q.tokens, ns)
	}
}

// checkHit checks that a Match in namespace ns served pages holding exactly
// the prompt's tokens, published in ns.
func (h *prefixHarness) checkHit(matched []allocator.PageID, prompt []int32, ns int) {
	h.t.Helper()
	for k, p := range matched {
		want := prompt[k*h.ps : (k+1)*h.ps]
		switch {
		case !h.pc.Cached(p):
			h.fatalf("match served page %d (prefix page %d), which is not cached", p, k)
		case !slices.Equal(h.content[p], want):
			h.fatalf("match served page %d for prefix page %d: it holds %v, the prompt has %v", p, k, h.content[p], want)
		case h.publishedNS[p] != ns:
			h.fatalf("match in namespace %d served page %d, published in namespace %d", ns, p, h.publishedNS[p])
		}
	}
	if len(matched) > 0 {
		h.seen["hit"]++
	}
}

// admit starts a request on its cached prefix, then reserves and writes the
// rest of its prompt.
func (h *prefixHarness) admit(c Cmd) {
	ns := int(c.A>>2) % 2
	prompt := slices.Clone(h.bases[int(c.A)%3][:1+int(c.B)%(4*h.ps)])
	if c.C%4 == 0 {
		i := int(c.C>>2) % len(prompt)
		prompt[i] ^= 1
	}
	matched, last := h.pc.Match(nil, h.keys[ns], prompt, (len(prompt)-1)/h.ps)
	h.checkHit(matched, prompt, ns)
	id := h.nextID
	h.noErr("add shared", h.tab.AddShared(id, matched, len(matched)*h.ps))
	h.pc.Recheck(matched...)
	q := &preq{tokens: prompt[:len(matched)*h.ps], ns: ns}
	// The chain: handles of every matched page. Only the last one is
	// returned; the earlier ones are re-derived by matching shorter prefixes.
	for k := range matched {
		_, hk := h.pc.Match(nil, h.keys[ns], prompt, k+1)
		q.chain = append(q.chain, hk)
	}
	if len(matched) > 0 && q.chain[len(q.chain)-1] != last {
		h.fatalf("match of %d pages returned handle %v, re-match %v", len(matched), last, q.chain[len(q.chain)-1])
	}
	h.reqs[id] = q
	h.live = append(h.live, id)
	h.nextID++
	h.extend([]pagetable.SeqID{id}, [][]int32{slices.Clone(prompt[len(q.tokens):])})
}

// extend reserves and writes toks[i] for request ids[i], evicting and
// retrying once when the pool runs out; after a second failure the batch is
// dropped (nothing changed).
func (h *prefixHarness) extend(ids []pagetable.SeqID, toks [][]int32) {
	counts := make([]int32, len(ids))
	need := 0
	for i, t := range toks {
		counts[i] = int32(len(t))
		need += len(t)/h.ps + 2
	}
	var err error
	for try := 0; ; try++ {
		h.copies, err = h.tab.Reserve(h.copies[:0], ids, counts)
		if err == nil {
			break
		}
		if !errors.Is(err, allocator.ErrOutOfPages) {
			h.fatalf("reserve %v %v: %v", ids, counts, err)
		}
		h.seen["out of pages"]++
		if try == 1 {
			return
		}
		h.evict(need)
	}
	for _, op := range h.copies {
		switch {
		case h.alloc.RefCount(op.Dst) != 1 || h.pc.Cached(op.Dst):
			h.fatalf("copy %+v into page %d with refcount %d (cached %v)", op, op.Dst, h.alloc.RefCount(op.Dst), h.pc.Cached(op.Dst))
		case h.alloc.RefCount(op.Src) < 1:
			h.fatalf("copy %+v from free page %d", op, op.Src)
		}
		copy(h.content[op.Dst], h.content[op.Src][:op.Entries])
		h.seen["copy-on-write"]++
	}
	for _, op := range h.copies {
		h.pc.Recheck(op.Src) // lost the copier as a holder
	}
	for i, id := range ids {
		q := h.reqs[id]
		start, pages := h.tab.Start(id), h.tab.Pages(id)
		for _, tok := range toks[i] {
			held := len(q.tokens) - start
			p := pages[held/h.ps]
			if rc := h.alloc.RefCount(p); rc != 1 || h.pc.Cached(p) {
				h.fatalf("request %d writes token %d into page %d with refcount %d (cached %v)", id, len(q.tokens), p, rc, h.pc.Cached(p))
			}
			h.content[p][held%h.ps] = tok
			q.tokens = append(q.tokens, tok)
		}
	}
}

// publish offers the request's filled pages past its chain to the cache.
func (h *prefixHarness) publish(id pagetable.SeqID, prio prefixcache.Priority) {
	q, ok := h.reqs[id]
	if !ok || q.broken {
		return
	}
	start, pages := h.tab.Start(id), h.tab.Pages(id)
	for k := len(q.chain); (k+1)*h.ps <= len(q.tokens); k++ {
		if k*h.ps < start {
			q.broken = true // the page left with the window before it was published
			return
		}
		p := pages[k-start/h.ps]
		toks := q.tokens[k*h.ps : (k+1)*h.ps]
		if !slices.Equal(h.content[p], toks) {
			h.fatalf("request %d page %d (prefix page %d) holds %v, want %v", id, p, k, h.content[p], toks)
		}
		var parent prefixcache.Handle
		if k > 0 {
			parent = q.chain[k-1]
		}
		wasCached := h.pc.Cached(p)
		hd, added, err := h.pc.Publish(parent, h.keys[q.ns], p, toks, prio)
		switch {
		case errors.Is(err, prefixcache.ErrStaleHandle) && !parent.IsRoot():
			q.broken = true
			h.seen["stale handle"]++
			return
		case err != nil:
			h.fatalf("publish page %d of request %d: %v", p, id, err)
		case added:
			if wasCached {
				h.fatalf("publish added page %d, which was cached already", p)
			}
			h.published[p] = slices.Clone(toks)
			h.publishedNS[p] = q.ns
			h.seen["published"]++
		default:
			h.seen["duplicate"]++
		}
		q.chain = append(q.chain, hd)
	}
}

// evict asks the cache for n pages and checks what came back.
func (h *prefixHarness) evict(n int) {
	free := h.alloc.NumFree()
	idle, _ := h.pc.Idle()
	freed := h.pc.Evict(n)
	switch {
	case h.alloc.NumFree() != free+freed:
		h.fatalf("evict(%d) reports %d pages freed, the pool has %d more free", n, freed, h.alloc.NumFree()-free)
	case idle > 0 && freed == 0:
		h.fatalf("evict(%d) freed nothing with %d idle pages", n, idle)
	}
	if after, _ := h.pc.Idle(); freed < n && after > 0 {
		h.fatalf("evict(%d) stopped at %d freed with %d idle pages left", n, freed, after)
	}
	if freed > 0 {
		h.seen["evicted"]++
	}
}

// verify checks the cross-package invariants (see FuzzPrefixSharing).
func (h *prefixHarness) verify() {
	h.t.Helper()
	for name, check := range map[string]func() error{
		"allocator": h.alloc.CheckInvariants, "page table": h.tab.CheckInvariants, "prefix cache": h.pc.CheckInvariants,
	} {
		if err := check(); err != nil {
			h.fatalf("%s: %v", name, err)
		}
	}
	holders := make([]int32, len(h.content))
	for _, id := range h.live {
		q := h.reqs[id]
		start, pages := h.tab.Start(id), h.tab.Pages(id)
		if h.tab.Len(id) != len(q.tokens) {
			h.fatalf("request %d has Len %d, want %d", id, h.tab.Len(id), len(q.tokens))
		}
		for t := start; t < len(q.tokens); t++ {
			p := pages[(t-start)/h.ps]
			if got := h.content[p][(t-start)%h.ps]; got != q.tokens[t] {
				h.fatalf("request %d token %d reads %d from page %d entry %d, want %d", id, t, got, p, (t-start)%h.ps, q.tokens[t])
			}
		}
		for _, p := range pages {
			holders[p]++
		}
	}
	cached, idle := 0, 0
	for p := range allocator.PageID(len(h.content)) {
		rc := h.alloc.RefCount(p)
		want := holders[p]
		if h.pc.Cached(p) {
			want++
			cached++
			if rc == 1 {
				idle++
			}
			if !slices.Equal(h.content[p], h.published[p]) {
				h.fatalf("cached page %d holds %v, published as %v", p, h.content[p], h.published[p])
			}
		} else {
			delete(h.published, p)
			delete(h.publishedNS, p)
		}
		if rc != want {
			h.fatalf("page %d has refcount %d, want %d (%d in the table, cached %v)", p, rc, want, holders[p], h.pc.Cached(p))
		}
		if rc == 0 {
			for e := range h.content[p] {
				h.content[p][e] = -1 // a free page's contents are garbage
			}
		}
	}
	evictable, idlePinned := h.pc.Idle()
	if h.pc.Len() != cached || evictable+idlePinned != idle {
		h.fatalf("cache reports %d cached, %d+%d idle; pool has %d cached pages, %d with refcount 1", h.pc.Len(), evictable, idlePinned, cached, idle)
	}
}

// TestPrefixSharingRandom runs random programs through the harness of
// FuzzPrefixSharing and insists that they reach the cases it exists for.
func TestPrefixSharingRandom(t *testing.T) {
	const programs = 1000 // 0.2 s; -short would lose the rarer cases (stale handles: 23 here)
	weighted := []string{"admit", "admit", "admit", "decode", "decode", "decode", "fork", "publish", "publish", "publish",
		"release", "release", "truncate", "window", "evict", "pin", "unpin", "match"}
	seen := map[string]int{}
	r := chooser{x: 43}
	for range programs {
		g := prefixGeom{uint8(r.intn(6)), uint8(r.intn(24)), uint8(r.next())}
		var prog []byte
		for range maxCmds {
			prog = append(prog, prefixOps.Prog(weighted[r.intn(len(weighted))], r.intn(256), r.intn(256), r.intn(256))...)
		}
		h := newPrefixHarness(t, g)
		h.prog = Decode(nil, prog, len(prefixOps))
		h.runProgram()
		for k, v := range h.seen {
			seen[k] += v
		}
	}
	t.Logf("events: %v", seen)
	for _, event := range []string{"hit", "published", "duplicate", "copy-on-write", "out of pages", "evicted",
		"window pages released", "fork", "truncate", "pin", "stale handle"} {
		require.Greater(t, seen[event], 10, "too few %q events for the test to mean much", event)
	}
}
