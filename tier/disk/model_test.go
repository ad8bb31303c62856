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
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/evict"
	"github.com/pagedkv/pagedkv/tier"
)

// refDisk is the slow model of a store: the pages it holds, each with
// the sequence it was written at and the hits it served since, on the
// queues of an evict policy (plain slices, least recent first; its
// own instance of the policy): what any container of the policy must
// evict, written here without the store's slot lists.
//
// Retention: each level has its own instance of the policy and its own
// queues; a page joins its level's; a victim comes from the lowest level
// that holds a page. A level with a duration lapses to 0 at its deadline
// (deadline order, ties by the page's slot), the page joining level 0's
// tail; serving a page restarts its count.
type refDisk struct {
	capacity int
	name     string
	levels   []refLevel
	pushed   map[tier.Digest]uint32 // each queued page's push number (an AgePolicy's ages)
	level    map[tier.Digest]int
	dur      map[tier.Digest]time.Duration // of a page whose level lapses
	deadline map[tier.Digest]time.Duration // its deadline, Unix ns
	hint     map[tier.Digest]uint8
	written  map[tier.Digest]tier.Retention // as written, and when (Left: its deadline, Unix ns)
	lapses   int                            // levels lapsed so far
	slotOf   func(tier.Digest) int32        // ties of deadlines: the store's slot
	pushes   uint32
	seq      map[tier.Digest]uint64
	hits     map[tier.Digest]uint32
	returned map[tier.Digest]bool // the ghosts knew it when it was written
	next     uint64
}

func newRefDisk(t testing.TB, capacity, levels int, policy string) *refDisk {
	r := &refDisk{capacity: capacity, name: policy, seq: map[tier.Digest]uint64{}, hits: map[tier.Digest]uint32{}, returned: map[tier.Digest]bool{},
		pushed: map[tier.Digest]uint32{}, levels: make([]refLevel, levels),
		level: map[tier.Digest]int{}, hint: map[tier.Digest]uint8{}, written: map[tier.Digest]tier.Retention{}, dur: map[tier.Digest]time.Duration{}, deadline: map[tier.Digest]time.Duration{}}
	r.reset(t)
	return r
}

// refLevel is one retention level: its policy instance and queues.
type refLevel struct {
	policy evict.Policy
	ghost  evict.GhostPolicy // policy, if it keeps ghosts
	class  evict.ClassPolicy // policy, if it places pages by class
	aged   evict.AgePolicy   // policy, if it picks by its queue heads' ages
	queues [][]tier.Digest
}

// reset starts the policies and their queues afresh (empty).
func (r *refDisk) reset(t testing.TB) {
	for i := range r.levels {
		p, err := evict.New(r.name)
		require.NoError(t, err)
		l := &r.levels[i]
		l.policy, l.queues = p, make([][]tier.Digest, p.Queues())
		l.ghost, _ = p.(evict.GhostPolicy)
		l.class, _ = p.(evict.ClassPolicy)
		l.aged, _ = p.(evict.AgePolicy)
		if l.ghost != nil {
			l.ghost.Size(r.capacity)
		}
	}
}

// advance lapses what is due at now.
func (r *refDisk) advance(now time.Time) {
	var due []tier.Digest
	for d, at := range r.deadline {
		if int64(at) <= now.UnixNano() {
			due = append(due, d)
		}
	}
	slices.SortFunc(due, func(a, b tier.Digest) int {
		return cmp.Or(cmp.Compare(r.deadline[a], r.deadline[b]), cmp.Compare(r.slotOf(a), r.slotOf(b)))
	})
	for _, d := range due {
		r.unqueue(d)
		r.level[d] = 0
		delete(r.deadline, d)
		delete(r.dur, d)
		r.enqueue(d)
		r.lapses++
	}
}

