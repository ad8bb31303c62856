package kernelstest

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// The hostile-index harness: every paged operation of a backend (append,
// MLA append, decode, prefill, MLA decode) is run on index arrays exactly as
// a hostile caller passes them - any lengths, any int32 values including
// MinInt32 and MaxInt32, decreasing or wrapping indptrs - over a small cache
// whose every byte is a known canary pattern, with guard bytes before and
// after every buffer the backend may write. The property:
//
//   - the call returns an error and no byte of any buffer (cache, o, lse,
//     guards) changed; or
//   - it succeeds, the guards are intact, and the only cache bytes that
//     changed are the slots the table names for the rows appended (decode,
//     prefill and MLA decode write no cache byte at all).
//
// The expected slots are computed here in int64 from the raw arrays, not by
// the validator under test.

// RawIndices are the index arrays of one hostile call set. Nil and empty
// slices are passed as they are.
type RawIndices struct {
	KVIndptr, KVPageIndices, KVLastPageLen []int32
	QOIndptr                               []int32
	BatchIndices, Positions                []int32
	KVLen                                  []int32 // MLA decode
	// MLANoLastPageLen passes a nil kv_last_page_len to the MLA append
	// (it is optional there).
	MLANoLastPageLen bool
}

// RawGeometry is the small cache the raw arrays index.
type RawGeometry struct {
	Layout     layout.KVLayout
	Form       layout.TensorForm
	DType      layout.DType // f32, f16 or bf16
	NumPages   int          // 0..8
	PageSize   int          // 1..
	NumKVHeads int
	Group      int // query heads per kv head
	HeadDim    int
	// MLA head dims (the MLA cache has the same pages and page size).
	HeadDimCKV, HeadDimKPE int
}

func (g RawGeometry) paged() layout.Paged {
	return layout.Paged{Layout: g.Layout, Form: g.Form, DType: g.DType, NumPages: g.NumPages,
		PageSize: g.PageSize, NumKVHeads: g.NumKVHeads, HeadDim: g.HeadDim}
}

func (g RawGeometry) mla() layout.MLA {
	return layout.MLA{Form: g.Form, DType: g.DType, NumPages: g.NumPages, PageSize: g.PageSize,
		HeadDimCKV: g.HeadDimCKV, HeadDimKPE: g.HeadDimKPE}
}

// guard is the number of canary bytes before and after every buffer.
const guard = 64

// guarded is a buffer of n bytes inside a larger one whose guard bytes
// before and after must never change.
type guarded struct {
	all  []byte
	snap []byte
}

func newGuarded(n int, seed byte) *guarded {
	g := &guarded{all: make([]byte, n+2*guard)}
	for i := range g.all {
		g.all[i] = byte(i*131) ^ seed ^ 0xA5
	}
	g.snap = bytes.Clone(g.all)
	return g
}

// buf is the usable part, with its capacity clipped so an append cannot
// reach the guard.
func (g *guarded) buf() []byte {
	n := len(g.all) - 2*guard
	return g.all[guard : guard+n : guard+n]
}

// check reports the first changed byte outside the bytes written[i] marks
// (written may be nil: nothing may change).
func (g *guarded) check(what string, written []bool) error {
	n := len(g.all) - 2*guard
	for i := range g.all {
		if g.all[i] == g.snap[i] {
			continue
		}
		switch {
		case i < guard:
			return fmt.Errorf("%s: guard byte %d before the buffer changed", what, guard-i)
		case i >= guard+n:
			return fmt.Errorf("%s: guard byte %d after the buffer changed", what, i-guard-n)
		case written == nil || !written[i-guard]:
			return fmt.Errorf("%s: byte %d changed but no row of the table names it", what, i-guard)
		}
	}
	return nil
}

func (g *guarded) guardsOnly(what string) error {
	n := len(g.all) - 2*guard
	if !bytes.Equal(g.all[:guard], g.snap[:guard]) || !bytes.Equal(g.all[guard+n:], g.snap[guard+n:]) {
		return fmt.Errorf("%s: guard bytes changed", what)
	}
	return nil
}

