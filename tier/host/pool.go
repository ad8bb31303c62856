package host

import (
	"errors"
	"fmt"
	"slices"
	"time"
	"unsafe"

	"github.com/pagedkv/pagedkv/evict"
	"github.com/pagedkv/pagedkv/internal/invariants"
	"github.com/pagedkv/pagedkv/internal/sysmem"
	"github.com/pagedkv/pagedkv/tier"
)

// PageID is a host page.
type PageID = tier.HostPageID

var (
	// ErrBadConfig reports an invalid [Config].
	ErrBadConfig = errors.New("host: bad config")
	// ErrBadPage reports a page outside the pool or in the wrong state for
	// the call.
	ErrBadPage = errors.New("host: bad page")
	// ErrPresent reports claiming a page for a digest the pool already
	// holds (writing or ready).
	ErrPresent = errors.New("host: page already present")
	// ErrFull reports a claim when no page is free or reclaimable.
	ErrFull = errors.New("host: no free or reclaimable page")
)

// Config describes a Pool.
type Config struct {
	// NumPages is the number of host pages, >= 1.
	NumPages int
	// PageSize is the number of tokens per page, >= 1.
	PageSize int
	// PageBytes is the size of a page's bytes (tier.PageFormat.PageBytes);
	// 0 keeps bookkeeping only (no memory).
	PageBytes int
	// Memory, if not nil, holds the pages' bytes (NumPages*PageBytes of
	// them, e.g. pinned memory the engine allocated); nil with PageBytes > 0
	// allocates it.
	Memory []byte
	// Levels is the number of retention levels (tier.Retention.Priority
	// 0..Levels-1), 1..tier.MaxRetentionLevels; 0 means 1.
	Levels int
	// MemoryLimit bounds the bytes New may allocate: the bookkeeping of
	// every page, plus the pages' bytes when Memory is nil. 0 means this
	// machine's physical memory, so that a pool that can never fit is
	// refused by name (wrapping ErrBadConfig) instead of being killed by
	// the OOM killer while it initialises; < 0 is invalid.
	MemoryLimit int64
}

// bookkeepingPerPage is what New allocates per page besides its bytes: the
// entry, the free-stack slot and the index entry (a map slot holds a
// digest, a value and a tophash byte; the map's load factor adds about a
// quarter). Tokens are counted separately, PageSize of them per page.
const bookkeepingPerPage = int64(unsafe.Sizeof(entry{})) + 4 + (int64(unsafe.Sizeof(tier.Digest{}))+4+1)*5/4 + tier.LapsesBytes

// AllocBytes is what New allocates for cfg (saturating at the largest
// int64): what MemoryLimit bounds.
func AllocBytes(cfg Config) int64 {
	n := int64(max(cfg.NumPages, 0))
	need := sysmem.MulAdd(n, bookkeepingPerPage+4*int64(max(cfg.PageSize, 0)), evict.AllocBytesIn(evict.LRU, max(cfg.Levels, 1), 0))
	if cfg.Memory == nil {
		need = sysmem.MulAdd(n, int64(max(cfg.PageBytes, 0)), need)
	}
	return need
}

// Page states.
const (
	stFree uint8 = iota
	stWriting
	stReady
)

type entry struct {
	digest, parent tier.Digest
	state          uint8
	level, hint    uint8 // its retention level and continuation hint
	readers        int32
	dur            time.Duration // its retention's duration (0: the level never lapses)
	lru            evict.Link    // its place on the LRU queue; zero off it
}

// Counters are the pool's cumulative event counts.
type Counters struct {
	Claimed   int64 // pages claimed for an offload
	Written   int64 // offloads completed (pages made ready)
	Abandoned int64 // claims given back unwritten
	Reclaimed int64 // ready pages reclaimed (LRU) to make room
	Lapsed    int64 // pages whose retention level lapsed to 0
	Hits      int64 // lookups served
}

// Pool is the host tier's page pool. It is not safe for concurrent use; the
// zero value is not usable (call [New]).
type Pool struct {
	pageSize  int
	pageBytes int
	mem       []byte

	ents   []entry
	tokens []int32 // [NumPages*PageSize]: tokens of writing and ready pages
	free   []int32 // stack
	index  map[tier.Digest]int32

	// lru holds the reclaimable pages (ready, no readers), least recently
	// used at the head of each retention level: evict's LRU policy, its
	// links in the entries. lapses holds the deadlines of the pages whose
	// level lapses (a duration, level > 0), on the pool's clock now.
	lru      *evict.Queues
	lapses   *tier.Lapses
	now      time.Duration
	nWriting int
	nReady   int
	nReaders int64 // sum of readers

	counters Counters
}

