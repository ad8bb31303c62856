package layout_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/reference"
	"github.com/pagedkv/pagedkv/layout"
)

// The worked example of flashinfer-semantics §1.4: P=6, N=4, H=2, D=64,
// fp16; the element K/V[page 3, entry 1, head 1, feat 5].
func TestWorkedOffsetsTable(t *testing.T) {
	//   format                   shape              K elem  K byte  V elem  V byte
	table := []struct {
		name         string
		layout       layout.KVLayout
		form         layout.TensorForm
		shape        []int
		kElem, kByte int64
		vElem, vByte int64
	}{
		{"5-D NHD", layout.NHD, layout.Fused, []int{6, 2, 4, 2, 64}, 3269, 6538, 3781, 7562},
		{"5-D HND", layout.HND, layout.Fused, []int{6, 2, 2, 4, 64}, 3397, 6794, 3909, 7818},
		{"tuple NHD", layout.NHD, layout.Split, []int{6, 4, 2, 64}, 1733, 3466, 1733, 3466},
		{"tuple HND", layout.HND, layout.Split, []int{6, 2, 4, 64}, 1861, 3722, 1861, 3722},
	}
	for _, tc := range table {
		t.Run(tc.name, func(t *testing.T) {
			g := layout.Paged{Layout: tc.layout, Form: tc.form, DType: layout.F16, NumPages: 6, PageSize: 4, NumKVHeads: 2, HeadDim: 64}
			require.NoError(t, g.Validate())
			assert.Equal(t, tc.shape, g.Shape())
			es := int64(g.DType.Size())
			k, v := g.KOffset(3, 1, 1, 5), g.VOffset(3, 1, 1, 5)
			assert.Equal(t, tc.kElem, k, "K element offset")
			assert.Equal(t, tc.kByte, k*es, "K byte offset")
			assert.Equal(t, tc.vElem, v, "V element offset")
			assert.Equal(t, tc.vByte, v*es, "V byte offset")
		})
	}
}

// "5-D NHD: page stride 1024, V offset +512, n stride 128, h stride 64."
func TestWorkedStrides(t *testing.T) {
	nhd := layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F16, NumPages: 6, PageSize: 4, NumKVHeads: 2, HeadDim: 64}
	assert.Equal(t, int64(1024), nhd.StridePage())
	assert.Equal(t, int64(512), nhd.VOffset(0, 0, 0, 0)-nhd.KOffset(0, 0, 0, 0))
	assert.Equal(t, int64(128), nhd.StrideN())
	assert.Equal(t, int64(64), nhd.StrideH())
	assert.Equal(t, int64(6*1024), nhd.TensorElements())

	hnd := nhd
	hnd.Layout = layout.HND
	assert.Equal(t, int64(64), hnd.StrideN())
	assert.Equal(t, int64(256), hnd.StrideH())

	split := hnd
	split.Form = layout.Split
	assert.Equal(t, int64(512), split.StridePage())
	assert.Equal(t, split.KOffset(5, 3, 1, 63), split.VOffset(5, 3, 1, 63), "split K and V share offsets (different buffers)")
	assert.Equal(t, int64(6*512), split.TensorElements())
}

// MLA: ckv [P, N, 512] and kpe [P, N, 64], fused as one [P, N, 576] tensor
// with kpe = [..., 512:], or split.
func TestMLAOffsets(t *testing.T) {
	fused := layout.MLA{Form: layout.Fused, DType: layout.BF16, NumPages: 5, PageSize: 16, HeadDimCKV: layout.HeadDimCKV, HeadDimKPE: layout.HeadDimKPE}
	require.NoError(t, fused.Validate())
	assert.Equal(t, int64(576), fused.RowCKV())
	assert.Equal(t, int64(576), fused.RowKPE())
	// page 2, entry 3: row (2*16+3) = 35 of 576 elements.
	assert.Equal(t, int64(35*576+7), fused.CKVOffset(2, 3, 7))
	assert.Equal(t, int64(35*576+512+7), fused.KPEOffset(2, 3, 7))
	assert.Equal(t, int64(5*16*576), fused.CKVElements())

	split := fused
	split.Form = layout.Split
	assert.Equal(t, int64(35*512+7), split.CKVOffset(2, 3, 7))
	assert.Equal(t, int64(35*64+7), split.KPEOffset(2, 3, 7))
	assert.Equal(t, int64(5*16*512), split.CKVElements())
	assert.Equal(t, int64(5*16*64), split.KPEElements())
}

