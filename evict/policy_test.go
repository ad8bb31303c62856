package evict

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestUnknownPolicyIsRejectedByName(t *testing.T) {
	_, err := New("lfu-ish")
	require.ErrorIs(t, err, ErrUnknownPolicy)
	require.ErrorContains(t, err, `"lfu-ish"`)
	require.ErrorContains(t, err, "arc, lru, slru, srrip")
	p, err := New("")
	require.NoError(t, err)
	require.Equal(t, LRU, p.Name(), "the default")
	require.Equal(t, []string{Adaptive, ARC, LRU, SLRU, SRRIP}, Names())
	for _, name := range Names() {
		p, err := New(name)
		require.NoError(t, err)
		require.Equal(t, name, p.Name())
		require.True(t, p.Queues() >= 1 && p.Queues() <= MaxQueues, name)
	}
}

// ghosts against a slice of the last n evictions: random adds and takes
// over a few hashes (so probes collide and wrap), every answer and count
// compared, and the index checked to hold exactly the live ghosts.
func TestGhostsMatchSlice(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, n := range []int{1, 2, 5, 14} {
		var g ghosts
		g.init(n)
		type rec struct {
			hash uint64
			list uint8
			live bool
		}
		var ref []rec
		for step := range 5000 {
			h := uint64(rng.IntN(3 * n))
			if rng.IntN(4) == 0 {
				h <<= 40 // far apart too
			}
			if rng.IntN(2) == 0 {
				l := uint8(rng.IntN(2))
				g.add(h, l)
				for i := range ref {
					if ref[i].live && ref[i].hash == h {
						ref[i].live = false
					}
				}
				ref = append(ref, rec{h, l, true})
				if len(ref) > n {
					ref = ref[1:]
				}
			} else {
				list, ok := g.take(h)
				var wl uint8
				wok := false
				for i := range ref {
					if ref[i].live && ref[i].hash == h {
						ref[i].live, wl, wok = false, ref[i].list, true
					}
				}
				require.Equal(t, [2]any{wok, wl}, [2]any{ok, list}, "n %d step %d take %d", n, step, h)
			}
			var count [ghostLists]int
			live := 0
			for _, r := range ref {
				if r.live {
					count[r.list]++
					live++
					require.GreaterOrEqual(t, g.find(r.hash), 0, "n %d step %d: ghost %d not found", n, step, r.hash)
				}
			}
			require.Equal(t, count, g.count, "n %d step %d", n, step)
			indexed := 0
			for _, x := range g.index {
				if x != 0 {
					indexed++
				}
			}
			require.Equal(t, live, indexed, "n %d step %d: index entries", n, step)
		}
	}
}

// ARC's target moves by the ratio of the ghost lists on a ghost hit: up
// when the page left probation, down when it left main; and a page that
// comes back is enqueued on main (its container enqueues it with one hit).
func TestARCLearnsFromGhosts(t *testing.T) {
	q, err := NewQueues(ARC, 1, 8)
	require.NoError(t, err)
	arc := q.Policy(0).(*arcPolicy)
	require.Equal(t, 4, arc.target, "starts in the middle")
	// store puts slot s, holding the page with hash h, on its queue as a
	// container does: hits 1 if the policy remembers h.
	store := func(s int32, h uint64, hits uint32) {
		if q.Returned(0, h) && hits == 0 {
			hits = 1
		}
		q.Push(s, 0, hits)
	}
	evictAll := func() {
		for q.Len() > 0 {
			v := q.Victim()
			_, k, _ := q.Position(v)
			q.Evicted(0, uint64(v)+100, uint32(k)) // hash 100+slot; main (queue 1) had hits
			q.Remove(v)
		}
	}
	// Three probation ghosts (hashes 100..102) and one main ghost (103).
	for s := range int32(3) {
		store(s, uint64(s)+100, 0)
	}
	store(3, 103, 1)
	evictAll()
	require.Equal(t, [ghostLists]int{3, 1}, arc.ghosts.count)
	// A probation ghost returns: up by max(1, 1/3) = 1, onto main.
	store(0, 100, 0)
	require.Equal(t, 5, arc.target)
	_, k, _ := q.Position(0)
	require.Equal(t, arcMain, k)
	// The main ghost returns: down by max(1, 2/1) = 2.
	store(1, 103, 0)
	require.Equal(t, 3, arc.target)
	require.Equal(t, [ghostLists]int{2, 0}, arc.ghosts.count)
	// A new page is on probation.
	store(2, 555, 0)
	_, k, _ = q.Position(2)
	require.Equal(t, arcProbation, k)
	require.NoError(t, q.CheckInvariants())
}

