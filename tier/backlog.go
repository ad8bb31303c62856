package tier

import (
	"context"
	"sync"
	"sync/atomic"
)

// Backlog counts the pages a store's background writer has yet to write,
// so that a Flush can wait for them. Safe for concurrent use.
type Backlog struct {
	mu   sync.Mutex
	idle sync.Cond // signalled when n reaches 0
	n    int
}

// Add counts n more pages queued.
func (b *Backlog) Add(n int) {
	b.mu.Lock()
	b.n += n
	b.mu.Unlock()
}

// Done counts n queued pages written (or failed).
func (b *Backlog) Done(n int) {
	b.mu.Lock()
	b.n -= n
	if b.n == 0 && b.idle.L != nil {
		b.idle.Broadcast()
	}
	b.mu.Unlock()
}

// Wait waits until no page is queued, or returns ctx's error. idle, if
// not nil, then runs before Wait returns, with the backlog still empty
// (Add waits for it): a writer that takes pages only after they are added
// is idle throughout.
func (b *Backlog) Wait(ctx context.Context, idle func()) error {
	stop := context.AfterFunc(ctx, func() {
		b.mu.Lock()
		if b.idle.L != nil {
			b.idle.Broadcast()
		}
		b.mu.Unlock()
	})
	defer stop()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.idle.L == nil {
		b.idle.L = &b.mu
	}
	for b.n > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		b.idle.Wait()
	}
	if idle != nil {
		idle()
	}
	return nil
}

// Queue counts j in b, then sends it on queue, in that order so that a
// Flush never misses a queued page. The send never blocks: a write-behind
// store makes at most cap(queue) jobs.
func Queue[J any](b *Backlog, queue chan<- J, j J) {
	b.Add(1)
	queue <- j
}

// CloseQueue marks a write-behind store closed (closed, guarded by mu,
// which its Store holds while queueing) and closes its queue, once: it
// reports whether this call did, so that a second Close does nothing.
func CloseQueue[J any](mu *sync.Mutex, closed *bool, queue chan J) bool {
	mu.Lock()
	defer mu.Unlock()
	if *closed {
		return false
	}
	*closed = true
	close(queue)
	return true
}

// RemoteCounters are a store's [RemoteStats] as atomics; safe for
// concurrent use.
type RemoteCounters struct {
	Lookups, Requested, Hits, Misses, Rejected, Errors, Timeouts atomic.Int64
	Stored, Dropped, BytesIn, BytesOut                           atomic.Int64
}

// Lookup counts a Fetch of n pages (a lookup and n requested pages); it is
// false, counting nothing, when n is 0: a Fetch of no pages asks nothing.
func (c *RemoteCounters) Lookup(n int) bool {
	if n == 0 {
		return false
	}
	c.Lookups.Add(1)
	c.Requested.Add(int64(n))
	return true
}

// Snapshot reads every counter.
func (c *RemoteCounters) Snapshot() RemoteStats {
	return RemoteStats{
		Lookups: c.Lookups.Load(), Requested: c.Requested.Load(), Hits: c.Hits.Load(), Misses: c.Misses.Load(),
		Rejected: c.Rejected.Load(), Errors: c.Errors.Load(), Timeouts: c.Timeouts.Load(),
		Stored: c.Stored.Load(), Dropped: c.Dropped.Load(), BytesIn: c.BytesIn.Load(), BytesOut: c.BytesOut.Load(),
	}
}

// Plus returns s and o added field by field; Recent keeps s's entries,
// then o's, as many as fit.
func (s RemoteStats) Plus(o RemoteStats) RemoteStats {
	sum := RemoteStats{
		Lookups: s.Lookups + o.Lookups, Requested: s.Requested + o.Requested, Hits: s.Hits + o.Hits, Misses: s.Misses + o.Misses,
		Rejected: s.Rejected + o.Rejected, Errors: s.Errors + o.Errors, Timeouts: s.Timeouts + o.Timeouts,
		Stored: s.Stored + o.Stored, Dropped: s.Dropped + o.Dropped, BytesIn: s.BytesIn + o.BytesIn, BytesOut: s.BytesOut + o.BytesOut,
	}
	for r := range sum.RejectedBy {
		sum.RejectedBy[r] = s.RejectedBy[r] + o.RejectedBy[r]
	}
	n := 0
	for _, e := range append(s.Recent[:], o.Recent[:]...) {
		if e.Count != 0 && n < len(sum.Recent) {
			sum.Recent[n] = e
			n++
		}
	}
	return sum
}
