package prefixcache

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/evict"
)

// This file checks the cache against a slow model under random operation
// sequences (TestCacheMatchesModel) and under the fuzzer (FuzzCache).
//
// The model keeps prefixes as strings in a map, reference counts in another,
// and finds each eviction victim by scanning every node: under LRU for the
// smallest (priority, time it joined its list); under SLRU and SRRIP by the
// policies' textbook rules (victim), with SRRIP's aging done literally, one
// increment of every evictable page's prediction at a time; under ARC with
// its ghost history as a plain slice scanned from newest to oldest. It
// shares no code with the cache but Namespace.encode, whose injectivity
// has its own test, and the page hash (ARC's ghosts are keyed by it, so the
// model computes it with the cache's HashFunc). Both run on the same
// allocator, so the model learns page IDs from the cache's publishes and the
// two states are compared as dumps after every operation.

// mnode is one cached prefix in the model.
type mnode struct {
	path    string // namespace + every token of the prefix
	parent  *mnode
	page    PageID
	tokens  []int32
	ns      string
	prio    int
	pins    int
	idle    bool  // as of the last recheck of its page
	tick    int64 // when it joined its LRU list (valid while idle and unpinned)
	hits    int   // admissions it served (Cache.Hit)
	rrpv    int   // SRRIP's re-reference prediction, set when it became evictable
	removed bool
	hash    uint64        // the cache's chained hash of the page (ARC's ghost key)
	seq     int64         // publish order (the cache's sibling lists are newest first)
	back    bool          // ARC: published while a ghost of its hash was remembered
	lapse   time.Duration // its retention lapse (Cache.Retain), 0: none
	at      time.Duration // when it lapses, while idle with a lapse
	queue   int           // adaptive: the queue its level's policy put it on when it was listed
}

// mttl is a pin's lifetime in the model.
type mttl struct{ life, at time.Duration }

// mghost is one eviction under ARC: a ghost while live (not yet taken by a
// publish, nor replaced by a later eviction of the same hash).
type mghost struct {
	hash uint64
	main bool
	live bool
}

type model struct {
	ps        int
	nprio     int
	maxPinned int
	nodes     map[string]*mnode
	byPage    map[PageID]*mnode
	held      map[PageID]int // references held by requests (not the cache)
	tick      int64
	pins      map[PinID]*mnode
	nextPin   PinID
	evicted   int64
	policy    string
	// ARC, per level: the last numPages evictions, oldest first, and the
	// probation target.
	hashFn   HashFunc
	numPages int
	ghosts   [][]mghost
	target   []int
	seq      int64
	returns  [2]int // ghost hits from probation and from main (adaptive: all in [0])
	now      time.Duration
	budget   int            // pin budget in pages (0: none)
	ttl      map[PinID]mttl // pins with a lifetime
	// adaptive, per level: the policy itself, as the oracle of its rule
	// (its rule is checked against a slow model of its own in evict's
	// TestQueuesMatchReference); the model keeps the queues, the ages
	// and the classes.
	adaptive []evict.AgePolicy
}

func newModel(ps, nprio, maxPinned int, policy string, numPages int, hashFn HashFunc) *model {
	m := &model{ps: ps, nprio: nprio, maxPinned: maxPinned, nodes: map[string]*mnode{},
		byPage: map[PageID]*mnode{}, held: map[PageID]int{}, pins: map[PinID]*mnode{}, policy: policy,
		hashFn: hashFn, numPages: numPages, ghosts: make([][]mghost, nprio), target: make([]int, nprio), ttl: map[PinID]mttl{}}
	for i := range m.target {
		m.target[i] = numPages / 2 // ARC starts in the middle
	}
	if policy == evict.Adaptive {
		for range nprio {
			p, err := evict.New(evict.Adaptive)
			if err != nil {
				panic(err)
			}
			a := p.(evict.AgePolicy)
			a.Size(numPages)
			m.adaptive = append(m.adaptive, a)
		}
	}
	return m
}

// class is what adaptive sees of n: its hits (1 for a page that came back
// from a ghost and served none), its depth.
func (m *model) class(n *mnode) evict.Class {
	c := evict.Class{Hits: uint32(n.hits)}
	if n.hits == 0 && n.back {
		c.Hits = 1
	}
	for p := n.parent; p != nil; p = p.parent {
		c.Depth++
	}
	return c
}

// main reports whether ARC keeps n on its main queue: it served a hit or
// came back from a ghost.
func (n *mnode) main() bool { return n.hits > 0 || n.back }

// forget kills the live ghost of hash h at level prio and returns it.
func (m *model) forget(prio int, h uint64) (mghost, bool) {
	for i, e := range m.ghosts[prio] {
		if e.live && e.hash == h {
			m.ghosts[prio][i].live = false
			return e, true
		}
	}
	return mghost{}, false
}

