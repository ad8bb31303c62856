package cascade

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// byteTree turns bytes into a prefix tree, valid or not: byte 0 picks
// page_size (1..8); then each 3-byte command (op, a, b) acts on node
// a % nodes:
//
//	op%8 in 0..2: add a child with b%4 pages (ids from b), last page
//	              1 + (b>>2)%page_size tokens
//	op%8 in 3..5: add a request with the next id and qo_len b%4
//	op%8 == 6:    a malformed tree, by b%6: a request with id b (maybe
//	              repeated or out of range), qo_len -1, last_page_len 0 on
//	              pages, a negative page id, a child already in the tree,
//	              a nil child
//	op%8 == 7:    add an empty child
func byteTree(data []byte) (*Node, int) {
	pageSize := 1
	if len(data) > 0 {
		pageSize = 1 + int(data[0]%8)
		data = data[1:]
	}
	root := &Node{}
	nodes := []*Node{root}
	nextID := 0
	for ; len(data) >= 3; data = data[3:] {
		op, n, b := data[0]%8, nodes[int(data[1])%len(nodes)], int(data[2])
		switch op {
		case 0, 1, 2:
			c := &Node{}
			for i := range b % 4 {
				c.Pages = append(c.Pages, int32(b*4+i))
			}
			if len(c.Pages) > 0 {
				c.LastPageLen = int32(1 + (b>>2)%pageSize)
			}
			n.Children = append(n.Children, c)
			nodes = append(nodes, c)
		case 3, 4, 5:
			n.Requests = append(n.Requests, Request{ID: nextID, QOLen: b % 4})
			nextID++
		case 6:
			switch b % 6 {
			case 0:
				n.Requests = append(n.Requests, Request{ID: b%5 - 1, QOLen: 1})
			case 1:
				n.Requests = append(n.Requests, Request{ID: nextID, QOLen: -1})
				nextID++
			case 2:
				n.Children = append(n.Children, &Node{Pages: []int32{int32(b)}})
			case 3:
				n.Children = append(n.Children, &Node{Pages: []int32{-1}, LastPageLen: 1})
			case 4:
				n.Children = append(n.Children, nodes[b%len(nodes)])
			case 5:
				n.Children = append(n.Children, nil)
			}
		case 7:
			c := &Node{}
			n.Children = append(n.Children, c)
			nodes = append(nodes, c)
		}
	}
	return root, pageSize
}

// nilEmpty maps empty slices to nil, the one way BuildTo's output may differ
// from Build's.
func nilEmpty(l *Layout) *Layout {
	c := *l
	c.Levels = make([]Level, len(l.Levels))
	for i, lv := range l.Levels {
		for _, s := range []*[]int32{&lv.QOIndptr, &lv.KVIndptr, &lv.KVPageIndices, &lv.KVLastPageLen} {
			if len(*s) == 0 {
				*s = nil
			}
		}
		c.Levels[i] = lv
	}
	return &c
}

// checkBuildTo builds the tree with Build and with b.BuildTo into dst (which
// holds some earlier layout): the same layout or the same error, and dst
// unchanged on error.
func checkBuildTo(t *testing.T, b *Builder, dst *Layout, data []byte) {
	t.Helper()
	root, pageSize := byteTree(data)
	want, wantErr := Build(root, pageSize)
	before := nilEmpty(dst)
	err := b.BuildTo(dst, root, pageSize)
	if wantErr != nil {
		require.ErrorIs(t, err, ErrInvalidTree)
		require.EqualError(t, err, wantErr.Error(), "tree bytes %v", data)
		require.Equal(t, before, nilEmpty(dst), "a failed BuildTo changed dst")
		return
	}
	require.NoError(t, err, "tree bytes %v", data)
	require.Equal(t, nilEmpty(want), nilEmpty(dst), "tree bytes %v", data)
}

// TestBuildToEqualsBuild: one Builder and one destination reused across
// random trees, valid and malformed, large and small.
func TestBuildToEqualsBuild(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var b Builder
	var dst Layout
	for range 3000 {
		data := make([]byte, 1+3*rng.IntN(40))
		for i := range data {
			data[i] = byte(rng.UintN(256))
		}
		checkBuildTo(t, &b, &dst, data)
	}
}

func TestBuildToErrorsOnArguments(t *testing.T) {
	var dst Layout
	require.ErrorIs(t, BuildTo(&dst, nil, 4), ErrInvalidTree)
	require.ErrorIs(t, BuildTo(&dst, &Node{Requests: []Request{{ID: 0}}}, 0), ErrInvalidTree)
	require.ErrorIs(t, BuildTo(&dst, &Node{}, 4), ErrInvalidTree, "no requests")
	require.Equal(t, Layout{}, dst)
}

// TestBuilderSteadyStateAllocatesNothing: FlashInfer's 3-level figure,
// rebuilt into the same destination, allocates nothing after the first
// build.
func TestBuilderSteadyStateAllocatesNothing(t *testing.T) {
	root := flashInferFigureForAllocs()
	var b Builder
	var dst Layout
	require.NoError(t, b.BuildTo(&dst, root, 4))
	want, err := Build(root, 4)
	require.NoError(t, err)
	require.Equal(t, nilEmpty(want), nilEmpty(&dst))
	allocs := testing.AllocsPerRun(100, func() {
		if err := b.BuildTo(&dst, root, 4); err != nil {
			panic(err)
		}
	})
	require.Zero(t, allocs)
}

// flashInferFigureForAllocs: a shared root prefix, two branches, eight
// requests with their own pages, as in FlashInfer's cascade figure.
func flashInferFigureForAllocs() *Node {
	leaf := func(id int, pages ...int32) *Node {
		n := &Node{Pages: pages, Requests: []Request{{ID: id, QOLen: 1 + id%3}}}
		if len(pages) > 0 {
			n.LastPageLen = 2
		}
		return n
	}
	return &Node{Pages: []int32{0, 1, 2}, LastPageLen: 4, Children: []*Node{
		{Pages: []int32{3, 4}, LastPageLen: 4, Children: []*Node{leaf(0, 10), leaf(1, 11, 12), leaf(2, 13), leaf(3)}},
		{Pages: []int32{5}, LastPageLen: 4, Children: []*Node{leaf(4, 14), leaf(5, 15), leaf(6, 16, 17)}},
		leaf(7, 18),
	}}
}

// FuzzBuildTo: BuildTo into a reused destination equals Build, error for
// error, and leaves the destination alone on error.
func FuzzBuildTo(f *testing.F) {
	f.Add([]byte{3, 0, 0, 5, 3, 1, 2, 0, 0, 9, 3, 2, 1})
	f.Add([]byte{1, 3, 0, 1, 3, 0, 2, 6, 0, 4})
	f.Add([]byte{7, 0, 0, 3, 6, 1, 1, 3, 1, 0, 7, 0, 0, 3, 2, 3})
	var b Builder
	var dst Layout
	f.Fuzz(func(t *testing.T, data []byte) {
		checkBuildTo(t, &b, &dst, data)
	})
}
