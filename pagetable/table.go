package pagetable

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/internal/invariants"
	"github.com/pagedkv/pagedkv/ragged"
)

// SeqID names a sequence (a request, or a branch of one after a fork).
type SeqID uint64

// MaxPageSize is the largest page size, in tokens, a Table accepts.
const MaxPageSize = 1 << 16

var (
	// ErrUnknownSeq reports a sequence ID the table does not hold.
	ErrUnknownSeq = errors.New("pagetable: unknown sequence")
	// ErrSeqExists reports adding a sequence ID the table already holds.
	ErrSeqExists = errors.New("pagetable: sequence already exists")
	// ErrBadCSR reports a malformed CSR page table or append indptr from
	// outside; the wrapping error names the request index and the value. It
	// is [ragged.ErrBadPageTable], the one page-table sentinel, which
	// kernels.ErrInvalidPageTable is too.
	ErrBadCSR = ragged.ErrBadPageTable
	// ErrBadArgument reports other malformed arguments: length mismatches,
	// negative counts, duplicate IDs in a batch, truncation outside
	// [Start, Len], and lengths that overflow int32.
	ErrBadArgument = errors.New("pagetable: bad argument")
	// ErrBadConfig reports an invalid [Config].
	ErrBadConfig = errors.New("pagetable: bad config")
)

// Config describes a Table.
type Config struct {
	// PageSize is the number of tokens per page, 1..MaxPageSize.
	PageSize int
	// Allocator supplies the pages. It may be shared with other holders.
	Allocator *allocator.Allocator
}

// CopyOp is a page copy that copy-on-write requires: the engine must copy
// entries [0, Entries) of page Src to page Dst, for every head, K and V.
type CopyOp struct {
	Src, Dst allocator.PageID
	Entries  int32
}

// seq is one sequence's state. Slots are reused after Release, so pages keeps
// its capacity from one request to the next.
type seq struct {
	id    SeqID
	live  bool
	pages []allocator.PageID // held pages in token order
	len   int                // tokens logically in the sequence (Len)
	start int                // first held token (Start), a multiple of pageSize

	// Scratch of the batch call in progress (Reserve), valid only while
	// mark == Table.epoch.
	mark     uint64
	newPages int  // pages to append
	cow      bool // whether the last page moves to a fresh page first
}

// Table holds the page lists of a set of sequences. It is not safe for
// concurrent use. The zero value is not usable; call [New]. A Table must not
// be copied.
type Table struct {
	_        invariants.NoCopy
	pageSize int
	alloc    *allocator.Allocator

	index     map[SeqID]int32 // sequence ID -> slot in slots
	slots     []seq
	freeSlots []int32 // slots with live == false

	epoch        uint64 // incremented by every batch call; see seq.mark
	scratchSlots []int32
	scratchPages []allocator.PageID
	scratchOld   []allocator.PageID

	// copiedAway counts, during Reserve, the batch members planned to copy
	// away from each shared page (see Reserve). Touched only when a partial
	// last page is shared.
	copiedAway map[allocator.PageID]int32
}

// New returns an empty table.
func New(cfg Config) (*Table, error) {
	if cfg.PageSize < 1 || cfg.PageSize > MaxPageSize {
		return nil, fmt.Errorf("%w: PageSize = %d, want 1..%d", ErrBadConfig, cfg.PageSize, MaxPageSize)
	}
	if cfg.Allocator == nil {
		return nil, fmt.Errorf("%w: Allocator is nil", ErrBadConfig)
	}
	return &Table{
		pageSize: cfg.PageSize,
		alloc:    cfg.Allocator,
		index:    make(map[SeqID]int32),
	}, nil
}

// PageSize returns the number of tokens per page.
func (t *Table) PageSize() int { return t.pageSize }

// Allocator returns the allocator the table takes pages from.
func (t *Table) Allocator() *allocator.Allocator { return t.alloc }

// NumSeqs returns the number of sequences in the table.
func (t *Table) NumSeqs() int { return len(t.index) }

// Has reports whether the table holds sequence id.
func (t *Table) Has(id SeqID) bool { _, ok := t.index[id]; return ok }

// Len returns the number of tokens logically in sequence id, including those
// whose pages [Table.ReleaseWindow] released; 0 for an unknown sequence.
func (t *Table) Len(id SeqID) int {
	if s := t.lookup(id); s != nil {
		return s.len
	}
	return 0
}

