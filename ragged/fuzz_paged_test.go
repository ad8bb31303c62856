package ragged

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

// FuzzPagedXFormersMask feeds xFormers' paged masks raw arrays: block tables
// of any shape (rows and columns that disagree with the batch or with the
// data), page ids negative or far out of range, negative q/kv lengths,
// padding (columns * page_size) shorter than a sequence, gappy offsets
// anywhere; and FlashInfer CSR page tables of any content for
// BlockTablesFromPagedKV. The input is
//
//	[mode, page_size, batch, rows±, cols, data±, window, (q, kv, start)..., ids...]
//
// mode%7 picks a paged kind (0-4), make_paged of a padded mask (5), or the
// CSR conversion (6). Every input that breaks a rule must be rejected with
// the sentinel of a broken rule and a message naming the bad value; every
// other must build a mask that matches the slow model (checkFamilyAgainstModels,
// which also round-trips PagedKV).
func FuzzPagedXFormersMask(f *testing.F) {
	f.Add([]byte{1, 2, 2, 0, 2, 0, 0, 1, 3, 0, 2, 4, 0, 2, 0, 1, 3}) // the worked causal example
	f.Add([]byte{2, 16, 1, 0, 3, 0, 8, 1, 40, 0, 5, 0, 7})           // sliding window
	f.Add([]byte{3, 2, 2, 0, 2, 0, 0, 1, 2, 1, 1, 2, 1, 3, 1, 0, 2}) // paged gappy
	f.Add([]byte{0, 2, 2, 1, 2, 0, 0, 1, 1, 0, 1, 1, 0, 0, 1, 2, 3}) // a row too many (ignored, as in xFormers)
	f.Add([]byte{0, 2, 1, 0, 2, 1, 0, 1, 9, 0, 0, 1})                // padding shorter than the sequence, data too long
	f.Add([]byte{1, 2, 1, 0, 1, 0, 0, 1, 1, 0, 0x80})                // a far page id
	f.Add([]byte{4, 2, 1, 0, 2, 0, 0, 0xff, 1, 0, 0, 1})             // a negative q_seqlen
	f.Add([]byte{5, 2, 2, 0, 2, 0, 0, 1, 3, 0, 2, 4, 0, 2, 0, 1, 3}) // make_paged
	f.Add([]byte{6, 2, 3, 0, 0, 0, 0, 0, 3, 3, 5, 1, 0, 2, 7, 2, 4, 0, 9})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &byteReader{data}
		mode := int(r.next() % 7)
		ps := int(int8(r.next())) % 17
		batch := int(r.next() % 5)
		if mode == 6 {
			fuzzPagedKV(t, r, ps, batch)
			return
		}
		rows := batch + int(int8(r.next()))%2
		cols := int(r.next() % 5)
		n := max(0, rows*cols+int(int8(r.next()))%2)
		window := int(int8(r.next())) % 12
		kind := []MaskKind{KindPagedBlockDiagonalPaddedKeys, KindPagedBlockDiagonalCausalWithOffsetPaddedKeys,
			KindPagedBlockDiagonalCausalLocalPaddedKeys, KindPagedBlockDiagonalGappyKeys,
			KindPagedBlockDiagonalCausalWithOffsetGappyKeys, KindPagedBlockDiagonalCausalWithOffsetPaddedKeys}[mode]
		gappy := mode == 3 || mode == 4
		cfg := MaskConfig{Kind: kind, QSeqLen: make([]int32, batch), KVSeqLen: make([]int32, batch), PageSize: ps}
		if gappy {
			cfg.KVSeqStarts = make([]int32, batch)
		}
		if kind == KindPagedBlockDiagonalCausalLocalPaddedKeys {
			cfg.WindowSize = window
		}
		for b := 0; b < batch; b++ {
			cfg.QSeqLen[b] = int32(int8(r.next())) % 9
			cfg.KVSeqLen[b] = int32(int8(r.next())) % 40
			start := int32(int8(r.next())) % 40
			if gappy {
				cfg.KVSeqStarts[b] = start
			}
		}
		cfg.BlockTables = BlockTables{Rows: rows, Cols: cols, Data: make([]int32, n)}
		for k := range cfg.BlockTables.Data {
			id := int32(int8(r.next()))
			if id == math.MinInt8 && ps >= 2 {
				id = 1 << 30 // (id+1)*page_size beyond int32
			}
			cfg.BlockTables.Data[k] = id
		}

		broken := pagedRulesBroken(cfg, rows, cols, n)
		var m AttentionMask
		var err error
		if mode == 5 {
			// make_paged of a padded mask whose own padding fits every key.
			pad := 1
			for _, kv := range cfg.KVSeqLen {
				pad = max(pad, int(kv))
			}
			var u BlockDiagonalCausalWithOffsetPaddedKeysMask
			u, err = BlockDiagonalCausalWithOffsetPaddedKeysMaskFromSeqlens(cfg.QSeqLen, pad, cfg.KVSeqLen)
			if err == nil {
				m, err = u.MakePaged(cfg.BlockTables, ps, kind)
			}
		} else {
			m, err = NewAttentionMask(cfg)
		}
		if len(broken) > 0 {
			if err == nil {
				t.Fatalf("%+v breaks %v but was accepted", cfg, broken)
			}
			for _, b := range broken {
				if errors.Is(err, b.sentinel) && strings.Contains(err.Error(), b.value) {
					return
				}
			}
			t.Fatalf("%+v: error %q names none of the broken rules %v", cfg, err, broken)
		}
		if err != nil {
			t.Fatalf("%+v: %v", cfg, err)
		}
		if m.Kind() != kind {
			t.Fatalf("built %s, want %s", m.Kind(), kind)
		}
		if rows, cols := m.Shape(); rows*cols > 1<<16 {
			return // keep each run fast; the rules above still held
		}
		checkFamilyAgainstModels(t, cfg)
	})
}

