package fuzz

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/appendkv"
	"github.com/pagedkv/pagedkv/internal/reference"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/pagetable"
)

// appendOps are the commands of FuzzTableAppendGather. Arguments:
//
//	add       a%8 == 0: re-add a live ID (must fail with ErrSeqExists)
//	fork      a: parent (255: unknown)
//	append    a: batch size and members, b%4: count shape (0: 0..1 tokens,
//	          1: fill the last page exactly, 2: 0..2*pageSize, 3: a prefill up
//	          to a page past the whole pool), c>>4 == 8: repeat a member (must fail)
//	truncate  a: sequence, b: new length in [Start, Len], c%16 == 0: Len+1
//	          and c%16 == 1: Start-1 (must fail)
//	release   a: sequence
//	window    a: sequence, b: window tokens in 0..2*pageSize, c%16 == 0: -1
//	export    a: batch of up to 5 IDs with repeats (255 in b: one unknown)
var appendOps = OpSet{"add", "fork", "append", "truncate", "release", "window", "export"}

// maxCmds bounds the commands one input runs, so an exec stays short however
// long the fuzzer grows the input.
const maxCmds = 48

var appendCacheDTypes = []layout.DType{layout.F32, layout.F16, layout.BF16, layout.E4M3, layout.E5M2}

// appendGeom is the header of a FuzzTableAppendGather input.
type appendGeom struct {
	// Bits: bit 0 HND (else NHD), bit 1 split (else fused); bit 2 converts
	// rows into an fp8 cache from bits>>3%3 (f32, f16, bf16) with K/V scales
	// picked by bits>>5.
	Bits                                  uint8
	DType                                 uint8 // appendCacheDTypes[DType%5]
	PageSize, Heads, HeadDim, NumPagesArg uint8 // 1+%16, 1+%3, 1+%6, 1+%24
}

