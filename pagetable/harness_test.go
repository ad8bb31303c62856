package pagetable_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/internal/reference"
	"github.com/pagedkv/pagedkv/pagetable"
)

// harness drives a Table and a reference.PageTableModel with the same
// operations and checks after each one that they agree. The two allocators
// may pick different free pages, so pages are compared up to a renaming
// (toModel), rebuilt after every operation from everything that holds pages:
// the exported page lists of all sequences and the external pins.
type harness struct {
	t     testing.TB
	next  func() byte // source of choices
	alloc *allocator.Allocator
	tab   *pagetable.Table
	model *reference.PageTableModel

	live   []pagetable.SeqID // sequences in both, in export order
	nextID pagetable.SeqID

	// pins are holds on pages from outside the table (as a prefix cache
	// has), in real and model IDs.
	pins      []allocator.PageID
	modelPins []int32

	toModel map[allocator.PageID]int32

	csr  pagetable.CSR
	app  pagetable.AppendCSR
	ops  []pagetable.CopyOp
	nops int

	// seen counts events, so a test can insist the operations it meant to
	// exercise happened.
	seen map[string]int
}

func newHarness(t testing.TB, pageSize, numPages int, next func() byte) *harness {
	a, err := allocator.New(allocator.Config{NumPages: numPages})
	require.NoError(t, err)
	tab, err := pagetable.New(pagetable.Config{PageSize: pageSize, Allocator: a})
	require.NoError(t, err)
	return &harness{
		t: t, next: next, alloc: a, tab: tab,
		model:   reference.NewPageTableModel(pageSize, numPages),
		nextID:  1,
		toModel: map[allocator.PageID]int32{},
		seen:    map[string]int{},
	}
}

func (h *harness) intn(n int) int {
	if n <= 0 {
		return 0
	}
	return int(uint16(h.next())|uint16(h.next())<<8) % n
}

// pickID returns a live sequence, or sometimes one that does not exist.
func (h *harness) pickID() pagetable.SeqID {
	if len(h.live) == 0 || h.intn(16) == 0 {
		return h.nextID + 1000
	}
	return h.live[h.intn(len(h.live))]
}

// newID returns an unused ID, or sometimes a live one.
func (h *harness) newID() pagetable.SeqID {
	if len(h.live) > 0 && h.intn(16) == 0 {
		return h.live[h.intn(len(h.live))]
	}
	h.nextID++
	return h.nextID
}

func (h *harness) dropLive(id pagetable.SeqID) {
	i := slices.Index(h.live, id)
	h.live = slices.Delete(h.live, i, i+1)
}

func (h *harness) modelPages(ps []allocator.PageID) []int32 {
	out := make([]int32, len(ps))
	for i, p := range ps {
		m, ok := h.toModel[p]
		if !ok {
			m = -1_000_000 - int32(p) // never a model page
		}
		out[i] = m
	}
	return out
}

// sameClass fails unless real and model errors are both nil or of the same
// class.
func (h *harness) sameClass(what string, real, model error) {
	h.t.Helper()
	classes := []struct{ real, model error }{
		{allocator.ErrOutOfPages, reference.ErrModelOutOfPages},
		{allocator.ErrBadPage, reference.ErrModelBadPage},
		{pagetable.ErrUnknownSeq, reference.ErrModelUnknownSeq},
		{pagetable.ErrSeqExists, reference.ErrModelSeqExists},
		{pagetable.ErrBadArgument, reference.ErrModelBadArgument},
	}
	same := (model == nil) == (real == nil)
	for _, c := range classes {
		same = same && errors.Is(model, c.model) == errors.Is(real, c.real)
	}
	if !same {
		h.t.Fatalf("op %d %s: real error %v, model error %v", h.nops, what, real, model)
	}
	switch {
	case real == nil:
	case errors.Is(real, allocator.ErrOutOfPages):
		h.seen["out of pages"]++
	default:
		h.seen["other error"]++
	}
}

