package disk

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/pagedkv/pagedkv/evict"
	"github.com/pagedkv/pagedkv/tier"
)

// Defaults.
const (
	DefaultGroup        = "all"
	DefaultSegmentPages = 1024
	DefaultQueueLen     = 64
	DefaultSyncEvery    = 256
	// MaxDropReports bounds [Recovery.Drops].
	MaxDropReports = 64
	// maxStoreBytes bounds the store (16 TiB): slot offsets stay far from
	// overflow.
	maxStoreBytes = 1 << 44
	// maxReadBytes bounds one read of the restart scan.
	maxReadBytes = 4 << 20
	// maxRunBytes bounds the slots one Fetch run reads (and pins).
	maxRunBytes = 16 << 20
	// readPieceBytes is the most one read call of a Fetch run moves (at
	// least a slot): a run is read in pieces of this size, Fetch's
	// goroutine and the read helper each reading and checking one while
	// the other does the next (read.go). Small pieces keep the wait for
	// the other goroutine's last piece short.
	readPieceBytes = 512 << 10
	// maxWriteBytes bounds the pages the writer takes off the queue at
	// once, and so one coalesced write.
	maxWriteBytes = 8 << 20
	// lingerIdle is how long the writer waits for the next page of a
	// burst before it writes what it has.
	lingerIdle = 200 * time.Microsecond
	// minWriteBytes: the writer writes as soon as it holds this many
	// bytes of pages (at least a page, at most half the queue), so that
	// Store's copies of the next pages overlap the write of these.
	minWriteBytes = 1 << 20
	// maxIovecs is Linux's IOV_MAX: a longer vector is split into calls.
	maxIovecs = 1024
	// MaxQueueBytes bounds the queue's buffers (QueueLen slots), which
	// Open allocates.
	MaxQueueBytes = 64 << 30
	// MaxQueueLen bounds Config.QueueLen, MaxPages Config.Pages.
	MaxQueueLen = 1 << 20
	MaxPages    = 1<<31 - 1
)

// Config describes a Store.
type Config struct {
	// Dir holds the segment files (created if missing). One Store per
	// directory at a time: Open locks it.
	Dir string
	// Namespace names the deployment (model and revision): only pages
	// written under it are served. Required.
	Namespace string
	// Group names the layer group ("" means DefaultGroup).
	Group string
	// Format is the page format.
	Format tier.PageFormat
	// Pages is the capacity in pages (slots), >= 1. It and SegmentPages
	// fix the segment files: reopen a directory with the same values.
	Pages int
	// SegmentPages is the number of slots per segment file (0:
	// DefaultSegmentPages, at most Pages).
	SegmentPages int
	// QueueLen bounds the pages queued or being written (0:
	// DefaultQueueLen); past it Store drops pages.
	QueueLen int
	// SyncEvery makes the writer fsync the segment files it wrote after
	// every SyncEvery pages (0: DefaultSyncEvery); negative: only Flush
	// and Close sync. A process crash loses nothing written (the kernel
	// has it); a power loss loses at most the pages written since the
	// last sync, and the restart scan drops any it finds torn.
	SyncEvery int
	// Eviction names the policy that picks the page to overwrite when
	// every slot holds one, by its evict name (evict.Names: "arc",
	// "lru", "slru", "srrip", as prefixcache.Config.Eviction); "" means
	// "lru". See policy.go.
	Eviction string
	// Levels is the number of retention levels (docs/retention.md,
	// "Below the device"): a page's level is its retention's priority, cut
	// to Levels-1; 0 means DefaultLevels, at most
	// tier.MaxRetentionLevels.
	Levels int
	// Clock is the wall clock retention deadlines are kept on (nil:
	// time.Now).
	Clock func() time.Time
}

// DefaultLevels is Config.Levels when 0: the Manager's default priority
// levels.
const DefaultLevels = 4

// Recovery is what Open found in the segment files.
type Recovery struct {
	Slots     int // slots scanned
	Empty     int // never written, or cleared after an earlier drop
	Recovered int // pages indexed: header, checksum, digest and namespace verified
	Torn      int // dropped: a write cut by a crash (or damaged bytes)
	Foreign   int // dropped: another namespace, group or format
	Duplicate int // dropped: an older copy of a page recovered from another slot
	// Renumbered is the recovered slots given new sequences (1..n in
	// their order) because the highest found was above RenumberAbove: 0
	// unless a header was planted or damaged in a way that verifies.
	Renumbered int
	// Drops names the first MaxDropReports dropped slots.
	Drops []Drop
}

// Drop is one slot the restart scan dropped (and cleared).
type Drop struct {
	File   string
	Slot   int // in the file
	Reason DropReason
	Err    string
}

// Stats are a Store's counters.
type Stats struct {
	// Remote are the counters every tier.RemoteStore reports.
	Remote tier.RemoteStats
	// Pages is the number of servable pages; Capacity the slots.
	Pages, Capacity int
	Evicted         int64 // pages overwritten to make room
	Skipped         int64 // queued pages the store already held
	Syncs           int64 // fsync rounds
	// Writes counts the writer's vectored writes: one per run of pages
	// in consecutive slots of a segment (Remote.Stored / Writes pages a
	// write on average).
	Writes int64
}

type slotState uint8

const (
	slotFree slotState = iota
	slotWriting
	slotReady
)

type slotEntry struct {
	digest tier.Digest
	seq    uint64
	state  slotState
	// ret is the page's retention: as written, then level 0 (hint kept)
	// once lapsed; its deadline, while running, is on s.lapses.
	ret tier.ValueRetention
}