// FuzzTableAppendGather runs a program of page-table commands (add, fork,
// append, truncate, release, sliding-window release, export) on a random
// geometry (NHD/HND, fused/split, f32/f16/bf16/fp8 with or without
// conversion, page size 1..16). Every append reserves pages in a
// pagetable.Table, performs the copy-on-write copies, exports the CSR, plans
// batch_indices/positions with appendkv and runs kernels/cpu's
// AppendPagedKVCache. After every command it checks the table against
// reference.PageTableModel, the allocator's counts against the table's
// holdings, the exported CSR against ValidateCSR and the model, and reads
// every live request back through the CSR with the first-principles formula
// (reference.GatherBytes) to compare with a dense per-request model. Each
// append must also leave every byte outside its rows' slots unchanged and
// write only pages whose reference count is 1.
func FuzzTableAppendGather(f *testing.F) {
	ops := appendOps
	type seed struct {
		g    appendGeom
		prog []byte
	}
	for _, s := range []seed{
		// Empty program, and empty requests: adds and zero-token appends.
		{appendGeom{0, 0, 3, 0, 1, 7}, nil},
		{appendGeom{0, 1, 3, 1, 2, 7}, ops.Prog("add", 1, 0, 0, "add", 1, 0, 0, "append", 1, 0, 0, "export", 3, 0, 0)},
		// last_page_len == page_size: fill the last page exactly, then fork
		// and append to both (no copy: full pages are shared as they are).
		{appendGeom{1, 0, 3, 1, 3, 15}, ops.Prog("add", 1, 0, 0, "append", 0, 1, 0, "fork", 0, 0, 0, "append", 1, 0, 0, "append", 0, 1, 0)},
		// Page size 1, HND split f16.
		{appendGeom{3, 1, 0, 2, 5, 20}, ops.Prog("add", 1, 0, 0, "append", 0, 2, 0, "fork", 0, 0, 0, "append", 1, 3, 0, "truncate", 1, 1, 2, "window", 0, 1, 2)},
		// Full pool: a prefill larger than the pool fails, then fills it.
		{appendGeom{2, 2, 1, 0, 0, 2}, ops.Prog("add", 1, 0, 0, "append", 0, 3, 0, "append", 0, 3, 0, "append", 0, 2, 0, "append", 0, 3, 0)},
		// Window 0 releases every full page; then appends continue.
		{appendGeom{0, 0, 3, 0, 1, 11}, ops.Prog("add", 1, 0, 0, "append", 0, 3, 0, "window", 0, 0, 2, "append", 0, 2, 0, "window", 0, 4, 2)},
		// Copy-on-write of a shared partial page, both holders in one batch.
		{appendGeom{1, 3, 7, 1, 3, 15}, ops.Prog("add", 1, 0, 0, "append", 0, 2, 0, "fork", 0, 0, 0, "fork", 1, 0, 0, "append", 3, 2, 0, "truncate", 2, 3, 2, "append", 2, 0, 0)},
		// fp8 cache fed f16 rows with scales; errors mixed in.
		{appendGeom{0x2c, 3, 4, 1, 4, 9}, ops.Prog("add", 1, 0, 0, "add", 0, 0, 0, "fork", 255, 0, 0, "append", 1, 2, 0x80, "append", 1, 2, 0, "truncate", 0, 0, 0, "window", 0, 0, 0, "release", 0, 0, 0, "export", 4, 255, 0)},
	} {
		f.Add(s.g.Bits, s.g.DType, s.g.PageSize, s.g.Heads, s.g.HeadDim, s.g.NumPagesArg, s.prog)
	}
	backend := cpu.New(cpu.Config{Workers: 1})
	f.Fuzz(func(t *testing.T, bits, dt, pageSize, heads, headDim, numPages uint8, prog []byte) {
		h := newAppendHarness(t, backend, appendGeom{bits, dt, pageSize, heads, headDim, numPages})
		h.prog = Decode(nil, prog, len(appendOps))
		if len(h.prog) > maxCmds {
			h.prog = h.prog[:maxCmds]
		}
		h.verify()
		for h.step = range h.prog {
			h.run(h.prog[h.step])
			h.verify()
		}
	})
}

// tokenRow is one token of a request as the cache stores it: K and V, each
// [H*D] elements of the cache dtype, head-major (reference.TokenBytes).
type tokenRow struct{ k, v []byte }

type appendHarness struct {
	t       *testing.T
	g       layout.Paged
	srcDT   layout.DType // dtype of the appended rows
	kScale  float64
	vScale  float64
	backend kernels.Backend

	alloc *allocator.Allocator
	tab   *pagetable.Table
	model *reference.PageTableModel
	cache kernels.PagedKVCache

	plan   appendkv.Plan
	csr    pagetable.CSR
	acsr   pagetable.AppendCSR
	copies []pagetable.CopyOp

	live   []pagetable.SeqID              // sequences in export order
	rows   map[pagetable.SeqID][]tokenRow // tokens [0, Len) of each sequence
	nextID pagetable.SeqID
	serial uint64 // tokens generated so far; each token's bytes derive from it

	prog []Cmd
	step int

	// seen counts events, so a test can insist that the programs it runs
	// reach the cases they are meant to (see TestTableAppendGatherRandom).
	seen map[string]int
}

