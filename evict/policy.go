package evict

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// A Policy decides the order in which evictable slots leave, inside one
// priority level. Its container keeps one Policy per level and, per level,
// Queues() FIFO queues of evictable slots (a [Queues] does both); the
// policy only says which queue a slot joins when it becomes evictable
// (Enqueue) and which queue gives up the next victim (Dequeue). Every call
// is O(1) (O(Queues())) and allocates nothing.
//
// The container's contract:
//   - Enqueue is called when a slot becomes evictable, with the number of
//     hits the slot's page served since it was stored (at least 1 for a
//     page a [GhostPolicy] reported as returned); the slot joins the tail
//     of the returned queue. A slot leaves its queue when it is used
//     again or evicted.
//   - Dequeue is called with each queue's length (at least one > 0) and
//     returns a non-empty queue; the victim is that queue's head.
//
// Leaf-first: a prefix cache enqueues a request's pages deepest first, and
// a page's hits are at least its children's (a hit on a page is a hit on
// its whole prefix). A policy whose queue order depends only on (enqueue
// order, hits) monotonically — a later or more-hit page is never dequeued
// before an earlier, less-hit one of its own chain — therefore picks a
// page after its descendants.
//
// A Policy belongs to its container (see the package doc).
type Policy interface {
	// Name is the policy's name, as [New] takes it.
	Name() string
	// Queues is the number of queues per priority level, 1..MaxQueues.
	Queues() int
	// Enqueue returns the queue (0..Queues()-1) a slot joins when it
	// becomes evictable, given the hits its page served so far.
	Enqueue(hits uint32) int
	// Dequeue returns the queue the next victim comes from, given each
	// queue's length: a queue q with lens[q] > 0.
	Dequeue(lens []int) int
}

// MaxQueues bounds Policy.Queues.
const MaxQueues = 32

// Policy names, for [New] and the containers' configurations.
const (
	// LRU evicts the slot idle longest: one queue. The default.
	LRU = "lru"
	// SLRU is segmented LRU (Karedla, Love and Wherry, 1994): pages that
	// never served a hit wait on a probation queue, pages that did on a
	// protected one, which holds at most SLRUProtectedShare of the
	// evictable pages before it gives up victims too.
	SLRU = "slru"
	// SRRIP is static re-reference interval prediction (Jaleel et al.,
	// ISCA 2010) with 2-bit predictions and hit promotion: a page without
	// hits is predicted re-referenced in a "long" interval (RRPV 2), a page
	// with hits in a "near-immediate" one (RRPV 0); the victim is the
	// oldest page of the most distant prediction, and every page ages as
	// victims are taken. Unlike LRU it lets one burst of new, never-reused
	// pages go before pages that served hits, and unlike SLRU it still
	// lets hit pages go once they have aged past new ones.
	SRRIP = "srrip"
	// ARC is adaptive replacement (Megiddo and Modha, FAST '03). Pages
	// that never served a hit wait on a probation queue (ARC's T1), pages
	// that did, or that come back soon after their eviction, on a main
	// queue (T2). The victim comes from probation while it holds more than
	// a target number of evictable pages, else from main. The target is
	// learned online from a ghost history of recently evicted pages'
	// hashes (B1, B2; as many as the container has slots): a page stored
	// again while its ghost from probation is remembered means probation
	// was too short, and the target grows; one from main, that main was
	// too short, and it shrinks, each by ARC's ratio of the two ghost
	// lists' sizes. It is a [GhostPolicy].
	ARC = "arc"
	// Adaptive keeps a FIFO queue per class of page (5 chain-depth
	// buckets × 6 hit buckets, and one each for pages hinted dead and
	// live). It measures, per class, how long after becoming idle its
	// pages are used again (hits, and returns of a ghost history of the
	// pages it evicted) and bypasses the classes whose room earns fewer
	// hits than a longer stay of the others: their pages go first.
	// Among the other classes it evicts the head whose age over its
	// class's lifetime multiplier is largest, the multipliers learned
	// from the ghosts until every class earns the same reuse per unit of
	// space-time at its eviction point. With nothing learned it is LRU.
	// It is an [AgePolicy]; see adaptive.go.
	Adaptive = "adaptive"
)