// job is one page queued for the writer: buf is a whole slot, 4 KiB
// aligned (the slot header, filled in by the writer once it knows the
// sequence; the value, encoded by Store; zero padding), so a run of
// consecutive slots is one vectored write of whole file pages.
type job struct {
	digest tier.Digest
	buf    []byte // slotBytes
	val    []byte // buf[valueOff:][:valueLen]
	slot   int32  // the slot it is written to (the writer's)
	seq    uint64
	ret    tier.ValueRetention
}

// Store is the disk tier: a [tier.RemoteStore] over segment files in a local
// directory. Close it when done.
type Store struct {
	cfg       Config
	valueLen  int
	dataOff   int // the page bytes' offset in a value
	valueOff  int // the value's offset in a slot
	slotBytes int
	segSlots  int       // slots per segment file
	dir       *storeDir // cfg.Dir, which every file is opened in
	segs      []*os.File
	lock      *os.File
	fresh     []bool // segments Open created: all slots empty, not scanned

	mu       sync.Mutex // guards everything below up to the queue
	closed   bool
	index    map[tier.Digest]int32
	slots    []slotEntry
	free     []int32 // free slots, the next to use last
	pending  map[tier.Digest]struct{}
	policy   *queues
	lapses   *tier.Lapses // ready slots whose level lapses, by wall-clock deadline (Unix ns)
	nextSeq  uint64
	recovery Recovery
	// [readLo, readHi) are the slots Fetch is reading: the writer does not
	// overwrite them until readDone is signalled.
	readLo, readHi int
	readDone       sync.Cond

	queue   chan *job
	jobs    chan *job // free job buffers
	wg      sync.WaitGroup
	backlog tier.Backlog

	ioMu sync.RWMutex // Fetch's reads (read lock) against Close
	// Fetch's state: one lookup at a time. A run of slots is read in
	// pieces (read.go): each slot's header and value head into meta, its
	// page bytes straight into the caller's Data, its checksum and the
	// slot's unused end into tails; runSeqs are the sequences the index
	// named.
	readMu     sync.Mutex
	meta       []byte
	tails      []byte
	runSeqs    []uint64
	piecePages int            // pages a read call (a piece) moves at most
	pipe       readPipe       // the run being read, shared with the helper
	readers    [2]pieceReader // Fetch's goroutine's, the helper's

	// The writer's state: the batch it writes, the vector of a run.
	batch    []*job
	wio      vecIO
	maxBatch int
	// gather waits for more pages while it holds fewer than lingerBatch
	// (minWriteBytes of pages), up to lingerIdle between two; Flush ends
	// the wait through kick.
	lingerBatch int
	linger      *time.Timer
	kick        chan struct{}
	writing     int // slots in slotWriting (s.mu)
	sinceSync   int
	dirty       []bool
	// writeChunk > 0 splits each value write into writes of that many
	// bytes (tests: more places for a crash to tear a slot).
	writeChunk int
	// beforeWrite, when set, runs before each page is written (tests:
	// hold the writer).
	beforeWrite func()

	c                               tier.RemoteCounters // Rejected unused: rejections
	rejections                      tier.RejectionLog
	evicted, skipped, syncs, writes atomic.Int64
}

var _ tier.RemoteStore = (*Store)(nil)

func (cfg *Config) check() error {
	if err := cfg.Format.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	switch {
	case cfg.Dir == "":
		return fmt.Errorf("%w: Dir is empty", ErrBadConfig)
	case cfg.Namespace == "" || len(cfg.Namespace) > 1024:
		return fmt.Errorf("%w: Namespace of %d bytes: want 1..1024", ErrBadConfig, len(cfg.Namespace))
	case len(cfg.Group) > 1024:
		return fmt.Errorf("%w: Group of %d bytes: want <= 1024", ErrBadConfig, len(cfg.Group))
	case cfg.Pages < 1 || cfg.Pages > MaxPages:
		return fmt.Errorf("%w: Pages = %d, want 1..2^31-1", ErrBadConfig, cfg.Pages)
	case cfg.SegmentPages < 0 || cfg.QueueLen < 0 || cfg.QueueLen > MaxQueueLen:
		return fmt.Errorf("%w: SegmentPages = %d or QueueLen = %d: want >= 0 (QueueLen <= 2^20)", ErrBadConfig, cfg.SegmentPages, cfg.QueueLen)
	case cfg.Levels < 0 || cfg.Levels > tier.MaxRetentionLevels:
		return fmt.Errorf("%w: Levels = %d, want 0..%d", ErrBadConfig, cfg.Levels, tier.MaxRetentionLevels)
	}
	if cfg.Levels == 0 {
		cfg.Levels = DefaultLevels
	}
	if cfg.Group == "" {
		cfg.Group = DefaultGroup
	}
	if cfg.SegmentPages == 0 {
		cfg.SegmentPages = DefaultSegmentPages
	}
	cfg.SegmentPages = min(cfg.SegmentPages, cfg.Pages)
	if cfg.QueueLen == 0 {
		cfg.QueueLen = DefaultQueueLen
	}
	if cfg.SyncEvery == 0 {
		cfg.SyncEvery = DefaultSyncEvery
	}
	p, err := evict.New(cfg.Eviction)
	if err != nil {
		return fmt.Errorf("%w: Eviction: %w", ErrBadConfig, err)
	}
	cfg.Eviction = p.Name()
	_, _, slot := slotGeometry(*cfg)
	if int64(slot)*int64(cfg.Pages) > maxStoreBytes {
		return fmt.Errorf("%w: %d pages of %d-byte slots exceed %d bytes", ErrBadConfig, cfg.Pages, slot, int64(maxStoreBytes))
	}
	if int64(slot)*int64(cfg.QueueLen) > MaxQueueBytes {
		return fmt.Errorf("%w: QueueLen = %d buffers of %d-byte slots exceed MaxQueueBytes (%d)", ErrBadConfig, cfg.QueueLen, slot, int64(MaxQueueBytes))
	}
	return nil
}

