package kernelstest

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/reference"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// Batch is a random append step: a post-append page table over a pool of
// NumPages pages and, per appended row, its request and position.
type Batch struct {
	NumPages     int
	PageSize     int
	Table        kernels.PageTable
	BatchIndices []int32 // [nnz]
	Positions    []int32 // [nnz]
	SeqLens      []int   // [B] after the append
	AppendLens   []int   // [B]
}

// RandomBatch returns a batch of 1..maxBatch requests, each with 0..3 pages
// of tokens before the append and 0..2 pages appended, on distinct pages of a
// pool with a few spare pages. With shuffle, the rows are not in CSR order.
func RandomBatch(r *rand.Rand, pageSize, maxBatch int, shuffle bool) Batch {
	B := 1 + r.IntN(maxBatch)
	bt := Batch{PageSize: pageSize, SeqLens: make([]int, B), AppendLens: make([]int, B)}
	pages := make([]int, B)
	total := 0
	for b := range B {
		old, add := r.IntN(3*pageSize+1), r.IntN(2*pageSize+1)
		if r.IntN(5) == 0 {
			old, add = 0, 0 // an empty request in the batch
		}
		bt.SeqLens[b], bt.AppendLens[b] = old+add, add
		pages[b] = (old + add + pageSize - 1) / pageSize
		total += pages[b]
	}
	bt.NumPages = total + r.IntN(3)
	ids := r.Perm(bt.NumPages)
	bt.Table.KVIndptr = make([]int32, B+1)
	bt.Table.KVLastPageLen = make([]int32, B)
	for b := range B {
		bt.Table.KVIndptr[b+1] = bt.Table.KVIndptr[b] + int32(pages[b])
		if n := bt.SeqLens[b]; n > 0 {
			bt.Table.KVLastPageLen[b] = int32((n-1)%pageSize + 1)
		}
	}
	for _, id := range ids[:total] {
		bt.Table.KVPageIndices = append(bt.Table.KVPageIndices, int32(id))
	}
	for b := range B {
		for i := range bt.AppendLens[b] {
			bt.BatchIndices = append(bt.BatchIndices, int32(b))
			bt.Positions = append(bt.Positions, int32(bt.SeqLens[b]-bt.AppendLens[b]+i))
		}
	}
	if shuffle {
		r.Shuffle(len(bt.BatchIndices), func(i, j int) {
			bt.BatchIndices[i], bt.BatchIndices[j] = bt.BatchIndices[j], bt.BatchIndices[i]
			bt.Positions[i], bt.Positions[j] = bt.Positions[j], bt.Positions[i]
		})
	}
	return bt
}

// Nnz is the number of appended rows.
func (bt Batch) Nnz() int { return len(bt.BatchIndices) }

// AppendCase is one append configuration of the suite.
type AppendCase struct {
	Layout   layout.KVLayout
	Form     layout.TensorForm
	DType    layout.DType // the cache's
	SrcDType layout.DType // the rows'; differs from DType only for f32/f16/bf16 into fp8
	PageSize int
	Heads    int
	HeadDim  int
	MaxBatch int
	Shuffle  bool
}

func (c AppendCase) String() string {
	s := fmt.Sprintf("%v/%v/%v/N%d/H%d/D%d", c.Layout, c.Form, c.DType, c.PageSize, c.Heads, c.HeadDim)
	if c.SrcDType != c.DType {
		s += "/from-" + c.SrcDType.String()
	}
	return s
}

// randomBytes fills a new buffer of n bytes.
func randomBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// refView is the reference model's view of a host cache (sharing buffers).
func refView(c *kernels.PagedKVCache) reference.PagedKV {
	g := c.Geometry
	return reference.PagedKV{Layout: g.Layout, Form: g.Form, DType: g.DType, NumPages: g.NumPages,
		PageSize: g.PageSize, NumKVHeads: g.NumKVHeads, HeadDim: g.HeadDim, Data: c.Data, K: c.K, V: c.V,
		SF: c.SF, KSF: c.KSF, VSF: c.VSF}
}

// cloneCache deep-copies a host cache.
func cloneCache(c kernels.PagedKVCache) kernels.PagedKVCache {
	c.Data, c.K, c.V = slices.Clone(c.Data), slices.Clone(c.K), slices.Clone(c.V)
	c.SF, c.KSF, c.VSF = slices.Clone(c.SF), slices.Clone(c.KSF), slices.Clone(c.VSF)
	return c
}

// AppendFixture is a ready-to-run append: params on a cache filled with
// random old content, and the reference's expected cache after the append.
type AppendFixture struct {
	Batch  Batch
	Params kernels.AppendParams
	Before kernels.PagedKVCache // a copy of the cache before the append
	Want   kernels.PagedKVCache // the reference's result
}

// NewAppendFixture builds a random append of case c from r.
func NewAppendFixture(r *rand.Rand, c AppendCase) AppendFixture {
	if c.SrcDType == layout.InvalidDType {
		c.SrcDType = c.DType
	}
	bt := RandomBatch(r, c.PageSize, max(c.MaxBatch, 1), c.Shuffle)
	g := layout.Paged{Layout: c.Layout, Form: c.Form, DType: c.DType, NumPages: bt.NumPages,
		PageSize: c.PageSize, NumKVHeads: c.Heads, HeadDim: c.HeadDim}
	cache, err := kernels.NewPagedKVCache(g)
	if err != nil {
		panic(err)
	}
	for _, buf := range [][]byte{cache.Data, cache.K, cache.V, cache.SF, cache.KSF, cache.VSF} {
		copy(buf, randomBytes(r, len(buf))) // old content the append must leave alone
	}
	nnz := bt.Nnz()
	key := kernels.NewTensor(c.SrcDType, nnz, c.Heads, c.HeadDim)
	val := kernels.NewTensor(c.SrcDType, nnz, c.Heads, c.HeadDim)
	copy(key.Data, randomBytes(r, len(key.Data)))
	copy(val.Data, randomBytes(r, len(val.Data)))
	p := kernels.AppendParams{AppendKey: key, AppendValue: val, BatchIndices: bt.BatchIndices, Positions: bt.Positions,
		Cache: cache, Table: bt.Table}
	if c.SrcDType != c.DType {
		scales := []float64{0, 1, 0.5, 3, 1.0 / 256, 1e-3}
		p.KScale, p.VScale = scales[r.IntN(len(scales))], scales[r.IntN(len(scales))]
	}
	want := cloneCache(cache)
	reference.Append(refView(&want), reference.AppendInput{
		Key: key.Data, Value: val.Data, SrcDType: c.SrcDType,
		BatchIndices: bt.BatchIndices, Positions: bt.Positions,
		KVIndptr: bt.Table.KVIndptr, KVPageIndices: bt.Table.KVPageIndices,
		KScale: p.KScale, VScale: p.VScale,
	})
	return AppendFixture{Batch: bt, Params: p, Before: cloneCache(cache), Want: want}
}

