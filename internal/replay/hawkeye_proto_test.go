//go:build hawkeyeproto

package replay

import (
	"fmt"
	"math/bits"
	"testing"

	"github.com/pagedkv/pagedkv/prefixcache"
)

// A block-level simulator of the sequential replay, for prototyping
// policies that see more than a page's hits: the Manager's admission
// (longest cached prefix hits, its blocks busy, one page per missed block
// and one for the query token), eviction of a victim with its subtree, and
// release deepest first.

type protoPolicy interface {
	queues() int
	// enqueue returns the queue block b joins when it becomes idle.
	enqueue(s *psim, b int32, c *bctx) int
	dequeue(lens []int) int
	evicted(s *psim, b int32, q int)
	published(s *psim, b int32) bool
	// access is told of every block reference, in stream order.
	access(s *psim, b int32)
}

// bctx is what a cache sees when a block becomes idle.
type bctx struct {
	depth, last, hits, turn, plen, olen, phits, matched int
}

type psim struct {
	capacity         int
	parent           []int32
	child, next, sib []int32 // first child, next sibling, previous sibling
	cached, busy     []bool
	returned         []bool
	hits             []uint32
	turn             []int32
	q                []int8
	qprev, qnext     []int32
	head, tail       []int32
	lens             []int
	nCached          int
	pol              protoPolicy
	hitBlocks        int64
	evictions        int64
	inner            int64
	t                int64   // stream position of the current reference
	pos              []int64 // per block: its last reference position
	live             []bool  // per reference position: referenced again later
	// predictor accuracy (filled by policies that predict).
	predLive, predDead, predRight int64
}

func newPsim(n int, capacity int, pol protoPolicy) *psim {
	s := &psim{capacity: capacity, pol: pol}
	s.parent = make([]int32, n)
	s.child = make([]int32, n)
	s.next = make([]int32, n)
	s.sib = make([]int32, n)
	s.qprev = make([]int32, n)
	s.qnext = make([]int32, n)
	for i := range n {
		s.child[i], s.next[i], s.sib[i], s.qprev[i], s.qnext[i] = -1, -1, -1, -1, -1
	}
	s.cached = make([]bool, n)
	s.busy = make([]bool, n)
	s.returned = make([]bool, n)
	s.hits = make([]uint32, n)
	s.turn = make([]int32, n)
	s.q = make([]int8, n)
	s.pos = make([]int64, n)
	nq := pol.queues()
	s.head, s.tail, s.lens = make([]int32, nq), make([]int32, nq), make([]int, nq)
	for i := range nq {
		s.head[i], s.tail[i] = -1, -1
	}
	return s
}

func (s *psim) push(b int32, q int) {
	s.q[b] = int8(q)
	s.qprev[b], s.qnext[b] = s.tail[q], -1
	if s.tail[q] >= 0 {
		s.qnext[s.tail[q]] = b
	} else {
		s.head[q] = b
	}
	s.tail[q] = b
	s.lens[q]++
}

func (s *psim) unlink(b int32) {
	q := s.q[b]
	if q < 0 {
		return
	}
	if s.qprev[b] >= 0 {
		s.qnext[s.qprev[b]] = s.qnext[b]
	} else {
		s.head[q] = s.qnext[b]
	}
	if s.qnext[b] >= 0 {
		s.qprev[s.qnext[b]] = s.qprev[b]
	} else {
		s.tail[q] = s.qprev[b]
	}
	s.qprev[b], s.qnext[b] = -1, -1
	s.lens[q]--
	s.q[b] = -1
}

// removeLeaf takes cached leaf b out.
func (s *psim) removeLeaf(b int32) {
	q := int(s.q[b])
	s.unlink(b)
	s.pol.evicted(s, b, q)
	if s.sib[b] >= 0 {
		s.next[s.sib[b]] = s.next[b]
	} else if p := s.parent[b]; p >= 0 {
		s.child[p] = s.next[b]
	}
	if s.next[b] >= 0 {
		s.sib[s.next[b]] = s.sib[b]
	}
	s.next[b], s.sib[b] = -1, -1
	s.cached[b] = false
	s.returned[b] = false
	s.hits[b] = 0
	s.nCached--
	s.evictions++
}

