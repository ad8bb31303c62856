package disk

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/tier"
)

// refDisk is the slow model of a store: the pages it holds in recency
// order (least recent first) with the sequence each was written at.
type refDisk struct {
	capacity int
	order    []tier.Digest
	seq      map[tier.Digest]uint64
	next     uint64
}

func (r *refDisk) store(d tier.Digest) {
	if _, ok := r.seq[d]; ok {
		return
	}
	if len(r.order) == r.capacity {
		delete(r.seq, r.order[0])
		r.order = r.order[1:]
	}
	r.next++
	r.seq[d] = r.next
	r.order = append(r.order, d)
}

// fetch serves the leading pages it holds, each becoming most recent.
func (r *refDisk) fetch(chain []tier.RemotePage) int {
	for i, p := range chain {
		if _, ok := r.seq[p.Digest]; !ok {
			return i
		}
		r.order = append(slices.DeleteFunc(r.order, func(d tier.Digest) bool { return d == p.Digest }), p.Digest)
	}
	return len(chain)
}

// restart: recency is forgotten, pages are ordered by write sequence.
func (r *refDisk) restart() {
	slices.SortFunc(r.order, func(a, b tier.Digest) int { return int(r.seq[a]) - int(r.seq[b]) })
}

func (r *refDisk) remove(d tier.Digest) {
	delete(r.seq, d)
	r.order = slices.DeleteFunc(r.order, func(x tier.Digest) bool { return x == d })
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
// refDisk, auditing after every operation. PAGEDKV_DISK_MODEL_OPS sets
// the operation count (default 20000; 3000 under CI=true).
func TestStoreMatchesModel(t *testing.T) {
	ops := 20000
	if os.Getenv("CI") == "true" {
		ops = 3000
	}
	ops = envInt(t, "PAGEDKV_DISK_MODEL_OPS", ops)
	if testing.Short() {
		ops = 1000
	}
	for seed := uint64(1); seed <= 2; seed++ {
		t.Run(strconv.Itoa(int(seed)), func(t *testing.T) { runModel(t, seed, ops/2) })
	}
}

func runModel(t *testing.T, seed uint64, ops int) {
	rng := rand.New(rand.NewPCG(seed, 31))
	dir := t.TempDir()
	cfg := testConfig(dir, 12)
	cfg.SegmentPages = 5 // segments of 5, 5 and 2 slots
	cfg.SyncEvery = -1
	u := newUniverse(testFormat, 8, 6)
	ref := &refDisk{capacity: cfg.Pages, seq: map[tier.Digest]uint64{}}
	s := openStore(t, cfg)
	defer func() { s.Close() }()
	restarts, damaged, dups := 0, 0, 0
	var total tier.RemoteStats
	reopen := func(wantTorn, wantDup int) {
		st := s.Stats()
		require.Zero(t, st.Errors+st.Dropped+st.Rejected)
		total.Stored, total.Hits, total.Misses = total.Stored+st.Stored, total.Hits+st.Hits, total.Misses+st.Misses
		s = openStore(t, cfg)
		rec := s.Recovery()
		require.Equal(t, len(ref.order), rec.Recovered)
		require.Equal(t, wantTorn, rec.Torn)
		require.Equal(t, wantDup, rec.Duplicate)
		require.Zero(t, rec.Foreign)
		ref.restart()
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
		case r < 98 && len(ref.order) > 0: // damage one byte of a page, restart
			d := ref.order[rng.IntN(len(ref.order))]
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
		case len(s.free) > 0 && len(ref.order) > 0: // copy a page into a free slot, restart
			d := ref.order[rng.IntN(len(ref.order))]
			from, to := int(s.index[d]), int(s.free[rng.IntN(len(s.free))])
			require.NoError(t, s.Close())
			copySlot(t, s, from, to)
			reopen(0, 1)
			dups++
		}
		require.NoError(t, s.CheckInvariants(), "op %d", op)
		require.Equal(t, len(ref.order), s.DiskStats().Pages, "op %d", op)
	}
	require.NoError(t, s.Close())
	reopen(0, 0)
	t.Logf("%d ops: %d restarts (%d over a damaged slot, %d over a duplicated one), %d pages written, %d served, %d misses",
		ops, restarts, damaged, dups, total.Stored, total.Hits, total.Misses)
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