// step runs one randomly chosen operation on both and checks agreement.
func (h *harness) step() {
	h.t.Helper()
	h.nops++
	ps := h.tab.PageSize()
	switch op := h.intn(20); {
	case op < 2: // add
		id := h.newID()
		err := h.tab.Add(id)
		h.sameClass("add", err, h.model.Add(uint64(id)))
		if err == nil {
			h.live = append(h.live, id)
		}
	case op < 3: // add shared: a prefix of another sequence's pages
		id := h.newID()
		var pages []allocator.PageID
		ntokens := 0
		if src := h.pickID(); h.tab.Has(src) {
			held := h.tab.Pages(src)
			pages = slices.Clone(held[:h.intn(len(held)+1)])
			if len(pages) > 0 {
				ntokens = (len(pages)-1)*ps + 1 + h.intn(ps)
			}
			switch h.intn(10) {
			case 0:
				ntokens += ps // too many tokens
			case 1:
				if len(pages) > 0 {
					pages = append(pages, pages[0]) // a page twice
				}
			case 2:
				pages = append(pages, allocator.PageID(h.intn(h.alloc.NumPages()+2)-1)) // maybe free
				ntokens = (len(pages)-1)*ps + 1
			}
		}
		err := h.tab.AddShared(id, pages, ntokens)
		h.sameClass("add shared", err, h.model.AddShared(uint64(id), h.modelPages(pages), ntokens))
		if err == nil {
			h.live = append(h.live, id)
		}
	case op < 10: // reserve a batch
		n := 1 + h.intn(4)
		ids := make([]pagetable.SeqID, 0, n)
		counts := make([]int32, 0, n)
		for range n {
			id := h.pickID()
			if slices.Contains(ids, id) && h.intn(8) != 0 {
				continue // duplicates only sometimes
			}
			c := int32(h.intn(2*ps + 1))
			switch h.intn(24) {
			case 0:
				c = int32(h.alloc.NumPages() * ps) // out of pages
			case 1:
				c = -1
			}
			ids, counts = append(ids, id), append(counts, c)
		}
		before := maps(h.toModel)
		prefix := len(h.ops)
		h.ops = append(h.ops[:0], pagetable.CopyOp{Src: -5, Dst: -5, Entries: -5})[:1]
		prefix = 1
		var err error
		h.ops, err = h.tab.Reserve(h.ops, ids, counts)
		mids := make([]uint64, len(ids))
		for i, id := range ids {
			mids[i] = uint64(id)
		}
		mops, merr := h.model.Reserve(mids, counts)
		h.sameClass(fmt.Sprintf("reserve %v %v", ids, counts), err, merr)
		require.Equal(h.t, pagetable.CopyOp{Src: -5, Dst: -5, Entries: -5}, h.ops[0], "op %d: Reserve overwrote dst", h.nops)
		if err != nil {
			require.Len(h.t, h.ops, prefix, "op %d: failed Reserve appended copy ops", h.nops)
			break
		}
		h.check()
		got := h.ops[prefix:]
		h.seen["copy-on-write"] += len(got)
		require.Len(h.t, got, len(mops), "op %d: copy ops %v, model %v", h.nops, got, mops)
		for i, o := range got {
			require.Equal(h.t, mops[i].Entries, o.Entries, "op %d: copy op %d entries", h.nops, i)
			require.Equal(h.t, mops[i].Src, before[o.Src], "op %d: copy op %d source (real %d)", h.nops, i, o.Src)
			require.Equal(h.t, mops[i].Dst, h.toModel[o.Dst], "op %d: copy op %d destination (real %d)", h.nops, i, o.Dst)
		}
		// The rows just reserved, as an append step exports them.
		err = h.tab.ExportAppendTo(&h.app, ids, counts)
		mapp, merr := h.model.ExportAppend(mids, counts)
		h.sameClass("export append", err, merr)
		if err == nil {
			requireInt32s(h.t, mapp.AppendIndptr, h.app.AppendIndptr, "op %d: AppendIndptr", h.nops)
			requireInt32s(h.t, mapp.BatchIndices, h.app.BatchIndices, "op %d: BatchIndices", h.nops)
			requireInt32s(h.t, mapp.Positions, h.app.Positions, "op %d: Positions", h.nops)
		}
		return
	case op < 12: // fork
		parent, child := h.pickID(), h.newID()
		err := h.tab.Fork(parent, child)
		h.sameClass("fork", err, h.model.Fork(uint64(parent), uint64(child)))
		if err == nil {
			h.live = append(h.live, child)
		}
	case op < 14: // truncate
		id := h.pickID()
		start, n := h.tab.Start(id), h.tab.Len(id)
		to := start - 1 + h.intn(n-start+3)
		err := h.tab.Truncate(id, to)
		h.sameClass(fmt.Sprintf("truncate %d to %d", id, to), err, h.model.Truncate(uint64(id), to))
	case op < 16: // release (more often when many sequences are live)
		id := h.pickID()
		err := h.tab.Release(id)
		h.sameClass("release", err, h.model.Release(uint64(id)))
		if err == nil {
			h.dropLive(id)
		}
	case op < 17: // sliding window
		id := h.pickID()
		w := h.intn(h.tab.Len(id)+2) - 1
		got, err := h.tab.ReleaseWindow(id, w)
		want, merr := h.model.ReleaseWindow(uint64(id), w)
		h.sameClass("release window", err, merr)
		h.seen["window pages released"] += got
		require.Equal(h.t, want, got, "op %d: pages released by ReleaseWindow(%d, %d)", h.nops, id, w)
	case op < 18: // pin a page from outside the table
		id := h.pickID()
		if pages := h.tab.Pages(id); len(pages) > 0 {
			p := pages[h.intn(len(pages))]
			require.NoError(h.t, h.alloc.Retain(p))
			require.NoError(h.t, h.model.Alloc.Retain(h.toModel[p]))
			h.pins, h.modelPins = append(h.pins, p), append(h.modelPins, h.toModel[p])
		}
	case op < 19: // unpin
		if len(h.pins) > 0 {
			i := h.intn(len(h.pins))
			_, err := h.alloc.Release(h.pins[i])
			require.NoError(h.t, err)
			_, err = h.model.Alloc.Release(h.modelPins[i])
			require.NoError(h.t, err)
			h.pins, h.modelPins = slices.Delete(h.pins, i, i+1), slices.Delete(h.modelPins, i, i+1)
		}
	default: // export a random subset (with repeats and unknown IDs)
		ids := make([]pagetable.SeqID, h.intn(5))
		for i := range ids {
			ids[i] = h.pickID()
		}
		err := h.tab.ExportTo(&h.csr, ids)
		mids := make([]uint64, len(ids))
		for i, id := range ids {
			mids[i] = uint64(id)
		}
		want, merr := h.model.Export(mids)
		h.sameClass("export", err, merr)
		if err == nil {
			h.compareCSR(want, h.csr, false)
		}
	}
	h.check()
}