func (s *psim) evictSubtree(v int32) {
	if s.child[v] >= 0 {
		s.inner++
	}
	x := v
	for {
		for s.child[x] >= 0 {
			x = s.child[x]
		}
		up := s.parent[x]
		s.removeLeaf(x)
		if x == v {
			return
		}
		x = up
	}
}

func (s *psim) insert(b, parent int32) {
	s.cached[b] = true
	s.parent[b] = parent
	s.q[b] = -1
	if parent >= 0 {
		s.next[b] = s.child[parent]
		if s.child[parent] >= 0 {
			s.sib[s.child[parent]] = b
		}
		s.child[parent] = b
	}
	s.nCached++
	s.returned[b] = s.pol.published(s, b)
}

// request runs one sequential request over dense blocks db.
func (s *psim) request(db []int32, q *Request) {
	k := 0
	for k < len(db) && s.cached[db[k]] {
		k++
	}
	s.hitBlocks += int64(k)
	for j := range k {
		b := db[j]
		s.unlink(b)
		s.busy[b] = true
		s.hits[b]++
	}
	for j, b := range db {
		s.t++
		s.pos[b] = s.t - 1
		_ = j
		s.pol.access(s, b)
	}
	need := len(db) - k + 1
	for s.nCached+need > s.capacity+1 {
		v := int32(-1)
		qq := s.pol.dequeue(s.lens)
		v = s.head[qq]
		if v < 0 {
			panic("empty queue")
		}
		s.evictSubtree(v)
	}
	turn := int32(1)
	if k > 0 {
		turn = s.turn[db[k-1]] + 1
	}
	for j := k; j < len(db); j++ {
		p := int32(-1)
		if j > 0 {
			p = db[j-1]
		}
		s.insert(db[j], p)
		s.turn[db[j]] = turn
	}
	matched := 0
	if k > 0 {
		matched = 1
	}
	for j := len(db) - 1; j >= 0; j-- {
		b := db[j]
		s.busy[b] = false
		c := bctx{depth: j + 1, hits: int(s.hits[b]), turn: int(turn), plen: q.InputTokens, olen: q.OutputTokens, matched: matched, phits: -1}
		if j == len(db)-1 {
			c.last = 1
		}
		if j > 0 {
			c.phits = int(s.hits[db[j-1]])
		}
		s.push(b, s.pol.enqueue(s, b, &c))
	}
}

// protoRun replays tr sequentially at capacity under pol.
func protoRun(tr *Trace, capacity int, pol protoPolicy) *psim {
	dense := map[int32]int32{}
	var refs [][]int32
	for _, q := range tr.Requests {
		d := make([]int32, len(q.Blocks))
		for i, id := range q.Blocks {
			x, ok := dense[id]
			if !ok {
				x = int32(len(dense))
				dense[id] = x
			}
			d[i] = x
		}
		refs = append(refs, d)
	}
	s := newPsim(len(dense), capacity, pol)
	// live[t]: reference t is followed by another of its block.
	seen := make([]bool, len(dense))
	s.live = make([]bool, tr.References)
	t := tr.References
	for i := len(refs) - 1; i >= 0; i-- {
		for j := len(refs[i]) - 1; j >= 0; j-- {
			t--
			s.live[t] = seen[refs[i][j]]
			seen[refs[i][j]] = true
		}
	}
	for i := range refs {
		s.request(refs[i], &tr.Requests[i])
	}
	return s
}

// treePolicy runs a prefixcache policy in the simulator.
type treePolicy struct {
	p     prefixcache.Policy
	g     prefixcache.GhostPolicy
	sized bool
}

func newTreePolicy(name string) *treePolicy {
	p, err := prefixcache.NewPolicy(name)
	if err != nil {
		panic(err)
	}
	t := &treePolicy{p: p}
	t.g, _ = p.(prefixcache.GhostPolicy)
	return t
}