// runAppend calls the backend; it reports false (and logs) when the backend
// declines the case with kernels.ErrUnsupported.
func runAppend(t testing.TB, b kernels.Backend, name string, p *kernels.AppendParams) bool {
	t.Helper()
	return ranAppend(t, b, name, b.AppendPagedKVCache(p))
}

// ranAppend reports whether b ran the append named name (err nil): an
// ErrUnsupported is logged and skipped, any other error fails t.
func ranAppend(t testing.TB, b kernels.Backend, name string, err error) bool {
	t.Helper()
	if errors.Is(err, kernels.ErrUnsupported) {
		t.Logf("backend %s does not support %s: %v", b.Name(), name, err)
		return false
	}
	require.NoError(t, err, "backend %s, %s", b.Name(), name)
	return true
}

// CacheDiff describes up to 8 (K/V, page, entry, head) rows where got and
// want differ, with the first differing feature of each; "" when equal.
func CacheDiff(got, want *kernels.PagedKVCache) string {
	g := want.Geometry
	rg, rw := refView(got), refView(want)
	es := int64(g.DType.Size())
	var out []string
	for page := 0; page < g.NumPages; page++ {
		for entry := 0; entry < g.PageSize; entry++ {
			for head := 0; head < g.NumKVHeads; head++ {
				for kv := range 2 {
					for feat := 0; feat < g.HeadDim; feat++ {
						s := reference.Slot{KV: kv, Page: page, Entry: entry, Head: head, Feat: feat}
						gb, gi := rg.Locate(s)
						wb, wi := rw.Locate(s)
						x, y := gb[gi*es:(gi+1)*es], wb[wi*es:(wi+1)*es]
						if string(x) == string(y) || bothNaN(g.DType, x, y) {
							continue
						}
						if len(out) == 8 {
							return strings.Join(append(out, "..."), "\n")
						}
						out = append(out, fmt.Sprintf("%s page %d entry %d head %d feat %d: got %x want %x",
							"KV"[kv:kv+1], page, entry, head, feat, x, y))
						break
					}
				}
			}
		}
	}
	return strings.Join(out, "\n")
}

// bothNaN reports whether x and y are both NaN codes of the fp8 dtype dt.
// Which NaN code an fp8 cache holds for a NaN input is not specified (the
// GPU writes the canonical 0x7F, the CPU backend and the emulator keep the
// input's sign; docs/layout.md, "NaN in an fp8 cache"), so any NaN code
// matches any other.
func bothNaN(dt layout.DType, x, y []byte) bool {
	if len(x) != 1 || len(y) != 1 {
		return false
	}
	switch dt {
	case layout.E4M3:
		return math.IsNaN(float64(layout.E4M3ToF32(x[0]))) && math.IsNaN(float64(layout.E4M3ToF32(y[0])))
	case layout.E5M2:
		return math.IsNaN(float64(layout.E5M2ToF32(x[0]))) && math.IsNaN(float64(layout.E5M2ToF32(y[0])))
	}
	return false
}

// testAppendNaN pins the fp8 NaN rule: a NaN key or value (either sign,
// from every source dtype) is stored as a NaN code of the cache dtype, and
// the finite values beside it exactly.
func testAppendNaN(t *testing.T, b kernels.Backend) {
	negNaN := math.Float32frombits(0xffc00000)
	posNaN := math.Float32frombits(0x7fc00000)
	const D = 16
	row := []float32{posNaN, negNaN, 1, -2, 0.5, -0.25, 0, 3}
	vals := make([]float32, 2*D)
	for i := range vals {
		vals[i] = row[i%len(row)]
	}
	for _, dt := range []layout.DType{layout.E4M3, layout.E5M2} {
		for _, src := range []layout.DType{layout.F32, layout.F16, layout.BF16} {
			name := fmt.Sprintf("nan %v from %v", dt, src)
			g := layout.Paged{Layout: layout.NHD, Form: layout.Split, DType: dt, NumPages: 2, PageSize: 2, NumKVHeads: 1, HeadDim: D}
			cache, err := kernels.NewPagedKVCache(g)
			require.NoError(t, err)
			p := kernels.AppendParams{
				AppendKey: kernels.TensorFromF32(src, vals, 2, 1, D), AppendValue: kernels.TensorFromF32(src, vals, 2, 1, D),
				BatchIndices: []int32{0, 0}, Positions: []int32{0, 1}, Cache: cache, KScale: 1, VScale: 1,
				Table: kernels.PageTable{KVIndptr: []int32{0, 1}, KVPageIndices: []int32{1}, KVLastPageLen: []int32{2}},
			}
			if !runAppend(t, b, name, &p) {
				continue
			}
			got := make([]float32, D)
			for entry := range 2 {
				for kv, gather := range []func([]float32, int, int, int){p.Cache.GatherK, p.Cache.GatherV} {
					gather(got, 1, entry, 0)
					for f, x := range got {
						want := vals[entry*D+f]
						if math.IsNaN(float64(want)) {
							require.True(t, math.IsNaN(float64(x)), "%s: %c entry %d feature %d: NaN in, %v stored", name, "KV"[kv], entry, f, x)
							continue
						}
						require.Equal(t, want, x, "%s: %c entry %d feature %d", name, "KV"[kv], entry, f)
					}
				}
			}
		}
	}
}

