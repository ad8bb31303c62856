package ragged

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func mustGrid(t *testing.T, g string) Dense {
	t.Helper()
	d, err := ParseDense(g)
	require.NoError(t, err)
	return d
}

func requireSameMask(t *testing.T, want, got Dense, msgAndArgs ...any) {
	t.Helper()
	if diff := Diff(want, got); diff != "" {
		require.Fail(t, "masks differ:\n"+diff, msgAndArgs...)
	}
}

// The worked examples of the Mistral seed, plus the golden attention_mask
// cases, drawn as grids: 'x' = the query (row) may attend the key (column).
func TestXFormersMasksAsPictures(t *testing.T) {
	tests := map[string]struct {
		cfg  MaskConfig
		want string
	}{
		// Prefill chunk 1: BlockDiagonalCausalMask.from_seqlens(q_seqlen=[2,1,2],
		// kv_seqlen=[2,1,2]).make_local_attention(window_size=3); the seed
		// prints materialize((5,5)).exp().
		"mistral prefill chunk 1": {
			cfg: MaskConfig{Kind: KindBlockDiagonalCausalLocal, QSeqLen: []int32{2, 1, 2}, KVSeqLen: []int32{2, 1, 2}, WindowSize: 3},
			want: `
				x . . . .
				x x . . .
				. . x . .
				. . . x .
				. . . x x`,
		},
		// Prefill chunk 2: BlockDiagonalMask.from_seqlens(q_seqlen=[2,0,1],
		// kv_seqlen=[4,1,3]).make_local_attention_from_bottomright(3). Request 1
		// has one cached key and no query: a column and no row.
		"mistral prefill chunk 2": {
			cfg: MaskConfig{Kind: KindBlockDiagonalCausalLocalFromBottomRight, QSeqLen: []int32{2, 0, 1}, KVSeqLen: []int32{4, 1, 3}, WindowSize: 3},
			want: `
				x x x . | . | . . .
				. x x x | . | . . .
				. . . . | . | x x x`,
		},
		// Decode: BlockDiagonalCausalWithOffsetPaddedKeysMask.from_seqlens(
		// q_seqlen=[1,1,1], kv_padding=3, kv_seqlen=[3,2,3]); sequence 2's third
		// key slot is padding.
		"mistral decode": {
			cfg: MaskConfig{Kind: KindBlockDiagonalCausalWithOffsetPaddedKeys, QSeqLen: []int32{1, 1, 1}, KVSeqLen: []int32{3, 2, 3}, KVPadding: 3},
			want: `
				x x x | . . . | . . .
				. . . | x x . | . . .
				. . . | . . . | x x x`,
		},
		"golden attention_mask_0_00": {
			cfg: MaskConfig{Kind: KindBlockDiagonalCausal, QSeqLen: []int32{3, 4, 2, 1}, KVSeqLen: []int32{3, 4, 2, 1}},
			want: `
				x.........
				xx........
				xxx.......
				...x......
				...xx.....
				...xxx....
				...xxxx...
				.......x..
				.......xx.
				.........x`,
		},
		"golden attention_mask_0_01": {
			cfg: MaskConfig{Kind: KindBlockDiagonalCausalLocal, QSeqLen: []int32{2, 1, 7, 6}, KVSeqLen: []int32{2, 1, 7, 6}, WindowSize: 3},
			want: `
				x...............
				xx..............
				..x.............
				...x............
				...xx...........
				...xxx..........
				....xxx.........
				.....xxx........
				......xxx.......
				.......xxx......
				..........x.....
				..........xx....
				..........xxx...
				...........xxx..
				............xxx.
				.............xxx`,
		},
		"golden attention_mask_0_02": {
			cfg: MaskConfig{Kind: KindBlockDiagonalCausalLocalFromBottomRight, QSeqLen: []int32{2, 3, 7, 5}, KVSeqLen: []int32{3, 6, 9, 7}, WindowSize: 4},
			want: `
				xx.......................
				xxx......................
				...xxxx..................
				....xxxx.................
				.....xxxx................
				.........xxx.............
				.........xxxx............
				..........xxxx...........
				...........xxxx..........
				............xxxx.........
				.............xxxx........
				..............xxxx.......
				..................xxx....
				..................xxxx...
				...................xxxx..
				....................xxxx.
				.....................xxxx`,
		},
		// Top-left causal with cached keys: the diagonal starts at key 0, so the
		// queries cannot see the keys after their own row index.
		"top-left causal, 2 queries over 4 keys": {
			cfg: MaskConfig{Kind: KindBlockDiagonalCausal, QSeqLen: []int32{2}, KVSeqLen: []int32{4}},
			want: `
				x . . .
				x x . .`,
		},
		"bottom-right causal, 2 queries over 4 keys": {
			cfg: MaskConfig{Kind: KindBlockDiagonalCausalFromBottomRight, QSeqLen: []int32{2}, KVSeqLen: []int32{4}},
			want: `
				x x x .
				x x x x`,
		},
		"non-causal block diagonal": {
			cfg: MaskConfig{Kind: KindBlockDiagonal, QSeqLen: []int32{1, 2}, KVSeqLen: []int32{2, 1}},
			want: `
				x x .
				. . x
				. . x`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m, want := requireDrawnMask(t, tc.cfg, tc.want)
			rows, cols := m.Shape()
			assert.Equal(t, [2]int{want.Rows, want.Cols}, [2]int{rows, cols})
			for r := 0; r < rows; r++ {
				for c := 0; c < cols; c++ {
					require.Equal(t, want.At(r, c), m.At(r, c), "At(%d, %d)", r, c)
				}
			}
		})
	}
}