// Start returns the first token of sequence id still on a page (a multiple
// of the page size); 0 unless [Table.ReleaseWindow] dropped pages, and 0 for
// an unknown sequence.
func (t *Table) Start(id SeqID) int {
	if s := t.lookup(id); s != nil {
		return s.start
	}
	return 0
}

// Pages returns the pages sequence id holds, in token order, or nil for an
// unknown sequence. The slice is a read-only view, valid until the next call
// that mutates the table.
func (t *Table) Pages(id SeqID) []allocator.PageID {
	if s := t.lookup(id); s != nil {
		return s.pages
	}
	return nil
}

// slotOf returns the slot of sequence id, the i-th of a batch. It tries
// hints[i] first: the batch calls (Reserve, ExportTo, ExportAppendTo) leave
// the slots of their batch in t.scratchSlots, and an engine passes the
// same batch to all three, so the map lookup (a cache miss per sequence at
// thousands of sequences) is skipped when the slot there still holds id.
func (t *Table) slotOf(id SeqID, hints []int32, i int) (int32, bool) {
	if i < len(hints) {
		if si := hints[i]; si >= 0 && int(si) < len(t.slots) && t.slots[si].live && t.slots[si].id == id {
			return si, true
		}
	}
	si, ok := t.index[id]
	return si, ok
}

func (t *Table) lookup(id SeqID) *seq {
	if i, ok := t.index[id]; ok {
		return &t.slots[i]
	}
	return nil
}

// ceilDiv returns ceil(a/b) for a >= 0, b > 0.
// ceilDiv is ceil(a/b) for a >= 0, b > 0, without the overflow of
// (a+b-1)/b near MaxInt.
func ceilDiv(a, b int) int {
	q := a / b
	if a%b != 0 {
		q++
	}
	return q
}

// newSlot makes a live, empty sequence id and returns its slot. It may move
// t.slots, so callers must not hold *seq pointers across it.
func (t *Table) newSlot(id SeqID) int32 {
	var i int32
	if n := len(t.freeSlots); n > 0 {
		i = t.freeSlots[n-1]
		t.freeSlots = t.freeSlots[:n-1]
	} else {
		t.slots = append(t.slots, seq{})
		i = int32(len(t.slots) - 1)
	}
	s := &t.slots[i]
	*s = seq{id: id, live: true, pages: s.pages[:0]}
	t.index[id] = i
	return i
}

// Add adds an empty sequence id.
func (t *Table) Add(id SeqID) error {
	if t.Has(id) {
		return fmt.Errorf("%w: add sequence %d", ErrSeqExists, id)
	}
	t.newSlot(id)
	return nil
}

// AddShared adds sequence id holding ntokens tokens on the given existing
// pages, each of which gains a holder (the prefix cache uses it to start a
// request on cached pages). The pages must be allocated and distinct, and
// either len(pages) == 0 and ntokens == 0, or
// (len(pages)-1)*pageSize < ntokens <= len(pages)*pageSize.
func (t *Table) AddShared(id SeqID, pages []allocator.PageID, ntokens int) error {
	if t.Has(id) {
		return fmt.Errorf("%w: add sequence %d", ErrSeqExists, id)
	}
	np := len(pages)
	if ntokens < 0 || ntokens > math.MaxInt32 {
		return fmt.Errorf("%w: add sequence %d with ntokens = %d, want 0..%d (int32 seq_len)", ErrBadArgument, id, ntokens, math.MaxInt32)
	}
	if ceilDiv(ntokens, t.pageSize) != np {
		return fmt.Errorf("%w: add sequence %d with %d tokens on %d pages of %d tokens (want %d pages)",
			ErrBadArgument, id, ntokens, np, t.pageSize, ceilDiv(ntokens, t.pageSize))
	}
	// A page listed twice would hold two different token ranges.
	sorted := append(t.scratchPages[:0], pages...)
	slices.Sort(sorted)
	t.scratchPages = sorted
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return fmt.Errorf("%w: add sequence %d: page %d listed twice", ErrBadArgument, id, sorted[i])
		}
	}
	if err := t.alloc.Retain(pages...); err != nil {
		return fmt.Errorf("pagetable: add sequence %d on shared pages: %w", id, err)
	}
	s := &t.slots[t.newSlot(id)]
	s.pages = append(s.pages, pages...)
	s.len = ntokens
	if invariants.Enabled {
		t.checkSeq(s)
	}
	return nil
}

