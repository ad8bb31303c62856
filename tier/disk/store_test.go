package disk

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/evict"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/tier"
)

func TestStoreFetchReopen(t *testing.T) {
	dir := t.TempDir()
	u := newUniverse(testFormat, 4, 6)
	s := openStore(t, testConfig(dir, 32))
	storeAll(t, s, u.chains[0])
	require.NoError(t, s.CheckInvariants())
	require.Equal(t, 6, fetchChecked(t, s, request(u.chains[0])))
	require.Equal(t, tier.Disk, tier.StoreMedium(s), "a Manager accounts the store's pages as disk reads")
	// Chain 1 shares page 0 with chain 0 only; its page 1 is missing.
	require.Equal(t, 1, fetchChecked(t, s, request(u.chains[1])))
	st := s.DiskStats()
	require.Equal(t, 6, st.Pages)
	require.EqualValues(t, 7, st.Remote.Hits)
	require.EqualValues(t, 1, st.Remote.Misses)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close twice")

	s = openStore(t, testConfig(dir, 32))
	defer s.Close()
	rec := s.Recovery()
	require.Equal(t, Recovery{Slots: 32, Empty: 26, Recovered: 6}, rec)
	require.Equal(t, 6, fetchChecked(t, s, request(u.chains[0])))
	// A request whose tokens differ from the stored page's is refused
	// even under the same digest (a key collision or a lying caller).
	req := request(u.chains[0][:1])
	req[0].Tokens = []int32{9, 9, 9, 9}
	require.Equal(t, 0, s.Fetch(context.Background(), req))
	rs := s.Stats()
	require.EqualValues(t, 1, rs.Rejected)
	require.EqualValues(t, 1, rs.RejectedBy[tier.RejectStale])
	require.Equal(t, req[0].Digest.String(), rs.Recent[0].Key)
	require.Contains(t, rs.Recent[0].Detail, "first difference at token 0")
}

func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	for name, mutate := range map[string]func(*Config){
		"no dir":       func(c *Config) { c.Dir = "" },
		"no namespace": func(c *Config) { c.Namespace = "" },
		"pages 0":      func(c *Config) { c.Pages = 0 },
		"neg segment":  func(c *Config) { c.SegmentPages = -1 },
		"neg queue":    func(c *Config) { c.QueueLen = -2 },
		"bad format":   func(c *Config) { c.Format.Layers = 0 },
		"too big":      func(c *Config) { c.Pages = 1<<31 - 1; c.Format.PageSize = 4096 },
		"queue bytes":  func(c *Config) { c.Format = benchFormat; c.QueueLen = 1 << 20 },
		"eviction":     func(c *Config) { c.Eviction = "LRU" },
	} {
		cfg := testConfig(dir, 16)
		mutate(&cfg)
		_, err := Open(cfg)
		require.ErrorIs(t, err, ErrBadConfig, name)
	}
}

func TestLockedAndForeignDirectory(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, testConfig(dir, 16))
	_, err := Open(testConfig(dir, 16))
	require.ErrorIs(t, err, ErrLocked)
	require.NoError(t, s.Close())

	// Another geometry: refused by name, the files untouched.
	other := testConfig(dir, 16)
	other.Format.HeadDim = 64
	_, err = Open(other)
	require.ErrorIs(t, err, ErrForeignDir)
	require.Contains(t, err.Error(), "seg-0000.pkvd")
	_, err = Open(testConfig(dir, 8)) // fewer segments: seg-0001 is left over
	require.ErrorIs(t, err, ErrForeignDir)
	require.Contains(t, err.Error(), "seg-0001.pkvd")

	// A file that is not a segment.
	bad := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(bad, "seg-0000.pkvd"), []byte("not a segment file, but long enough to have a header"), 0o644))
	_, err = Open(testConfig(bad, 8))
	require.ErrorIs(t, err, ErrForeignDir)
	require.Contains(t, err.Error(), "magic")

	// A directory of format version 1 (its segment magic "PKVDSEG1"):
	// refused by name, untouched.
	v1 := t.TempDir()
	seg := make([]byte, segmentHeaderBytes)
	segmentHeader{SlotBytes: 4096, Slots: 8}.encode(seg)
	copy(seg, "PKVDSEG1")
	require.NoError(t, os.WriteFile(filepath.Join(v1, "seg-0000.pkvd"), seg, 0o644))
	_, err = Open(testConfig(v1, 8))
	require.ErrorIs(t, err, ErrForeignDir)
	require.Contains(t, err.Error(), `magic "PKVDSEG1", want "PKVDSEG2"`)
	got, err := os.ReadFile(filepath.Join(v1, "seg-0000.pkvd"))
	require.NoError(t, err)
	require.Equal(t, seg, got)

	// The directory still opens with its own config.
	s = openStore(t, testConfig(dir, 16))
	require.NoError(t, s.Close())
}

