package pagetable_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/reference"
	"github.com/pagedkv/pagedkv/pagetable"
)

type i32 = []int32

func TestValidateCSR(t *testing.T) {
	tests := map[string]struct {
		indptr, indices, last i32
		pageSize, numPages    int
		err                   string // "" means valid
	}{
		"FlashInferFigure":     {i32{0, 3, 6, 8}, i32{0, 5, 8, 1, 6, 7, 3, 4}, i32{6, 4, 7}, 8, 9, ""},
		"EmptyBatch":           {i32{0}, i32{}, i32{}, 8, 9, ""},
		"EmptyRequests":        {i32{0, 0, 9}, i32{0, 1, 2, 3, 4, 5, 6, 7, 8}, i32{0, 1}, 16, 9, ""},
		"LastPageFull":         {i32{0, 1}, i32{0}, i32{8}, 8, 1, ""},
		"PageSize1":            {i32{0, 2, 3}, i32{1, 0, 2}, i32{1, 1}, 1, 3, ""},
		"SharedPageTwice":      {i32{0, 1, 2}, i32{4, 4}, i32{3, 3}, 8, 9, ""},
		"NoIndptr":             {i32{}, i32{}, i32{}, 8, 9, "pagetable: invalid page table: kv_indptr is empty, want length batch_size+1 >= 1"},
		"IndptrStartsAt1":      {i32{1, 3}, i32{0, 1}, i32{2}, 8, 9, "pagetable: invalid page table: kv_indptr[0] = 1, want 0"},
		"IndptrDecreases":      {i32{0, 3, 2}, i32{0, 1, 2}, i32{1, 1}, 8, 9, "pagetable: invalid page table: kv_indptr decreases at request 1: kv_indptr[1] = 3 > kv_indptr[2] = 2"},
		"TooFewIndices":        {i32{0, 3}, i32{0, 1}, i32{1}, 8, 9, "pagetable: invalid page table: kv_indptr[1] = 3 but kv_indices has length 2"},
		"LastPageLenMissing":   {i32{0, 1, 2}, i32{0, 1}, i32{1}, 8, 9, "pagetable: invalid page table: kv_last_page_len has length 1, want 2 (len(kv_indptr)-1)"},
		"LastPageLenZero":      {i32{0, 1, 2}, i32{0, 1}, i32{1, 0}, 8, 9, "pagetable: invalid page table: request 1: kv_last_page_len[1] = 0, want 1..8 (page_size)"},
		"LastPageLenPastPage":  {i32{0, 1, 2}, i32{0, 1}, i32{9, 1}, 8, 9, "pagetable: invalid page table: request 0: kv_last_page_len[0] = 9, want 1..8 (page_size)"},
		"EmptyButLastPageLen":  {i32{0, 0, 1}, i32{0}, i32{3, 1}, 8, 9, "pagetable: invalid page table: request 0 has 0 pages but kv_last_page_len[0] = 3, want 0"},
		"PageOutsideThePool":   {i32{0, 1, 3}, i32{0, 2, 9}, i32{1, 1}, 8, 9, "pagetable: invalid page table: request 1: kv_indices[2] = 9 outside the pool [0, 9)"},
		"NegativePage":         {i32{0, 0, 2}, i32{1, -1}, i32{0, 1}, 8, 9, "pagetable: invalid page table: request 1: kv_indices[1] = -1 outside the pool [0, 9)"},
		"BadPageSize":          {i32{0}, i32{}, i32{}, 0, 9, "pagetable: invalid page table: page_size = 0, want 1..65536"},
		"SeqLenOverflowsInt32": {i32{0, 1 << 16}, make(i32, 1<<16), i32{1 << 15}, 1 << 15, 1, "pagetable: invalid page table: request 0: seq_len of 65536 pages of 32768 tokens (the last 32768) exceeds 2147483647 (int32)"},
		"TokenOffsetsOverflow32Bit": {i32{0, 1 << 15, 1 << 16, 1 << 16 * 3 / 2, 1 << 17}, make(i32, 1<<17), i32{1, 1, 1, 1}, 1 << 15, 1,
			"pagetable: invalid page table: kv_indptr[4]*page_size = 131072*32768 = 4294967296, want < 2^32 (32-bit token offsets)"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := pagetable.ValidateCSR(tc.indptr, tc.indices, tc.last, tc.pageSize, tc.numPages)
			slow := reference.CheckCSRSlow(tc.indptr, tc.indices, tc.last, tc.pageSize, tc.numPages)
			if tc.err == "" {
				require.NoError(t, err)
				require.NoError(t, slow)
				return
			}
			require.ErrorIs(t, err, pagetable.ErrBadCSR)
			assert.EqualError(t, err, tc.err)
			assert.Error(t, slow, "the slow checker must reject it too")
		})
	}
}

