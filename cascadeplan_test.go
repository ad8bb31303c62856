package pagedkv

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/cascade"
)

// checkCascadeCoversPlan checks the cascade invariant against the flat
// arrays of the same plan: for every request, the pages of its groups,
// level 0 first, are exactly its flat page list; every level but the last
// holds only full pages before the request's first query token; and the
// last level's group is the request's own, with its last page length.
func checkCascadeCoversPlan(t testing.TB, p *Plan, pageSize int) {
	t.Helper()
	lay := p.Cascade
	nb := len(p.Requests)
	require.Len(t, lay.RequestOrder, nb)
	for k, b := range lay.RequestOrder {
		row := lay.RequestQOIndptr[k]
		qo := p.QOIndptr[b+1] - p.QOIndptr[b]
		require.Equal(t, qo, lay.RequestQOIndptr[k+1]-row, "request %d rows", b)
		var pages []int32
		for l, lv := range lay.Levels {
			g := -1
			for i := 0; i+1 < len(lv.QOIndptr); i++ {
				if lv.QOIndptr[i] <= row && (row < lv.QOIndptr[i+1] || qo == 0 && row == lv.QOIndptr[i+1]) {
					g = i
					break
				}
			}
			require.GreaterOrEqual(t, g, 0, "request %d has no group on level %d", b, l)
			seg := lv.KVPageIndices[lv.KVIndptr[g]:lv.KVIndptr[g+1]]
			last := l == len(lay.Levels)-1
			if last {
				require.Equal(t, lv.QOIndptr[g]+qo, lv.QOIndptr[g+1], "request %d: its last-level group holds other rows", b)
				if len(seg) > 0 {
					require.Equal(t, p.KVLastPageLen[b], lv.KVLastPageLen[g], "request %d last page length", b)
				}
			} else if len(seg) > 0 {
				require.Equal(t, int32(pageSize), lv.KVLastPageLen[g], "request %d: level %d segment ends in a partial page", b, l)
			}
			pages = append(pages, seg...)
			if !last {
				shared := len(pages) * pageSize
				require.LessOrEqual(t, shared, int(p.SeqLens[b]-qo), "request %d: a shared level holds one of its query tokens", b)
			}
		}
		require.Equal(t, p.KVPageIndices[p.KVIndptr[b]:p.KVIndptr[b+1]], pages, "request %d: cascade pages vs flat pages", b)
	}
}

// TestCascadeStepIsAllocationFreeInSteadyState pins the per-step hot path
// with a cascade plan: 32 requests share a 4-page system prompt and, in two
// halves, a 2-page branch; every decode step plans three levels (system
// prompt, branch, own pages), and once a generation of requests has grown
// the buffers, Reserve + Commit allocate nothing.
func TestCascadeStepIsAllocationFreeInSteadyState(t *testing.T) {
	const ps, nreq = 16, 32
	m := mustNew(t, Config{NumPages: 4096, PageSize: ps, HashSeed: 1})
	ids := make([]RequestID, nreq)
	ones := make([]int32, nreq)
	sampled := make([]int32, nreq)
	var plan *Plan
	decode := func() {
		p, err := m.Reserve(ids, ones)
		if err != nil {
			panic(err)
		}
		plan = p
		if err := m.Commit(sampled); err != nil {
			panic(err)
		}
	}
	for gen := range 2 {
		for i := range ids {
			if gen > 0 {
				require.NoError(t, m.Release(ids[i]))
			}
			ids[i], ones[i], sampled[i] = RequestID(gen*nreq+i), 1, 3
			prompt := concat(seqTokens(0, 4*ps), seqTokens(100000*(1+i%2), 2*ps), seqTokens(i*1000+gen, 8))
			_, err := m.Add(ids[i], Request{Prompt: prompt, CapacityTokens: 4096})
			require.NoError(t, err)
			for m.Computed(ids[i]) < len(m.Tokens(ids[i])) {
				step(t, m, ids[i:i+1], []int32{int32(min(16, len(m.Tokens(ids[i]))-m.Computed(ids[i])))}, nil)
			}
			require.NoError(t, m.Extend(ids[i], 1))
		}
		for range 300 {
			decode()
		}
	}
	require.NotNil(t, plan.Cascade)
	require.Len(t, plan.Cascade.Levels, 3)
	checkCascadeCoversPlan(t, plan, ps)
	require.Zero(t, testing.AllocsPerRun(200, decode))
	require.NoError(t, m.Audit())
}