func TestValidateRejects(t *testing.T) {
	ok := layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F16, NumPages: 1, PageSize: 1, NumKVHeads: 1, HeadDim: 1}
	require.NoError(t, ok.Validate())
	for name, mut := range map[string]func(*layout.Paged){
		"layout":   func(p *layout.Paged) { p.Layout = 7 },
		"form":     func(p *layout.Paged) { p.Form = 7 },
		"dtype":    func(p *layout.Paged) { p.DType = layout.I8 },
		"pages":    func(p *layout.Paged) { p.NumPages = -1 },
		"pagesize": func(p *layout.Paged) { p.PageSize = 0 },
		"heads":    func(p *layout.Paged) { p.NumKVHeads = 0 },
		"headdim":  func(p *layout.Paged) { p.HeadDim = -3 },
		"huge":     func(p *layout.Paged) { p.NumPages, p.PageSize, p.NumKVHeads, p.HeadDim = 1<<20, 1<<10, 1<<6, 1<<7 },
	} {
		p := ok
		mut(&p)
		assert.Error(t, p.Validate(), name)
	}
	m := layout.MLA{Form: layout.Split, DType: layout.E4M3, NumPages: 0, PageSize: 1, HeadDimCKV: 1, HeadDimKPE: 1}
	require.NoError(t, m.Validate())
	m.HeadDimKPE = 0
	assert.Error(t, m.Validate())
}

// refPaged is the reference model's view of geometry g.
func refPaged(g layout.Paged) reference.PagedKV {
	return reference.PagedKV{Layout: g.Layout, Form: g.Form, DType: g.DType, NumPages: g.NumPages,
		PageSize: g.PageSize, NumKVHeads: g.NumKVHeads, HeadDim: g.HeadDim,
		Data: []byte("data"), K: []byte("k"), V: []byte("v")}
}

// checkPagedOffsets checks every element of a (small) geometry: the K and V
// offsets equal the reference's row-major flattening of the PyTorch shape,
// lie inside the tensor, and are pairwise distinct within each buffer.
func checkPagedOffsets(t testing.TB, g layout.Paged) {
	t.Helper()
	ref := refPaged(g)
	n := g.TensorElements()
	seen := map[string][]bool{"data": make([]bool, n), "k": make([]bool, n), "v": make([]bool, n)}
	for page := 0; page < g.NumPages; page++ {
		for entry := 0; entry < g.PageSize; entry++ {
			for head := 0; head < g.NumKVHeads; head++ {
				for feat := 0; feat < g.HeadDim; feat++ {
					for kv, off := range []int64{g.KOffset(page, entry, head, feat), g.VOffset(page, entry, head, feat)} {
						buf, want := ref.Locate(reference.Slot{KV: kv, Page: page, Entry: entry, Head: head, Feat: feat})
						if off != want {
							t.Fatalf("%+v: offset of kv=%d (page %d, entry %d, head %d, feat %d) = %d, reference %d", g, kv, page, entry, head, feat, off, want)
						}
						if off < 0 || off >= n {
							t.Fatalf("%+v: offset %d outside [0, %d)", g, off, n)
						}
						if s := seen[string(buf)]; s[off] {
							t.Fatalf("%+v: offset %d in buffer %q used twice", g, off, buf)
						} else {
							s[off] = true
						}
					}
				}
			}
		}
	}
}

func TestPagedOffsetsMatchReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		g := layout.Paged{
			Layout: layout.KVLayout(r.IntN(2)), Form: layout.TensorForm(r.IntN(2)), DType: layout.F16,
			NumPages: r.IntN(5), PageSize: 1 + r.IntN(5), NumKVHeads: 1 + r.IntN(4), HeadDim: 1 + r.IntN(9),
		}
		require.NoError(t, g.Validate())
		checkPagedOffsets(t, g)
	}
}

// FuzzPagedOffsets decodes a small geometry and checks every element against
// the reference, inside the tensor and injective.
func FuzzPagedOffsets(f *testing.F) {
	f.Add(uint8(0), uint8(6), uint8(4), uint8(2), uint8(8))
	f.Add(uint8(1), uint8(3), uint8(1), uint8(1), uint8(1))
	f.Add(uint8(3), uint8(9), uint8(16), uint8(3), uint8(5))
	f.Fuzz(func(t *testing.T, lf, pages, pageSize, heads, dim uint8) {
		g := layout.Paged{
			Layout: layout.KVLayout(lf & 1), Form: layout.TensorForm(lf >> 1 & 1), DType: layout.BF16,
			NumPages: int(pages % 10), PageSize: 1 + int(pageSize%17), NumKVHeads: 1 + int(heads%5), HeadDim: 1 + int(dim%12),
		}
		if err := g.Validate(); err != nil {
			t.Fatal(err)
		}
		checkPagedOffsets(t, g)
	})
}

