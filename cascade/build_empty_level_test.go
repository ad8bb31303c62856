package cascade

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Two unrelated prefixes under an empty root: the root's depth holds no page,
// so it is not a level. Level 0 is the two prefixes, the last level the
// requests' own pages; both builders agree.
//
//	root (no pages)
//	├── A [10 11]      requests 0 (pages [20]) and 1 (pages [21])
//	└── B [12]         requests 2 (pages [22]) and 3 (no own pages)
func TestEmptyDepthIsNotALevel(t *testing.T) {
	leaf := func(id int, pages ...int32) *Node {
		n := &Node{Pages: pages, Requests: []Request{{ID: id, QOLen: 1}}}
		if len(pages) > 0 {
			n.LastPageLen = 2
		}
		return n
	}
	root := &Node{Children: []*Node{
		{Pages: []int32{10, 11}, LastPageLen: 4, Children: []*Node{leaf(0, 20), leaf(1, 21)}},
		{Pages: []int32{12}, LastPageLen: 4, Children: []*Node{leaf(2, 22), leaf(3)}},
	}}
	want := []Level{
		{QOIndptr: []int32{0, 2, 4}, KVIndptr: []int32{0, 2, 3}, KVPageIndices: []int32{10, 11, 12}, KVLastPageLen: []int32{4, 4}},
		{QOIndptr: []int32{0, 1, 2, 3, 4}, KVIndptr: []int32{0, 1, 2, 3, 3}, KVPageIndices: []int32{20, 21, 22}, KVLastPageLen: []int32{2, 2, 2, 0}},
	}
	lay, err := Build(root, 4)
	require.NoError(t, err)
	require.Equal(t, want, lay.Levels)

	var dst Layout
	require.NoError(t, BuildTo(&dst, root, 4))
	require.Equal(t, want, dst.Levels)

	// A tree that is all empty still has its last level, with empty groups.
	lay, err = Build(&Node{Requests: []Request{{ID: 0, QOLen: 3}}}, 4)
	require.NoError(t, err)
	require.Equal(t, []Level{{QOIndptr: []int32{0, 3}, KVIndptr: []int32{0, 0}, KVLastPageLen: []int32{0}}}, lay.Levels)
}
