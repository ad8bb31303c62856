package evict

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
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
	class Class  // what it was pushed with
}

// refGhost is one eviction ARC's reference remembers: live until its page
// returns or is evicted again.
type refGhost struct {
	hash  uint64
	main  bool
	live  bool
	queue int    // adaptive: the queue it left
	idle  uint32 // adaptive: the level's push count when its page became idle
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
	// adaptive, per level: the hinted segments' targets (dead, live), the
	// classes' lifetime multipliers, the counted returns and evictions.
	hinted    [][2]int
	mult      [][adaptiveQueues]float64
	rets, evs []float64
	// adaptive's plan, per level: pushes, pushes since the last halving,
	// class evictions since the last plan, per class the pushes and the
	// reuse gaps by log2 bucket, the bypassed classes; and how many
	// victims came from a bypassed class.
	now        []uint32
	sinceDecay []int
	sincePlan  []int
	pushed     [][AdaptiveClasses]float64
	gaps       [][AdaptiveClasses][33]float64
	bypass     [][adaptiveQueues]bool
	bypassed   int
}

func newRefModel(name string, levels, slots int) *refModel {
	m := &refModel{name: name, slots: slots, target: make([]int, levels), ghosts: make([][]refGhost, levels),
		hinted: make([][2]int, levels), mult: make([][adaptiveQueues]float64, levels),
		rets: make([]float64, levels), evs: make([]float64, levels),
		now: make([]uint32, levels), sinceDecay: make([]int, levels), sincePlan: make([]int, levels),
		pushed: make([][AdaptiveClasses]float64, levels), gaps: make([][AdaptiveClasses][33]float64, levels),
		bypass: make([][adaptiveQueues]bool, levels)}
	for i := range m.target {
		m.target[i] = max(slots, 1) / 2
		m.hinted[i][1] = max(slots, 1)
		for q := range m.mult[i] {
			m.mult[i][q] = 1
		}
	}
	return m
}

func (m *refModel) push(slot int32, level int, c Class) {
	rrpv := 2 // SRRIP: a page without hits is re-referenced in a "long" interval
	if c.Hits > 0 {
		rrpv = 0
	}
	m.entries = append(m.entries, refEntry{slot: slot, level: level, seq: m.seq, hits: c.Hits, rrpv: rrpv, class: c})
	m.seq++
	if m.name != Adaptive {
		return
	}
	m.now[level]++
	if q := refAdaptiveQueue(c); q >= 1 && q <= AdaptiveClasses {
		m.pushed[level][q-1]++
	}
	if m.sinceDecay[level]++; m.sinceDecay[level] >= 16*max(m.slots, 1) {
		m.sinceDecay[level] = 0
		for c := range m.pushed[level] {
			m.pushed[level][c] /= 2
			for b := range m.gaps[level][c] {
				m.gaps[level][c][b] /= 2
			}
		}
	}
}

// gapBucket is the log2 bucket of a gap, written out: bucket b holds
// [2^(b-1), 2^b), bucket 0 the gap 0.
func refGapBucket(gap uint32) int {
	b := 0
	for uint64(gap) >= uint64(1)<<b {
		b++
	}
	return b
}

// reuse is an entry used again (not evicted): adaptive counts its gap.
func (m *refModel) reuse(slot int32) {
	i := slices.IndexFunc(m.entries, func(e refEntry) bool { return e.slot == slot })
	if e := m.entries[i]; m.name == Adaptive {
		if q := refAdaptiveQueue(e.class); q >= 1 && q <= AdaptiveClasses {
			m.gaps[e.level][q-1][refGapBucket(uint32(m.seq-e.seq))]++
		}
	}
	m.remove(slot)
}

// refReused is v_c(L): the share of class c's pushes reused within L
// pushes, each bucket's gaps spread evenly over [lo, hi).
func (m *refModel) refReused(level, c int, L float64) float64 {
	if m.pushed[level][c] <= 0 {
		return 0
	}
	v := 0.0
	for b := 0; b < 33; b++ {
		lo, hi := 0.0, 1.0
		if b > 0 {
			lo, hi = float64(uint64(1)<<(b-1)), float64(uint64(1)<<b)
		}
		switch {
		case hi <= L:
			v += m.gaps[level][c][b]
		case lo <= L:
			v += m.gaps[level][c][b] * (L - lo) / (hi - lo)
		}
	}
	return v / m.pushed[level][c]
}