func TestEvictionLRU(t *testing.T) {
	s := openStore(t, testConfig(t.TempDir(), 4))
	defer s.Close()
	u := newUniverse(testFormat, 1, 6)
	pages := u.chains[0]
	for i := range 4 {
		require.True(t, s.Store(&pages[i]))
	}
	flush(t, s)
	// Serve page 0: page 1 is now the least recently used.
	require.Equal(t, 1, fetchChecked(t, s, request(pages[:1])))
	require.True(t, s.Store(&pages[4]))
	flush(t, s)
	require.NoError(t, s.CheckInvariants())
	got := make([]bool, 6)
	for i := range pages {
		got[i] = fetchChecked(t, s, request(pages[i:i+1])) == 1
	}
	require.Equal(t, []bool{true, false, true, true, true, false}, got)
	require.EqualValues(t, 1, s.DiskStats().Evicted)
}

// TestEvictionPolicies: Config.Eviction takes evict's policy names
// (an unknown one is refused by name) and means what it means there. A
// page served once, then a burst of new pages the size of the store:
// LRU evicts the served page with the rest; SLRU (on its protected
// queue) and SRRIP (predicted near re-reference) keep it, evicting the
// new pages that never served a hit instead.
func TestEvictionPolicies(t *testing.T) {
	cfg := testConfig(t.TempDir(), 4)
	cfg.Eviction = "lfu"
	_, err := Open(cfg)
	require.ErrorIs(t, err, ErrBadConfig)
	require.ErrorIs(t, err, evict.ErrUnknownPolicy)
	require.Contains(t, err.Error(), `"lfu"`)

	for _, policy := range evict.Names() {
		cfg := testConfig(t.TempDir(), 4)
		cfg.Eviction = policy
		s := openStore(t, cfg)
		require.Equal(t, policy, s.Config().Eviction)
		pages := newUniverse(testFormat, 1, 8).chains[0]
		for i := range 4 {
			require.True(t, s.Store(&pages[i]))
		}
		flush(t, s)
		require.Equal(t, 1, fetchChecked(t, s, request(pages[:1])))
		for i := 4; i < 8; i++ {
			require.True(t, s.Store(&pages[i]))
			flush(t, s)
			require.NoError(t, s.CheckInvariants())
		}
		kept := fetchChecked(t, s, request(pages[:1])) == 1
		// adaptive starts as LRU (every class's lifetime multiplier 1) and
		// learns only from pages that come back after their eviction.
		require.Equal(t, policy != evict.LRU && policy != evict.Adaptive, kept, "%s: the page served once is kept", policy)
		require.EqualValues(t, 4, s.DiskStats().Evicted)
		require.NoError(t, s.Close())
	}
	s := openStore(t, testConfig(t.TempDir(), 4))
	require.Equal(t, evict.LRU, s.Config().Eviction, "the default")
	require.NoError(t, s.Close())
}

func TestQueueBoundDrops(t *testing.T) {
	cfg := testConfig(t.TempDir(), 256)
	cfg.QueueLen = 2
	s := openStore(t, cfg)
	defer s.Close()
	u := newUniverse(testFormat, 1, 8)
	gate := make(chan struct{})
	s.beforeWrite = func() { <-gate } // the writer holds the first page: the queue fills
	stored, dropped := 0, 0
	for i := range u.chains[0] {
		if s.Store(&u.chains[0][i]) {
			stored++
		} else {
			dropped++
		}
	}
	close(gate)
	flush(t, s)
	require.LessOrEqual(t, stored, 3, "at most QueueLen queued plus the one being written")
	require.Positive(t, dropped)
	require.EqualValues(t, dropped, s.Stats().Dropped)
	require.NoError(t, s.CheckInvariants())
}

