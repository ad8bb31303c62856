package disk

import (
	"context"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/tier"
)

// setPieces makes s read its Fetch runs in pieces of n pages (the
// default is 512 KiB, a single piece for the tests' small pages), so
// that Fetch's goroutine and the read helper share them.
func setPieces(s *Store, n int) {
	s.readMu.Lock()
	s.piecePages = n
	s.runSeqs = nil // Fetch sizes its buffers for n again
	s.readMu.Unlock()
}

// TestFetchServesUpToFirstFailure: a run read in pieces (1 to 4 pages,
// some read by the helper) serves exactly the pages before the first
// that fails, whichever piece it is in and whichever part of the slot is
// damaged (header, value head, page bytes, checksum); the failure is
// recorded once, the served pages hold their K/V, and the page is served
// again once its slot is whole. A run whose read fails serves nothing and
// counts one error.
func TestFetchServesUpToFirstFailure(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, testConfig(dir, 8))
	defer s.Close()
	chain := newUniverse(testFormat, 1, 8).chains[0]
	for i := range chain {
		require.True(t, s.Store(&chain[i]))
	}
	flush(t, s)
	for i := range chain {
		require.EqualValues(t, i, s.index[chain[i].Digest], "page %d: one run of consecutive slots", i)
	}
	valueLen, valueOff, _ := slotGeometry(s.cfg)
	rng := rand.New(rand.NewPCG(7, 31))
	parts := []struct {
		name   string
		lo, hi int // byte range of the slot damaged
	}{
		{"header", 0, slotHeaderUsed},
		{"value head", valueOff, valueOff + s.dataOff},
		{"page bytes", valueOff + s.dataOff, valueOff + valueLen - tier.ValueCRCBytes},
		{"checksum", valueOff + valueLen - tier.ValueCRCBytes, valueOff + valueLen},
	}
	for pieces := 1; pieces <= 4; pieces++ {
		setPieces(s, pieces)
		require.Equal(t, len(chain), fetchChecked(t, s, request(chain)), "%d-page pieces, nothing damaged", pieces)
		for bad := range chain {
			part := parts[rng.IntN(len(parts))]
			good := readSlot(t, dir, bad)
			flip(t, dir, bad, part.lo+rng.IntN(part.hi-part.lo))
			rejected := s.Stats().Rejected
			require.Equal(t, bad, fetchChecked(t, s, request(chain)), "%d-page pieces, page %d's %s damaged", pieces, bad, part.name)
			require.Equal(t, rejected+1, s.Stats().Rejected, "%d-page pieces, page %d's %s damaged", pieces, bad, part.name)
			writeSlot(t, dir, bad, good)
			require.Equal(t, len(chain), fetchChecked(t, s, request(chain)), "%d-page pieces, page %d whole again", pieces, bad)
		}
	}
	// A read that fails (a segment file open for writing only: EBADF)
	// serves nothing and counts one error, however many pieces.
	rw := s.segs[0]
	wo, err := os.OpenFile(rw.Name(), os.O_WRONLY, 0)
	require.NoError(t, err)
	s.segs[0] = wo
	errs := s.Stats().Errors
	require.Zero(t, s.Fetch(context.Background(), request(chain)))
	require.Equal(t, errs+1, s.Stats().Errors)
	s.segs[0] = rw
	require.NoError(t, wo.Close())
	require.Equal(t, len(chain), fetchChecked(t, s, request(chain)))
	require.NoError(t, s.CheckInvariants())
}
