package prefixcache

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/allocator"
)

const ps = 4 // page size of the scenario tests

// fixture is a pool of pages and a cache over it. Pages are handed out in
// increasing ID order, so the scenarios below can name them.
type fixture struct {
	t     *testing.T
	alloc *allocator.Allocator
	c     *Cache
	key   Key // the default namespace
}

func newFixture(t *testing.T, numPages int, mod func(*Config)) *fixture {
	t.Helper()
	a, err := allocator.New(allocator.Config{NumPages: numPages})
	require.NoError(t, err)
	cfg := Config{NumPages: numPages, PageSize: ps, Refs: a, Seed: 1}
	if mod != nil {
		mod(&cfg)
	}
	c, err := New(cfg)
	require.NoError(t, err)
	return &fixture{t: t, alloc: a, c: c, key: c.Key(Namespace{})}
}

// check runs the full invariant check and compares the dump with want.
func (f *fixture) check(want string) {
	f.t.Helper()
	require.NoError(f.t, f.c.CheckInvariants())
	require.NoError(f.t, f.alloc.CheckInvariants())
	require.Equal(f.t, want, f.c.dump())
}

// prefill plays a request that computed tokens on fresh pages (no match) and
// publishes every full page in order under key; it returns the pages, which
// the request still holds.
func (f *fixture) prefill(key Key, prio Priority, tokens ...int32) []PageID {
	f.t.Helper()
	pages := make([]PageID, len(tokens)/ps)
	require.NoError(f.t, f.alloc.Alloc(pages))
	h := Handle{}
	for i, p := range pages {
		var err error
		h, _, err = f.c.Publish(h, key, p, tokens[i*ps:(i+1)*ps], prio)
		require.NoError(f.t, err)
	}
	return pages
}

// match plays a request admitted on a cached prefix: it takes a reference on
// the matched pages and reports them.
func (f *fixture) match(key Key, tokens ...int32) []PageID {
	f.t.Helper()
	pages, _ := f.c.Match(nil, key, tokens, len(tokens)/ps)
	require.NoError(f.t, f.alloc.Retain(pages...))
	f.c.Recheck(pages...)
	return pages
}

// release plays a request that finishes: its pages go deepest first.
func (f *fixture) release(pages ...PageID) {
	f.t.Helper()
	_, err := f.alloc.Release(pages...)
	require.NoError(f.t, err)
	for i := len(pages) - 1; i >= 0; i-- {
		f.c.Recheck(pages[i])
	}
}

const nsDefault = ` ns "T\x00L\x00S\x00"`