// alignedBytes returns n zero bytes starting at a multiple of align (a
// power of two).
func alignedBytes(n, align int) []byte {
	b := make([]byte, n+align)
	skip := (align - int(uintptr(unsafe.Pointer(unsafe.SliceData(b))))&(align-1)) & (align - 1)
	return b[skip : skip+n : skip+n]
}

// slotGeometry places a value of cfg's format, namespace and group in a
// slot: the value's length, its offset in the slot (its page bytes on a
// 4 KiB boundary) and the slot's length (a multiple of 4 KiB).
func slotGeometry(cfg Config) (valueLen, valueOff, slotBytes int) {
	group := cmp.Or(cfg.Group, DefaultGroup)
	valueLen = tier.EncodedValueLen(cfg.Format, cfg.Namespace, group)
	dataOff := tier.ValueDataOffset(cfg.Format, cfg.Namespace, group)
	valueOff = alignUp(slotHeaderBytes+dataOff, slotAlign) - dataOff
	return valueLen, valueOff, alignUp(valueOff+valueLen, slotAlign)
}

func alignUp(n, align int) int { return (n + align - 1) / align * align }

// Open opens (or creates) the store in cfg.Dir, rebuilding its index from
// the segment files: see [Store.Recovery] for what it kept and dropped.
func Open(cfg Config) (*Store, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	s := &Store{cfg: cfg, dataOff: tier.ValueDataOffset(cfg.Format, cfg.Namespace, cfg.Group)}
	s.valueLen, s.valueOff, s.slotBytes = slotGeometry(cfg)
	s.segSlots = cfg.SegmentPages
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("disk: open %s: %w", cfg.Dir, err)
	}
	dir, err := openStoreDir(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("disk: open %s: %w", cfg.Dir, err)
	}
	s.dir = dir
	lock, err := dir.openFile(lockName)
	if err != nil {
		s.closeFiles()
		if errors.Is(err, ErrNotRegularFile) { // names the path
			return nil, err
		}
		return nil, fmt.Errorf("disk: open %s: %w", cfg.Dir, err)
	}
	if err := lockFile(lock); err != nil {
		lock.Close()
		s.closeFiles()
		return nil, fmt.Errorf("%w: %s: %w", ErrLocked, cfg.Dir, err)
	}
	s.lock = lock
	if err := s.openSegments(); err != nil {
		s.closeFiles()
		return nil, err
	}
	if err := s.scan(); err != nil {
		s.closeFiles()
		return nil, err
	}
	s.queue = make(chan *job, cfg.QueueLen)
	s.jobs = make(chan *job, cfg.QueueLen)
	arena := alignedBytes(cfg.QueueLen*s.slotBytes, slotAlign)
	for i := range cfg.QueueLen {
		buf := arena[i*s.slotBytes : (i+1)*s.slotBytes : (i+1)*s.slotBytes]
		end := s.valueOff + s.valueLen
		s.jobs <- &job{buf: buf, val: buf[s.valueOff:end:end]}
	}
	s.maxBatch = max(1, min(cfg.QueueLen, maxWriteBytes/s.slotBytes, maxIovecs))
	s.lingerBatch = max(1, min(s.maxBatch, cfg.QueueLen/2, minWriteBytes/s.slotBytes))
	s.linger = time.NewTimer(time.Hour)
	s.linger.Stop()
	s.kick = make(chan struct{}, 1)
	s.batch = make([]*job, 0, s.maxBatch)
	s.wio.init(s.maxBatch)
	s.readDone.L = &s.mu
	s.piecePages = max(1, readPieceBytes/s.slotBytes)
	s.startReadHelper()
	s.wg.Add(1)
	go s.writer()
	return s, nil
}

// lockName is the lock file's name in the directory.
const lockName = "LOCK"

func segmentName(i int) string { return fmt.Sprintf("seg-%04d.pkvd", i) }

func (s *Store) segmentPath(i int) string {
	return filepath.Join(s.cfg.Dir, segmentName(i))
}

// segmentSlots is the number of slots of segment i (the last may be short).
func (s *Store) segmentSlots(i int) int {
	return min(s.segSlots, s.cfg.Pages-i*s.segSlots)
}

