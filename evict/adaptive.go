package evict

import (
	"math"
	"math/bits"
)

// Hint is a continuation hint on a page: what its engine expects of the
// page's chain once its request lets it go. A container passes it in the
// page's [Class]; the adaptive policy keeps hinted pages on queues of
// their own and learns, like for any class, how much reuse they earn, so a
// hint is worth what its accuracy makes it worth. Other policies ignore it.
type Hint uint8

const (
	// HintNone: nothing is known (the default).
	HintNone Hint = iota
	// HintReuse: the chain is expected to be used again soon (the
	// session continues).
	HintReuse
	// HintNoReuse: the chain is not expected to be used again (the
	// session ended, or the tokens will not be re-sent).
	HintNoReuse
	// NumHints is the number of hints.
	NumHints
)

// Class is what a container knows of a page when it becomes evictable.
type Class struct {
	// Hits is what [Policy.Enqueue] takes: the hits the page served
	// (at least 1 for a page a GhostPolicy reported as returned).
	Hits uint32
	// Depth is the number of pages before it in its chain (0 for a
	// chain's first page, or where the container keeps no chains).
	Depth uint32
	// Hint is its engine's continuation hint.
	Hint Hint
	// Age, for an evicted page, is how many pushes ago it became idle;
	// [Queues.EvictedSlot] fills it in from its stamps (0 otherwise).
	Age uint32
}

// A ClassPolicy is a [GhostPolicy] that places a page by its whole
// [Class] and learns from where pages are reused. Its container (a
// [Queues]) calls EnqueueClass instead of Enqueue, EvictedClass instead of
// Evicted, and Reused when a slot leaves queue q because its page is used
// again (not evicted), with the pushes since it became idle (0 where the
// container keeps no ages). Every call is O(1) (O(Queues()) for a return
// or a victim) and allocates nothing after the policy's first eviction.
type ClassPolicy interface {
	GhostPolicy
	EnqueueClass(c Class) int
	EvictedClass(hash uint64, c Class)
	Reused(queue int, age uint32)
}

// An AgePolicy is a [ClassPolicy] that picks its victim knowing how old
// each queue's head is: its container (a [Queues]) stamps every slot it
// pushes and calls DequeueAges instead of Dequeue.
type AgePolicy interface {
	ClassPolicy
	// DequeueAges is Dequeue given also each queue's head's age in
	// pushes: how many slots (of any level) became evictable after it
	// did, modulo 2^32; 0 for an empty queue.
	DequeueAges(lens []int, ages []uint32) int
}

// The adaptive policy's classes of pages without a hint: chain depth
// buckets × hit buckets.
const (
	// AdaptiveDepthClasses buckets a page's chain depth: 0–1, 2–3, 4–7,
	// 8–15, 16 and deeper.
	AdaptiveDepthClasses = 5
	// AdaptiveHitClasses buckets the hits a page served: 0, 1, 2, 3,
	// 4–7, 8 and more.
	AdaptiveHitClasses = 6
	// AdaptiveClasses is the number of classes.
	AdaptiveClasses = AdaptiveDepthClasses * AdaptiveHitClasses
)

// The adaptive policy's queues: pages hinted dead, one per class of pages
// without a hint (depth bucket major), pages hinted live.
const (
	adaptiveNoReuse = 0
	adaptiveFirst   = 1 // the first class's queue
	adaptiveReuse   = adaptiveFirst + AdaptiveClasses
	adaptiveQueues  = adaptiveReuse + 1
)

// The adaptive policy's learning (docs/replay.md, "The adaptive policy"):
const (
	// adaptiveRate is how far one ghost return moves its class's
	// lifetime multiplier (×(1+rate)); an eviction moves its class's by
	// ×(1 − rate·ρ), ρ the returns per eviction of all classes.
	adaptiveRate = 0.01
	// adaptiveWindow: only the return of a ghost younger than this share
	// of the cache's pages (in evictions) counts: the reuse just past
	// the eviction point, what a longer stay would have caught.
	adaptiveWindow = 0.25
	// AdaptiveMaxMultiplier bounds a class's lifetime multiplier to
	// [1/AdaptiveMaxMultiplier, AdaptiveMaxMultiplier].
	AdaptiveMaxMultiplier = 64
	// AdaptiveGhosts is the ghost history's length in pool pages: long
	// enough to see a conversation's next turn after its blocks were
	// evicted young.
	AdaptiveGhosts = 4
	// adaptiveGapBuckets: each class's reuse gaps (pushes from idle to
	// reuse) are counted in log2 buckets: bucket b holds gaps in
	// [2^(b-1), 2^b), bucket 0 the gap 0.
	adaptiveGapBuckets = 33
	// adaptiveDecay: the gap counts are halved every adaptiveDecay ×
	// pages pushes.
	adaptiveDecay = 16
	// adaptivePlanMin: the bypassed classes are chosen again every
	// max(pages/4, adaptivePlanMin) class evictions.
	adaptivePlanMin = 64
	// adaptivePlanFirst is the first candidate lifetime of the plan,
	// log2 pushes (shorter ones only reorder classes that a longer one
	// orders too).
	adaptivePlanFirst = 4
)

