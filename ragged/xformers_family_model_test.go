package ragged

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// The slow model of the whole family, written the way attn_bias.py builds
// masks (and sharing no code with the package): a block is ones(q, kv) cut
// by tril/triu diagonals relative to shift = kv-q (0 for the top-left
// classes); blocks are pasted into an all-masked matrix at their key
// columns; a paged mask is first materialised unpaged with a padding of
// block_tables.shape[1]*page_size and then copied page by page, in
// block_tables order, onto the physical pages.

// familyBlock is _create_block_mask / _materialize_causal_mask /
// _apply_locality_on_mask for one block.
func familyBlock(cfg MaskConfig, q, kv int) [][]bool {
	shift := kv - q
	blk := make([][]bool, q)
	for i := range blk {
		blk[i] = make([]bool, kv)
		for j := range blk[i] {
			d := j - i
			var keep bool
			switch cfg.Kind {
			case KindBlockDiagonal, KindBlockDiagonalPaddedKeys, KindPagedBlockDiagonalPaddedKeys,
				KindBlockDiagonalGappyKeys, KindPagedBlockDiagonalGappyKeys:
				keep = true
			case KindBlockDiagonalCausal, KindLowerTriangular:
				keep = d <= 0
			case KindBlockDiagonalCausalFromBottomRight, KindBlockDiagonalCausalWithOffsetPaddedKeys,
				KindPagedBlockDiagonalCausalWithOffsetPaddedKeys, KindBlockDiagonalCausalWithOffsetGappyKeys,
				KindPagedBlockDiagonalCausalWithOffsetGappyKeys, KindLowerTriangularFromBottomRight:
				keep = d <= shift
			case KindBlockDiagonalCausalLocal:
				keep = d <= 0 && d >= -cfg.WindowSize+1
			case KindBlockDiagonalCausalLocalFromBottomRight, KindBlockDiagonalCausalLocalPaddedKeys,
				KindPagedBlockDiagonalCausalLocalPaddedKeys, KindLowerTriangularFromBottomRightLocal:
				keep = d <= shift && d >= shift-cfg.WindowSize+1
			case KindBlockDiagonalLocalPaddedKeys, KindBlockDiagonalLocalFromBottomRightGappyKeys, KindLocalAttentionFromBottomRight:
				keep = d >= shift-cfg.WindowLeft && d <= shift+cfg.WindowRight
			default:
				panic(cfg.Kind)
			}
			blk[i][j] = keep
		}
	}
	return blk
}

func isPagedKind(k MaskKind) bool {
	switch k {
	case KindPagedBlockDiagonalPaddedKeys, KindPagedBlockDiagonalCausalWithOffsetPaddedKeys, KindPagedBlockDiagonalCausalLocalPaddedKeys,
		KindPagedBlockDiagonalGappyKeys, KindPagedBlockDiagonalCausalWithOffsetGappyKeys:
		return true
	}
	return false
}

