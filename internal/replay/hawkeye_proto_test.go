//go:build hawkeyeproto

package replay

import (
	"fmt"
	"math/bits"
	"os"
	"strings"
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
	root, anchor                                        int // the request's first block; its deepest matched block
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
		var v int32
		if pk, ok := s.pol.(victimPicker); ok {
			v = pk.pick(s)
		} else {
			v = s.head[s.pol.dequeue(s.lens)]
		}
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
		anchor := -1
		if k > 0 {
			anchor = int(db[k-1])
		}
		app := -1 // the deepest matched block referenced >= 6 times before: the shared system prompt
		for j := k - 1; j >= 0; j-- {
			if s.hits[db[j]] >= 5 {
				app = int(db[j])
				break
			}
		}
		c := bctx{root: app + 1, anchor: anchor, depth: j + 1, hits: int(s.hits[b]), turn: int(turn), plen: q.InputTokens, olen: q.OutputTokens, matched: matched, phits: -1}
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
func features(c *bctx, mask uint32, f *[10]int) int {
	all := [10]int{lg(c.depth), c.last, min(c.hits, 3), min(c.turn, 8), lg(c.plen >> 9), lg(c.olen), min(c.phits+1, 4), c.matched, c.root, c.anchor + 1}
	n := 0
	for i, v := range all {
		if mask&(1<<i) != 0 {
			f[n] = i<<28 | v
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
	var f [10]int
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
	w      [10 << 12]int32
	thresh int32
	cls    int
}

// widx is feature value v's weight: a table of 4096 per feature, the value
// hashed into it.
func widx(v int) int {
	h := uint64(v&(1<<28-1)) * 0x9e3779b97f4a7c15
	return v>>28<<12 | int(h>>52)
}

func (p *perceptron) sum(c *bctx) int32 {
	var f [10]int
	n := features(c, p.mask, &f)
	var s int32
	for _, v := range f[:n] {
		s += p.w[widx(v)]
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
	var f [10]int
	n := features(c, p.mask, &f)
	if keep && s < p.thresh {
		for _, v := range f[:n] {
			p.w[widx(v)] = min(p.w[widx(v)]+1, 127)
		}
	} else if !keep && s > -p.thresh {
		for _, v := range f[:n] {
			p.w[widx(v)] = max(p.w[widx(v)]-1, -128)
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
	only := os.Getenv("PROTO")
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
		{"mockingjay/all", func() protoPolicy { return &mockingjay{mask: all, sample: 1, step: 1.0 / 8} }},
		{"mockingjay/all/s32", func() protoPolicy { return &mockingjay{mask: all, sample: 32, step: 1.0 / 8} }},
		{"mockingjay/depth,last,hits", func() protoPolicy { return &mockingjay{mask: 0b111, sample: 1, step: 1.0 / 8} }},
	}
	for _, f := range []float64{0.02, 0.05, 0.10, 0.25, 0.50} {
		c := int(f * float64(tr.DistinctBlocks))
		for _, m := range mks {
			if only != "" && !strings.Contains(m.name, only) {
				continue
			}
			s := protoRun(tr, c, m.new())
			fmt.Printf("%3.0f%% %-24s %.2f%% (inner %d) accuracy %.1f%% (live %d dead %d)\n", 100*f, m.name, 100*float64(s.hitBlocks)/float64(tr.References), s.inner,
				100*float64(s.predRight)/float64(s.predLive+s.predDead), s.predLive, s.predDead)
		}
	}
}

// A victimPicker chooses victims itself (among idle blocks).
type victimPicker interface {
	pick(s *psim) int32
}

// mockingjay predicts, per signature, a block's reuse distance (in block
// references) from the sampled past: a sampled block reused within the
// horizon (8x the capacity, Hawkeye's OPTgen window) trains its previous
// reference's signature with the observed distance, one not reused within
// it with the horizon (Mockingjay's "infinite" distance). A cached block's
// estimated time of arrival is its last reference + its signature's
// prediction; the victim is the idle block whose ETA is farthest from now,
// in the future or overdue (Mockingjay's max |ETR|).
type mockingjay struct {
	mask    uint32
	sample  int
	rd      map[int]float64 // signature -> predicted reuse distance
	step    float64
	prev    []bctx
	has     []bool
	eta     []int64
	ver     []uint32
	late    etaHeap // min ETA first (most overdue)
	early   etaHeap // max ETA first (farthest)
	horizon int64
	last    map[int32]int64
	ring    []int32
	now     int64 // sampled time
}

type etaEntry struct {
	eta int64
	b   int32
	ver uint32
}

type etaHeap struct {
	e   []etaEntry
	max bool
}

func (h *etaHeap) less(i, j int) bool {
	if h.max {
		return h.e[i].eta > h.e[j].eta
	}
	return h.e[i].eta < h.e[j].eta
}
func (h *etaHeap) push(x etaEntry) {
	h.e = append(h.e, x)
	i := len(h.e) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			break
		}
		h.e[i], h.e[p] = h.e[p], h.e[i]
		i = p
	}
}
func (h *etaHeap) pop() {
	n := len(h.e) - 1
	h.e[0] = h.e[n]
	h.e = h.e[:n]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && h.less(l, m) {
			m = l
		}
		if r < n && h.less(r, m) {
			m = r
		}
		if m == i {
			return
		}
		h.e[i], h.e[m] = h.e[m], h.e[i]
		i = m
	}
}

func (m *mockingjay) sig(c *bctx) int {
	var f [10]int
	n := features(c, m.mask, &f)
	h := 0
	for _, v := range f[:n] {
		h = h*1000003 + v
	}
	return h
}

func (m *mockingjay) init(s *psim) {
	if m.prev != nil {
		return
	}
	n := len(s.parent)
	m.prev, m.has, m.eta, m.ver = make([]bctx, n), make([]bool, n), make([]int64, n), make([]uint32, n)
	m.rd = map[int]float64{}
	m.late.max, m.early.max = false, true
	m.horizon = int64(8 * max(s.capacity/m.sample, 1))
	m.last = map[int32]int64{}
	m.ring = make([]int32, m.horizon)
}

func (m *mockingjay) train(b int32, d int64) {
	if !m.has[b] {
		return
	}
	k := m.sig(&m.prev[b])
	old, ok := m.rd[k]
	if !ok {
		m.rd[k] = float64(d)
		return
	}
	m.rd[k] = old + (float64(d)-old)*m.step
}

func (m *mockingjay) queues() int { return 1 }
func (m *mockingjay) enqueue(s *psim, b int32, c *bctx) int {
	m.init(s)
	m.prev[b], m.has[b] = *c, true
	pred, ok := m.rd[m.sig(c)]
	if !ok {
		pred = 0 // no prediction yet: due now (LRU among unknowns)
	}
	// Distances are learned in sampled time; the cache ages in block
	// references.
	m.eta[b] = s.pos[b] + int64(pred)*int64(m.sample)
	m.ver[b]++
	e := etaEntry{m.eta[b], b, m.ver[b]}
	m.late.push(e)
	m.early.push(e)
	live := s.live[s.pos[b]]
	if live {
		s.predLive++
	} else {
		s.predDead++
	}
	if live == (float64(pred) < float64(m.horizon)/2) {
		s.predRight++
	}
	return 0
}
func (m *mockingjay) dequeue([]int) int { return 0 }
func (m *mockingjay) evicted(s *psim, b int32, q int) {
	m.ver[b]++
}
func (m *mockingjay) published(*psim, int32) bool { return false }
func (m *mockingjay) access(s *psim, b int32) {
	m.init(s)
	m.ver[b]++ // busy: out of the heaps until released
	if !sampled(b, uint64(m.sample)) {
		return
	}
	if m.now >= m.horizon {
		old := m.now - m.horizon
		x := m.ring[old%m.horizon]
		if t0, ok := m.last[x]; ok && t0 == old {
			m.train(x, m.horizon)
			delete(m.last, x)
		}
	}
	if t0, ok := m.last[b]; ok {
		m.train(b, m.now-t0)
	}
	m.last[b] = m.now
	m.ring[m.now%m.horizon] = b
	m.now++
}

func (m *mockingjay) top(h *etaHeap) (etaEntry, bool) {
	for len(h.e) > 0 {
		e := h.e[0]
		if m.ver[e.b] == e.ver {
			return e, true
		}
		h.pop()
	}
	return etaEntry{}, false
}

func (m *mockingjay) pick(s *psim) int32 {
	now := s.t
	a, okA := m.top(&m.late)
	b, okB := m.top(&m.early)
	if !okA && !okB {
		panic("mockingjay: nothing idle")
	}
	if now-a.eta >= b.eta-now {
		return a.b
	}
	return b.b
}

// recorder is LRU that counts, per full signature, the idle blocks that
// are referenced again (live) and those that are not.
type recorder struct {
	mask uint32
	cnt  map[int][2]int64
}

func (r *recorder) queues() int { return 1 }
func (r *recorder) enqueue(s *psim, b int32, c *bctx) int {
	k := sigKey(c, r.mask)
	v := r.cnt[k]
	if s.live[s.pos[b]] {
		v[1]++
	} else {
		v[0]++
	}
	r.cnt[k] = v
	return 0
}
func (r *recorder) dequeue([]int) int           { return 0 }
func (r *recorder) evicted(*psim, int32, int)   {}
func (r *recorder) published(*psim, int32) bool { return false }
func (r *recorder) access(*psim, int32)         {}

func sigKey(c *bctx, mask uint32) int {
	var f [10]int
	n := features(c, mask, &f)
	h := 0
	for _, v := range f[:n] {
		h = h*1000003 + v
	}
	return h
}

// hindsight predicts with each signature's live share over the whole
// trace (not online: the best any predictor of these features can know),
// in `classes` buckets of that share (2: Hawkeye's friendly at >= 1/2).
type hindsight struct {
	mask uint32
	cnt  map[int][2]int64
	cls  int
}

func (h *hindsight) classes() int { return h.cls }
func (h *hindsight) predict(c *bctx) int {
	v, ok := h.cnt[sigKey(c, h.mask)]
	p := float64(v[1]) / float64(max(v[0]+v[1], 1))
	if !ok {
		p = 1 // a signature the recording never saw: no reason to evict it first
	}
	if h.cls == 2 {
		if p >= 0.5 {
			return 1
		}
		return 0
	}
	return min(int(p*float64(h.cls)), h.cls-1)
}
func (h *hindsight) train(*bctx, bool) {}
func (h *hindsight) victim(*bctx)      {}

func TestProtoHindsight(t *testing.T) {
	tr := conversation(t)
	for _, mask := range []uint32{0x100, 0x1ff, 0x107} {
		r := &recorder{mask: mask, cnt: map[int][2]int64{}}
		protoRun(tr, tr.DistinctBlocks/20, r)
		var right, total, fr, frLive, live int64
		for _, v := range r.cnt {
			right += max(v[0], v[1])
			total += v[0] + v[1]
			live += v[1]
			if v[1] >= v[0] {
				fr += v[0] + v[1]
				frLive += v[1]
			}
		}
		fmt.Printf("mask %#x: friendly %d of %d idle blocks, %.1f%% of them live; %.1f%% of the live ones friendly\n", mask, fr, total, 100*float64(frLive)/float64(max(fr, 1)), 100*float64(frLive)/float64(live))
		if mask == 0x100 {
			for k, v := range r.cnt {
				if v[0]+v[1] > 2000 {
					fmt.Printf("app %d: %d idle, %.1f%% live\n", k, v[0]+v[1], 100*float64(v[1])/float64(v[0]+v[1]))
				}
			}
		}
		fmt.Printf("mask %#x: %d signatures, hindsight accuracy %.1f%% (all dead: %.1f%%)\n", mask, len(r.cnt), 100*float64(right)/float64(total), 100*182790.0/288500)
		for _, f := range []float64{0.02, 0.05, 0.10, 0.25, 0.50} {
			c := int(f * float64(tr.DistinctBlocks))
			for _, cls := range []int{2, 8} {
				s := protoRun(tr, c, newLearned(&hindsight{mask: mask, cnt: r.cnt, cls: cls}, 1))
				fmt.Printf("%3.0f%% hindsight/%d classes %.2f%% accuracy %.1f%%\n", 100*f, cls, 100*float64(s.hitBlocks)/float64(tr.References), 100*float64(s.predRight)/float64(s.predLive+s.predDead))
			}
		}
	}
}

// rrip drives SRRIP's insertion with a predictor (SHiP-style, Wu et al.
// MICRO '11, here with OPTgen's labels as Hawkeye trains): predicted
// averse -> RRPV 3 (distant), else SRRIP's own rule (hit: 0, new: 2); every
// block ages as victims are taken, so a friendly block goes once it has
// aged past the rest.
type rrip struct {
	*learned
	epoch uint32
}

func (r *rrip) queues() int { return 4 }
func (r *rrip) enqueue(s *psim, b int32, c *bctx) int {
	cl := r.learned.enqueue(s, b, c)
	rrpv := uint32(2)
	switch {
	case cl == 0:
		rrpv = 3
	case c.hits > 0:
		rrpv = 0
	}
	return int((r.epoch + 3 - rrpv) % 4)
}
func (r *rrip) dequeue(lens []int) int {
	for d := range uint32(4) {
		q := (r.epoch + d) % 4
		if lens[q] > 0 {
			r.epoch += d
			return int(q)
		}
	}
	panic("empty")
}
func (r *rrip) evicted(s *psim, b int32, q int) {}

func TestProtoRRIP(t *testing.T) {
	tr := conversation(t)
	rec := &recorder{mask: 0xff, cnt: map[int][2]int64{}}
	protoRun(tr, tr.DistinctBlocks/20, rec)
	for _, f := range []float64{0.02, 0.05, 0.10, 0.25, 0.50} {
		c := int(f * float64(tr.DistinctBlocks))
		for name, p := range map[string]func() predictor{
			"hawkeye-table": func() predictor { return newHawkeyeTable(0xff) },
			"perceptron":    func() predictor { return &perceptron{mask: 0xff, thresh: 100, cls: 2} },
			"hindsight":     func() predictor { return &hindsight{mask: 0xff, cnt: rec.cnt, cls: 2} },
		} {
			s := protoRun(tr, c, &rrip{learned: newLearned(p(), 1)})
			fmt.Printf("%3.0f%% rrip/%-14s %.2f%% accuracy %.1f%% inner %d\n", 100*f, name, 100*float64(s.hitBlocks)/float64(tr.References), 100*float64(s.predRight)/float64(s.predLive+s.predDead), s.inner)
		}
	}
}

// TestProtoTable prints docs/replay.md's rows: hit ratio (share of
// Belady's hits) per capacity, and the predictor's accuracy against the
// dead-block oracle at 5% and 10%.
func TestProtoTable(t *testing.T) {
	tr := conversation(t)
	caps := []float64{0.02, 0.05, 0.10, 0.25, 0.50}
	bel := make([]int64, len(caps))
	for i, f := range caps {
		bel[i] = Belady(TraceStream(tr), int(f*float64(tr.DistinctBlocks)))
	}
	rows := []struct {
		name string
		new  func() protoPolicy
	}{
		{"lru", func() protoPolicy { return newTreePolicy("lru") }},
		{"arc", func() protoPolicy { return newTreePolicy("arc") }},
		{"hawkeye", func() protoPolicy { return newLearned(newHawkeyeTable(0xff), 1) }},
		{"hawkeye, sampled 1/32", func() protoPolicy { return newLearned(newHawkeyeTable(0xff), 32) }},
		{"hawkeye, depth/last/hits only", func() protoPolicy { return newLearned(newHawkeyeTable(0b111), 1) }},
		{"glider (training threshold 30)", func() protoPolicy { return newLearned(&perceptron{mask: 0xff, thresh: 30, cls: 3}, 1) }},
		{"glider (training threshold 100)", func() protoPolicy { return newLearned(&perceptron{mask: 0xff, thresh: 100, cls: 3}, 1) }},
		{"glider (training threshold 300)", func() protoPolicy { return newLearned(&perceptron{mask: 0xff, thresh: 300, cls: 3}, 1) }},
		{"glider, sampled 1/32", func() protoPolicy { return newLearned(&perceptron{mask: 0xff, thresh: 100, cls: 3}, 32) }},
		{"srrip insertion by hawkeye's table", func() protoPolicy { return &rrip{learned: newLearned(newHawkeyeTable(0xff), 1)} }},
		{"srrip insertion by the perceptron", func() protoPolicy {
			return &rrip{learned: newLearned(&perceptron{mask: 0xff, thresh: 100, cls: 2}, 1)}
		}},
		{"mockingjay", func() protoPolicy { return &mockingjay{mask: 0xff, sample: 1, step: 1.0 / 8} }},
		{"mockingjay, sampled 1/32", func() protoPolicy { return &mockingjay{mask: 0xff, sample: 32, step: 1.0 / 8} }},
		{"hindsight (not online)", nil},
	}
	for _, r := range rows {
		line := "| " + r.name + " |"
		acc := ""
		for i, f := range caps {
			mk := r.new
			if mk == nil {
				rec := &recorder{mask: 0xff, cnt: map[int][2]int64{}}
				protoRun(tr, int(f*float64(tr.DistinctBlocks)), rec)
				mk = func() protoPolicy { return newLearned(&hindsight{mask: 0xff, cnt: rec.cnt, cls: 2}, 1) }
			}
			s := protoRun(tr, int(f*float64(tr.DistinctBlocks)), mk())
			line += fmt.Sprintf(" %.1f (%.1f) |", 100*float64(s.hitBlocks)/float64(tr.References), 100*float64(s.hitBlocks)/float64(bel[i]))
			if (f == 0.05 || f == 0.10) && s.predLive+s.predDead > 0 {
				acc += fmt.Sprintf(" %.1f%%", 100*float64(s.predRight)/float64(s.predLive+s.predDead))
			}
		}
		fmt.Println(line + acc)
	}
}

// thresholded is the hindsight predictor with its friendly threshold
// swept: the best any "evict the signatures below theta first, LRU within"
// rule over these features could do.
type thresholded struct {
	hindsight
	theta float64
}

func (h *thresholded) predict(c *bctx) int {
	v, ok := h.cnt[sigKey(c, h.mask)]
	if !ok || float64(v[1]) >= h.theta*float64(max(v[0]+v[1], 1)) {
		return 1
	}
	return 0
}

func TestProtoThreshold(t *testing.T) {
	tr := conversation(t)
	caps := []float64{0.02, 0.05, 0.10, 0.25, 0.50}
	recs := make([]*recorder, len(caps))
	for i, f := range caps {
		recs[i] = &recorder{mask: 0xff, cnt: map[int][2]int64{}}
		protoRun(tr, int(f*float64(tr.DistinctBlocks)), recs[i])
	}
	for _, theta := range []float64{0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5} {
		line := fmt.Sprintf("| theta %.2f |", theta)
		for i, f := range caps {
			rec := recs[i]
			s := protoRun(tr, int(f*float64(tr.DistinctBlocks)), newLearned(&thresholded{hindsight{mask: 0xff, cnt: rec.cnt, cls: 2}, theta}, 1))
			line += fmt.Sprintf(" %.1f (%.1f) |", 100*float64(s.hitBlocks)/float64(tr.References), 100*float64(s.hitBlocks)/float64(Belady(TraceStream(tr), int(f*float64(tr.DistinctBlocks)))))
		}
		fmt.Println(line)
	}
}

// deadFirst puts blocks a predictor calls averse on a queue of their own,
// evicted first, and runs a tree policy over the rest.
type deadFirst struct {
	*treePolicy
	pred predictor
}

func (d *deadFirst) queues() int { return 1 + d.treePolicy.queues() }
func (d *deadFirst) enqueue(s *psim, b int32, c *bctx) int {
	if d.pred.predict(c) == 0 {
		return 0
	}
	return 1 + d.treePolicy.enqueue(s, b, c)
}
func (d *deadFirst) dequeue(lens []int) int {
	if lens[0] > 0 {
		return 0
	}
	return 1 + d.treePolicy.dequeue(lens[1:])
}

type lastOnly struct{}

func (lastOnly) classes() int { return 2 }
func (lastOnly) predict(c *bctx) int {
	if c.last == 1 {
		return 0
	}
	return 1
}
func (lastOnly) train(*bctx, bool) {}
func (lastOnly) victim(*bctx)      {}

func TestProtoDeadFirst(t *testing.T) {
	tr := conversation(t)
	for _, base := range []string{"lru", "arc"} {
		for _, theta := range []float64{-1, 0.02, 0.05, 0.1, 0.2} {
			line := fmt.Sprintf("| %s, theta %.2f |", base, theta)
			for _, f := range []float64{0.02, 0.05, 0.10, 0.25, 0.50} {
				c := int(f * float64(tr.DistinctBlocks))
				var p predictor = lastOnly{}
				if theta >= 0 {
					rec := &recorder{mask: 0xff, cnt: map[int][2]int64{}}
					protoRun(tr, c, rec)
					p = &thresholded{hindsight{mask: 0xff, cnt: rec.cnt, cls: 2}, theta}
				}
				s := protoRun(tr, c, &deadFirst{newTreePolicy(base), p})
				line += fmt.Sprintf(" %.1f (%.1f) |", 100*float64(s.hitBlocks)/float64(tr.References), 100*float64(s.hitBlocks)/float64(Belady(TraceStream(tr), c)))
			}
			fmt.Println(line)
		}
	}
}

// TestProtoAnchor: the deepest matched block (a per-conversation key) as a
// ninth feature, online, and how many idle blocks each signature covers.
func TestProtoAnchor(t *testing.T) {
	tr := conversation(t)
	for _, f := range []float64{0.05, 0.10} {
		c := int(f * float64(tr.DistinctBlocks))
		for name, mk := range map[string]func() protoPolicy{
			"glider+anchor":  func() protoPolicy { return newLearned(&perceptron{mask: 0x2ff, thresh: 100, cls: 3}, 1) },
			"hawkeye+anchor": func() protoPolicy { return newLearned(newHawkeyeTable(0x2ff), 1) },
		} {
			s := protoRun(tr, c, mk())
			fmt.Printf("%3.0f%% %s %.1f%% accuracy %.1f%%\n", 100*f, name, 100*float64(s.hitBlocks)/float64(tr.References), 100*float64(s.predRight)/float64(s.predLive+s.predDead))
		}
		rec := &recorder{mask: 0x2ff, cnt: map[int][2]int64{}}
		protoRun(tr, c, rec)
		hist := map[int64]int{}
		var total int64
		for _, v := range rec.cnt {
			n := v[0] + v[1]
			total += n
			switch {
			case n <= 2:
				hist[2]++
			case n <= 8:
				hist[8]++
			default:
				hist[9]++
			}
		}
		fmt.Printf("%d signatures: <=2 idle %d, 3-8 %d, >8 %d; total %d\n", len(rec.cnt), hist[2], hist[8], hist[9], total)
	}
}

// noDetrain is Hawkeye's table without its detraining of friendly victims.
type noDetrain struct{ *hawkeyeTable }

func (noDetrain) victim(*bctx) {}

func TestProtoNoDetrain(t *testing.T) {
	tr := conversation(t)
	for _, f := range []float64{0.05, 0.10, 0.25, 0.50} {
		c := int(f * float64(tr.DistinctBlocks))
		s := protoRun(tr, c, newLearned(noDetrain{newHawkeyeTable(0xff)}, 1))
		fmt.Printf("%3.0f%% hawkeye without detraining %.1f%% accuracy %.1f%%\n", 100*f, 100*float64(s.hitBlocks)/float64(tr.References), 100*float64(s.predRight)/float64(s.predLive+s.predDead))
	}
}