// Reserve appends ntokens[i] token slots to sequence ids[i] for every i,
// allocating the pages needed, and appends to dst the copies copy-on-write
// requires (see the package doc); it returns the extended dst. The batch is
// all-or-nothing: if any ID is unknown or repeated, any count is negative or
// would take a sequence past MaxInt32 tokens, or the pool lacks pages for the
// whole batch (copies included; the error then wraps
// [allocator.ErrOutOfPages]), nothing changes and dst is returned as given.
//
// Copy-on-write follows one rule: a page is written only while its reference
// count is 1. A sequence appending into a partial last page with other
// holders moves to a fresh page (one CopyOp, in batch order). Holders that
// copy away earlier in the same batch stop counting, so when every holder of
// a page appends in one batch, all but the last copy and the last keeps it.
//
// The pages named by the returned CopyOps' Src stay held by their other
// holders; the engine must perform the copies before it writes the new
// tokens and before it releases any other holder of Src.
func (t *Table) Reserve(dst []CopyOp, ids []SeqID, ntokens []int32) ([]CopyOp, error) {
	if len(ids) != len(ntokens) {
		return dst, fmt.Errorf("%w: reserve: %d sequence IDs but %d token counts", ErrBadArgument, len(ids), len(ntokens))
	}
	ps := t.pageSize
	t.epoch++
	clear(t.copiedAway)
	hints, slotsIdx := t.scratchSlots, t.scratchSlots[:0]
	need, total := 0, int64(0)
	for i, id := range ids {
		si, ok := t.slotOf(id, hints, i)
		if !ok {
			t.scratchSlots = slotsIdx
			return dst, fmt.Errorf("%w: reserve: ids[%d] = %d", ErrUnknownSeq, i, id)
		}
		s := &t.slots[si]
		n := int(ntokens[i])
		switch {
		case s.mark == t.epoch:
			t.scratchSlots = slotsIdx
			return dst, fmt.Errorf("%w: reserve: ids[%d] = %d appears twice in the batch", ErrBadArgument, i, id)
		case n < 0:
			t.scratchSlots = slotsIdx
			return dst, fmt.Errorf("%w: reserve: ntokens[%d] = %d (sequence %d) is negative", ErrBadArgument, i, n, id)
		case int64(s.len)+int64(n) > math.MaxInt32:
			t.scratchSlots = slotsIdx
			return dst, fmt.Errorf("%w: reserve: ntokens[%d] = %d would take sequence %d from %d tokens past int32",
				ErrBadArgument, i, n, id, s.len)
		}
		s.mark = t.epoch
		held := s.len - s.start
		s.newPages = ceilDiv(held+n, ps) - len(s.pages)
		// Write into a partial last page only while we are its sole holder.
		// Holders that copy away earlier in this batch no longer count, so of
		// k batch members sharing a page, k-1 copy and the last one keeps it.
		s.cow = false
		if n > 0 && held%ps != 0 {
			last := s.pages[len(s.pages)-1]
			if rc := t.alloc.RefCount(last); rc > 1 {
				if t.copiedAway == nil {
					t.copiedAway = make(map[allocator.PageID]int32)
				}
				if rc-t.copiedAway[last] > 1 {
					s.cow = true
					t.copiedAway[last]++
				}
			}
		}
		need += s.newPages
		if s.cow {
			need++
		}
		total += int64(n)
		slotsIdx = append(slotsIdx, si)
	}
	t.scratchSlots = slotsIdx

	fresh := t.scratchPages[:0]
	if need > 0 {
		fresh = slices.Grow(fresh, need)[:need]
		t.scratchPages = fresh
		if err := t.alloc.Alloc(fresh); err != nil {
			return dst, fmt.Errorf("pagetable: reserve %d token slots for %d sequences (%d pages): %w",
				total, len(ids), need, err)
		}
	}

	// Commit: nothing below can fail.
	old := t.scratchOld[:0]
	for i, si := range slotsIdx {
		s := &t.slots[si]
		if s.cow {
			last := len(s.pages) - 1
			entries := int32(s.len - s.start - last*ps)
			dst = append(dst, CopyOp{Src: s.pages[last], Dst: fresh[0], Entries: entries})
			old = append(old, s.pages[last])
			s.pages[last] = fresh[0]
			fresh = fresh[1:]
		}
		s.pages = append(s.pages, fresh[:s.newPages]...)
		fresh = fresh[s.newPages:]
		s.len += int(ntokens[i])
		if invariants.Enabled {
			t.checkSeq(s)
		}
	}
	t.scratchOld = old
	if len(old) > 0 {
		if _, err := t.alloc.Release(old...); err != nil {
			panic(fmt.Sprintf("pagetable: releasing pages left by copy-on-write: %v", err))
		}
	}
	return dst, nil
}