// retain gives page d (not queued) retention ret written at now.
func (r *refDisk) retain(d tier.Digest, ret tier.Retention, now time.Time) {
	r.level[d], r.hint[d] = int(ret.Priority), ret.Hint
	delete(r.dur, d)
	delete(r.deadline, d)
	if ret.Priority > 0 && ret.Duration > 0 {
		r.dur[d] = ret.Duration
		r.deadline[d] = time.Duration(now.UnixNano()) + ret.Left
		ret.Left = r.deadline[d]
	} else {
		ret.Duration, ret.Left = 0, 0
	}
	r.written[d] = ret
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
	l := &r.levels[r.level[d]]
	if l.class != nil {
		q = l.class.EnqueueClass(evict.Class{Hits: r.enqueueHits(d)})
	} else {
		q = l.policy.Enqueue(r.enqueueHits(d))
	}
	l.queues[q] = append(l.queues[q], d)
	r.pushed[d] = r.pushes
	r.pushes++
}

func (r *refDisk) unqueue(d tier.Digest) {
	l := &r.levels[r.level[d]]
	for q := range l.queues {
		l.queues[q] = slices.DeleteFunc(l.queues[q], func(x tier.Digest) bool { return x == d })
	}
}

// store writes page d with retention ret at now.
func (r *refDisk) store(d tier.Digest, ret tier.Retention, now time.Time) {
	if _, ok := r.seq[d]; ok {
		return
	}
	r.advance(now)
	if r.len() == r.capacity {
		l := &r.levels[0]
		for i := range r.levels {
			if n := func() int {
				n := 0
				for _, q := range r.levels[i].queues {
					n += len(q)
				}
				return n
			}(); n > 0 {
				l = &r.levels[i]
				break
			}
		}
		lens := make([]int, len(l.queues))
		for q := range l.queues {
			lens[q] = len(l.queues[q])
		}
		var k int
		if l.aged != nil {
			ages := make([]uint32, len(l.queues))
			for q, queue := range l.queues {
				if len(queue) > 0 {
					ages[q] = r.pushes - r.pushed[queue[0]]
				}
			}
			k = l.aged.DequeueAges(lens, ages)
		} else {
			k = l.policy.Dequeue(lens)
		}
		v := l.queues[k][0]
		switch {
		case l.class != nil:
			l.class.EvictedClass(ghostHash(v), evict.Class{Hits: r.enqueueHits(v)})
		case l.ghost != nil:
			l.ghost.Evicted(ghostHash(v), r.enqueueHits(v))
		}
		r.remove(v)
	}
	r.next++
	r.seq[d], r.hits[d] = r.next, 0
	r.retain(d, ret, now)
	g := r.levels[r.level[d]].ghost
	r.returned[d] = g != nil && g.Returned(ghostHash(d))
	r.enqueue(d)
}

// fetch serves the leading pages it holds, each counting a hit and
// joining the queue its hits give, and returns them with their
// retention (what is left; a use restarts the count).
func (r *refDisk) fetch(chain []tier.RemotePage, now time.Time) []tier.Retention {
	if _, ok := r.seq[chain[0].Digest]; ok {
		r.advance(now) // as the store: when it serves a run
	}
	var out []tier.Retention
	for _, p := range chain {
		d := p.Digest
		if _, ok := r.seq[d]; !ok {
			break
		}
		ret := tier.Retention{Priority: uint8(r.level[d]), Hint: r.hint[d]}
		if dur, ok := r.dur[d]; ok {
			ret.Duration, ret.Left = dur, r.deadline[d]-time.Duration(now.UnixNano())
			r.deadline[d] = time.Duration(now.UnixNano()) + dur
		}
		out = append(out, ret)
		r.unqueue(d)
		r.hits[d]++
		r.enqueue(d)
	}
	return out
}