// CheckRawIndices runs every paged operation of b on ix over a canary-filled
// cache of geometry g and returns the first violation of the property above
// (nil when every call kept it). A backend that panics takes the caller
// down, which a fuzzer reports.
func CheckRawIndices(b kernels.Backend, g RawGeometry, ix RawIndices) error {
	for _, run := range []func(kernels.Backend, RawGeometry, RawIndices) error{
		rawAppend, rawDecode, rawPrefill, rawMLADecode, rawMLAAppend,
	} {
		if err := run(b, g, ix); err != nil {
			return err
		}
	}
	return nil
}

// pagedCache is a canary-filled paged cache with guarded buffers.
type pagedCache struct {
	c    kernels.PagedKVCache
	k, v *guarded // v == k for Fused
}

func newPagedCache(g layout.Paged) (*pagedCache, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	n := int(g.TensorElements()) * g.DType.Size()
	pc := &pagedCache{c: kernels.PagedKVCache{Geometry: g}}
	pc.k = newGuarded(n, 1)
	if g.Form == layout.Fused {
		pc.v = pc.k
		pc.c.Data = pc.k.buf()
	} else {
		pc.v = newGuarded(n, 2)
		pc.c.K, pc.c.V = pc.k.buf(), pc.v.buf()
	}
	return pc, nil
}

func (pc *pagedCache) check(what string, wk, wv []bool) error {
	return checkPair(what, pc.c.Geometry.Form == layout.Fused, pc.k, pc.v, wk, wv, "k cache", "v cache", "fused cache")
}

// checkPair checks a cache's two guarded buffers a and b (one buffer, a ==
// b, when fused): wa and wb mark the bytes a call may have written (nil:
// none). aName, bName and fusedName name the buffers in messages.
func checkPair(what string, fused bool, a, b *guarded, wa, wb []bool, aName, bName, fusedName string) error {
	if fused {
		if wa != nil && wb != nil {
			for i := range wa {
				wa[i] = wa[i] || wb[i]
			}
		}
		return a.check(what+": "+fusedName, wa)
	}
	if err := a.check(what+": "+aName, wa); err != nil {
		return err
	}
	return b.check(what+": "+bName, wb)
}

func randomRows(dt layout.DType, seed byte, shape ...int) kernels.Tensor {
	t := kernels.NewTensor(dt, shape...)
	vals := make([]float32, t.NumElements())
	for i := range vals {
		vals[i] = float32(int(byte(i*7)^seed)%17-8) / 8
	}
	layout.StoreRowF32(t.Data, dt, vals)
	return t
}

// outputs are a guarded o tensor and a guarded lse.
type outputs struct {
	o       *guarded
	ot      kernels.Tensor
	lseAllF []float32 // lsev with guardF values either side
	lseSnap []uint32
	lsev    []float32
}

const guardF = 16

func newOutputs(dt layout.DType, rows, heads, d int) outputs {
	var out outputs
	out.o = newGuarded(rows*heads*d*dt.Size(), 3)
	out.ot = kernels.Tensor{DType: dt, Shape: []int{rows, heads, d}, Data: out.o.buf()}
	n := rows * heads
	all := make([]float32, n+2*guardF)
	out.lseSnap = make([]uint32, len(all))
	for i := range all {
		all[i] = math.Float32frombits(uint32(i)*2654435761 | 1)
		out.lseSnap[i] = math.Float32bits(all[i])
	}
	out.lsev = all[guardF : guardF+n : guardF+n]
	out.lseAllF = all
	return out
}

// after checks an attention call that wrote out and read cache: the cache
// untouched, o and lse written only where the call succeeded. what names
// the call in messages, with callErr when it failed.
func (out *outputs) after(what string, callErr error, cache interface {
	check(what string, wk, wv []bool) error
}) error {
	if callErr != nil {
		what = fmt.Sprintf("%s failed (%v)", what, callErr)
	}
	if err := cache.check(what, nil, nil); err != nil {
		return err
	}
	return out.check(what, callErr != nil)
}

