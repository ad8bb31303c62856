package evict

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
// again (not evicted). Every call is O(1) and allocates nothing after the
// policy's first eviction.
type ClassPolicy interface {
	GhostPolicy
	EnqueueClass(c Class) int
	EvictedClass(hash uint64, c Class)
	Reused(queue int)
}

// The adaptive policy's queues (segments): pages hinted dead, pages
// without a hint that served no hit (ARC's probation, T1), pages without a
// hint that did (ARC's main, T2), pages hinted live.
const (
	adaptiveNoReuse   = 0
	adaptiveProbation = 1
	adaptiveMain      = 2
	adaptiveReuse     = 3
	adaptiveQueues    = 4
)

// adaptivePolicy is ARC over pages without a hint, with a segment on
// either side for hinted pages, each segment's room learned from a ghost
// history of the last len(pages) evictions, each ghost with the segment
// it left (ARC's rule, per segment: a page stored again while its ghost
// is remembered means its segment was too short):
//
//   - the dead-hinted segment's target starts at 0 (the hint is believed)
//     and grows on a return of one of its ghosts, by max(1, other ghosts /
//     its ghosts), and shrinks on a return of any other segment's ghost,
//     by max(1, its ghosts / other ghosts);
//   - the live-hinted segment's target starts at the whole cache (the
//     hint is believed) and moves by the same rule;
//   - ARC's probation target p starts at half the cache and moves on
//     returns from probation and main as in ARC.
//
// The victim is the oldest page of the first segment over its target, in
// the order dead-hinted, live-hinted, then ARC's choice between probation
// and main; failing that, the first non-empty of dead-hinted, probation,
// main, live-hinted. A hint is thus worth what its returns show: hints
// that lie make their segment's target drift until the hint counts for
// nothing. Without hints it is ARC. O(1) per operation.
type adaptivePolicy struct {
	pages  int
	target [adaptiveQueues]int // per segment; probation's is ARC's p, main's unused
	ghosts ghosts
}

func newAdaptive() *adaptivePolicy { return &adaptivePolicy{} }

func (*adaptivePolicy) Name() string { return Adaptive }
func (*adaptivePolicy) Queues() int  { return adaptiveQueues }

// adaptiveClass is the segment of class c.
func adaptiveClass(c Class) int {
	switch {
	case c.Hint == HintNoReuse:
		return adaptiveNoReuse
	case c.Hint == HintReuse:
		return adaptiveReuse
	case c.Hits == 0:
		return adaptiveProbation
	}
	return adaptiveMain
}

func (p *adaptivePolicy) Enqueue(hits uint32) int          { return adaptiveClass(Class{Hits: hits}) }
func (p *adaptivePolicy) EnqueueClass(c Class) int         { return adaptiveClass(c) }
func (p *adaptivePolicy) Evicted(hash uint64, hits uint32) { p.EvictedClass(hash, Class{Hits: hits}) }
func (p *adaptivePolicy) Reused(int)                       {}

func (p *adaptivePolicy) EvictedClass(hash uint64, c Class) {
	if p.ghosts.hash == nil {
		p.ghosts.init(p.pages)
	}
	p.ghosts.add(hash, uint8(adaptiveClass(c)))
}

// Size sets the cache's room and the targets' starts.
func (p *adaptivePolicy) Size(pages int) {
	p.pages = max(pages, 1)
	p.target = [adaptiveQueues]int{adaptiveNoReuse: 0, adaptiveProbation: p.pages / 2, adaptiveReuse: p.pages}
}

// Returned moves the targets by the segment the page's ghost left; the
// page then counts as having served a hit.
func (p *adaptivePolicy) Returned(hash uint64) bool {
	if p.ghosts.hash == nil {
		return false
	}
	seg, ok := p.ghosts.take(hash)
	if !ok {
		return false
	}
	n := p.ghosts.count
	n[seg]++ // sizes before the ghost left, as ARC takes them
	total := n[0] + n[1] + n[2] + n[3]
	for _, s := range [...]int{adaptiveNoReuse, adaptiveReuse} {
		mine, other := n[s], total-n[s]
		if int(seg) == s {
			p.target[s] = min(p.pages, p.target[s]+max(1, other/max(mine, 1)))
		} else {
			p.target[s] = max(0, p.target[s]-max(1, mine/max(other, 1)))
		}
	}
	n1, n2 := max(n[adaptiveProbation], 1), max(n[adaptiveMain], 1)
	switch seg {
	case adaptiveProbation:
		p.target[adaptiveProbation] = min(p.pages, p.target[adaptiveProbation]+max(1, n2/n1))
	case adaptiveMain:
		p.target[adaptiveProbation] = max(0, p.target[adaptiveProbation]-max(1, n1/n2))
	}
	return true
}

func (p *adaptivePolicy) Dequeue(lens []int) int {
	switch {
	case lens[adaptiveNoReuse] > p.target[adaptiveNoReuse]:
		return adaptiveNoReuse
	case lens[adaptiveReuse] > p.target[adaptiveReuse]:
		return adaptiveReuse
	case lens[adaptiveProbation] > 0 && (lens[adaptiveMain] == 0 || lens[adaptiveProbation] > p.target[adaptiveProbation]):
		return adaptiveProbation
	case lens[adaptiveMain] > 0:
		return adaptiveMain
	case lens[adaptiveNoReuse] > 0:
		return adaptiveNoReuse
	}
	return adaptiveReuse
}
