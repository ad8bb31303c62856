package disk

import "fmt"

// Policy chooses which occupied slot to overwrite when the store is full.
// Slots are integers in [0, slots); the store tells the policy which slots
// hold a servable page and which page was served, and asks it for a victim.
// The interface is small on purpose: prefixcache's eviction policies (LRU,
// and those that follow it) can be adapted to it slot for slot.
//
// A Policy is called with the store's lock held; it need not be safe for
// concurrent use, and it must not allocate per call on the read path (Used).
type Policy interface {
	// Added: slot now holds a servable page (just written, or found by
	// the restart scan, oldest first).
	Added(slot int)
	// Used: the page in slot was served.
	Used(slot int)
	// Removed: slot no longer holds a servable page.
	Removed(slot int)
	// Victim returns the slot to overwrite next, without removing it
	// (the store calls Removed), or false when no slot is tracked.
	Victim() (slot int, ok bool)
	// Len is the number of slots tracked.
	Len() int
}

// NewLRU returns the default policy: least recently written or served
// first. It allocates its list once (two int32 per slot).
func NewLRU(slots int) Policy {
	l := &lru{prev: make([]int32, slots+1), next: make([]int32, slots+1), in: make([]bool, slots)}
	l.prev[slots], l.next[slots] = int32(slots), int32(slots) // the sentinel
	return l
}

// lru is a doubly linked list over slot numbers with a sentinel at index
// len(in): next of the sentinel is the least recently used slot.
type lru struct {
	prev, next []int32
	in         []bool
	n          int
}

func (l *lru) sentinel() int32 { return int32(len(l.in)) }

func (l *lru) Added(slot int) {
	if l.in[slot] {
		panic(fmt.Sprintf("disk: LRU: slot %d added twice", slot))
	}
	l.in[slot] = true
	l.n++
	l.pushBack(int32(slot))
}

func (l *lru) pushBack(s int32) {
	tail := l.prev[l.sentinel()]
	l.prev[s], l.next[s] = tail, l.sentinel()
	l.next[tail], l.prev[l.sentinel()] = s, s
}

func (l *lru) unlink(s int32) {
	l.next[l.prev[s]], l.prev[l.next[s]] = l.next[s], l.prev[s]
}

func (l *lru) Used(slot int) {
	if !l.in[slot] {
		panic(fmt.Sprintf("disk: LRU: slot %d used but not tracked", slot))
	}
	l.unlink(int32(slot))
	l.pushBack(int32(slot))
}

func (l *lru) Removed(slot int) {
	if !l.in[slot] {
		panic(fmt.Sprintf("disk: LRU: slot %d removed but not tracked", slot))
	}
	l.in[slot] = false
	l.n--
	l.unlink(int32(slot))
}

func (l *lru) Victim() (int, bool) {
	if l.n == 0 {
		return 0, false
	}
	return int(l.next[l.sentinel()]), true
}

func (l *lru) Len() int { return l.n }

// checkInvariants walks the list: it holds exactly the tracked slots, each
// once, with consistent links.
func (l *lru) checkInvariants() error {
	seen := 0
	for s, prev := l.next[l.sentinel()], l.sentinel(); s != l.sentinel(); prev, s = s, l.next[s] {
		if s < 0 || int(s) >= len(l.in) || !l.in[s] || l.prev[s] != prev || seen > l.n {
			return fmt.Errorf("disk: LRU list broken at slot %d after %d slots", s, seen)
		}
		seen++
	}
	if seen != l.n {
		return fmt.Errorf("disk: LRU list holds %d slots, the counter says %d", seen, l.n)
	}
	return nil
}