func (out *outputs) check(what string, failed bool) error {
	if failed {
		if err := out.o.check(what+": o", nil); err != nil {
			return err
		}
	} else if err := out.o.guardsOnly(what + ": o"); err != nil {
		return err
	}
	n := len(out.lsev)
	for i, x := range out.lseAllF {
		inside := i >= guardF && i < guardF+n
		if math.Float32bits(x) != out.lseSnap[i] && (failed || !inside) {
			return fmt.Errorf("%s: lse value %d (guard %d either side) changed", what, i, guardF)
		}
	}
	return nil
}

func rows(indptr []int32) int { return max(len(indptr)-1, 0) }

// clampRows is a row count taken from a raw value: in [0, 64].
func clampRows(x int32) int { return int(min(max(x, 0), 64)) }

func rawAppend(b kernels.Backend, g RawGeometry, ix RawIndices) error {
	pg := g.paged()
	pc, err := newPagedCache(pg)
	if err != nil {
		return nil // the geometry itself is invalid: nothing to call
	}
	nnz := len(ix.BatchIndices)
	p := kernels.AppendParams{
		AppendKey:    randomRows(g.DType, 5, nnz, g.NumKVHeads, g.HeadDim),
		AppendValue:  randomRows(g.DType, 6, nnz, g.NumKVHeads, g.HeadDim),
		BatchIndices: ix.BatchIndices, Positions: ix.Positions, Cache: pc.c,
		Table: kernels.PageTable{KVIndptr: ix.KVIndptr, KVPageIndices: ix.KVPageIndices, KVLastPageLen: ix.KVLastPageLen},
	}
	callErr := b.AppendPagedKVCache(&p)
	if callErr != nil {
		return pc.check(fmt.Sprintf("append failed (%v)", callErr), nil, nil)
	}
	// Success: every row must name a slot of the pool; mark those bytes.
	n := int(pg.TensorElements()) * pg.DType.Size()
	wk, wv := make([]bool, n), make([]bool, n)
	es := int64(pg.DType.Size())
	for i, bi := range ix.BatchIndices {
		page, entry, ok := rawSlot(ix.KVIndptr, ix.KVPageIndices, ix.KVLastPageLen, bi, ix.Positions[i], g.PageSize, g.NumPages)
		if !ok {
			return fmt.Errorf("append accepted row %d (batch %d, position %d) that names no slot of the pool", i, bi, ix.Positions[i])
		}
		for h := 0; h < g.NumKVHeads; h++ {
			ko, vo := pg.KOffset(page, entry, h, 0)*es, pg.VOffset(page, entry, h, 0)*es
			for j := int64(0); j < int64(g.HeadDim)*es; j++ {
				wk[ko+j], wv[vo+j] = true, true
			}
		}
	}
	if pg.Form == layout.Fused {
		// Both views index the one buffer.
		for i := range wk {
			wk[i] = wk[i] || wv[i]
		}
		return pc.k.check("append", wk)
	}
	return pc.check("append", wk, wv)
}

// rawSlot is the (page, entry) row i of an append names, computed in int64
// from the raw arrays, and whether it lies in the table and the pool and
// below the request's seq_len ((pages-1)*page_size + last_page_len; with
// last nil, as MLA append allows, every page counts as full).
func rawSlot(indptr, indices, last []int32, b, pos int32, pageSize, numPages int) (page, entry int, ok bool) {
	if b < 0 || int64(b)+1 >= int64(len(indptr)) || pos < 0 {
		return 0, 0, false
	}
	lo, hi := int64(indptr[b]), int64(indptr[b+1])
	i := lo + int64(pos)/int64(pageSize)
	if lo < 0 || i >= hi || i >= int64(len(indices)) {
		return 0, 0, false
	}
	seqLen := (hi - lo) * int64(pageSize)
	if last != nil {
		if int64(b) >= int64(len(last)) {
			return 0, 0, false
		}
		seqLen = (hi-lo-1)*int64(pageSize) + int64(last[b])
	}
	if int64(pos) >= seqLen {
		return 0, 0, false
	}
	pid := int64(indices[i])
	if pid < 0 || pid >= int64(numPages) {
		return 0, 0, false
	}
	return int(pid), int(int64(pos) % int64(pageSize)), true
}