// adaptivePolicy: see [Adaptive]. Its queues are FIFO in the order pages
// became evictable, so each class queue's head is its class's oldest
// page. The victim is, first, the oldest head of a bypassed class (see
// plan); else the head whose age over its class's lifetime multiplier m
// is largest. With no class bypassed and every m at 1 that is the oldest
// idle page of all: LRU.
//
// The plan (every max(pages/4, 64) class evictions) picks the bypassed
// classes from each class's measured reuse gaps: the pushes from a page
// becoming idle to its next use, counted on hits and on returns of
// ghosts (a history of the last AdaptiveGhosts × pages evictions, each
// with its queue and the push it became idle at). It bypasses the
// classes whose room earns fewer hits than a longer stay of the others
// would: on a conversation trace, at a small pool, the blocks of a
// conversation come back hundreds of requests after they became idle,
// so keeping every class for a short while catches little and keeping
// the likelier classes for longer catches more.
//
// The multipliers learn, from the same ghosts, which kept class a longer
// stay pays off for: a return of a ghost of class c younger than a
// quarter of the pool in evictions lengthens c's lifetime by ×(1+rate),
// each eviction from a kept class c shortens it by ×(1−rate·ρ), ρ the
// returns per eviction over all classes (both counts halved at a counted
// return once the evictions pass 4·pages). So m settles where every kept
// class earns the same reuse per unit of space-time at its eviction
// point.
//
// The hinted segments keep their own rule (each an ARC
// target over the ghosts, per segment): the dead-hinted segment's target
// starts at 0 (the hint is believed) and grows on a return of one of its
// ghosts by max(1, other ghosts / its ghosts), and shrinks on a return of
// any other queue's ghost by max(1, its ghosts / other ghosts); the
// live-hinted segment's starts at the whole cache and moves by the same
// rule. The victim is the head of the first hinted segment over its
// target (dead-hinted, then live-hinted), else the class pick above,
// else the first non-empty of dead-hinted and live-hinted.
//
// O(queues) per push, return and victim; the plan costs
// O(classes² × 29) every max(pages/4, 64) class evictions. No allocation
// after the ghosts' first eviction.
type adaptivePolicy struct {
	pages     int
	target    [adaptiveQueues]int     // the hinted segments' targets
	m         [adaptiveQueues]float64 // the classes' lifetime multipliers
	rets, evs float64                 // counted returns and class evictions, halved now and then
	ghosts    ghosts
	// The bypass plan (see plan): pushes so far (the clock of the idle
	// stamps and gaps), per class the pushes and the reuse gaps seen
	// (hits while idle, returns of ghosts), both halved every
	// adaptiveDecay × pages pushes, and the classes bypassed.
	now        uint32
	sinceDecay int
	sincePlan  int
	pushed     [AdaptiveClasses]float64
	gaps       [AdaptiveClasses][adaptiveGapBuckets]float64
	bypass     [adaptiveQueues]bool
}

func newAdaptive() *adaptivePolicy { return &adaptivePolicy{} }

func (*adaptivePolicy) Name() string { return Adaptive }
func (*adaptivePolicy) Queues() int  { return adaptiveQueues }

// adaptiveClass is the queue of a page of class c.
func adaptiveClass(c Class) int {
	switch c.Hint {
	case HintNoReuse:
		return adaptiveNoReuse
	case HintReuse:
		return adaptiveReuse
	}
	d := min(max(bits.Len32(c.Depth), 1)-1, AdaptiveDepthClasses-1)
	h := int(min(c.Hits, 4))
	if c.Hits >= 8 {
		h = 5
	}
	return adaptiveFirst + d*AdaptiveHitClasses + h
}

