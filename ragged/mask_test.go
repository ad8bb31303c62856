package ragged

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMaskIndptrRaggedAndPaged(t *testing.T) {
	// Ragged: qo_len [2,1,3], kv_len [7,0,4].
	qoIndptr := []int32{0, 2, 3, 6}
	kvIndptr := []int32{0, 7, 7, 11}
	got, err := MaskIndptr(qoIndptr, kvIndptr)
	require.NoError(t, err)
	assert.Equal(t, []int32{0, 14, 14, 26}, got)

	// The same kv lengths from a page table with page_size 4: request 0 has
	// 2 pages (4 + 3), request 1 none, request 2 one full page.
	paged, err := PagedMaskIndptr(qoIndptr, []int32{0, 2, 2, 3}, []int32{3, 0, 4}, 4)
	require.NoError(t, err)
	assert.Equal(t, got, paged)

	fromLens, err := MaskIndptrFromLens([]int32{2, 1, 3}, []int32{7, 0, 4})
	require.NoError(t, err)
	assert.Equal(t, got, fromLens)

	bytes, err := SegmentPackedIndptr(got)
	require.NoError(t, err)
	assert.Equal(t, []int32{0, 2, 2, 4}, bytes) // ceil(14/8)=2, 0, ceil(12/8)=2
}

func TestMaskIndptrErrors(t *testing.T) {
	tests := map[string]struct {
		err     error
		wantErr error
		msg     string
	}{
		"qo/kv batch mismatch": {
			err:     func() error { _, err := MaskIndptr([]int32{0, 1}, []int32{0, 1, 2}); return err }(),
			wantErr: ErrLengthMismatch, msg: "qo_indptr has length 2, kv_indptr 3"},
		"bad kv_indptr": {
			err:     func() error { _, err := MaskIndptr([]int32{0, 1}, []int32{0, -1}); return err }(),
			wantErr: ErrBadIndptr, msg: "kv_indptr decreases at request 0"},
		"negative length": {
			err:     func() error { _, err := MaskIndptrFromLens([]int32{1, -2}, []int32{1, 1}); return err }(),
			wantErr: ErrNegativeLength, msg: "request 1 has qo_len -2"},
		"beyond int32": {
			err:     func() error { _, err := MaskIndptrFromLens([]int32{50000}, []int32{50000}); return err }(),
			wantErr: ErrTooLarge, msg: "2500000000 bits at request 0"},
		"last page too long": {
			err:     func() error { _, err := PagedMaskIndptr([]int32{0, 1}, []int32{0, 1}, []int32{5}, 4); return err }(),
			wantErr: ErrBadLastPageLen, msg: "request 0: kv_last_page_len[0] = 5, want 1..4"},
		"last page zero with pages": {
			err:     func() error { _, err := PagedMaskIndptr([]int32{0, 1}, []int32{0, 1}, []int32{0}, 4); return err }(),
			wantErr: ErrBadLastPageLen, msg: "want 1..4"},
		"empty request with last page": {
			err:     func() error { _, err := PagedMaskIndptr([]int32{0, 1}, []int32{0, 0}, []int32{2}, 4); return err }(),
			wantErr: ErrBadLastPageLen, msg: "request 0 has 0 pages but kv_last_page_len[0] = 2, want 0"},
		"last_page_len length": {
			err:     func() error { _, err := PagedMaskIndptr([]int32{0, 1}, []int32{0, 1}, []int32{1, 1}, 4); return err }(),
			wantErr: ErrLengthMismatch, msg: "kv_last_page_len has length 2"},
		"page size": {
			err:     func() error { _, err := PagedMaskIndptr([]int32{0, 1}, []int32{0, 1}, []int32{1}, 0); return err }(),
			wantErr: ErrNegativeLength, msg: "page_size = 0"},
		"custom mask too short": {
			err: func() error {
				_, _, err := PackCustomMask(make([]byte, 5), []int32{0, 2}, []int32{0, 3})
				return err
			}(),
			wantErr: ErrMaskSize, msg: "custom_mask has 5 elements, sum(qo_len*kv_len) = 6"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			require.ErrorIs(t, tc.err, tc.wantErr)
			assert.ErrorContains(t, tc.err, tc.msg)
		})
	}
}

func TestPackedMaskValidation(t *testing.T) {
	qo, kv := []int32{3, 1, 2}, []int32{4, 5, 3}
	packed := []byte{195, 3, 4, 42}
	require.NoError(t, ValidatePackedMask(packed, []int32{0, 2, 3, 4}, qo, kv))

	err := ValidatePackedMask(packed, []int32{0, 1, 2, 3}, qo, kv) // bit offsets passed as bytes
	assert.ErrorIs(t, err, ErrMaskSize)
	assert.ErrorContains(t, err, "request 0 (qo_len 3, kv_len 4) has 1 bytes, want 2")
	err = ValidatePackedMask(packed[:3], []int32{0, 2, 3, 4}, qo, kv)
	assert.ErrorIs(t, err, ErrMaskSize)
	assert.ErrorContains(t, err, "ends at byte 4, packed mask has 3")
	err = ValidatePackedMask(packed, []int32{0, 2, 3}, qo, kv)
	assert.ErrorIs(t, err, ErrLengthMismatch)

	_, err = MaskBit(packed, []int32{0, 2, 3, 4}, qo, kv, 1, 1, 0)
	assert.ErrorIs(t, err, ErrOutOfRange)
	assert.ErrorContains(t, err, "request 1 (qo_len 1, kv_len 5) has no (qo 1, kv 0)")
	_, err = MaskBit(packed, []int32{0, 2, 3, 4}, qo, kv, 3, 0, 0)
	assert.ErrorIs(t, err, ErrOutOfRange)
	_, err = MaskBit(packed, []int32{0, 12, 17, 23}, qo, kv, 0, 0, 0) // bit indptr by mistake
	assert.ErrorIs(t, err, ErrMaskSize)
}