// The seed's construction chains give the same masks as NewAttentionMask.
func TestXFormersConstructorChains(t *testing.T) {
	causal, err := BlockDiagonalCausalMaskFromSeqlens([]int32{2, 1, 2}, []int32{2, 1, 2})
	require.NoError(t, err)
	local, err := causal.MakeLocalAttention(3)
	require.NoError(t, err)
	assert.Equal(t, KindBlockDiagonalCausalLocal, local.Kind())
	assert.Equal(t, 3, local.WindowSize())
	assert.Equal(t, "BlockDiagonalCausalLocalAttentionMask(q_seqlen=[2 1 2], kv_seqlen=[2 1 2], window_size=3)", local.String())
	got, err := local.Materialize()
	require.NoError(t, err)
	requireSameMask(t, mustGrid(t, "x.... / xx... / ..x.. / ...x. / ...xx"), got)

	bd, err := BlockDiagonalMaskFromSeqlens([]int32{2, 0, 1}, []int32{4, 1, 3})
	require.NoError(t, err)
	br, err := bd.MakeLocalAttentionFromBottomright(3)
	require.NoError(t, err)
	got, err = br.Materialize()
	require.NoError(t, err)
	requireSameMask(t, mustGrid(t, "xxx..... / .xxx.... / .....xxx"), got)

	dec, err := BlockDiagonalCausalWithOffsetPaddedKeysMaskFromSeqlens([]int32{1, 1, 1}, 3, []int32{3, 2, 3})
	require.NoError(t, err)
	assert.Equal(t, 3, dec.KVPadding())
	assert.Equal(t, "BlockDiagonalCausalWithOffsetPaddedKeysMask(q_seqlen=[1 1 1], kv_padding=3, kv_seqlen=[3 2 3])", dec.String())

	// MakeCausal and MakeCausalFromBottomright relabel the same lengths.
	c2 := bd.MakeCausal()
	assert.Equal(t, KindBlockDiagonalCausal, c2.Kind())
	fromBR, err := bd.MakeCausalFromBottomright()
	require.NoError(t, err)
	got, err = fromBR.Materialize()
	require.NoError(t, err)
	requireSameMask(t, mustGrid(t, "xxx..... / xxxx.... / .....xxx"), got)

	// Accessors return copies.
	q := bd.QSeqLen()
	q[0] = 99
	assert.Equal(t, []int32{2, 0, 1}, bd.QSeqLen())

	// The zero value is an empty batch.
	var zero BlockDiagonalCausalMask
	rows, cols := zero.Shape()
	assert.Zero(t, rows+cols)
	d, err := zero.Materialize()
	require.NoError(t, err)
	assert.Zero(t, d.Rows)
}

