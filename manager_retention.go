package pagedkv

import (
	"fmt"
	"time"
)

// Session is what the engine knows of a conversation's future: whether
// the request's chain will be sent again.
type Session uint8

// The sessions.
const (
	// SessionUnknown leaves a page's continuation hint as it is.
	SessionUnknown Session = iota
	// SessionContinues: the chain will be sent again (a client that keeps
	// a conversation open); its pages are hinted [HintReuse].
	SessionContinues
	// SessionEnded: the chain will not be sent again (the conversation or
	// agent run is over); its pages are hinted [HintNoReuse].
	SessionEnded
	numSessions
)

// hint is the continuation hint s stands for (HintNone: none to set).
func (s Session) hint() Hint {
	switch s {
	case SessionContinues:
		return HintReuse
	case SessionEnded:
		return HintNoReuse
	}
	return HintNone
}

// Retention is what the engine tells the cache about some tokens' pages
// (TensorRT-LLM's retention priority and duration, Anthropic's and
// Dynamo's cache_control {ephemeral, ttl}). See docs/manager.md,
// "Retention hints".
type Retention struct {
	// Priority is the eviction level of the pages (0..Config.Priorities-1;
	// higher is kept longer): no page is evicted while a page of a lower
	// level is evictable, under every policy. It replaces the page's
	// level (the latest hint wins).
	Priority Priority
	// Duration, when > 0, makes Priority lapse: once a page has stayed
	// idle (no request holds it) for Duration on Config.Clock, it drops to
	// level 0. Every use restarts the count. 0: no lapse.
	Duration time.Duration
	// Ephemeral keeps the pages out of the prefix cache (reasoning tokens
	// that will not be sent again): a request publishes no page that
	// holds an ephemeral token, nor any page after it (a cached page
	// needs its whole prefix cached).
	Ephemeral bool
	// Session sets the pages' continuation hint (read by the "adaptive"
	// policy; see [Manager.HintContinuation]).
	Session Session
}

// RetentionRange applies a Retention to the pages that hold any of the
// request's tokens [Start, End) (End 0: to the end, tokens still to come
// included). Where ranges overlap on a page, the later range in the list
// wins, except that Ephemeral in any of them holds.
type RetentionRange struct {
	Start, End int
	Retention
}

// MaxRetentionRanges bounds the ranges of one request (each page's
// retention is resolved over them when it is published).
const MaxRetentionRanges = 64

// checkRetention validates ranges for request id in a pool of levels
// priority levels.
func checkRetention(op string, id RequestID, ranges []RetentionRange, levels int) error {
	if len(ranges) > MaxRetentionRanges {
		return fmt.Errorf("%w: %s request %d: %d retention ranges, want at most %d", ErrBadArgument, op, id, len(ranges), MaxRetentionRanges)
	}
	for i, r := range ranges {
		switch {
		case r.Start < 0 || r.Start > MaxRequestTokens:
			return fmt.Errorf("%w: %s request %d: retention range %d starts at token %d, want 0..%d", ErrBadArgument, op, id, i, r.Start, MaxRequestTokens)
		case r.End != 0 && (r.End <= r.Start || r.End > MaxRequestTokens):
			return fmt.Errorf("%w: %s request %d: retention range %d is tokens [%d, %d), want an end after the start, at most %d (or 0: to the end)",
				ErrBadArgument, op, id, i, r.Start, r.End, MaxRequestTokens)
		case int(r.Priority) >= levels:
			return fmt.Errorf("%w: %s request %d: retention range %d has priority %d, want 0..%d", ErrBadArgument, op, id, i, r.Priority, levels-1)
		case r.Duration < 0:
			return fmt.Errorf("%w: %s request %d: retention range %d lasts %v, want a duration >= 0", ErrBadArgument, op, id, i, r.Duration)
		case r.Session >= numSessions:
			return fmt.Errorf("%w: %s request %d: retention range %d has session %d, want 0..%d", ErrBadArgument, op, id, i, r.Session, numSessions-1)
		}
	}
	return nil
}

// pageRetention resolves the retention of page d of r (tokens [d*ps,
// (d+1)*ps)): ranged is false when no range covers it (the page keeps the
// request's priority and no lapse); ephemeral when any range that covers
// it is.
func pageRetention(r *request, d, ps int) (ret Retention, ranged, ephemeral bool) {
	lo, hi := d*ps, (d+1)*ps
	for i := range r.retention {
		x := &r.retention[i]
		if x.Start >= hi || x.End != 0 && x.End <= lo {
			continue
		}
		ret, ranged = x.Retention, true
		ephemeral = ephemeral || x.Ephemeral
	}
	return ret, ranged, ephemeral
}

