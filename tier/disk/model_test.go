package disk

import (
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/evict"
	"github.com/pagedkv/pagedkv/tier"
)

// refDisk is the slow model of a store: the pages it holds, each with
// the sequence it was written at and the hits it served since, on the
// queues of an evict policy (plain slices, least recent first; its
// own instance of the policy): what any container of the policy must
// evict, written here without the store's slot lists.
type refDisk struct {
	capacity int
	name     string
	policy   evict.Policy
	ghost    evict.GhostPolicy // policy, if it keeps ghosts
	class    evict.ClassPolicy // policy, if it places pages by class
	aged     evict.AgePolicy   // policy, if it picks by its queue heads' ages
	queues   [][]tier.Digest
	pushed   map[tier.Digest]uint32 // each queued page's push number (an AgePolicy's ages)
	pushes   uint32
	seq      map[tier.Digest]uint64
	hits     map[tier.Digest]uint32
	returned map[tier.Digest]bool // the ghosts knew it when it was written
	next     uint64
}

func newRefDisk(t testing.TB, capacity int, policy string) *refDisk {
	r := &refDisk{capacity: capacity, name: policy, seq: map[tier.Digest]uint64{}, hits: map[tier.Digest]uint32{}, returned: map[tier.Digest]bool{},
		pushed: map[tier.Digest]uint32{}}
	r.reset(t)
	return r
}

// reset starts the policy and its queues afresh (empty).
func (r *refDisk) reset(t testing.TB) {
	p, err := evict.New(r.name)
	require.NoError(t, err)
	r.policy, r.queues = p, make([][]tier.Digest, p.Queues())
	r.ghost, _ = p.(evict.GhostPolicy)
	r.class, _ = p.(evict.ClassPolicy)
	r.aged, _ = p.(evict.AgePolicy)
	if r.ghost != nil {
		r.ghost.Size(r.capacity)
	}
}

// enqueueHits: a page the ghosts knew counts one hit until it serves one.
func (r *refDisk) enqueueHits(d tier.Digest) uint32 {
	if r.hits[d] == 0 && r.returned[d] {
		return 1
	}
	return r.hits[d]
}

func (r *refDisk) len() int { return len(r.seq) }

func (r *refDisk) enqueue(d tier.Digest) {
	var q int
	if r.class != nil {
		q = r.class.EnqueueClass(evict.Class{Hits: r.enqueueHits(d)})
	} else {
		q = r.policy.Enqueue(r.enqueueHits(d))
	}
	r.queues[q] = append(r.queues[q], d)
	r.pushed[d] = r.pushes
	r.pushes++
}

func (r *refDisk) unqueue(d tier.Digest) {
	for q := range r.queues {
		r.queues[q] = slices.DeleteFunc(r.queues[q], func(x tier.Digest) bool { return x == d })
	}
}

func (r *refDisk) store(d tier.Digest) {
	if _, ok := r.seq[d]; ok {
		return
	}
	if r.len() == r.capacity {
		lens := make([]int, len(r.queues))
		for q := range r.queues {
			lens[q] = len(r.queues[q])
		}
		var k int
		if r.aged != nil {
			ages := make([]uint32, len(r.queues))
			for q, queue := range r.queues {
				if len(queue) > 0 {
					ages[q] = r.pushes - r.pushed[queue[0]]
				}
			}
			k = r.aged.DequeueAges(lens, ages)
		} else {
			k = r.policy.Dequeue(lens)
		}
		v := r.queues[k][0]
		switch {
		case r.class != nil:
			r.class.EvictedClass(ghostHash(v), evict.Class{Hits: r.enqueueHits(v)})
		case r.ghost != nil:
			r.ghost.Evicted(ghostHash(v), r.enqueueHits(v))
		}
		r.remove(v)
	}
	r.next++
	r.seq[d], r.hits[d] = r.next, 0
	r.returned[d] = r.ghost != nil && r.ghost.Returned(ghostHash(d))
	r.enqueue(d)
}

// fetch serves the leading pages it holds, each counting a hit and
// joining the queue its hits give.
func (r *refDisk) fetch(chain []tier.RemotePage) int {
	for i, p := range chain {
		if _, ok := r.seq[p.Digest]; !ok {
			return i
		}
		r.unqueue(p.Digest)
		r.hits[p.Digest]++
		r.enqueue(p.Digest)
	}
	return len(chain)
}

// restart: a fresh policy learns the pages in write order, hits forgotten.
func (r *refDisk) restart(t testing.TB) {
	pages := slices.Collect(maps.Keys(r.seq))
	slices.SortFunc(pages, func(a, b tier.Digest) int { return cmp.Compare(r.seq[a], r.seq[b]) })
	r.reset(t)
	for _, d := range pages {
		r.hits[d], r.returned[d] = 0, false
		r.enqueue(d)
	}
}

// any returns one of the pages held, in a seeded order.
func (r *refDisk) any(rng *rand.Rand) tier.Digest {
	pages := slices.SortedFunc(maps.Keys(r.seq), func(a, b tier.Digest) int { return cmp.Compare(r.seq[a], r.seq[b]) })
	return pages[rng.IntN(len(pages))]
}

func (r *refDisk) remove(d tier.Digest) {
	r.unqueue(d)
	delete(r.seq, d)
	delete(r.hits, d)
	delete(r.returned, d)
}

// envInt reads a count from the environment, or returns def.
func envInt(t testing.TB, name string, def int) int {
	if v := os.Getenv(name); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, name)
		return n
	}
	return def
}