// New returns a pool with every page free.
func New(cfg Config) (*Pool, error) {
	switch {
	case cfg.NumPages < 1 || cfg.NumPages > 1<<30:
		return nil, fmt.Errorf("%w: NumPages = %d, want 1..2^30", ErrBadConfig, cfg.NumPages)
	case cfg.PageSize < 1:
		return nil, fmt.Errorf("%w: PageSize = %d, want >= 1", ErrBadConfig, cfg.PageSize)
	case cfg.PageBytes < 0 || cfg.PageBytes > tier.MaxPageBytes:
		return nil, fmt.Errorf("%w: PageBytes = %d, want 0..%d", ErrBadConfig, cfg.PageBytes, tier.MaxPageBytes)
	case int64(cfg.NumPages)*int64(cfg.PageSize) > 1<<32:
		return nil, fmt.Errorf("%w: NumPages*PageSize = %d*%d tokens, want <= 2^32", ErrBadConfig, cfg.NumPages, cfg.PageSize)
	case cfg.Memory != nil && int64(len(cfg.Memory)) != int64(cfg.NumPages)*int64(cfg.PageBytes):
		return nil, fmt.Errorf("%w: Memory has %d bytes, want NumPages*PageBytes = %d*%d", ErrBadConfig, len(cfg.Memory), cfg.NumPages, cfg.PageBytes)
	case cfg.Levels < 0 || cfg.Levels > tier.MaxRetentionLevels:
		return nil, fmt.Errorf("%w: Levels = %d, want 0..%d", ErrBadConfig, cfg.Levels, tier.MaxRetentionLevels)
	case cfg.MemoryLimit < 0:
		return nil, fmt.Errorf("%w: MemoryLimit = %d, want >= 0 (0: physical memory)", ErrBadConfig, cfg.MemoryLimit)
	}
	what := fmt.Sprintf("a host pool of NumPages = %d (PageSize = %d, PageBytes = %d)", cfg.NumPages, cfg.PageSize, cfg.PageBytes)
	if err := sysmem.Check(what, AllocBytes(cfg), cfg.MemoryLimit); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	ents := make([]entry, cfg.NumPages)
	lru, err := evict.NewQueuesIn(evict.LRU, max(cfg.Levels, 1), ents, func(e *entry) *evict.Link { return &e.lru })
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	p := &Pool{
		pageSize: cfg.PageSize, pageBytes: cfg.PageBytes, mem: cfg.Memory,
		ents:   ents,
		tokens: make([]int32, cfg.NumPages*cfg.PageSize),
		free:   make([]int32, cfg.NumPages),
		index:  make(map[tier.Digest]int32, cfg.NumPages),
		lru:    lru,
		lapses: tier.NewLapses(cfg.NumPages),
	}
	if p.mem == nil && cfg.PageBytes > 0 {
		p.mem = make([]byte, cfg.NumPages*cfg.PageBytes)
	}
	for i := range p.free {
		p.free[i] = int32(cfg.NumPages - 1 - i) // page 0 on top
	}
	return p, nil
}

// NumPages is the size of the pool.
func (p *Pool) NumPages() int { return len(p.ents) }

// PageSize is the number of tokens per page.
func (p *Pool) PageSize() int { return p.pageSize }

// PageBytes is the size of a page's bytes (0: bookkeeping only).
func (p *Pool) PageBytes() int { return p.pageBytes }

// Page returns the bytes of page h (nil without memory). The engine writes
// them for an offload and reads them for an onload.
func (p *Pool) Page(h PageID) []byte {
	if p.mem == nil {
		return nil
	}
	off := int(h) * p.pageBytes
	return p.mem[off : off+p.pageBytes : off+p.pageBytes]
}

// Tokens returns the tokens recorded for writing or ready page h (read-only).
func (p *Pool) Tokens(h PageID) []int32 {
	off := int(h) * p.pageSize
	return p.tokens[off : off+p.pageSize : off+p.pageSize]
}