// checkMLAOffsets checks every element of a small MLA geometry against the
// reference model: the reference appends a distinct 16-bit code per element
// (its own flattening), and the offsets must find each code where expected,
// inside the tensor and injectively.
func checkMLAOffsets(t testing.TB, g layout.MLA) {
	t.Helper()
	g.DType = layout.F16 // codes are raw 16-bit patterns, never decoded
	P, N, DC, DK := g.NumPages, g.PageSize, g.HeadDimCKV, g.HeadDimKPE
	ref := reference.MLACache{Form: g.Form, DType: g.DType, PageSize: N, DCKV: DC, DKPE: DK}
	if g.Form == layout.Fused {
		ref.Data = make([]byte, 2*g.CKVElements())
	} else {
		ref.CKV, ref.KPE = make([]byte, 2*g.CKVElements()), make([]byte, 2*g.KPEElements())
	}
	code := func(tok, d int) uint16 { return uint16(1 + tok*(DC+DK) + d) }
	// One request owning every page in order, so token t is (t/N, t%N).
	indptr, indices := []int32{0, int32(P)}, make([]int32, P)
	for i := range indices {
		indices[i] = int32(i)
	}
	in := reference.MLAAppendInput{KVIndptr: indptr, KVPageIndices: indices}
	for tok := 0; tok < P*N; tok++ {
		in.BatchIndices = append(in.BatchIndices, 0)
		in.Positions = append(in.Positions, int32(tok))
		for d := 0; d < DC+DK; d++ {
			c := code(tok, d)
			if d < DC {
				in.CKV = append(in.CKV, byte(c), byte(c>>8))
			} else {
				in.KPE = append(in.KPE, byte(c), byte(c>>8))
			}
		}
	}
	reference.MLAAppend(ref, in)
	ckvBuf, kpeBuf := ref.CKV, ref.KPE
	if g.Form == layout.Fused {
		ckvBuf, kpeBuf = ref.Data, ref.Data
	}
	seenC, seenK := make([]bool, g.CKVElements()), make([]bool, g.KPEElements())
	for page := 0; page < P; page++ {
		for entry := 0; entry < N; entry++ {
			tok := page*N + entry
			for d := 0; d < DC+DK; d++ {
				off, buf, seen := g.CKVOffset(page, entry, d), ckvBuf, seenC
				if d >= DC {
					off, buf, seen = g.KPEOffset(page, entry, d-DC), kpeBuf, seenK
				}
				if g.Form == layout.Fused {
					seen = seenC // one tensor: ckv and kpe must not collide either
				}
				if off < 0 || 2*off >= int64(len(buf)) {
					t.Fatalf("%+v: (page %d, entry %d, feat %d) offset %d outside [0, %d)", g, page, entry, d, off, len(buf)/2)
				}
				if got, want := uint16(buf[2*off])|uint16(buf[2*off+1])<<8, code(tok, d); got != want {
					t.Fatalf("%+v: (page %d, entry %d, feat %d) offset %d holds code %d, the reference put %d there", g, page, entry, d, off, got, want)
				}
				if seen[off] {
					t.Fatalf("%+v: offset %d used twice", g, off)
				}
				seen[off] = true
			}
		}
	}
}

func FuzzMLAOffsets(f *testing.F) {
	f.Add(uint8(0), uint8(3), uint8(2), uint8(8), uint8(2))
	f.Add(uint8(1), uint8(1), uint8(1), uint8(1), uint8(1))
	f.Fuzz(func(t *testing.T, form, pages, pageSize, dc, dk uint8) {
		g := layout.MLA{Form: layout.TensorForm(form & 1), DType: layout.F16, NumPages: int(pages % 5),
			PageSize: 1 + int(pageSize%6), HeadDimCKV: 1 + int(dc%9), HeadDimKPE: 1 + int(dk%4)}
		if err := g.Validate(); err != nil {
			t.Fatal(err)
		}
		checkMLAOffsets(t, g)
	})
}

func TestMLAOffsetsMatchReference(t *testing.T) {
	for _, form := range []layout.TensorForm{layout.Fused, layout.Split} {
		for _, dims := range [][4]int{{1, 1, 1, 1}, {3, 2, 8, 2}, {2, 4, 5, 3}} {
			checkMLAOffsets(t, layout.MLA{Form: form, NumPages: dims[0], PageSize: dims[1], HeadDimCKV: dims[2], HeadDimKPE: dims[3]})
		}
	}
}

func TestParseNames(t *testing.T) {
	for _, dt := range []layout.DType{layout.F32, layout.F16, layout.BF16, layout.E4M3, layout.E5M2, layout.I8, layout.I32, layout.U8} {
		got, err := layout.ParseDType(dt.String())
		require.NoError(t, err)
		assert.Equal(t, dt, got)
	}
	for _, s := range []string{"float8_e4m3fn", "float8_e5m2", "bfloat16", "float16"} {
		_, err := layout.ParseDType(s)
		assert.NoError(t, err, s)
	}
	_, err := layout.ParseDType("f64")
	assert.Error(t, err)
	for _, l := range []layout.KVLayout{layout.NHD, layout.HND} {
		got, err := layout.ParseKVLayout(l.String())
		require.NoError(t, err)
		assert.Equal(t, l, got)
	}
	_, err = layout.ParseKVLayout("nhd")
	assert.Error(t, err)
}