func newAppendHarness(t *testing.T, b kernels.Backend, ag appendGeom) *appendHarness {
	g := layout.Paged{
		Layout: layout.KVLayout(ag.Bits & 1), Form: layout.TensorForm(ag.Bits >> 1 & 1),
		DType:    appendCacheDTypes[int(ag.DType)%len(appendCacheDTypes)],
		NumPages: 1 + int(ag.NumPagesArg)%24, PageSize: 1 + int(ag.PageSize)%16,
		NumKVHeads: 1 + int(ag.Heads)%3, HeadDim: 1 + int(ag.HeadDim)%6,
	}
	h := &appendHarness{t: t, g: g, srcDT: g.DType, backend: b, rows: map[pagetable.SeqID][]tokenRow{}, nextID: 1, seen: map[string]int{}}
	if (g.DType == layout.E4M3 || g.DType == layout.E5M2) && ag.Bits&4 != 0 {
		scales := []float64{0, 0.5, 2, 3}
		h.srcDT = []layout.DType{layout.F32, layout.F16, layout.BF16}[int(ag.Bits>>3&3)%3]
		h.kScale, h.vScale = scales[ag.Bits>>5&3], scales[(ag.Bits>>5+1)&3]
	}
	var err error
	h.alloc, err = allocator.New(allocator.Config{NumPages: g.NumPages})
	require.NoError(t, err)
	h.tab, err = pagetable.New(pagetable.Config{PageSize: g.PageSize, Allocator: h.alloc})
	require.NoError(t, err)
	h.model = reference.NewPageTableModel(g.PageSize, g.NumPages)
	h.cache, err = kernels.NewPagedKVCache(g)
	require.NoError(t, err)
	// Start from garbage, not zeros, so a missed write shows.
	fillGarbage(&h.cache, 131, 17)
	return h
}

// fillGarbage sets byte i of c's Data, K and V to i*mul+add, so that a
// missed write shows.
func fillGarbage(c *kernels.PagedKVCache, mul, add int) {
	for _, buf := range [][]byte{c.Data, c.K, c.V} {
		for i := range buf {
			buf[i] = byte(i*mul + add)
		}
	}
}

// where names the current command and the program, for failure messages.
func (h *appendHarness) where() string {
	return fmt.Sprintf("geometry %+v src %v scales %v/%v, command %d of:\n%s",
		h.g, h.srcDT, h.kScale, h.vScale, h.step, appendOps.Format(h.prog))
}

func (h *appendHarness) fatalf(format string, args ...any) {
	h.t.Helper()
	h.t.Fatalf("%s\n%s", fmt.Sprintf(format, args...), h.where())
}

// tableErrors pairs the page table's and allocator's sentinels with the model's.
var tableErrors = []errorPair{
	{allocator.ErrOutOfPages, reference.ErrModelOutOfPages},
	{allocator.ErrBadPage, reference.ErrModelBadPage},
	{pagetable.ErrUnknownSeq, reference.ErrModelUnknownSeq},
	{pagetable.ErrSeqExists, reference.ErrModelSeqExists},
	{pagetable.ErrBadArgument, reference.ErrModelBadArgument},
}

// sameClass fails unless real and model errors are both nil or of the same
// class, and reports whether the operation succeeded.
func (h *appendHarness) sameClass(what string, real, model error) bool {
	h.t.Helper()
	return matchErrors(h.fatalf, h.seen, tableErrors, allocator.ErrOutOfPages, what, real, model)
}

// pick returns the live sequence a selects, or an unknown ID for a == 255
// or an empty table.
func (h *appendHarness) pick(a uint8) pagetable.SeqID {
	return pickLive(h.live, a)
}

func (h *appendHarness) held(id pagetable.SeqID) (start, n int) {
	s := h.model.Seqs[uint64(id)]
	return s.Start, s.Len
}