// requireCacheEqual fails with a CacheDiff when the caches differ.
func requireCacheEqual(t testing.TB, got, want *kernels.PagedKVCache, msg string) {
	t.Helper()
	if bytes.Equal(got.Data, want.Data) && bytes.Equal(got.K, want.K) && bytes.Equal(got.V, want.V) {
		return
	}
	if d := CacheDiff(got, want); d != "" {
		t.Fatalf("%s: cache differs from the reference:\n%s", msg, d)
	}
}

// ranAppendCase draws case c's fixture from seed and runs its append on b:
// the fixture, the parameters the append ran with, and false when b does
// not support c (logged).
func ranAppendCase(t testing.TB, b kernels.Backend, c AppendCase, seed uint64) (f AppendFixture, p kernels.AppendParams, ok bool) {
	t.Helper()
	f = NewAppendFixture(rand.New(rand.NewPCG(seed, 0x9e3779b9)), c)
	p = f.Params
	ok = runAppend(t, b, c.String(), &p)
	return f, p, ok
}

// CheckAppend runs one random append of case c (from seed) on b and checks
// the whole cache against the reference, that every appended row reads back
// through the page table, and that no other element changed.
func CheckAppend(t testing.TB, b kernels.Backend, c AppendCase, seed uint64) {
	t.Helper()
	f, p, ok := ranAppendCase(t, b, c, seed)
	if !ok {
		return
	}
	requireCacheEqual(t, &p.Cache, &f.Want, fmt.Sprintf("%v seed %d", c, seed))

	// Append then gather returns the appended rows (exact when copying).
	bt, ref := f.Batch, refView(&p.Cache)
	if c.SrcDType == layout.InvalidDType || c.SrcDType == c.DType {
		rowBytes := c.Heads * c.HeadDim * c.DType.Size()
		for b := range bt.SeqLens {
			toks := reference.GatherBytes(ref, bt.Table.KVIndptr, bt.Table.KVPageIndices, b, bt.SeqLens[b])
			for i, rb := range bt.BatchIndices {
				if int(rb) != b {
					continue
				}
				tok := toks[bt.Positions[i]]
				if string(tok.K) != string(p.AppendKey.Data[i*rowBytes:(i+1)*rowBytes]) ||
					string(tok.V) != string(p.AppendValue.Data[i*rowBytes:(i+1)*rowBytes]) {
					t.Fatalf("%v seed %d: row %d (request %d, position %d) does not read back", c, seed, i, b, bt.Positions[i])
				}
			}
		}
	}

	// Untouched entries are unchanged: mark the bytes of every appended
	// slot, then compare every other byte with the cache before the append.
	es := int64(c.DType.Size())
	mask := map[*byte][]byte{}
	for _, buf := range [][]byte{p.Cache.Data, p.Cache.K, p.Cache.V} {
		if len(buf) > 0 {
			mask[&buf[0]] = bytes.Repeat([]byte{1}, len(buf)) // 1: must be unchanged
		}
	}
	for i, rb := range bt.BatchIndices {
		page, entry := reference.TokenSlot(bt.Table.KVIndptr, bt.Table.KVPageIndices, c.PageSize, int(rb), int(bt.Positions[i]))
		for kv := range 2 {
			for h := 0; h < c.Heads; h++ {
				for d := 0; d < c.HeadDim; d++ {
					buf, j := ref.Locate(reference.Slot{KV: kv, Page: page, Entry: entry, Head: h, Feat: d})
					clear(mask[&buf[0]][j*es : (j+1)*es])
				}
			}
		}
	}
	for bi, pair := range [][2][]byte{{p.Cache.Data, f.Before.Data}, {p.Cache.K, f.Before.K}, {p.Cache.V, f.Before.V}} {
		if len(pair[0]) == 0 {
			continue
		}
		m := mask[&pair[0][0]]
		for k := range pair[0] {
			if m[k] == 1 && pair[0][k] != pair[1][k] {
				t.Fatalf("%v seed %d: byte %d of buffer %s, not in any appended slot, changed from %#x to %#x",
					c, seed, k, []string{"Data", "K", "V"}[bi], pair[1][k], pair[0][k])
			}
		}
	}
}

// AppendCases lists the suite's matrix: both layouts, both tensor forms,
// every cache dtype, page sizes 1, 3 and 16, head dims 64 and 128 (and 8
// unless a backend declines it), and the converting f32/f16/bf16 -> fp8
// appends.
func AppendCases() []AppendCase {
	var cs []AppendCase
	dts := []layout.DType{layout.F32, layout.F16, layout.BF16, layout.E4M3, layout.E5M2}
	for _, l := range []layout.KVLayout{layout.NHD, layout.HND} {
		for _, f := range []layout.TensorForm{layout.Fused, layout.Split} {
			for _, dt := range dts {
				for i, n := range []int{1, 3, 16} {
					d := []int{8, 64, 128}[i]
					cs = append(cs, AppendCase{Layout: l, Form: f, DType: dt, SrcDType: dt, PageSize: n, Heads: 1 + i, HeadDim: d, MaxBatch: 4, Shuffle: i == 1})
				}
				if dt == layout.E4M3 || dt == layout.E5M2 {
					for _, src := range []layout.DType{layout.F32, layout.F16, layout.BF16} {
						cs = append(cs, AppendCase{Layout: l, Form: f, DType: dt, SrcDType: src, PageSize: 4, Heads: 2, HeadDim: 64, MaxBatch: 3, Shuffle: true})
					}
				}
			}
		}
	}
	return cs
}