// Entry returns what page h records: its digest, its parent's digest,
// whether it is ready (servable) and how many readers it has. ok is false
// for a free page or one outside the pool.
func (p *Pool) Entry(h PageID) (digest, parent tier.Digest, ready bool, readers int, ok bool) {
	if h < 0 || int(h) >= len(p.ents) || p.ents[h].state == stFree {
		return tier.Digest{}, tier.Digest{}, false, 0, false
	}
	e := &p.ents[h]
	return e.digest, e.parent, e.state == stReady, int(e.readers), true
}

// Has reports whether the pool holds digest d (writing or ready).
func (p *Pool) Has(d tier.Digest) bool { _, ok := p.index[d]; return ok }

// Find returns the page that holds digest d (writing or ready).
func (p *Pool) Find(d tier.Digest) (PageID, bool) { h, ok := p.index[d]; return PageID(h), ok }

// Levels is the number of retention levels.
func (p *Pool) Levels() int { return p.lru.Levels() }

// Usage returns the pages by state: free, writing, ready (with or without
// readers), and of the ready ones those reclaimable (no readers).
func (p *Pool) Usage() (free, writing, ready, reclaimable int) {
	return len(p.free), p.nWriting, p.nReady, p.lru.Len()
}

// Counters returns the cumulative event counts.
func (p *Pool) Counters() Counters { return p.counters }

// Claim takes a page for an offload of the page named digest (child of
// parent, holding tokens): a free page, or else the least recently used
// ready page without readers, which is reclaimed. The page is writing until
// [Pool.Written] or [Pool.Abandon]. It fails, changing nothing, with
// [ErrPresent] if d is already held, [ErrFull] if no page can be taken, and
// [ErrBadPage] for tokens of the wrong length.
func (p *Pool) Claim(d, parent tier.Digest, tokens []int32) (PageID, error) {
	if len(tokens) != p.pageSize {
		return 0, fmt.Errorf("%w: claim with %d tokens, want %d", ErrBadPage, len(tokens), p.pageSize)
	}
	if h, ok := p.index[d]; ok {
		return 0, fmt.Errorf("%w: digest %s is on host page %d", ErrPresent, d.String()[:16], h)
	}
	var h int32
	switch {
	case len(p.free) > 0:
		h = p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
	case p.lru.Len() > 0:
		h = p.lru.Victim()
		p.lru.Remove(h)
		p.lapses.Remove(h)
		delete(p.index, p.ents[h].digest)
		p.nReady--
		p.counters.Reclaimed++
	default:
		return 0, fmt.Errorf("%w: %d pages: %d writing, %d ready with readers", ErrFull, len(p.ents), p.nWriting, p.nReady)
	}
	e := &p.ents[h]
	*e = entry{digest: d, parent: parent, state: stWriting}
	copy(p.Tokens(PageID(h)), tokens)
	p.index[d] = h
	p.nWriting++
	p.counters.Claimed++
	p.check(h)
	return PageID(h), nil
}

// Written records that the engine finished writing page h: it becomes ready
// (servable) and the most recently used.
func (p *Pool) Written(h PageID) error {
	if err := p.want("written", h, stWriting); err != nil {
		return err
	}
	e := &p.ents[h]
	e.state = stReady
	p.nWriting--
	p.nReady++
	p.lru.Push(int32(h), int(e.level), 0)
	p.counters.Written++
	p.check(int32(h))
	return nil
}

// Abandon gives back writing page h unwritten (a failed fetch, a cancelled
// offload): it becomes free and its digest is forgotten.
func (p *Pool) Abandon(h PageID) error {
	if err := p.want("abandon", h, stWriting); err != nil {
		return err
	}
	delete(p.index, p.ents[h].digest)
	p.lapses.Remove(int32(h))
	p.ents[h] = entry{}
	p.nWriting--
	p.free = append(p.free, int32(h))
	p.counters.Abandoned++
	p.check(int32(h))
	return nil
}

// Lookup returns the ready page that holds digest d, child of parent, with
// exactly tokens; ok is false otherwise (absent, still writing, or a
// different parent or tokens: never served). It changes nothing but the
// hit counter.
func (p *Pool) Lookup(d, parent tier.Digest, tokens []int32) (h PageID, ok bool) {
	x, ok := p.index[d]
	if !ok {
		return 0, false
	}
	e := &p.ents[x]
	if e.state != stReady || e.parent != parent || !slices.Equal(p.Tokens(PageID(x)), tokens) {
		return 0, false
	}
	p.counters.Hits++
	return PageID(x), true
}