// openSegments opens or creates every segment file and checks its header.
func (s *Store) openSegments() error {
	n := (s.cfg.Pages + s.segSlots - 1) / s.segSlots
	if s.dir.exists(segmentName(n)) {
		return fmt.Errorf("%w: %s exists beyond the %d segments of %d pages in %d-page segments: reopen with the Pages and SegmentPages it was created with",
			ErrForeignDir, s.segmentPath(n), n, s.cfg.Pages, s.segSlots)
	}
	hdr := make([]byte, segmentHeaderBytes)
	s.fresh = make([]bool, n)
	for i := range n {
		path := s.segmentPath(i)
		f, err := s.dir.openFile(segmentName(i))
		if errors.Is(err, ErrNotRegularFile) { // names the path
			return err
		}
		if err != nil {
			return fmt.Errorf("disk: %w", err)
		}
		s.segs = append(s.segs, f)
		want := segmentHeader{SlotBytes: uint32(s.slotBytes), Slots: uint32(s.segmentSlots(i)), Segment: uint32(i), ValueLen: uint32(s.valueLen), ValueOff: uint32(s.valueOff)}
		size := int64(segmentHeaderBytes) + int64(want.Slots)*int64(s.slotBytes)
		st, err := f.Stat()
		if err != nil {
			return fmt.Errorf("disk: %w", err)
		}
		nread, err := f.ReadAt(hdr, 0)
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("disk: read %s: %w", path, err)
		}
		if nread < segmentHeaderUsed || isZero(hdr[:nread]) {
			// New, or created by a process that died before writing the
			// header: nothing in it was ever indexed.
			if nread > 0 && st.Size() > int64(segmentHeaderBytes) && !isZero(hdr[:nread]) {
				return fmt.Errorf("%w: %s: a segment header of %d bytes", ErrForeignDir, path, nread)
			}
			if err := s.initSegment(f, want, size); err != nil {
				return fmt.Errorf("disk: create %s: %w", path, err)
			}
			s.fresh[i] = true
			continue
		}
		got, err := decodeSegmentHeader(hdr[:nread])
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrForeignDir, path, err)
		}
		if got != want {
			return fmt.Errorf("%w: %s: slot bytes %d, slots %d, segment %d, value length %d, value offset %d; this config needs %d, %d, %d, %d, %d",
				ErrForeignDir, path, got.SlotBytes, got.Slots, got.Segment, got.ValueLen, got.ValueOff, want.SlotBytes, want.Slots, want.Segment, want.ValueLen, want.ValueOff)
		}
		if st.Size() < size { // preallocation cut by a crash
			if err := preallocate(f, size); err != nil {
				return fmt.Errorf("disk: extend %s to %d bytes: %w", path, size, err)
			}
		}
	}
	s.dirty = make([]bool, n)
	return nil
}

func (s *Store) initSegment(f *os.File, h segmentHeader, size int64) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	if err := preallocate(f, size); err != nil {
		return err
	}
	b := make([]byte, segmentHeaderBytes)
	h.encode(b)
	if _, err := f.WriteAt(b, 0); err != nil {
		return err
	}
	return f.Sync()
}

// slotAt returns the segment file and byte offset of slot i.
func (s *Store) slotAt(i int) (*os.File, int64) {
	return s.segs[i/s.segSlots], int64(segmentHeaderBytes) + int64(i%s.segSlots)*int64(s.slotBytes)
}

// scan rebuilds the index from every slot: verified pages are indexed
// (the newest copy of each), the rest are counted, reported and cleared.
func (s *Store) scan() error {
	s.slots = make([]slotEntry, s.cfg.Pages)
	s.index = make(map[tier.Digest]int32)
	s.pending = make(map[tier.Digest]struct{})
	policy, err := newQueues(s.cfg.Eviction, s.cfg.Levels, s.cfg.Pages)
	if err != nil { // checked by Open
		return fmt.Errorf("%w: Eviction: %w", ErrBadConfig, err)
	}
	s.policy = policy
	s.lapses = tier.NewLapses(s.cfg.Pages)
	rec := &s.recovery
	rec.Slots = s.cfg.Pages
	perRead := max(1, maxReadBytes/s.slotBytes)
	buf := make([]byte, min(perRead, s.segSlots)*s.slotBytes)
	var tokens []int32
	scratch := make([]byte, 0, 64+4*s.cfg.Format.PageSize)
	var drops []int32
	drop := func(slot int, why DropReason, err error) {
		switch why {
		case DropTorn:
			rec.Torn++
		case DropForeign:
			rec.Foreign++
		case DropDuplicate:
			rec.Duplicate++
		}
		if len(rec.Drops) < MaxDropReports {
			rec.Drops = append(rec.Drops, Drop{File: filepath.Base(s.segmentPath(slot / s.segSlots)), Slot: slot % s.segSlots, Reason: why, Err: err.Error()})
		}
		drops = append(drops, int32(slot))
	}
	for first := 0; first < s.cfg.Pages; {
		if seg := first / s.segSlots; s.fresh[seg] {
			// Created by this Open: every slot is empty. Not reading it
			// keeps its (zero) bytes out of the page cache too.
			rec.Empty += s.segmentSlots(seg)
			first += s.segmentSlots(seg)
			continue
		}
		n := min(perRead, s.segSlots-first%s.segSlots, s.cfg.Pages-first)
		f, off := s.slotAt(first)
		b := buf[:n*s.slotBytes]
		if _, err := f.ReadAt(b, off); err != nil {
			return fmt.Errorf("disk: read %s at %d: %w", f.Name(), off, err)
		}
		for k := range n {
			slot := first + k
			h, v, why, err := s.checkSlot(b[k*s.slotBytes:(k+1)*s.slotBytes], tokens)
			if err == nil {
				tokens = v.Tokens
				if err = v.CheckDigest(scratch); err != nil {
					why = DropTorn
				}
			}
			switch {
			case errors.Is(err, errEmptySlot):
				rec.Empty++
				continue
			case err != nil:
				drop(slot, why, err)
				continue
			}
			if old, ok := s.index[v.Digest]; ok {
				older, newer := int(old), slot
				if s.slots[old].seq > h.Seq {
					older, newer = slot, int(old)
				}
				drop(older, DropDuplicate, fmt.Errorf("page %s also in slot %d with a higher sequence", v.Digest.String()[:16], newer))
				if older == slot {
					continue
				}
				s.slots[old] = slotEntry{}
				rec.Recovered--
			}
			if h.Ret.Priority >= uint8(s.cfg.Levels) { // written with more levels
				h.Ret.Priority = uint8(s.cfg.Levels - 1)
				if h.Ret.Priority == 0 {
					h.Ret = tier.ValueRetention{Hint: h.Ret.Hint}
				}
			}
			s.slots[slot] = slotEntry{digest: v.Digest, seq: h.Seq, state: slotReady, ret: h.Ret}
			s.index[v.Digest] = int32(slot)
			s.nextSeq = max(s.nextSeq, h.Seq)
			rec.Recovered++
		}
		first += n
	}
	s.nextSeq++
	// Clear the dropped slots' headers so the next restart does not
	// report them again; a crash while clearing only repeats the report.
	var zero [slotHeaderBytes]byte
	for _, slot := range drops {
		f, off := s.slotAt(int(slot))
		if _, err := f.WriteAt(zero[:], off); err != nil {
			return fmt.Errorf("disk: clear dropped slot %d of %s: %w", int(slot)%s.segSlots, f.Name(), err)
		}
	}
	if len(drops) > 0 {
		for _, f := range s.segs {
			if err := f.Sync(); err != nil {
				return fmt.Errorf("disk: sync %s: %w", f.Name(), err)
			}
		}
	}
	// The scan read every slot once: drop those bytes from the page
	// cache (they are clean), as a later read or write of a slot is
	// better served by cache pages of its own. Pages the scan read stay
	// as the readahead made them, small, and writes into small cache
	// pages cost the kernel about a third more than writes that make
	// their own (docs/performance-log.md, the disk tier's 2026-11-27 entry).
	for i, f := range s.segs {
		if !s.fresh[i] {
			dropCache(f)
		}
	}
	// The policy learns the recovered pages oldest first; free slots are
	// used lowest first (sequential writes into a fresh store).
	ready := make([]int32, 0, len(s.index))
	for i := len(s.slots) - 1; i >= 0; i-- {
		if s.slots[i].state == slotReady {
			ready = append(ready, int32(i))
		} else {
			s.free = append(s.free, int32(i))
		}
	}
	slices.SortFunc(ready, func(a, b int32) int { return cmp.Compare(s.slots[a].seq, s.slots[b].seq) })
	if s.nextSeq > RenumberAbove {
		if err := s.renumber(ready); err != nil {
			return err
		}
	}
	now := s.now()
	for _, slot := range ready {
		s.policy.Added(int(slot), s.timeRetention(int(slot), now, false))
	}
	return nil
}