// plan is adaptive's choice of bypassed classes, the slow way: for each
// candidate lifetime 2^4..2^32, the classes ordered by v(L) (stable),
// each prefix K valued at Σ_K share·v(pages / Σ_K share); the best prefix
// of all is kept (the whole order on a tie), the rest bypassed.
func (m *refModel) plan(level int) {
	total := 0.0
	for _, n := range m.pushed[level] {
		total += n
	}
	if total == 0 {
		return
	}
	var keep []int
	bestVal := -1.0
	for cand := 4; cand < 33; cand++ {
		L := float64(uint64(1) << cand)
		order := make([]int, AdaptiveClasses)
		for i := range order {
			order[i] = i
		}
		sort.SliceStable(order, func(a, b int) bool { return m.refReused(level, order[a], L) > m.refReused(level, order[b], L) })
		share := 0.0
		for k, c := range order {
			share += m.pushed[level][c] / total
			if share == 0 {
				continue
			}
			lk, val := float64(max(m.slots, 1))/share, 0.0
			for _, c2 := range order[:k+1] {
				val += m.pushed[level][c2] / total * m.refReused(level, c2, lk)
			}
			if val > bestVal || (k == len(order)-1 && val >= bestVal) {
				bestVal, keep = val, slices.Clone(order[:k+1])
			}
		}
	}
	for q := 1; q <= AdaptiveClasses; q++ {
		m.bypass[level][q] = !slices.Contains(keep, q-1)
	}
}

// refAdaptiveQueue is adaptive's queue for class c, written out: dead
// hint 0, live hint 31, else 1 + 6 × depth bucket (0–1, 2–3, 4–7, 8–15,
// 16+) + hit bucket (0, 1, 2, 3, 4–7, 8+).
func refAdaptiveQueue(c Class) int {
	switch c.Hint {
	case HintNoReuse:
		return 0
	case HintReuse:
		return 31
	}
	d := 0
	for lo := uint32(2); d < 4 && c.Depth >= lo; lo *= 2 {
		d++
	}
	h := int(c.Hits)
	switch {
	case h >= 8:
		h = 5
	case h >= 4:
		h = 4
	}
	return 1 + 6*d + h
}

