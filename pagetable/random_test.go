package pagetable_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRandomOpsAgainstModel runs 100k mixed operations (add, add shared,
// reserve, fork, truncate, release, sliding-window release, pins, export,
// with failures mixed in) against reference.PageTableModel and compares the
// whole state after each one (see harness.check).
func TestRandomOpsAgainstModel(t *testing.T) {
	configs := []struct{ pageSize, numPages int }{
		{1, 24}, {2, 40}, {3, 48}, {8, 64}, {16, 96},
	}
	const totalOps = 100_000
	for i, c := range configs {
		t.Run(fmt.Sprintf("pageSize=%d/numPages=%d", c.pageSize, c.numPages), func(t *testing.T) {
			t.Parallel() // independent pools; halves the wall time on two cores
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			h := newHarness(t, c.pageSize, c.numPages, func() byte { return byte(rng.Uint32()) })
			for range totalOps / len(configs) {
				h.step()
				// Keep the population small so that sequences grow long
				// enough to share, copy and run out of pages.
				for len(h.live) > 12 {
					id := h.live[0]
					_ = h.tab.Release(id)
					_ = h.model.Release(uint64(id))
					h.dropLive(id)
				}
			}
			t.Logf("events: %v", h.seen)
			events := []string{"out of pages", "other error", "window pages released"}
			if c.pageSize > 1 { // page size 1 has no partial pages to copy
				events = append(events, "copy-on-write")
			}
			for _, event := range events {
				require.Greater(t, h.seen[event], 50, "too few %q events for the test to mean much", event)
			}
		})
	}
}

func FuzzTableOps(f *testing.F) {
	f.Add(uint8(4), uint8(8), []byte{})                                   // empty
	f.Add(uint8(1), uint8(4), []byte{0, 0, 5, 0, 9, 0, 0, 0, 1, 0, 4, 0}) // page size 1
	f.Add(uint8(4), uint8(2), []byte{0, 0, 9, 0, 9, 0, 9, 0, 9, 0, 9, 0}) // full pool
	f.Add(uint8(8), uint8(16), []byte{1, 0, 4, 0, 3, 0, 2, 0, 11, 0, 0, 0, 9, 0, 4, 0, 7, 0, 5, 0})
	f.Add(uint8(3), uint8(12), []byte{0, 0, 9, 0, 8, 0, 10, 0, 0, 0, 12, 0, 0, 0, 1, 0, 9, 0, 4, 0, 13, 0, 2, 0, 16, 0, 3, 0})
	f.Fuzz(func(t *testing.T, pageSize, numPages uint8, ops []byte) {
		i := 0
		next := func() byte {
			if i >= len(ops) {
				return 0
			}
			i++
			return ops[i-1]
		}
		h := newHarness(t, int(pageSize)%17+1, int(numPages)%64+1, next)
		for i < len(ops) {
			h.step()
		}
	})
}