// renumber gives the recovered slots ready (in sequence order) the
// sequences 1..len(ready), rewriting each slot header, then syncs: a
// store whose highest sequence leaves too few to continue (a planted or
// damaged header that verifies) goes on from len(ready)+1. A crash in
// the middle leaves old and new sequences mixed, which the next Open
// renumbers again; no page is lost, only their order may change.
func (s *Store) renumber(ready []int32) error {
	var hdr [slotHeaderBytes]byte
	for i, slot := range ready {
		f, off := s.slotAt(int(slot))
		if _, err := f.ReadAt(hdr[:], off); err != nil {
			return fmt.Errorf("disk: renumber slot %d of %s: %w", int(slot)%s.segSlots, f.Name(), err)
		}
		h, err := decodeSlotHeader(hdr[:])
		if err != nil {
			return fmt.Errorf("disk: renumber slot %d of %s: %w", int(slot)%s.segSlots, f.Name(), err)
		}
		h.Seq = uint64(i + 1)
		h.encode(hdr[:])
		if _, err := f.WriteAt(hdr[:], off); err != nil {
			return fmt.Errorf("disk: renumber slot %d of %s: %w", int(slot)%s.segSlots, f.Name(), err)
		}
		s.slots[slot].seq = h.Seq
	}
	for _, f := range s.segs {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("disk: sync %s: %w", f.Name(), err)
		}
	}
	s.recovery.Renumbered = len(ready)
	s.nextSeq = uint64(len(ready)) + 1
	return nil
}

// Recovery returns what Open found in the segment files.
func (s *Store) Recovery() Recovery {
	r := s.recovery
	r.Drops = slices.Clone(r.Drops)
	return r
}

// Config returns the store's configuration with defaults filled in.
func (s *Store) Config() Config { return s.cfg }

// Fetch implements [tier.RemoteStore]: the leading pages found and
// verified (slot header, checksum, namespace, group, format, digest, parent
// and tokens), read run by run (pages in consecutive slots), each run in
// pieces of at most 512 KiB (at least a slot), one preadv each, read and
// checked by Fetch's goroutine and the store's read helper in turn
// (read.go), checking ctx between runs. The page bytes are read straight
// into Data and checked there, so the Data of the page that failed (the
// first one not served) and of the pages after it may have been written:
// only the served pages' Data is defined.
func (s *Store) Fetch(ctx context.Context, pages []tier.RemotePage) int {
	if !s.c.Lookup(len(pages)) {
		return 0
	}
	s.readMu.Lock()
	defer s.readMu.Unlock()
	s.ioMu.RLock()
	defer s.ioMu.RUnlock()
	maxRun := max(1, maxRunBytes/s.slotBytes)
	if s.runSeqs == nil {
		s.allocReads(min(maxRun, s.cfg.Pages))
	}
	for done := 0; done < len(pages); {
		if ctx.Err() != nil {
			s.c.Errors.Add(1)
			s.c.Timeouts.Add(1)
			return done
		}
		first, n, ok := s.lookupRun(pages[done:], min(maxRun, len(s.runSeqs)))
		if !ok {
			return done
		}
		served := s.readRun(pages[done:done+n], first)
		done += served
		if served < n {
			return done
		}
	}
	return len(pages)
}