func TestXFormersErrors(t *testing.T) {
	tests := map[string]maskConfigError{
		"negative window": {MaskConfig{Kind: KindBlockDiagonalCausalLocal, QSeqLen: []int32{2}, KVSeqLen: []int32{2}, WindowSize: -1},
			ErrInvalidWindow, "window_size >= 1, got -1"},
		"zero window": {MaskConfig{Kind: KindBlockDiagonalCausalLocalFromBottomRight, QSeqLen: []int32{2}, KVSeqLen: []int32{2}, WindowSize: 0},
			ErrInvalidWindow, "got 0"},
		"window on a non-local kind": {MaskConfig{Kind: KindBlockDiagonalCausal, QSeqLen: []int32{2}, KVSeqLen: []int32{2}, WindowSize: 3},
			ErrInvalidWindow, "takes no window_size"},
		"length mismatch": {MaskConfig{Kind: KindBlockDiagonalCausal, QSeqLen: []int32{2, 1}, KVSeqLen: []int32{2}},
			ErrLengthMismatch, "2 q_seqlen, 1 kv_seqlen"},
		"negative length": {MaskConfig{Kind: KindBlockDiagonal, QSeqLen: []int32{2, -1}, KVSeqLen: []int32{2, 3}},
			ErrNegativeLength, "block 1 has q_seqlen -1"},
		"kv_seqlen beyond padding": {MaskConfig{Kind: KindBlockDiagonalCausalWithOffsetPaddedKeys, QSeqLen: []int32{1, 1}, KVSeqLen: []int32{3, 4}, KVPadding: 3},
			ErrOutOfRange, "block 1 has kv_seqlen 4 > kv_padding 3"},
		"zero padding": {MaskConfig{Kind: KindBlockDiagonalCausalWithOffsetPaddedKeys, QSeqLen: []int32{0}, KVSeqLen: []int32{0}},
			ErrNegativeLength, "kv_padding >= 1"},
		"padding on an unpadded kind": {MaskConfig{Kind: KindBlockDiagonal, QSeqLen: []int32{1}, KVSeqLen: []int32{1}, KVPadding: 4},
			ErrLengthMismatch, "takes no kv_padding"},
		"bottom-right with fewer keys than queries": {MaskConfig{Kind: KindBlockDiagonalCausalLocalFromBottomRight, QSeqLen: []int32{1, 3}, KVSeqLen: []int32{1, 2}, WindowSize: 2},
			ErrNoVisibleKey, "block 1 has kv_seqlen 2 < q_seqlen 3"},
		"local window before the first key": {MaskConfig{Kind: KindBlockDiagonalCausalLocal, QSeqLen: []int32{5}, KVSeqLen: []int32{2}, WindowSize: 3},
			ErrNoVisibleKey, "q_seqlen 5 >= kv_seqlen 2 + window_size 3"},
		"unknown kind": {MaskConfig{Kind: "lower_triangular_with_tensor_bias"}, ErrUnknownMaskKind, `"lower_triangular_with_tensor_bias"`},
		"padded keys, empty batch": {MaskConfig{Kind: KindBlockDiagonalCausalWithOffsetPaddedKeys, KVPadding: 3},
			ErrLengthMismatch, "needs at least one block"},
	}
	checkMaskConfigErrors(t, tests)
	// xFormers accepts the largest q_seqlen that still sees a key.
	_, err := NewAttentionMask(MaskConfig{Kind: KindBlockDiagonalCausalLocal, QSeqLen: []int32{4}, KVSeqLen: []int32{2}, WindowSize: 3})
	assert.NoError(t, err)

	bd, err := BlockDiagonalMaskFromSeqlens([]int32{3}, []int32{2})
	require.NoError(t, err)
	_, err = bd.MakeCausalFromBottomright()
	assert.ErrorIs(t, err, ErrNoVisibleKey)
	_, err = bd.MakeLocalAttention(-2)
	assert.ErrorIs(t, err, ErrInvalidWindow)
}