func (p *adaptivePolicy) Enqueue(hits uint32) int          { return p.EnqueueClass(Class{Hits: hits}) }
func (p *adaptivePolicy) Evicted(hash uint64, hits uint32) { p.EvictedClass(hash, Class{Hits: hits}) }

// isClass reports whether queue q is a class's (not a hinted segment's).
func isClass(q int) bool { return q >= adaptiveFirst && q < adaptiveReuse }

// EnqueueClass counts the push for the plan.
func (p *adaptivePolicy) EnqueueClass(c Class) int {
	q := adaptiveClass(c)
	p.now++
	if isClass(q) {
		p.pushed[q-adaptiveFirst]++
	}
	if p.sinceDecay++; p.sinceDecay >= adaptiveDecay*p.pages {
		p.sinceDecay = 0
		for i := range p.pushed {
			p.pushed[i] /= 2
			for b := range p.gaps[i] {
				p.gaps[i][b] /= 2
			}
		}
	}
	return q
}

// Reused counts a hit on an idle page of a class as a reuse after age
// pushes.
func (p *adaptivePolicy) Reused(q int, age uint32) {
	if isClass(q) {
		p.gaps[q-adaptiveFirst][gapBucket(age)]++
	}
}

// gapBucket is the log2 bucket of a reuse gap.
func gapBucket(gap uint32) int { return bits.Len32(gap) }

// Size sets the cache's room, the hinted targets' starts, every
// multiplier to 1 and no class bypassed.
func (p *adaptivePolicy) Size(pages int) {
	p.pages = max(pages, 1)
	p.target = [adaptiveQueues]int{adaptiveReuse: p.pages}
	for q := range p.m {
		p.m[q] = 1
	}
}

func (p *adaptivePolicy) EvictedClass(hash uint64, c Class) {
	if p.ghosts.hash == nil {
		p.ghosts.initIdle(AdaptiveGhosts * p.pages)
	}
	q := adaptiveClass(c)
	p.ghosts.addIdle(hash, uint8(q), p.now-c.Age)
	if !isClass(q) {
		return
	}
	if !p.bypass[q] { // a bypassed class's evictions say nothing of its lifetime
		p.evs++
		rho := p.rets / p.evs
		p.m[q] = max(p.m[q]*(1-adaptiveRate*rho), 1.0/AdaptiveMaxMultiplier)
	}
	if p.sincePlan++; p.sincePlan >= max(p.pages/4, adaptivePlanMin) {
		p.sincePlan = 0
		p.plan()
	}
}

// Returned moves the hinted targets by the queue the page's ghost left,
// and, for a young ghost of a class, the class's multiplier; the page
// then counts as having served a hit.
func (p *adaptivePolicy) Returned(hash uint64) bool {
	if p.ghosts.hash == nil {
		return false
	}
	age := p.ghosts.age(hash)
	seg, idle, ok := p.ghosts.takeIdle(hash)
	if !ok {
		return false
	}
	if isClass(int(seg)) {
		p.gaps[int(seg)-adaptiveFirst][gapBucket(p.now-idle)]++
	}
	n := p.ghosts.count
	n[seg]++ // sizes before the ghost left, as ARC takes them
	total := 0
	for _, c := range n[:adaptiveQueues] {
		total += c
	}
	for _, s := range [...]int{adaptiveNoReuse, adaptiveReuse} {
		mine, other := n[s], total-n[s]
		if int(seg) == s {
			p.target[s] = min(p.pages, p.target[s]+max(1, other/max(mine, 1)))
		} else {
			p.target[s] = max(0, p.target[s]-max(1, mine/max(other, 1)))
		}
	}
	if c := int(seg); c >= adaptiveFirst && c < adaptiveReuse && float64(age) < adaptiveWindow*float64(p.pages) {
		p.rets++
		p.m[c] = min(p.m[c]*(1+adaptiveRate), AdaptiveMaxMultiplier)
		if p.evs > 4*float64(p.pages) {
			p.evs /= 2
			p.rets /= 2
		}
	}
	return true
}

// Dequeue, for a container that keeps no ages, takes each queue's
// length for its head's age.
func (p *adaptivePolicy) Dequeue(lens []int) int {
	var ages [adaptiveQueues]uint32
	for q := range ages {
		ages[q] = uint32(min(lens[q], 1<<31))
	}
	return p.DequeueAges(lens, ages[:])
}