// returned is ARC's adaptation when a page of hash h is published at prio.
func (m *model) returned(prio int, h uint64) bool {
	if m.adaptive != nil {
		back := m.adaptive[prio].Returned(h)
		if back {
			m.returns[0]++
		}
		return back
	}
	if !arcLike(m.policy) {
		return false
	}
	var nmain, nprob int
	for _, e := range m.ghosts[prio] {
		if !e.live {
			continue
		}
		if e.main {
			nmain++
		} else {
			nprob++
		}
	}
	e, ok := m.forget(prio, h)
	if !ok {
		return false
	}
	if e.main {
		m.returns[1]++
		m.target[prio] = max(0, m.target[prio]-max(1, nprob/nmain))
	} else {
		m.returns[0]++
		m.target[prio] = min(m.numPages, m.target[prio]+max(1, nmain/nprob))
	}
	return true
}

// remember records n's eviction at its level as the newest ghost, killing
// an older ghost of the same hash, and forgets the oldest eviction past
// numPages.
func (m *model) remember(n *mnode) {
	if m.adaptive != nil {
		c := m.class(n)
		if m.listed(n) { // Queues.EvictedSlot: the pushes since it became idle
			c.Age = uint32(m.tick - n.tick + 1)
		}
		m.adaptive[n.prio].EvictedClass(n.hash, c)
		return
	}
	if !arcLike(m.policy) {
		return
	}
	m.forget(n.prio, n.hash)
	m.ghosts[n.prio] = append(m.ghosts[n.prio], mghost{hash: n.hash, main: n.main(), live: true})
	if len(m.ghosts[n.prio]) > m.numPages {
		m.ghosts[n.prio] = m.ghosts[n.prio][1:]
	}
}

// list records that n became evictable now.
func (m *model) list(n *mnode) {
	m.tick++
	n.tick = m.tick
	n.rrpv = 2 // SRRIP: "long" for a page that never served a hit
	if n.hits > 0 {
		n.rrpv = 0 // "near-immediate"
	}
	if m.adaptive != nil {
		n.queue = m.adaptive[n.prio].EnqueueClass(m.class(n))
	}
}

// victim returns the page the policy evicts next, or nil.
func (m *model) victim() *mnode {
	for prio := range m.nprio {
		var level []*mnode
		for _, n := range m.nodes {
			if m.listed(n) && n.prio == prio {
				level = append(level, n)
			}
		}
		if len(level) == 0 {
			continue
		}
		oldest := func(keep func(*mnode) bool) *mnode {
			var v *mnode
			for _, n := range level {
				if keep(n) && (v == nil || n.tick < v.tick) {
					v = n
				}
			}
			return v
		}
		switch m.policy {
		case evict.SLRU:
			probation := 0
			for _, n := range level {
				if n.hits == 0 {
					probation++
				}
			}
			protected := len(level) - probation
			if probation == 0 || float64(protected) > evict.SLRUProtectedShare*float64(len(level)) {
				return oldest(func(n *mnode) bool { return n.hits > 0 })
			}
			return oldest(func(n *mnode) bool { return n.hits == 0 })
		case evict.Adaptive:
			// Each queue's length and oldest page; a page's age is the
			// pages listed since it was, itself included.
			nq := m.adaptive[prio].Queues()
			lens, ages, heads := make([]int, nq), make([]uint32, nq), make([]*mnode, nq)
			for _, n := range level {
				lens[n.queue]++
				if h := heads[n.queue]; h == nil || n.tick < h.tick {
					heads[n.queue] = n
				}
			}
			for k, h := range heads {
				if h != nil {
					ages[k] = uint32(m.tick - h.tick + 1)
				}
			}
			return heads[m.adaptive[prio].DequeueAges(lens, ages)]
		case evict.ARC:
			probation := 0
			for _, n := range level {
				if !n.main() {
					probation++
				}
			}
			if probation == len(level) || probation > m.target[prio] {
				return oldest(func(n *mnode) bool { return !n.main() })
			}
			return oldest(func(n *mnode) bool { return n.main() })
		case evict.SRRIP:
			for {
				if v := oldest(func(n *mnode) bool { return n.rrpv == 3 }); v != nil {
					return v
				}
				for _, n := range level {
					n.rrpv++
				}
			}
		default:
			return oldest(func(*mnode) bool { return true })
		}
	}
	return nil
}

func pathOf(parent *mnode, ns string, tokens []int32) string {
	if parent == nil {
		return fmt.Sprintf("%q:%v", ns, tokens)
	}
	return fmt.Sprintf("%s%v", parent.path, tokens)
}