func TestShareReleaseEvictLeafFirst(t *testing.T) {
	f := newFixture(t, 8, nil)
	a := f.prefill(f.key, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
	require.Equal(t, []PageID{0, 1, 2}, a)
	f.check("" +
		"p0 <- - [1 2 3 4] prio 0 pins 0" + nsDefault + "\n" +
		"p1 <- p0 [5 6 7 8] prio 0 pins 0\n" +
		"p2 <- p1 [9 10 11 12] prio 0 pins 0\n")

	// B shares the first two pages and diverges inside the third.
	b := f.match(f.key, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 99, 99)
	require.Equal(t, []PageID{0, 1}, b)

	f.release(a...) // only p2 is left to the cache alone
	f.check("" +
		"p0 <- - [1 2 3 4] prio 0 pins 0" + nsDefault + "\n" +
		"p1 <- p0 [5 6 7 8] prio 0 pins 0\n" +
		"p2 <- p1 [9 10 11 12] prio 0 pins 0 idle\n" +
		"lru[0]: p2\n")

	f.release(b...)
	f.check("" +
		"p0 <- - [1 2 3 4] prio 0 pins 0 idle" + nsDefault + "\n" +
		"p1 <- p0 [5 6 7 8] prio 0 pins 0 idle\n" +
		"p2 <- p1 [9 10 11 12] prio 0 pins 0 idle\n" +
		"lru[0]: p2 p1 p0\n")
	ev, pinned := f.c.Idle()
	require.Equal(t, [2]int{3, 0}, [2]int{ev, pinned})

	// Leaf first: the deepest page goes first, then its parent.
	require.Equal(t, 1, f.c.Evict(1))
	f.check("" +
		"p0 <- - [1 2 3 4] prio 0 pins 0 idle" + nsDefault + "\n" +
		"p1 <- p0 [5 6 7 8] prio 0 pins 0 idle\n" +
		"lru[0]: p1 p0\n")
	require.Equal(t, 2, f.c.Evict(5)) // asks for more than there is
	f.check("")
	require.Equal(t, 8, f.alloc.NumFree())
	require.Equal(t, Counters{Published: 3, Evicted: 3, Freed: 3, Victims: 3}, f.c.Counters())
}

func TestMatchLeavesAtLeastOnePageBoundaryAndStopsAtFirstMiss(t *testing.T) {
	f := newFixture(t, 8, nil)
	f.prefill(f.key, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
	for _, tc := range []struct {
		name     string
		tokens   []int32
		maxPages int
		want     []PageID
	}{
		{"all three", []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, 3, []PageID{0, 1, 2}},
		{"capped by maxPages", []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, 2, []PageID{0, 1}},
		{"partial last page is never matched", []int32{1, 2, 3, 4, 5, 6, 7}, 9, []PageID{0}},
		{"miss in page 1 ends the match", []int32{1, 2, 3, 4, 5, 0, 7, 8, 9, 10, 11, 12}, 3, []PageID{0}},
		{"miss at page 0", []int32{0, 2, 3, 4}, 1, nil},
		{"empty prompt", nil, 3, nil},
		{"negative maxPages", []int32{1, 2, 3, 4}, -1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, h := f.c.Match(nil, f.key, tc.tokens, tc.maxPages)
			require.Equal(t, tc.want, got)
			if len(got) == 0 {
				require.True(t, h.IsRoot())
			} else {
				p, ok := h.Page()
				require.True(t, ok)
				require.Equal(t, got[len(got)-1], p)
			}
		})
	}
}

// TestForcedCollisionsServeOnlyCorrectPages injects a hash under which every
// page of every prefix in every namespace collides, and checks that lookups
// still return exactly the pages whose tokens (and namespace) match.
func TestForcedCollisionsServeOnlyCorrectPages(t *testing.T) {
	f := newFixture(t, 16, func(c *Config) { c.Hash = func(uint64, []int32) uint64 { return 7 } })
	tenantB := f.c.Key(Namespace{Tenant: "b"})
	loraB := f.c.Key(Namespace{LoRA: "b"})
	a := f.prefill(f.key, 0, 1, 2, 3, 4, 5, 6, 7, 8)
	b := f.prefill(tenantB, 0, 1, 2, 3, 4, 5, 6, 7, 8) // same tokens, other tenant
	c := f.prefill(f.key, 0, 1, 2, 3, 4, 5, 6, 7, 9)   // differs in the last token
	d := f.prefill(f.key, 0, 5, 6, 7, 8, 1, 2, 3, 4)   // the same pages swapped
	require.NoError(t, f.c.CheckInvariants())
	require.Equal(t, 1, f.c.byHash.n, "every page must share one hash chain")

	for _, tc := range []struct {
		name   string
		key    Key
		tokens []int32
		want   []PageID
	}{
		{"default namespace", f.key, []int32{1, 2, 3, 4, 5, 6, 7, 8}, a},
		{"tenant b", tenantB, []int32{1, 2, 3, 4, 5, 6, 7, 8}, b},
		{"last token differs", f.key, []int32{1, 2, 3, 4, 5, 6, 7, 9}, []PageID{a[0], c[1]}},
		{"swapped pages", f.key, []int32{5, 6, 7, 8, 1, 2, 3, 4}, d},
		{"lora b is not tenant b", loraB, []int32{1, 2, 3, 4, 5, 6, 7, 8}, nil},
		{"nothing matches", f.key, []int32{9, 9, 9, 9}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := f.c.Match(nil, tc.key, tc.tokens, 2)
			require.Equal(t, tc.want, got)
			for i, p := range got {
				require.Equal(t, tc.tokens[i*ps:(i+1)*ps], f.c.pageTokens(int32(p)), "page %d", p)
			}
		})
	}
	// c's first page was a duplicate of a's: published under a's handle.
	require.Equal(t, int64(1), f.c.Counters().Duplicates)
	f.release(c[0]) // c keeps its private duplicate page 4; release it
	require.False(t, f.c.Cached(c[0]))

	// Evicting through one long collision chain keeps the others findable.
	f.release(a...)
	f.release(c[1])
	// LRU: a[1], a[0], c[1]. Evict(2) takes a[1], then a[0], which goes
	// with c[1] (c chained it under a[0] when its own first page turned out
	// a duplicate): three pages for a request of two.
	require.Equal(t, 3, f.c.Evict(2))
	require.Equal(t, int64(1), f.c.Counters().InnerVictims)
	require.NoError(t, f.c.CheckInvariants())
	got, _ := f.c.Match(nil, tenantB, []int32{1, 2, 3, 4, 5, 6, 7, 8}, 2)
	require.Equal(t, b, got)
	got, _ = f.c.Match(nil, f.key, []int32{5, 6, 7, 8, 1, 2, 3, 4}, 2)
	require.Equal(t, d, got)
}

