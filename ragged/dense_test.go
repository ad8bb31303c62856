package ragged

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseDense(t *testing.T) {
	d, err := ParseDense("x . . / x x . ")
	require.NoError(t, err)
	assert.Equal(t, Dense{Rows: 2, Cols: 3, Allowed: []bool{true, false, false, true, true, false}}, d)
	assert.Equal(t, "x..\nxx.\n", d.String())

	again, err := ParseDense(d.String())
	require.NoError(t, err)
	assert.True(t, d.Equal(again))

	ones, err := ParseDense("\n  1 0\n  0 1\n")
	require.NoError(t, err)
	assert.Equal(t, []uint8{1, 0, 0, 1}, ones.U8())
	fromU8, err := DenseFromU8(2, 2, []uint8{1, 0, 0, 7})
	require.NoError(t, err)
	assert.True(t, ones.Equal(fromU8))

	_, err = ParseDense("x x / x")
	assert.ErrorIs(t, err, ErrLengthMismatch)
	_, err = ParseDense("x o")
	assert.ErrorContains(t, err, "'o'")
	empty, err := ParseDense("")
	require.NoError(t, err)
	assert.Zero(t, empty.Rows)
	_, err = DenseFromU8(2, 2, []uint8{1})
	assert.ErrorIs(t, err, ErrLengthMismatch)
	_, err = NewDense(1<<16, 1<<15)
	assert.ErrorIs(t, err, ErrTooLarge)
	_, err = NewDense(-1, 2)
	assert.ErrorIs(t, err, ErrNegativeLength)
}

func TestDiffPrintsPicture(t *testing.T) {
	want, _ := ParseDense("x.. / xx.")
	got, _ := ParseDense("x.. / x.x")
	assert.Equal(t, ""+
		"want  got   diff\n"+
		"x..   x..   ...\n"+
		"xx.   x.x   .!!\n"+
		"2 cells differ\n", Diff(want, got))
	assert.Empty(t, Diff(want, want))
	other, _ := ParseDense("x")
	assert.Contains(t, Diff(want, other), "shape: want 2×3, got 1×1")
}