// modelFamily materialises cfg (which must be valid).
func modelFamily(cfg MaskConfig) Dense {
	batch := len(cfg.QSeqLen)
	rows := 0
	for _, q := range cfg.QSeqLen {
		rows += int(q)
	}
	// Key column of block b's key 0, and the axis length, unpaged.
	colOf := make([]int, batch)
	cols := 0
	switch {
	case isPagedKind(cfg.Kind):
		rowLen := cfg.BlockTables.Cols * cfg.PageSize
		for b := range colOf {
			colOf[b] = b * rowLen
			if cfg.KVSeqStarts != nil {
				colOf[b] += int(cfg.KVSeqStarts[b])
			}
		}
		cols = batch * rowLen
	case cfg.KVPadding > 0:
		for b := range colOf {
			colOf[b] = b * cfg.KVPadding
		}
		cols = batch * cfg.KVPadding
	case cfg.KVSeqStarts != nil:
		for b := range colOf {
			colOf[b] = int(cfg.KVSeqStarts[b])
		}
		cols = int(cfg.KVSeqStarts[batch])
	default:
		for b := range colOf {
			colOf[b] = cols
			cols += int(cfg.KVSeqLen[b])
		}
	}
	logical := Dense{Rows: rows, Cols: cols, Allowed: make([]bool, rows*cols)}
	r0 := 0
	for b := 0; b < batch; b++ {
		q, kv := int(cfg.QSeqLen[b]), int(cfg.KVSeqLen[b])
		blk := familyBlock(cfg, q, kv)
		for i := 0; i < q; i++ {
			for j := 0; j < kv; j++ {
				logical.Allowed[(r0+i)*cols+colOf[b]+j] = blk[i][j]
			}
		}
		r0 += q
	}
	if !isPagedKind(cfg.Kind) {
		return logical
	}
	ps, bt := cfg.PageSize, cfg.BlockTables
	maxID := 0
	for _, id := range bt.Data {
		maxID = max(maxID, int(id))
	}
	phys := Dense{Rows: rows, Cols: (maxID + 1) * ps, Allowed: make([]bool, rows*(maxID+1)*ps)}
	r0 = 0
	for b := 0; b < batch; b++ {
		for i := r0; i < r0+int(cfg.QSeqLen[b]); i++ {
			for l := 0; l < bt.Cols; l++ {
				p := int(bt.Data[b*bt.Cols+l])
				for t := 0; t < ps; t++ {
					phys.Allowed[i*phys.Cols+p*ps+t] = logical.Allowed[i*cols+b*bt.Cols*ps+l*ps+t]
				}
			}
		}
		r0 += int(cfg.QSeqLen[b])
	}
	return phys
}

// familyFlashBlocks returns the per-request masks in FlashInfer's view:
// [q, kv] per block, or [q, start+kv] for the paged gappy kinds with the
// first start keys masked.
func familyFlashBlocks(cfg MaskConfig) (blocks [][][]bool, kvLens []int32) {
	for b := range cfg.QSeqLen {
		q, kv := int(cfg.QSeqLen[b]), int(cfg.KVSeqLen[b])
		off := 0
		if isPagedKind(cfg.Kind) && cfg.KVSeqStarts != nil {
			off = int(cfg.KVSeqStarts[b])
		}
		blk := familyBlock(cfg, q, kv)
		out := make([][]bool, q)
		for i := range out {
			out[i] = make([]bool, off+kv)
			copy(out[i][off:], blk[i])
		}
		blocks = append(blocks, out)
		kvLens = append(kvLens, int32(off+kv))
	}
	return blocks, kvLens
}

