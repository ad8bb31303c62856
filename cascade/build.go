package cascade

import (
	"fmt"
	"math"
)

// Builder is [Build] into reused memory: [Builder.BuildTo] writes a
// [Layout] into the caller's Layout, reusing its slices, and keeps its own
// scratch between calls, so once the builder and the destination have seen
// a tree of a given size, building a tree no larger allocates nothing. The
// zero Builder is ready to use. A Builder is not safe for concurrent use.
type Builder struct {
	seen   map[*Node]struct{}
	path   []*Node   // the walk's current root ... node
	order  []Request // requests in query order
	paths  []*Node   // order[k]'s path is paths[pathAt[k]:pathAt[k+1]]
	pathAt []int
	idSeen []bool
	levels []int // the tree depths that become levels, in order
}

// BuildTo is [Build] writing into dst: on success dst holds exactly the
// levels, request order and query counts Build would return, except that an
// empty slice (a level without pages) may be non-nil. The slices of dst are
// reused when large enough, so dst's previous contents, and any slice taken
// from them, are overwritten. On error dst is unchanged. See [Builder] for
// a builder that keeps its scratch too.
func BuildTo(dst *Layout, root *Node, pageSize int) error {
	var b Builder
	return b.BuildTo(dst, root, pageSize)
}

// BuildTo is [BuildTo] with b's scratch.
func (b *Builder) BuildTo(dst *Layout, root *Node, pageSize int) error {
	if pageSize <= 0 {
		return fmt.Errorf("%w: page_size %d <= 0", ErrInvalidTree, pageSize)
	}
	if root == nil {
		return fmt.Errorf("%w: nil root", ErrInvalidTree)
	}
	if b.seen == nil {
		b.seen = map[*Node]struct{}{}
	}
	clear(b.seen)
	b.path, b.order, b.paths, b.pathAt = b.path[:0], b.order[:0], b.paths[:0], append(b.pathAt[:0], 0)
	err := b.walk(root, pageSize)
	clear(b.seen) // do not keep the caller's nodes alive
	clear(b.path[:cap(b.path)])
	if err != nil {
		clear(b.paths[:cap(b.paths)])
		return err
	}

	// Validate the requests and size every level before touching dst.
	nr := len(b.order)
	b.idSeen = resize(b.idSeen, nr)
	clear(b.idSeen)
	depth := 0
	nnz := int64(0)
	for k, r := range b.order {
		id := r.ID
		switch {
		case id < 0 || id >= nr:
			return b.fail(fmt.Errorf("%w: request id %d outside [0, %d) (ids must be 0..requests-1)", ErrInvalidTree, id, nr))
		case b.idSeen[id]:
			return b.fail(fmt.Errorf("%w: request id %d appears twice", ErrInvalidTree, id))
		case r.QOLen < 0:
			return b.fail(fmt.Errorf("%w: request %d has qo_len %d < 0", ErrInvalidTree, id, r.QOLen))
		}
		b.idSeen[id] = true
		nnz += int64(r.QOLen)
		if nnz > math.MaxInt32 {
			return b.fail(fmt.Errorf("%w: more than 2^31-1 query rows", ErrInvalidTree))
		}
		depth = max(depth, b.pathAt[k+1]-b.pathAt[k])
	}
	if nr == 0 {
		return b.fail(fmt.Errorf("%w: the tree has no requests", ErrInvalidTree))
	}
	// A tree level whose groups hold no pages at all (the root of unrelated
	// prefixes, say) adds nothing but a launch and a merge of identity
	// states, so it is dropped; the last level is always kept, as it is the
	// only causal one.
	b.levels = b.levels[:0]
	for l := range depth {
		pages := int64(0)
		for k := 0; k < nr; {
			k1 := b.groupEnd(k, l, l == depth-1)
			if node := b.nodeAt(k, l); node != nil {
				pages += int64(len(node.Pages))
			}
			if pages > math.MaxInt32 {
				return b.fail(fmt.Errorf("%w: level %d has more than 2^31-1 pages", ErrInvalidTree, l))
			}
			k = k1
		}
		if pages > 0 || l == depth-1 {
			b.levels = append(b.levels, l)
		}
	}

	// Write dst.
	dst.QOLenByID = resize(dst.QOLenByID, nr)
	dst.RequestOrder = dst.RequestOrder[:0]
	dst.RequestQOIndptr = append(dst.RequestQOIndptr[:0], 0)
	for _, r := range b.order {
		dst.QOLenByID[r.ID] = r.QOLen
		dst.RequestOrder = append(dst.RequestOrder, r.ID)
		dst.RequestQOIndptr = append(dst.RequestQOIndptr, dst.RequestQOIndptr[len(dst.RequestQOIndptr)-1]+int32(r.QOLen))
	}
	dst.Levels = resize(dst.Levels, len(b.levels))
	for i, l := range b.levels {
		lv := &dst.Levels[i]
		lv.QOIndptr = append(lv.QOIndptr[:0], 0)
		lv.KVIndptr = append(lv.KVIndptr[:0], 0)
		lv.KVPageIndices = lv.KVPageIndices[:0]
		lv.KVLastPageLen = lv.KVLastPageLen[:0]
		last := l == depth-1
		for k := 0; k < nr; {
			k1 := b.groupEnd(k, l, last)
			var lastLen int32
			if node := b.nodeAt(k, l); node != nil {
				lv.KVPageIndices = append(lv.KVPageIndices, node.Pages...)
				lastLen = node.LastPageLen
			}
			lv.QOIndptr = append(lv.QOIndptr, dst.RequestQOIndptr[k1])
			lv.KVIndptr = append(lv.KVIndptr, int32(len(lv.KVPageIndices)))
			lv.KVLastPageLen = append(lv.KVLastPageLen, lastLen)
			k = k1
		}
	}
	clear(b.paths[:cap(b.paths)])
	return nil
}