func rawDecode(b kernels.Backend, g RawGeometry, ix RawIndices) error {
	pc, err := newPagedCache(g.paged())
	if err != nil {
		return nil
	}
	B, hq := rows(ix.KVIndptr), g.NumKVHeads*g.Group
	out := newOutputs(g.DType, B, hq, g.HeadDim)
	p := kernels.DecodeParams{
		Q: randomRows(g.DType, 7, B, hq, g.HeadDim), Cache: pc.c,
		Table:           kernels.PageTable{KVIndptr: ix.KVIndptr, KVPageIndices: ix.KVPageIndices, KVLastPageLen: ix.KVLastPageLen},
		AttentionParams: kernels.AttentionParams{NumQOHeads: hq, WindowLeft: -1},
		O:               out.ot, LSE: out.lsev,
	}
	return out.after("decode", b.BatchDecode(&p), pc)
}

func rawPrefill(b kernels.Backend, g RawGeometry, ix RawIndices) error {
	pc, err := newPagedCache(g.paged())
	if err != nil {
		return nil
	}
	nnz := 0
	if len(ix.QOIndptr) > 0 {
		nnz = clampRows(ix.QOIndptr[len(ix.QOIndptr)-1])
	}
	hq := g.NumKVHeads * g.Group
	out := newOutputs(g.DType, nnz, hq, g.HeadDim)
	p := kernels.PrefillParams{
		Q: randomRows(g.DType, 8, nnz, hq, g.HeadDim), QOIndptr: ix.QOIndptr, Cache: pc.c,
		Table:           kernels.PageTable{KVIndptr: ix.KVIndptr, KVPageIndices: ix.KVPageIndices, KVLastPageLen: ix.KVLastPageLen},
		Causal:          len(ix.QOIndptr)%2 == 0,
		AttentionParams: kernels.AttentionParams{NumQOHeads: hq, WindowLeft: -1},
		O:               out.ot, LSE: out.lsev,
	}
	return out.after("prefill", b.BatchPrefill(&p), pc)
}

// mlaCache is a canary-filled MLA cache with guarded buffers.
type mlaCacheG struct {
	c        kernels.MLACache
	ckv, kpe *guarded
}

func newMLACacheG(g layout.MLA) (*mlaCacheG, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	mc := &mlaCacheG{c: kernels.MLACache{Geometry: g}}
	es := g.DType.Size()
	mc.ckv = newGuarded(int(g.CKVElements())*es, 9)
	if g.Form == layout.Fused {
		mc.kpe = mc.ckv
		mc.c.Data = mc.ckv.buf()
		return mc, nil
	}
	mc.kpe = newGuarded(int(g.KPEElements())*es, 10)
	mc.c.CKV, mc.c.KPE = mc.ckv.buf(), mc.kpe.buf()
	return mc, nil
}

func (mc *mlaCacheG) check(what string, wc, wk []bool) error {
	return checkPair(what, mc.c.Geometry.Form == layout.Fused, mc.ckv, mc.kpe, wc, wk, "ckv", "kpe", "fused mla cache")
}