// TestAdaptiveLearnsFromGhosts draws adaptive's learning on one picture:
// class A's evicted pages come back at once, class B's never, so A's
// lifetime multiplier grows and B's shrinks, until a younger B page goes
// before an older A page; a ghost older than a quarter of the cache
// teaches nothing. With nothing learned the order is LRU's.
func TestAdaptiveLearnsFromGhosts(t *testing.T) {
	q, err := NewQueues(Adaptive, 1, 8)
	require.NoError(t, err)
	p := q.Policy(0).(*adaptivePolicy)
	classA, classB := Class{Depth: 20}, Class{Depth: 1}
	qa, qb := adaptiveClass(classA), adaptiveClass(classB)
	require.Equal(t, [2]int{adaptiveFirst + 4*AdaptiveHitClasses, adaptiveFirst}, [2]int{qa, qb})

	q.PushClass(0, 0, classA)
	q.PushClass(1, 0, classB)
	require.Equal(t, int32(0), q.Victim(), "nothing learned: the oldest")
	q.Remove(0)
	q.Remove(1)

	h := uint64(100)
	for range 100 {
		h++
		q.EvictedClass(0, h, classB) // never comes back
		h++
		q.EvictedClass(0, h, classA)
		require.True(t, q.Returned(0, h), "A's ghost")
	}
	require.Greater(t, p.m[qa], 1.5) // ×1.01 a return, ×(1 − 0.01ρ) an eviction, ρ ≈ ½
	require.Less(t, p.m[qb], 0.65)

	q.PushClass(2, 0, classA) // older
	q.PushClass(3, 0, classB)
	require.Equal(t, int32(3), q.Victim(), "B goes first although younger: age 1/m_B > 2/m_A")

	before := p.m
	for range 4 { // push B's ghost out of the young window (8/4 = 2 evictions)
		h++
		q.EvictedClass(0, h, classB)
	}
	mb := p.m[qb]
	require.True(t, q.Returned(0, h-3), "an old ghost is still remembered")
	require.Equal(t, mb, p.m[qb], "but teaches nothing")
	require.Less(t, p.m[qb], before[qb])
}

// TestAdaptiveBypassPlan draws the plan on one picture: class A's pages
// are all hit again some pushes after they become idle, class B's never.
// In a pool of 8 pages with one lifetime for both (8 pushes) A earns
// nothing when its gap is 12; kept alone, A lives 16 pushes and earns
// every reuse, so B is bypassed, and B's head goes before A's older one.
// With a gap of 4, inside the common lifetime, nothing is bypassed.
func TestAdaptiveBypassPlan(t *testing.T) {
	for _, gap := range []uint32{12, 4} {
		q, err := NewQueues(Adaptive, 1, 8)
		require.NoError(t, err)
		p := q.Policy(0).(*adaptivePolicy)
		a, b := Class{Hits: 9, Depth: 3}, Class{Depth: 30}
		qa, qb := adaptiveClass(a), adaptiveClass(b)
		for i := range adaptivePlanMin { // the first plan runs at the 64th class eviction
			require.False(t, p.bypass[qb], "planned before its time")
			p.EnqueueClass(a)
			p.EnqueueClass(b)
			p.Reused(qa, gap)
			p.EvictedClass(uint64(i), b)
		}
		require.Equal(t, gap == 12, p.bypass[qb], "gap %d: B bypassed", gap)
		require.False(t, p.bypass[qa], "gap %d: A bypassed", gap)
		q.PushClass(0, 0, a) // older
		q.PushClass(1, 0, b)
		want := int32(0) // the oldest: every multiplier is still 1
		if gap == 12 {
			want = 1
		}
		require.Equal(t, want, q.Victim(), "gap %d", gap)
	}
}