// restart: a fresh policy learns the pages in write order, hits
// forgotten, at the levels they were written with (lapsed ones at 0):
// a use's restart of the count is forgotten too, as hits are.
func (r *refDisk) restart(t testing.TB, now time.Time) {
	pages := slices.Collect(maps.Keys(r.seq))
	slices.SortFunc(pages, func(a, b tier.Digest) int { return cmp.Compare(r.seq[a], r.seq[b]) })
	r.reset(t)
	for _, d := range pages {
		r.hits[d], r.returned[d] = 0, false
		w := r.written[d]
		r.level[d] = int(w.Priority)
		delete(r.dur, d)
		delete(r.deadline, d)
		if w.Duration > 0 {
			r.dur[d], r.deadline[d] = w.Duration, w.Left
		}
		if at, ok := r.deadline[d]; ok && int64(at) <= now.UnixNano() {
			r.lapses++
			r.level[d] = 0
			delete(r.deadline, d)
			delete(r.dur, d)
		}
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
	delete(r.level, d)
	delete(r.hint, d)
	delete(r.written, d)
	delete(r.dur, d)
	delete(r.deadline, d)
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
	// Retention: 3 levels on a clock the test moves.
	cfg.Levels = 3
	clock := time.Unix(1_800_000_000, 0)
	cfg.Clock = func() time.Time { return clock }
	u := newUniverse(testFormat, 8, 6)
	ref := newRefDisk(t, cfg.Pages, cfg.Levels, policy)
	s := openStore(t, cfg)
	ref.slotOf = func(d tier.Digest) int32 { return s.index[d] }
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
		ref.restart(t, clock)
		restarts++
	}
	for op := range ops {
		clock = clock.Add(time.Duration(rng.IntN(4)) * time.Second)
		switch r := rng.IntN(100); {
		case r < 50: // store a run of a chain's pages, one at a time
			ch := u.chains[rng.IntN(len(u.chains))]
			a := rng.IntN(len(ch))
			for i := a; i < min(len(ch), a+1+rng.IntN(3)); i++ {
				p := ch[i]
				if rng.IntN(2) == 0 {
					p.Retention = tier.Retention{Priority: uint8(rng.IntN(cfg.Levels)), Hint: uint8(rng.IntN(3))}
					if rng.IntN(2) == 0 {
						p.Retention.Duration = time.Duration(1+rng.IntN(12)) * time.Second
						p.Retention.Left = time.Duration(1+rng.Int64N(int64(p.Retention.Duration))) * time.Nanosecond
					}
				}
				require.True(t, s.Store(&p))
				flush(t, s)
				ref.store(p.Digest, p.Retention, clock)
			}
		case r < 90: // look a chain up from its first page
			ch := u.chains[rng.IntN(len(u.chains))]
			want := ref.fetch(ch, clock)
			req := request(ch)
			require.Equal(t, len(want), fetchChecked(t, s, req), "op %d: pages served", op)
			for i, w := range want {
				require.Equal(t, w, req[i].Retention, "op %d: page %d's retention", op, i)
			}
		case r < 95: // clean restart
			require.NoError(t, s.Close())
			reopen(0, 0)
		case r < 98 && ref.len() > 0: // damage one byte of a page, restart
			d := ref.any(rng)
			slot := int(s.index[d])
			require.NoError(t, s.Close())
			off := rng.IntN(slotRetentionUsed + s.valueLen)
			if off >= slotRetentionUsed {
				off += s.valueOff - slotRetentionUsed
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
		for d, level := range ref.level {
			require.Equal(t, level, s.policy.Level(int(s.index[d])), "op %d: page %s's level", op, d.String()[:16])
		}
		require.Equal(t, ref.len(), s.DiskStats().Pages, "op %d", op)
		for d := range ref.seq {
			_, ok := s.index[d]
			require.True(t, ok, "op %d: the store evicted page %s, which the model holds", op, d.String()[:16])
		}
	}
	require.NoError(t, s.Close())
	reopen(0, 0)
	lapsed := ref.lapses
	if ops >= 500 {
		require.Greater(t, lapsed, 0, "no level lapsed")
	}
	t.Logf("%s: %d ops, %d lapses: %d restarts (%d over a damaged slot, %d over a duplicated one), %d pages written, %d served, %d misses",
		policy, ops, lapsed, restarts, damaged, dups, total.Stored, total.Hits, total.Misses)
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
