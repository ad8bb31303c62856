package pagedkv

import (
	"math"
	"slices"

	"github.com/pagedkv/pagedkv/cascade"
	"github.com/pagedkv/pagedkv/layergroup"
)

// cascadePlanner turns a step's page lists into a multi-level cascade
// layout when requests share enough prefix pages to be worth it.
//
// Requests share a page when they hold the same physical page (a prefix
// reused from the cache, or a fork), and because every sharing request's
// pages start at the same token (token 0, or for a chunked group the start
// of the chunk both are in), two
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
//
// Every buffer, the tree's nodes and the returned layout included, is kept
// from step to step, so once the planner has seen a batch of a given shape
// it plans it again without allocating. The layout is therefore valid only
// until the next plan (the next Reserve).
type cascadePlanner struct {
	// mark[p] == epoch when page p was seen as some request's first page in
	// the current plan: the allocation-free test for "nothing is shared".
	mark  []uint64
	epoch uint64

	// The current plan's inputs.
	p        *Plan
	ps       int32
	minSaved int
	maxSeq   int32 // a request holding more keys (SeqLens) shares nothing

	order   []int           // batch indices, sorted by page list
	lcp     []int           // lcp[k]: pages order[k-1] and order[k] may share and do
	covered []bool          // by position in order: the request has its leaf
	leaves  []planLeaf      // in the order they were made
	nodes   []*cascade.Node // the node pool; nodes[:used] are this plan's
	used    int
	kept    int // shared segments that became nodes

	builder cascade.Builder
	layout  cascade.Layout
	windows []int // the layout's per-level window_left (Plan.CascadeWindowLeft)
}

// planLeaf is a request's own node (its remaining pages) with the node it
// hangs from and that node's depth below the root.
type planLeaf struct {
	parent *cascade.Node
	depth  int
	node   *cascade.Node
}

func (c *cascadePlanner) init(numPages int) { c.mark = make([]uint64, numPages) }

// plan returns the cascade layout of m's current plan, or nil for flat. The
// layout is the planner's own and is overwritten by the next plan.
//
// A full or MLA group shares any common prefix. A windowed group shares
// only what every row of every sharing request sees in full (see
// docs/manager.md, "Cascade with windows"):
//
//   - sliding window W: a request takes part in sharing only while it holds
//     at most W keys after the step's append (SeqLens <= W). Its pages then
//     start at token 0 and its last row, at seq_len-1, reads from
//     seq_len-W <= 0, so every row sees every held key; a request holding more
//     has a first held page with a key some row must not see, which no
//     level's window_left can mask per row, and keeps all its pages on the
//     last level, where window_left W-1 is exact;
//   - chunked attention of C tokens: the plan is a cascade only if every
//     request holds at most C keys (all its rows in the chunk its pages
//     start at, so its attention is causal over its held pages, window -1);
//     a request whose rows cross a chunk needs two attention ranges, which
//     one leaf cannot express, so then the whole plan stays flat.
func (c *cascadePlanner) plan(m *group, minSaved int) *cascade.Layout {
	switch m.layerGroup.Kind {
	case layergroup.Sliding:
		return c.planFor(&m.plan, m.pageSize, minSaved, m.layerGroup.WindowTokens)
	case layergroup.Chunked:
		for _, n := range m.plan.SeqLens {
			if int(n) > m.layerGroup.ChunkTokens {
				return nil
			}
		}
	}
	return c.planFor(&m.plan, m.pageSize, minSaved, math.MaxInt32)
}