func TestFlashInferParams(t *testing.T) {
	tests := map[string]struct {
		cfg        MaskConfig
		causal     bool
		windowLeft int
		ok         bool
		why        string
	}{
		// q == kv in every block, so top-left and bottom-right coincide.
		"mistral prefill chunk 1": {MaskConfig{Kind: KindBlockDiagonalCausalLocal, QSeqLen: []int32{2, 1, 2}, KVSeqLen: []int32{2, 1, 2}, WindowSize: 3},
			true, 2, true, ""},
		"mistral prefill chunk 2": {MaskConfig{Kind: KindBlockDiagonalCausalLocalFromBottomRight, QSeqLen: []int32{2, 0, 1}, KVSeqLen: []int32{4, 1, 3}, WindowSize: 3},
			true, 2, true, ""},
		"mistral decode (keys passed unpadded)": {MaskConfig{Kind: KindBlockDiagonalCausalWithOffsetPaddedKeys, QSeqLen: []int32{1, 1, 1}, KVSeqLen: []int32{3, 2, 3}, KVPadding: 3},
			true, -1, true, ""},
		"block diagonal": {MaskConfig{Kind: KindBlockDiagonal, QSeqLen: []int32{2, 3}, KVSeqLen: []int32{5, 1}},
			false, -1, true, ""},
		"bottom-right causal": {MaskConfig{Kind: KindBlockDiagonalCausalFromBottomRight, QSeqLen: []int32{2, 3}, KVSeqLen: []int32{5, 3}},
			true, -1, true, ""},
		"top-left causal with cached keys": {MaskConfig{Kind: KindBlockDiagonalCausal, QSeqLen: []int32{2, 2}, KVSeqLen: []int32{2, 4}},
			true, -1, false, "block 1 (q_seqlen 2, kv_seqlen 4) row 0 sees keys [0, 1), FlashInfer with causal=true, window_left=-1 sees [0, 3)"},
		"top-left local with cached keys": {MaskConfig{Kind: KindBlockDiagonalCausalLocal, QSeqLen: []int32{3}, KVSeqLen: []int32{5}, WindowSize: 2},
			true, -1, false, "top-left corner"},
		// Top-left causal with one key: every query sees key 0, which is
		// exactly FlashInfer's non-causal mask.
		"top-left causal, one key": {MaskConfig{Kind: KindBlockDiagonalCausal, QSeqLen: []int32{3}, KVSeqLen: []int32{1}},
			false, -1, true, ""},
		// A window wider than every block cuts nothing, but the literal
		// translation is kept.
		"window wider than blocks": {MaskConfig{Kind: KindBlockDiagonalCausalLocal, QSeqLen: []int32{2, 3}, KVSeqLen: []int32{2, 3}, WindowSize: 10},
			true, 9, true, ""},
		// Top-left local with one key per block and more queries: every
		// query sees key 0 (xFormers allows q_seqlen < kv_seqlen + window).
		"top-left local, one key": {MaskConfig{Kind: KindBlockDiagonalCausalLocal, QSeqLen: []int32{2}, KVSeqLen: []int32{1}, WindowSize: 2},
			false, -1, true, ""},
		"empty batch": {MaskConfig{Kind: KindBlockDiagonalCausal}, true, -1, true, ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m, err := NewAttentionMask(tc.cfg)
			require.NoError(t, err)
			p := m.FlashInferParams()
			assert.Equal(t, tc.ok, p.OK, p.Why)
			if tc.ok {
				assert.Equal(t, tc.causal, p.Causal)
				assert.Equal(t, tc.windowLeft, p.WindowLeft)
				assert.Empty(t, p.Why)
			} else {
				assert.Contains(t, p.Why, tc.why)
			}
		})
	}
}