func TestGetSeqLens(t *testing.T) {
	tests := map[string]struct {
		indptr, last i32
		pageSize     int
		want         i32
	}{
		"FlashInferFigure":   {i32{0, 3, 6, 8}, i32{6, 4, 7}, 8, i32{22, 20, 15}},
		"EmptyRequests":      {i32{0, 0, 9}, i32{0, 1}, 16, i32{0, 129}},
		"SmallAppend(§2.2)":  {i32{0, 2, 4}, i32{2, 2}, 2, i32{4, 4}},
		"PageSize1":          {i32{0, 3, 4}, i32{1, 1}, 1, i32{3, 1}},
		"FullLastPages":      {i32{0, 1, 3}, i32{16, 16}, 16, i32{16, 32}},
		"EmptyBatch":         {i32{0}, i32{}, 16, i32{}},
		"AppendDocstring":    {i32{0, 3, 4, 6, 8}, i32{13, 8, 9, 6}, 16, i32{45, 8, 25, 22}},
		"LongRequestOnePage": {i32{0, 1}, i32{5}, 8, i32{5}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			buf := make(i32, 0, 1) // reused and grown as needed
			got, err := pagetable.GetSeqLensTo(buf, tc.indptr, tc.last, tc.pageSize)
			require.NoError(t, err)
			requireInt32s(t, tc.want, got, "seq_lens")
			requireInt32s(t, tc.want, reference.SeqLensSlow(tc.indptr, tc.last, tc.pageSize), "slow seq_lens")
		})
	}
	orig := i32{7, 7}
	got, err := pagetable.GetSeqLensTo(orig, i32{0, 1}, i32{9}, 8)
	require.ErrorIs(t, err, pagetable.ErrBadCSR)
	assert.Equal(t, i32{7, 7}, got, "a failed call returns dst unchanged")
}