func (m *model) match(ns string, tokens []int32, maxPages int) []*mnode {
	var out []*mnode
	var parent *mnode
	for d := 0; d < maxPages && (d+1)*m.ps <= len(tokens); d++ {
		n := m.nodes[pathOf(parent, ns, tokens[d*m.ps:(d+1)*m.ps])]
		if n == nil {
			break
		}
		out = append(out, n)
		parent = n
	}
	return out
}

func (m *model) listed(n *mnode) bool { return n.idle && n.pins == 0 }

func (m *model) recheck(p PageID) {
	n := m.byPage[p]
	if n == nil {
		return
	}
	idle := m.held[p] == 0
	if idle == n.idle {
		return
	}
	if m.adaptive != nil && m.listed(n) { // used again: the cache's Queues.Reuse
		m.adaptive[n.prio].Reused(n.queue, uint32(m.tick-n.tick+1))
	}
	n.idle = idle
	if idle {
		n.at = m.now + n.lapse
	}
	if m.listed(n) {
		m.list(n)
	}
}

// retain is Cache.Retain.
func (m *model) retain(prio int, lapse time.Duration, pages []PageID) {
	for _, p := range pages {
		n := m.byPage[p]
		if n == nil {
			continue
		}
		if n.prio != prio {
			n.prio = prio
			if m.listed(n) {
				m.list(n)
			}
		}
		n.lapse, n.at = lapse, m.now+lapse
	}
}

// advance is Cache.Advance: every due lapse, earliest (then lowest page)
// first, then every due pin, earliest (then oldest) first.
func (m *model) advance(now time.Duration) (npages, npins int) {
	m.now = max(m.now, now)
	var due []*mnode
	for _, n := range m.nodes {
		if n.idle && n.lapse > 0 && n.at <= m.now {
			due = append(due, n)
		}
	}
	sort.Slice(due, func(i, j int) bool {
		if due[i].at != due[j].at {
			return due[i].at < due[j].at
		}
		return due[i].page < due[j].page
	})
	for _, n := range due {
		n.lapse = 0
		if n.prio != 0 {
			n.prio = 0
			if m.listed(n) {
				m.list(n)
			}
		}
	}
	var pins []PinID
	for id, t := range m.ttl {
		if t.at <= m.now {
			pins = append(pins, id)
		}
	}
	sort.Slice(pins, func(i, j int) bool {
		a, b := m.ttl[pins[i]].at, m.ttl[pins[j]].at
		if a != b {
			return a < b
		}
		return pins[i] < pins[j]
	})
	for _, id := range pins {
		if err := m.unpin(id); err != nil {
			panic(err)
		}
	}
	return len(due), len(pins)
}

// hit counts an admission on pages.
func (m *model) hit(pages []PageID) {
	for _, p := range pages {
		if n := m.byPage[p]; n != nil {
			n.hits++
			for id, t := range m.ttl {
				if m.pins[id] == n {
					m.ttl[id] = mttl{life: t.life, at: m.now + t.life}
				}
			}
		}
	}
}

var errModelStale = errors.New("model: stale")

// publish returns the node now caching the prefix and whether it was added.
func (m *model) publish(parent *mnode, ns string, nsHash uint64, page PageID, tokens []int32, prio int) (*mnode, bool, error) {
	if parent != nil && parent.removed {
		return nil, false, errModelStale
	}
	path := pathOf(parent, ns, tokens)
	if n := m.nodes[path]; n != nil {
		return n, false, nil
	}
	prev := nsHash
	if parent != nil {
		prev = parent.hash
	}
	m.seq++
	n := &mnode{path: path, parent: parent, page: page, tokens: slices.Clone(tokens), ns: ns, prio: prio,
		hash: m.hashFn(prev, tokens), seq: m.seq}
	n.back = m.returned(prio, n.hash)
	m.nodes[path] = n
	m.byPage[page] = n
	m.recheck(page)
	return n, true, nil
}

func (m *model) raise(prio int, pages []PageID) {
	for _, p := range pages {
		if n := m.byPage[p]; n != nil && prio > n.prio {
			n.prio = prio
			if m.listed(n) {
				m.list(n)
			}
		}
	}
}

// evict scans for victims; every node below a victim goes with it,
// children first, the most recently published child first (the order in
// which ARC's ghosts are remembered).
func (m *model) evict(npages int) (freed int) {
	var drop func(v *mnode)
	drop = func(v *mnode) {
		var kids []*mnode
		for _, n := range m.nodes {
			if n.parent == v {
				kids = append(kids, n)
			}
		}
		sort.Slice(kids, func(i, j int) bool { return kids[i].seq > kids[j].seq })
		for _, k := range kids {
			drop(k)
		}
		if m.held[v.page] == 0 {
			freed++
		}
		m.remember(v)
		v.removed = true
		delete(m.nodes, v.path)
		delete(m.byPage, v.page)
		m.evicted++
	}
	for freed < npages {
		v := m.victim()
		if v == nil {
			break
		}
		drop(v)
	}
	return freed
}

