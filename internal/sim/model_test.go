package sim

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/layout"
)

// TestModelValuesExact: every K, V and Q value survives a round trip
// through its dtype, so the paged cache holds exactly the model's values.
func TestModelValuesExact(t *testing.T) {
	for _, dt := range []layout.DType{layout.F16, layout.BF16, layout.F32} {
		m := Model{Layers: 2, NumQOHeads: 4, NumKVHeads: 2, HeadDim: 16, DType: dt, Seed: 7}
		require.NoError(t, m.Validate())
		k, q := make([]float32, 2*16), make([]float32, 4*16)
		back := make([]float32, 4*16)
		buf := make([]byte, 4*16*dt.Size())
		distinct := map[float32]bool{}
		for i := range 200 {
			ctx := Next(m.Root("ns"), int32(i), i)
			for l := range m.Layers {
				m.K(k, ctx, l)
				m.Q(q, ctx, l)
				for _, row := range [][]float32{k, q} {
					layout.StoreRowF32(buf, dt, row)
					layout.LoadRowF32(back[:len(row)], dt, buf)
					require.Equal(t, row, back[:len(row)], "%v values must be exact", dt)
				}
				for _, x := range k {
					require.True(t, x >= -1 && x < 1, "K value %v outside [-1, 1)", x)
					distinct[x] = true
				}
				for _, x := range q {
					require.True(t, x >= -4 && x < 4, "Q value %v outside [-4, 4)", x)
				}
			}
		}
		// The grid is used, not a handful of values.
		assert.Greater(t, len(distinct), 200, "%v: %d distinct K values", dt, len(distinct))
	}
}

// TestModelContext: K/V depend on everything before the token, on the
// namespace and on the layer; equal contexts give equal rows.
func TestModelContext(t *testing.T) {
	m := Model{Layers: 2, NumQOHeads: 2, NumKVHeads: 1, HeadDim: 8, DType: layout.F16, Seed: 3}
	row := func(ns string, tokens []int32, layer int) []float32 {
		ctx := m.Contexts(nil, ns, tokens)
		k := make([]float32, 8)
		m.K(k, ctx[len(ctx)-1], layer)
		return k
	}
	base := row("a", []int32{1, 2, 3}, 0)
	assert.Equal(t, base, row("a", []int32{1, 2, 3}, 0))
	assert.NotEqual(t, base, row("a", []int32{9, 2, 3}, 0), "an earlier token must change K")
	assert.NotEqual(t, base, row("b", []int32{1, 2, 3}, 0), "the namespace must change K")
	assert.NotEqual(t, base, row("a", []int32{1, 2, 3}, 1), "the layer must change K")
	assert.NotEqual(t, base, row("a", []int32{2, 3}, 0), "the position must change K")

	ctx := m.Contexts(nil, "a", []int32{1, 2, 3})
	assert.NotEqual(t, m.Sample(ctx[2], 0), m.Sample(ctx[2], 1), "branches must sample differently")
}

func TestModelValidate(t *testing.T) {
	ok := Model{Layers: 1, NumQOHeads: 4, NumKVHeads: 2, HeadDim: 8, DType: layout.F16}
	require.NoError(t, ok.Validate())
	for _, bad := range []func(*Model){
		func(m *Model) { m.Layers = 0 },
		func(m *Model) { m.NumKVHeads = 0 },
		func(m *Model) { m.NumQOHeads = 3 },
		func(m *Model) { m.HeadDim = 6 },
		func(m *Model) { m.DType = layout.E4M3 },
	} {
		m := ok
		bad(&m)
		assert.ErrorIs(t, m.Validate(), ErrBadConfig, "%+v", m)
	}
}
