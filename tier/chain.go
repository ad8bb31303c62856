package tier

import (
	"context"
	"crypto/sha256"
)

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
	return c.fetch(ctx, pages, nil)
}

// FetchMedia is Fetch that names the store that served each page
// ([MediaFetcher]).
func (c chain) FetchMedia(ctx context.Context, pages []RemotePage, media []Medium) int {
	return c.fetch(ctx, pages, media[:len(pages)])
}

// fetch is Fetch, setting media (when not nil) as FetchMedia does.
func (c chain) fetch(ctx context.Context, pages []RemotePage, media []Medium) int {
	done := 0
	for i, s := range c {
		if done == len(pages) || ctx.Err() != nil {
			break
		}
		var n int
		if media != nil {
			n = FetchMedia(ctx, s, pages[done:], media[done:])
		} else {
			n = max(0, min(s.Fetch(ctx, pages[done:]), len(pages)-done))
		}
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

// GroupRoot returns the digest a layer group's chains start from: the
// namespace root d (NamespaceRoot) followed by the group's identity tag
// (a HybridManager's group tag: docs/tiers.md, "Hybrid groups"), so two
// groups never share a digest.
func GroupRoot(d Digest, tag string) Digest {
	h := sha256.New()
	h.Write([]byte("pagedkv/tier/group/v1"))
	h.Write(d[:])
	h.Write([]byte(tag))
	var out Digest
	h.Sum(out[:0])
	return out
}

// StateParent returns the parent digest of a state checkpoint's page in
// the state group of tag: e is the namespace chain's digest (Next from
// NamespaceRoot) after every page of the checkpoint's prefix but its
// last; the page's digest is Next(StateParent(e, tag), last page's
// tokens) (docs/state-groups.md, "Tiers"). The state domain keeps it
// apart from every page digest.
func StateParent(e Digest, tag string) Digest {
	h := sha256.New()
	h.Write([]byte("pagedkv/tier/state/v1"))
	h.Write(e[:])
	h.Write([]byte(tag))
	var out Digest
	h.Sum(out[:0])
	return out
}