func (m *model) pin(ns string, tokens []int32) (PinID, int, error) {
	path := m.match(ns, tokens, len(tokens)/m.ps)
	if len(path) == 0 {
		return 0, 0, ErrNotCached
	}
	fresh, pinned := 0, 0
	for _, n := range path {
		if n.pins == 0 {
			fresh++
		}
	}
	for _, n := range m.nodes {
		if n.pins > 0 {
			pinned++
		}
	}
	if m.maxPinned > 0 && pinned+fresh > m.maxPinned || m.budget > 0 && pinned+fresh > m.budget {
		return 0, 0, ErrPinLimit
	}
	for _, n := range path {
		n.pins++
	}
	m.nextPin++
	m.pins[m.nextPin] = path[len(path)-1]
	return m.nextPin, len(path), nil
}

func (m *model) unpin(id PinID) error {
	n, ok := m.pins[id]
	if !ok {
		return ErrUnknownPin
	}
	delete(m.pins, id)
	delete(m.ttl, id)
	for ; n != nil; n = n.parent {
		n.pins--
		if m.listed(n) {
			m.list(n)
		}
	}
	return nil
}

// dump draws the model in the format of Cache.dump.
func (m *model) dump() string {
	nodes := make([]*mnode, 0, len(m.nodes))
	for _, n := range m.nodes {
		nodes = append(nodes, n)
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].page < nodes[j].page })
	var b strings.Builder
	for _, n := range nodes {
		par := "-"
		if n.parent != nil {
			par = fmt.Sprintf("p%d", n.parent.page)
		}
		fmt.Fprintf(&b, "p%d <- %s %v prio %d pins %d", n.page, par, n.tokens, n.prio, n.pins)
		if n.hits > 0 {
			fmt.Fprintf(&b, " hits %d", n.hits)
		}
		if n.idle {
			b.WriteString(" idle")
		}
		if n.lapse > 0 {
			fmt.Fprintf(&b, " lapse %v", n.lapse)
			if n.idle {
				fmt.Fprintf(&b, " at %v", n.at)
			}
		}
		if n.parent == nil {
			fmt.Fprintf(&b, " ns %q", n.ns)
		}
		b.WriteByte('\n')
	}
	for prio := range m.nprio {
		var l []*mnode
		for _, n := range nodes {
			if m.listed(n) && n.prio == prio {
				l = append(l, n)
			}
		}
		if len(l) == 0 {
			continue
		}
		if m.policy != evict.LRU {
			fmt.Fprintf(&b, "evictable[%d]:", prio)
			for _, n := range l {
				fmt.Fprintf(&b, " p%d", n.page)
			}
			b.WriteByte('\n')
			continue
		}
		sort.Slice(l, func(i, j int) bool { return l[i].tick < l[j].tick })
		fmt.Fprintf(&b, "lru[%d]:", prio)
		for _, n := range l {
			fmt.Fprintf(&b, " p%d", n.page)
		}
		b.WriteByte('\n')
	}
	ids := make([]PinID, 0, len(m.ttl))
	for id := range m.ttl {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		fmt.Fprintf(&b, "pin %d lapses at %v\n", id, m.ttl[id].at)
	}
	return b.String()
}

// The harness: requests ("holders") that match, publish, release, and
// slide a window, applied to the cache and the model alike.

const (
	hPageSize   = 2
	hNumPages   = 14
	hPriorities = 3
	hMaxPinned  = 5
	hPinBudget  = 0.3 // 4 of hNumPages: tighter than hMaxPinned
	hTick       = time.Second
	hFamilies   = 8
	hSpaces     = 3
)

type holder struct {
	ns     int
	family int
	npages int      // pages of tokens so far
	pages  []PageID // pages still held, in token order (a window may drop the front)
	chain  Handle   // where the next page is published
	mchain *mnode   // the model's chain (nil: root)
	prio   Priority
}

type harness struct {
	t       testing.TB
	alloc   *allocator.Allocator
	c       *Cache
	m       *model
	keys    [hSpaces]Key
	holders []*holder
	pins    []PinID
	// What the retention ops reached: pages and TTL pins lapsed, pins
	// refused by the budget.
	lapsedPages, lapsedPins, refused int
}