func (h *appendHarness) run(c Cmd) {
	ps := h.g.PageSize
	r := newChooser(c, h.step)
	switch appendOps[c.Op] {
	case "add":
		id := h.nextID
		if c.A%8 == 0 && len(h.live) > 0 {
			id = h.pick(c.B)
		}
		if h.sameClass("add", h.tab.Add(id), h.model.Add(uint64(id))) {
			h.live = append(h.live, id)
			h.rows[id] = nil
			h.nextID++
		}
	case "fork":
		parent, child := h.pick(c.A), h.nextID
		if h.sameClass("fork", h.tab.Fork(parent, child), h.model.Fork(uint64(parent), uint64(child))) {
			h.live = append(h.live, child)
			h.rows[child] = slices.Clone(h.rows[parent])
			h.nextID++
		}
	case "append":
		h.appendBatch(c, &r)
	case "truncate":
		id := h.pick(c.A)
		n := 0
		if _, ok := h.model.Seqs[uint64(id)]; ok {
			start, length := h.held(id)
			n = start + int(c.B)%(length-start+1)
			switch {
			case c.C%16 == 0:
				n = length + 1
			case c.C%16 == 1 && start > 0:
				n = start - 1
			}
		}
		if h.sameClass("truncate", h.tab.Truncate(id, n), h.model.Truncate(uint64(id), n)) {
			h.rows[id] = h.rows[id][:n]
		}
	case "release":
		id := h.pick(c.A)
		if h.sameClass("release", h.tab.Release(id), h.model.Release(uint64(id))) {
			h.live = slices.DeleteFunc(h.live, func(x pagetable.SeqID) bool { return x == id })
			delete(h.rows, id)
		}
	case "window":
		id := h.pick(c.A)
		w := int(c.B) % (2*ps + 1)
		if c.C%16 == 0 {
			w = -1
		}
		got, err := h.tab.ReleaseWindow(id, w)
		want, merr := h.model.ReleaseWindow(uint64(id), w)
		if h.sameClass("window", err, merr) && got != want {
			h.fatalf("ReleaseWindow(%d, %d) released %d pages, model %d", id, w, got, want)
		}
		if got > 0 {
			h.seen["window pages released"]++
		}
	case "export":
		ids := make([]pagetable.SeqID, int(c.A)%6)
		for i := range ids {
			ids[i] = h.pick(uint8(r.intn(255)))
		}
		if c.B == 255 {
			ids = append(ids, 1<<41)
		}
		h.checkExport(ids)
	}
}