// randomCases runs check on b for every case, with seeds 0, 1 and 2 (only
// 0 with -short), one subtest a case.
func randomCases[C fmt.Stringer](t *testing.T, b kernels.Backend, cases []C, check func(testing.TB, kernels.Backend, C, uint64)) {
	seeds := 3
	if testing.Short() {
		seeds = 1
	}
	for _, c := range cases {
		t.Run(c.String(), func(t *testing.T) {
			for s := range seeds {
				check(t, b, c, uint64(s))
			}
		})
	}
}

// TestAppend is the conformance suite for AppendPagedKVCache.
func TestAppend(t *testing.T, b kernels.Backend) {
	t.Run("worked", func(t *testing.T) { testAppendWorked(t, b) })
	t.Run("nan", func(t *testing.T) { testAppendNaN(t, b) })
	t.Run("random", func(t *testing.T) { randomCases(t, b, AppendCases(), CheckAppend) })
	t.Run("layouts-agree", func(t *testing.T) { testAppendLayoutsAgree(t, b) })
	t.Run("invalid-writes-nothing", func(t *testing.T) { testAppendInvalid(t, b) })
	t.Run("empty", func(t *testing.T) {
		f := NewAppendFixture(rand.New(rand.NewPCG(7, 7)), AppendCase{Layout: layout.NHD, DType: layout.F16, PageSize: 4, Heads: 2, HeadDim: 64, MaxBatch: 2})
		p := f.Params
		p.BatchIndices, p.Positions = nil, nil
		p.AppendKey, p.AppendValue = kernels.NewTensor(layout.F16, 0, 2, 64), kernels.NewTensor(layout.F16, 0, 2, 64)
		if runAppend(t, b, "nnz=0", &p) {
			requireCacheEqual(t, &p.Cache, &f.Before, "nnz=0")
		}
	})
}

// testAppendWorked is flashinfer-semantics §2.3: page_size 2, post-append
// kv_indptr [0,2,4], kv_indices [3,0,2,1], kv_last_page_len [2,2]; rows
// (b, pos) = (0,3), (1,2), (1,3) land in (page 0, entry 1), (page 1, entry 0)
// and (page 1, entry 1).
func testAppendWorked(t *testing.T, b kernels.Backend) {
	for _, l := range []layout.KVLayout{layout.NHD, layout.HND} {
		for _, f := range []layout.TensorForm{layout.Fused, layout.Split} {
			const H, D = 2, 64
			g := layout.Paged{Layout: l, Form: f, DType: layout.F16, NumPages: 4, PageSize: 2, NumKVHeads: H, HeadDim: D}
			cache, err := kernels.NewPagedKVCache(g)
			require.NoError(t, err)
			vals := func(base float32) []float32 {
				v := make([]float32, 3*H*D)
				for i := range v {
					v[i] = base + float32(i/(H*D)) + float32(i%(H*D))/1024
				}
				return v
			}
			p := kernels.AppendParams{
				AppendKey:    kernels.TensorFromF32(layout.F16, vals(10), 3, H, D),
				AppendValue:  kernels.TensorFromF32(layout.F16, vals(20), 3, H, D),
				BatchIndices: []int32{0, 1, 1}, Positions: []int32{3, 2, 3},
				Cache: cache,
				Table: kernels.PageTable{KVIndptr: []int32{0, 2, 4}, KVPageIndices: []int32{3, 0, 2, 1}, KVLastPageLen: []int32{2, 2}},
			}
			if !runAppend(t, b, fmt.Sprintf("worked %v/%v", l, f), &p) {
				continue
			}
			k, v := make([]float32, D), make([]float32, D)
			wantK, wantV := p.AppendKey.F32(), p.AppendValue.F32() // the f16-rounded rows
			for _, want := range []struct{ row, page, entry int }{{0, 0, 1}, {1, 1, 0}, {2, 1, 1}} {
				for h := range H {
					p.Cache.GatherK(k, want.page, want.entry, h)
					p.Cache.GatherV(v, want.page, want.entry, h)
					require.Equal(t, wantK[(want.row*H+h)*D:(want.row*H+h+1)*D], k, "%v/%v K row %d -> page %d entry %d head %d", l, f, want.row, want.page, want.entry, h)
					require.Equal(t, wantV[(want.row*H+h)*D:(want.row*H+h+1)*D], v, "%v/%v V row %d head %d", l, f, want.row, h)
				}
			}
			// Page 0 entry 0, pages 2 and 3 are not written.
			for _, pe := range [][2]int{{0, 0}, {2, 0}, {2, 1}, {3, 0}, {3, 1}} {
				p.Cache.GatherK(k, pe[0], pe[1], 1)
				require.Equal(t, make([]float32, D), k, "%v/%v untouched page %d entry %d", l, f, pe[0], pe[1])
			}
		}
	}
}

