package ppl_test

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/ppl"
)

// byteReader hands out fuzz input bytes, then zeros.
type byteReader []byte

func (r *byteReader) next() int {
	if len(*r) == 0 {
		return 0
	}
	b := (*r)[0]
	*r = (*r)[1:]
	return int(b)
}

func (r *byteReader) i64() int64 {
	var buf [8]byte
	n := copy(buf[:], *r)
	*r = (*r)[n:]
	return int64(binary.LittleEndian.Uint64(buf[:]))
}

// fuzzGeometry decodes a small geometry (at most a few thousand elements).
func fuzzGeometry(r *byteReader) ppl.Geometry {
	sel := r.next()
	g := ppl.Geometry{
		Layout: ppl.Layout(sel & 3), Mode: ppl.Mode(sel >> 2 & 1),
		NumLayers: 1 + r.next()%4, MaxTokens: r.next() % 24, NumKVHeads: 1 + r.next()%3,
		HeadDim: 2 * (1 + r.next()%8), NumRepeat: 1 + r.next()%3, PageSize: 1 + r.next()%6,
	}
	switch q := r.next(); q % 4 {
	case 0:
		g.DType = []layout.DType{layout.F32, layout.F16, layout.BF16}[q/4%3]
	case 1, 2:
		g.QuantBits, g.ScaleDType = 8, layout.F16
	default:
		g.QuantBits, g.ScaleDType = 4, layout.F32
	}
	if g.Quantised() {
		// A power of two dividing HeadDim (HeadDim is even).
		g.QuantGroup = 1
		for k := r.next() % 4; k > 0 && g.HeadDim%(2*g.QuantGroup) == 0; k-- {
			g.QuantGroup *= 2
		}
	}
	return g
}

// FuzzOffsets: for any geometry the fuzzer builds, Validate never panics,
// and for a valid small one every (layer, kv, slot, head, feat) maps to a
// distinct offset inside the cache tensor (and every scale group to a
// distinct offset inside the scale tensor), equal to the row-major index of
// the seed's shape.
func FuzzOffsets(f *testing.F) {
	f.Add([]byte{0, 2, 5, 2, 3, 1, 2, 0})
	f.Add([]byte{3, 1, 9, 1, 7, 2, 4, 1, 3})
	f.Add([]byte{6, 0, 23, 2, 0, 0, 5, 7, 2})
	f.Add([]byte{5, 3, 1, 0, 4, 1, 0, 3, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := byteReader(data)
		g := fuzzGeometry(&r)
		// Raw, unbounded values for Validate alone.
		raw := g
		raw.Layout, raw.MaxTokens, raw.NumLayers = ppl.Layout(r.next()), int(r.i64()), int(r.i64())
		_ = raw.Validate()

		require.NoError(t, g.Validate(), "%+v", g)
		checkBijection(t, g)
		for l := 0; l < g.NumLayers; l++ {
			for tok := 0; tok < g.MaxTokens; tok++ {
				if got, want := g.Offset(l, 1, tok, g.NumKVHeads-1, g.HeadDim-1), slowOffset(g, g.HeadDim, l, 1, tok, g.NumKVHeads-1, g.HeadDim-1); got != want {
					t.Fatalf("%+v: Offset = %d, row-major %d", g, got, want)
				}
			}
		}
	})
}

// FuzzCSRRoundTrip: a CSR table decoded from the input converts to PPL's
// page table and back to itself; PPL addressing decoded from the input
// (arbitrary, possibly unaligned or negative starts) either converts to CSR
// and back keeping every used page start, or fails leaving dst unchanged.
func FuzzCSRRoundTrip(f *testing.F) {
	f.Add([]byte{8, 3, 3, 0, 5, 8, 6, 3, 1, 6, 7, 4, 2, 3, 4, 7})
	f.Add([]byte{4, 2, 0, 0, 2, 12, 4, 4})
	f.Add([]byte{1, 1, 5, 9, 9, 9, 9, 9, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := byteReader(data)
		N := 1 + r.next()%16
		B := r.next() % 6

		// CSR -> PPL -> CSR.
		csr := kernels.PageTable{KVIndptr: []int32{0}}
		for b := 0; b < B; b++ {
			pages := r.next() % 5
			for j := 0; j < pages; j++ {
				csr.KVPageIndices = append(csr.KVPageIndices, int32(r.next()<<8|r.next()))
			}
			csr.KVIndptr = append(csr.KVIndptr, int32(len(csr.KVPageIndices)))
			last := int32(0)
			if pages > 0 {
				last = int32(1 + r.next()%N)
			}
			csr.KVLastPageLen = append(csr.KVLastPageLen, last)
		}
		var a ppl.Addressing
		require.NoError(t, ppl.PageTableFromCSR(&a, &csr, N, r.next()%3*4))
		var back kernels.PageTable
		require.NoError(t, ppl.CSRFromPageTable(&back, &a, N))
		require.Equal(t, csr, back)

		// PPL (arbitrary) -> CSR -> PPL.
		maxP := r.next() % 4
		pa := ppl.Addressing{KVStarts: []int64{0}, MaxPages: maxP}
		for b := 0; b < B; b++ {
			pa.KVStarts = append(pa.KVStarts, pa.KVStarts[b]+int64(r.next()%(4*N+1)))
			for j := 0; j < maxP; j++ {
				pa.CacheStarts = append(pa.CacheStarts, int64(int8(r.next()))*int64(1+r.next()%(2*N)))
			}
		}
		dst := kernels.PageTable{KVIndptr: []int32{-7}}
		if err := ppl.CSRFromPageTable(&dst, &pa, N); err != nil {
			require.Equal(t, kernels.PageTable{KVIndptr: []int32{-7}}, dst, "dst changed on error %v", err)
			return
		}
		require.NoError(t, dst.Validate(N, 1<<31))
		var pa2 ppl.Addressing
		require.NoError(t, ppl.PageTableFromCSR(&pa2, &dst, N, maxP))
		require.Equal(t, pa.KVStarts, pa2.KVStarts)
		require.Equal(t, usedColumns(&pa, N), usedColumns(&pa2, N))
	})
}

// FuzzKeyValueCache runs operator steps on a fuzzed geometry and batch
// against the history model of kvcache_test.go (direct gather, quantised
// inputs, untouched rows).
func FuzzKeyValueCache(f *testing.F) {
	f.Add([]byte{0, 1, 4, 2, 3, 1, 2, 1, 2, 3, 5, 0, 9})
	f.Add([]byte{7, 2, 0, 1, 7, 2, 5, 3, 1, 1, 0, 4})
	f.Add([]byte{2, 3, 9, 3, 1, 3, 0, 2, 4, 0, 0, 0, 0, 8, 8})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := byteReader(data)
		g := fuzzGeometry(&r)
		g.MaxTokens = 0 // sized by the harness
		B := r.next() % 4
		capacity := make([]int, B)
		for b := range capacity {
			capacity[b] = r.next() % 10
		}
		rng := rand.New(rand.NewPCG(uint64(r.next()), 1))
		h := newHarness(t, rng, g, r.next()%g.NumLayers, capacity)
		dts := []layout.DType{layout.F32, layout.F16, layout.BF16}
		for s := 0; s < 3; s++ {
			add := make([]int, B)
			for b := range add {
				add[b] = r.next() % (capacity[b] - h.len(b) + 1)
			}
			h.step(add, dts[r.next()%3], dts[r.next()%3])
		}
	})
}