func newHarness(t testing.TB, hash HashFunc, policy string) *harness {
	a, err := allocator.New(allocator.Config{NumPages: hNumPages})
	require.NoError(t, err)
	c, err := New(Config{NumPages: hNumPages, PageSize: hPageSize, Refs: a, Seed: 3, Hash: hash,
		Priorities: hPriorities, MaxPinnedPages: hMaxPinned, PinBudget: hPinBudget, Eviction: policy})
	require.NoError(t, err)
	require.Equal(t, policy, c.Eviction())
	hashFn := hash
	if hashFn == nil {
		hashFn = func(prev uint64, toks []int32) uint64 { return hashTokens(c.seed, prev, toks) }
	}
	h := &harness{t: t, alloc: a, c: c, m: newModel(hPageSize, hPriorities, hMaxPinned, policy, hNumPages, hashFn)}
	budget := hPinBudget
	h.m.budget = int(budget * hNumPages)
	for i := range h.keys {
		h.keys[i] = c.Key(Namespace{Tenant: fmt.Sprint("t", i%2), LoRA: fmt.Sprint("l", i/2)})
	}
	return h
}

// family returns the first npages pages of token family f: all families share
// page 0, pairs share page 1, and so on, so prefixes overlap at every depth.
func family(f, npages int) []int32 {
	out := make([]int32, npages*hPageSize)
	for d := range npages {
		g := f >> max(0, 3-d)
		for t := range hPageSize {
			out[d*hPageSize+t] = int32(g*100 + d*10 + t)
		}
	}
	return out
}

func (h *harness) retain(pages []PageID) {
	require.NoError(h.t, h.alloc.Retain(pages...))
	for _, p := range pages {
		h.m.held[p]++
	}
	h.c.Recheck(pages...)
	for _, p := range pages {
		h.m.recheck(p)
	}
}

// release drops pages deepest first.
func (h *harness) release(pages []PageID) {
	_, err := h.alloc.Release(pages...)
	require.NoError(h.t, err)
	for i := len(pages) - 1; i >= 0; i-- {
		p := pages[i]
		if h.m.held[p]--; h.m.held[p] == 0 {
			delete(h.m.held, p)
		}
		h.c.Recheck(p)
		h.m.recheck(p)
	}
}

func (h *harness) evict(n int) {
	got := h.c.Evict(n)
	want := h.m.evict(n)
	require.Equal(h.t, want, got, "Evict(%d) freed", n)
}

// publish adds pages [from, to) of holder x under its chain; a stale chain
// stops it (the holder keeps its pages private).
func (h *harness) publish(x *holder, from int) {
	tokens := family(x.family, x.npages)
	key := h.keys[x.ns]
	for d := from; d < x.npages; d++ {
		page := x.pages[len(x.pages)-(x.npages-d)]
		toks := tokens[d*hPageSize : (d+1)*hPageSize]
		hd, added, err := h.c.Publish(x.chain, key, page, toks, x.prio)
		mn, madded, merr := h.m.publish(x.mchain, key.id, key.hash, page, toks, int(x.prio))
		if merr != nil {
			require.ErrorIs(h.t, err, ErrStaleHandle, "publish depth %d", d)
			return
		}
		require.NoError(h.t, err, "publish depth %d", d)
		require.Equal(h.t, madded, added, "publish depth %d added", d)
		p, _ := hd.Page()
		require.Equal(h.t, mn.page, p, "publish depth %d: page", d)
		x.chain, x.mchain = hd, mn
	}
}

// insert admits a request of npages pages: with useMatch it first takes the
// cached prefix, otherwise it computes every page (and publishing finds
// duplicates).
func (h *harness) insert(ns, fam, npages int, prio Priority, useMatch bool) {
	tokens := family(fam, npages)
	key := h.keys[ns]
	x := &holder{ns: ns, family: fam, npages: npages, prio: prio}
	if useMatch {
		got, last := h.c.Match(nil, key, tokens, npages)
		want := h.m.match(key.id, tokens, npages)
		require.Equal(h.t, pagesOf(want), got, "match")
		h.retain(got)
		h.c.Hit(got...)
		h.m.hit(got)
		require.NoError(h.t, h.c.Raise(prio, got...))
		h.m.raise(int(prio), got)
		x.pages, x.chain = got, last
		if len(want) > 0 {
			x.mchain = want[len(want)-1]
		}
	}
	fresh := npages - len(x.pages)
	if !h.grow(x, fresh) {
		h.release(x.pages)
		return
	}
	h.publish(x, npages-fresh)
	h.holders = append(h.holders, x)
}

// grow appends n fresh pages to x, evicting on demand; false if the pool
// cannot supply them even then.
func (h *harness) grow(x *holder, n int) bool {
	if short := n - h.alloc.NumFree(); short > 0 {
		h.evict(short)
	}
	if h.alloc.NumFree() < n {
		return false
	}
	fresh := make([]PageID, n)
	require.NoError(h.t, h.alloc.Alloc(fresh))
	for _, p := range fresh {
		h.m.held[p]++
	}
	x.pages = append(x.pages, fresh...)
	return true
}

