package pagedkv

import (
	"slices"

	"github.com/pagedkv/pagedkv/cascade"
)

// cascadePlanner turns a step's page lists into a multi-level cascade
// layout when requests share enough prefix pages to be worth it.
//
// Requests share a page when they hold the same physical page (a prefix
// reused from the cache, or a fork), and because every request's pages
// start at its token 0 (cascade plans are for full attention only), two
// requests' common pages form a common prefix of their page lists. Sorting
// the lists makes every group of requests with a common prefix contiguous,
// and the common prefix of a contiguous run is the minimum of the adjacent
// common prefixes, so the sharing tree falls out of one sort and one pass.
//
// The cost model: reading a shared segment of s pages once for g requests
// instead of g times saves (g-1)*s page reads per layer, while every level
// costs one more kernel launch and a merge over all query rows. A segment
// becomes a level when (g-1)*s >= Config.CascadeMinSavedPages; a segment
// that does not qualify is pushed down into the segments below it (which
// then qualify more easily), and requests below no kept segment stay flat.
// If no segment qualifies the plan is flat (Plan.Cascade == nil).
//
// Only pages holding no query token of the step can be shared levels (the
// shared levels are not causal); copy-on-write already makes every page a
// step writes private.
type cascadePlanner struct {
	// mark[p] == epoch when page p was seen as some request's first page in
	// the current plan: the allocation-free test for "nothing is shared".
	mark  []uint64
	epoch uint64
}

func (c *cascadePlanner) init(numPages int) { c.mark = make([]uint64, numPages) }

// sharedRun is a run order[lo:hi] of requests (in sorted order) that share
// their first end pages; their common segment below the parent run starts at
// begin.
type sharedRun struct {
	lo, hi     int
	begin, end int // pages [begin, end)
	children   []*sharedRun
}

// plan returns the cascade layout of m's current plan, or nil for flat.
// The fast path (no request shares its first page with another) allocates
// nothing.
func (c *cascadePlanner) plan(m *Manager, minSaved int) *cascade.Layout {
	p := &m.plan
	nb := len(p.Requests)
	if nb < 2 {
		return nil
	}
	c.epoch++
	shared := false
	for b := range nb {
		if lo, hi := p.KVIndptr[b], p.KVIndptr[b+1]; hi > lo {
			pg := p.KVPageIndices[lo]
			if c.mark[pg] == c.epoch {
				shared = true
				break
			}
			c.mark[pg] = c.epoch
		}
	}
	if !shared {
		return nil
	}

	// Slow path: some prefix is shared. The pages of request b and how many
	// of them may be shared (those before its first query token).
	ps := int32(m.pageSize)
	pages := func(b int) []int32 { return p.KVPageIndices[p.KVIndptr[b]:p.KVIndptr[b+1]] }
	shareable := func(b int) int {
		qo := p.QOIndptr[b+1] - p.QOIndptr[b]
		return int((p.SeqLens[b] - qo) / ps)
	}
	order := make([]int, nb)
	for b := range order {
		order[b] = b
	}
	slices.SortStableFunc(order, func(x, y int) int { return slices.Compare(pages(x), pages(y)) })
	// lcp[k] = pages order[k-1] and order[k] share, within what both may share.
	lcp := make([]int, nb)
	for k := 1; k < nb; k++ {
		a, b := pages(order[k-1]), pages(order[k])
		n := min(shareable(order[k-1]), shareable(order[k]))
		i := 0
		for i < n && a[i] == b[i] {
			i++
		}
		lcp[k] = i
	}
	var runs func(lo, hi, depth int) []*sharedRun
	runs = func(lo, hi, depth int) []*sharedRun {
		var out []*sharedRun
		for k := lo; k < hi; {
			j, end := k+1, int(^uint(0)>>1)
			for j < hi && lcp[j] > depth {
				end = min(end, lcp[j])
				j++
			}
			if j-k >= 2 {
				r := &sharedRun{lo: k, hi: j, begin: depth, end: end}
				r.children = runs(k, j, end)
				out = append(out, r)
			}
			k = j
		}
		return out
	}

	// Emit kept runs as cascade nodes; collect each request's leaf (its
	// remaining pages) with the node it hangs from and its depth.
	type leaf struct {
		parent *cascade.Node
		depth  int
		node   *cascade.Node
	}
	leaves := make([]leaf, 0, nb)
	covered := make([]bool, nb) // by position in order
	kept := 0
	addLeaf := func(k int, parent *cascade.Node, depth, from int) {
		b := order[k]
		n := &cascade.Node{Requests: []cascade.Request{{ID: b, QOLen: int(p.QOIndptr[b+1] - p.QOIndptr[b])}}}
		if pg := pages(b); from < len(pg) {
			n.Pages, n.LastPageLen = pg[from:], p.KVLastPageLen[b]
		}
		leaves = append(leaves, leaf{parent: parent, depth: depth, node: n})
		covered[k] = true
	}
	var emit func(r *sharedRun, parent *cascade.Node, depth, segStart int)
	emit = func(r *sharedRun, parent *cascade.Node, depth, segStart int) {
		if g := r.hi - r.lo; (g-1)*(r.end-segStart) >= minSaved {
			n := &cascade.Node{Pages: pages(order[r.lo])[segStart:r.end], LastPageLen: ps}
			parent.Children = append(parent.Children, n)
			parent, depth, segStart = n, depth+1, r.end
			kept++
		}
		for _, ch := range r.children {
			emit(ch, parent, depth, segStart)
		}
		for k := r.lo; k < r.hi; k++ {
			if !covered[k] {
				addLeaf(k, parent, depth, segStart)
			}
		}
	}
	root := &cascade.Node{}
	for _, r := range runs(0, nb, 0) {
		emit(r, root, 0, 0)
	}
	if kept == 0 {
		return nil
	}
	for k := range nb {
		if !covered[k] {
			addLeaf(k, root, 0, 0)
		}
	}
	// Every request's own pages must be on the last level (the only causal
	// one), so pad shallower leaves with empty nodes (groups without pages).
	deepest := 0
	for _, l := range leaves {
		deepest = max(deepest, l.depth)
	}
	for _, l := range leaves {
		at := l.parent
		for range deepest - l.depth {
			e := &cascade.Node{}
			at.Children = append(at.Children, e)
			at = e
		}
		at.Children = append(at.Children, l.node)
	}
	// One segment shared by the whole batch is level 0 itself.
	if len(root.Children) == 1 && len(root.Requests) == 0 {
		root = root.Children[0]
	}
	lay, err := cascade.Build(root, m.pageSize)
	if err != nil {
		panic("pagedkv: cascade plan: " + err.Error())
	}
	return lay
}