// randomFamilyConfig draws a valid configuration of kind.
func randomFamilyConfig(r *rand.Rand, kind MaskKind) MaskConfig {
	batch := 1 + r.IntN(4)
	cfg := MaskConfig{Kind: kind}
	switch kind {
	case KindLowerTriangular, KindLowerTriangularFromBottomRight, KindLowerTriangularFromBottomRightLocal, KindLocalAttentionFromBottomRight:
		batch = 1
	}
	cfg.QSeqLen, cfg.KVSeqLen = make([]int32, batch), make([]int32, batch)
	for b := range cfg.QSeqLen {
		cfg.QSeqLen[b] = int32(r.IntN(6))
	}
	switch kind {
	case KindLowerTriangularFromBottomRightLocal:
		cfg.WindowSize = 1 + r.IntN(6)
	case KindBlockDiagonalCausalLocalPaddedKeys, KindPagedBlockDiagonalCausalLocalPaddedKeys:
		cfg.WindowSize = r.IntN(8) - 1 // xFormers takes any window here
	case KindBlockDiagonalLocalPaddedKeys, KindLocalAttentionFromBottomRight:
		cfg.WindowLeft, cfg.WindowRight = r.IntN(5), r.IntN(4)
	case KindBlockDiagonalLocalFromBottomRightGappyKeys:
		cfg.WindowLeft, cfg.WindowRight = r.IntN(7)-2, r.IntN(6)-2
	}
	switch kind {
	case KindBlockDiagonalPaddedKeys, KindBlockDiagonalLocalPaddedKeys, KindBlockDiagonalCausalLocalPaddedKeys:
		cfg.KVPadding = 1 + r.IntN(7)
		for b := range cfg.KVSeqLen {
			cfg.KVSeqLen[b] = int32(r.IntN(cfg.KVPadding + 1))
		}
	case KindBlockDiagonalGappyKeys, KindBlockDiagonalCausalWithOffsetGappyKeys, KindBlockDiagonalLocalFromBottomRightGappyKeys:
		total := r.IntN(15)
		cfg.KVSeqStarts = make([]int32, batch+1)
		for b := range cfg.KVSeqLen {
			n := r.IntN(min(total, 6) + 1)
			cfg.KVSeqLen[b] = int32(n)
			cfg.KVSeqStarts[b] = int32(r.IntN(total - n + 1))
		}
		cfg.KVSeqStarts[batch] = int32(total)
	case KindPagedBlockDiagonalPaddedKeys, KindPagedBlockDiagonalCausalWithOffsetPaddedKeys, KindPagedBlockDiagonalCausalLocalPaddedKeys,
		KindPagedBlockDiagonalGappyKeys, KindPagedBlockDiagonalCausalWithOffsetGappyKeys:
		cfg.PageSize = 1 + r.IntN(4)
		cols := 1 + r.IntN(3)
		cfg.BlockTables = randomBlockTables(r, batch, cols)
		rowLen := cols * cfg.PageSize
		gappy := kind == KindPagedBlockDiagonalGappyKeys || kind == KindPagedBlockDiagonalCausalWithOffsetGappyKeys
		if gappy {
			cfg.KVSeqStarts = make([]int32, batch)
		}
		for b := range cfg.KVSeqLen {
			n := r.IntN(rowLen + 1)
			cfg.KVSeqLen[b] = int32(n)
			if gappy {
				cfg.KVSeqStarts[b] = int32(r.IntN(max(1, rowLen-n+1)))
				if int(cfg.KVSeqStarts[b]) >= rowLen {
					cfg.KVSeqStarts[b] = 0
				}
				if int(cfg.KVSeqStarts[b])+n > rowLen {
					cfg.KVSeqLen[b] = int32(rowLen - int(cfg.KVSeqStarts[b]))
				}
			}
		}
	default:
		for b := range cfg.KVSeqLen {
			cfg.KVSeqLen[b] = int32(r.IntN(7))
		}
	}
	return cfg
}

// randomBlockTables: distinct pages most of the time, repeats sometimes
// (shared prefixes, and padding that collides with used pages).
func randomBlockTables(r *rand.Rand, batch, cols int) BlockTables {
	bt := BlockTables{Rows: batch, Cols: cols, Data: make([]int32, batch*cols)}
	if r.IntN(3) > 0 {
		perm := r.Perm(batch*cols + r.IntN(4))
		for k := range bt.Data {
			bt.Data[k] = int32(perm[k])
		}
		return bt
	}
	for k := range bt.Data {
		bt.Data[k] = int32(r.IntN(batch*cols + 2))
	}
	return bt
}

var newKinds = []MaskKind{
	KindBlockDiagonalPaddedKeys, KindBlockDiagonalLocalPaddedKeys, KindBlockDiagonalCausalLocalPaddedKeys,
	KindPagedBlockDiagonalPaddedKeys, KindPagedBlockDiagonalCausalWithOffsetPaddedKeys, KindPagedBlockDiagonalCausalLocalPaddedKeys,
	KindBlockDiagonalGappyKeys, KindBlockDiagonalCausalWithOffsetGappyKeys, KindBlockDiagonalLocalFromBottomRightGappyKeys,
	KindPagedBlockDiagonalGappyKeys, KindPagedBlockDiagonalCausalWithOffsetGappyKeys,
	KindLowerTriangular, KindLowerTriangularFromBottomRight, KindLowerTriangularFromBottomRightLocal, KindLocalAttentionFromBottomRight,
}