func (t *treePolicy) queues() int { return t.p.Queues() }
func (t *treePolicy) phits(s *psim, b int32) uint32 {
	if s.hits[b] == 0 && s.returned[b] {
		return 1
	}
	return s.hits[b]
}
func (t *treePolicy) enqueue(s *psim, b int32, c *bctx) int { return t.p.Enqueue(t.phits(s, b)) }
func (t *treePolicy) dequeue(lens []int) int                { return t.p.Dequeue(lens) }
func (t *treePolicy) evicted(s *psim, b int32, q int) {
	if t.g != nil {
		t.g.Evicted(uint64(b)+1, t.phits(s, b))
	}
}
func (t *treePolicy) published(s *psim, b int32) bool {
	if t.g == nil {
		return false
	}
	if !t.sized {
		t.g.Size(s.capacity + 1)
		t.sized = true
	}
	return t.g.Returned(uint64(b) + 1)
}
func (t *treePolicy) access(*psim, int32) {}

// segtree is a ring of occupancy counts over the last w time steps with
// range add and range max (lazy propagation).
type segtree struct {
	w      int
	mx, lz []int32
}

func newSegtree(w int) *segtree {
	n := 1
	for n < w {
		n *= 2
	}
	return &segtree{w: n, mx: make([]int32, 2*n), lz: make([]int32, 2*n)}
}

func (t *segtree) add(node, lo, hi, a, b int, v int32) {
	if b <= lo || hi <= a {
		return
	}
	if a <= lo && hi <= b {
		t.mx[node] += v
		t.lz[node] += v
		return
	}
	mid := (lo + hi) / 2
	t.add(2*node, lo, mid, a, b, v)
	t.add(2*node+1, mid, hi, a, b, v)
	t.mx[node] = max(t.mx[2*node], t.mx[2*node+1]) + t.lz[node]
}

func (t *segtree) max(node, lo, hi, a, b int) int32 {
	if b <= lo || hi <= a {
		return -1 << 30
	}
	if a <= lo && hi <= b {
		return t.mx[node]
	}
	mid := (lo + hi) / 2
	return max(t.max(2*node, lo, mid, a, b), t.max(2*node+1, mid, hi, a, b)) + t.lz[node]
}

// over [t0, t1) in time, t1-t0 <= w.
func (t *segtree) rangeAdd(t0, t1 int64, v int32) {
	a, b := int(t0%int64(t.w)), int(t1%int64(t.w))
	if t1-t0 == 0 {
		return
	}
	if a < b {
		t.add(1, 0, t.w, a, b, v)
	} else {
		t.add(1, 0, t.w, a, t.w, v)
		t.add(1, 0, t.w, 0, b, v)
	}
}

func (t *segtree) rangeMax(t0, t1 int64) int32 {
	a, b := int(t0%int64(t.w)), int(t1%int64(t.w))
	if a < b {
		return t.max(1, 0, t.w, a, b)
	}
	return max(t.max(1, 0, t.w, a, t.w), t.max(1, 0, t.w, 0, b))
}

func (t *segtree) reset(at int64) {
	v := t.rangeMax(at, at+1)
	t.rangeAdd(at, at+1, -v)
}

// optgen reconstructs Belady's decisions over a sliding window of the
// (sampled) reference stream and reports a label for every sampled
// reference's previous reference: kept (OPT hit) or not.
type optgen struct {
	sample   uint64 // 1 in sample blocks
	capacity int32
	window   int64
	occ      *segtree
	now      int64
	last     map[int32]int64 // sampled block -> its last sampled time
	ring     []int32         // block referenced at each time in the window
	label    func(b int32, keep bool)
	hits     int64
}

func newOptgen(capacity int, sample int, label func(int32, bool)) *optgen {
	cs := max(capacity/sample, 1)
	w := int64(8 * cs)
	return &optgen{sample: uint64(sample), capacity: int32(cs), window: w, occ: newSegtree(int(w)),
		last: map[int32]int64{}, ring: make([]int32, newSegtree(int(w)).w), label: label}
}

func sampled(b int32, sample uint64) bool {
	h := uint64(b) * 0x9e3779b97f4a7c15
	return (h>>32)%sample == 0
}

func (o *optgen) access(b int32) {
	if !sampled(b, o.sample) {
		return
	}
	w := int64(len(o.ring))
	// The reference leaving the window: never reused within it.
	if o.now >= o.window {
		old := o.now - o.window
		x := o.ring[old%w]
		if t0, ok := o.last[x]; ok && t0 == old {
			o.label(x, false)
			delete(o.last, x)
		}
	}
	o.occ.reset(o.now)
	if t0, ok := o.last[b]; ok {
		if o.occ.rangeMax(t0, o.now) < o.capacity {
			o.occ.rangeAdd(t0, o.now, 1)
			o.hits++
			o.label(b, true)
		} else {
			o.label(b, false)
		}
	}
	o.last[b] = o.now
	o.ring[o.now%w] = b
	o.now++
}

