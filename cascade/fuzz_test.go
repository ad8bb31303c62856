package cascade

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// decodeTree turns fuzz bytes into a prefix tree. Byte 0 picks page_size
// (1..8); then each 3-byte command (op, a, b) acts on node a % nodes:
//
//	op%3 == 0: add a child with b%4 fresh pages (full, except the last,
//	           which holds 1 + (b>>2)%page_size tokens)
//	op%3 == 1: add a request with qo_len b%4
//	op%3 == 2: add a child that reuses page id b (pages may repeat)
//
// It returns the tree, page_size and, per request id, the expected pages of
// its prefix path and the path itself (root first).
func decodeTree(data []byte) (root *Node, pageSize int, want map[int][]int32, pathOf map[int][]*Node) {
	pageSize = 1
	if len(data) > 0 {
		pageSize = 1 + int(data[0]%8)
		data = data[1:]
	}
	root = &Node{}
	nodes := []*Node{root}
	parent := map[*Node]*Node{}
	next := int32(0)
	ids := 0
	for ; len(data) >= 3; data = data[3:] {
		op, n := data[0]%3, nodes[int(data[1])%len(nodes)]
		b := data[2]
		switch op {
		case 0, 2:
			c := &Node{}
			np := int(b % 4)
			if op == 2 {
				np = 1
			}
			for i := 0; i < np; i++ {
				if op == 2 {
					c.Pages = append(c.Pages, int32(b))
				} else {
					c.Pages = append(c.Pages, 1000+next)
					next++
				}
			}
			if np > 0 {
				c.LastPageLen = int32(1 + int(b>>2)%pageSize)
			}
			n.Children = append(n.Children, c)
			parent[c] = n
			nodes = append(nodes, c)
		case 1:
			n.Requests = append(n.Requests, Request{ID: ids, QOLen: int(b % 4)})
			ids++
		}
	}
	want, pathOf = map[int][]int32{}, map[int][]*Node{}
	for _, n := range nodes {
		for _, r := range n.Requests {
			var path []*Node
			for x := n; x != nil; x = parent[x] {
				path = append(path, x)
			}
			slices.Reverse(path)
			var pages []int32
			for _, x := range path {
				pages = append(pages, x.Pages...)
			}
			want[r.ID], pathOf[r.ID] = pages, path
		}
	}
	return root, pageSize, want, pathOf
}

// FuzzBuild checks the level builder on random trees: every level is valid
// CSR over the same rows, each request's rows sit inside one group of each
// level, the last level has one group per request, and the pages of a
// request's groups, level 0 first, are its prefix path's pages in order.
func FuzzBuild(f *testing.F) {
	f.Add([]byte{3})                                              // no requests
	f.Add([]byte{3, 1, 0, 1})                                     // one request at the root
	f.Add([]byte{3, 0, 0, 7, 0, 1, 6, 1, 1, 1, 1, 2, 2, 1, 0, 3}) // branches and requests
	f.Add([]byte{0, 0, 0, 3, 0, 1, 3, 2, 0, 9, 1, 2, 1, 1, 3, 0}) // page_size 1, a shared page id
	f.Add([]byte{7, 0, 0, 255, 0, 1, 255, 0, 2, 255, 1, 3, 3, 1, 0, 0, 1, 1, 2})
	f.Fuzz(checkBuild)
}