// checkFamilyAgainstModels: Materialize and At equal the model; ToFlashInfer
// equals segment_packbits of the model's per-request masks; FlashInferParams
// is right both ways; for the paged kinds, PagedKV is the block table cut at
// each request's keys and round-trips through BlockTablesFromPagedKV.
func checkFamilyAgainstModels(t testing.TB, cfg MaskConfig) {
	m := materializeAgainst(t, cfg, modelFamily)

	blocks, kvLens := familyFlashBlocks(cfg)
	checkToFlashInfer(t, m, blocks, cfg.QSeqLen, kvLens)

	p := m.FlashInferParams()
	if p.OK {
		if p.WindowLeft < -1 || !blocksEqual(blocks, modelFlashInferBlocks(cfg.QSeqLen, kvLens, p.Causal, p.WindowLeft)) {
			t.Fatalf("%s: FlashInferParams %+v do not reproduce the mask", m, p)
		}
	} else {
		if p.Why == "" {
			t.Fatalf("%s: not expressible but no reason given", m)
		}
		maxKV := 0
		for _, kv := range kvLens {
			maxKV = max(maxKV, int(kv))
		}
		for _, causal := range []bool{false, true} {
			for w := -1; w <= maxKV; w++ {
				if blocksEqual(blocks, modelFlashInferBlocks(cfg.QSeqLen, kvLens, causal, w)) {
					t.Fatalf("%s: FlashInferParams says %q, but causal=%t window_left=%d matches", m, p.Why, causal, w)
				}
			}
		}
	}

	if !isPagedKind(cfg.Kind) {
		if _, err := m.(interface{ PagedKV() (PagedKV, error) }).PagedKV(); err == nil {
			t.Fatalf("%s: PagedKV of an unpaged mask succeeded", m)
		}
		return
	}
	checkPagedKV(t, m, cfg, kvLens)
}