// The Mistral masks in FlashInfer's packed layout, checked against the seed
// grids through the kernel's bit lookup.
func TestToFlashInferMistral(t *testing.T) {
	m, err := BlockDiagonalCausalWithOffsetPaddedKeysMaskFromSeqlens([]int32{1, 1, 1}, 3, []int32{3, 2, 3})
	require.NoError(t, err)
	fi, err := m.ToFlashInfer()
	require.NoError(t, err)
	assert.Equal(t, []int32{0, 1, 2, 3}, fi.QOIndptr)
	assert.Equal(t, []int32{0, 3, 5, 8}, fi.KVIndptr)
	assert.Equal(t, []int32{0, 3, 5, 8}, fi.MaskIndptr)
	assert.Equal(t, []int32{0, 1, 2, 3}, fi.PackedMaskIndptr)
	assert.Equal(t, []byte{0b111, 0b11, 0b111}, fi.PackedCustomMask)

	m2, err := NewAttentionMask(MaskConfig{Kind: KindBlockDiagonalCausalLocalFromBottomRight, QSeqLen: []int32{2, 0, 1}, KVSeqLen: []int32{4, 1, 3}, WindowSize: 3})
	require.NoError(t, err)
	fi, err = m2.ToFlashInfer()
	require.NoError(t, err)
	// Request 0 is "xxx. / .xxx" = bits 1110 0111 -> 0b11100111; request 1
	// has no bits; request 2 is "xxx".
	assert.Equal(t, []int32{0, 8, 8, 11}, fi.MaskIndptr)
	assert.Equal(t, []int32{0, 1, 1, 2}, fi.PackedMaskIndptr)
	assert.Equal(t, []byte{0b11100111, 0b111}, fi.PackedCustomMask)
}

var allKinds = []MaskKind{
	KindBlockDiagonal, KindBlockDiagonalCausal, KindBlockDiagonalCausalFromBottomRight,
	KindBlockDiagonalCausalLocal, KindBlockDiagonalCausalLocalFromBottomRight,
	KindBlockDiagonalCausalWithOffsetPaddedKeys,
}

// randomMaskConfig draws a configuration that xFormers accepts.
func randomMaskConfig(r *rand.Rand) MaskConfig {
	kind := allKinds[r.IntN(len(allKinds))]
	batch := r.IntN(5)
	if kind == KindBlockDiagonalCausalWithOffsetPaddedKeys {
		batch = 1 + r.IntN(4) // xFormers takes max(kv_seqlen)
	}
	cfg := MaskConfig{Kind: kind, QSeqLen: make([]int32, batch), KVSeqLen: make([]int32, batch)}
	switch kind {
	case KindBlockDiagonalCausalLocal, KindBlockDiagonalCausalLocalFromBottomRight:
		cfg.WindowSize = 1 + r.IntN(6)
	case KindBlockDiagonalCausalWithOffsetPaddedKeys:
		cfg.KVPadding = 1 + r.IntN(7)
	}
	for b := 0; b < batch; b++ {
		q, kv := r.IntN(7), r.IntN(7)
		if r.IntN(3) == 0 {
			kv = q // the first-chunk shape
		}
		switch kind {
		case KindBlockDiagonalCausalFromBottomRight, KindBlockDiagonalCausalLocalFromBottomRight:
			kv = max(kv, q)
		case KindBlockDiagonalCausalLocal:
			kv = max(kv, q-cfg.WindowSize+1)
		case KindBlockDiagonalCausalWithOffsetPaddedKeys:
			kv = min(kv, cfg.KVPadding)
		}
		cfg.QSeqLen[b], cfg.KVSeqLen[b] = int32(q), int32(kv)
	}
	return cfg
}

