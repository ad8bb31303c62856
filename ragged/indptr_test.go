package ragged

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestValidateIndptr(t *testing.T) {
	tests := map[string]struct {
		indptr  []int32
		nnz     int
		wantErr string // "" = valid
	}{
		"three requests":      {[]int32{0, 3, 3, 5}, 5, ""},
		"empty batch":         {[]int32{0}, 0, ""},
		"nil":                 {nil, 0, "indptr is empty"},
		"does not start at 0": {[]int32{1, 3}, 3, "indptr[0] = 1, want 0"},
		"decreasing":          {[]int32{0, 4, 2, 5}, 5, "decreases at request 1"},
		"wrong nnz":           {[]int32{0, 2, 4}, 5, "indptr[2] = 4, want nnz = 5"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := ValidateIndptr(tc.indptr, tc.nnz)
			if tc.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorIs(t, err, ErrBadIndptr)
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestLengthsAndPrefixSums(t *testing.T) {
	indptr := []int32{0, 3, 3, 5}
	lens, err := Lengths(indptr)
	require.NoError(t, err)
	assert.Equal(t, []int32{3, 0, 2}, lens)
	back, err := IndptrFromLengths(lens)
	require.NoError(t, err)
	assert.Equal(t, indptr, back)
	m, err := MaxLength(indptr)
	require.NoError(t, err)
	assert.Equal(t, 3, m)

	dst := make([]int32, 3)
	require.NoError(t, LengthsTo(dst, indptr))
	assert.Equal(t, lens, dst)
	assert.ErrorIs(t, LengthsTo(make([]int32, 2), indptr), ErrLengthMismatch)
	dst4 := make([]int32, 4)
	require.NoError(t, IndptrFromLengthsTo(dst4, lens))
	assert.Equal(t, indptr, dst4)

	_, err = IndptrFromLengths([]int32{2, -1})
	assert.ErrorIs(t, err, ErrNegativeLength)
	assert.ErrorContains(t, err, "lens[1] = -1")
	_, err = IndptrFromLengths([]int32{math.MaxInt32, 1})
	assert.ErrorIs(t, err, ErrTooLarge)
}

func TestSlice(t *testing.T) {
	// NHD keys, [nnz=5, H*D=2]: request 0 has 3 rows, 1 none, 2 has 2.
	data := []float32{0, 1, 10, 11, 20, 21, 30, 31, 40, 41}
	indptr := []int32{0, 3, 3, 5}
	want := [][]float32{{0, 1, 10, 11, 20, 21}, {}, {30, 31, 40, 41}}
	for i, w := range want {
		got, err := Slice(data, indptr, i, 2)
		require.NoError(t, err)
		assert.Equal(t, w, got, "request %d", i)
	}
	_, err := Slice(data, indptr, 3, 2)
	assert.ErrorIs(t, err, ErrOutOfRange)
	_, err = Slice(data[:8], indptr, 2, 2)
	assert.ErrorIs(t, err, ErrLengthMismatch)
	assert.ErrorContains(t, err, "request 2 ends at row 5, data has 4 rows")
	_, err = Slice(data, []int32{0, 3, 2}, 1, 2)
	assert.ErrorIs(t, err, ErrBadIndptr)
}

func TestCSRToCOO(t *testing.T) {
	indptr := []int32{0, 3, 3, 5}
	bi, pos, err := CSRToCOO(indptr)
	require.NoError(t, err)
	assert.Equal(t, []int32{0, 0, 0, 2, 2}, bi)
	assert.Equal(t, []int32{0, 1, 2, 0, 1}, pos)
	back, err := COOToCSR(bi, pos, 3)
	require.NoError(t, err)
	assert.Equal(t, indptr, back)
	back, err = COOToCSR(bi, nil, 4) // a trailing empty request
	require.NoError(t, err)
	assert.Equal(t, []int32{0, 3, 3, 5, 5}, back)

	tests := map[string]struct {
		bi, pos []int32
		batch   int
		wantErr error
		msg     string
	}{
		"unsorted":         {[]int32{0, 1, 0}, nil, 2, ErrNotSorted, "batch_indices[2] = 0 < batch_indices[1] = 1"},
		"out of range":     {[]int32{0, 2}, nil, 2, ErrOutOfRange, "batch_indices[1] = 2, batch size 2"},
		"negative":         {[]int32{-1}, nil, 2, ErrOutOfRange, "batch_indices[0] = -1"},
		"position gap":     {[]int32{0, 0, 1}, []int32{0, 2, 0}, 2, ErrNotSorted, "positions[1] = 2 for request 0, want 1"},
		"position restart": {[]int32{0, 1, 1}, []int32{0, 1, 1}, 2, ErrNotSorted, "positions[1] = 1 for request 1, want 0"},
		"length mismatch":  {[]int32{0, 0}, []int32{0}, 1, ErrLengthMismatch, "positions has length 1"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dst := []int32{7, 7, 7}
			_, err := COOToCSR(tc.bi, tc.pos, tc.batch)
			assert.ErrorIs(t, err, tc.wantErr)
			assert.ErrorContains(t, err, tc.msg)
			assert.ErrorIs(t, COOToCSRTo(dst, tc.bi, tc.pos), tc.wantErr)
			assert.Equal(t, []int32{7, 7, 7}, dst, "a failed call writes nothing")
		})
	}
}

func TestPaddedRaggedPicture(t *testing.T) {
	// Two requests of lengths 2 and 1, one element per row, padded to 3.
	src := []string{"a0", "a1", "b0"}
	indptr := []int32{0, 2, 3}
	padded := make([]string, 2*3)
	require.NoError(t, RaggedToPadded(padded, src, indptr, 3, 1, "_"))
	assert.Equal(t, []string{
		"a0", "a1", "_",
		"b0", "_", "_",
	}, padded)
	back := make([]string, 3)
	require.NoError(t, PaddedToRagged(back, padded, indptr, 3, 1))
	assert.Equal(t, src, back)

	err := RaggedToPadded(padded, src, indptr, 1, 1, "_")
	assert.ErrorIs(t, err, ErrOutOfRange)
	assert.ErrorContains(t, err, "request 0 has length 2 > maxLen 1")
	err = RaggedToPadded(padded[:5], src, indptr, 3, 1, "_")
	assert.ErrorIs(t, err, ErrLengthMismatch)
	err = PaddedToRagged(back, padded, indptr, 3, 0)
	assert.ErrorIs(t, err, ErrNegativeLength)
	err = RaggedToPadded(padded, src, indptr, math.MaxInt/2, 4, "_")
	assert.ErrorIs(t, err, ErrTooLarge)
}

// Round trips on random ragged tensors: lengths ⇄ indptr, CSR ⇄ COO, and
// ragged → padded → ragged (identity) and padded → ragged → padded (identity
// on rows, pad elsewhere).
func TestRaggedRoundTripsRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for iter := 0; iter < 1000; iter++ {
		indptr := randomIndptr(r, r.IntN(7), 6)
		checkIndptrRoundTrips(t, indptr, 1+r.IntN(3), r.IntN(3))
	}
}

func checkIndptrRoundTrips(t testing.TB, indptr []int32, width, extraPad int) {
	if err := ValidateIndptr(indptr, int(indptr[len(indptr)-1])); err != nil {
		t.Fatalf("ValidateIndptr(%v): %v", indptr, err)
	}
	lens, err := Lengths(indptr)
	if err != nil {
		t.Fatal(err)
	}
	back, err := IndptrFromLengths(lens)
	if err != nil || !equalInt32(back, indptr) {
		t.Fatalf("IndptrFromLengths(Lengths(%v)) = %v, %v", indptr, back, err)
	}
	bi, pos, err := CSRToCOO(indptr)
	if err != nil {
		t.Fatal(err)
	}
	// The COO model: row k belongs to the b with indptr[b] <= k < indptr[b+1].
	for k := range bi {
		b := bi[k]
		if !(indptr[b] <= int32(k) && int32(k) < indptr[b+1]) || pos[k] != int32(k)-indptr[b] {
			t.Fatalf("CSRToCOO(%v): row %d -> (%d, %d)", indptr, k, b, pos[k])
		}
	}
	back, err = COOToCSR(bi, pos, len(indptr)-1)
	if err != nil || !equalInt32(back, indptr) {
		t.Fatalf("COOToCSR(CSRToCOO(%v)) = %v, %v", indptr, back, err)
	}

	maxLen, err := MaxLength(indptr)
	if err != nil {
		t.Fatal(err)
	}
	maxLen += extraPad
	nnz := int(indptr[len(indptr)-1])
	src := make([]int, nnz*width)
	for i := range src {
		src[i] = i + 1
	}
	batch := len(indptr) - 1
	padded := make([]int, batch*maxLen*width)
	if err := RaggedToPadded(padded, src, indptr, maxLen, width, -1); err != nil {
		t.Fatal(err)
	}
	for b := 0; b < batch; b++ {
		for p := 0; p < maxLen; p++ {
			for e := 0; e < width; e++ {
				want := -1
				if p < int(indptr[b+1]-indptr[b]) {
					want = (int(indptr[b])+p)*width + e + 1
				}
				if got := padded[(b*maxLen+p)*width+e]; got != want {
					t.Fatalf("RaggedToPadded(%v): [%d,%d,%d] = %d, want %d", indptr, b, p, e, got, want)
				}
			}
		}
	}
	ragged := make([]int, nnz*width)
	if err := PaddedToRagged(ragged, padded, indptr, maxLen, width); err != nil {
		t.Fatal(err)
	}
	for i := range src {
		if ragged[i] != src[i] {
			t.Fatalf("PaddedToRagged(RaggedToPadded(x)) != x for indptr %v at %d", indptr, i)
		}
	}
}
