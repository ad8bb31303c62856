package evict

// A GhostPolicy is a [Policy] that also learns from the pages its container
// evicts and stores again (ARC). Its container calls:
//   - Size once, before any other call, with the number of pages it can
//     hold;
//   - Evicted for every page eviction removes (a victim and the pages cut
//     with it), with the page's hash and the hits its container would
//     enqueue it with;
//   - Returned for every page it stores, with its hash; when it reports
//     true, the page counts as having served a hit until it serves one
//     (it is enqueued with hits 1).
//
// Every call is O(1) and allocates nothing once the policy has taken its
// memory (at most once per policy, at its first eviction).
type GhostPolicy interface {
	Policy
	Size(pages int)
	Evicted(hash uint64, hits uint32)
	Returned(hash uint64) bool
}

// arcPolicy: queue 0 is probation (T1), queue 1 main (T2).
type arcPolicy struct {
	pages  int // the container's capacity: ARC's c
	target int // the probation target, 0..pages (ARC's p)
	ghosts ghosts
}

const (
	arcProbation = 0
	arcMain      = 1
)

func (*arcPolicy) Name() string { return ARC }
func (*arcPolicy) Queues() int  { return 2 }

func (p *arcPolicy) Enqueue(hits uint32) int {
	if hits == 0 {
		return arcProbation
	}
	return arcMain
}

func (p *arcPolicy) Dequeue(lens []int) int {
	if lens[arcMain] == 0 || lens[arcProbation] > p.target {
		return arcProbation
	}
	return arcMain
}

// Size sets ARC's c and starts the target in the middle: no prior for
// recency over frequency.
func (p *arcPolicy) Size(pages int) {
	p.pages = max(pages, 1)
	p.target = p.pages / 2
}

func (p *arcPolicy) Evicted(hash uint64, hits uint32) {
	if p.ghosts.hash == nil {
		p.ghosts.init(p.pages)
	}
	p.ghosts.add(hash, uint8(p.Enqueue(hits)))
}

// Returned is ARC's adaptation on a ghost hit: by max(1, |B2|/|B1|) up on
// B1, by max(1, |B1|/|B2|) down on B2, sizes taken before the ghost
// leaves.
func (p *arcPolicy) Returned(hash uint64) bool {
	if p.ghosts.hash == nil {
		return false
	}
	list, ok := p.ghosts.take(hash)
	if !ok {
		return false
	}
	n0, n1 := p.ghosts.count[arcProbation], p.ghosts.count[arcMain]
	if list == arcProbation {
		n0++
		p.target = min(p.pages, p.target+max(1, n1/n0))
	} else {
		n1++
		p.target = max(0, p.target-max(1, n0/n1))
	}
	return true
}

// ghosts is a FIFO of the last len(hash) evicted pages' hashes, each with
// the list it left (0 or 1), distinct, with an open-addressing index from
// hash to ring slot (linear probing, backward-shift deletion): O(1) per
// operation, no allocation after init.
type ghosts struct {
	hash  []uint64        // ring of slots
	list  []uint8         // each slot's list, or ghostEmpty
	head  int             // the next slot written (the oldest when the ring is full)
	index []int32         // slot+1 of a live ghost, 0 for none; len a power of two
	count [ghostLists]int // live ghosts per list (ARC: 2; adaptive: a segment each)
	idle  []uint32        // adaptive: each slot's idle stamp (initIdle); nil for ARC
}

const ghostEmpty = 0xff

// ghostLists is the most lists ghosts keep apart (adaptive's segments).
const ghostLists = MaxQueues

func (g *ghosts) init(n int) {
	g.hash = make([]uint64, n)
	g.list = make([]uint8, n)
	for i := range g.list {
		g.list[i] = ghostEmpty
	}
	size := 2
	for size < 2*n {
		size *= 2
	}
	g.index = make([]int32, size)
}

// initIdle is init with an idle stamp kept per ghost.
func (g *ghosts) initIdle(n int) {
	g.init(n)
	g.idle = make([]uint32, n)
}

// home is hash h's first probe position.
func (g *ghosts) home(h uint64) int {
	h ^= h >> 29
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 32
	return int(h & uint64(len(g.index)-1))
}

// find returns the index position of h's ghost, or -1.
func (g *ghosts) find(h uint64) int {
	mask := len(g.index) - 1
	for i := g.home(h); g.index[i] != 0; i = (i + 1) & mask {
		if g.hash[g.index[i]-1] == h {
			return i
		}
	}
	return -1
}

// drop empties index position i and its slot, shifting later probes back.
func (g *ghosts) drop(i int) {
	slot := g.index[i] - 1
	g.count[g.list[slot]]--
	g.list[slot] = ghostEmpty
	mask := len(g.index) - 1
	for j := (i + 1) & mask; g.index[j] != 0; j = (j + 1) & mask {
		k := g.home(g.hash[g.index[j]-1])
		// Move j's entry to the hole at i unless its home lies in (i, j].
		if (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			g.index[i] = g.index[j]
			i = j
		}
	}
	g.index[i] = 0
}

// add remembers h as the newest ghost, of list l, forgetting the oldest
// when the ring is full and any older ghost of h.
func (g *ghosts) add(h uint64, l uint8) { g.addIdle(h, l, 0) }

// addIdle is add, remembering idle (adaptive: the push number at which
// the page became idle) where the ghosts keep it ([ghosts.initIdle]).
func (g *ghosts) addIdle(h uint64, l uint8, idle uint32) {
	if len(g.hash) == 0 {
		return
	}
	if i := g.find(h); i >= 0 {
		g.drop(i)
	}
	if g.list[g.head] != ghostEmpty {
		g.drop(g.find(g.hash[g.head]))
	}
	slot := g.head
	g.hash[slot], g.list[slot] = h, l
	if g.idle != nil {
		g.idle[slot] = idle
	}
	g.count[l]++
	g.head = (g.head + 1) % len(g.hash)
	mask := len(g.index) - 1
	i := g.home(h)
	for g.index[i] != 0 {
		i = (i + 1) & mask
	}
	g.index[i] = int32(slot) + 1
}

// take forgets h's ghost and returns its list.
func (g *ghosts) take(h uint64) (list uint8, ok bool) {
	list, _, ok = g.takeIdle(h)
	return list, ok
}

// takeIdle is take, returning also the idle stamp addIdle kept (0 where
// the ghosts keep none).
func (g *ghosts) takeIdle(h uint64) (list uint8, idle uint32, ok bool) {
	i := g.find(h)
	if i < 0 {
		return 0, 0, false
	}
	slot := g.index[i] - 1
	list = g.list[slot]
	if g.idle != nil {
		idle = g.idle[slot]
	}
	g.drop(i)
	return list, idle, true
}

// age is how many ghosts were added after h's, or -1 if h has none.
func (g *ghosts) age(h uint64) int {
	i := g.find(h)
	if i < 0 {
		return -1
	}
	slot := int(g.index[i] - 1)
	return (g.head - 1 - slot + 2*len(g.hash)) % len(g.hash)
}