// fail drops the scratch's references to the caller's nodes and returns err.
func (b *Builder) fail(err error) error {
	clear(b.paths[:cap(b.paths)])
	return err
}

// walk visits n's subtree depth-first (children in order, then n's own
// requests), appending each request and its path.
func (b *Builder) walk(n *Node, pageSize int) error {
	if n == nil {
		return fmt.Errorf("%w: nil child at depth %d", ErrInvalidTree, len(b.path))
	}
	if _, ok := b.seen[n]; ok {
		return fmt.Errorf("%w: a node is reachable twice (at depth %d); the prefix structure must be a tree", ErrInvalidTree, len(b.path))
	}
	b.seen[n] = struct{}{}
	if err := checkNode(n, pageSize, len(b.path)); err != nil {
		return err
	}
	b.path = append(b.path, n)
	for _, c := range n.Children {
		if err := b.walk(c, pageSize); err != nil {
			return err
		}
	}
	for _, r := range n.Requests {
		b.order = append(b.order, r)
		b.paths = append(b.paths, b.path...)
		b.pathAt = append(b.pathAt, len(b.paths))
	}
	b.path = b.path[:len(b.path)-1]
	return nil
}

// nodeAt is the node at depth l of request order[k]'s path, or nil if the
// path ends above l.
func (b *Builder) nodeAt(k, l int) *Node {
	if at := b.pathAt[k] + l; at < b.pathAt[k+1] {
		return b.paths[at]
	}
	return nil
}

// groupEnd returns the end of the level-l group that starts at order[k]:
// k alone on the last level or when k's path ends above l, else k and the
// following requests that share its node at depth l.
func (b *Builder) groupEnd(k, l int, last bool) int {
	k1 := k + 1
	node := b.nodeAt(k, l)
	if node == nil || last {
		return k1
	}
	for k1 < len(b.order) && b.nodeAt(k1, l) == node {
		k1++
	}
	return k1
}

// resize returns s with length n, reusing its array when large enough.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		s = append(s[:cap(s)], make([]T, n-cap(s))...)
	}
	return s[:n]
}
