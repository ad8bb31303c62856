package ppl_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/ppl"
)

const x = -1 // an unused cachestarts column (never read)

// TestPageTableCSRWorkedExamples: PPL page tables drawn as rows of page
// starts beside the FlashInfer CSR for the same pages.
func TestPageTableCSRWorkedExamples(t *testing.T) {
	tests := map[string]struct {
		pageSize    int
		cacheStarts [][]int64 // (B, MaxP)
		kvStarts    []int64
		csr         kernels.PageTable
	}{
		// The seed's example, batch 2, page_size 256: cachestarts =
		// [[0, 256, ...], [1024, 2048, ...]], here with 300 and 256 keys.
		"seed/page_size-256": {
			pageSize:    256,
			cacheStarts: [][]int64{{0, 256, x}, {1024, x, 2048}},
			kvStarts:    []int64{0, 300, 556},
			csr: kernels.PageTable{
				KVIndptr:      []int32{0, 2, 3},
				KVPageIndices: []int32{0, 1, 4},
				KVLastPageLen: []int32{44, 256},
			},
		},
		// FlashInfer's tutorial figure: page_size 8, pages [0 5 8], [1 6 7],
		// [3 4], last_page_len 6, 4, 7 (seq_len 22, 20, 15).
		"flashinfer/page_layout-figure": {
			pageSize:    8,
			cacheStarts: [][]int64{{0, 40, 64}, {8, 48, 56}, {24, 32, x}},
			kvStarts:    []int64{0, 22, 42, 57},
			csr: kernels.PageTable{
				KVIndptr:      []int32{0, 3, 6, 8},
				KVPageIndices: []int32{0, 5, 8, 1, 6, 7, 3, 4},
				KVLastPageLen: []int32{6, 4, 7},
			},
		},
		// An empty request has no pages and last_page_len 0; a full last
		// page has last_page_len = page_size.
		"empty-and-full": {
			pageSize:    4,
			cacheStarts: [][]int64{{x, x}, {12, 4}, {x, x}},
			kvStarts:    []int64{0, 0, 8, 8},
			csr: kernels.PageTable{
				KVIndptr:      []int32{0, 0, 2, 2},
				KVPageIndices: []int32{3, 1},
				KVLastPageLen: []int32{0, 4, 0},
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			a := ppl.Addressing{KVStarts: tc.kvStarts, CacheStarts: flatten(tc.cacheStarts), MaxPages: len(tc.cacheStarts[0])}
			var got kernels.PageTable
			require.NoError(t, ppl.CSRFromPageTable(&got, &a, tc.pageSize))
			assert.Equal(t, tc.csr, got)

			var back ppl.Addressing
			require.NoError(t, ppl.PageTableFromCSR(&back, &tc.csr, tc.pageSize, a.MaxPages))
			assert.Equal(t, tc.kvStarts, back.KVStarts)
			assert.Equal(t, usedColumns(&a, tc.pageSize), usedColumns(&back, tc.pageSize), "used page starts")
		})
	}
}

// TestPageTableFromCSRPadding: unused columns are -1; maxPages 0 sizes the
// table to the longest request.
func TestPageTableFromCSRPadding(t *testing.T) {
	csr := kernels.PageTable{KVIndptr: []int32{0, 1, 1, 4}, KVPageIndices: []int32{7, 2, 0, 5}, KVLastPageLen: []int32{3, 0, 1}}
	var a ppl.Addressing
	require.NoError(t, ppl.PageTableFromCSR(&a, &csr, 4, 0))
	assert.Equal(t, 3, a.MaxPages)
	assert.Equal(t, [][]int64{
		{28, x, x},
		{x, x, x},
		{8, 0, 20},
	}, unflatten(a.CacheStarts, 3))
	assert.Equal(t, []int64{0, 3, 3, 12}, a.KVStarts)

	require.NoError(t, ppl.PageTableFromCSR(&a, &csr, 4, 4))
	assert.Equal(t, []int64{28, x, x, x}, a.CacheStarts[:4])

	before := a
	err := ppl.PageTableFromCSR(&a, &csr, 4, 2)
	assert.ErrorIs(t, err, ppl.ErrOutOfRange)
	assert.Contains(t, err.Error(), "a request has 3 pages, MaxP is 2")
	assert.Equal(t, before, a, "unchanged on error")
}