func maps(m map[allocator.PageID]int32) map[allocator.PageID]int32 {
	c := make(map[allocator.PageID]int32, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// compareCSR compares an exported CSR with the model's. With rebuild, it
// also rebuilds the page renaming from it; otherwise pages must follow the
// current renaming.
func (h *harness) compareCSR(want reference.CSRModel, got pagetable.CSR, rebuild bool) {
	h.t.Helper()
	requireInt32s(h.t, want.KVIndptr, got.KVIndptr, "op %d: KVIndptr", h.nops)
	requireInt32s(h.t, want.KVLastPageLen, got.KVLastPageLen, "op %d: KVLastPageLen", h.nops)
	requireInt32s(h.t, want.SeqLens, got.SeqLens, "op %d: SeqLens", h.nops)
	require.Len(h.t, got.KVPageIndices, len(want.KVPageIndices), "op %d: KVPageIndices", h.nops)
	toReal := map[int32]allocator.PageID{}
	if !rebuild {
		for r, m := range h.toModel {
			toReal[m] = r
		}
	}
	for k, r := range got.KVPageIndices {
		h.pair(allocator.PageID(r), want.KVPageIndices[k], toReal, "kv_page_indices", k)
	}
}

// pair records that real page r is model page m, and fails if either is
// already paired with another page. where[i] names the place. (No t.Helper
// or testify here: this runs for every held page after every operation.)
func (h *harness) pair(r allocator.PageID, m int32, toReal map[int32]allocator.PageID, where string, i int) {
	if old, ok := h.toModel[r]; ok && old != m {
		h.t.Fatalf("op %d: %s[%d]: real page %d is model page %d here but %d elsewhere", h.nops, where, i, r, m, old)
	}
	if old, ok := toReal[m]; ok && old != r {
		h.t.Fatalf("op %d: %s[%d]: model page %d is real page %d here but %d elsewhere (one page owned twice?)", h.nops, where, i, m, r, old)
	}
	h.toModel[r], toReal[m] = m, r
}

// check compares the whole state: the CSR of every live sequence, the page
// renaming, every reference count, the pool's counters, and both types'
// invariants.
func (h *harness) check() {
	h.t.Helper()
	require.Equal(h.t, len(h.model.Seqs), h.tab.NumSeqs(), "op %d: sequences", h.nops)
	mids := make([]uint64, len(h.live))
	for i, id := range h.live {
		mids[i] = uint64(id)
		ms := h.model.Seqs[uint64(id)]
		if ms == nil || ms.Len != h.tab.Len(id) || ms.Start != h.tab.Start(id) {
			h.t.Fatalf("op %d: sequence %d: model %+v, table Len %d Start %d", h.nops, id, ms, h.tab.Len(id), h.tab.Start(id))
		}
	}
	require.NoError(h.t, h.tab.ExportTo(&h.csr, h.live))
	want, err := h.model.Export(mids)
	require.NoError(h.t, err)
	clear(h.toModel)
	h.compareCSR(want, h.csr, true)
	toReal := map[int32]allocator.PageID{}
	for r, m := range h.toModel {
		toReal[m] = r
	}
	for i, p := range h.pins {
		h.pair(p, h.modelPins[i], toReal, "pins", i)
	}
	// No leak: every page in use is held by a sequence or a pin.
	st := h.alloc.Stats()
	require.Equal(h.t, len(h.toModel), st.InUse, "op %d: pages in use vs pages held (leak?)", h.nops)
	require.Equal(h.t, allocator.Stats{
		Total: h.model.Alloc.NumPages, Free: h.model.Alloc.NumFree(),
		InUse: h.model.Alloc.NumPages - h.model.Alloc.NumFree(), Shared: h.model.Alloc.NumShared(),
	}, st, "op %d: stats", h.nops)
	// Reference counts equal holders.
	holders := map[allocator.PageID]int32{}
	for _, p := range h.csr.KVPageIndices {
		holders[allocator.PageID(p)]++
	}
	for _, p := range h.pins {
		holders[p]++
	}
	for r, m := range h.toModel {
		if rc := h.alloc.RefCount(r); rc != holders[r] || rc != int32(h.model.Alloc.RefCount(m)) {
			h.t.Fatalf("op %d: page %d has refcount %d, %d holders; model page %d has refcount %d",
				h.nops, r, rc, holders[r], m, h.model.Alloc.RefCount(m))
		}
	}
	require.NoError(h.t, h.tab.CheckInvariants(), "op %d", h.nops)
	require.NoError(h.t, h.alloc.CheckInvariants(), "op %d", h.nops)
	require.NoError(h.t, pagetable.ValidateCSR(h.csr.KVIndptr, h.csr.KVPageIndices, h.csr.KVLastPageLen, h.tab.PageSize(), h.alloc.NumPages()),
		"op %d: exported CSR", h.nops)
}

// requireInt32s compares int32 arrays and prints both in full with the first
// difference.
func requireInt32s(t testing.TB, want, got []int32, msg string, args ...any) {
	t.Helper()
	if slices.Equal(want, got) {
		return
	}
	i := 0
	for i < len(want) && i < len(got) && want[i] == got[i] {
		i++
	}
	t.Fatalf("%s: first difference at index %d\nwant %v\ngot  %v", fmt.Sprintf(msg, args...), i, want, got)
}