func TestGetBatchIndicesPositions(t *testing.T) {
	tests := map[string]struct {
		appendIndptr, seqLens i32
		batch, pos            i32
	}{
		"FlashInferFigure": {i32{0, 4, 6, 9}, i32{22, 20, 15},
			i32{0, 0, 0, 0, 1, 1, 2, 2, 2}, i32{18, 19, 20, 21, 18, 19, 12, 13, 14}},
		"Docstring": {i32{0, 1, 3, 6, 10}, i32{5, 5, 5, 5},
			i32{0, 1, 1, 2, 2, 2, 3, 3, 3, 3}, i32{4, 3, 4, 2, 3, 4, 1, 2, 3, 4}},
		"SmallAppend":     {i32{0, 1, 3}, i32{4, 4}, i32{0, 1, 1}, i32{3, 2, 3}},
		"Prefill":         {i32{0, 2, 5}, i32{2, 3}, i32{0, 0, 1, 1, 1}, i32{0, 1, 0, 1, 2}},
		"EmptyRequests":   {i32{0, 0, 2, 2}, i32{7, 3, 0}, i32{1, 1}, i32{1, 2}},
		"NothingAppended": {i32{0, 0}, i32{9}, i32{}, i32{}},
		"EmptyBatch":      {i32{0}, i32{}, i32{}, i32{}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			nnz := int(tc.appendIndptr[len(tc.appendIndptr)-1])
			bi, pos, err := pagetable.GetBatchIndicesPositionsTo(nil, nil, tc.appendIndptr, tc.seqLens, nnz)
			require.NoError(t, err)
			requireInt32s(t, tc.batch, bi, "batch_indices")
			requireInt32s(t, tc.pos, pos, "positions")
			sb, sp := reference.BatchIndicesPositionsSlow(tc.appendIndptr, tc.seqLens)
			requireInt32s(t, tc.batch, sb, "slow batch_indices")
			requireInt32s(t, tc.pos, sp, "slow positions")
		})
	}
	bad := map[string]struct {
		appendIndptr, seqLens i32
		nnz                   int
		err                   string
	}{
		"NnzPastIndptr":    {i32{0, 2}, i32{3}, 3, "pagetable: invalid page table: nnz = 3, want append_indptr[1] = 2"},
		"IndptrDecreases":  {i32{0, 2, 1}, i32{3, 3}, 1, "pagetable: invalid page table: ragged: malformed indptr: append_indptr decreases at request 1: append_indptr[1] = 2 > append_indptr[2] = 1"},
		"IndptrStartsAt2":  {i32{2, 3}, i32{3}, 3, "pagetable: invalid page table: ragged: malformed indptr: append_indptr[0] = 2, want 0"},
		"SeqLensMissing":   {i32{0, 1, 2}, i32{3}, 2, "pagetable: invalid page table: seq_lens has length 1, want 2 (len(append_indptr)-1)"},
		"SeqShorterThanIt": {i32{0, 1, 4}, i32{3, 2}, 4, "pagetable: invalid page table: request 1 appends 3 rows but seq_lens[1] = 2 (positions would be negative)"},
		"NoIndptr":         {i32{}, i32{}, 0, "pagetable: invalid page table: ragged: malformed indptr: append_indptr is empty, want length batch_size+1 >= 1"},
	}
	for name, tc := range bad {
		t.Run(name, func(t *testing.T) {
			b0, p0 := i32{-3}, i32{-4}
			bi, pos, err := pagetable.GetBatchIndicesPositionsTo(b0, p0, tc.appendIndptr, tc.seqLens, tc.nnz)
			require.ErrorIs(t, err, pagetable.ErrBadCSR)
			assert.EqualError(t, err, tc.err)
			assert.Equal(t, i32{-3}, bi)
			assert.Equal(t, i32{-4}, pos)
		})
	}
}

// randomCSR draws a valid page table from lengths.
func randomCSR(rng *rand.Rand, batch, pageSize, numPages int) (indptr, indices, last i32) {
	indptr = i32{0}
	for range batch {
		n := rng.IntN(5 * pageSize)
		if rng.IntN(4) == 0 {
			n = 0
		}
		np := (n + pageSize - 1) / pageSize
		for range np {
			indices = append(indices, int32(rng.IntN(numPages)))
		}
		indptr = append(indptr, int32(len(indices)))
		if n == 0 {
			last = append(last, 0)
		} else {
			last = append(last, int32((n-1)%pageSize+1))
		}
	}
	return indptr, indices, last
}