func TestCSRFromOffsets(t *testing.T) {
	// Offset mode is a page table with page_size 1: slot = page id.
	a := ppl.Addressing{KVStarts: []int64{0, 3, 3, 5}, CacheStarts: []int64{10, 99, 0}}
	var got kernels.PageTable
	require.NoError(t, ppl.CSRFromOffsets(&got, &a))
	assert.Equal(t, kernels.PageTable{
		KVIndptr:      []int32{0, 3, 3, 5},
		KVPageIndices: []int32{10, 11, 12, 0, 1},
		KVLastPageLen: []int32{1, 0, 1},
	}, got)

	bad := ppl.Addressing{KVStarts: []int64{0, 2}, CacheStarts: []int64{math.MaxInt32}}
	assert.ErrorIs(t, ppl.CSRFromOffsets(&got, &bad), ppl.ErrOutOfRange)
}

func TestCSRFromPageTableErrors(t *testing.T) {
	base := func() ppl.Addressing {
		return ppl.Addressing{KVStarts: []int64{0, 5, 9}, CacheStarts: []int64{8, 0, 16, x}, MaxPages: 2}
	}
	tests := map[string]struct {
		edit     func(a *ppl.Addressing)
		pageSize int
		is       error
		want     string
	}{
		"unaligned start":   {func(a *ppl.Addressing) { a.CacheStarts[1] = 2 }, 4, ppl.ErrUnalignedPage, "cachestarts[0, 1] = 2, page_size 4"},
		"negative start":    {func(a *ppl.Addressing) { a.CacheStarts[2] = -4 }, 4, ppl.ErrOutOfRange, "cachestarts[1, 0] = -4 < 0"},
		"too many pages":    {func(a *ppl.Addressing) { a.KVStarts[2] = 14 }, 4, ppl.ErrOutOfRange, "request 1: kv_len 9 needs 3 pages of 4, cachestarts has MaxP 2 columns"},
		"short cachestarts": {func(a *ppl.Addressing) { a.CacheStarts = a.CacheStarts[:3] }, 4, ppl.ErrInvalidStarts, "cachestarts has length 3, want batch 2 x MaxP 2"},
		"kvstarts[0] != 0":  {func(a *ppl.Addressing) { a.KVStarts[0] = 1 }, 4, ppl.ErrInvalidStarts, "kvstarts[0] = 1, want 0"},
		"kvstarts decrease": {func(a *ppl.Addressing) { a.KVStarts[2] = 4 }, 4, ppl.ErrInvalidStarts, "kvstarts decreases at request 1: 5 > 4"},
		"page past int32":   {func(a *ppl.Addressing) { a.CacheStarts[0] = 4 << 31 }, 4, ppl.ErrOutOfRange, "past int32"},
		"page_size 0":       {func(a *ppl.Addressing) {}, 0, ppl.ErrInvalidGeometry, "page_size 0 < 1"},
	}
	for name, tc := range tests {
		a := base()
		tc.edit(&a)
		dst := kernels.PageTable{KVIndptr: []int32{42}}
		err := ppl.CSRFromPageTable(&dst, &a, tc.pageSize)
		if assert.Error(t, err, name) {
			assert.ErrorIs(t, err, tc.is, name)
			assert.Contains(t, err.Error(), tc.want, name)
		}
		assert.Equal(t, kernels.PageTable{KVIndptr: []int32{42}}, dst, "%s: dst unchanged", name)
	}
}

// TestCSRRoundTripRandom: CSR -> PPL -> CSR is the identity, and PPL -> CSR ->
// PPL keeps every used page start.
func TestCSRRoundTripRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	var a, a2 ppl.Addressing
	var csr, csr2 kernels.PageTable
	for i := 0; i < 3000; i++ {
		N := 1 + rng.IntN(9)
		csr = randomCSR(rng, N, csr)
		require.NoError(t, csr.Validate(N, 1<<20))
		maxP := 0
		if rng.IntN(2) == 0 {
			maxP = 16
		}
		require.NoError(t, ppl.PageTableFromCSR(&a, &csr, N, maxP))
		require.NoError(t, ppl.CSRFromPageTable(&csr2, &a, N))
		require.Equal(t, csr, csr2, "CSR -> PPL -> CSR, page_size %d", N)

		require.NoError(t, ppl.PageTableFromCSR(&a2, &csr2, N, a.MaxPages))
		require.Equal(t, a, a2, "PPL -> CSR -> PPL")
	}
}