func pagesOf(ns []*mnode) []PageID {
	var out []PageID
	for _, n := range ns {
		out = append(out, n.page)
	}
	return out
}

// Operations, one per 4-byte command: op, a, b, c.
const (
	opInsert = iota
	opInsertNoMatch
	opRelease
	opWindow
	opEvict
	opPin
	opUnpin
	opRaise
	opLookup
	opExtend
	opRetain
	opAdvance
	opPinTTL
	numOps
)

func (h *harness) step(op, a, b, c byte) {
	switch op % numOps {
	case opInsert, opInsertNoMatch:
		h.insert(int(a)%hSpaces, int(b)%hFamilies, 1+int(c)%5, Priority(int(c>>4)%hPriorities), op%numOps == opInsert)
	case opRelease:
		if len(h.holders) > 0 {
			i := int(a) % len(h.holders)
			h.release(h.holders[i].pages)
			h.holders = slices.Delete(h.holders, i, i+1)
		}
	case opWindow:
		if len(h.holders) > 0 {
			x := h.holders[int(a)%len(h.holders)]
			if k := 1 + int(b)%2; len(x.pages) > k {
				h.release(x.pages[:k])
				x.pages = slices.Clone(x.pages[k:])
			}
		}
	case opEvict:
		h.evict(1 + int(a)%4)
	case opPin, opPinTTL:
		ns, fam, np := int(a)%hSpaces, int(b)%hFamilies, 1+int(c)%5
		tokens := family(fam, np)
		var ttl time.Duration
		if op%numOps == opPinTTL {
			ttl = time.Duration(1+int(c>>4)%4) * hTick
		}
		// CheckPin first: it predicts Pin and changes nothing (the model
		// comparison after the operation would see a change).
		cn, cerr := h.c.CheckPin(h.keys[ns], tokens)
		id, n, err := h.c.PinFor(h.keys[ns], tokens, ttl)
		mid, mn, merr := h.m.pin(h.keys[ns].id, tokens)
		if merr == nil && ttl > 0 {
			h.m.ttl[mid] = mttl{life: ttl, at: h.m.now + ttl}
		}
		if merr != nil {
			require.ErrorIs(h.t, cerr, merr, "check pin")
			require.ErrorIs(h.t, err, merr)
			if errors.Is(err, ErrPinLimit) {
				h.refused++
			}
			return
		}
		require.NoError(h.t, cerr, "check pin")
		require.Equal(h.t, mn, cn, "check pin: pages")
		require.NoError(h.t, err)
		require.Equal(h.t, [2]int{int(mid), mn}, [2]int{int(id), n}, "pin id, pages")
		h.pins = append(h.pins, id)
	case opUnpin:
		if len(h.pins) > 0 {
			i := int(a) % len(h.pins)
			// A TTL pin may have lapsed: then both refuse it.
			merr := h.m.unpin(h.pins[i])
			if err := h.c.Unpin(h.pins[i]); merr != nil {
				require.ErrorIs(h.t, err, merr)
			} else {
				require.NoError(h.t, err)
			}
			require.ErrorIs(h.t, h.c.Unpin(h.pins[i]), ErrUnknownPin)
			h.pins = slices.Delete(h.pins, i, i+1)
		}
	case opRaise:
		if len(h.holders) > 0 {
			x := h.holders[int(a)%len(h.holders)]
			prio := Priority(int(b) % hPriorities)
			require.NoError(h.t, h.c.Raise(prio, x.pages...))
			h.m.raise(int(prio), x.pages)
		}
	case opRetain:
		if len(h.holders) > 0 {
			x := h.holders[int(a)%len(h.holders)]
			prio := Priority(int(b) % hPriorities)
			lapse := time.Duration(int(c)%4) * hTick
			require.NoError(h.t, h.c.Retain(prio, lapse, x.pages...))
			h.m.retain(int(prio), lapse, x.pages)
		}
	case opAdvance:
		// Back in time sometimes: the cache keeps its latest time.
		now := h.c.Now() + time.Duration(int(a)%6-1)*hTick
		pages, pins := h.c.Advance(now)
		mpages, mpins := h.m.advance(now)
		if [2]int{pages, pins} != [2]int{mpages, mpins} {
			require.Equal(h.t, [2]int{mpages, mpins}, [2]int{pages, pins}, "Advance(%v): lapsed pages, pins", now)
		}
		h.lapsedPages += pages
		h.lapsedPins += pins
	case opLookup:
		ns, fam, np := int(a)%hSpaces, int(b)%hFamilies, 1+int(c)%5
		tokens := append(family(fam, np), 7) // a partial page is never matched
		got, _ := h.c.Match(nil, h.keys[ns], tokens, np+1)
		require.Equal(h.t, pagesOf(h.m.match(h.keys[ns].id, tokens, np+1)), got, "lookup")
	case opExtend:
		if len(h.holders) > 0 {
			x := h.holders[int(a)%len(h.holders)]
			n := 1 + int(b)%2
			if h.grow(x, n) {
				x.npages += n
				h.publish(x, x.npages-n)
			}
		}
	}
}