type brokenRule struct {
	sentinel error
	value    string // appears in the error message
}

func (b brokenRule) String() string { return fmt.Sprintf("%v(%s)", b.sentinel, b.value) }

// pagedRulesBroken restates the paged masks' preconditions (xFormers' and
// ours) independently of the implementation.
func pagedRulesBroken(cfg MaskConfig, rows, cols, n int) []brokenRule {
	var out []brokenRule
	add := func(s error, format string, args ...any) {
		out = append(out, brokenRule{s, fmt.Sprintf(format, args...)})
	}
	batch := len(cfg.QSeqLen)
	ps := cfg.PageSize
	if batch == 0 {
		add(ErrLengthMismatch, "empty batch")
	}
	for b := 0; b < batch; b++ {
		if cfg.QSeqLen[b] < 0 {
			add(ErrNegativeLength, "q_seqlen %d", cfg.QSeqLen[b])
		}
		if cfg.KVSeqLen[b] < 0 {
			add(ErrNegativeLength, "kv_seqlen %d", cfg.KVSeqLen[b])
		}
	}
	if ps < 1 {
		add(ErrNegativeLength, "page_size = %d", ps)
	}
	if rows*cols != n {
		add(ErrLengthMismatch, "its %d entries", n)
	}
	if rows < batch {
		add(ErrLengthMismatch, "has %d rows", rows)
	}
	if cols < 1 {
		add(ErrNegativeLength, "has %d columns", cols)
	}
	maxID := -1
	for k, id := range cfg.BlockTables.Data {
		if id < 0 {
			add(ErrOutOfRange, "block_tables[%d][%d] = %d", k/max(cols, 1), k%max(cols, 1), id)
		}
		maxID = max(maxID, int(id))
	}
	if ps >= 1 && int64(maxID+1)*int64(ps) > math.MaxInt32 {
		add(ErrOutOfRange, "page id %d", maxID)
	}
	rowLen := cols * ps
	for b := 0; b < batch; b++ {
		start := 0
		if cfg.KVSeqStarts != nil {
			start = int(cfg.KVSeqStarts[b])
			if start < 0 || start >= rowLen {
				add(ErrOutOfRange, "starts at key %d", start)
			}
		}
		if cfg.KVSeqLen[b] >= 0 && start+int(cfg.KVSeqLen[b]) > rowLen {
			add(ErrOutOfRange, "keys up to %d", start+int(cfg.KVSeqLen[b]))
		}
	}
	return out
}