func rawMLADecode(b kernels.Backend, g RawGeometry, ix RawIndices) error {
	mc, err := newMLACacheG(g.mla())
	if err != nil {
		return nil
	}
	B, h := rows(ix.KVIndptr), g.Group
	out := newOutputs(g.DType, B, h, g.HeadDimCKV)
	p := kernels.MLADecodeParams{
		QNope: randomRows(g.DType, 11, B, h, g.HeadDimCKV), QPE: randomRows(g.DType, 12, B, h, g.HeadDimKPE),
		Cache: mc.c, KVIndptr: ix.KVIndptr, KVPageIndices: ix.KVPageIndices, KVLen: ix.KVLen,
		NumHeads: h, SMScale: 0.5, O: out.ot, LSE: out.lsev,
	}
	return out.after("mla decode", b.MLADecode(&p), mc)
}

func rawMLAAppend(b kernels.Backend, g RawGeometry, ix RawIndices) error {
	mg := g.mla()
	mc, err := newMLACacheG(mg)
	if err != nil {
		return nil
	}
	nnz := len(ix.BatchIndices)
	last := ix.KVLastPageLen
	if ix.MLANoLastPageLen {
		last = nil
	}
	p := kernels.MLAAppendParams{
		AppendCKV: randomRows(g.DType, 13, nnz, g.HeadDimCKV), AppendKPE: randomRows(g.DType, 14, nnz, g.HeadDimKPE),
		BatchIndices: ix.BatchIndices, Positions: ix.Positions, Cache: mc.c,
		KVIndptr: ix.KVIndptr, KVPageIndices: ix.KVPageIndices, KVLastPageLen: last,
	}
	callErr := b.AppendPagedMLAKVCache(&p)
	if callErr != nil {
		return mc.check(fmt.Sprintf("mla append failed (%v)", callErr), nil, nil)
	}
	es := int64(mg.DType.Size())
	wc, wk := make([]bool, len(mc.ckv.all)-2*guard), make([]bool, len(mc.kpe.all)-2*guard)
	for i, bi := range ix.BatchIndices {
		page, entry, ok := rawSlot(ix.KVIndptr, ix.KVPageIndices, last, bi, ix.Positions[i], g.PageSize, g.NumPages)
		if !ok {
			return fmt.Errorf("mla append accepted row %d (batch %d, position %d) that names no slot of the pool", i, bi, ix.Positions[i])
		}
		co, ko := mg.CKVOffset(page, entry, 0)*es, mg.KPEOffset(page, entry, 0)*es
		for j := int64(0); j < int64(g.HeadDimCKV)*es; j++ {
			wc[co+j] = true
		}
		for j := int64(0); j < int64(g.HeadDimKPE)*es; j++ {
			wk[ko+j] = true
		}
	}
	return mc.check("mla append", wc, wk)
}