// Grow makes room in sequence id's page list for pages up to token ntokens
// (counted like Len), so that [Table.Reserve] appends to it without
// allocating while the sequence stays within that length. It changes no
// page and no length; an unknown sequence is an error wrapping
// [ErrUnknownSeq], a negative or past-int32 count one wrapping
// [ErrBadArgument].
func (t *Table) Grow(id SeqID, ntokens int) error {
	s := t.lookup(id)
	if s == nil {
		return fmt.Errorf("%w: grow %d", ErrUnknownSeq, id)
	}
	if ntokens < 0 || ntokens > math.MaxInt32 {
		return fmt.Errorf("%w: grow sequence %d to %d tokens, want 0..%d", ErrBadArgument, id, ntokens, math.MaxInt32)
	}
	if need := ceilDiv(max(ntokens-s.start, 0), t.pageSize); need > len(s.pages) {
		s.pages = slices.Grow(s.pages, need-len(s.pages))
	}
	return nil
}

// Fork adds sequence child as a copy of parent that shares every page of it
// (each page gains a holder). The first append into a shared partial last
// page, by either side, moves it to a fresh page (see [Table.Reserve]).
func (t *Table) Fork(parent, child SeqID) error {
	pi, ok := t.index[parent]
	if !ok {
		return fmt.Errorf("%w: fork parent %d", ErrUnknownSeq, parent)
	}
	if t.Has(child) {
		return fmt.Errorf("%w: fork child %d of %d", ErrSeqExists, child, parent)
	}
	if err := t.alloc.Retain(t.slots[pi].pages...); err != nil {
		return fmt.Errorf("pagetable: fork %d -> %d: %w", parent, child, err)
	}
	ci := t.newSlot(child) // may move t.slots
	p, c := &t.slots[pi], &t.slots[ci]
	c.pages = append(c.pages, p.pages...)
	c.len, c.start = p.len, p.start
	if invariants.Enabled {
		t.checkSeq(c)
	}
	return nil
}

// Truncate shortens sequence id to ntokens tokens, Start <= ntokens <= Len,
// and releases the pages past the new end.
func (t *Table) Truncate(id SeqID, ntokens int) error {
	s := t.lookup(id)
	if s == nil {
		return fmt.Errorf("%w: truncate %d", ErrUnknownSeq, id)
	}
	if ntokens < s.start || ntokens > s.len {
		return fmt.Errorf("%w: truncate sequence %d to %d tokens, want %d..%d (Start..Len)",
			ErrBadArgument, id, ntokens, s.start, s.len)
	}
	keep := ceilDiv(ntokens-s.start, t.pageSize)
	t.release(s.pages[keep:])
	s.pages = s.pages[:keep]
	s.len = ntokens
	if invariants.Enabled {
		t.checkSeq(s)
	}
	return nil
}

// ReplaceLast makes page the last page of sequence id in place of the one
// it holds, and returns the page it replaced. page gains a holder and the
// old page loses one (returning to the pool if that was its last). It
// undoes a copy-on-write whose copy held nothing worth keeping (the
// Manager's rollback of rejected draft tokens): the caller guarantees that
// page holds the sequence's entries of its last page. The sequence must
// hold at least one page, page must be allocated and not already held by
// the sequence; otherwise nothing changes.
func (t *Table) ReplaceLast(id SeqID, page allocator.PageID) (old allocator.PageID, err error) {
	s := t.lookup(id)
	if s == nil {
		return 0, fmt.Errorf("%w: replace last page of %d", ErrUnknownSeq, id)
	}
	n := len(s.pages)
	if n == 0 {
		return 0, fmt.Errorf("%w: replace last page of sequence %d, which holds no page", ErrBadArgument, id)
	}
	if slices.Contains(s.pages, page) {
		return 0, fmt.Errorf("%w: replace last page of sequence %d with page %d, which it holds", ErrBadArgument, id, page)
	}
	if err := t.alloc.Retain(page); err != nil {
		return 0, fmt.Errorf("pagetable: replace last page of sequence %d: %w", id, err)
	}
	old = s.pages[n-1]
	s.pages[n-1] = page
	t.release([]allocator.PageID{old})
	if invariants.Enabled {
		t.checkSeq(s)
	}
	return old, nil
}

