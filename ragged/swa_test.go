package ragged

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The seed's example: max(seqLen) = 5, windowSize = 3.
func TestSWAMaskSeedExample(t *testing.T) {
	m, err := SWAMask(5, 3)
	require.NoError(t, err)
	want := mustGrid(t, `
		x . . . .
		x x . . .
		x x x . .
		. x x x .
		. . x x x`)
	requireSameMask(t, want, m.AsBool())

	add := m.AsAdditive()
	flags := m.AsMaskedFlags()
	require.Len(t, add, 25)
	require.Len(t, flags, 25)
	for i, ok := range want.Allowed {
		if ok {
			assert.Equal(t, float32(0), add[i], "cell %d", i)
			assert.Equal(t, float32(0), flags[i], "cell %d", i)
		} else {
			assert.Equal(t, float32(-65536), add[i], "cell %d", i)
			assert.Equal(t, float32(1), flags[i], "cell %d", i)
		}
	}
	assert.Equal(t, FlashInferParams{Causal: true, WindowLeft: 2, OK: true}, m.FlashInferParams())
	flash, err := FlashInferDense([]int32{5}, []int32{5}, true, 2)
	require.NoError(t, err)
	requireSameMask(t, want, flash)
}

// "当windowSize >= seqlen时,mask和不开启SWA时一样": a window at least as long as
// the sequence gives the plain causal mask.
func TestSWAMaskWideWindowIsCausal(t *testing.T) {
	for _, w := range []int{4, 5, 100} {
		m, err := SWAMask(4, w)
		require.NoError(t, err)
		requireSameMask(t, mustGrid(t, "x... / xx.. / xxx. / xxxx"), m.AsBool(), "window %d", w)
	}
}

// The seed's Python (triu/tril) and its C++ loop agree on the plain mask once
// the C++ row stride is the mask's own size, and we match both.
func TestSWAMaskMatchesBothSeedVersions(t *testing.T) {
	for size := 1; size <= 24; size++ {
		for w := 1; w <= size+2; w++ {
			m, err := SWAMask(size, w)
			require.NoError(t, err)
			py := denseFromRows(modelSWAPython(size, w))
			requireSameMask(t, py, m.AsBool(), "python size %d w %d", size, w)
			requireSameMask(t, py, denseFromRows(modelSWACpp(size, w)), "C++ size %d w %d", size, w)
			for i := 0; i < size; i++ {
				for j := 0; j < size; j++ {
					require.Equal(t, py.At(i, j), m.Allowed(i, j))
				}
			}
		}
	}
	// The C++ as printed indexes row i at i*SWA_COMPRESS_MASK_SIZE (512), so
	// for max_seq = 5 its second row already writes past the 25-element
	// vector. We follow the Python.
	assert.Greater(t, 1*CompressedSWAMaskSize+0, 5*5-1)
}

func TestCompressedSWAWindow(t *testing.T) {
	tests := map[string]struct {
		window, headDim int
		want            int // ours = the seed's Python
		cpp             int // the seed's C++
	}{
		"small window kept":            {window: 100, headDim: 128, want: 100, cpp: 100},
		"3 blocks exactly":             {window: 384, headDim: 128, want: 384, cpp: 384},
		"golden swa_mask_0_01":         {window: 4100, headDim: 64, want: 260, cpp: 260},
		"mistral 4096, head_dim 128":   {window: 4096, headDim: 128, want: 384, cpp: 256},
		"multiple of the block":        {window: 512, headDim: 128, want: 384, cpp: 256},
		"head_dim 256, blocks of 64":   {window: 300, headDim: 256, want: 172, cpp: 172},
		"head_dim 192: C++ blocks 80":  {window: 300, headDim: 192, want: 172, cpp: 220},
		"head_dim 512: C++ blocks 32":  {window: 150, headDim: 512, want: 150, cpp: 86},
		"head_dim 129: C++ blocks 112": {window: 200, headDim: 129, want: 136, cpp: 200},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := CompressedSWAWindow(tc.window, tc.headDim)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.want, pythonCompressedWindow(tc.window, tc.headDim))
			assert.Equal(t, tc.cpp, cppCompressedWindow(tc.window, tc.headDim))
		})
	}
	for hd := 1; hd <= 600; hd++ {
		for w := 1; w <= 1200; w += 7 {
			got, err := CompressedSWAWindow(w, hd)
			require.NoError(t, err)
			require.Equal(t, pythonCompressedWindow(w, hd), got, "window %d head_dim %d", w, hd)
		}
	}
}

func TestCompressedSWAMask(t *testing.T) {
	m, err := CompressedSWAMask(4100, 64)
	require.NoError(t, err)
	assert.Equal(t, 512, m.Size())
	assert.Equal(t, 260, m.Window())
	d := m.AsBool()
	requireSameMask(t, denseFromRows(modelSWAPython(512, 260)), d)
	count := func(row int) (n int) {
		for j := 0; j < 512; j++ {
			if d.At(row, j) {
				n++
			}
		}
		return n
	}
	assert.Equal(t, 1, count(0))
	assert.Equal(t, 260, count(259))
	assert.Equal(t, 260, count(511))
	assert.True(t, d.At(511, 252) && !d.At(511, 251))
}

func TestSWAErrors(t *testing.T) {
	_, err := SWAMask(5, 0)
	assert.ErrorIs(t, err, ErrInvalidWindow)
	_, err = SWAMask(5, -3)
	assert.ErrorIs(t, err, ErrInvalidWindow)
	assert.ErrorContains(t, err, "window_size = -3")
	_, err = SWAMask(0, 3)
	assert.ErrorIs(t, err, ErrNegativeLength)
	_, err = SWAMask(1<<16, 3)
	assert.ErrorIs(t, err, ErrTooLarge)
	_, err = CompressedSWAMask(-1, 128)
	assert.ErrorIs(t, err, ErrInvalidWindow)
	_, err = CompressedSWAMask(10, 0)
	assert.ErrorIs(t, err, ErrNegativeLength)
}