// TestCSRFunctionsAgainstSlowModels compares the three standalone functions
// with their slow twins on random valid and corrupted inputs, and checks the
// CSR -> COO round trip: the rows of each request are consecutive, its
// positions end at seq_len-1, and counting rows per request gives back the
// append indptr.
func TestCSRFunctionsAgainstSlowModels(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var seqLens, bi, pos i32
	for iter := range 3000 {
		pageSize := 1 + rng.IntN(17)
		numPages := 1 + rng.IntN(40)
		indptr, indices, last := randomCSR(rng, rng.IntN(6), pageSize, numPages)
		if iter%2 == 1 { // corrupt one value
			arrs := []i32{indptr, indices, last}
			a := arrs[rng.IntN(3)]
			if len(a) > 0 {
				a[rng.IntN(len(a))] += int32(rng.IntN(5) - 2)
			}
		}
		err := pagetable.ValidateCSR(indptr, indices, last, pageSize, numPages)
		slow := reference.CheckCSRSlow(indptr, indices, last, pageSize, numPages)
		require.Equal(t, slow == nil, err == nil, "iter %d: ValidateCSR %v, slow %v (indptr %v indices %v last %v ps %d pages %d)",
			iter, err, slow, indptr, indices, last, pageSize, numPages)
		if err != nil {
			require.ErrorIs(t, err, pagetable.ErrBadCSR)
			continue
		}
		seqLens, err = pagetable.GetSeqLensTo(seqLens, indptr, last, pageSize)
		require.NoError(t, err)
		requireInt32s(t, reference.SeqLensSlow(indptr, last, pageSize), seqLens, "iter %d: seq_lens", iter)

		// Append a random suffix of each request.
		appendIndptr := i32{0}
		for _, n := range seqLens {
			appendIndptr = append(appendIndptr, appendIndptr[len(appendIndptr)-1]+int32(rng.IntN(int(n)+1)))
		}
		nnz := int(appendIndptr[len(appendIndptr)-1])
		bi, pos, err = pagetable.GetBatchIndicesPositionsTo(bi, pos, appendIndptr, seqLens, nnz)
		require.NoError(t, err)
		wb, wp := reference.BatchIndicesPositionsSlow(appendIndptr, seqLens)
		requireInt32s(t, wb, bi, "iter %d: batch_indices", iter)
		requireInt32s(t, wp, pos, "iter %d: positions", iter)
		checkCOORoundTrip(t, appendIndptr, seqLens, bi, pos)
	}
}

func checkCOORoundTrip(t testing.TB, appendIndptr, seqLens, bi, pos i32) {
	t.Helper()
	counts := make(i32, len(seqLens))
	for i, b := range bi {
		require.True(t, b >= 0 && int(b) < len(seqLens), "row %d: batch index %d", i, b)
		require.True(t, i == 0 || bi[i-1] <= b, "row %d: batch indices not sorted", i)
		counts[b]++
		require.True(t, pos[i] >= 0 && pos[i] < seqLens[b], "row %d: position %d outside [0, %d)", i, pos[i], seqLens[b])
		if i+1 == len(bi) || bi[i+1] != b {
			require.Equal(t, seqLens[b]-1, pos[i], "row %d: last row of request %d", i, b)
		} else {
			require.Equal(t, pos[i]+1, pos[i+1], "row %d: positions not consecutive", i)
		}
	}
	back := i32{0}
	for _, c := range counts {
		back = append(back, back[len(back)-1]+c)
	}
	require.Equal(t, appendIndptr, back, "append_indptr rebuilt from batch_indices")
}

