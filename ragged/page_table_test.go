package ragged

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestValidatePageTable(t *testing.T) {
	type i32 = []int32
	strict := PageTableCheck{PageSize: 4, NumPages: 8}
	loose := PageTableCheck{PageSize: 4, NumPages: 8, IndicesMayBeLonger: true, LastPageLenOptional: true}
	for name, c := range map[string]struct {
		indptr, indices, last i32
		check                 PageTableCheck
		kind                  error // nil: valid
		msg                   string
	}{
		// Request 0: pages 3, 5 (6 tokens); request 1: none; request 2: page 0 (4 tokens).
		"valid":                 {i32{0, 2, 2, 3}, i32{3, 5, 0}, i32{2, 0, 4}, strict, nil, ""},
		"valid, longer indices": {i32{0, 1}, i32{3, -1}, i32{1}, loose, nil, ""},
		"valid, no last":        {i32{0, 1}, i32{3}, nil, loose, nil, ""},
		"valid, no pool":        {i32{0, 1}, i32{math.MaxInt32}, i32{1}, PageTableCheck{PageSize: 1, NumPages: AnyPageID}, nil, ""},
		"page size 0":           {i32{0}, nil, i32{}, PageTableCheck{NumPages: 8}, ErrNegativeLength, "page_size = 0, want >= 1"},
		"empty indptr":          {nil, nil, nil, strict, ErrBadIndptr, "kv_indptr is empty"},
		"indptr from 1":         {i32{1, 2}, i32{0, 1}, i32{1}, strict, ErrBadIndptr, "kv_indptr[0] = 1, want 0"},
		"indptr wraps":          {i32{0, math.MaxInt32, -5}, i32{}, i32{1, 1}, strict, ErrBadIndptr, "kv_indptr decreases at request 1: kv_indptr[1] = 2147483647 > kv_indptr[2] = -5"},
		"last missing":          {i32{0, 1}, i32{0}, nil, strict, ErrLengthMismatch, "kv_last_page_len has length 0, want 1"},
		"last short, optional":  {i32{0, 1, 2}, i32{0, 1}, i32{1}, loose, ErrLengthMismatch, "kv_last_page_len has length 1, want 2"},
		"last 0 with pages":     {i32{0, 1}, i32{0}, i32{0}, strict, ErrBadLastPageLen, "request 0: kv_last_page_len[0] = 0, want 1..4 (page_size)"},
		"last past page":        {i32{0, 1}, i32{0}, i32{5}, strict, ErrBadLastPageLen, "request 0: kv_last_page_len[0] = 5, want 1..4 (page_size)"},
		"last without pages":    {i32{0, 1, 1}, i32{0}, i32{1, 2}, strict, ErrBadLastPageLen, "request 1 has 0 pages but kv_last_page_len[1] = 2, want 0"},
		"seq_len past int32": {i32{0, 1 << 16}, make(i32, 1<<16), i32{1 << 15}, PageTableCheck{PageSize: 1 << 15, NumPages: 1}, ErrTooLarge,
			"request 0: seq_len of 65536 pages of 32768 tokens (the last 32768) exceeds 2147483647 (int32)"},
		"seq_len int32 max": {i32{0, 1 << 16}, make(i32, 1<<16), i32{1<<15 - 1}, PageTableCheck{PageSize: 1 << 15, NumPages: 1}, nil, ""},
		"too few indices":   {i32{0, 2}, i32{0}, i32{1}, loose, ErrBadIndptr, "kv_indptr[1] = 2 but kv_indices has length 1"},
		"too many indices":  {i32{0, 1}, i32{0, 1}, i32{1}, strict, ErrBadIndptr, "kv_indptr[1] = 1 but kv_indices has length 2"},
		"negative pool":     {i32{0}, nil, i32{}, PageTableCheck{PageSize: 4, NumPages: -1}, ErrNegativeLength, "num_pages = -1 is negative"},
		"page past pool":    {i32{0, 1, 3}, i32{0, 2, 8}, i32{1, 1}, strict, ErrOutOfRange, "request 1: kv_indices[2] = 8 outside the pool [0, 8)"},
		"negative page":     {i32{0, 0, 2}, i32{1, -1}, i32{0, 1}, strict, ErrOutOfRange, "request 1: kv_indices[1] = -1 outside the pool [0, 8)"},
	} {
		t.Run(name, func(t *testing.T) {
			err := ValidatePageTable(c.indptr, c.indices, c.last, c.check)
			if c.kind == nil {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrBadPageTable)
			assert.ErrorIs(t, err, c.kind)
			assert.ErrorContains(t, err, "invalid page table: "+c.msg)
			var pe *PageTableError
			require.True(t, errors.As(err, &pe))
			assert.Equal(t, c.kind, pe.Kind)
		})
	}
}

// The lengths-only half accepts what ValidatePageTable does without
// kv_indices and computes FlashInfer's get_length.
func TestValidatePagedKVLens(t *testing.T) {
	indptr, last := []int32{0, 2, 2, 3}, []int32{2, 0, 4}
	require.NoError(t, ValidatePagedKVLens(indptr, last, 4))
	var lens []int32
	for b := range last {
		lens = append(lens, PagedKVLen(indptr, last, 4, b))
	}
	assert.Equal(t, []int32{6, 0, 4}, lens)
	assert.ErrorIs(t, ValidatePagedKVLens(indptr, nil, 4), ErrLengthMismatch, "kv_last_page_len is required")
}

// Every backend op validates its table: a valid one costs no allocation.
func TestValidatePageTableDoesNotAllocate(t *testing.T) {
	indptr, indices, last := []int32{0, 2, 2, 3}, []int32{3, 5, 0, 7}, []int32{2, 0, 4}
	check := PageTableCheck{PageSize: 4, NumPages: 8, IndicesMayBeLonger: true}
	allocs := testing.AllocsPerRun(100, func() {
		if err := ValidatePageTable(indptr, indices, last, check); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs)
}