// TestStoreMatchesModel drives a store with random stores, lookups,
// clean restarts and restarts over damaged or duplicated slots, against
// refDisk, auditing after every operation, for each eviction policy
// evict knows (the seeds take them in turn). PAGEDKV_DISK_MODEL_OPS
// sets the operation count in all (default 20000; 3000 under CI=true).
func TestStoreMatchesModel(t *testing.T) {
	ops := 20000
	if os.Getenv("CI") == "true" {
		ops = 3000
	}
	ops = envInt(t, "PAGEDKV_DISK_MODEL_OPS", ops)
	if testing.Short() {
		ops = 1000
	}
	policies := evict.Names()
	runs := 2 * len(policies)
	for seed := uint64(1); seed <= uint64(runs); seed++ {
		policy := policies[int(seed-1)%len(policies)]
		t.Run(fmt.Sprintf("%s/%d", policy, seed), func(t *testing.T) { runModel(t, seed, policy, ops/runs) })
	}
}

func runModel(t *testing.T, seed uint64, policy string, ops int) {
	rng := rand.New(rand.NewPCG(seed, 31))
	dir := t.TempDir()
	cfg := testConfig(dir, 12)
	cfg.SegmentPages = 5 // segments of 5, 5 and 2 slots
	cfg.SyncEvery = -1
	cfg.Eviction = policy
	u := newUniverse(testFormat, 8, 6)
	ref := newRefDisk(t, cfg.Pages, policy)
	s := openStore(t, cfg)
	defer func() { s.Close() }()
	// Runs are read in pieces of 1 to 3 pages (a new size at each
	// restart): Fetch's goroutine and the read helper share them.
	setPieces(s, 1+rng.IntN(3))
	restarts, damaged, dups := 0, 0, 0
	var total tier.RemoteStats
	reopen := func(wantTorn, wantDup int) {
		st := s.Stats()
		require.Zero(t, st.Errors+st.Dropped+st.Rejected)
		total.Stored, total.Hits, total.Misses = total.Stored+st.Stored, total.Hits+st.Hits, total.Misses+st.Misses
		s = openStore(t, cfg)
		setPieces(s, 1+rng.IntN(3))
		rec := s.Recovery()
		require.Equal(t, ref.len(), rec.Recovered)
		require.Equal(t, wantTorn, rec.Torn)
		require.Equal(t, wantDup, rec.Duplicate)
		require.Zero(t, rec.Foreign)
		ref.restart(t)
		restarts++
	}
	for op := range ops {
		switch r := rng.IntN(100); {
		case r < 50: // store a run of a chain's pages, one at a time
			ch := u.chains[rng.IntN(len(u.chains))]
			a := rng.IntN(len(ch))
			for i := a; i < min(len(ch), a+1+rng.IntN(3)); i++ {
				require.True(t, s.Store(&ch[i]))
				flush(t, s)
				ref.store(ch[i].Digest)
			}
		case r < 90: // look a chain up from its first page
			ch := u.chains[rng.IntN(len(u.chains))]
			want := ref.fetch(ch)
			require.Equal(t, want, fetchChecked(t, s, request(ch)), "op %d: pages served", op)
		case r < 95: // clean restart
			require.NoError(t, s.Close())
			reopen(0, 0)
		case r < 98 && ref.len() > 0: // damage one byte of a page, restart
			d := ref.any(rng)
			slot := int(s.index[d])
			require.NoError(t, s.Close())
			off := rng.IntN(slotHeaderUsed + s.valueLen)
			if off >= slotHeaderUsed {
				off += s.valueOff - slotHeaderUsed
			}
			flipAt(t, s, slot, off)
			ref.remove(d)
			reopen(1, 0)
			damaged++
		case len(s.free) > 0 && ref.len() > 0: // copy a page into a free slot, restart
			d := ref.any(rng)
			from, to := int(s.index[d]), int(s.free[rng.IntN(len(s.free))])
			require.NoError(t, s.Close())
			copySlot(t, s, from, to)
			reopen(0, 1)
			dups++
		}
		require.NoError(t, s.CheckInvariants(), "op %d", op)
		require.Equal(t, ref.len(), s.DiskStats().Pages, "op %d", op)
		for d := range ref.seq {
			_, ok := s.index[d]
			require.True(t, ok, "op %d: the store evicted page %s, which the model holds", op, d.String()[:16])
		}
	}
	require.NoError(t, s.Close())
	reopen(0, 0)
	t.Logf("%s: %d ops: %d restarts (%d over a damaged slot, %d over a duplicated one), %d pages written, %d served, %d misses",
		policy, ops, restarts, damaged, dups, total.Stored, total.Hits, total.Misses)
}

func slotFile(t *testing.T, s *Store, slot int) (*os.File, int64) {
	f, err := os.OpenFile(filepath.Join(s.cfg.Dir, filepath.Base(s.segmentPath(slot/s.segSlots))), os.O_RDWR, 0)
	require.NoError(t, err)
	return f, int64(segmentHeaderBytes) + int64(slot%s.segSlots)*int64(s.slotBytes)
}

// flipAt inverts the byte at off in slot of a closed store.
func flipAt(t *testing.T, s *Store, slot, off int) {
	f, base := slotFile(t, s, slot)
	defer f.Close()
	b := []byte{0}
	_, err := f.ReadAt(b, base+int64(off))
	require.NoError(t, err)
	b[0] ^= 1 << (off % 8)
	_, err = f.WriteAt(b, base+int64(off))
	require.NoError(t, err)
}

// copySlot copies slot from over slot to in a closed store.
func copySlot(t *testing.T, s *Store, from, to int) {
	src, off := slotFile(t, s, from)
	defer src.Close()
	b := make([]byte, s.slotBytes)
	_, err := src.ReadAt(b, off)
	require.NoError(t, err)
	dst, off := slotFile(t, s, to)
	defer dst.Close()
	_, err = dst.WriteAt(b, off)
	require.NoError(t, err)
}