// Acquire adds a reader to ready page h (an onload copy in flight): it is
// not reclaimed until every reader has called [Pool.Release].
func (p *Pool) Acquire(h PageID) error {
	if err := p.want("acquire", h, stReady); err != nil {
		return err
	}
	e := &p.ents[h]
	if e.readers == 0 {
		p.lru.Remove(int32(h))
	}
	if e.dur > 0 {
		p.lapses.Set(int32(h), p.now+e.dur) // a use restarts the count
	}
	e.readers++
	p.nReaders++
	p.check(int32(h))
	return nil
}

// Release removes a reader from page h; with none left it becomes the most
// recently used reclaimable page.
func (p *Pool) Release(h PageID) error {
	if err := p.want("release", h, stReady); err != nil {
		return err
	}
	e := &p.ents[h]
	if e.readers == 0 {
		return fmt.Errorf("%w: release host page %d without readers", ErrBadPage, h)
	}
	e.readers--
	p.nReaders--
	if e.readers == 0 {
		p.lru.Push(int32(h), int(e.level), 0)
	}
	p.check(int32(h))
	return nil
}

// SetRetention gives writing or ready page h retention r: its level (a
// reclaimable page moves to the tail of its new level's queue), its
// continuation hint, and, with a duration, the deadline r.Left after the
// pool's time at which the level lapses to 0. r is checked
// (tier.Retention.Check) and its level must be below Levels; on an error
// nothing changes.
func (p *Pool) SetRetention(h PageID, r tier.Retention) error {
	if h < 0 || int(h) >= len(p.ents) || p.ents[h].state == stFree {
		return fmt.Errorf("%w: retention of host page %d, which is free or outside the pool [0, %d)", ErrBadPage, h, len(p.ents))
	}
	if err := r.Check(); err != nil {
		return fmt.Errorf("%w: host page %d: %w", ErrBadPage, h, err)
	}
	if int(r.Priority) >= p.lru.Levels() {
		return fmt.Errorf("%w: host page %d: retention priority %d, want 0..%d", ErrBadPage, h, r.Priority, p.lru.Levels()-1)
	}
	e := &p.ents[h]
	if r.Priority == 0 {
		r.Duration, r.Left = 0, 0 // level 0 has nothing to lapse
	}
	e.hint, e.dur = r.Hint, r.Duration
	if r.Duration > 0 {
		p.lapses.Set(int32(h), p.now+r.Left)
	} else {
		p.lapses.Remove(int32(h))
	}
	p.relevel(int32(h), r.Priority)
	p.check(int32(h))
	return nil
}

// relevel moves page h to level (the tail of its queue when reclaimable).
func (p *Pool) relevel(h int32, level uint8) {
	e := &p.ents[h]
	if e.level == level {
		return
	}
	queued := p.lru.Queued(h)
	if queued {
		p.lru.Remove(h)
	}
	e.level = level
	if queued {
		p.lru.Push(h, int(level), 0)
	}
}

// Retention returns writing or ready page h's retention at the pool's
// time: its level, hint, duration and what is left of it (zero for a free
// page).
func (p *Pool) Retention(h PageID) tier.Retention {
	if h < 0 || int(h) >= len(p.ents) || p.ents[h].state == stFree {
		return tier.Retention{}
	}
	e := &p.ents[h]
	r := tier.Retention{Priority: e.level, Hint: e.hint, Duration: e.dur}
	if at, ok := p.lapses.Deadline(int32(h)); ok {
		r.Left = at - p.now
	}
	return r
}

// Advance sets the pool's time to now (an earlier time is taken as the
// current one) and lapses, earliest deadline first (ties: lowest page),
// the levels whose deadline it has reached: each such page drops to level
// 0 (the tail of its queue when reclaimable). It returns how many lapsed.
// O(log n) per lapse; nothing allocates.
func (p *Pool) Advance(now time.Duration) int {
	p.now = max(p.now, now)
	n := 0
	for {
		h, ok := p.lapses.Due(p.now)
		if !ok {
			return n
		}
		p.lapses.Remove(h)
		p.ents[h].dur = 0
		p.relevel(h, 0)
		p.counters.Lapsed++
		p.check(h)
		n++
	}
}

// Now is the pool's time: the latest Advance.
func (p *Pool) Now() time.Duration { return p.now }