func FuzzValidateCSR(f *testing.F) {
	f.Add([]byte{}, uint8(8), uint8(9))                                      // empty request list
	f.Add([]byte{0, 0, 3, 6, 8, 0, 5, 8, 1, 6, 7, 3, 4}, uint8(8), uint8(9)) // figure-like
	f.Add([]byte{1, 1, 0, 8}, uint8(8), uint8(1))                            // last_page_len == page_size
	f.Add([]byte{2, 2, 1, 0, 1}, uint8(1), uint8(2))                         // page size 1
	f.Add([]byte{255, 255, 255, 255}, uint8(255), uint8(255))                // full pool, junk
	f.Fuzz(func(t *testing.T, data []byte, ps, np uint8) {
		// data: batch, then kv_indptr deltas (may be negative), then
		// last_page_len, then page IDs.
		if len(data) == 0 {
			data = []byte{0}
		}
		batch := int(data[0]) % 8
		data = data[1:]
		take := func() int32 {
			if len(data) == 0 {
				return 0
			}
			v := int32(int8(data[0]))
			data = data[1:]
			return v
		}
		indptr := i32{take() / 32} // mostly 0
		for range batch {
			indptr = append(indptr, indptr[len(indptr)-1]+take()%6)
		}
		last := make(i32, 0, batch)
		for range batch {
			last = append(last, take()%int32(int(ps)%20+2))
		}
		var indices i32
		for len(data) > 0 && len(indices) < 64 {
			indices = append(indices, take()%int32(int(np)+2))
		}
		pageSize, numPages := int(ps)%20, int(np)%40+1
		err := pagetable.ValidateCSR(indptr, indices, last, pageSize, numPages)
		slow := reference.CheckCSRSlow(indptr, indices, last, pageSize, numPages)
		if (err == nil) != (slow == nil) {
			t.Fatalf("ValidateCSR %v, slow %v", err, slow)
		}
		if err != nil {
			if !errors.Is(err, pagetable.ErrBadCSR) {
				t.Fatalf("error %v does not wrap ErrBadCSR", err)
			}
			return
		}
		// Accepted: the invariants hold and the derived arrays agree.
		seqLens, err := pagetable.GetSeqLensTo(nil, indptr, last, pageSize)
		if err != nil {
			t.Fatal(err)
		}
		for b := range batch {
			np := indptr[b+1] - indptr[b]
			if (np == 0) != (last[b] == 0) || last[b] > int32(pageSize) || seqLens[b] > math.MaxInt32 {
				t.Fatalf("request %d: %d pages, last %d", b, np, last[b])
			}
		}
		for _, p := range indices {
			if p < 0 || int(p) >= numPages {
				t.Fatalf("page %d accepted", p)
			}
		}
	})
}

func FuzzGetBatchIndicesPositions(f *testing.F) {
	f.Add([]byte{}, []byte{})                     // empty requests
	f.Add([]byte{4, 2, 3}, []byte{22, 20, 15})    // the figure
	f.Add([]byte{1, 2, 3, 4}, []byte{5, 5, 5, 5}) // docstring
	f.Add([]byte{0, 5, 0}, []byte{0, 5, 9})       // empty appends, prefill
	f.Add([]byte{200, 1}, []byte{100, 0})         // append longer than seq
	f.Fuzz(func(t *testing.T, appendLens, lens []byte) {
		n := min(len(appendLens), len(lens))
		appendIndptr := i32{0}
		seqLens := make(i32, n)
		for b := range n {
			appendIndptr = append(appendIndptr, appendIndptr[b]+int32(appendLens[b]))
			seqLens[b] = int32(lens[b])
		}
		nnz := int(appendIndptr[n])
		bi, pos, err := pagetable.GetBatchIndicesPositionsTo(nil, nil, appendIndptr, seqLens, nnz)
		tooLong := false
		for b := range n {
			tooLong = tooLong || appendLens[b] > lens[b]
		}
		if tooLong {
			if !errors.Is(err, pagetable.ErrBadCSR) {
				t.Fatalf("append longer than its sequence accepted: %v", err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		wb, wp := reference.BatchIndicesPositionsSlow(appendIndptr, seqLens)
		requireInt32s(t, wb, bi, "batch_indices")
		requireInt32s(t, wp, pos, "positions")
		checkCOORoundTrip(t, appendIndptr, seqLens, bi, pos)
		// Any other nnz is rejected.
		if _, _, err := pagetable.GetBatchIndicesPositionsTo(nil, nil, appendIndptr, seqLens, nnz+1); !errors.Is(err, pagetable.ErrBadCSR) {
			t.Fatalf("nnz %d accepted for append_indptr[B] = %d", nnz+1, nnz)
		}
	})
}
