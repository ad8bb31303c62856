package evict

import "math/bits"

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
}

// A ClassPolicy is a [GhostPolicy] that places a page by its whole
// [Class] and learns from where pages are reused. Its container (a
// [Queues]) calls EnqueueClass instead of Enqueue, EvictedClass instead of
// Evicted, and Reused when a slot leaves queue q because its page is used
// again (not evicted). Every call is O(1) (O(Queues()) for a return or a
// victim) and allocates nothing after the policy's first eviction.
type ClassPolicy interface {
	GhostPolicy
	EnqueueClass(c Class) int
	EvictedClass(hash uint64, c Class)
	Reused(queue int)
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
	// AdaptiveDepthClasses buckets a page's chain depth: 0, 1, 2–3, 4–7,
	// 8–15, 16 and deeper.
	AdaptiveDepthClasses = 6
	// AdaptiveHitClasses buckets the hits a page served: 0, 1, 2, 3+.
	AdaptiveHitClasses = 4
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
)

// adaptivePolicy: see [Adaptive]. Its queues are FIFO in the order pages
// became evictable, so each class queue's head is its class's oldest
// page; the victim is the head whose age over its class's lifetime
// multiplier m is largest. With every m at 1 that is the oldest idle page
// of all: LRU. The multipliers learn, from a ghost history of the last
// `pages` evictions (each ghost with its queue and its age), which class
// a longer stay pays off for: a return of a young ghost of class c
// lengthens c's lifetime by ×(1+rate), each eviction from class c
// shortens it by ×(1−rate·ρ), ρ the returns per eviction over all classes
// (both counts halved at a counted return once the evictions pass
// 4·pages). So m settles where every
// class earns the same reuse per unit of space-time at its eviction
// point: a class whose evicted pages come back more than the others'
// stays longer, one whose pages never do goes sooner.
//
// The hinted segments keep the rule the policy had before (each an ARC
// target over the ghosts, per segment): the dead-hinted segment's target
// starts at 0 (the hint is believed) and grows on a return of one of its
// ghosts by max(1, other ghosts / its ghosts), and shrinks on a return of
// any other queue's ghost by max(1, its ghosts / other ghosts); the
// live-hinted segment's starts at the whole cache and moves by the same
// rule. The victim is the head of the first hinted segment over its
// target (dead-hinted, then live-hinted), else the class pick above,
// else the first non-empty of dead-hinted and live-hinted.
//
// O(queues) per eviction and per return, O(1) per push; no allocation
// after the ghosts' first eviction.
type adaptivePolicy struct {
	pages     int
	target    [adaptiveQueues]int     // the hinted segments' targets
	m         [adaptiveQueues]float64 // the classes' lifetime multipliers
	rets, evs float64                 // counted returns and class evictions, halved now and then
	ghosts    ghosts
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
	d := min(bits.Len32(c.Depth), AdaptiveDepthClasses-1)
	h := int(min(c.Hits, AdaptiveHitClasses-1))
	return adaptiveFirst + d*AdaptiveHitClasses + h
}

func (p *adaptivePolicy) Enqueue(hits uint32) int          { return adaptiveClass(Class{Hits: hits}) }
func (p *adaptivePolicy) EnqueueClass(c Class) int         { return adaptiveClass(c) }
func (p *adaptivePolicy) Evicted(hash uint64, hits uint32) { p.EvictedClass(hash, Class{Hits: hits}) }
func (p *adaptivePolicy) Reused(int)                       {}

// Size sets the cache's room, the hinted targets' starts and every
// multiplier to 1.
func (p *adaptivePolicy) Size(pages int) {
	p.pages = max(pages, 1)
	p.target = [adaptiveQueues]int{adaptiveReuse: p.pages}
	for q := range p.m {
		p.m[q] = 1
	}
}

func (p *adaptivePolicy) EvictedClass(hash uint64, c Class) {
	if p.ghosts.hash == nil {
		p.ghosts.init(p.pages)
	}
	q := adaptiveClass(c)
	p.ghosts.add(hash, uint8(q))
	if q >= adaptiveFirst && q < adaptiveReuse {
		p.evs++
		rho := p.rets / p.evs
		p.m[q] = max(p.m[q]*(1-adaptiveRate*rho), 1.0/AdaptiveMaxMultiplier)
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
	seg, ok := p.ghosts.take(hash)
	if !ok {
		return false
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
