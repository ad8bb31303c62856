package tier

import "context"

// Chain returns a [RemoteStore] that stacks stores below the host tier,
// nearest first: host → disk → Redis is Chain(disk, redis). The Manager
// takes one remote store; a chain is how it gets several.
//
// Fetch asks the first store for the whole prefix, the next store for the
// pages after the first one's hits, and so on, all under the caller's one
// deadline; pages a lower store served are stored into the stores above
// it (promotion), so the next lookup finds them nearer. Store hands a page
// to every store (write-through to each level) and reports whether any
// took it. Stats is the sum of the stores' counters.
//
// A chain is as safe for concurrent use as its stores.
func Chain(stores ...RemoteStore) RemoteStore {
	return chain(stores)
}

type chain []RemoteStore

func (c chain) Fetch(ctx context.Context, pages []RemotePage) int {
	done := 0
	for i, s := range c {
		if done == len(pages) || ctx.Err() != nil {
			break
		}
		n := s.Fetch(ctx, pages[done:])
		for _, above := range c[:i] {
			for k := done; k < done+n; k++ {
				above.Store(&pages[k])
			}
		}
		done += n
	}
	return done
}

func (c chain) Store(p *RemotePage) bool {
	took := false
	for _, s := range c {
		took = s.Store(p) || took
	}
	return took
}

func (c chain) Stats() RemoteStats {
	var sum RemoteStats
	for _, s := range c {
		sum = sum.Plus(s.Stats())
	}
	return sum
}