// fuzzPagedKV: raw kv_indptr, kv_indices, kv_last_page_len for
// BlockTablesFromPagedKV. Accepted tables must hold each request's pages
// then pad, and ToPagedKV must give back the same arrays; rejected input
// must break one of FlashInfer's or block_tables' rules.
func fuzzPagedKV(t *testing.T, r *byteReader, ps, batch int) {
	cols := int(r.next() % 6)
	pad := int32(int8(r.next()))
	indptr := make([]int32, batch+1)
	for i := range indptr {
		indptr[i] = int32(int8(r.next())) % 9
	}
	nIdx := int(r.next() % 12)
	indices := make([]int32, nIdx)
	for i := range indices {
		indices[i] = int32(int8(r.next()))
	}
	last := make([]int32, batch)
	for i := range last {
		last[i] = int32(int8(r.next())) % 18
	}
	valid := ps >= 1 && indptr[0] == 0 && int(indptr[batch]) == nIdx && pad >= 0
	most := 1
	for b := 0; b < batch && valid; b++ {
		pages := indptr[b+1] - indptr[b]
		valid = pages >= 0 && (pages == 0 && last[b] == 0 || pages > 0 && last[b] >= 1 && int(last[b]) <= ps)
		most = max(most, int(pages))
	}
	valid = valid && (cols == 0 || cols >= most)
	for _, id := range indices {
		valid = valid && id >= 0
	}
	tables, kvLen, err := BlockTablesFromPagedKV(indptr, indices, last, ps, cols, pad)
	if !valid {
		if err == nil {
			t.Fatalf("BlockTablesFromPagedKV(%v, %v, %v, %d, %d, %d) accepted invalid input", indptr, indices, last, ps, cols, pad)
		}
		for _, s := range []error{ErrBadIndptr, ErrNegativeLength, ErrLengthMismatch, ErrBadLastPageLen, ErrOutOfRange, ErrTooLarge} {
			if errors.Is(err, s) {
				return
			}
		}
		t.Fatalf("error %v wraps no sentinel", err)
	}
	if err != nil {
		t.Fatalf("BlockTablesFromPagedKV(%v, %v, %v, %d, %d, %d): %v", indptr, indices, last, ps, cols, pad, err)
	}
	if cols == 0 {
		cols = most
	}
	if tables.Rows != batch || tables.Cols != cols {
		t.Fatalf("tables %d×%d, want %d×%d", tables.Rows, tables.Cols, batch, cols)
	}
	for b := 0; b < batch; b++ {
		pages := indices[indptr[b]:indptr[b+1]]
		row := tables.Row(b)
		if !slices.Equal(row[:len(pages)], pages) || slices.ContainsFunc(row[len(pages):], func(x int32) bool { return x != pad }) {
			t.Fatalf("row %d = %v, want %v then %d", b, row, pages, pad)
		}
	}
	gotIndptr, gotIdx, gotLast, err := tables.ToPagedKV(kvLen, ps)
	if err != nil {
		t.Fatalf("ToPagedKV: %v", err)
	}
	if !slices.Equal(gotIndptr, indptr) || !slices.Equal(gotIdx, indices) || !slices.Equal(gotLast, last) {
		t.Fatalf("round trip: %v %v %v, want %v %v %v", gotIndptr, gotIdx, gotLast, indptr, indices, last)
	}
}
