package layergroup

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestKeepFromCoversEveryVisibleKey checks the release rule against the
// dense visibility rule: after n computed tokens, every key any later
// query may read is at or after KeepFrom(n), KeepFrom is page-aligned and
// never decreases, and NeedFrom(L) covers the next query's keys.
func TestKeepFromCoversEveryVisibleKey(t *testing.T) {
	for _, ps := range []int{1, 4, 16} {
		for _, s := range []Spec{{Kind: Full, NumLayers: 1}, {Kind: MLA, NumLayers: 1},
			{Kind: Sliding, WindowTokens: 1, NumLayers: 1}, {Kind: Sliding, WindowTokens: 7, NumLayers: 1},
			{Kind: Sliding, WindowTokens: 32, NumLayers: 1}, {Kind: Chunked, ChunkTokens: 2 * ps, NumLayers: 1},
			{Kind: Chunked, ChunkTokens: 3 * ps, NumLayers: 1}} {
			require.NoError(t, s.Validate(ps))
			prev := 0
			for n := 0; n < 200; n++ {
				from := s.KeepFrom(n, ps)
				require.Zero(t, from%ps)
				require.LessOrEqual(t, from, n)
				require.GreaterOrEqual(t, from, prev, "%+v n %d", s, n)
				prev = from
				for q := n; q < n+3*ps+40; q++ {
					for k := 0; k < from; k++ {
						if s.Visible(q, k) {
							t.Fatalf("%+v: n %d keeps from %d but query %d reads key %d", s, n, from, q, k)
						}
					}
				}
			}
		}
	}
}

// TestSegments draws a chunked group's split of a step's rows: chunks of
// 8 tokens, a request with 6 computed tokens appending 12 rows (positions
// 6..17) attends in three segments.
func TestSegments(t *testing.T) {
	s := Spec{Kind: Chunked, ChunkTokens: 8, NumLayers: 1}
	require.Equal(t, []Segment{
		{Row: 0, Rows: 2, KeyFrom: 0, KeyTo: 8},    // positions 6, 7
		{Row: 2, Rows: 8, KeyFrom: 8, KeyTo: 16},   // positions 8..15
		{Row: 10, Rows: 2, KeyFrom: 16, KeyTo: 18}, // positions 16, 17
	}, s.Segments(nil, 6, 12, 0))
	full := Spec{Kind: Sliding, WindowTokens: 4, NumLayers: 1}
	require.Equal(t, []Segment{{Row: 0, Rows: 12, KeyFrom: 4, KeyTo: 18}}, full.Segments(nil, 6, 12, 4))
	// Every row's visible keys lie in its segment's range.
	for computed := 0; computed < 30; computed++ {
		for rows := 0; rows < 20; rows++ {
			keep := s.KeepFrom(computed, 4)
			segs := s.Segments(nil, computed, rows, keep)
			n := 0
			for _, g := range segs {
				require.Equal(t, n, g.Row)
				for r := g.Row; r < g.Row+g.Rows; r++ {
					q := computed + r
					for k := 0; k <= q; k++ {
						if s.Visible(q, k) != (k >= g.KeyFrom && k < g.KeyTo) {
							t.Fatalf("q %d k %d seg %+v", q, k, g)
						}
					}
				}
				n += g.Rows
			}
			require.Equal(t, rows, n)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, bad := range []Spec{{Kind: 9, NumLayers: 1}, {Kind: Full}, {Kind: Sliding, NumLayers: 1},
		{Kind: Full, WindowTokens: 3, NumLayers: 1}, {Kind: Chunked, ChunkTokens: 6, NumLayers: 1},
		{Kind: Sliding, WindowTokens: 4, ChunkTokens: 8, NumLayers: 1}} {
		require.ErrorIs(t, bad.Validate(4), ErrBadSpec, "%+v", bad)
	}
	require.ErrorIs(t, ValidateGroups(nil, 4), ErrBadSpec)
	require.ErrorIs(t, ValidateGroups([]Spec{{Kind: Full, NumLayers: 2}, {Kind: Sliding, WindowTokens: 4, NumLayers: 1}}, 4), ErrBadSpec)
	require.NoError(t, ValidateGroups([]Spec{{Kind: Full, NumLayers: 2}, {Kind: Chunked, ChunkTokens: 8, NumLayers: 2}}, 4))
}