// checkMaskAgainstModels is the shared property check of the randomized test
// and the fuzzer:
//   - Materialize equals the torch-style model, and At agrees cell by cell;
//   - ToFlashInfer equals segment_packbits of the model's per-block masks;
//   - FlashInferParams OK ⇒ FlashInfer's kernel formula with those
//     parameters gives the same per-block masks;
//   - FlashInferParams !OK ⇒ no causal ∈ {false,true}, window_left in
//     [-1, max kv_seqlen] gives them (larger windows equal -1's result).
func checkMaskAgainstModels(t testing.TB, cfg MaskConfig) {
	m := materializeAgainst(t, cfg, modelXFormers)

	blocks := xformersBlocks(cfg)
	checkToFlashInfer(t, m, blocks, cfg.QSeqLen, cfg.KVSeqLen)

	p := m.FlashInferParams()
	if p.OK {
		if p.WindowLeft < -1 {
			t.Fatalf("%s: window_left %d", m, p.WindowLeft)
		}
		fiBlocks := modelFlashInferBlocks(cfg.QSeqLen, cfg.KVSeqLen, p.Causal, p.WindowLeft)
		if !blocksEqual(blocks, fiBlocks) {
			t.Fatalf("%s: FlashInferParams %+v do not reproduce the mask", m, p)
		}
		return
	}
	if p.Why == "" {
		t.Fatalf("%s: not expressible but no reason given", m)
	}
	maxKV := 0
	for _, kv := range cfg.KVSeqLen {
		maxKV = max(maxKV, int(kv))
	}
	for _, causal := range []bool{false, true} {
		for w := -1; w <= maxKV; w++ {
			if blocksEqual(blocks, modelFlashInferBlocks(cfg.QSeqLen, cfg.KVSeqLen, causal, w)) {
				t.Fatalf("%s: FlashInferParams says %q, but causal=%t window_left=%d matches", m, p.Why, causal, w)
			}
		}
	}
}

func TestXFormersRandomVsModels(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for iter := 0; iter < 3000; iter++ {
		checkMaskAgainstModels(t, randomMaskConfig(r))
	}
}

// A mask built from causal + window_left equals the materialised xFormers
// mask wherever both exist: bottom-right local masks for every window, and
// top-left masks when q_seqlen == kv_seqlen.
func TestFlashInferDenseMatchesXFormers(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for iter := 0; iter < 500; iter++ {
		batch := r.IntN(5)
		q := make([]int32, batch)
		kv := make([]int32, batch)
		same := make([]int32, batch)
		for b := range q {
			q[b] = int32(r.IntN(6))
			kv[b] = q[b] + int32(r.IntN(4))
			same[b] = q[b]
		}
		w := 1 + r.IntN(6)

		br, err := NewAttentionMask(MaskConfig{Kind: KindBlockDiagonalCausalLocalFromBottomRight, QSeqLen: q, KVSeqLen: kv, WindowSize: w})
		require.NoError(t, err)
		xf, err := br.Materialize()
		require.NoError(t, err)
		fi, err := FlashInferDense(q, kv, true, w-1)
		require.NoError(t, err)
		requireSameMask(t, xf, fi, "%s", br)

		tl, err := NewAttentionMask(MaskConfig{Kind: KindBlockDiagonalCausalLocal, QSeqLen: q, KVSeqLen: same, WindowSize: w})
		require.NoError(t, err)
		xf, err = tl.Materialize()
		require.NoError(t, err)
		fi, err = FlashInferDense(q, same, true, w-1)
		require.NoError(t, err)
		requireSameMask(t, xf, fi, "%s", tl)

		nc, err := NewAttentionMask(MaskConfig{Kind: KindBlockDiagonal, QSeqLen: q, KVSeqLen: kv})
		require.NoError(t, err)
		xf, err = nc.Materialize()
		require.NoError(t, err)
		fi, err = FlashInferDense(q, kv, false, -1)
		require.NoError(t, err)
		requireSameMask(t, xf, fi, "%s", nc)
	}
	_, err := FlashInferDense([]int32{1}, []int32{1}, true, -2)
	assert.ErrorIs(t, err, ErrInvalidWindow)
}

