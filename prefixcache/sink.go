package prefixcache

import "encoding/binary"

// Sink observes every change of a cache's page set, as it happens: a page
// published ([Cache.Publish] adding it) or removed (eviction). It is the
// seam for KV-cache events (package events); a nil [Config.Sink] costs one
// branch per change.
//
// The cache calls a Sink from inside Publish and Evict, on the cache's own
// goroutine, after the change is committed. A Sink must not call back into
// the cache, must not keep tokens past the call (the slice is the caller's
// or the cache's), and should not allocate: it runs on the engine's step.
type Sink interface {
	// PageStored reports that page now holds tokens (PageSize of them) at
	// chain hash hash. parent is the page before it in the prefix and
	// parentHash its chain hash; at depth 0 parent is -1 and parentHash the
	// namespace's seed h_{-1}. key is the namespace (meaningful at depth 0;
	// deeper pages inherit their root's).
	PageStored(page PageID, hash uint64, parent PageID, parentHash uint64, key Key, tokens []int32)
	// PageRemoved reports that page, which had chain hash hash, left the
	// cache. A subtree is removed children first.
	PageRemoved(page PageID, hash uint64)
}

// Hasher computes the cache's hash chain outside a cache: a router that
// knows the seed (and the page size) derives, from a request's tokens and
// namespace, the same chain hashes the cache publishes, without the engine.
// The zero Hasher is not usable; call [NewHasher].
type Hasher struct {
	seed uint64
	fn   HashFunc
}

// NewHasher returns the hash chain of a cache built with Config.Seed = seed
// and Config.Hash = fn (nil for the default). seed must be the cache's
// actual seed, so it must not be 0 (a cache given 0 picks a random one; see
// [Cache.Seed]).
func NewHasher(seed uint64, fn HashFunc) Hasher { return Hasher{seed: seed, fn: fn} }

// Namespace returns h_{-1}, the seed of every chain in ns.
func (h Hasher) Namespace(ns Namespace) uint64 { return hashBytes(h.seed, []byte(ns.encode())) }

// Page chains one page: the hash of a prefix whose previous pages hash to
// prev and whose next page holds tokens.
func (h Hasher) Page(prev uint64, tokens []int32) uint64 {
	if h.fn != nil {
		return h.fn(prev, tokens)
	}
	return hashTokens(h.seed, prev, tokens)
}

// Chain appends to dst the chain hashes h_0 .. h_{n-1} of the n =
// len(tokens)/pageSize full pages of tokens in namespace ns and returns it.
// pageSize must be >= 1.
func (h Hasher) Chain(dst []uint64, ns Namespace, pageSize int, tokens []int32) []uint64 {
	prev := h.Namespace(ns)
	for i := 0; i+pageSize <= len(tokens); i += pageSize {
		prev = h.Page(prev, tokens[i:i+pageSize])
		dst = append(dst, prev)
	}
	return dst
}

// Seed returns the seed of the cache's hash chain (the one it picked when
// Config.Seed was 0).
func (c *Cache) Seed() uint64 { return c.seed }

// Namespace decodes the namespace a Key was made from. The strings share
// the Key's memory: it does not allocate.
func (k Key) Namespace() Namespace {
	var ns Namespace
	s := k.id
	for len(s) > 0 {
		tag := s[0]
		n, w := binary.Uvarint([]byte(s[1:min(len(s), 1+binary.MaxVarintLen64)]))
		if w <= 0 || uint64(len(s)-1-w) < n {
			return ns // not an encoding made by encode; cannot happen for a Key from Cache.Key
		}
		f := s[1+w : 1+w+int(n)]
		switch tag {
		case 'T':
			ns.Tenant = f
		case 'L':
			ns.LoRA = f
		case 'S':
			ns.Salt = f
		}
		s = s[1+w+int(n):]
	}
	return ns
}

// AppendHashes appends the chain hash of every cached page to dst, in page
// order, and returns it: the cache's page set as a router sees it.
func (c *Cache) AppendHashes(dst []uint64) []uint64 {
	for p := range c.nodes {
		if c.nodes[p].cached() {
			dst = append(dst, c.nodes[p].hash)
		}
	}
	return dst
}

// PageHash returns cached page p's chain hash and its parent's; at depth 0
// root is true and parentHash is 0 (the namespace's seed is
// [Key.Hash]). ok is false when p is not in the cache. The Manager's tiers use it to name the pages they
// copy below the device in KV events.
func (c *Cache) PageHash(p PageID) (hash, parentHash uint64, root, ok bool) {
	if !c.Cached(p) {
		return 0, 0, false, false
	}
	n := &c.nodes[p]
	if n.parent == none {
		return n.hash, 0, true, true
	}
	return n.hash, c.nodes[n.parent].hash, false, true
}