// testAppendLayoutsAgree appends the same logical rows through NHD and HND,
// fused and split, and requires every request to read back identically.
func testAppendLayoutsAgree(t *testing.T, b kernels.Backend) {
	for seed := range uint64(3) {
		bt := RandomBatch(rand.New(rand.NewPCG(seed, 1)), 5, 4, true)
		r := rand.New(rand.NewPCG(seed, 2))
		const H, D = 3, 64
		// Finite values, so that the float gather below compares with ==.
		kv := make([]float32, 2*bt.Nnz()*H*D)
		for i := range kv {
			kv[i] = float32(r.NormFloat64())
		}
		key := kernels.TensorFromF32(layout.BF16, kv[:len(kv)/2], bt.Nnz(), H, D)
		val := kernels.TensorFromF32(layout.BF16, kv[len(kv)/2:], bt.Nnz(), H, D)
		var first [][]reference.TokenBytes
		var firstName string
		for _, l := range []layout.KVLayout{layout.NHD, layout.HND} {
			for _, f := range []layout.TensorForm{layout.Fused, layout.Split} {
				name := fmt.Sprintf("%v/%v", l, f)
				cache, err := kernels.NewPagedKVCache(layout.Paged{Layout: l, Form: f, DType: layout.BF16, NumPages: bt.NumPages, PageSize: 5, NumKVHeads: H, HeadDim: D})
				require.NoError(t, err)
				p := kernels.AppendParams{AppendKey: key, AppendValue: val, BatchIndices: bt.BatchIndices, Positions: bt.Positions, Cache: cache, Table: bt.Table}
				if !runAppend(t, b, name, &p) {
					continue
				}
				var got [][]reference.TokenBytes
				for req, n := range bt.SeqLens {
					got = append(got, reference.GatherBytes(refView(&p.Cache), bt.Table.KVIndptr, bt.Table.KVPageIndices, req, n))
				}
				// The float gather of the kernels package agrees too.
				kf, vf := make([]float32, H*D), make([]float32, H*D)
				for i, req := range bt.BatchIndices {
					require.NoError(t, p.Cache.GatherToken(kf, vf, &p.Table, int(req), int(bt.Positions[i])))
					row := kernels.Tensor{DType: layout.BF16, Shape: []int{H * D}, Data: key.Data[i*H*D*2 : (i+1)*H*D*2]}
					require.Equal(t, row.F32(), kf, "%s seed %d: GatherToken of row %d", name, seed, i)
				}
				if first == nil {
					first, firstName = got, name
					continue
				}
				for req := range got {
					for tok := range got[req] {
						if string(got[req][tok].K) != string(first[req][tok].K) || string(got[req][tok].V) != string(first[req][tok].V) {
							t.Fatalf("seed %d: request %d token %d reads differently through %s and %s", seed, req, tok, name, firstName)
						}
					}
				}
			}
		}
	}
}

// testAppendInvalid breaks one input at a time (in the last row where the
// input is per row, so a backend that wrote before validating would be
// caught) and requires the matching error and an unchanged cache.
func testAppendInvalid(t *testing.T, b kernels.Backend) {
	base := func() AppendFixture {
		// Regenerate until the last row's request has a following request
		// or not; any batch with at least two rows will do.
		for s := uint64(0); ; s++ {
			f := NewAppendFixture(rand.New(rand.NewPCG(s, 3)), AppendCase{Layout: layout.HND, Form: layout.Split, DType: layout.F16, PageSize: 4, Heads: 2, HeadDim: 64, MaxBatch: 3})
			if f.Batch.Nnz() >= 2 {
				return f
			}
		}
	}
	fresh := func() (*kernels.AppendParams, func(t *testing.T, name string)) {
		f := base()
		p := f.Params
		p.BatchIndices, p.Positions = slices.Clone(p.BatchIndices), slices.Clone(p.Positions)
		p.Table.KVIndptr, p.Table.KVPageIndices = slices.Clone(p.Table.KVIndptr), slices.Clone(p.Table.KVPageIndices)
		p.Table.KVLastPageLen = slices.Clone(p.Table.KVLastPageLen)
		return &p, func(t *testing.T, name string) {
			// Compare the original buffers (a mutation may have resliced p.Cache).
			requireCacheEqual(t, &f.Params.Cache, &f.Before, name+" (failed call)")
		}
	}
	last := func(p *kernels.AppendParams) int { return len(p.BatchIndices) - 1 }
	runAppendInvalid(t, b, "invalid-base", fresh, b.AppendPagedKVCache, []appendBreak[kernels.AppendParams]{
		{"position == seq_len", kernels.ErrIndexOutOfRange, func(p *kernels.AppendParams) {
			i := last(p)
			p.Positions[i] = int32(p.Table.SeqLen(int(p.BatchIndices[i]), 4))
		}},
		{"negative position", kernels.ErrIndexOutOfRange, func(p *kernels.AppendParams) { p.Positions[last(p)] = -1 }},
		{"batch index == B", kernels.ErrIndexOutOfRange, func(p *kernels.AppendParams) { p.BatchIndices[last(p)] = int32(p.Table.BatchSize()) }},
		{"negative batch index", kernels.ErrIndexOutOfRange, func(p *kernels.AppendParams) { p.BatchIndices[last(p)] = -1 }},
		{"page id == num_pages", kernels.ErrIndexOutOfRange, func(p *kernels.AppendParams) {
			p.Table.KVPageIndices[len(p.Table.KVPageIndices)-1] = int32(p.Cache.Geometry.NumPages)
		}},
		{"last_page_len > page_size", kernels.ErrInvalidPageTable, func(p *kernels.AppendParams) {
			b := int(p.BatchIndices[last(p)])
			p.Table.KVLastPageLen[b] = 5
		}},
		{"last_page_len 0 with pages", kernels.ErrInvalidPageTable, func(p *kernels.AppendParams) {
			p.Table.KVLastPageLen[p.BatchIndices[last(p)]] = 0
		}},
		{"kv_indptr[0] != 0", kernels.ErrInvalidPageTable, func(p *kernels.AppendParams) { p.Table.KVIndptr[0] = 1 }},
		{"kv_indptr beyond kv_indices", kernels.ErrInvalidPageTable, func(p *kernels.AppendParams) {
			p.Table.KVPageIndices = p.Table.KVPageIndices[:len(p.Table.KVPageIndices)-1]
		}},
		{"kv_last_page_len too short", kernels.ErrInvalidPageTable, func(p *kernels.AppendParams) {
			p.Table.KVLastPageLen = p.Table.KVLastPageLen[1:]
		}},
		{"positions shorter than batch_indices", kernels.ErrInvalidTensor, func(p *kernels.AppendParams) { p.Positions = p.Positions[1:] }},
		{"append_key has the wrong head count", kernels.ErrInvalidTensor, func(p *kernels.AppendParams) {
			p.AppendKey = kernels.NewTensor(layout.F16, len(p.BatchIndices), 1, 128)
		}},
		{"append_value has the wrong nnz", kernels.ErrInvalidTensor, func(p *kernels.AppendParams) {
			p.AppendValue = kernels.NewTensor(layout.F16, len(p.BatchIndices)+1, 2, 64)
		}},
		{"append_key data too short", kernels.ErrInvalidTensor, func(p *kernels.AppendParams) { p.AppendKey.Data = p.AppendKey.Data[1:] }},
		{"bf16 rows into an f16 cache", kernels.ErrInvalidTensor, func(p *kernels.AppendParams) {
			p.AppendKey.DType, p.AppendValue.DType = layout.BF16, layout.BF16
		}},
		{"key and value dtypes differ", kernels.ErrInvalidTensor, func(p *kernels.AppendParams) { p.AppendValue.DType = layout.BF16 }},
		{"scale on a plain copy", kernels.ErrInvalidScale, func(p *kernels.AppendParams) { p.KScale = 0.5 }},
		{"negative scale", kernels.ErrInvalidScale, func(p *kernels.AppendParams) { p.VScale = -1 }},
		{"cache buffer too short", kernels.ErrInvalidCache, func(p *kernels.AppendParams) { p.Cache.V = p.Cache.V[:len(p.Cache.V)-2] }},
		{"split cache with Data set", kernels.ErrInvalidCache, func(p *kernels.AppendParams) { p.Cache.Data = []byte{} }},
		{"page size 0", kernels.ErrInvalidCache, func(p *kernels.AppendParams) { p.Cache.Geometry.PageSize = 0 }},
	})
}