// checkBuild is FuzzBuild's body. It uses plain comparisons rather than
// testify in its loops: every require call runs t.Helper, which walks the
// stack, and that dominated the fuzzer's time.
func checkBuild(t *testing.T, data []byte) {
	if len(data) > 1+3*48 { // 48 commands build trees deep and wide enough; longer inputs only slow minimization
		return
	}
	root, pageSize, want, pathOf := decodeTree(data)
	lay, err := Build(root, pageSize)
	if len(want) == 0 {
		require.ErrorIs(t, err, ErrInvalidTree)
		return
	}
	require.NoError(t, err)
	R := len(want)
	require.Len(t, lay.RequestOrder, R)
	nnz := lay.RequestQOIndptr[R]
	maxPage := int32(0)
	for _, lv := range lay.Levels {
		for _, p := range lv.KVPageIndices {
			maxPage = max(maxPage, p)
		}
	}
	for l, lv := range lay.Levels {
		groups := len(lv.QOIndptr) - 1
		switch {
		case groups < 1:
			t.Fatalf("level %d has no groups", l)
		case len(lv.KVIndptr) != groups+1:
			t.Fatalf("level %d: kv_indptr has %d entries for %d groups", l, len(lv.KVIndptr), groups)
		case lv.QOIndptr[0] != 0 || lv.QOIndptr[groups] != nnz:
			t.Fatalf("level %d: qo_indptr %v does not span [0, %d]", l, lv.QOIndptr, nnz)
		case len(lv.KVPageIndices) != int(lv.KVIndptr[groups]):
			t.Fatalf("level %d: %d kv_indices, kv_indptr ends at %d", l, len(lv.KVPageIndices), lv.KVIndptr[groups])
		}
		for g := 0; g < groups; g++ {
			if lv.QOIndptr[g] > lv.QOIndptr[g+1] {
				t.Fatalf("level %d: qo_indptr decreases at group %d: %v", l, g, lv.QOIndptr)
			}
		}
		tab := lv.Table()
		if err := tab.Validate(pageSize, int(maxPage)+1); err != nil {
			t.Fatalf("level %d: %v", l, err)
		}
	}
	last := lay.Levels[len(lay.Levels)-1]
	if !slices.Equal(lay.RequestQOIndptr, last.QOIndptr) {
		t.Fatalf("the last level must have one group per request, in request order: qo_indptr %v, requests %v", last.QOIndptr, lay.RequestQOIndptr)
	}

	// Depths whose groups hold no pages are dropped, but the deepest one
	// always stays as the last level.
	treeDepth := 0
	for _, path := range pathOf {
		treeDepth = max(treeDepth, len(path))
	}
	for k, id := range lay.RequestOrder {
		if got := lay.RequestQOIndptr[k+1] - lay.RequestQOIndptr[k]; got != int32(lay.QOLenByID[id]) {
			t.Fatalf("request %d has %d rows, qo_len %d", id, got, lay.QOLenByID[id])
		}
		var got []int32
		for l, lv := range lay.Levels {
			g := groupOf(t, lv, lay.RequestQOIndptr[k], lay.RequestQOIndptr[k+1], l == len(lay.Levels)-1, k)
			if g < 0 {
				continue // a request with no rows below the last level: no group to find
			}
			got = append(got, lv.KVPageIndices[lv.KVIndptr[g]:lv.KVIndptr[g+1]]...)
		}
		if lay.QOLenByID[id] > 0 && !slices.Equal(want[id], got) {
			t.Fatalf("request %d: pages over all levels %v, want its prefix path's %v", id, got, want[id])
		}
		// The last level's group k is the request's own: its node at the
		// last depth, or nothing when its path is shorter.
		path := pathOf[id]
		var wantLast []int32
		wantLen := int32(0)
		if len(path) == treeDepth {
			wantLast, wantLen = path[len(path)-1].Pages, path[len(path)-1].LastPageLen
		}
		if gotLast := last.KVPageIndices[last.KVIndptr[k]:last.KVIndptr[k+1]]; !slices.Equal(wantLast, gotLast) || wantLen != last.KVLastPageLen[k] {
			t.Fatalf("request %d: last level pages %v (last %d), want %v (last %d)", id, gotLast, last.KVLastPageLen[k], wantLast, wantLen)
		}
	}
	rows := lay.QueryRows()
	require.Len(t, rows, int(nnz))
	seen := make([]bool, nnz)
	for _, r := range rows {
		if seen[r] {
			t.Fatalf("QueryRows is not a permutation: row %d twice", r)
		}
		seen[r] = true
	}
}

// groupOf finds the group of level lv holding rows [s, e) of request k
// (the k-th group on the last level). It fails when the rows straddle
// groups, and returns -1 for an empty row range above the last level.
func groupOf(t *testing.T, lv Level, s, e int32, last bool, k int) int {
	if last {
		return k
	}
	if s == e {
		return -1
	}
	for g := 0; g+1 < len(lv.QOIndptr); g++ {
		if lv.QOIndptr[g] <= s && s < lv.QOIndptr[g+1] {
			if e > lv.QOIndptr[g+1] {
				t.Fatalf("request rows [%d, %d) straddle groups: qo_indptr %v", s, e, lv.QOIndptr)
			}
			return g
		}
	}
	t.Fatalf("row %d in no group: qo_indptr %v", s, lv.QOIndptr)
	return -1
}