// HostileTables are crafted page tables a serving engine must never let
// reach a kernel: wrapping and decreasing indptrs, int32 extremes in every
// array. Each is invalid for a pool of 4 pages of 4 tokens.
func HostileTables() []RawIndices {
	const maxI, minI = math.MaxInt32, math.MinInt32
	ten := []int32{0, 1, 2, 3, 0, 1, 2, 3, 0, 1}
	return []RawIndices{
		// Found in the audit: MaxInt32 - (-5) wraps positive in int32.
		{KVIndptr: []int32{0, maxI, -5}, KVPageIndices: []int32{0, 1, 2}, KVLastPageLen: []int32{1, 1}},
		{KVIndptr: []int32{0, maxI, -5, 10}, KVPageIndices: ten, KVLastPageLen: []int32{1, 1, 1},
			BatchIndices: []int32{2}, Positions: []int32{20}, QOIndptr: []int32{0, 1, 2, 3}, KVLen: []int32{1, 1, 1}},
		{KVIndptr: []int32{0, minI, 2}, KVPageIndices: ten, KVLastPageLen: []int32{1, 1}, BatchIndices: []int32{1}, Positions: []int32{0}},
		{KVIndptr: []int32{0, 3, 1, 4}, KVPageIndices: ten, KVLastPageLen: []int32{4, 4, 4}, BatchIndices: []int32{1}, Positions: []int32{0}},
		{KVIndptr: []int32{0, maxI}, KVPageIndices: ten, KVLastPageLen: []int32{1}, BatchIndices: []int32{0}, Positions: []int32{maxI}, KVLen: []int32{maxI}},
		{KVIndptr: []int32{minI, 0}, KVPageIndices: ten, KVLastPageLen: []int32{1}},
		{KVIndptr: []int32{0, 2}, KVPageIndices: []int32{maxI, minI}, KVLastPageLen: []int32{1}, BatchIndices: []int32{0}, Positions: []int32{0}, KVLen: []int32{1}},
		{KVIndptr: []int32{0, 2}, KVPageIndices: []int32{0, 1}, KVLastPageLen: []int32{maxI}, BatchIndices: []int32{0}, Positions: []int32{4}},
		{KVIndptr: []int32{0, 2}, KVPageIndices: []int32{0, 1}, KVLastPageLen: []int32{minI}, BatchIndices: []int32{0}, Positions: []int32{1}, KVLen: []int32{minI}},
		{KVIndptr: []int32{0, 2}, KVPageIndices: []int32{0, 1}, KVLastPageLen: []int32{2}, BatchIndices: []int32{maxI}, Positions: []int32{0}, KVLen: []int32{9}},
		{KVIndptr: []int32{0, 2}, KVPageIndices: []int32{0, 1}, KVLastPageLen: []int32{2}, BatchIndices: []int32{minI}, Positions: []int32{minI},
			QOIndptr: []int32{0, minI}, KVLen: []int32{maxI}},
		{KVIndptr: []int32{0, 2}, KVPageIndices: []int32{0, 1}, KVLastPageLen: []int32{2}, QOIndptr: []int32{0, maxI}, KVLen: []int32{-1}},
		{KVIndptr: []int32{0, 2}, KVPageIndices: []int32{0, 1}, KVLastPageLen: []int32{2}, BatchIndices: []int32{0}, Positions: []int32{8},
			KVLen: []int32{9}, MLANoLastPageLen: true},
	}
}

// TestHostileIndices runs every paged operation of b (with its workers, if
// any) on [HostileTables]: each call must fail with a kernels sentinel and
// leave every byte as it was. The canaries of [CheckRawIndices] hold too.
func TestHostileIndices(t *testing.T, b kernels.Backend) {
	g := RawGeometry{Layout: layout.NHD, Form: layout.Fused, DType: layout.F32, NumPages: 4, PageSize: 4,
		NumKVHeads: 2, Group: 2, HeadDim: 8, HeadDimCKV: 8, HeadDimKPE: 4}
	// FlashInfer's MLA head dims in bf16 too: the shape a device backend
	// may run on other kernels (tensor cores) than the small one.
	mla := g
	mla.DType, mla.HeadDimCKV, mla.HeadDimKPE = layout.BF16, 512, 64
	sentinels := []error{kernels.ErrInvalidPageTable, kernels.ErrIndexOutOfRange, kernels.ErrInvalidAttention, kernels.ErrInvalidTensor}
	for i, ix := range HostileTables() {
		for _, form := range []layout.TensorForm{layout.Fused, layout.Split} {
			g.Form, mla.Form = form, form
			t.Run(fmt.Sprintf("table%d/%v", i, form), func(t *testing.T) {
				if err := CheckRawIndices(b, g, ix); err != nil {
					t.Fatal(err)
				}
				if err := rawMLADecode(b, mla, ix); err != nil {
					t.Fatalf("bf16 512+64: %v", err)
				}
				pc, err := newPagedCache(g.paged())
				if err != nil {
					t.Fatal(err)
				}
				// The audit's cross-request write: must be refused with a sentinel.
				nnz := len(ix.BatchIndices)
				err = b.AppendPagedKVCache(&kernels.AppendParams{
					AppendKey:    randomRows(g.DType, 1, nnz, g.NumKVHeads, g.HeadDim),
					AppendValue:  randomRows(g.DType, 2, nnz, g.NumKVHeads, g.HeadDim),
					BatchIndices: ix.BatchIndices, Positions: ix.Positions, Cache: pc.c,
					Table: kernels.PageTable{KVIndptr: ix.KVIndptr, KVPageIndices: ix.KVPageIndices, KVLastPageLen: ix.KVLastPageLen},
				})
				if nnz > 0 && !isAny(err, sentinels) {
					t.Fatalf("append on hostile table %+v: err = %v, want one of the kernels sentinels", ix, err)
				}
				B := rows(ix.KVIndptr)
				out := newOutputs(g.DType, B, g.NumKVHeads*g.Group, g.HeadDim)
				err = b.BatchDecode(&kernels.DecodeParams{
					Q: randomRows(g.DType, 7, B, g.NumKVHeads*g.Group, g.HeadDim), Cache: pc.c,
					Table:           kernels.PageTable{KVIndptr: ix.KVIndptr, KVPageIndices: ix.KVPageIndices, KVLastPageLen: ix.KVLastPageLen},
					AttentionParams: kernels.AttentionParams{NumQOHeads: g.NumKVHeads * g.Group, WindowLeft: -1},
					O:               out.ot, LSE: out.lsev,
				})
				if !isAny(err, sentinels) && rawTableInvalid(ix, g.PageSize, g.NumPages) {
					t.Fatalf("decode on hostile table %+v: err = %v, want one of the kernels sentinels", ix, err)
				}
			})
		}
	}
}