// retainPage applies page d of r's retention to cached page p, if a range
// covers it.
func (m *group) retainPage(r *request, d int, p PageID) {
	ret, ranged, _ := pageRetention(r, d, m.pageSize)
	if !ranged {
		return
	}
	if err := m.cache.Retain(ret.Priority, ret.Duration, p); err != nil {
		panic(fmt.Sprintf("pagedkv: retention of request %d's page %d checked, refused by the cache: %v", r.id, d, err))
	}
	if h := ret.Session.hint(); h != HintNone {
		if err := m.cache.Hint(h, p); err != nil {
			panic(fmt.Sprintf("pagedkv: hint %d refused by the cache: %v", h, err))
		}
	}
}

// retainCached applies r's retention to its cached pages held from token
// r.start: pages [r.start/ps, r.cachedPages).
func (m *group) retainCached(r *request) {
	if !r.running || len(r.retention) == 0 {
		return
	}
	pages := m.table.Pages(r.seq())
	first := r.start / m.pageSize
	for d := first; d < r.cachedPages && d-first < len(pages); d++ {
		m.retainPage(r, d, pages[d-first])
	}
}

// ephemeralFrom reports whether page d of r holds an ephemeral token.
func (m *group) ephemeralFrom(r *request, d int) bool {
	if len(r.retention) == 0 {
		return false
	}
	_, _, eph := pageRetention(r, d, m.pageSize)
	return eph
}

// SetRetention replaces request id's retention ranges (Request.Retention)
// and applies them at once to the pages it holds in the cache; pages it
// publishes later take them when published, and a Resume applies them to
// the pages it matches. Call it between steps: after a Commit (the
// tokens just sampled), before a Resume, or before Release (a session
// that ended). nil clears the ranges (pages keep what they were given).
// It fails, changing nothing, with [ErrUnknownRequest], [ErrStepPending]
// or [ErrBadArgument] naming the bad range.
func (m *Manager) SetRetention(id RequestID, ranges []RetentionRange) error {
	return m.core.setRetention(id, ranges)
}

func (c *core) setRetention(id RequestID, ranges []RetentionRange) error {
	for _, g := range c.groups {
		if g.pending {
			return fmt.Errorf("%w: set retention of request %d", ErrStepPending, id)
		}
		if _, err := g.lookup("set retention of", id); err != nil {
			return err
		}
	}
	if err := checkRetention("set retention of", id, ranges, c.groups[0].cache.NumPriorities()); err != nil {
		return err
	}
	c.tickFor(ranges)
	for _, g := range c.groups {
		r := g.reqs[id]
		r.retention = append(r.retention[:0], ranges...)
		g.retainCached(r)
		g.afterChange()
	}
	return nil
}

// PinFor is [Manager.Pin] with a lifetime (a TTL pin, Anthropic's
// cache_control ttl): with ttl > 0 the pin lapses by itself once ttl has
// passed on Config.Clock since it was made or last refreshed, and every
// admission that matches the whole pinned prefix refreshes it. Lapsed
// pins are removed at the start of the Manager's next operation (no call
// is needed; an Unpin of one is ErrUnknownPin). Pins count against
// Config.PinBudget and Config.MaxPinnedPages: a pin past either is
// refused with ErrPinLimit naming the figures. ttl 0 is Pin.
func (m *Manager) PinFor(ns Namespace, tokens []int32, ttl time.Duration) (id PinID, pinnedTokens int, err error) {
	return m.core.pinFor(ns, tokens, ttl)
}

// tickFor is tick for an operation that gives ranges: the first range
// with a Duration starts the clock (c.timed) before the operation sets
// any deadline.
func (c *core) tickFor(ranges []RetentionRange) {
	for i := 0; !c.timed && i < len(ranges); i++ {
		c.timed = ranges[i].Duration > 0
	}
	c.tick()
}

// startClock starts the clock when a retention with a Duration arrives
// from below the device (a tier value's, a handoff's), as tickFor does for
// one the engine gives: the caches advance to now before the deadline is
// set. The first start cannot lapse anything (no deadline existed), so it
// is safe inside an operation.
func (c *core) startClock() {
	if !c.timed {
		c.timed = true
		c.tick()
	}
}

// clockOf returns cfg's clock, or a monotonic one from now.
func clockOf(cfg *Config) func() time.Duration {
	if cfg.Clock != nil {
		return cfg.Clock
	}
	start := time.Now()
	return func() time.Duration { return time.Since(start) }
}

// tick reads the clock once and advances every group's cache to it, so
// that what is due lapses (retention and TTL pins) before the operation
// that follows, the same in every group. Until a retention with a
// Duration or a TTL pin is given (c.timed) no deadline exists and none
// can start, so tick does nothing: the step reads no clock.
func (c *core) tick() {
	if !c.timed {
		return
	}
	now := c.clock()
	lapsed := false
	for _, m := range c.groups {
		pages, pins := m.cache.Advance(now)
		lapsed = lapsed || pages+pins > 0
	}
	if lapsed {
		c.afterChange()
	}
}