func TestDamagedAndForeignSlotsDropped(t *testing.T) {
	dir := t.TempDir()
	u := newUniverse(testFormat, 2, 4)
	s := openStore(t, testConfig(dir, 16))
	storeAll(t, s, u.chains[0])
	slots := map[tier.Digest]int{}
	for d, sl := range s.index {
		slots[d] = int(sl)
	}
	require.NoError(t, s.Close())

	// Another deployment's store in the same geometry writes chain 1
	// into a copy of the directory; its slots are moved into ours.
	foreignDir := t.TempDir()
	fcfg := testConfig(foreignDir, 16)
	fcfg.Namespace = "model-b" // same length: same slot geometry
	fs := openStore(t, fcfg)
	require.True(t, fs.Store(&u.chains[1][1]))
	flush(t, fs)
	require.NoError(t, fs.Close())
	foreignSlot := readSlot(t, foreignDir, 0)
	writeSlot(t, dir, 6, foreignSlot) // chain 0 fills slots 0-3

	// Page 1: one byte of its K/V flipped. Page 2: its header's sequence
	// changed (its checksum no longer matches).
	_, valueOff, _ := slotGeometry(testConfig(dir, 16))
	flip(t, dir, slots[u.chains[0][1].Digest], valueOff+200)
	flip(t, dir, slots[u.chains[0][2].Digest], 9)
	s = openStore(t, testConfig(dir, 16))
	defer s.Close()
	rec := s.Recovery()
	require.Equal(t, 2, rec.Recovered)
	require.Equal(t, 2, rec.Torn)
	require.Equal(t, 1, rec.Foreign)
	require.Len(t, rec.Drops, 3)
	for _, d := range rec.Drops {
		require.Equal(t, "seg-0000.pkvd", d.File)
		require.NotEmpty(t, d.Err)
	}
	require.Contains(t, fmt.Sprint(rec.Drops), "namespace \"model-b\"")
	require.Equal(t, 1, fetchChecked(t, s, request(u.chains[0])), "page 0 only: page 1 is gone")
	require.Equal(t, 1, fetchChecked(t, s, request(u.chains[0][3:])))
	require.NoError(t, s.Close())
	// Dropped slots were cleared: the next restart reports nothing.
	s2 := openStore(t, testConfig(dir, 16))
	require.Equal(t, Recovery{Slots: 16, Empty: 14, Recovered: 2}, s2.Recovery())
	require.NoError(t, s2.Close())
}

// TestReadPinsSlots: the writer does not overwrite a slot Fetch is
// reading (a lookup found it, the pread has not finished); it waits, then
// overwrites, and the old page is gone.
func TestReadPinsSlots(t *testing.T) {
	s, u := storeFirstPage(t, 1)
	req := request(u.chains[0][:1])
	s.readMu.Lock()
	s.allocReads(1)
	first, n, ok := s.lookupRun(req, 1)
	require.True(t, ok)
	require.Equal(t, 0, first)
	require.Equal(t, 1, n)
	// The only slot is pinned: the next page waits for it.
	require.True(t, s.Store(&u.chains[0][1]))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	require.ErrorIs(t, s.Flush(ctx, false), context.DeadlineExceeded)
	cancel()
	require.Equal(t, 1, s.readRun(req, first), "the pinned slot still holds the page")
	require.Equal(t, contentOf(testFormat, req[0].Digest), req[0].Data)
	s.readMu.Unlock()
	flush(t, s)
	require.NoError(t, s.CheckInvariants())
	require.Equal(t, 0, fetchChecked(t, s, request(u.chains[0][:1])), "the old page is gone")
	require.Equal(t, 1, fetchChecked(t, s, request(u.chains[0][1:])))
	require.Zero(t, s.Stats().Rejected)
}

func TestEveryFormatRoundTrips(t *testing.T) {
	for _, dt := range []layout.DType{layout.F32, layout.F16, layout.BF16, layout.E4M3} {
		for _, kl := range []layout.KVLayout{layout.NHD, layout.HND} {
			f := tier.PageFormat{Layout: kl, DType: dt, PageSize: 16, NumKVHeads: 2, HeadDim: 64, Layers: 3}
			cfg := testConfig(t.TempDir(), 8)
			cfg.Format = f
			s := openStore(t, cfg)
			u := newUniverse(f, 1, 3)
			storeAll(t, s, u.chains[0])
			require.Equal(t, 3, fetchChecked(t, s, request(u.chains[0])), "%v %v", dt, kl)
			require.NoError(t, s.Close())
		}
	}
}

func TestFetchDeadline(t *testing.T) {
	s, u := storeFirstPage(t, 8)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.Equal(t, 0, s.Fetch(ctx, request(u.chains[0])))
	require.EqualValues(t, 1, s.Stats().Timeouts)
}

// testSlotBytes is the slot length of testConfig's stores.
func testSlotBytes() int {
	_, _, n := slotGeometry(testConfig("", 1))
	return n
}