// lookupRun finds pages[0] and the pages after it that sit in the slots
// after its slot in the same segment (at most maxRun), recording each
// slot's sequence; ok is false on a miss (or a closed store).
func (s *Store) lookupRun(pages []tier.RemotePage, maxRun int) (first, n int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		s.c.Errors.Add(1)
		return 0, 0, false
	}
	slot, hit := s.index[pages[0].Digest]
	if !hit || s.slots[slot].state != slotReady {
		s.c.Misses.Add(1)
		return 0, 0, false
	}
	first = int(slot)
	s.runSeqs[0] = s.slots[slot].seq
	n = 1
	for n < len(pages) && n < maxRun && (first+n)%s.segSlots != 0 {
		next, hit := s.index[pages[n].Digest]
		if !hit || int(next) != first+n || s.slots[next].state != slotReady {
			break
		}
		s.runSeqs[n] = s.slots[next].seq
		n++
	}
	s.readLo, s.readHi = first, first+n
	return first, n, true
}

// Store implements [tier.RemoteStore]: it encodes p into a free buffer and
// queues it for the writer; a page the store holds or has queued is not
// queued again (true); with every buffer in use, a bad page or a closed
// store it drops the page (false).
func (s *Store) Store(p *tier.RemotePage) bool {
	s.mu.Lock()
	_, have := s.index[p.Digest]
	_, queued := s.pending[p.Digest]
	closed := s.closed
	s.mu.Unlock()
	switch {
	case closed:
		s.c.Dropped.Add(1)
		return false
	case have || queued:
		return true
	}
	var j *job
	select {
	case j = <-s.jobs:
	default:
		s.c.Dropped.Add(1)
		return false
	}
	// The value is encoded in place: j.val has exactly its length as
	// capacity, so EncodeValue never moves it out of the slot buffer. The
	// retention goes in the slot header: every value has the same length.
	bare := *p
	bare.Retention = tier.Retention{}
	_, err := tier.EncodeValue(j.val[:0], s.cfg.Format, s.cfg.Namespace, s.cfg.Group, &bare)
	if err == nil {
		err = p.Retention.Check()
	}
	if err != nil {
		s.jobs <- j
		s.c.Dropped.Add(1)
		return false
	}
	r := p.Retention
	r.Priority = min(r.Priority, uint8(s.cfg.Levels-1))
	if r.Priority == 0 {
		r.Duration, r.Left = 0, 0 // level 0 has nothing to lapse
	}
	j.digest, j.ret = p.Digest, r.Written(s.now())
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.jobs <- j
		s.c.Dropped.Add(1)
		return false
	}
	// Checked again under the lock that queues: another Store of the same
	// page may have queued it while this one encoded. Two jobs of one page
	// in a batch would both get a slot, and the first would stay ready but
	// unindexed (CheckInvariants: "not indexed at itself").
	_, have = s.index[p.Digest]
	_, queued = s.pending[p.Digest]
	if have || queued {
		s.mu.Unlock()
		s.jobs <- j
		return true
	}
	s.pending[p.Digest] = struct{}{}
	tier.Queue(&s.backlog, s.queue, j) // never blocks: at most QueueLen jobs exist
	s.mu.Unlock()
	return true
}

// writer writes queued pages until Close, then syncs. It takes every
// page queued (gather) and writes them with a few vectored writes: a
// write call costs more than its bytes suggest. It starts once it holds
// minWriteBytes of pages (or none has come for lingerIdle, or Flush
// asks), so that while it writes, Store copies the next pages into free
// buffers on the caller's core, and the next batch is what queued
// meanwhile.
func (s *Store) writer() {
	defer s.wg.Done()
	for j := range s.queue {
		if s.beforeWrite != nil {
			s.beforeWrite()
		}
		s.batch = append(s.batch[:0], j)
		s.gather()
		s.writeBatch(s.batch)
		for _, j := range s.batch {
			s.jobs <- j
		}
		s.backlog.Done(len(s.batch))
	}
	s.sync()
}

// gather adds to s.batch (holding the first page) every page already
// queued, up to maxBatch; while it holds fewer than lingerBatch it also
// waits for the next page, until none comes for lingerIdle or Flush asks
// for the writes. At least half the buffers stay free for Store.
func (s *Store) gather() {
	for len(s.batch) < s.maxBatch {
		select {
		case j, ok := <-s.queue:
			if !ok {
				return
			}
			s.batch = append(s.batch, j)
			continue
		default:
		}
		if len(s.batch) >= s.lingerBatch {
			return
		}
		s.linger.Reset(lingerIdle)
		select {
		case j, ok := <-s.queue:
			s.linger.Stop()
			if !ok {
				return
			}
			s.batch = append(s.batch, j)
		case <-s.linger.C:
			return
		case <-s.kick:
			s.linger.Stop()
			return
		}
	}
}