// FlashInferDense follows the worked prefill example of the reference notes
// (qo_len 2, kv_len 4).
func TestFlashInferDensePictures(t *testing.T) {
	tests := map[string]struct {
		causal     bool
		windowLeft int
		want       string
	}{
		"non-causal":      {false, -1, "xxxx / xxxx"},
		"causal":          {true, -1, "xxx. / xxxx"},
		"causal, w=1":     {true, 1, ".xx. / ..xx"},
		"non-causal, w=1": {false, 1, ".xxx / ..xx"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := FlashInferDense([]int32{2}, []int32{4}, tc.causal, tc.windowLeft)
			require.NoError(t, err)
			requireSameMask(t, mustGrid(t, tc.want), got)
		})
	}
}

// materializeAgainst makes cfg's mask and requires Materialize to equal
// model(cfg) and At to agree with it cell by cell.
func materializeAgainst(t testing.TB, cfg MaskConfig, model func(MaskConfig) Dense) AttentionMask {
	t.Helper()
	m, err := NewAttentionMask(cfg)
	if err != nil {
		t.Fatalf("NewAttentionMask(%+v): %v", cfg, err)
	}
	want := model(cfg)
	got, err := m.Materialize()
	if err != nil {
		t.Fatalf("%s: Materialize: %v", m, err)
	}
	if diff := Diff(want, got); diff != "" {
		t.Fatalf("%s: Materialize differs from the model:\n%s", m, diff)
	}
	for r := 0; r < got.Rows; r++ {
		for c := 0; c < got.Cols; c++ {
			if m.At(r, c) != got.At(r, c) {
				t.Fatalf("%s: At(%d, %d) = %t, Materialize has %t", m, r, c, m.At(r, c), got.At(r, c))
			}
		}
	}
	return m
}

// checkToFlashInfer requires m.ToFlashInfer to equal segment_packbits of
// blocks, the model's per-block masks of queries qLens over keys kvLens.
func checkToFlashInfer(t testing.TB, m AttentionMask, blocks [][][]bool, qLens, kvLens []int32) {
	t.Helper()
	maskIndptr, err := MaskIndptrFromLens(qLens, kvLens)
	if err != nil {
		t.Fatal(err)
	}
	wantPacked, wantIP := modelSegmentPackBits(flattenBlocks(blocks), maskIndptr, BitOrderLittle)
	fi, err := m.ToFlashInfer()
	if err != nil {
		t.Fatalf("%s: ToFlashInfer: %v", m, err)
	}
	if fmt.Sprint(fi.PackedCustomMask, fi.PackedMaskIndptr, fi.MaskIndptr) != fmt.Sprint(wantPacked, wantIP, maskIndptr) {
		t.Fatalf("%s: ToFlashInfer = %v %v %v, model %v %v %v", m,
			fi.PackedCustomMask, fi.PackedMaskIndptr, fi.MaskIndptr, wantPacked, wantIP, maskIndptr)
	}
}

// maskConfigError is a mask config NewAttentionMask refuses, with the
// error it must wrap and a part of its message.
type maskConfigError struct {
	cfg     MaskConfig
	wantErr error
	wantMsg string
}

// checkMaskConfigErrors requires NewAttentionMask to refuse each config of
// tests as it says, one subtest each.
func checkMaskConfigErrors(t *testing.T, tests map[string]maskConfigError) {
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := NewAttentionMask(tc.cfg)
			require.ErrorIs(t, err, tc.wantErr)
			assert.ErrorContains(t, err, tc.wantMsg)
		})
	}
}

// requireDrawnMask makes cfg's mask and requires Materialize to equal
// drawn (a grid of x and ., "|" ignored); want is that grid.
func requireDrawnMask(t *testing.T, cfg MaskConfig, drawn string) (m AttentionMask, want Dense) {
	t.Helper()
	m, err := NewAttentionMask(cfg)
	require.NoError(t, err)
	got, err := m.Materialize()
	require.NoError(t, err)
	want = mustGrid(t, strings.ReplaceAll(drawn, "|", ""))
	requireSameMask(t, want, got, "%s", m)
	return m, want
}