// SLRUProtectedShare is the largest share of a level's evictable pages the
// protected segment of SLRU keeps before it gives up victims; 0.8 is the
// usual setting in the SLRU literature (and in S3-FIFO's main queue).
const SLRUProtectedShare = 0.8

// ErrUnknownPolicy reports a policy name that [New] does not know.
var ErrUnknownPolicy = errors.New("unknown eviction policy")

var makers = map[string]func() Policy{
	LRU:      func() Policy { return lruPolicy{} },
	SLRU:     func() Policy { return slruPolicy{} },
	SRRIP:    func() Policy { return &srripPolicy{} },
	ARC:      func() Policy { return &arcPolicy{} },
	Adaptive: func() Policy { return newAdaptive() },
}

// ReadsHints reports whether policy name reads continuation hints
// ([Class].Hint); the others place a page by its hits alone.
func ReadsHints(name string) bool { return name == Adaptive }

// Names returns the names New knows, sorted.
func Names() []string {
	names := make([]string, 0, len(makers))
	for n := range makers {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// New returns a fresh policy by name ("" means LRU). A container needs one
// per priority level: a policy may keep state.
func New(name string) (Policy, error) {
	if name == "" {
		name = LRU
	}
	mk, ok := makers[name]
	if !ok {
		return nil, fmt.Errorf("%w %q, want one of %s", ErrUnknownPolicy, name, strings.Join(Names(), ", "))
	}
	return mk(), nil
}

// lruPolicy: one queue in the order slots became evictable.
type lruPolicy struct{}

func (lruPolicy) Name() string           { return LRU }
func (lruPolicy) Queues() int            { return 1 }
func (lruPolicy) Enqueue(uint32) int     { return 0 }
func (lruPolicy) Dequeue(lens []int) int { return 0 }

// slruPolicy: queue 0 is probation (no hit yet), queue 1 protected.
type slruPolicy struct{}

const (
	slruProbation = 0
	slruProtected = 1
)

func (slruPolicy) Name() string { return SLRU }
func (slruPolicy) Queues() int  { return 2 }
func (slruPolicy) Enqueue(hits uint32) int {
	if hits == 0 {
		return slruProbation
	}
	return slruProtected
}
func (slruPolicy) Dequeue(lens []int) int {
	prot := lens[slruProtected]
	if lens[slruProbation] == 0 || float64(prot) > SLRUProtectedShare*float64(prot+lens[slruProbation]) {
		return slruProtected
	}
	return slruProbation
}

// srripPolicy keeps SRRIP's predictions as due dates on a ring: a page
// enqueued with re-reference prediction value r (0..3) is due at
// epoch+3-r, queue (epoch+3-r) mod 4. Due dates lie in [epoch, epoch+3]
// because epoch only advances to the earliest non-empty due date, so the
// four queues are the four due dates in order, oldest first within each.
// Taking the earliest due date and moving epoch to it is SRRIP's "age
// every line until one reaches RRPV 3", done in O(1).
type srripPolicy struct {
	epoch uint32
}

const (
	srripLevels = 4 // 2-bit RRPV: 0..3
	srripLong   = 2 // RRPV of a page inserted without hits
	srripNear   = 0 // RRPV of a page that served a hit
)

func (*srripPolicy) Name() string { return SRRIP }
func (*srripPolicy) Queues() int  { return srripLevels }
func (p *srripPolicy) Enqueue(hits uint32) int {
	rrpv := uint32(srripLong)
	if hits > 0 {
		rrpv = srripNear
	}
	return int((p.epoch + srripLevels - 1 - rrpv) % srripLevels)
}
func (p *srripPolicy) Dequeue(lens []int) int {
	for d := range uint32(srripLevels) {
		q := (p.epoch + d) % srripLevels
		if lens[q] > 0 {
			p.epoch += d
			return int(q)
		}
	}
	panic("evict: srrip Dequeue with every queue empty")
}
