package cascade

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// chain is a path of depth nodes of one page each with one request at the
// bottom.
func chain(depth int) *Node {
	root := &Node{Pages: []int32{0}, LastPageLen: 4}
	n := root
	for i := 1; i < depth; i++ {
		c := &Node{Pages: []int32{int32(i)}, LastPageLen: 4}
		n.Children = []*Node{c}
		n = c
	}
	n.Requests = []Request{{ID: 0, QOLen: 1}}
	return root
}

func buildBytes(t *testing.T, root *Node) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	lay, err := Build(root, 4)
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	require.NotEmpty(t, lay.Levels)
	return after.TotalAlloc - before.TotalAlloc
}

// The audit measured Build at 95 MB for a chain of depth 4000 (every node
// copied its path): doubling the depth must about double the memory, not
// quadruple it.
func TestBuildMemoryIsLinearInDepth(t *testing.T) {
	small, large := buildBytes(t, chain(2000)), buildBytes(t, chain(4000))
	t.Logf("depth 2000: %d bytes, depth 4000: %d bytes", small, large)
	require.Less(t, float64(large), 2.6*float64(small), "memory grows faster than the depth")
	require.Less(t, large, uint64(8<<20), "depth 4000 needs more than 8 MiB")
}