// checkPagedKV: request b's pages are the first ceil(kv_len/page_size) of
// its block_tables row; the kernel's view (pages + custom mask) sees the
// same physical slots as the model's row wherever the row's padding entries
// do not repaint its used pages; and block_tables/kv_seqlen come back from
// the CSR arrays.
func checkPagedKV(t testing.TB, m AttentionMask, cfg MaskConfig, kvLens []int32) {
	pkv, err := m.(interface{ PagedKV() (PagedKV, error) }).PagedKV()
	if err != nil {
		t.Fatalf("%s: PagedKV: %v", m, err)
	}
	ps, bt := cfg.PageSize, cfg.BlockTables
	var wantIdx []int32
	wantIndptr := []int32{0}
	var wantLast []int32
	for b, n := range kvLens {
		pages := (int(n) + ps - 1) / ps
		wantIdx = append(wantIdx, bt.Data[b*bt.Cols:b*bt.Cols+pages]...)
		wantIndptr = append(wantIndptr, int32(len(wantIdx)))
		last := int32(0)
		if pages > 0 {
			last = n - int32((pages-1)*ps)
		}
		wantLast = append(wantLast, last)
	}
	if fmt.Sprint(pkv.KVIndptr, pkv.KVPageIndices, pkv.KVLastPageLen, pkv.PageSize) != fmt.Sprint(wantIndptr, wantIdx, wantLast, ps) {
		t.Fatalf("%s: PagedKV = %+v, want indptr %v indices %v last %v", m, pkv, wantIndptr, wantIdx, wantLast)
	}
	back, lens, err := BlockTablesFromPagedKV(pkv.KVIndptr, pkv.KVPageIndices, pkv.KVLastPageLen, ps, bt.Cols, 0)
	if err != nil {
		t.Fatalf("%s: BlockTablesFromPagedKV: %v", m, err)
	}
	if !equalInt32(lens, kvLens) {
		t.Fatalf("%s: kv_seqlen %v came back as %v", m, kvLens, lens)
	}
	for b := range kvLens {
		pages := (int(kvLens[b]) + ps - 1) / ps
		if !equalInt32(back.Row(b)[:pages], bt.Row(b)[:pages]) {
			t.Fatalf("%s: row %d came back as %v, want %v", m, b, back.Row(b), bt.Row(b))
		}
	}

	// And back to a mask: the same page table, and the same mask once the
	// padding entries are the pad used.
	const pad = 0
	back2, err := MaskFromPagedKV(cfg.Kind, pkv, m.(interface{ KVSeqStarts() []int32 }).KVSeqStarts(), cfg.WindowSize, bt.Cols, pad)
	if err != nil {
		t.Fatalf("%s: MaskFromPagedKV: %v", m, err)
	}
	if pkv2, err := back2.(interface{ PagedKV() (PagedKV, error) }).PagedKV(); err != nil || fmt.Sprint(pkv2) != fmt.Sprint(pkv) {
		t.Fatalf("%s: PagedKV of MaskFromPagedKV = %+v, %v; want %+v", m, pkv2, err, pkv)
	}
	padded := cfg
	// The CSR arrays hold one row per sequence: rows past the batch are gone.
	padded.BlockTables = BlockTables{Rows: len(kvLens), Cols: bt.Cols, Data: append([]int32(nil), bt.Data[:len(kvLens)*bt.Cols]...)}
	for b, n := range kvLens {
		for l := (int(n) + ps - 1) / ps; l < bt.Cols; l++ {
			padded.BlockTables.Data[b*bt.Cols+l] = pad
		}
	}
	mp, err := NewAttentionMask(padded)
	if err != nil {
		t.Fatalf("%+v: %v", padded, err)
	}
	dp, _ := mp.Materialize()
	db, _ := back2.Materialize()
	if mp.String() != back2.String() || Diff(dp, db) != "" {
		t.Fatalf("MaskFromPagedKV(PagedKV(%s)) = %s, want %s:\n%s", m, back2, mp, Diff(dp, db))
	}

	// The kernel's view, drawn on the physical columns.
	fi, err := m.ToFlashInfer()
	if err != nil {
		t.Fatal(err)
	}
	d, err := m.Materialize()
	if err != nil {
		t.Fatal(err)
	}
	r0 := 0
	for b, n := range kvLens {
		q := int(cfg.QSeqLen[b])
		pages := pkv.KVPageIndices[pkv.KVIndptr[b]:pkv.KVIndptr[b+1]]
		repainted := false
		used := map[int32]bool{}
		for _, p := range pages {
			repainted = repainted || used[p] // one page twice: only the last copy shows
			used[p] = true
		}
		for _, p := range bt.Row(b)[len(pages):] {
			repainted = repainted || used[p]
		}
		for i := 0; i < q; i++ {
			kernel := make([]bool, d.Cols)
			for k := 0; k < int(n); k++ {
				bit, err := MaskBit(fi.PackedCustomMask, fi.PackedMaskIndptr, cfg.QSeqLen, kvLens, b, i, k)
				if err != nil {
					t.Fatal(err)
				}
				if bit {
					kernel[int(pages[k/ps])*ps+k%ps] = true
				}
			}
			for c := 0; c < d.Cols && !repainted; c++ {
				if kernel[c] != d.At(r0+i, c) {
					t.Fatalf("%s: block %d row %d: the kernel's view and the materialised mask differ at physical slot %d", m, b, i, c)
				}
			}
		}
		r0 += q
	}
}

func TestXFormersFamilyRandomVsModels(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(22, 1))
	for iter := 0; iter < 4000; iter++ {
		kind := newKinds[iter%len(newKinds)]
		checkFamilyAgainstModels(t, randomFamilyConfig(r, kind))
	}
}