// rawTableInvalid reports whether the paged table is malformed for the pool,
// computed in int64 without the validator.
func rawTableInvalid(ix RawIndices, pageSize, numPages int) bool {
	p := ix.KVIndptr
	if len(p) == 0 || p[0] != 0 || len(ix.KVLastPageLen) != len(p)-1 {
		return true
	}
	for b := 0; b+1 < len(p); b++ {
		n := int64(p[b+1]) - int64(p[b])
		l := int64(ix.KVLastPageLen[b])
		if n < 0 || (n == 0) != (l == 0) || l < 0 || l > int64(pageSize) {
			return true
		}
	}
	last := int64(p[len(p)-1])
	if last > int64(len(ix.KVPageIndices)) {
		return true
	}
	for _, id := range ix.KVPageIndices[:last] {
		if id < 0 || int64(id) >= int64(numPages) {
			return true
		}
	}
	return false
}

func isAny(err error, targets []error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// rawBytes hands out fuzz input bytes (zeros once exhausted).
type rawBytes []byte

func (r *rawBytes) next() byte {
	if len(*r) == 0 {
		return 0
	}
	x := (*r)[0]
	*r = (*r)[1:]
	return x
}

// int32 decodes one value: mostly small ones (so valid tables are common),
// then the int32 extremes and their neighbours, and any 32-bit pattern.
func (r *rawBytes) int32() int32 {
	switch k := r.next(); {
	case k < 160:
		return int32(k%16) - 2
	case k < 176:
		return math.MaxInt32 - int32(k-160)
	case k < 192:
		return math.MinInt32 + int32(k-176)
	default:
		return int32(uint32(r.next()) | uint32(r.next())<<8 | uint32(r.next())<<16 | uint32(r.next())<<24)
	}
}

func (r *rawBytes) array() []int32 {
	n := int(r.next())
	if n == 255 {
		return nil
	}
	n %= 17
	a := make([]int32, n)
	for i := range a {
		a[i] = r.int32()
	}
	return a
}

// DecodeRaw turns fuzz bytes into a small geometry and raw index arrays of
// any length (0..16, or nil) holding any int32 values.
func DecodeRaw(data []byte) (RawGeometry, RawIndices) {
	r := rawBytes(data)
	f := r.next()
	g := RawGeometry{
		Layout: layout.NHD, Form: layout.Fused,
		DType:      []layout.DType{layout.F32, layout.F16, layout.BF16}[int(f>>2&3)%3],
		NumPages:   int(r.next() % 9),
		PageSize:   1 + int(r.next()%4),
		NumKVHeads: 1 + int(r.next()%2),
		Group:      1 + int(r.next()%2),
		HeadDim:    []int{1, 2, 4, 8, 16}[r.next()%5],
		HeadDimCKV: []int{1, 4, 8, 16}[r.next()%4],
		HeadDimKPE: []int{1, 2, 4}[r.next()%3],
	}
	if f&1 != 0 {
		g.Layout = layout.HND
	}
	if f&2 != 0 {
		g.Form = layout.Split
	}
	ix := RawIndices{MLANoLastPageLen: f&0x80 != 0}
	for _, a := range []*[]int32{&ix.KVIndptr, &ix.KVPageIndices, &ix.KVLastPageLen, &ix.QOIndptr, &ix.BatchIndices, &ix.Positions, &ix.KVLen} {
		*a = r.array()
	}
	return g, ix
}

// EncodeRaw is DecodeRaw's inverse for seeds: small values (-2..13) and
// MinInt32/MaxInt32 map to one byte, anything else to five.
func EncodeRaw(g RawGeometry, ix RawIndices) []byte {
	f := byte(0)
	if g.Layout == layout.HND {
		f |= 1
	}
	if g.Form == layout.Split {
		f |= 2
	}
	switch g.DType {
	case layout.F16:
		f |= 4
	case layout.BF16:
		f |= 8
	}
	if ix.MLANoLastPageLen {
		f |= 0x80
	}
	idx := func(xs []int, v int) byte {
		for i, x := range xs {
			if x == v {
				return byte(i)
			}
		}
		return 0
	}
	out := []byte{f, byte(g.NumPages), byte(g.PageSize - 1), byte(g.NumKVHeads - 1), byte(g.Group - 1),
		idx([]int{1, 2, 4, 8, 16}, g.HeadDim), idx([]int{1, 4, 8, 16}, g.HeadDimCKV), idx([]int{1, 2, 4}, g.HeadDimKPE)}
	for _, a := range [][]int32{ix.KVIndptr, ix.KVPageIndices, ix.KVLastPageLen, ix.QOIndptr, ix.BatchIndices, ix.Positions, ix.KVLen} {
		if a == nil {
			out = append(out, 255)
			continue
		}
		out = append(out, byte(len(a)))
		for _, v := range a {
			switch {
			case v >= -2 && v <= 13:
				out = append(out, byte(v+2))
			case v == math.MaxInt32:
				out = append(out, 160)
			case v == math.MinInt32:
				out = append(out, 176)
			default:
				u := uint32(v)
				out = append(out, 200, byte(u), byte(u>>8), byte(u>>16), byte(u>>24))
			}
		}
	}
	return out
}

// RawSeeds are fuzz seeds: the hostile tables and a few valid batches.
func RawSeeds() [][]byte {
	g := RawGeometry{Layout: layout.NHD, Form: layout.Fused, DType: layout.F32, NumPages: 4, PageSize: 4,
		NumKVHeads: 2, Group: 2, HeadDim: 8, HeadDimCKV: 8, HeadDimKPE: 4}
	var seeds [][]byte
	for _, ix := range HostileTables() {
		seeds = append(seeds, EncodeRaw(g, ix))
	}
	valid := RawIndices{KVIndptr: []int32{0, 2, 2, 4}, KVPageIndices: []int32{3, 0, 2, 1}, KVLastPageLen: []int32{3, 0, 1},
		QOIndptr: []int32{0, 2, 2, 3}, BatchIndices: []int32{0, 0, 2}, Positions: []int32{6, 1, 4}, KVLen: []int32{7, 0, 5}}
	seeds = append(seeds, EncodeRaw(g, valid))
	g.Layout, g.Form, g.DType = layout.HND, layout.Split, layout.BF16
	seeds = append(seeds, EncodeRaw(g, valid))
	return seeds
}