// appendBreak is one broken input of an append: mut breaks valid
// parameters, and the call must fail with want.
type appendBreak[P any] struct {
	name string
	want error
	mut  func(p *P)
}

// runAppendInvalid requires the parameters fresh makes to append (as
// baseName; it returns when b does not support them), then runs every break
// on fresh parameters: call must fail with its error and leave the cache as
// it was (fresh's check).
func runAppendInvalid[P any](t *testing.T, b kernels.Backend, baseName string, fresh func() (*P, func(t *testing.T, name string)), call func(*P) error, breaks []appendBreak[P]) {
	if p, _ := fresh(); !ranAppend(t, b, baseName, call(p)) {
		return
	}
	for _, tc := range breaks {
		t.Run(tc.name, func(t *testing.T) {
			p, unchanged := fresh()
			tc.mut(p)
			err := call(p)
			require.ErrorIs(t, err, tc.want, "backend %s", b.Name())
			t.Logf("%s: %v", tc.name, err)
			unchanged(t, tc.name)
		})
	}
}

// MLACase is one MLA append configuration of the suite.
type MLACase struct {
	Form     layout.TensorForm
	DType    layout.DType
	PageSize int
	DCKV     int // FlashInfer: 512
	DKPE     int // FlashInfer: 64
	MaxBatch int
	Shuffle  bool
	// NoLastPageLen passes KVLastPageLen = nil (positions are then bounded
	// by the reserved pages only).
	NoLastPageLen bool
}

func (c MLACase) String() string {
	s := fmt.Sprintf("%v/%v/N%d/ckv%d/kpe%d", c.Form, c.DType, c.PageSize, c.DCKV, c.DKPE)
	if c.NoLastPageLen {
		s += "/no-last-page-len"
	}
	return s
}

// MLAFixture is a ready-to-run MLA append and the reference's result.
type MLAFixture struct {
	Batch  Batch
	Params kernels.MLAAppendParams
	Before kernels.MLACache
	Want   kernels.MLACache
}

func refMLA(c *kernels.MLACache) reference.MLACache {
	g := c.Geometry
	return reference.MLACache{Form: g.Form, DType: g.DType, PageSize: g.PageSize, DCKV: g.HeadDimCKV, DKPE: g.HeadDimKPE,
		Data: c.Data, CKV: c.CKV, KPE: c.KPE}
}

func cloneMLA(c kernels.MLACache) kernels.MLACache {
	c.Data, c.CKV, c.KPE = slices.Clone(c.Data), slices.Clone(c.CKV), slices.Clone(c.KPE)
	return c
}

// NewMLAFixture builds a random MLA append of case c from r.
func NewMLAFixture(r *rand.Rand, c MLACase) MLAFixture {
	bt := RandomBatch(r, c.PageSize, max(c.MaxBatch, 1), c.Shuffle)
	cache, err := kernels.NewMLACache(layout.MLA{Form: c.Form, DType: c.DType, NumPages: bt.NumPages, PageSize: c.PageSize, HeadDimCKV: c.DCKV, HeadDimKPE: c.DKPE})
	if err != nil {
		panic(err)
	}
	for _, buf := range [][]byte{cache.Data, cache.CKV, cache.KPE} {
		copy(buf, randomBytes(r, len(buf)))
	}
	nnz := bt.Nnz()
	ckv, kpe := kernels.NewTensor(c.DType, nnz, c.DCKV), kernels.NewTensor(c.DType, nnz, c.DKPE)
	copy(ckv.Data, randomBytes(r, len(ckv.Data)))
	copy(kpe.Data, randomBytes(r, len(kpe.Data)))
	p := kernels.MLAAppendParams{AppendCKV: ckv, AppendKPE: kpe, BatchIndices: bt.BatchIndices, Positions: bt.Positions,
		Cache: cache, KVIndptr: bt.Table.KVIndptr, KVPageIndices: bt.Table.KVPageIndices, KVLastPageLen: bt.Table.KVLastPageLen}
	if c.NoLastPageLen {
		p.KVLastPageLen = nil
	}
	want := cloneMLA(cache)
	reference.MLAAppend(refMLA(&want), reference.MLAAppendInput{CKV: ckv.Data, KPE: kpe.Data, BatchIndices: bt.BatchIndices,
		Positions: bt.Positions, KVIndptr: bt.Table.KVIndptr, KVPageIndices: bt.Table.KVPageIndices})
	return MLAFixture{Batch: bt, Params: p, Before: cloneMLA(cache), Want: want}
}

