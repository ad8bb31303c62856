//go:build cgo

package cpuemu

import (
	"bytes"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/reference"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// byteSource hands out fuzz input bytes (zeros once exhausted).
type byteSource struct{ b []byte }

func (s *byteSource) next() int {
	if len(s.b) == 0 {
		return 0
	}
	x := s.b[0]
	s.b = s.b[1:]
	return int(x)
}

func (s *byteSource) pick(n int) int { return s.next() % n }

// fuzzTable builds a page table for lens over a pool with spare pages, the
// page ids permuted by the input.
func fuzzTable(s *byteSource, lens []int, pageSize, numPages int) kernels.PageTable {
	perm := make([]int32, numPages)
	for i := range perm {
		perm[i] = int32(i)
	}
	for i := numPages - 1; i > 0; i-- {
		j := s.pick(i + 1)
		perm[i], perm[j] = perm[j], perm[i]
	}
	t := kernels.PageTable{KVIndptr: []int32{0}, KVLastPageLen: make([]int32, len(lens))}
	next := 0
	for b, n := range lens {
		for range (n + pageSize - 1) / pageSize {
			t.KVPageIndices = append(t.KVPageIndices, perm[next])
			next++
		}
		t.KVIndptr = append(t.KVIndptr, int32(len(t.KVPageIndices)))
		if n > 0 {
			t.KVLastPageLen[b] = int32((n-1)%pageSize + 1)
		}
	}
	return t
}

// FuzzEmuAppend checks the indexing of the append kernels: for any
// geometry (every copy unit, layout, tensor form, dtype and the converting
// fp8 path) and any set of distinct destination slots, the emulated kernel
// writes exactly the bytes the reference model writes, and nothing else.
func FuzzEmuAppend(f *testing.F) {
	f.Add([]byte{0, 0, 1, 3, 1, 2, 5, 7, 1, 2, 3})
	f.Add([]byte{1, 1, 4, 1, 0, 6, 2, 9, 9, 9, 200, 3, 4, 5, 6, 7})
	f.Add([]byte{2, 3, 2, 2, 2, 1, 1, 1, 17, 33, 65, 129})
	b := New(Config{NumSMs: 2})
	f.Fuzz(func(t *testing.T, data []byte) {
		s := &byteSource{data}
		dts := []layout.DType{layout.F32, layout.F16, layout.BF16, layout.E4M3, layout.E5M2}
		g := layout.Paged{
			Layout: layout.KVLayout(s.pick(2)), Form: layout.TensorForm(s.pick(2)), DType: dts[s.pick(5)],
			PageSize: 1 + s.pick(5), NumKVHeads: 1 + s.pick(3), HeadDim: []int{1, 2, 3, 4, 8, 24, 64}[s.pick(7)],
		}
		src := g.DType
		if (g.DType == layout.E4M3 || g.DType == layout.E5M2) && s.pick(2) == 1 {
			src = dts[s.pick(3)] // f32/f16/bf16 rows, converted
		}
		lens := make([]int, 1+s.pick(3))
		total := 0
		for i := range lens {
			lens[i] = s.pick(12)
			total += (lens[i] + g.PageSize - 1) / g.PageSize
		}
		g.NumPages = total + s.pick(3)
		table := fuzzTable(s, lens, g.PageSize, g.NumPages)
		// Distinct destination slots, in an order the input picks.
		var rows [][2]int32
		for r, n := range lens {
			for pos := range n {
				if s.pick(2) == 1 {
					rows = append(rows, [2]int32{int32(r), int32(pos)})
				}
			}
		}
		for i := len(rows) - 1; i > 0; i-- {
			j := s.pick(i + 1)
			rows[i], rows[j] = rows[j], rows[i]
		}
		cache, err := kernels.NewPagedKVCache(g)
		require.NoError(t, err)
		for _, buf := range [][]byte{cache.Data, cache.K, cache.V} {
			for i := range buf {
				buf[i] = byte(s.next() ^ i)
			}
		}
		nnz := len(rows)
		p := kernels.AppendParams{
			AppendKey: kernels.NewTensor(src, nnz, g.NumKVHeads, g.HeadDim), AppendValue: kernels.NewTensor(src, nnz, g.NumKVHeads, g.HeadDim),
			BatchIndices: make([]int32, nnz), Positions: make([]int32, nnz), Cache: cache, Table: table,
		}
		for i, r := range rows {
			p.BatchIndices[i], p.Positions[i] = r[0], r[1]
		}
		for i := range p.AppendKey.Data {
			p.AppendKey.Data[i] = byte(s.next() + 3*i)
			p.AppendValue.Data[i] = byte(s.next() + 5*i)
		}
		if src != g.DType {
			p.KScale, p.VScale = 0.25*float64(1+s.pick(8)), 0
		}
		want := reference.PagedKV{Layout: g.Layout, Form: g.Form, DType: g.DType, NumPages: g.NumPages, PageSize: g.PageSize,
			NumKVHeads: g.NumKVHeads, HeadDim: g.HeadDim,
			Data: bytes.Clone(cache.Data), K: bytes.Clone(cache.K), V: bytes.Clone(cache.V)}
		reference.Append(want, reference.AppendInput{Key: p.AppendKey.Data, Value: p.AppendValue.Data, SrcDType: src,
			BatchIndices: p.BatchIndices, Positions: p.Positions, KVIndptr: table.KVIndptr, KVPageIndices: table.KVPageIndices,
			KScale: p.KScale, VScale: p.VScale})
		require.NoError(t, b.AppendPagedKVCache(&p))
		what := fmt.Sprintf("%v %v %v<-%v N=%d H=%d D=%d lens=%v nnz=%d", g.Layout, g.Form, g.DType, src, g.PageSize, g.NumKVHeads, g.HeadDim, lens, nnz)
		require.Equal(t, want.Data, cache.Data, what)
		require.Equal(t, want.K, cache.K, what)
		require.Equal(t, want.V, cache.V, what)
	})
}

// FuzzEmuDecode checks the page walk, window and split-k indexing of the
// decode kernels: any page table, window and chunk length gives the
// reference's output within tolerance. Unused cache slots hold NaN, so a key
// read from the wrong slot shows.
func FuzzEmuDecode(f *testing.F) {
	f.Add([]byte{0, 0, 2, 1, 3, 9, 0, 40, 5})
	f.Add([]byte{1, 1, 0, 3, 2, 70, 3, 0, 250, 1, 7})
	f.Add([]byte{1, 0, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		s := &byteSource{data}
		g := layout.Paged{
			Layout: layout.KVLayout(s.pick(2)), Form: layout.TensorForm(s.pick(2)), DType: layout.F32,
			PageSize: 1 + s.pick(6), NumKVHeads: 1 + s.pick(2), HeadDim: []int{3, 32, 64}[s.pick(3)],
		}
		group := 1 + s.pick(10)
		window := s.pick(40) - 1
		chunk := s.pick(20) // 0: the H100 plan
		lens := make([]int, 1+s.pick(3))
		total := 0
		for i := range lens {
			lens[i] = s.pick(90)
			total += (lens[i] + g.PageSize - 1) / g.PageSize
		}
		g.NumPages = total + 1
		table := fuzzTable(s, lens, g.PageSize, g.NumPages)
		cache, err := kernels.NewPagedKVCache(g)
		require.NoError(t, err)
		for _, buf := range [][]byte{cache.Data, cache.K, cache.V} {
			for i := 0; i+4 <= len(buf); i += 4 {
				copy(buf[i:], []byte{0, 0, 0xc0, 0x7f}) // NaN
			}
		}
		val := func() float32 { return float32(s.next()%17-8) / 8 }
		for r, n := range lens {
			for tok := range n {
				page, entry, err := table.Locate(r, tok, g.PageSize)
				require.NoError(t, err)
				for h := range g.NumKVHeads {
					for d := range g.HeadDim {
						layout.StoreF32(layout.F32, cache.KBuf(), int(g.KOffset(page, entry, h, d)), val())
						layout.StoreF32(layout.F32, cache.VBuf(), int(g.VOffset(page, entry, h, d)), val())
					}
				}
			}
		}
		B, Hq, D := len(lens), g.NumKVHeads*group, g.HeadDim
		qv := make([]float32, B*Hq*D)
		for i := range qv {
			qv[i] = val()
		}
		p := kernels.DecodeParams{Q: kernels.TensorFromF32(layout.F32, qv, B, Hq, D), Cache: cache, Table: table,
			AttentionParams: kernels.AttentionParams{NumQOHeads: Hq, WindowLeft: window},
			O:               kernels.NewTensor(layout.F32, B, Hq, D), LSE: make([]float32, B*Hq)}
		require.NoError(t, New(Config{NumSMs: 4, MaxChunkTokens: chunk}).BatchDecode(&p))
		ref := reference.PagedKV{Layout: g.Layout, Form: g.Form, DType: g.DType, NumPages: g.NumPages, PageSize: g.PageSize,
			NumKVHeads: g.NumKVHeads, HeadDim: g.HeadDim, Data: cache.Data, K: cache.K, V: cache.V}
		q := reference.Rows3(reference.Floats(layout.F32, p.Q.Data), B, Hq, D)
		wo, wl := reference.BatchDecode(q, ref, table.KVIndptr, table.KVPageIndices, table.KVLastPageLen, reference.Logits{WindowLeft: window})
		o := p.O.F32()
		for r := range B {
			for h := range Hq {
				w, got := wl[r][h], float64(p.LSE[r*Hq+h])
				require.True(t, w == got || math.Abs(w-got) <= 1e-4+1e-5*math.Abs(w), "lse[req %d, head %d] = %v, want %v (lens %v, window %d, chunk %d)", r, h, got, w, lens, window, chunk)
				for d := range D {
					require.InDelta(t, wo[r][h][d], o[(r*Hq+h)*D+d], 1e-5+1e-5*math.Abs(wo[r][h][d]), "o[req %d, head %d, feat %d] (lens %v, window %d, chunk %d)", r, h, d, lens, window, chunk)
				}
			}
		}
	})
}
