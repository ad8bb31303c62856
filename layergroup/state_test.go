package layergroup

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStateShape pins a state group's sizes and each refusal, which names
// the bad value.
func TestStateShape(t *testing.T) {
	// Qwen3-Next-like Gated DeltaNet layer: conv 8192x3 bf16, state
	// 32x128x128 f32.
	good := StateShape{ConvShape: [2]int{8192, 3}, ConvDType: StateBF16, SSMShape: [3]int{32, 128, 128}, SSMDType: StateF32, PageBytes: 4 << 20}
	require.Equal(t, 8192*3*2, good.ConvBytes())
	require.Equal(t, 32*128*128*4, good.SSMBytes())
	require.Equal(t, good.ConvBytes()+good.SSMBytes(), good.Bytes())
	require.NoError(t, Spec{Kind: State, NumLayers: 12, State: good}.Validate(16))
	require.Equal(t, "state", State.String())
	for _, c := range []struct {
		mutate func(*StateShape)
		want   string
	}{
		{func(s *StateShape) { s.ConvShape[1] = 0 }, "ConvShape[1] = 0"},
		{func(s *StateShape) { s.SSMShape[2] = -5 }, "SSMShape[2] = -5"},
		{func(s *StateShape) { s.ConvDType = 7 }, "ConvDType = StateDType(7)"},
		{func(s *StateShape) { s.SSMDType = StateInvalid }, "SSMDType = StateDType(0)"},
		{func(s *StateShape) { s.SSMShape = [3]int{1 << 30, 1 << 30, 1} }, "1073741824x1073741824x1"},
		{func(s *StateShape) { s.PageBytes = 0 }, "PageBytes = 0"},
		{func(s *StateShape) { s.PageBytes = 2 << 20 }, "exceeds PageBytes = 2097152"},
	} {
		s := good
		c.mutate(&s)
		err := Spec{Kind: State, NumLayers: 1, State: s}.Validate(16)
		require.ErrorIs(t, err, ErrBadSpec, c.want)
		require.ErrorContains(t, err, c.want)
	}
	err := Spec{Kind: Full, NumLayers: 1, State: good}.Validate(16)
	require.ErrorContains(t, err, "full group with a State shape")
	err = ValidateGroups([]Spec{{Kind: State, NumLayers: 1, State: good}}, 16)
	require.ErrorContains(t, err, "all of kind state")
}
