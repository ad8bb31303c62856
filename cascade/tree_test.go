package cascade

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// flashInferFigure is FlashInfer's cascade data-layout figure
// (docs/tutorials/kv_layout.rst, page_size 4): a shared system prompt
// (pages 0-3, 13 tokens), three branches of 2 pages, and one suffix per
// request. Requests 2, 3 and 4 have no suffix pages; asLeaves says whether
// they hang on empty leaves (as drawn) or directly on their branch node.
func flashInferFigure(asLeaves bool) *Node {
	leaf := func(id, qoLen int, lastLen int32, pages ...int32) *Node {
		return &Node{Pages: pages, LastPageLen: lastLen, Requests: []Request{{ID: id, QOLen: qoLen}}}
	}
	a := &Node{Pages: []int32{4, 5}, LastPageLen: 1, Children: []*Node{leaf(0, 1, 1, 10), leaf(1, 1, 1, 11, 12)}}
	b := &Node{Pages: []int32{6, 7}, LastPageLen: 1}
	if asLeaves {
		a.Children = append(a.Children, leaf(2, 2, 0))
		b.Children = []*Node{leaf(3, 1, 0), leaf(4, 1, 0)}
	} else {
		a.Requests = []Request{{ID: 2, QOLen: 2}}
		b.Requests = []Request{{ID: 3, QOLen: 1}, {ID: 4, QOLen: 1}}
	}
	c := &Node{Pages: []int32{8, 9}, LastPageLen: 1, Children: []*Node{leaf(5, 1, 3, 13), leaf(6, 1, 3, 14), leaf(7, 1, 4, 15)}}
	return &Node{Pages: []int32{0, 1, 2, 3}, LastPageLen: 1, Children: []*Node{a, b, c}}
}

// TestBuildFlashInferFigure checks the builder against the figure's arrays.
// The figure prints level 0's kv_page_indptr as [0, 3] while listing four
// pages; [0, 4] is the consistent value (FORMAT.md).
func TestBuildFlashInferFigure(t *testing.T) {
	want := []Level{
		//                   queries of the 9 tokens         pages per group               page ids                         tokens in last page
		{QOIndptr: []int32{0, 9}, KVIndptr: []int32{0, 4}, KVPageIndices: []int32{0, 1, 2, 3}, KVLastPageLen: []int32{1}},
		{QOIndptr: []int32{0, 4, 6, 9}, KVIndptr: []int32{0, 2, 4, 6}, KVPageIndices: []int32{4, 5, 6, 7, 8, 9}, KVLastPageLen: []int32{1, 1, 1}},
		{QOIndptr: []int32{0, 1, 2, 4, 5, 6, 7, 8, 9}, KVIndptr: []int32{0, 1, 3, 3, 3, 3, 4, 5, 6}, KVPageIndices: []int32{10, 11, 12, 13, 14, 15}, KVLastPageLen: []int32{1, 1, 0, 0, 0, 3, 3, 4}},
	}
	for name, asLeaves := range map[string]bool{"empty leaves": true, "requests on branch nodes": false} {
		t.Run(name, func(t *testing.T) {
			lay, err := Build(flashInferFigure(asLeaves), 4)
			require.NoError(t, err)
			require.Equal(t, want, lay.Levels)
			assert.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7}, lay.RequestOrder)
			assert.Equal(t, []int32{0, 1, 2, 4, 5, 6, 7, 8, 9}, lay.RequestQOIndptr)
			assert.Equal(t, []int32{0, 1, 2, 3, 4, 5, 6, 7, 8}, lay.QueryRows(), "the figure's requests are already in depth-first order")
		})
	}
}

// TestBuildQueryOrder: requests listed out of ID order come back in
// depth-first order, and QueryRows maps each cascade row to its caller row.
func TestBuildQueryOrder(t *testing.T) {
	//            root [p0]
	//           /          \
	//   x [p1] {req 2: 3q}   y [p2]   {req 0: 1q}
	//                          \
	//                           z [p3] {req 1: 2q}
	root := &Node{Pages: []int32{0}, LastPageLen: 4, Children: []*Node{
		{Pages: []int32{1}, LastPageLen: 2, Requests: []Request{{ID: 2, QOLen: 3}}},
		{Pages: []int32{2}, LastPageLen: 4, Children: []*Node{
			{Pages: []int32{3}, LastPageLen: 1, Requests: []Request{{ID: 1, QOLen: 2}}},
		}},
	}, Requests: []Request{{ID: 0, QOLen: 1}}}
	lay, err := Build(root, 4)
	require.NoError(t, err)
	assert.Equal(t, []int{2, 1, 0}, lay.RequestOrder)
	// Caller rows: request 0 -> row 0, request 1 -> rows 1-2, request 2 -> rows 3-5.
	assert.Equal(t, []int32{3, 4, 5, 1, 2, 0}, lay.QueryRows())
	want := []Level{
		{QOIndptr: []int32{0, 6}, KVIndptr: []int32{0, 1}, KVPageIndices: []int32{0}, KVLastPageLen: []int32{4}},
		// req 2 alone at x, req 1 at y, req 0 ends at the root: empty group.
		{QOIndptr: []int32{0, 3, 5, 6}, KVIndptr: []int32{0, 1, 2, 2}, KVPageIndices: []int32{1, 2}, KVLastPageLen: []int32{2, 4, 0}},
		{QOIndptr: []int32{0, 3, 5, 6}, KVIndptr: []int32{0, 0, 1, 1}, KVPageIndices: []int32{3}, KVLastPageLen: []int32{0, 1, 0}},
	}
	require.Equal(t, want, lay.Levels)
}

func TestBuildErrors(t *testing.T) {
	shared := &Node{Pages: []int32{1}, LastPageLen: 1, Requests: []Request{{ID: 0, QOLen: 1}}}
	tests := map[string]struct {
		root     *Node
		pageSize int
	}{
		"nil root":             {nil, 4},
		"page size 0":          {&Node{Requests: []Request{{ID: 0}}}, 0},
		"no requests":          {&Node{Pages: []int32{0}, LastPageLen: 1}, 4},
		"last_page_len > N":    {&Node{Pages: []int32{0}, LastPageLen: 5, Requests: []Request{{ID: 0}}}, 4},
		"last_page_len 0":      {&Node{Pages: []int32{0}, LastPageLen: 0, Requests: []Request{{ID: 0}}}, 4},
		"no pages, last 1":     {&Node{LastPageLen: 1, Requests: []Request{{ID: 0}}}, 4},
		"negative page id":     {&Node{Pages: []int32{-1}, LastPageLen: 1, Requests: []Request{{ID: 0}}}, 4},
		"duplicate request id": {&Node{Requests: []Request{{ID: 0}, {ID: 0}}}, 4},
		"id gap":               {&Node{Requests: []Request{{ID: 0}, {ID: 2}}}, 4},
		"negative qo_len":      {&Node{Requests: []Request{{ID: 0, QOLen: -1}}}, 4},
		"node reachable twice": {&Node{Children: []*Node{shared, shared}}, 4},
		"nil child":            {&Node{Children: []*Node{nil}, Requests: []Request{{ID: 0}}}, 4},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Build(tc.root, tc.pageSize)
			require.ErrorIs(t, err, ErrInvalidTree)
			t.Log(err)
		})
	}
}