// writeBatch puts the pages of batch into free slots, or overwrites the
// policy's victims: each victim leaves the index before its bytes change,
// each run of pages in consecutive slots is one vectored write of whole
// slots (header, value, padding), and the pages join the index after it.
func (s *Store) writeBatch(batch []*job) {
	s.mu.Lock()
	for _, j := range batch {
		j.slot = -1
		if _, ok := s.index[j.digest]; ok {
			s.skipped.Add(1)
			continue
		}
		if s.nextSeq > MaxSequence { // unreachable: Open leaves 2^62 sequences
			s.c.Dropped.Add(1)
			continue
		}
		slot, ok := s.takeSlot()
		if !ok { // unreachable with one writer: every slot is free, ready or ours
			s.c.Dropped.Add(1)
			continue
		}
		j.slot, j.seq = int32(slot), s.nextSeq
		s.nextSeq++
		s.slots[slot] = slotEntry{digest: j.digest, seq: j.seq, state: slotWriting, ret: j.ret}
		s.writing++
	}
	s.mu.Unlock()

	// One run at a time: consecutive jobs in consecutive slots of one
	// segment file.
	var errs []bool // nil unless a run failed
	for a := 0; a < len(batch); {
		if batch[a].slot < 0 {
			a++
			continue
		}
		b := a + 1
		for b < len(batch) && batch[b].slot == batch[b-1].slot+1 && int(batch[b].slot)%s.segSlots != 0 {
			b++
		}
		if err := s.writeRun(batch[a:b]); err != nil {
			if errs == nil {
				errs = make([]bool, len(batch))
			}
			for k := a; k < b; k++ {
				errs[k] = true
			}
		}
		a = b
	}

	s.mu.Lock()
	now := s.advance()
	for k, j := range batch {
		delete(s.pending, j.digest)
		if j.slot < 0 {
			continue
		}
		slot := int(j.slot)
		s.writing--
		if errs != nil && errs[k] {
			s.slots[slot] = slotEntry{}
			s.free = append(s.free, j.slot)
			s.c.Errors.Add(1)
			continue
		}
		s.slots[slot].state = slotReady
		s.index[j.digest] = j.slot
		s.policy.Written(slot, s.timeRetention(slot, now, false), j.digest)
		s.c.Stored.Add(1)
		s.c.BytesOut.Add(int64(s.valueLen))
		s.dirty[slot/s.segSlots] = true
		s.sinceSync++
	}
	if errs != nil { // the failed slots are used again lowest first
		slices.SortFunc(s.free, func(a, b int32) int { return cmp.Compare(b, a) })
	}
	s.mu.Unlock()
	if s.cfg.SyncEvery > 0 && s.sinceSync >= s.cfg.SyncEvery {
		s.sync()
	}
}

// writeRun writes jobs (in consecutive slots of one segment) with one
// pwritev of their whole slots. Each slot header, written here, names its
// sequence and its value's checksum, so a slot whose write was cut (a
// crash in the middle of the run) never verifies: its header and its
// value's trailing checksum come from different writes, or its value
// fails its checksum.
func (s *Store) writeRun(jobs []*job) error {
	for _, j := range jobs {
		slotHeader{Seq: j.seq, ValueLen: uint32(s.valueLen), ValueCRC: binary.LittleEndian.Uint32(j.val[s.valueLen-tier.ValueCRCBytes:]), Ret: j.ret}.encode(j.buf)
	}
	s.writes.Add(1)
	f, off := s.slotAt(int(jobs[0].slot))
	if s.writeChunk > 0 {
		return s.writePieces(f, jobs)
	}
	s.wio.reset()
	for _, j := range jobs {
		s.wio.add(j.buf)
	}
	return s.wio.writeAt(f, off)
}

// writePieces (tests) writes each slot's header and value in pieces of
// writeChunk bytes, one pwrite each, in order: many more places for a
// kill to cut a slot.
func (s *Store) writePieces(f *os.File, jobs []*job) error {
	for _, j := range jobs {
		_, off := s.slotAt(int(j.slot))
		for b := j.buf[:s.valueOff+s.valueLen]; len(b) > 0; {
			n := min(len(b), s.writeChunk)
			if _, err := f.WriteAt(b[:n], off); err != nil {
				return err
			}
			b, off = b[n:], off+int64(n)
		}
	}
	return nil
}

// takeSlot returns a free slot or the policy's victim, taken out of the
// index and the policy; s.mu is held.
func (s *Store) takeSlot() (int, bool) {
	if n := len(s.free); n > 0 {
		slot := s.free[n-1]
		s.free = s.free[:n-1]
		return int(slot), true
	}
	s.advance()
	slot, ok := s.policy.Victim()
	for ok && slot >= s.readLo && slot < s.readHi {
		// Fetch is reading the victim: wait for it (one preadv), then ask
		// again (the read made it recently used).
		s.readDone.Wait()
		slot, ok = s.policy.Victim()
	}
	if !ok {
		return 0, false
	}
	s.policy.Evict(slot, s.slots[slot].digest)
	s.lapses.Remove(int32(slot))
	delete(s.index, s.slots[slot].digest)
	s.slots[slot] = slotEntry{}
	s.evicted.Add(1)
	return slot, true
}

// sync fsyncs the segment files written since the last sync (the writer's
// goroutine, or Flush once the writer is idle).
func (s *Store) sync() {
	synced := false
	for i, d := range s.dirty {
		if !d {
			continue
		}
		if err := s.segs[i].Sync(); err != nil {
			s.c.Errors.Add(1)
		}
		s.dirty[i], synced = false, true
	}
	if synced {
		s.syncs.Add(1)
	}
	s.sinceSync = 0
}