// allMLASlots reads every (page, entry) of an MLA cache in page-major order
// through the reference (one pseudo-request owning all pages in order).
func allMLASlots(c *kernels.MLACache) []reference.TokenBytes {
	P := c.Geometry.NumPages
	indices := make([]int32, P)
	for i := range indices {
		indices[i] = int32(i)
	}
	return reference.MLAGatherBytes(refMLA(c), []int32{0, int32(P)}, indices, 0, P*c.Geometry.PageSize)
}

// MLADiff describes up to 8 slots where got and want differ; "" when equal.
func MLADiff(got, want *kernels.MLACache) string {
	if bytes.Equal(got.Data, want.Data) && bytes.Equal(got.CKV, want.CKV) && bytes.Equal(got.KPE, want.KPE) {
		return ""
	}
	g, w := allMLASlots(got), allMLASlots(want)
	N := want.Geometry.PageSize
	var out []string
	for s := range w {
		for part, pair := range [][2][]byte{{g[s].K, w[s].K}, {g[s].V, w[s].V}} {
			if string(pair[0]) == string(pair[1]) {
				continue
			}
			if len(out) == 8 {
				return strings.Join(append(out, "..."), "\n")
			}
			out = append(out, fmt.Sprintf("%s page %d entry %d: got %x want %x", []string{"ckv", "kpe"}[part], s/N, s%N, pair[0], pair[1]))
		}
	}
	return strings.Join(out, "\n")
}

func runMLAAppend(t testing.TB, b kernels.Backend, name string, p *kernels.MLAAppendParams) bool {
	t.Helper()
	return ranAppend(t, b, "MLA append "+name, b.AppendPagedMLAKVCache(p))
}

// CheckMLAAppend runs one random MLA append of case c on b and checks the
// cache against the reference, the appended rows reading back, and every
// other slot being unchanged.
func CheckMLAAppend(t testing.TB, b kernels.Backend, c MLACase, seed uint64) {
	t.Helper()
	f := NewMLAFixture(rand.New(rand.NewPCG(seed, 0x51)), c)
	p := f.Params
	if !runMLAAppend(t, b, c.String(), &p) {
		return
	}
	if d := MLADiff(&p.Cache, &f.Want); d != "" {
		t.Fatalf("%v seed %d: cache differs from the reference:\n%s", c, seed, d)
	}
	bt, es := f.Batch, c.DType.Size()
	written := map[int]bool{}
	toks := make([][]reference.TokenBytes, len(bt.SeqLens))
	for req, n := range bt.SeqLens {
		toks[req] = reference.MLAGatherBytes(refMLA(&p.Cache), bt.Table.KVIndptr, bt.Table.KVPageIndices, req, n)
	}
	for i, rb := range bt.BatchIndices {
		tok := toks[rb][bt.Positions[i]]
		if string(tok.K) != string(p.AppendCKV.Data[i*c.DCKV*es:(i+1)*c.DCKV*es]) || string(tok.V) != string(p.AppendKPE.Data[i*c.DKPE*es:(i+1)*c.DKPE*es]) {
			t.Fatalf("%v seed %d: row %d (request %d, position %d) does not read back", c, seed, i, rb, bt.Positions[i])
		}
		page, entry := reference.TokenSlot(bt.Table.KVIndptr, bt.Table.KVPageIndices, c.PageSize, int(rb), int(bt.Positions[i]))
		written[page*c.PageSize+entry] = true
	}
	after, before := allMLASlots(&p.Cache), allMLASlots(&f.Before)
	for s := range after {
		if !written[s] && (string(after[s].K) != string(before[s].K) || string(after[s].V) != string(before[s].V)) {
			t.Fatalf("%v seed %d: untouched page %d entry %d changed", c, seed, s/c.PageSize, s%c.PageSize)
		}
	}
}

// MLACases lists the MLA suite's matrix: fused and split, every cache dtype,
// FlashInfer's 512/64 dims and small ones, page sizes 1, 3 and 16, with and
// without kv_last_page_len.
func MLACases() []MLACase {
	var cs []MLACase
	for _, f := range []layout.TensorForm{layout.Fused, layout.Split} {
		for _, dt := range []layout.DType{layout.F32, layout.F16, layout.BF16, layout.E4M3, layout.E5M2} {
			cs = append(cs,
				MLACase{Form: f, DType: dt, PageSize: 16, DCKV: layout.HeadDimCKV, DKPE: layout.HeadDimKPE, MaxBatch: 3},
				MLACase{Form: f, DType: dt, PageSize: 3, DCKV: 16, DKPE: 8, MaxBatch: 4, Shuffle: true},
				MLACase{Form: f, DType: dt, PageSize: 1, DCKV: layout.HeadDimCKV, DKPE: layout.HeadDimKPE, MaxBatch: 2, NoLastPageLen: true},
			)
		}
	}
	return cs
}