// adaptiveVictim is adaptive's rule over the level's entries: a hinted
// segment over its target, else the class whose oldest page is oldest
// over its multiplier, else a hinted segment.
func (m *refModel) adaptiveVictim(level int) int {
	var n [adaptiveQueues]int
	oldest := [adaptiveQueues]int{}
	for q := range oldest {
		oldest[q] = -1
	}
	for i, e := range m.entries {
		if e.level != level {
			continue
		}
		q := refAdaptiveQueue(e.class)
		n[q]++
		if oldest[q] < 0 || e.seq < m.entries[oldest[q]].seq {
			oldest[q] = i
		}
	}
	dead, live := 0, 1+AdaptiveClasses
	switch {
	case n[dead] > m.hinted[level][0]:
		return oldest[dead]
	case n[live] > m.hinted[level][1]:
		return oldest[live]
	}
	by := -1
	for q := 1; q < live; q++ {
		if m.bypass[level][q] && n[q] > 0 && (by < 0 || m.entries[oldest[q]].seq < m.entries[oldest[by]].seq) {
			by = q
		}
	}
	if by >= 0 {
		m.bypassed++
		return oldest[by]
	}
	best, score := -1, 0.0
	for q := 1; q < live; q++ {
		if n[q] == 0 {
			continue
		}
		age := float64(m.seq - m.entries[oldest[q]].seq)
		if s := age / m.mult[level][q]; best < 0 || s > score {
			best, score = oldest[q], s
		}
	}
	switch {
	case best >= 0:
		return best
	case n[dead] > 0:
		return oldest[dead]
	}
	return oldest[live]
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
		case Adaptive:
			i = m.adaptiveVictim(level)
		case ARC:
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

// evicted remembers hash as the newest ghost (ARC: of main if it had
// hits; adaptive: of its queue with its idle stamp, the class's
// multiplier shrinks unless the class is bypassed, and every
// max(slots/4, 64) class evictions the plan runs). age is the pushes
// (of every level) since the page became idle.
func (m *refModel) evicted(level int, hash uint64, c Class, age uint32) {
	if !arcLike(m.name) || m.slots == 0 {
		return
	}
	g := m.ghosts[level]
	for i := range g {
		if g[i].hash == hash {
			g[i].live = false
		}
	}
	q := refAdaptiveQueue(c)
	history := m.slots
	if m.name == Adaptive {
		history = 4 * m.slots
	}
	g = append(g, refGhost{hash, c.Hits > 0, true, q, m.now[level] - age})
	if len(g) > history {
		g = g[1:]
	}
	m.ghosts[level] = g
	if m.name == Adaptive && q >= 1 && q <= AdaptiveClasses {
		if !m.bypass[level][q] {
			m.evs[level]++
			rho := m.rets[level] / m.evs[level]
			m.mult[level][q] = max(m.mult[level][q]*(1-0.01*rho), 1.0/64)
		}
		if m.sincePlan[level]++; m.sincePlan[level] >= max(m.slots/4, 64) {
			m.sincePlan[level] = 0
			m.plan(level)
		}
	}
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
	if m.name == Adaptive {
		m.adaptiveReturned(level, i)
		return true
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

// adaptiveReturned is adaptive's learning on the return of ghost i: each
// hinted segment's target by ARC's rule over (its ghosts, the others'),
// and a class's multiplier (×1.01, at most 64) when the ghost is younger
// than a quarter of the slots in evictions. (The constants are written
// out, so that changing the policy's fails here.)
func (m *refModel) adaptiveReturned(level, i int) {
	g := m.ghosts[level]
	var n [adaptiveQueues]int
	total := 0
	for _, x := range g {
		if x.live {
			n[x.queue]++
			total++
		}
	}
	seg, pages := g[i].queue, max(m.slots, 1)
	if seg >= 1 && seg <= AdaptiveClasses {
		m.gaps[level][seg-1][refGapBucket(m.now[level]-g[i].idle)]++
	}
	for j, s := range [2]int{0, 1 + AdaptiveClasses} {
		mine, other := n[s], total-n[s]
		t := &m.hinted[level][j]
		if seg == s {
			*t = min(pages, *t+max(1, other/max(mine, 1)))
		} else {
			*t = max(0, *t-max(1, mine/max(other, 1)))
		}
	}
	age := len(g) - 1 - i // evictions since
	if seg >= 1 && seg <= AdaptiveClasses && float64(age) < 0.25*float64(pages) {
		m.rets[level]++
		m.mult[level][seg] = min(m.mult[level][seg]*(1+0.01), 64)
		if m.evs[level] > 4*float64(pages) {
			m.evs[level] /= 2
			m.rets[level] /= 2
		}
	}
	g[i].live = false
}

// TestQueuesMatchReference drives Queues and the reference model with the
// same random pushes, removals, evictions and returning pages, for every
// policy, over one to three levels, with the Links kept by the queues or
// in the container's records, and compares every victim, every
// length and every ghost answer, checking invariants after each step.
func TestQueuesMatchReference(t *testing.T) {
	bypassed := 0 // adaptive's victims from a bypassed class, over every run
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
				hints := seed%3 != 0            // adaptive: hinted pages on some runs, none on others
				hashOf := make([]uint64, slots) // the page each slot holds
				for step := range 3000 {
					s := int32(rng.IntN(slots))
					switch op := rng.IntN(8); {
					case op < 3 && !q.Queued(s): // a page stored (or used again) becomes evictable
						level := rng.IntN(levels)
						hits := uint32(0)
						if rng.IntN(3) == 0 {
							hits = uint32(1 + rng.IntN(10))
						} else {
							hashOf[s] = uint64(rng.IntN(2 * slots)) // a page, maybe one evicted before
							got, want := q.Returned(level, hashOf[s]), ref.returned(level, hashOf[s])
							require.Equal(t, want, got, "step %d: returned %d", step, hashOf[s])
							if got {
								hits = 1
							}
						}
						c := Class{Hits: hits, Depth: uint32(rng.IntN(40))}
						if r := rng.IntN(8); r < 2 && hints {
							c.Hint = Hint(1 + r) // HintReuse, HintNoReuse
						}
						q.PushClass(s, level, c)
						ref.push(s, level, c)
					case op < 5 && q.Queued(s): // used: off its queue
						q.Reuse(s)
						ref.reuse(s)
					case op >= 5: // evict
						v, want := q.Victim(), ref.victim()
						require.Equal(t, want, v, "step %d: victim", step)
						if v != None {
							level, _, _ := q.Position(v)
							i := slices.IndexFunc(ref.entries, func(e refEntry) bool { return e.slot == v })
							q.EvictedSlot(v, level, hashOf[v], ref.entries[i].class)
							ref.evicted(level, hashOf[v], ref.entries[i].class, uint32(ref.seq-ref.entries[i].seq))
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
				if name == Adaptive { // the learning was reached, and agrees
					learned := false
					for level := range levels {
						a := q.Policy(level).(*adaptivePolicy)
						require.Equal(t, ref.mult[level], a.m, "level %d multipliers", level)
						require.Equal(t, ref.bypass[level], a.bypass, "level %d bypassed classes", level)
						require.Equal(t, ref.gaps[level], a.gaps, "level %d reuse gaps", level)
						require.Equal(t, ref.hinted[level], [2]int{a.target[adaptiveNoReuse], a.target[adaptiveReuse]}, "level %d hinted targets", level)
						learned = learned || ref.rets[level] > 0
					}
					require.True(t, learned || slots < 4, "no counted ghost return in %d slots", slots)
					bypassed += ref.bypassed
				}
			})
		}
	}
	require.Positive(t, bypassed, "adaptive never bypassed a class")
}

// arcLike reports whether the reference keeps ARC's ghost history for
// name (adaptive keeps it too, each ghost with its queue).
func arcLike(name string) bool { return name == ARC || name == Adaptive }