// appendBatch reserves tokens for a batch, performs the copy-on-write
// copies as an engine must, and appends the rows through the plan on the
// backend.
func (h *appendHarness) appendBatch(c Cmd, r *chooser) {
	ps := h.g.PageSize
	n := 1 + int(c.A)%4
	ids := make([]pagetable.SeqID, 0, n+1)
	counts := make([]int32, 0, n+1)
	for range n {
		id := h.pick(uint8(r.intn(256)))
		if slices.Contains(ids, id) {
			continue
		}
		k := 0
		if s, ok := h.model.Seqs[uint64(id)]; ok {
			switch c.B % 4 {
			case 0:
				k = r.intn(2)
			case 1:
				k = ps - (s.Len-s.Start)%ps // the last page ends full
			case 2:
				k = r.intn(2*ps + 1)
			case 3:
				k = r.intn((h.g.NumPages+1)*ps + 1) // up to past a full pool
			}
		}
		ids, counts = append(ids, id), append(counts, int32(k))
	}
	if c.C>>4 == 8 {
		ids, counts = append(ids, ids[0]), append(counts, 1)
	}

	var err error
	h.copies, err = h.tab.Reserve(h.copies[:0], ids, counts)
	mids := make([]uint64, len(ids))
	for i, id := range ids {
		mids[i] = uint64(id)
	}
	mcopies, merr := h.model.Reserve(mids, counts)
	if !h.sameClass(fmt.Sprintf("reserve %v %v", ids, counts), err, merr) {
		return
	}

	// Copy-on-write: the same copies as the model (up to page names), each
	// to a fresh page of ours from a page someone else still holds.
	if len(h.copies) != len(mcopies) {
		h.fatalf("reserve %v %v: %d copies %v, model %v", ids, counts, len(h.copies), h.copies, mcopies)
	}
	for i, op := range h.copies {
		switch {
		case op.Entries != mcopies[i].Entries || op.Entries < 1 || int(op.Entries) >= ps:
			h.fatalf("copy %d = %+v, model %+v (entries must be 1..%d)", i, op, mcopies[i], ps-1)
		case h.alloc.RefCount(op.Dst) != 1 || h.alloc.RefCount(op.Src) < 1:
			h.fatalf("copy %d = %+v: refcounts src %d, dst %d (want >= 1 and 1)", i, op, h.alloc.RefCount(op.Src), h.alloc.RefCount(op.Dst))
		}
		h.copyEntries(op)
		h.seen["copy-on-write"]++
	}

	// Plan the step from the exported arrays and check the plan against the
	// export and the model.
	require.NoError(h.t, h.tab.ExportTo(&h.csr, ids), h.where())
	mcsr, err := h.model.Export(mids)
	require.NoError(h.t, err, h.where())
	h.checkCSR(ids, mcsr)
	require.NoError(h.t, h.tab.ExportAppendTo(&h.acsr, ids, counts), h.where())
	macsr, err := h.model.ExportAppend(mids, counts)
	require.NoError(h.t, err, h.where())
	require.NoError(h.t, h.plan.FromAppendCSR(&h.acsr, h.csr.SeqLens), h.where())
	wantBI, wantPos := reference.BatchIndicesPositionsSlow(h.acsr.AppendIndptr, h.csr.SeqLens)
	for name, pair := range map[string][2][]int32{
		"append_indptr vs model":     {h.acsr.AppendIndptr, macsr.AppendIndptr},
		"batch_indices vs model":     {h.acsr.BatchIndices, macsr.BatchIndices},
		"positions vs model":         {h.acsr.Positions, macsr.Positions},
		"plan batch_indices vs csr":  {h.plan.BatchIndices, h.acsr.BatchIndices},
		"plan positions vs csr":      {h.plan.Positions, h.acsr.Positions},
		"plan batch_indices vs slow": {h.plan.BatchIndices, wantBI},
		"plan positions vs slow":     {h.plan.Positions, wantPos},
	} {
		if !slices.Equal(pair[0], pair[1]) {
			h.fatalf("%s: got %v, want %v", name, pair[0], pair[1])
		}
	}

	// The rows, and what the cache must hold for each.
	nnz := h.plan.Nnz()
	H, D := h.g.NumKVHeads, h.g.HeadDim
	key, val := kernels.NewTensor(h.srcDT, nnz, H, D), kernels.NewTensor(h.srcDT, nnz, H, D)
	newRows := make([]tokenRow, nnz)
	for i := range nnz {
		newRows[i] = tokenRow{k: h.fillRow(key.Data, i, h.kScale), v: h.fillRow(val.Data, i, h.vScale)}
	}

	// Every row lands in a page only its request holds.
	for i := range nnz {
		page, _ := reference.TokenSlot(h.csr.KVIndptr, h.csr.KVPageIndices, ps, int(h.plan.BatchIndices[i]), int(h.plan.Positions[i]))
		if rc := h.alloc.RefCount(allocator.PageID(page)); rc != 1 {
			h.fatalf("row %d (request %d, position %d) is written to page %d, which has %d holders",
				i, h.plan.BatchIndices[i], h.plan.Positions[i], page, rc)
		}
	}

	// The whole cache must change exactly as the element-by-element
	// reference append changes a copy of it.
	want := h.cloneCache()
	reference.Append(h.view(&want), reference.AppendInput{
		Key: key.Data, Value: val.Data, SrcDType: h.srcDT,
		BatchIndices: h.plan.BatchIndices, Positions: h.plan.Positions,
		KVIndptr: h.csr.KVIndptr, KVPageIndices: h.csr.KVPageIndices,
		KScale: h.kScale, VScale: h.vScale,
	})
	table := kernels.PageTable{KVIndptr: h.csr.KVIndptr, KVPageIndices: h.csr.KVPageIndices, KVLastPageLen: h.csr.KVLastPageLen}
	err = h.plan.Run(h.backend, appendkv.Input{AppendKey: key, AppendValue: val, Cache: &h.cache, Table: &table, KScale: h.kScale, VScale: h.vScale})
	require.NoError(h.t, err, h.where())
	h.requireCacheEqual(&want)

	for i := range nnz {
		id := ids[h.plan.BatchIndices[i]]
		h.rows[id] = append(h.rows[id], newRows[i])
	}
	h.seen["append"]++
	if nnz == 0 {
		h.seen["append of no rows"]++
	}
	if h.srcDT != h.g.DType && nnz > 0 {
		h.seen["converting append"]++
	}
}