// verify compares the whole state after a step. Checks call require only on
// a mismatch (require's bookkeeping would dominate the run otherwise).
func (h *harness) verify(step int) {
	if err := h.c.CheckInvariants(); err != nil {
		require.NoError(h.t, err, "after step %d", step)
	}
	if err := h.alloc.CheckInvariants(); err != nil {
		require.NoError(h.t, err, "after step %d", step)
	}
	if want, got := h.m.dump(), h.c.dump(); want != got {
		require.Equal(h.t, want, got, "after step %d", step)
	}
	if h.m.adaptive != nil { // each idle page on the queue of its class
		for _, n := range h.m.nodes {
			if !h.m.listed(n) {
				continue
			}
			if level, k, ok := h.c.queues.Position(int32(n.page)); !ok || level != n.prio || k != n.queue {
				require.Equal(h.t, [2]int{n.prio, n.queue}, [2]int{level, k}, "after step %d: page %d's queue", step, n.page)
			}
		}
	}
	ev, pinned := h.c.Idle()
	var mev, mpinned int
	for _, n := range h.m.nodes {
		switch {
		case h.m.listed(n):
			mev++
		case n.idle:
			mpinned++
		}
	}
	if mev != ev || mpinned != pinned {
		require.Equal(h.t, [2]int{mev, mpinned}, [2]int{ev, pinned}, "Idle() after step %d", step)
	}
	// Every page is free, or held by requests and/or the cache: never both
	// free and referenced.
	var want, got [hNumPages]int32
	for p := range PageID(hNumPages) {
		want[p] = int32(h.m.held[p])
		if h.m.byPage[p] != nil {
			want[p]++
		}
		got[p] = h.alloc.RefCount(p)
	}
	if want != got {
		require.Equal(h.t, want, got, "reference counts by page after step %d", step)
	}
	if h.m.evicted != h.c.Counters().Evicted {
		require.Equal(h.t, h.m.evicted, h.c.Counters().Evicted, "evicted pages after step %d", step)
	}
}

func (h *harness) run(data []byte) {
	for i := 0; i+4 <= len(data); i += 4 {
		h.step(data[i], data[i+1], data[i+2], data[i+3])
		h.verify(i / 4)
	}
}

func TestCacheMatchesModel(t *testing.T) {
	runs, steps := 200, 150
	if testing.Short() || raceEnabled {
		runs = 40
	}
	hashes := map[string]HashFunc{
		"default":   nil,
		"colliding": func(_ uint64, toks []int32) uint64 { return uint64(toks[0] % 2) },
	}
	for _, policy := range evict.Names() {
		for name, hash := range hashes {
			t.Run(policy+"/"+name, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(1, uint64(len(name)+len(policy))))
				var returns [2]int
				for range runs {
					data := make([]byte, 4*steps)
					for i := range data {
						data[i] = byte(rng.Uint32())
					}
					h := newHarness(t, hash, policy)
					h.run(data)
					returns[0] += h.m.returns[0]
					returns[1] += h.m.returns[1]
				}
				switch policy {
				case evict.ARC: // the runs reach both of ARC's adaptations
					require.Positive(t, returns[0], "ghost hits from probation")
					require.Positive(t, returns[1], "ghost hits from main")
				case evict.Adaptive: // and adaptive's learning
					require.Positive(t, returns[0], "ghost hits")
				}
			})
		}
	}
}

// FuzzCache decodes the input into 4-byte commands (op, a, b, c) run on the
// cache and the model; see harness.step. Trailing bytes are ignored and
// every op is valid, so the fuzzer is not constrained by the encoding.
func FuzzCache(f *testing.F) {
	seed := func(cmds ...[4]byte) []byte {
		var b []byte
		for _, c := range cmds {
			b = append(b, c[:]...)
		}
		return b
	}
	// Share a prefix, release, evict leaf first.
	f.Add(seed([4]byte{opInsert, 0, 0, 2}, [4]byte{opInsert, 0, 1, 2}, [4]byte{opRelease, 0, 0, 0}, [4]byte{opEvict, 3, 0, 0}))
	// Duplicates, then an eviction that cuts the duplicate's chain.
	f.Add(seed([4]byte{opInsert, 1, 2, 3}, [4]byte{opInsertNoMatch, 1, 2, 3}, [4]byte{opRelease, 0, 0, 0},
		[4]byte{opEvict, 1, 0, 0}, [4]byte{opExtend, 0, 1, 0}))
	// Window release under pressure.
	f.Add(seed([4]byte{opInsert, 0, 5, 4}, [4]byte{opWindow, 0, 1, 0}, [4]byte{opInsert, 2, 6, 4},
		[4]byte{opInsert, 1, 7, 4}, [4]byte{opExtend, 0, 1, 0}, [4]byte{opEvict, 3, 0, 0}))
	// Pins and priorities.
	f.Add(seed([4]byte{opInsert, 0, 3, 0x24}, [4]byte{opPin, 0, 3, 4}, [4]byte{opRelease, 0, 0, 0},
		[4]byte{opEvict, 3, 0, 0}, [4]byte{opUnpin, 0, 0, 0}, [4]byte{opRaise, 0, 2, 0}, [4]byte{opEvict, 3, 0, 0}))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 4*400 {
			data = data[:4*400]
		}
		newHarness(t, nil, evict.LRU).run(data)
	})
}

