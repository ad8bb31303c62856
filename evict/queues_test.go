package evict

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// walk lists queue k of level, head first.
func walk(q *Queues, level, k int) []int32 {
	var got []int32
	for s := q.Front(level, k); s != None; s = q.Next(s) {
		got = append(got, s)
	}
	return got
}

// TestQueuesPicture: SLRU over two levels; the pictures are each queue,
// oldest first.
func TestQueuesPicture(t *testing.T) {
	q, err := NewQueues(SLRU, 2, 8)
	require.NoError(t, err)
	require.Equal(t, SLRU, q.Name())
	require.Equal(t, 2, q.QueuesPerLevel())
	q.Push(3, 0, 0)
	q.Push(1, 0, 2)
	q.Push(5, 0, 0)
	q.Push(7, 1, 0)
	require.Equal(t, []int32{3, 5}, walk(q, 0, slruProbation))
	require.Equal(t, []int32{1}, walk(q, 0, slruProtected))
	require.Equal(t, []int32{7}, walk(q, 1, slruProbation))
	require.Equal(t, 4, q.Len())
	require.Equal(t, 3, q.LevelLen(0))
	require.Equal(t, 2, q.QueueLen(0, slruProbation))
	level, k, ok := q.Position(1)
	require.Equal(t, [3]any{0, slruProtected, true}, [3]any{level, k, ok})
	_, _, ok = q.Position(0)
	require.False(t, ok)

	require.Equal(t, int32(3), q.Victim(), "level 0 first, probation first")
	q.Remove(3)
	q.Remove(5)
	require.Equal(t, int32(1), q.Victim(), "probation empty: protected")
	q.Remove(1)
	require.Equal(t, int32(7), q.Victim(), "level 0 empty: level 1")
	q.Remove(7)
	require.Equal(t, None, q.Victim())
	require.NoError(t, q.CheckInvariants())
	require.Panics(t, func() { q.Remove(7) }, "on no queue")
	q.Push(7, 1, 0)
	require.Panics(t, func() { q.Push(7, 0, 0) }, "already queued")
}

// CheckInvariants reports a corrupted link, length or slot.
func TestQueuesCheckInvariantsFindsDamage(t *testing.T) {
	fresh := func() *Queues {
		q, err := NewQueues(LRU, 1, 4)
		require.NoError(t, err)
		q.Push(0, 0, 0)
		q.Push(2, 0, 0)
		require.NoError(t, q.CheckInvariants())
		return q
	}
	q := fresh()
	q.lens[0]++
	require.ErrorContains(t, q.CheckInvariants(), "length says")
	q = fresh()
	q.links[2].prev = 3
	require.ErrorContains(t, q.CheckInvariants(), "broken at slot 2")
	q = fresh()
	q.links[1].queue = 0
	require.ErrorContains(t, q.CheckInvariants(), "record a queue")
	q = fresh()
	q.links[1].next = 0
	require.ErrorContains(t, q.CheckSlot(1), "on no queue but links")
}

// Push, Remove, Victim and the ghost calls allocate nothing, under every
// policy (ARC's ghost history is taken at its first eviction).
func TestQueuesDoNotAllocate(t *testing.T) {
	for _, name := range Names() {
		q, err := NewQueues(name, 2, 16)
		require.NoError(t, err)
		q.Evicted(0, 1, 0)
		q.Evicted(1, 1, 0)
		h := uint64(0)
		allocs := testing.AllocsPerRun(100, func() {
			for s := range int32(16) {
				h++
				hits := uint32(0)
				if q.Returned(int(s)%2, h%40) {
					hits = 1
				}
				q.Push(s, int(s)%2, hits+uint32(s%3))
			}
			q.Remove(5)
			for q.Len() > 0 {
				v := q.Victim()
				q.Evicted(0, h+uint64(v), 0)
				q.Remove(v)
			}
		})
		require.Zero(t, allocs, name)
	}
}

func TestNewQueuesRefusesMismatchedPolicies(t *testing.T) {
	_, err := NewQueues("lfu", 1, 4)
	require.ErrorIs(t, err, ErrUnknownPolicy)
	_, err = NewQueues(LRU, 0, 4)
	require.Error(t, err)
	_, err = NewQueuesOf([]Policy{lruPolicy{}, slruPolicy{}}, 4)
	require.ErrorContains(t, err, "queues")
}