// Release removes sequence id and releases its pages; pages left with no
// holder return to the pool.
func (t *Table) Release(id SeqID) error {
	i, ok := t.index[id]
	if !ok {
		return fmt.Errorf("%w: release %d", ErrUnknownSeq, id)
	}
	s := &t.slots[i]
	t.release(s.pages)
	*s = seq{pages: s.pages[:0]}
	delete(t.index, id)
	t.freeSlots = append(t.freeSlots, i)
	return nil
}

// ReleaseWindow keeps the last windowTokens tokens of sequence id reachable
// and releases the leading pages that lie entirely before them: page k holds
// tokens [Start+k*pageSize, Start+(k+1)*pageSize) and goes if that range ends
// at or before Len-windowTokens. Start advances by releasedPages*pageSize;
// Len is unchanged.
func (t *Table) ReleaseWindow(id SeqID, windowTokens int) (releasedPages int, err error) {
	s := t.lookup(id)
	if s == nil {
		return 0, fmt.Errorf("%w: release window of %d", ErrUnknownSeq, id)
	}
	if windowTokens < 0 {
		return 0, fmt.Errorf("%w: release window of sequence %d: windowTokens = %d is negative", ErrBadArgument, id, windowTokens)
	}
	before := s.len - windowTokens - s.start // held tokens before the window
	if before < t.pageSize {
		return 0, nil
	}
	drop := before / t.pageSize
	t.release(s.pages[:drop])
	s.pages = s.pages[:copy(s.pages, s.pages[drop:])]
	s.start += drop * t.pageSize
	if invariants.Enabled {
		t.checkSeq(s)
	}
	return drop, nil
}

// release gives back pages the table holds; failure means the table and the
// allocator disagree, which no input can cause.
func (t *Table) release(pages []allocator.PageID) {
	if len(pages) == 0 {
		return
	}
	if _, err := t.alloc.Release(pages...); err != nil {
		panic(fmt.Sprintf("pagetable: releasing held pages: %v", err))
	}
}

// CheckInvariants verifies every sequence and the reference counts of every
// held page, in time linear in the pages held, and returns the first
// violation found, or nil.
func (t *Table) CheckInvariants() error {
	live := 0
	for i := range t.slots {
		if t.slots[i].live {
			live++
		}
	}
	if live != len(t.index) || live+len(t.freeSlots) != len(t.slots) {
		return fmt.Errorf("pagetable: %d live slots, %d free slots, %d slots, %d indexed sequences",
			live, len(t.freeSlots), len(t.slots), len(t.index))
	}
	type holding struct {
		n        int32 // holders in the table
		lastSlot int32 // the last slot seen holding the page
	}
	holders := make(map[allocator.PageID]holding)
	for id, i := range t.index {
		s := &t.slots[i]
		if !s.live || s.id != id {
			return fmt.Errorf("pagetable: sequence %d maps to slot %d holding sequence %d (live %v)", id, i, s.id, s.live)
		}
		if err := t.seqError(s); err != nil {
			return err
		}
		for k, p := range s.pages {
			h, seen := holders[p]
			if seen && h.lastSlot == i {
				return fmt.Errorf("pagetable: sequence %d holds page %d twice (second at pages[%d])", id, p, k)
			}
			holders[p] = holding{n: h.n + 1, lastSlot: i}
		}
	}
	for p, h := range holders {
		if rc := t.alloc.RefCount(p); rc < h.n {
			return fmt.Errorf("pagetable: page %d is held %d times by the table but has refcount %d", p, h.n, rc)
		}
	}
	return nil
}

// seqError checks one sequence's shape and the counts of its last page.
func (t *Table) seqError(s *seq) error {
	if s.start < 0 || s.start > s.len || s.start%t.pageSize != 0 || s.len > math.MaxInt32 {
		return fmt.Errorf("pagetable: sequence %d has Start %d, Len %d, page size %d", s.id, s.start, s.len, t.pageSize)
	}
	if want := ceilDiv(s.len-s.start, t.pageSize); len(s.pages) != want {
		return fmt.Errorf("pagetable: sequence %d holds %d pages for tokens [%d, %d), want %d",
			s.id, len(s.pages), s.start, s.len, want)
	}
	if n := len(s.pages); n > 0 {
		if p := s.pages[n-1]; t.alloc.RefCount(p) < 1 {
			return fmt.Errorf("pagetable: sequence %d holds free page %d", s.id, p)
		}
	}
	return nil
}

// checkSeq is the cheap per-mutation check of invariants builds.
func (t *Table) checkSeq(s *seq) {
	if err := t.seqError(s); err != nil {
		panic(err.Error())
	}
}