// randomCSR returns a valid CSR table of up to 6 requests with up to 16
// pages each from a pool of 2^20 pages, reusing dst's slices.
func randomCSR(rng *rand.Rand, N int, dst kernels.PageTable) kernels.PageTable {
	B := rng.IntN(7)
	dst.KVIndptr = append(dst.KVIndptr[:0], 0)
	dst.KVPageIndices = dst.KVPageIndices[:0]
	dst.KVLastPageLen = dst.KVLastPageLen[:0]
	for b := 0; b < B; b++ {
		pages := rng.IntN(17)
		if rng.IntN(4) == 0 {
			pages = 0
		}
		for j := 0; j < pages; j++ {
			dst.KVPageIndices = append(dst.KVPageIndices, int32(rng.IntN(1<<20)))
		}
		dst.KVIndptr = append(dst.KVIndptr, int32(len(dst.KVPageIndices)))
		last := int32(0)
		if pages > 0 {
			last = int32(1 + rng.IntN(N))
		}
		dst.KVLastPageLen = append(dst.KVLastPageLen, last)
	}
	return dst
}

// TestValidateAddressing covers the slot bounds of both modes.
func TestValidateAddressing(t *testing.T) {
	g := ppl.Geometry{Mode: ppl.ModePageTable, NumLayers: 1, MaxTokens: 32, NumKVHeads: 1, HeadDim: 4, NumRepeat: 1, PageSize: 8, DType: layout.F16}
	require.NoError(t, g.Validate())
	// Request 0: 10 keys in pages at 24 (8 keys) and 30 (2 keys: slots 30, 31).
	a := ppl.Addressing{KVStarts: []int64{0, 10}, CacheStarts: []int64{24, 30}, MaxPages: 2}
	require.NoError(t, g.ValidateAddressing(&a, 1), "a partial last page may end at MaxT")
	a.CacheStarts[1] = 31
	assert.ErrorContains(t, g.ValidateAddressing(&a, 1), "cachestarts[0, 1] = 31, a page holding 2 tokens, leaves [0, MaxT 32)")
	assert.ErrorContains(t, g.ValidateAddressing(&a, 2), "kvstarts has length 2, want batch+1 = 3")

	g.Mode = ppl.ModeOffset
	o := ppl.Addressing{KVStarts: []int64{0, 10, 10}, CacheStarts: []int64{22, -5}}
	require.NoError(t, g.ValidateAddressing(&o, 2), "an empty request's start is not read")
	o.CacheStarts[0] = 23
	err := g.ValidateAddressing(&o, 2)
	assert.ErrorIs(t, err, ppl.ErrOutOfRange)
	assert.ErrorContains(t, err, "request 0: cachestarts[0] = 23 with kv_len 10 leaves [0, MaxT 32)")
	o.CacheStarts = o.CacheStarts[:1]
	assert.ErrorIs(t, g.ValidateAddressing(&o, 2), ppl.ErrInvalidStarts)
}

// --- helpers ---

func flatten(rows [][]int64) []int64 {
	var out []int64
	for _, r := range rows {
		out = append(out, r...)
	}
	return out
}

func unflatten(flat []int64, cols int) [][]int64 {
	var out [][]int64
	for i := 0; i < len(flat); i += cols {
		out = append(out, flat[i:i+cols])
	}
	return out
}

// usedColumns returns, per request, the page starts its keys use.
func usedColumns(a *ppl.Addressing, pageSize int) [][]int64 {
	out := [][]int64{}
	for b := 0; b < a.BatchSize(); b++ {
		n := int((a.KVLen(b) + int64(pageSize) - 1) / int64(pageSize))
		out = append(out, append([]int64{}, a.CacheStarts[b*a.MaxPages:b*a.MaxPages+n]...))
	}
	return out
}