func readSlot(t *testing.T, dir string, slot int) []byte {
	f, err := os.Open(filepath.Join(dir, "seg-0000.pkvd"))
	require.NoError(t, err)
	defer f.Close()
	b := make([]byte, testSlotBytes())
	_, err = f.ReadAt(b, int64(segmentHeaderBytes+slot*len(b)))
	require.NoError(t, err)
	return b
}

func writeSlot(t *testing.T, dir string, slot int, b []byte) {
	f, err := os.OpenFile(filepath.Join(dir, "seg-0000.pkvd"), os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	_, err = f.WriteAt(b, int64(segmentHeaderBytes+slot*testSlotBytes()))
	require.NoError(t, err)
}

// flip inverts one byte at off in slot (segment 0 of the test geometry).
func flip(t *testing.T, dir string, slot, off int) {
	b := readSlot(t, dir, slot)
	b[off] ^= 0xff
	writeSlot(t, dir, slot, b)
}

// TestConcurrentStoreAndFetch: writers and readers on one small store (the
// writer evicting what readers look up): every served page holds its
// K/V, nothing is rejected or lost to an error, and the store audits
// clean.
func TestConcurrentStoreAndFetch(t *testing.T) {
	s := openStore(t, testConfig(t.TempDir(), 6))
	defer s.Close()
	setPieces(s, 1) // the read helper reads while the writer evicts
	u := newUniverse(testFormat, 6, 5)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				ch := u.chains[(g+i)%len(u.chains)]
				if g%2 == 0 {
					for k := range ch {
						s.Store(&ch[k])
					}
					continue
				}
				req := request(ch)
				n := s.Fetch(context.Background(), req)
				for k := range n {
					if !bytes.Equal(contentOf(testFormat, req[k].Digest), req[k].Data) {
						t.Errorf("page %d of chain %d served with the wrong K/V", k, (g+i)%len(u.chains))
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	flush(t, s)
	require.NoError(t, s.CheckInvariants())
	st := s.Stats()
	require.Zero(t, st.Rejected+st.Errors, "%+v", st)
	t.Logf("%d pages served of %d asked, %d written, %d evicted", st.Hits, st.Requested, st.Stored, s.DiskStats().Evicted)
}

// storeFirstPage opens a store of pages slots and writes the first page of
// a two-page chain into it.
func storeFirstPage(t *testing.T, pages int) (*Store, *pageUniverse) {
	s := openStore(t, testConfig(t.TempDir(), pages))
	t.Cleanup(func() { s.Close() })
	u := newUniverse(testFormat, 1, 2)
	require.True(t, s.Store(&u.chains[0][0]))
	flush(t, s)
	return s, u
}

// TestFetchAllocatesNothing: a lookup that reads and verifies a chain
// (a preadv per piece, on Fetch's goroutine and the read helper, the
// checks, the policy's bookkeeping) allocates nothing once the store's
// read buffers exist.
func TestFetchAllocatesNothing(t *testing.T) {
	s := openStore(t, testConfig(t.TempDir(), 16))
	defer s.Close()
	setPieces(s, 2)
	chain := newUniverse(testFormat, 1, 6).chains[0]
	for i := range chain {
		require.True(t, s.Store(&chain[i]))
	}
	flush(t, s)
	req := request(chain)
	ctx := context.Background()
	require.Equal(t, len(chain), fetchChecked(t, s, req))
	require.Zero(t, testing.AllocsPerRun(100, func() {
		if s.Fetch(ctx, req) != len(chain) {
			t.Fatal("a page was not served")
		}
	}))
}

// fakeGhost is a policy with a ghost history (evict's GhostPolicy
// methods) over SLRU, recording what the store's queues tell it.
type fakeGhost struct {
	evict.Policy
	size     int
	known    map[uint64]bool
	evicted  []uint64
	evHits   []uint32
	enqueued []uint32
}

func (f *fakeGhost) Size(n int)             { f.size = n }
func (f *fakeGhost) Returned(h uint64) bool { return f.known[h] }
func (f *fakeGhost) Evicted(h uint64, hits uint32) {
	f.evicted, f.evHits = append(f.evicted, h), append(f.evHits, hits)
}
func (f *fakeGhost) Enqueue(hits uint32) int {
	f.enqueued = append(f.enqueued, hits)
	return f.Policy.Enqueue(hits)
}
func (f *fakeGhost) Dequeue(lens []int) int { return f.Policy.Dequeue(lens) }

// TestGhostPolicyWiring: a policy that keeps ghosts of evicted pages is
// told the capacity, every page evicted (its hash and hits) and every page
// written; a page it remembers joins its queue as one with a hit until it
// serves one.
func TestGhostPolicyWiring(t *testing.T) {
	slru, err := evict.New(evict.SLRU)
	require.NoError(t, err)
	u := newUniverse(testFormat, 1, 2).chains[0]
	d0, d1 := u[0].Digest, u[1].Digest
	g := &fakeGhost{Policy: slru, known: map[uint64]bool{ghostHash(d0): true}}
	q, err := newQueuesOf(g, 4)
	require.NoError(t, err)
	require.Equal(t, 4, g.size)
	q.Written(0, 0, d0) // remembered: enqueued with one hit
	q.Written(1, 0, d1)
	q.Used(0) // its first hit: still one
	q.Used(0)
	q.Used(1)
	require.Equal(t, []uint32{1, 0, 1, 2, 1}, g.enqueued)
	require.NoError(t, q.checkInvariants())
	q.Evict(1, d1)
	q.Evict(0, d0)
	require.Equal(t, []uint64{ghostHash(d1), ghostHash(d0)}, g.evicted)
	require.Equal(t, []uint32{1, 2}, g.evHits)
	require.Zero(t, q.Len())
	require.NoError(t, q.checkInvariants())
}

// TestWriteErrorFreesSlots: a batch whose write fails is counted, its pages
// are not indexed, its slots go back to the free list, and the store
// writes and serves pages once the file takes writes again.
func TestWriteErrorFreesSlots(t *testing.T) {
	s := openStore(t, testConfig(t.TempDir(), 8))
	defer s.Close()
	chain := newUniverse(testFormat, 1, 4).chains[0]
	rw := s.segs[0]
	ro, err := os.Open(rw.Name()) // writes fail: EBADF
	require.NoError(t, err)
	s.segs[0] = ro
	for i := range chain {
		require.True(t, s.Store(&chain[i]))
	}
	flush(t, s)
	st := s.DiskStats()
	require.EqualValues(t, len(chain), st.Remote.Errors)
	require.Zero(t, st.Remote.Stored)
	require.Zero(t, st.Pages)
	require.Equal(t, []int32{7, 6, 5, 4, 3, 2, 1, 0}, s.free, "used again lowest first")
	require.NoError(t, s.CheckInvariants())
	require.Zero(t, fetchChecked(t, s, request(chain)))

	s.segs[0] = rw
	require.NoError(t, ro.Close())
	for i := range chain {
		require.True(t, s.Store(&chain[i]))
	}
	flush(t, s)
	require.NoError(t, s.CheckInvariants())
	require.Equal(t, len(chain), fetchChecked(t, s, request(chain)))
	for i := range chain {
		require.EqualValues(t, i, s.index[chain[i].Digest], "page %d in slot %d: consecutive slots", i, i)
	}
}

// TestOpenSkipsFreshSegments: the segments Open creates are counted empty
// without being read, in a new directory and beside segments that hold
// pages (one lost and recreated); the pages of the others are recovered
// and served.
func TestOpenSkipsFreshSegments(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir, 20) // segments of 8, 8 and 4 slots
	s := openStore(t, cfg)
	require.Equal(t, Recovery{Slots: 20, Empty: 20}, s.Recovery())
	require.Equal(t, []bool{true, true, true}, s.fresh)
	chain := newUniverse(testFormat, 1, 5).chains[0]
	for i := range chain {
		require.True(t, s.Store(&chain[i]))
	}
	flush(t, s)
	require.NoError(t, s.Close())
	require.NoError(t, os.Remove(s.segmentPath(2)))

	s = openStore(t, cfg)
	defer s.Close()
	require.Equal(t, []bool{false, false, true}, s.fresh)
	require.Equal(t, Recovery{Slots: 20, Empty: 15, Recovered: 5}, s.Recovery())
	require.Equal(t, len(chain), fetchChecked(t, s, request(chain)))
}

// Stores of one page from several goroutines at once queue it once: the
// page gets one slot, and no second slot stays ready but unindexed (before,
// two Stores that both found the page neither indexed nor queued each
// queued a job, and a batch holding both gave each a slot).
func TestConcurrentStoresOfOnePage(t *testing.T) {
	s := openStore(t, testConfig(t.TempDir(), 64))
	defer s.Close()
	u := newUniverse(testFormat, 1, 16)
	for _, p := range u.chains[0] {
		start := make(chan struct{})
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				require.True(t, s.Store(&p))
			}()
		}
		close(start)
		wg.Wait()
	}
	flush(t, s)
	require.NoError(t, s.CheckInvariants())
	require.EqualValues(t, 16, s.Stats().Stored)
	require.Equal(t, 16, fetchChecked(t, s, request(u.chains[0])))
}
