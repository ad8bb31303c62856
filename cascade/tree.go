package cascade

import (
	"errors"
	"fmt"
)

// ErrInvalidTree is wrapped by every [Build] error: a malformed node, a
// request listed twice or missing, a node reachable twice.
var ErrInvalidTree = errors.New("cascade: invalid prefix tree")

// Request is a request whose prefix path ends at a node.
type Request struct {
	// ID is the caller's index of the request: the IDs of a tree must be
	// exactly 0..R-1, each once.
	ID int
	// QOLen is the number of query rows (tokens) of the request, >= 0.
	QOLen int
}

// Node is a run of KV pages shared by every request in its subtree.
type Node struct {
	// Pages are the physical page ids of this node's own KV segment, in
	// token order. Tokens continue from the parent's segment.
	Pages []int32
	// LastPageLen is the number of tokens in the last of Pages,
	// 1..page_size, and 0 when Pages is empty. Only a node at the deepest
	// level usually has a partial last page: a request's KV as one flat page
	// list exists only when every node above its last has full pages, but
	// cascade attention does not need that.
	LastPageLen int32
	// Children continue this node's segment, each for its own subtree.
	Children []*Node
	// Requests end here: their prefix path is the root ... this node.
	Requests []Request
}

// Layout is the output of [Build].
type Layout struct {
	// Levels are the per-level arrays, level 0 (the root) first.
	Levels []Level
	// RequestOrder lists request IDs in query order: the rows of
	// RequestOrder[k] are RequestQOIndptr[k]:RequestQOIndptr[k+1].
	RequestOrder []int
	// RequestQOIndptr has length len(RequestOrder)+1, starting at 0.
	RequestQOIndptr []int32
	// QOLenByID[id] is the query count of request id.
	QOLenByID []int
}

// QueryRows returns the row permutation between the caller's order and the
// cascade's: rows[r] is the row, in ID order (request 0's queries first,
// then request 1's, ...), whose query the cascade holds in row r. Reorder
// with qCascade[r] = qCaller[rows[r]] before [Run] and
// oCaller[rows[r]] = oCascade[r] after.
func (l *Layout) QueryRows() []int32 {
	start := make([]int32, len(l.QOLenByID)+1)
	for id, n := range l.QOLenByID {
		start[id+1] = start[id] + int32(n)
	}
	rows := make([]int32, 0, start[len(l.QOLenByID)])
	for k, id := range l.RequestOrder {
		for i := int32(0); i < l.RequestQOIndptr[k+1]-l.RequestQOIndptr[k]; i++ {
			rows = append(rows, start[id]+i)
		}
	}
	return rows
}

// Build derives the per-level arrays of a prefix tree. Each depth of the
// tree, down to the deepest node that has a request at or below it, is a
// level, except a depth (other than the deepest) whose groups hold no page
// at all, which is dropped; nodes without requests below them are not
// attended and do not appear. At the level of depth l:
//
//   - l below the last: one group per node at depth l (all the requests
//     below it, its pages), and one empty group (no pages, last_page_len 0)
//     per request whose path ends above depth l;
//   - the last level: one group per request, holding the pages of its
//     path's node at that depth, or none.
//
// Queries are ordered depth-first: each child's subtree in order, then the
// node's own requests in order (so a request that ends at a branch node
// comes where an empty leaf after its siblings would put it). Every request gets its own last-level group, so the
// causal mask of the last level is aligned per request.
//
// Build keeps one path stack while it walks the tree, so its memory is
// linear in the tree's depth and size plus the layout it returns (it is
// [Builder.BuildTo] into a fresh Layout).
func Build(root *Node, pageSize int) (*Layout, error) {
	var b Builder
	lay := &Layout{}
	if err := b.BuildTo(lay, root, pageSize); err != nil {
		return nil, err
	}
	return lay, nil
}

func checkNode(n *Node, pageSize, depth int) error {
	switch {
	case len(n.Pages) == 0 && n.LastPageLen != 0:
		return fmt.Errorf("%w: node at depth %d has no pages but last_page_len %d (want 0)", ErrInvalidTree, depth, n.LastPageLen)
	case len(n.Pages) > 0 && (n.LastPageLen < 1 || int(n.LastPageLen) > pageSize):
		return fmt.Errorf("%w: node at depth %d has last_page_len %d outside [1, page_size %d]", ErrInvalidTree, depth, n.LastPageLen, pageSize)
	}
	for i, p := range n.Pages {
		if p < 0 {
			return fmt.Errorf("%w: node at depth %d has page id %d < 0 at position %d", ErrInvalidTree, depth, p, i)
		}
	}
	return nil
}