func (p *adaptivePolicy) DequeueAges(lens []int, ages []uint32) int {
	switch {
	case lens[adaptiveNoReuse] > p.target[adaptiveNoReuse]:
		return adaptiveNoReuse
	case lens[adaptiveReuse] > p.target[adaptiveReuse]:
		return adaptiveReuse
	}
	by := -1
	for q := adaptiveFirst; q < adaptiveReuse; q++ {
		if p.bypass[q] && lens[q] > 0 && (by < 0 || ages[q] > ages[by]) {
			by = q
		}
	}
	if by >= 0 {
		return by
	}
	best, score := -1, 0.0
	for q := adaptiveFirst; q < adaptiveReuse; q++ {
		if lens[q] > 0 {
			if o := float64(ages[q]) / p.m[q]; best < 0 || o > score {
				best, score = q, o
			}
		}
	}
	switch {
	case best >= 0:
		return best
	case lens[adaptiveNoReuse] > 0:
		return adaptiveNoReuse
	}
	return adaptiveReuse
}

// plan chooses the bypassed classes: those whose pages go first, before
// any other class's, because keeping them costs room that the others
// turn into more hits. Per class c it has its share of pushes s_c and
// v_c(L), the share of its pushes reused within L pushes of becoming
// idle (hits, and returns of ghosts, whose history is AdaptiveGhosts
// times the pool: so a class evicted young still shows its reuses).
// Keeping the set K with one lifetime, L_K = pages / Σ_K s_c pushes,
// earns Σ_K s_c·v_c(L_K) hits a push. For each candidate lifetime L =
// 2^4 .. 2^32 it orders the classes by v_c(L) and takes the best of each
// order's prefixes K; the best K of all is kept, every class when that
// ties. So a class is bypassed only when the hits it would earn in its
// room are fewer than what the longer stay of the others earns, which on
// a conversation trace is the case at a small pool: a conversation's
// next turn comes hundreds of requests after its blocks became idle.
// O(AdaptiveClasses² × candidates); called every pages/4 evictions.
func (p *adaptivePolicy) plan() {
	var total float64
	for _, n := range p.pushed {
		total += n
	}
	if total == 0 {
		return
	}
	var cum [AdaptiveClasses][adaptiveGapBuckets + 1]float64 // reuses with a gap below bucket b's
	for c := range cum {
		for b, n := range p.gaps[c] {
			cum[c][b+1] = cum[c][b] + n
		}
	}
	var order, best [AdaptiveClasses]int
	var v [AdaptiveClasses]float64
	nbest, bestVal := 0, -1.0
	for cand := adaptivePlanFirst; cand < adaptiveGapBuckets; cand++ {
		L := math.Ldexp(1, cand)
		for i := range order {
			order[i], v[i] = i, p.reused(&cum, i, L)
		}
		for i := 1; i < len(order); i++ { // insertion sort by v(L), descending, stable
			for j := i; j > 0 && v[order[j]] > v[order[j-1]]; j-- {
				order[j], order[j-1] = order[j-1], order[j]
			}
		}
		share := 0.0
		for k, c := range order {
			share += p.pushed[c] / total
			if share == 0 {
				continue
			}
			lk, val := float64(p.pages)/share, 0.0
			for _, c2 := range order[:k+1] {
				val += p.pushed[c2] / total * p.reused(&cum, c2, lk)
			}
			if val > bestVal || (k == len(order)-1 && val >= bestVal) {
				bestVal, nbest, best = val, k+1, order
			}
		}
	}
	for q := adaptiveFirst; q < adaptiveReuse; q++ {
		p.bypass[q] = true
	}
	for _, c := range best[:nbest] {
		p.bypass[adaptiveFirst+c] = false
	}
}

// reused is v_c(L): the share of class c's pushes reused within L
// pushes, the gaps taken as spread evenly over their buckets.
func (p *adaptivePolicy) reused(cum *[AdaptiveClasses][adaptiveGapBuckets + 1]float64, c int, L float64) float64 {
	if p.pushed[c] <= 0 {
		return 0
	}
	b := adaptiveGapBuckets // L past the last bucket: every reuse counted
	lo := 0.0
	if L < 1 {
		b = 0
	} else if e := math.Ilogb(L) + 1; e < adaptiveGapBuckets {
		b, lo = e, math.Ldexp(1, e-1)
	}
	v := cum[c][b]
	if b < adaptiveGapBuckets {
		hi := math.Ldexp(1, b)
		v += p.gaps[c][b] * (L - lo) / (hi - lo)
	}
	return v / p.pushed[c]
}