// planFor is plan over the flat arrays of p (Requests, QOIndptr, KVIndptr,
// KVPageIndices, KVLastPageLen, SeqLens), with page ids < len(c.mark): a
// request with SeqLens > maxSeq shares no page.
func (c *cascadePlanner) planFor(p *Plan, pageSize, minSaved, maxSeq int) *cascade.Layout {
	nb := len(p.Requests)
	if nb < 2 {
		return nil
	}
	c.maxSeq = int32(min(maxSeq, math.MaxInt32))
	c.epoch++
	shared := false
	for b := range nb {
		if lo, hi := p.KVIndptr[b], p.KVIndptr[b+1]; hi > lo && p.SeqLens[b] <= c.maxSeq {
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

	// Slow path: some prefix is shared.
	c.p, c.ps, c.minSaved = p, int32(pageSize), minSaved
	c.order = c.order[:0]
	for b := range nb {
		c.order = append(c.order, b)
	}
	slices.SortStableFunc(c.order, func(x, y int) int { return slices.Compare(c.pages(x), c.pages(y)) })
	c.lcp = append(c.lcp[:0], 0)
	for k := 1; k < nb; k++ {
		a, b := c.pages(c.order[k-1]), c.pages(c.order[k])
		n := min(c.shareable(c.order[k-1]), c.shareable(c.order[k]))
		i := 0
		for i < n && a[i] == b[i] {
			i++
		}
		c.lcp = append(c.lcp, i)
	}

	// Emit kept runs as cascade nodes; collect each request's leaf.
	c.covered = append(c.covered[:0], make([]bool, nb)...)
	c.leaves = c.leaves[:0]
	c.used, c.kept = 0, 0
	root := c.node()
	c.emitRuns(0, nb, 0, root, 0, 0)
	if c.kept == 0 {
		c.release()
		return nil
	}
	for k := range nb {
		if !c.covered[k] {
			c.addLeaf(k, root, 0, 0)
		}
	}
	// Every request's own pages must be on the last level (the only causal
	// one), so pad shallower leaves with empty nodes (groups without pages).
	deepest := 0
	for _, l := range c.leaves {
		deepest = max(deepest, l.depth)
	}
	for _, l := range c.leaves {
		at := l.parent
		for range deepest - l.depth {
			e := c.node()
			at.Children = append(at.Children, e)
			at = e
		}
		at.Children = append(at.Children, l.node)
	}
	// One segment shared by the whole batch is level 0 itself.
	if len(root.Children) == 1 && len(root.Requests) == 0 {
		root = root.Children[0]
	}
	if err := c.builder.BuildTo(&c.layout, root, pageSize); err != nil {
		panic("pagedkv: cascade plan: " + err.Error())
	}
	c.release()
	return &c.layout
}

// pages are request b's pages.
func (c *cascadePlanner) pages(b int) []int32 {
	return c.p.KVPageIndices[c.p.KVIndptr[b]:c.p.KVIndptr[b+1]]
}

// shareable is how many of request b's pages may be shared: those before
// its first query token, none when it holds more than maxSeq keys.
func (c *cascadePlanner) shareable(b int) int {
	if c.p.SeqLens[b] > c.maxSeq {
		return 0
	}
	qo := c.p.QOIndptr[b+1] - c.p.QOIndptr[b]
	return int((c.p.SeqLens[b] - qo) / c.ps)
}

// emitRuns emits every run of two or more requests in order[lo:hi] that
// share more than depth pages (adjacent lcp > depth) under parent, which is
// at the given depth below the root and whose segment ends at page
// segStart.
func (c *cascadePlanner) emitRuns(lo, hi, depth int, parent *cascade.Node, nodeDepth, segStart int) {
	for k := lo; k < hi; {
		j, end := k+1, math.MaxInt
		for j < hi && c.lcp[j] > depth {
			end = min(end, c.lcp[j])
			j++
		}
		if j-k >= 2 {
			c.emitRun(k, j, end, parent, nodeDepth, segStart)
		}
		k = j
	}
}

// emitRun emits the run order[lo:hi], which shares its first end pages: a
// node for pages [segStart, end) if the saving pays, then its sub-runs,
// then a leaf for each of its requests no sub-run covered.
func (c *cascadePlanner) emitRun(lo, hi, end int, parent *cascade.Node, nodeDepth, segStart int) {
	if g := hi - lo; (g-1)*(end-segStart) >= c.minSaved {
		n := c.node()
		n.Pages, n.LastPageLen = c.pages(c.order[lo])[segStart:end], c.ps
		parent.Children = append(parent.Children, n)
		parent, nodeDepth, segStart = n, nodeDepth+1, end
		c.kept++
	}
	c.emitRuns(lo, hi, end, parent, nodeDepth, segStart)
	for k := lo; k < hi; k++ {
		if !c.covered[k] {
			c.addLeaf(k, parent, nodeDepth, segStart)
		}
	}
}

// addLeaf makes the leaf of request order[k]: its pages from page from on.
func (c *cascadePlanner) addLeaf(k int, parent *cascade.Node, depth, from int) {
	b := c.order[k]
	n := c.node()
	n.Requests = append(n.Requests, cascade.Request{ID: b, QOLen: int(c.p.QOIndptr[b+1] - c.p.QOIndptr[b])})
	if pg := c.pages(b); from < len(pg) {
		n.Pages, n.LastPageLen = pg[from:], c.p.KVLastPageLen[b]
	}
	c.leaves = append(c.leaves, planLeaf{parent: parent, depth: depth, node: n})
	c.covered[k] = true
}

// node returns an empty node from the pool.
func (c *cascadePlanner) node() *cascade.Node {
	if c.used == len(c.nodes) {
		c.nodes = append(c.nodes, &cascade.Node{})
	}
	n := c.nodes[c.used]
	c.used++
	n.Pages, n.LastPageLen, n.Children, n.Requests = nil, 0, n.Children[:0], n.Requests[:0]
	return n
}

// release drops the references the scratch holds into the plan.
func (c *cascadePlanner) release() {
	c.p = nil
	for _, n := range c.nodes[:c.used] {
		n.Pages = nil
	}
	clear(c.leaves)
}
