package prefixcache

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestIndexMatchesMap drives the open-addressing index with hashes that
// crowd a few home slots (long probe runs that wrap around the table) and
// checks every chain head against a map after each insert and delete.
func TestIndexMatchesMap(t *testing.T) {
	const numPages = 16
	rng := rand.New(rand.NewPCG(5, 6))
	for range 200 {
		ix := newIndex(numPages)
		require.Len(t, ix.slots, 32)
		nodes := make([]node, numPages)
		for i := range nodes {
			nodes[i].nextHash = none
		}
		live := map[int32]bool{}
		want := map[uint64][]int32{} // hash -> chain, head first
		for range 300 {
			p := int32(rng.IntN(numPages))
			if !live[p] {
				// Home slots 30, 31, 0 and 1 only: runs wrap the table's end.
				h := uint64(rng.IntN(3))<<40 | uint64(30+rng.IntN(4))&31
				nodes[p].hash = h
				nodes[p].nextHash = ix.push(nodes, h, p)
				want[h] = append([]int32{p}, want[h]...)
				live[p] = true
			} else {
				h := nodes[p].hash
				ix.drop(nodes, h, p, nodes[p].nextHash)
				chain := want[h]
				for i, x := range chain {
					if x == p {
						want[h] = append(chain[:i:i], chain[i+1:]...)
						break
					}
				}
				if len(want[h]) == 0 {
					delete(want, h)
				}
				nodes[p] = node{nextHash: none}
				live[p] = false
			}
			require.Equal(t, len(want), ix.n)
			for h, chain := range want {
				var got []int32
				for x := ix.get(nodes, h); x != none; x = nodes[x].nextHash {
					got = append(got, x)
				}
				require.Equal(t, chain, got, "chain of hash %#x", h)
			}
		}
	}
}
