package evict

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// refEntry is one evictable slot of the reference model.
type refEntry struct {
	slot  int32
	level int
	seq   int    // enqueue order
	hits  uint32 // the hits it was enqueued with
	rrpv  int    // SRRIP's re-reference prediction, aged in place
}

// refGhost is one eviction ARC's reference remembers: live until its page
// returns or is evicted again.
type refGhost struct {
	hash uint64
	main bool
	live bool
}

// refModel is the slow, obvious twin of Queues with each policy written as
// its paper states it: a flat list of evictable slots, scanned for the
// victim. No queues, no due-date ring, no hash index.
type refModel struct {
	name    string
	slots   int
	entries []refEntry
	seq     int
	// ARC, per level: the probation target and the last `slots`
	// evictions, oldest first.
	target []int
	ghosts [][]refGhost
}

func newRefModel(name string, levels, slots int) *refModel {
	m := &refModel{name: name, slots: slots, target: make([]int, levels), ghosts: make([][]refGhost, levels)}
	for i := range m.target {
		m.target[i] = max(slots, 1) / 2
	}
	return m
}

func (m *refModel) push(slot int32, level int, hits uint32) {
	rrpv := 2 // SRRIP: a page without hits is re-referenced in a "long" interval
	if hits > 0 {
		rrpv = 0
	}
	m.entries = append(m.entries, refEntry{slot: slot, level: level, seq: m.seq, hits: hits, rrpv: rrpv})
	m.seq++
}

func (m *refModel) remove(slot int32) {
	m.entries = slices.DeleteFunc(m.entries, func(e refEntry) bool { return e.slot == slot })
}

// oldest is the earliest enqueued entry of level that keep accepts, or -1.
func (m *refModel) oldest(level int, keep func(e refEntry) bool) int {
	best := -1
	for i, e := range m.entries {
		if e.level == level && keep(e) && (best < 0 || e.seq < m.entries[best].seq) {
			best = i
		}
	}
	return best
}

func (m *refModel) victim() int32 {
	for level := range m.target {
		count := func(keep func(e refEntry) bool) int {
			n := 0
			for _, e := range m.entries {
				if e.level == level && keep(e) {
					n++
				}
			}
			return n
		}
		any := func(refEntry) bool { return true }
		fresh := func(e refEntry) bool { return e.hits == 0 }
		reused := func(e refEntry) bool { return e.hits > 0 }
		if count(any) == 0 {
			continue
		}
		var i int
		switch m.name {
		case LRU:
			i = m.oldest(level, any)
		case SLRU:
			prob, prot := count(fresh), count(reused)
			if prob == 0 || float64(prot) > SLRUProtectedShare*float64(prot+prob) {
				i = m.oldest(level, reused)
			} else {
				i = m.oldest(level, fresh)
			}
		case ARC, Adaptive:
			if count(reused) == 0 || count(fresh) > m.target[level] {
				i = m.oldest(level, fresh)
			} else {
				i = m.oldest(level, reused)
			}
		case SRRIP:
			// Age every page of the level until one is predicted distant
			// (RRPV 3), then take the oldest such.
			distant := func(e refEntry) bool { return e.rrpv == 3 }
			for count(distant) == 0 {
				for j := range m.entries {
					if m.entries[j].level == level {
						m.entries[j].rrpv++
					}
				}
			}
			i = m.oldest(level, distant)
		default:
			panic(m.name)
		}
		return m.entries[i].slot
	}
	return None
}

// evicted remembers hash as ARC's newest ghost (of main if it had hits).
func (m *refModel) evicted(level int, hash uint64, hits uint32) {
	if !arcLike(m.name) || m.slots == 0 {
		return
	}
	g := m.ghosts[level]
	for i := range g {
		if g[i].hash == hash {
			g[i].live = false
		}
	}
	g = append(g, refGhost{hash, hits > 0, true})
	if len(g) > m.slots {
		g = g[1:]
	}
	m.ghosts[level] = g
}

// returned is ARC's adaptation on a ghost hit.
func (m *refModel) returned(level int, hash uint64) bool {
	if !arcLike(m.name) {
		return false
	}
	i := slices.IndexFunc(m.ghosts[level], func(x refGhost) bool { return x.live && x.hash == hash })
	if i < 0 {
		return false
	}
	var b1, b2 int
	for _, x := range m.ghosts[level] {
		switch {
		case !x.live:
		case x.main:
			b2++
		default:
			b1++
		}
	}
	if m.ghosts[level][i].main {
		m.target[level] = max(0, m.target[level]-max(1, b1/b2))
	} else {
		m.target[level] = min(max(m.slots, 1), m.target[level]+max(1, b2/b1))
	}
	m.ghosts[level][i].live = false
	return true
}

// TestQueuesMatchReference drives Queues and the reference model with the
// same random pushes, removals, evictions and returning pages, for every
// policy, over one to three levels, with the Links kept by the queues or
// in the container's records, and compares every victim, every
// length and every ghost answer, checking invariants after each step.
func TestQueuesMatchReference(t *testing.T) {
	for _, name := range Names() {
		for seed := range uint64(6) {
			t.Run(fmt.Sprintf("%s/%d", name, seed), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 36))
				slots := 1 + rng.IntN(24)
				levels := 1 + rng.IntN(3)
				// Odd seeds keep the Links in records of their own.
				q, err := NewQueues(name, levels, slots)
				if seed%2 == 1 {
					q, err = NewQueuesIn(name, levels, make([]record, slots), func(r *record) *Link { return &r.link })
				}
				require.NoError(t, err)
				ref := newRefModel(name, levels, slots)
				hashOf := make([]uint64, slots) // the page each slot holds
				for step := range 3000 {
					s := int32(rng.IntN(slots))
					switch op := rng.IntN(8); {
					case op < 3 && !q.Queued(s): // a page stored (or used again) becomes evictable
						level := rng.IntN(levels)
						hits := uint32(0)
						if rng.IntN(3) == 0 {
							hits = uint32(1 + rng.IntN(3))
						} else {
							hashOf[s] = uint64(rng.IntN(2 * slots)) // a page, maybe one evicted before
							got, want := q.Returned(level, hashOf[s]), ref.returned(level, hashOf[s])
							require.Equal(t, want, got, "step %d: returned %d", step, hashOf[s])
							if got {
								hits = 1
							}
						}
						q.Push(s, level, hits)
						ref.push(s, level, hits)
					case op < 5 && q.Queued(s): // used: off its queue
						q.Remove(s)
						ref.remove(s)
					case op >= 5: // evict
						v, want := q.Victim(), ref.victim()
						require.Equal(t, want, v, "step %d: victim", step)
						if v != None {
							level, _, _ := q.Position(v)
							i := slices.IndexFunc(ref.entries, func(e refEntry) bool { return e.slot == v })
							q.Evicted(level, hashOf[v], ref.entries[i].hits)
							ref.evicted(level, hashOf[v], ref.entries[i].hits)
							q.Remove(v)
							ref.remove(v)
						}
					}
					require.Equal(t, len(ref.entries), q.Len(), "step %d", step)
					for level := range levels {
						n := 0
						for _, e := range ref.entries {
							if e.level == level {
								n++
							}
						}
						require.Equal(t, n, q.LevelLen(level), "step %d level %d", step, level)
					}
					require.NoError(t, q.CheckInvariants(), "step %d", step)
				}
			})
		}
	}
}

// arcLike reports whether the reference runs name as ARC: "adaptive"
// without hints is ARC (its hint segments stay empty).
func arcLike(name string) bool { return name == ARC || name == Adaptive }
