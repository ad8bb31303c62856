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
	q.own[2].prev = 3
	require.ErrorContains(t, q.CheckInvariants(), "broken at slot 2")
	q = fresh()
	q.own[1].queue = 1
	require.ErrorContains(t, q.CheckInvariants(), "record a queue")
	q = fresh()
	q.own[1].next = 2
	require.ErrorContains(t, q.CheckSlot(1), "on no queue but links")
	q = fresh()
	q.own[2].next = 1
	require.ErrorContains(t, q.CheckSlot(2), "not linked")
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

// record is a container's per-slot record with the Link inside it.
type record struct {
	payload [5]int32
	link    Link
	tail    uint8
}

// NewQueuesIn keeps the Links in the records: pushes write them there, and
// resetting a record of an unqueued slot keeps the queues whole.
func TestQueuesInRecords(t *testing.T) {
	recs := make([]record, 6)
	q, err := NewQueuesIn(SLRU, 1, recs, func(r *record) *Link { return &r.link })
	require.NoError(t, err)
	q.Push(4, 0, 0)
	q.Push(2, 0, 1)
	q.Push(0, 0, 0)
	require.NotZero(t, recs[4].link)
	require.Equal(t, []int32{4, 0}, walk(q, 0, slruProbation))
	q.Remove(4)
	require.Zero(t, recs[4].link)
	recs[4] = record{tail: 7} // a container resets an unqueued record
	require.NoError(t, q.CheckInvariants())
	require.Equal(t, int32(0), q.Victim())

	recs[1].link.queue = 1
	_, err = NewQueuesIn(LRU, 1, recs[:2], func(r *record) *Link { return &r.link })
	require.ErrorContains(t, err, "not zero")
	var elsewhere Link
	_, err = NewQueuesIn(LRU, 1, make([]record, 2), func(*record) *Link { return &elsewhere })
	require.ErrorContains(t, err, "not inside its record")
	q, err = NewQueuesIn(LRU, 1, []record(nil), func(r *record) *Link { return &r.link })
	require.NoError(t, err)
	require.Equal(t, None, q.Victim())
}