// TestMLAAppend is the conformance suite for AppendPagedMLAKVCache.
func TestMLAAppend(t *testing.T, b kernels.Backend) {
	t.Run("random", func(t *testing.T) { randomCases(t, b, MLACases(), CheckMLAAppend) })
	t.Run("fused-split-agree", func(t *testing.T) {
		for seed := range uint64(3) {
			fused := NewMLAFixture(rand.New(rand.NewPCG(seed, 9)), MLACase{Form: layout.Fused, DType: layout.BF16, PageSize: 4, DCKV: 512, DKPE: 64, MaxBatch: 3, Shuffle: true})
			split := NewMLAFixture(rand.New(rand.NewPCG(seed, 9)), MLACase{Form: layout.Split, DType: layout.BF16, PageSize: 4, DCKV: 512, DKPE: 64, MaxBatch: 3, Shuffle: true})
			fp, sp := fused.Params, split.Params
			require.Equal(t, fp.AppendCKV.Data, sp.AppendCKV.Data, "same seed, same rows")
			if !runMLAAppend(t, b, "fused", &fp) || !runMLAAppend(t, b, "split", &sp) {
				continue
			}
			bt := fused.Batch
			for req, n := range bt.SeqLens {
				got := reference.MLAGatherBytes(refMLA(&fp.Cache), bt.Table.KVIndptr, bt.Table.KVPageIndices, req, n)
				want := reference.MLAGatherBytes(refMLA(&sp.Cache), bt.Table.KVIndptr, bt.Table.KVPageIndices, req, n)
				for i, rb := range bt.BatchIndices {
					if int(rb) != req {
						continue
					}
					pos := bt.Positions[i]
					if string(got[pos].K) != string(want[pos].K) || string(got[pos].V) != string(want[pos].V) {
						t.Fatalf("seed %d: request %d position %d reads differently fused and split", seed, req, pos)
					}
				}
			}
			// The kernels package's float gather reads the same through both forms.
			ckvF, kpeF := make([]float32, 512), make([]float32, 64)
			ckvS, kpeS := make([]float32, 512), make([]float32, 64)
			for i, rb := range bt.BatchIndices {
				page, entry := reference.TokenSlot(bt.Table.KVIndptr, bt.Table.KVPageIndices, 4, int(rb), int(bt.Positions[i]))
				fp.Cache.GatherMLA(ckvF, kpeF, page, entry)
				sp.Cache.GatherMLA(ckvS, kpeS, page, entry)
				require.Equal(t, bitsOf(ckvS), bitsOf(ckvF), "ckv of row %d", i)
				require.Equal(t, bitsOf(kpeS), bitsOf(kpeF), "kpe of row %d", i)
			}
		}
	})
	t.Run("invalid-writes-nothing", func(t *testing.T) { testMLAAppendInvalid(t, b) })
}

// bitsOf compares float32 rows bit for bit (NaN == NaN).
func bitsOf(xs []float32) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = fmt.Sprintf("%08x", math.Float32bits(x))
	}
	return out
}

func testMLAAppendInvalid(t *testing.T, b kernels.Backend) {
	base := func() MLAFixture {
		for s := uint64(0); ; s++ {
			f := NewMLAFixture(rand.New(rand.NewPCG(s, 4)), MLACase{Form: layout.Fused, DType: layout.BF16, PageSize: 4, DCKV: 512, DKPE: 64, MaxBatch: 3})
			if f.Batch.Nnz() >= 2 {
				return f
			}
		}
	}
	fresh := func() (*kernels.MLAAppendParams, func(t *testing.T, name string)) {
		f := base()
		p := f.Params
		p.BatchIndices, p.Positions = slices.Clone(p.BatchIndices), slices.Clone(p.Positions)
		p.KVIndptr, p.KVPageIndices, p.KVLastPageLen = slices.Clone(p.KVIndptr), slices.Clone(p.KVPageIndices), slices.Clone(p.KVLastPageLen)
		return &p, func(t *testing.T, name string) {
			if d := MLADiff(&f.Params.Cache, &f.Before); d != "" {
				t.Fatalf("%s: failed call changed the cache:\n%s", name, d)
			}
		}
	}
	last := func(p *kernels.MLAAppendParams) int { return len(p.BatchIndices) - 1 }
	runAppendInvalid(t, b, "MLA append invalid-base", fresh, b.AppendPagedMLAKVCache, []appendBreak[kernels.MLAAppendParams]{
		{"position == seq_len", kernels.ErrIndexOutOfRange, func(p *kernels.MLAAppendParams) {
			i := last(p)
			tbl := kernels.PageTable{KVIndptr: p.KVIndptr, KVPageIndices: p.KVPageIndices, KVLastPageLen: p.KVLastPageLen}
			p.Positions[i] = int32(tbl.SeqLen(int(p.BatchIndices[i]), 4))
		}},
		{"position == pages*page_size without last_page_len", kernels.ErrIndexOutOfRange, func(p *kernels.MLAAppendParams) {
			i, b := last(p), p.BatchIndices[last(p)]
			p.KVLastPageLen = nil
			p.Positions[i] = 4 * (p.KVIndptr[b+1] - p.KVIndptr[b])
		}},
		{"batch index == B", kernels.ErrIndexOutOfRange, func(p *kernels.MLAAppendParams) { p.BatchIndices[last(p)] = int32(len(p.KVIndptr) - 1) }},
		{"page id < 0", kernels.ErrIndexOutOfRange, func(p *kernels.MLAAppendParams) { p.KVPageIndices[len(p.KVPageIndices)-1] = -1 }},
		{"kv_indptr decreasing", kernels.ErrInvalidPageTable, func(p *kernels.MLAAppendParams) {
			p.KVIndptr[len(p.KVIndptr)-1] = p.KVIndptr[len(p.KVIndptr)-2] - 1
		}},
		{"empty kv_indptr", kernels.ErrInvalidPageTable, func(p *kernels.MLAAppendParams) { p.KVIndptr = nil }},
		{"append_ckv with 576 columns", kernels.ErrInvalidTensor, func(p *kernels.MLAAppendParams) {
			p.AppendCKV = kernels.NewTensor(layout.BF16, len(p.BatchIndices), 576)
		}},
		{"append_kpe wrong dtype", kernels.ErrInvalidTensor, func(p *kernels.MLAAppendParams) { p.AppendKPE.DType = layout.F16 }},
		{"positions too long", kernels.ErrInvalidTensor, func(p *kernels.MLAAppendParams) { p.Positions = append(p.Positions, 0) }},
		{"fused cache too short", kernels.ErrInvalidCache, func(p *kernels.MLAAppendParams) { p.Cache.Data = p.Cache.Data[:len(p.Cache.Data)-1] }},
		{"fused cache with split buffers", kernels.ErrInvalidCache, func(p *kernels.MLAAppendParams) { p.Cache.KPE = []byte{} }},
	})
}