func TestNamespaceEncodingIsInjective(t *testing.T) {
	all := []Namespace{
		{}, {Tenant: "a"}, {LoRA: "a"}, {Salt: "a"},
		{Tenant: "ab", LoRA: "c"}, {Tenant: "a", LoRA: "bc"},
		{LoRA: "x", Salt: ""}, {LoRA: "", Salt: "x"},
		{Tenant: "T\x01L"}, {Tenant: "T", LoRA: "L"},
	}
	seen := map[string]Namespace{}
	for _, ns := range all {
		e := ns.encode()
		prev, dup := seen[e]
		require.False(t, dup, "%+v and %+v encode to %q", prev, ns, e)
		seen[e] = ns
	}
}

// TestKeyIsMemoized: Key returns the same key for equal namespaces, from
// the memo without allocating once seen, and keeps returning correct keys
// after the memo fills and starts over.
func TestKeyIsMemoized(t *testing.T) {
	f := newFixture(t, 4, nil)
	ns := Namespace{Tenant: "t", LoRA: "l", Salt: "s"}
	want := Key{id: ns.encode(), hash: hashBytes(f.c.seed, []byte(ns.encode()))}
	require.Equal(t, want, f.c.Key(ns))
	require.Zero(t, testing.AllocsPerRun(20, func() { f.c.Key(ns) }))
	for i := range maxMemoKeys + 5 {
		other := Namespace{Tenant: fmt.Sprint(i)}
		require.Equal(t, other.encode(), f.c.Key(other).id)
		require.LessOrEqual(t, len(f.c.keys), maxMemoKeys)
	}
	require.Equal(t, want, f.c.Key(ns))
}

func TestPinKeepsAPrefixAndPrioritiesOrderEviction(t *testing.T) {
	f := newFixture(t, 8, func(c *Config) { c.MaxPinnedPages = 2 })
	sys := f.prefill(f.key, 1, 1, 2, 3, 4, 5, 6, 7, 8) // system prompt, priority 1
	low := f.prefill(f.key, 0, 9, 9, 9, 9)             // priority 0
	f.release(sys...)
	f.release(low...)
	f.check("" +
		"p0 <- - [1 2 3 4] prio 1 pins 0 idle" + nsDefault + "\n" +
		"p1 <- p0 [5 6 7 8] prio 1 pins 0 idle\n" +
		"p2 <- - [9 9 9 9] prio 0 pins 0 idle" + nsDefault + "\n" +
		"lru[0]: p2\n" +
		"lru[1]: p1 p0\n")

	id, n, err := f.c.Pin(f.key, []int32{1, 2, 3, 4, 5, 6, 7, 8, 100})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	_, _, err = f.c.Pin(f.key, []int32{9, 9, 9, 9})
	require.ErrorIs(t, err, ErrPinLimit)
	_, _, err = f.c.Pin(f.key, []int32{8, 8, 8, 8})
	require.ErrorIs(t, err, ErrNotCached)
	f.check("" +
		"p0 <- - [1 2 3 4] prio 1 pins 1 idle" + nsDefault + "\n" +
		"p1 <- p0 [5 6 7 8] prio 1 pins 1 idle\n" +
		"p2 <- - [9 9 9 9] prio 0 pins 0 idle" + nsDefault + "\n" +
		"lru[0]: p2\n")
	ev, pinned := f.c.Idle()
	require.Equal(t, [2]int{1, 2}, [2]int{ev, pinned})

	require.Equal(t, 1, f.c.Evict(3), "pinned pages are not evictable")
	require.NoError(t, f.c.Unpin(id))
	require.ErrorIs(t, f.c.Unpin(id), ErrUnknownPin)
	f.check("" +
		"p0 <- - [1 2 3 4] prio 1 pins 0 idle" + nsDefault + "\n" +
		"p1 <- p0 [5 6 7 8] prio 1 pins 0 idle\n" +
		"lru[1]: p1 p0\n")

	// Raising moves an idle page to the tail of its new level.
	require.NoError(t, f.c.Raise(3, 0))
	require.ErrorIs(t, f.c.Raise(4, 0), ErrBadArgument)
	f.check("" +
		"p0 <- - [1 2 3 4] prio 3 pins 0 idle" + nsDefault + "\n" +
		"p1 <- p0 [5 6 7 8] prio 1 pins 0 idle\n" +
		"lru[1]: p1\n" +
		"lru[3]: p0\n")
}