func TestProtoReproducesReplay(t *testing.T) {
	tr := conversation(t)
	for _, f := range []float64{0.02, 0.05, 0.10, 0.25, 0.50} {
		c := int(f * float64(tr.DistinctBlocks))
		for _, name := range []string{"lru", "srrip", "arc"} {
			s := protoRun(tr, c, newTreePolicy(name))
			fmt.Printf("%3.0f%% %-6s %.2f%% (hits %d, evicted %d, inner %d)\n", 100*f, name, 100*float64(s.hitBlocks)/float64(tr.References), s.hitBlocks, s.evictions, s.inner)
		}
	}
}

func TestOptgenIsBelady(t *testing.T) {
	tr := conversation(t)
	st := TraceStream(tr)
	for _, f := range []float64{0.02, 0.05, 0.10} {
		c := int(f * float64(tr.DistinctBlocks))
		o := newOptgen(c, 1, func(int32, bool) {})
		o.window = 1 << 20
		o.occ = newSegtree(1 << 20)
		o.ring = make([]int32, 1<<20)
		dense := map[int32]int32{}
		for _, a := range st.Admissions {
			for _, id := range a {
				d, ok := dense[id]
				if !ok {
					d = int32(len(dense))
					dense[id] = d
				}
				o.access(d)
			}
		}
		fmt.Printf("%3.0f%% optgen %d belady %d\n", 100*f, o.hits, Belady(st, c))
	}
}

// A predictor maps a block's context to a class (0: evict first) and learns
// from OPTgen's labels on the context of a block's previous reference.
type predictor interface {
	classes() int
	predict(c *bctx) int
	train(c *bctx, keep bool)
	// victim is told when a block predicted friendly (class > 0) is evicted.
	victim(c *bctx)
}

func lg(x int) int { return bits.Len(uint(x)) }

// features of a context, each a small non-negative bucket.
func features(c *bctx, mask uint32, f *[8]int) int {
	all := [8]int{lg(c.depth), c.last, min(c.hits, 3), min(c.turn, 8), lg(c.plen >> 9), lg(c.olen), min(c.phits+1, 4), c.matched}
	n := 0
	for i, v := range all {
		if mask&(1<<i) != 0 {
			f[n] = i<<5 | v
			n++
		}
	}
	return n
}

// hawkeyeTable: Hawkeye's predictor, 3-bit saturating counters indexed by a
// hash of the signature (here the tuple of features), friendly at >= 4.
type hawkeyeTable struct {
	mask uint32
	ctr  []uint8
}

func newHawkeyeTable(mask uint32) *hawkeyeTable {
	t := &hawkeyeTable{mask: mask, ctr: make([]uint8, 8192)}
	for i := range t.ctr {
		t.ctr[i] = 4
	}
	return t
}
func (t *hawkeyeTable) index(c *bctx) int {
	var f [8]int
	n := features(c, t.mask, &f)
	h := uint64(0x12345)
	for _, v := range f[:n] {
		h = (h ^ uint64(v)) * 0x100000001b3
	}
	h ^= h >> 29
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 32
	return int(h % uint64(len(t.ctr)))
}
func (t *hawkeyeTable) classes() int { return 2 }
func (t *hawkeyeTable) predict(c *bctx) int {
	if t.ctr[t.index(c)] >= 4 {
		return 1
	}
	return 0
}
func (t *hawkeyeTable) train(c *bctx, keep bool) {
	i := t.index(c)
	if keep && t.ctr[i] < 7 {
		t.ctr[i]++
	} else if !keep && t.ctr[i] > 0 {
		t.ctr[i]--
	}
}
func (t *hawkeyeTable) victim(c *bctx) { t.train(c, false) }

// perceptron: one weight per feature value (Glider's ISVM over a k-sparse
// binary feature vector), integer weights, learning rate 1, trained while
// the sum is on the wrong side or within the training threshold; classes by
// Glider's prediction thresholds: < 0 averse, 0..59 friendly (low), >= 60
// friendly (high).
type perceptron struct {
	mask   uint32
	w      [8 << 5]int32
	thresh int32
	cls    int
}