func (p *Pool) want(op string, h PageID, st uint8) error {
	if h < 0 || int(h) >= len(p.ents) {
		return fmt.Errorf("%w: %s host page %d outside the pool [0, %d)", ErrBadPage, op, h, len(p.ents))
	}
	if got := p.ents[h].state; got != st {
		return fmt.Errorf("%w: %s host page %d, which is %s (want %s)", ErrBadPage, op, h, stateName(got), stateName(st))
	}
	return nil
}

func stateName(st uint8) string {
	switch st {
	case stFree:
		return "free"
	case stWriting:
		return "writing"
	}
	return "ready"
}

// check verifies page h in invariants builds.
func (p *Pool) check(h int32) {
	if !invariants.Enabled {
		return
	}
	if err := p.checkEntry(h); err != nil {
		panic(err.Error())
	}
}

func (p *Pool) checkEntry(h int32) error {
	e := &p.ents[h]
	x, indexed := p.index[e.digest]
	onLRU := p.lru.Queued(h)
	switch e.state {
	case stFree:
		if e.readers != 0 || onLRU || (indexed && x == h) {
			return fmt.Errorf("host: free page %d has readers %d, is on the LRU list (%v) or has an index entry", h, e.readers, onLRU)
		}
	case stWriting:
		if !indexed || x != h || e.readers != 0 || onLRU {
			return fmt.Errorf("host: writing page %d: indexed %v (as %d), readers %d, on the LRU list %v", h, indexed, x, e.readers, onLRU)
		}
	case stReady:
		if !indexed || x != h || e.readers < 0 || onLRU != (e.readers == 0) {
			return fmt.Errorf("host: ready page %d: indexed %v (as %d), readers %d, on the LRU list %v", h, indexed, x, e.readers, onLRU)
		}
	default:
		return fmt.Errorf("host: page %d in state %d", h, e.state)
	}
	if err := p.lru.CheckSlot(h); err != nil {
		return fmt.Errorf("host: %w", err)
	}
	if level, _, ok := p.lru.Position(h); ok && level != int(e.level) {
		return fmt.Errorf("host: page %d of level %d is queued at level %d", h, e.level, level)
	}
	at, timed := p.lapses.Deadline(h)
	switch {
	case timed != (e.state != stFree && e.dur > 0):
		return fmt.Errorf("host: page %d (%s, duration %v) on the lapse heap: %v", h, stateName(e.state), e.dur, timed)
	case timed && (e.level == 0 || at <= p.now || at > p.now+e.dur):
		return fmt.Errorf("host: page %d of level %d lapses at %v, the pool's time is %v and its duration %v", h, e.level, at, p.now, e.dur)
	case e.state == stFree && (e.level != 0 || e.hint != 0):
		return fmt.Errorf("host: free page %d keeps retention level %d hint %d", h, e.level, e.hint)
	}
	return nil
}

// CheckInvariants checks every invariant of the package doc and returns the
// first violation.
func (p *Pool) CheckInvariants() error {
	onFree := make([]bool, len(p.ents))
	for _, h := range p.free {
		if h < 0 || int(h) >= len(p.ents) || onFree[h] || p.ents[h].state != stFree {
			return fmt.Errorf("host: free stack entry %d is out of range, repeated or not free", h)
		}
		onFree[h] = true
	}
	if err := p.lru.CheckInvariants(); err != nil {
		return fmt.Errorf("host: LRU list: %w", err)
	}
	if err := p.lapses.Check(); err != nil {
		return fmt.Errorf("host: %w", err)
	}
	var writing, ready int
	var readers int64
	for h := range p.ents {
		e := &p.ents[h]
		if err := p.checkEntry(int32(h)); err != nil {
			return err
		}
		switch e.state {
		case stFree:
			if !onFree[h] {
				return fmt.Errorf("host: free page %d is not on the free stack", h)
			}
		case stWriting:
			writing++
		case stReady:
			ready++
			readers += int64(e.readers)
		}
	}
	if writing != p.nWriting || ready != p.nReady || readers != p.nReaders || len(p.index) != writing+ready {
		return fmt.Errorf("host: counted %d writing, %d ready, %d readers, %d indexed; counters say %d, %d, %d",
			writing, ready, readers, len(p.index), p.nWriting, p.nReady, p.nReaders)
	}
	return nil
}

// InUse returns the pages that are not free.
func (p *Pool) InUse() int { return len(p.ents) - len(p.free) }