// TestInnerVictimTakesItsSubtree is the sliding-window case: a request still
// holds a prefix's later page but released its first one, which becomes an
// idle page with a busy child. Evicting it cuts the child from the cache but
// leaves the child's page with the request.
func TestInnerVictimTakesItsSubtree(t *testing.T) {
	f := newFixture(t, 8, nil)
	pages := f.prefill(f.key, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
	f.release(pages[0]) // the window moved past page 0
	f.check("" +
		"p0 <- - [1 2 3 4] prio 0 pins 0 idle" + nsDefault + "\n" +
		"p1 <- p0 [5 6 7 8] prio 0 pins 0\n" +
		"p2 <- p1 [9 10 11 12] prio 0 pins 0\n" +
		"lru[0]: p0\n")
	require.Equal(t, 1, f.c.Evict(1))
	f.check("")
	require.Equal(t, int32(1), f.alloc.RefCount(1), "the request still holds page 1")
	require.Equal(t, int32(1), f.alloc.RefCount(2), "the request still holds page 2")
	require.Equal(t, Counters{Published: 3, Evicted: 3, Freed: 1, Victims: 1, InnerVictims: 1}, f.c.Counters())
}

func TestPublishFailuresChangeNothing(t *testing.T) {
	f := newFixture(t, 8, nil)
	pages := f.prefill(f.key, 0, 1, 2, 3, 4, 5, 6, 7, 8)
	_, last := f.c.Match(nil, f.key, []int32{1, 2, 3, 4, 5, 6, 7, 8}, 2)
	before := f.c.dump()
	var spare [1]PageID
	require.NoError(t, f.alloc.Alloc(spare[:]))

	_, _, err := f.c.Publish(last, f.key, spare[0], []int32{1, 2, 3}, 0)
	require.ErrorIs(t, err, ErrBadArgument)
	_, _, err = f.c.Publish(last, f.key, 8, []int32{1, 2, 3, 4}, 0)
	require.ErrorIs(t, err, ErrBadArgument)
	_, _, err = f.c.Publish(last, f.key, spare[0], []int32{1, 2, 3, 4}, 4)
	require.ErrorIs(t, err, ErrBadArgument)
	_, _, err = f.c.Publish(last, f.key, pages[0], []int32{0, 0, 0, 0}, 0)
	require.ErrorIs(t, err, ErrPageCached)
	_, _, err = f.c.Publish(last, f.key, 7, []int32{0, 0, 0, 0}, 0) // page 7 is free
	require.ErrorIs(t, err, allocator.ErrBadPage)
	require.Equal(t, before, f.c.dump())

	// A handle goes stale when its page is evicted, even if the page is
	// cached again later.
	f.release(pages...)
	require.Equal(t, 2, f.c.Evict(2))
	again := f.prefill(f.key, 0, 1, 2, 3, 4, 5, 6, 7, 8)
	require.Equal(t, pages, again, "the allocator hands the same pages back")
	_, _, err = f.c.Publish(last, f.key, spare[0], []int32{0, 0, 0, 0}, 0)
	require.ErrorIs(t, err, ErrStaleHandle)
	require.NoError(t, f.c.CheckInvariants())
}

func TestNewRejectsBadConfig(t *testing.T) {
	a, err := allocator.New(allocator.Config{NumPages: 4})
	require.NoError(t, err)
	for name, cfg := range map[string]Config{
		"no pages":            {PageSize: 4, Refs: a},
		"no page size":        {NumPages: 4, Refs: a},
		"no refs":             {NumPages: 4, PageSize: 4},
		"too many priorities": {NumPages: 4, PageSize: 4, Refs: a, Priorities: MaxPriorities + 1},
		"negative pin cap":    {NumPages: 4, PageSize: 4, Refs: a, MaxPinnedPages: -1},
	} {
		_, err := New(cfg)
		require.ErrorIs(t, err, ErrBadConfig, name)
	}
}