func (p *perceptron) sum(c *bctx) int32 {
	var f [8]int
	n := features(c, p.mask, &f)
	var s int32
	for _, v := range f[:n] {
		s += p.w[v]
	}
	return s
}
func (p *perceptron) classes() int { return p.cls }
func (p *perceptron) predict(c *bctx) int {
	s := p.sum(c)
	switch {
	case s < 0:
		return 0
	case s < 60 || p.cls == 2:
		return 1
	}
	return 2
}
func (p *perceptron) train(c *bctx, keep bool) {
	s := p.sum(c)
	var f [8]int
	n := features(c, p.mask, &f)
	if keep && s < p.thresh {
		for _, v := range f[:n] {
			p.w[v] = min(p.w[v]+1, 127)
		}
	} else if !keep && s > -p.thresh {
		for _, v := range f[:n] {
			p.w[v] = max(p.w[v]-1, -128)
		}
	}
}
func (p *perceptron) victim(c *bctx) {}

// learned is Hawkeye's policy over the queues: a block joins the queue of
// its predicted class; victims come from the lowest non-empty class, oldest
// first; OPTgen trains the predictor on the block's previous reference.
type learned struct {
	pred   predictor
	opt    *optgen
	prev   []bctx // per block: the context of its last reference
	has    []bool
	sample int
}

func newLearned(p predictor, sample int) *learned { return &learned{pred: p, sample: sample} }

func (l *learned) queues() int { return l.pred.classes() }
func (l *learned) init(s *psim) {
	if l.opt != nil {
		return
	}
	l.prev = make([]bctx, len(s.parent))
	l.has = make([]bool, len(s.parent))
	l.opt = newOptgen(s.capacity, l.sample, func(b int32, keep bool) {
		if l.has[b] {
			l.pred.train(&l.prev[b], keep)
		}
	})
}
func (l *learned) enqueue(s *psim, b int32, c *bctx) int {
	l.init(s)
	l.prev[b], l.has[b] = *c, true
	cl := l.pred.predict(c)
	live := s.live[s.pos[b]]
	if live {
		s.predLive++
	} else {
		s.predDead++
	}
	if live == (cl > 0) {
		s.predRight++
	}
	return cl
}
func (l *learned) dequeue(lens []int) int {
	for q, n := range lens {
		if n > 0 {
			return q
		}
	}
	panic("empty")
}
func (l *learned) evicted(s *psim, b int32, q int) {
	if q > 0 {
		l.pred.victim(&l.prev[b])
	}
}
func (l *learned) published(*psim, int32) bool { return false }
func (l *learned) access(s *psim, b int32) {
	l.init(s)
	l.opt.access(b)
}

func TestProtoHawkeye(t *testing.T) {
	tr := conversation(t)
	const all = 0xff
	type mk struct {
		name string
		new  func() protoPolicy
	}
	mks := []mk{
		{"hawkeye/all", func() protoPolicy { return newLearned(newHawkeyeTable(all), 1) }},
		{"hawkeye/all/s32", func() protoPolicy { return newLearned(newHawkeyeTable(all), 32) }},
		{"hawkeye/depth,last,hits", func() protoPolicy { return newLearned(newHawkeyeTable(0b111), 1) }},
		{"glider/all", func() protoPolicy { return newLearned(&perceptron{mask: all, thresh: 100, cls: 3}, 1) }},
		{"glider/all/s32", func() protoPolicy { return newLearned(&perceptron{mask: all, thresh: 100, cls: 3}, 32) }},
		{"perceptron2/all", func() protoPolicy { return newLearned(&perceptron{mask: all, thresh: 100, cls: 2}, 1) }},
	}
	for _, f := range []float64{0.02, 0.05, 0.10, 0.25, 0.50} {
		c := int(f * float64(tr.DistinctBlocks))
		for _, m := range mks {
			s := protoRun(tr, c, m.new())
			fmt.Printf("%3.0f%% %-24s %.2f%% (inner %d) accuracy %.1f%% (live %d dead %d)\n", 100*f, m.name, 100*float64(s.hitBlocks)/float64(tr.References), s.inner,
				100*float64(s.predRight)/float64(s.predLive+s.predDead), s.predLive, s.predDead)
		}
	}
}