// FuzzCachePolicies is FuzzCache under every eviction policy: the first
// byte picks the policy, the rest are FuzzCache's commands.
func FuzzCachePolicies(f *testing.F) {
	names := evict.Names()
	for i := range names {
		f.Add([]byte{byte(i), opInsert, 0, 0, 3, opInsert, 0, 1, 3, opInsert, 1, 0, 2, opRelease, 0, 0, 0,
			opInsert, 0, 0, 4, opRelease, 1, 0, 0, opRelease, 0, 0, 0, opInsert, 2, 5, 4, opEvict, 3, 0, 0})
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		if len(data) > 1+4*400 {
			data = data[:1+4*400]
		}
		newHarness(t, nil, names[int(data[0])%len(names)]).run(data[1:])
	})
}

// arcLike reports whether the model runs policy as ARC.
func arcLike(policy string) bool { return policy == evict.ARC }

// retentionOps are the commands of FuzzRetention and
// TestRetentionMatchesModel: admissions (whose hits refresh TTL pins),
// releases, retention, the clock, TTL and plain pins, unpins, evictions.
var retentionOps = [...]byte{opInsert, opRelease, opRetain, opAdvance, opPinTTL, opUnpin, opEvict, opPin, opExtend, opWindow}

// runRetention runs data as retention commands (op byte modulo
// len(retentionOps)) on the cache and the model.
func (h *harness) runRetention(data []byte) {
	for i := 0; i+4 <= len(data); i += 4 {
		h.step(retentionOps[int(data[i])%len(retentionOps)], data[i+1], data[i+2], data[i+3])
		h.verify(i / 4)
	}
}

// TestRetentionMatchesModel runs random retention programs under every
// policy against the model (same levels, lapses, pins, victims), and
// checks that they reached lapsed pages, lapsed TTL pins and budget
// refusals.
func TestRetentionMatchesModel(t *testing.T) {
	runs, steps := 40, 150
	if testing.Short() || raceEnabled {
		runs = 2
	}
	for _, policy := range evict.Names() {
		t.Run(policy, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, uint64(len(policy))))
			var pages, pins, refused int
			for range runs {
				data := make([]byte, 4*steps)
				for i := range data {
					data[i] = byte(rng.Uint32())
				}
				h := newHarness(t, nil, policy)
				h.runRetention(data)
				pages, pins, refused = pages+h.lapsedPages, pins+h.lapsedPins, refused+h.refused
			}
			require.Positive(t, pages, "lapsed pages")
			require.Positive(t, pins, "lapsed TTL pins")
			require.Positive(t, refused, "pins refused by the budget")
		})
	}
}

// FuzzRetention decodes the input into retention commands (see
// runRetention; the first byte picks the policy) run on the cache and the
// model: retention levels and lapses, TTL pins with their refreshes and
// lapses, the pin budget, and the victims that follow.
func FuzzRetention(f *testing.F) {
	names := evict.Names()
	// Retain at level 2 for a tick, release, advance past it, evict; a TTL
	// pin, a refreshing hit, advances around its deadline.
	f.Add([]byte{0, 0, 0, 1, 0x13, 2, 0, 2, 1, 1, 0, 0, 0, 3, 3, 0, 0, 6, 3, 0, 0,
		4, 0, 1, 0x14, 0, 0, 1, 3, 3, 2, 0, 0, 3, 4, 0, 0, 5, 0, 0, 0})
	for i := range names {
		f.Add([]byte{byte(i), 0, 1, 2, 3, 2, 0, 1, 2, 1, 0, 0, 0, 3, 5, 0, 0, 4, 1, 2, 0x33, 3, 5, 0, 0, 6, 2, 0, 0})
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		if len(data) > 1+4*400 {
			data = data[:1+4*400]
		}
		newHarness(t, nil, names[int(data[0])%len(names)]).runRetention(data[1:])
	})
}