// Flush waits until every queued page has been written (or has failed),
// or returns ctx's error. With sync it then fsyncs what was written since
// the last sync, so the pages survive a power loss too.
func (s *Store) Flush(ctx context.Context, sync bool) error {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return ErrClosed
	}
	// A writer gathering a batch writes it now.
	select {
	case s.kick <- struct{}{}:
	default:
	}
	// The writer is idle while the backlog stays empty: it takes a page
	// only after Store counted it, which waits for Wait to return.
	return s.backlog.Wait(ctx, func() {
		if sync {
			s.sync()
		}
	})
}

// Close stops accepting pages, writes what is queued, syncs and closes the
// files. The directory's lock is released.
func (s *Store) Close() error {
	if !tier.CloseQueue(&s.mu, &s.closed, s.queue) {
		return nil
	}
	s.wg.Wait()
	s.ioMu.Lock()
	defer s.ioMu.Unlock()
	s.stopReadHelper()
	return s.closeFiles()
}

func (s *Store) closeFiles() error {
	var errs []error
	for _, f := range s.segs {
		errs = append(errs, f.Close())
	}
	s.segs = nil
	if s.lock != nil {
		errs = append(errs, s.lock.Close())
		s.lock = nil
	}
	if s.dir != nil {
		errs = append(errs, s.dir.close())
		s.dir = nil
	}
	return errors.Join(errs...)
}

// Stats implements [tier.RemoteStore].
func (s *Store) Stats() tier.RemoteStats {
	st := s.c.Snapshot()
	s.rejections.Fill(&st)
	return st
}

// reject records that page p's slot was found and refused.
func (s *Store) reject(p *tier.RemotePage, reason tier.RejectReason, err error) {
	s.rejections.Record(p.Digest.String(), reason, err.Error())
}

// rejectReason classifies why a slot was refused in a lookup.
func rejectReason(why DropReason, err error) tier.RejectReason {
	switch {
	case errors.Is(err, tier.ErrStaleValue):
		return tier.RejectStale
	case why == DropForeign || errors.Is(err, tier.ErrForeignValue):
		return tier.RejectForeign
	}
	return tier.RejectCorrupt
}

// DiskStats returns the store's counters and occupancy.
func (s *Store) DiskStats() Stats {
	s.mu.Lock()
	pages := len(s.index)
	s.mu.Unlock()
	return Stats{Remote: s.Stats(), Pages: pages, Capacity: s.cfg.Pages,
		Evicted: s.evicted.Load(), Skipped: s.skipped.Load(), Syncs: s.syncs.Load(), Writes: s.writes.Load()}
}

// CheckInvariants checks the index against the slot table, the free list
// and the policy: every ready slot is indexed under its digest exactly
// once and tracked by the policy, every other slot is free (or the one
// being written), and the free list holds each free slot once.
func (s *Store) CheckInvariants() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var problems []string
	onFree := make([]bool, len(s.slots))
	for _, f := range s.free {
		if f < 0 || int(f) >= len(s.slots) || onFree[f] || s.slots[f].state != slotFree {
			problems = append(problems, fmt.Sprintf("free list holds slot %d (repeated, out of range or not free)", f))
			continue
		}
		onFree[f] = true
	}
	ready, writing := 0, 0
	for i, e := range s.slots {
		switch e.state {
		case slotReady:
			ready++
			if got, ok := s.index[e.digest]; !ok || int(got) != i {
				problems = append(problems, fmt.Sprintf("ready slot %d (page %s) is not indexed at itself", i, e.digest.String()[:16]))
			}
			if e.seq == 0 || e.seq >= s.nextSeq {
				problems = append(problems, fmt.Sprintf("slot %d sequence %d outside [1, %d)", i, e.seq, s.nextSeq))
			}
		case slotWriting:
			writing++
		case slotFree:
			if !onFree[i] {
				problems = append(problems, fmt.Sprintf("free slot %d is not on the free list", i))
			}
		}
	}
	if len(s.index) != ready {
		problems = append(problems, fmt.Sprintf("index holds %d pages, %d slots are ready", len(s.index), ready))
	}
	if writing != s.writing || writing > s.maxBatch {
		problems = append(problems, fmt.Sprintf("%d slots being written, the writer counts %d and writes at most %d", writing, s.writing, s.maxBatch))
	}
	if s.policy.Len() != ready {
		problems = append(problems, fmt.Sprintf("policy tracks %d slots, %d are ready", s.policy.Len(), ready))
	}
	if err := s.policy.checkInvariants(); err != nil {
		problems = append(problems, err.Error())
	}
	if err := s.lapses.Check(); err != nil {
		problems = append(problems, err.Error())
	}
	for i, e := range s.slots {
		if s.policy.tracked(i) != (e.state == slotReady) {
			problems = append(problems, fmt.Sprintf("slot %d: on an eviction queue %v, state %d", i, s.policy.tracked(i), e.state))
		}
		if s.policy.tracked(i) && s.policy.Level(i) != int(e.ret.Priority) {
			problems = append(problems, fmt.Sprintf("slot %d of level %d is queued at level %d", i, e.ret.Priority, s.policy.Level(i)))
		}
		at, timed := s.lapses.Deadline(int32(i))
		if timed != (e.state == slotReady && e.ret.Duration > 0) || timed && int64(at) != e.ret.Deadline {
			problems = append(problems, fmt.Sprintf("slot %d (state %d, retention %+v) on the lapse heap %v at %d", i, e.state, e.ret, timed, at))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("disk: invariants: %s", strings.Join(problems, "; "))
	}
	return nil
}

// Medium returns [tier.Disk]: pages a Manager reads from the store are
// accounted as disk reads ([tier.MediumStore]).
func (s *Store) Medium() tier.Medium { return tier.Disk }