// BenchmarkDecodeStepCascade: Reserve (then Abort, so every iteration plans
// the same step) of the decode step of
// TestCascadeStepIsAllocationFreeInSteadyState (a three-level cascade plan),
// next to the same batch with cascade planning off.
func BenchmarkDecodeStepCascade(b *testing.B) {
	for _, c := range []struct {
		name    string
		minSave int
	}{{"cascade", 0}, {"flat", -1}} {
		b.Run(c.name, func(b *testing.B) {
			const ps, nreq = 16, 32
			m := mustNew(b, Config{NumPages: 1024, PageSize: ps, HashSeed: 1, CascadeMinSavedPages: c.minSave})
			ids := make([]RequestID, nreq)
			ones := make([]int32, nreq)
			for i := range ids {
				ids[i], ones[i] = RequestID(i), 1
				prompt := concat(seqTokens(0, 4*ps), seqTokens(100000*(1+i%2), 2*ps), seqTokens(i*1000, 8))
				_, err := m.Add(ids[i], Request{Prompt: prompt, CapacityTokens: 256})
				require.NoError(b, err)
				for m.Computed(ids[i]) < len(m.Tokens(ids[i])) {
					step(b, m, ids[i:i+1], []int32{int32(min(16, len(m.Tokens(ids[i]))-m.Computed(ids[i])))}, nil)
				}
				require.NoError(b, m.Extend(ids[i], 1))
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := m.Reserve(ids, ones); err != nil {
					b.Fatal(err)
				}
				if err := m.Abort(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// randomSharingPlan makes the flat arrays of a step whose requests share
// prefixes: a random tree of full-page segments, each request below one of
// its nodes (or none) with 0..3 pages of its own, the last one partial, and
// 0..seq_len query tokens at the end. It returns the plan and the number of
// page ids used.
func randomSharingPlan(rng *rand.Rand, pageSize int) (*Plan, int) {
	nextPage := int32(0)
	fresh := func(n int) []int32 {
		out := make([]int32, n)
		for i := range out {
			out[i] = nextPage
			nextPage++
		}
		return out
	}
	paths := [][]int32{nil} // the pages from the root to each tree node
	for range rng.IntN(6) {
		parent := paths[rng.IntN(len(paths))]
		paths = append(paths, append(slices.Clip(parent), fresh(1+rng.IntN(4))...))
	}
	p := &Plan{QOIndptr: []int32{0}, KVIndptr: []int32{0}}
	for b := range 2 + rng.IntN(10) {
		pages := append(slices.Clip(paths[rng.IntN(len(paths))]), fresh(rng.IntN(4))...)
		seqLen, last := int32(0), int32(0)
		if len(pages) > 0 {
			last = int32(1 + rng.IntN(pageSize))
			seqLen = int32((len(pages)-1)*pageSize) + last
		}
		qo := int32(0)
		if seqLen > 0 {
			qo = int32(rng.IntN(int(min(seqLen, int32(2*pageSize))) + 1))
		}
		p.Requests = append(p.Requests, RequestID(b))
		p.QOIndptr = append(p.QOIndptr, p.QOIndptr[b]+qo)
		p.KVPageIndices = append(p.KVPageIndices, pages...)
		p.KVIndptr = append(p.KVIndptr, int32(len(p.KVPageIndices)))
		p.KVLastPageLen = append(p.KVLastPageLen, last)
		p.SeqLens = append(p.SeqLens, seqLen)
	}
	return p, int(nextPage)
}

// TestCascadePlannerEqualsReference: the planner, reused across random
// batches, returns the layout the first, allocating planner returned.
func TestCascadePlannerEqualsReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var c cascadePlanner
	c.init(0)
	cascades, checked := 0, 0
	for i := range 3000 {
		pageSize := 1 + rng.IntN(4)
		minSaved := rng.IntN(6)
		p, numPages := randomSharingPlan(rng, pageSize)
		if numPages > len(c.mark) {
			c.mark = append(c.mark, make([]uint64, numPages-len(c.mark))...)
		}
		want := referenceCascadePlan(p, pageSize, minSaved)
		got := c.planFor(p, pageSize, minSaved, math.MaxInt32)
		if want == nil {
			require.Nil(t, got, "batch %d: %+v", i, p)
			continue
		}
		cascades++
		require.NotNil(t, got, "batch %d: %+v", i, p)
		require.Equal(t, layoutNilEmpty(want), layoutNilEmpty(got), "batch %d: %+v", i, p)
		// checkCascadeCoversPlan finds a request's groups by its first row,
		// which is ambiguous for a request without query rows.
		if !slices.ContainsFunc(p.Requests, func(b RequestID) bool { return p.QOIndptr[b+1] == p.QOIndptr[b] }) {
			p.Cascade = got
			checkCascadeCoversPlan(t, p, pageSize)
			checked++
		}
	}
	require.Greater(t, cascades, 1000, "too few batches had a cascade plan")
	require.Greater(t, checked, 200, "too few cascade plans were checked against their flat arrays")
}

// layoutNilEmpty maps empty slices to nil (a reused layout keeps empty
// non-nil slices where a new one has nil).
func layoutNilEmpty(l *cascade.Layout) *cascade.Layout {
	c := *l
	c.Levels = make([]cascade.Level, len(l.Levels))
	for i, lv := range l.Levels {
		for _, s := range []*[]int32{&lv.QOIndptr, &lv.KVIndptr, &lv.KVPageIndices, &lv.KVLastPageLen} {
			if len(*s) == 0 {
				*s = nil
			}
		}
		c.Levels[i] = lv
	}
	return &c
}

// sharedRun is a run order[lo:hi] of requests (in sorted order) that share
// their first end pages; their common segment below the parent run starts at
// begin.
type refSharedRun struct {
	lo, hi     int
	begin, end int // pages [begin, end)
	children   []*refSharedRun
}

// referenceCascadePlan is the cascade planner as first written (before it
// kept its buffers): one allocation per node, run and leaf, no fast path,
// and cascade.Build. cascadePlanner must return the same layout.
func referenceCascadePlan(p *Plan, pageSize, minSaved int) *cascade.Layout {
	nb := len(p.Requests)
	if nb < 2 {
		return nil
	}

	// Slow path: some prefix is shared. The pages of request b and how many
	// of them may be shared (those before its first query token).
	ps := int32(pageSize)
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
	var runs func(lo, hi, depth int) []*refSharedRun
	runs = func(lo, hi, depth int) []*refSharedRun {
		var out []*refSharedRun
		for k := lo; k < hi; {
			j, end := k+1, int(^uint(0)>>1)
			for j < hi && lcp[j] > depth {
				end = min(end, lcp[j])
				j++
			}
			if j-k >= 2 {
				r := &refSharedRun{lo: k, hi: j, begin: depth, end: end}
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
	var emit func(r *refSharedRun, parent *cascade.Node, depth, segStart int)
	emit = func(r *refSharedRun, parent *cascade.Node, depth, segStart int) {
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
	lay, err := cascade.Build(root, pageSize)
	if err != nil {
		panic("pagedkv: cascade plan: " + err.Error())
	}
	return lay
}