// fillRow writes row i of an [nnz, H, D] tensor of the source dtype with
// fresh values and returns what the cache must store for it: the same bytes
// when dtypes match, else each value divided by scale and rounded
// (saturating) to the cache dtype, computed with the reference's float64
// rounding.
func (h *appendHarness) fillRow(data []byte, i int, scale float64) []byte {
	h.serial++
	r := chooser{x: h.serial * 0x2545f4914f6cdd1d}
	n := h.g.NumKVHeads * h.g.HeadDim
	ss, cs := h.srcDT.Size(), h.g.DType.Size()
	src := data[i*n*ss : (i+1)*n*ss]
	if h.srcDT == h.g.DType {
		for k := range src {
			src[k] = byte(r.next())
		}
		return slices.Clone(src)
	}
	out := make([]byte, n*cs)
	for e := range n {
		// Finite values, some past fp8's range so saturation is exercised.
		v := float32(r.intn(4001)-2000) / float32(int(1)<<r.intn(8))
		layout.StoreF32(h.srcDT, src, e, v)
		x := reference.Float(h.srcDT, src, int64(e))
		out[e] = byte(reference.Encode(h.g.DType, reference.ScaleDown(x, scale), true))
	}
	return out
}

// view is the reference's picture of cache c (sharing its buffers).
func (h *appendHarness) view(c *kernels.PagedKVCache) reference.PagedKV {
	return reference.PagedKV{
		Layout: h.g.Layout, Form: h.g.Form, DType: h.g.DType, NumPages: h.g.NumPages,
		PageSize: h.g.PageSize, NumKVHeads: h.g.NumKVHeads, HeadDim: h.g.HeadDim,
		Data: c.Data, K: c.K, V: c.V,
	}
}

func (h *appendHarness) cloneCache() kernels.PagedKVCache {
	return kernels.PagedKVCache{Geometry: h.g, Data: slices.Clone(h.cache.Data), K: slices.Clone(h.cache.K), V: slices.Clone(h.cache.V)}
}

// copyEntries performs a copy-on-write copy the engine's way: entries
// [0, Entries) of page Src to page Dst, every head, K and V.
func (h *appendHarness) copyEntries(op pagetable.CopyOp) {
	v, es := h.view(&h.cache), int64(h.g.DType.Size())
	for kv := range 2 {
		for e := range int(op.Entries) {
			for hd := range h.g.NumKVHeads {
				for d := range h.g.HeadDim {
					sb, si := v.Locate(reference.Slot{KV: kv, Page: int(op.Src), Entry: e, Head: hd, Feat: d})
					db, di := v.Locate(reference.Slot{KV: kv, Page: int(op.Dst), Entry: e, Head: hd, Feat: d})
					copy(db[di*es:(di+1)*es], sb[si*es:(si+1)*es])
				}
			}
		}
	}
}

// requireCacheEqual fails with the first element that differs, named by
// its slot.
func (h *appendHarness) requireCacheEqual(want *kernels.PagedKVCache) {
	h.t.Helper()
	for _, pair := range [][2][]byte{{h.cache.Data, want.Data}, {h.cache.K, want.K}, {h.cache.V, want.V}} {
		if bytes.Equal(pair[0], pair[1]) {
			continue
		}
		v, es := h.view(&h.cache), int64(h.g.DType.Size())
		for page := range h.g.NumPages {
			for kv := range 2 {
				for e := range h.g.PageSize {
					for hd := range h.g.NumKVHeads {
						for d := range h.g.HeadDim {
							s := reference.Slot{KV: kv, Page: page, Entry: e, Head: hd, Feat: d}
							buf, i := v.Locate(s)
							if &buf[0] != &pair[0][0] {
								continue
							}
							if got, exp := pair[0][i*es:(i+1)*es], pair[1][i*es:(i+1)*es]; !bytes.Equal(got, exp) {
								h.fatalf("after append, %+v holds %x, want %x (page refcount %d)", s, got, exp, h.alloc.RefCount(allocator.PageID(page)))
							}
						}
					}
				}
			}
		}
		h.fatalf("cache buffers differ outside every slot")
	}
}

// checkExport exports ids (repeats allowed) and compares the result with the
// model and with every request's tokens read back through it.
func (h *appendHarness) checkExport(ids []pagetable.SeqID) {
	h.t.Helper()
	mids := make([]uint64, len(ids))
	for i, id := range ids {
		mids[i] = uint64(id)
	}
	err := h.tab.ExportTo(&h.csr, ids)
	want, merr := h.model.Export(mids)
	if !h.sameClass(fmt.Sprintf("export %v", ids), err, merr) {
		return
	}
	h.checkCSR(ids, want)
	v := h.view(&h.cache)
	for b, id := range ids {
		start, length := h.held(id)
		n := int(h.csr.SeqLens[b])
		got := reference.GatherBytes(v, h.csr.KVIndptr, h.csr.KVPageIndices, b, n)
		exp := h.rows[id][start:length]
		for t := range got {
			if !bytes.Equal(got[t].K, exp[t].k) || !bytes.Equal(got[t].V, exp[t].v) {
				page, entry := reference.TokenSlot(h.csr.KVIndptr, h.csr.KVPageIndices, h.g.PageSize, b, t)
				h.fatalf("sequence %d token %d (held position %d, page %d entry %d) reads K %x V %x, want K %x V %x",
					id, start+t, t, page, entry, got[t].K, got[t].V, exp[t].k, exp[t].v)
			}
		}
	}
}

// checkCSR checks h.csr, the export of ids, against the model's export
// want, both CSR validators, get_seq_lens, and each sequence's held length.
func (h *appendHarness) checkCSR(ids []pagetable.SeqID, want reference.CSRModel) {
	h.t.Helper()
	for name, pair := range map[string][2][]int32{
		"kv_indptr":        {h.csr.KVIndptr, want.KVIndptr},
		"kv_last_page_len": {h.csr.KVLastPageLen, want.KVLastPageLen},
		"seq_lens":         {h.csr.SeqLens, want.SeqLens},
	} {
		if !slices.Equal(pair[0], pair[1]) {
			h.fatalf("export %v: %s = %v, model %v", ids, name, pair[0], pair[1])
		}
	}
	ps, np := h.g.PageSize, h.g.NumPages
	if err := pagetable.ValidateCSR(h.csr.KVIndptr, h.csr.KVPageIndices, h.csr.KVLastPageLen, ps, np); err != nil {
		h.fatalf("export %v fails ValidateCSR: %v", ids, err)
	}
	if err := reference.CheckCSRSlow(h.csr.KVIndptr, h.csr.KVPageIndices, h.csr.KVLastPageLen, ps, np); err != nil {
		h.fatalf("export %v fails CheckCSRSlow: %v", ids, err)
	}
	seqLens, err := pagetable.GetSeqLensTo(nil, h.csr.KVIndptr, h.csr.KVLastPageLen, ps)
	require.NoError(h.t, err, h.where())
	if slow := reference.SeqLensSlow(h.csr.KVIndptr, h.csr.KVLastPageLen, ps); !slices.Equal(seqLens, slow) || !slices.Equal(seqLens, h.csr.SeqLens) {
		h.fatalf("export %v: get_seq_lens %v, slow %v, exported seq_lens %v", ids, seqLens, slow, h.csr.SeqLens)
	}
	for b, id := range ids {
		start, length := h.held(id)
		n := reference.SeqLen(h.csr.KVIndptr, h.csr.KVLastPageLen, ps, b)
		switch {
		case h.csr.KVIndptr[b] == h.csr.KVIndptr[b+1]:
			h.seen["request with no pages"]++
		case h.csr.KVLastPageLen[b] == int32(ps):
			h.seen["last_page_len == page_size"]++
		}
		if n != length-start {
			h.fatalf("export %v: request %d (sequence %d) has seq_len %d from kv_last_page_len %d, want %d (Len %d - Start %d)",
				ids, b, id, n, h.csr.KVLastPageLen[b], length-start, length, start)
		}
	}
}

// verify checks every invariant after a command: both packages'
// CheckInvariants, exact reference counts (the table is the only holder
// here), and every live sequence read back through a fresh export.
func (h *appendHarness) verify() {
	h.t.Helper()
	if err := h.alloc.CheckInvariants(); err != nil {
		h.fatalf("allocator: %v", err)
	}
	if err := h.tab.CheckInvariants(); err != nil {
		h.fatalf("page table: %v", err)
	}
	holders := map[allocator.PageID]int32{}
	for _, id := range h.live {
		start, length := h.held(id)
		if h.tab.Len(id) != length || h.tab.Start(id) != start {
			h.fatalf("sequence %d: Len %d Start %d, model %d %d", id, h.tab.Len(id), h.tab.Start(id), length, start)
		}
		for _, p := range h.tab.Pages(id) {
			holders[p]++
		}
	}
	for p := range allocator.PageID(h.g.NumPages) {
		if rc := h.alloc.RefCount(p); rc != holders[p] {
			h.fatalf("page %d has refcount %d but %d holders in the table", p, rc, holders[p])
		}
	}
	if free := h.alloc.NumFree(); free != h.model.Alloc.NumFree() {
		h.fatalf("%d free pages, model %d", free, h.model.Alloc.NumFree())
	}
	h.checkExport(h.live)
}

// TestTableAppendGatherRandom runs random programs through the harness of
// FuzzTableAppendGather, so the plain test run (and -race) covers it beyond
// the seeds, and insists that they reach the cases the target exists for.
func TestTableAppendGatherRandom(t *testing.T) {
	programs := 150
	if testing.Short() {
		programs = 40
	}
	backend := cpu.New(cpu.Config{Workers: 2})
	seen := map[string]int{}
	r := chooser{x: 42}
	for range programs {
		var g [6]uint8
		for i := range g {
			g[i] = uint8(r.next())
		}
		// Small pools and pages half the time, so programs fill them.
		if r.intn(2) == 0 {
			g[2], g[5] = uint8(r.intn(4)), uint8(r.intn(8))
		}
		// Weighted ops: appends, adds and forks grow state worth checking.
		weighted := []string{"add", "add", "fork", "fork", "append", "append", "append", "append", "append",
			"truncate", "release", "window", "export"}
		var prog []byte
		for range maxCmds {
			op := weighted[r.intn(len(weighted))]
			prog = append(prog, appendOps.Prog(op, r.intn(256), r.intn(256), r.intn(256))...)
		}
		h := newAppendHarness(t, backend, appendGeom{g[0], g[1], g[2], g[3], g[4], g[5]})
		h.prog = Decode(nil, prog, len(appendOps))
		h.verify()
		for h.step = range h.prog {
			h.run(h.prog[h.step])
			h.verify()
		}
		for k, v := range h.seen {
			seen[k] += v
		}
	}
	t.Logf("events: %v", seen)
	for _, event := range []string{"append", "append of no rows", "converting append", "copy-on-write", "out of pages",
		"other error", "window pages released", "request with no pages", "last_page_len == page_size"} {
		require.Greater(t, seen[event], 10, "too few %q events for the test to mean much", event)
	}
}
