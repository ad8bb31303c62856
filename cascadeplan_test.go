package pagedkv

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// checkCascadeCoversPlan checks the cascade invariant against the flat
// arrays of the same plan: for every request, the pages of its groups,
// level 0 first, are exactly its flat page list; every level but the last
// holds only full pages before the request's first query token; and the
// last level's group is the request's own, with its last page length.
func checkCascadeCoversPlan(t testing.TB, p *Plan, pageSize int) {
	t.Helper()
	lay := p.Cascade
	nb := len(p.Requests)
	require.Len(t, lay.RequestOrder, nb)
	for k, b := range lay.RequestOrder {
		row := lay.RequestQOIndptr[k]
		qo := p.QOIndptr[b+1] - p.QOIndptr[b]
		require.Equal(t, qo, lay.RequestQOIndptr[k+1]-row, "request %d rows", b)
		var pages []int32
		for l, lv := range lay.Levels {
			g := -1
			for i := 0; i+1 < len(lv.QOIndptr); i++ {
				if lv.QOIndptr[i] <= row && (row < lv.QOIndptr[i+1] || qo == 0 && row == lv.QOIndptr[i+1]) {
					g = i
					break
				}
			}
			require.GreaterOrEqual(t, g, 0, "request %d has no group on level %d", b, l)
			seg := lv.KVIndices[lv.KVIndptr[g]:lv.KVIndptr[g+1]]
			last := l == len(lay.Levels)-1
			if last {
				require.Equal(t, lv.QOIndptr[g]+qo, lv.QOIndptr[g+1], "request %d: its last-level group holds other rows", b)
				if len(seg) > 0 {
					require.Equal(t, p.KVLastPageLen[b], lv.KVLastPageLen[g], "request %d last page length", b)
				}
			} else if len(seg) > 0 {
				require.Equal(t, int32(pageSize), lv.KVLastPageLen[g], "request %d: level %d segment ends in a partial page", b, l)
			}
			pages = append(pages, seg...)
			if !last {
				shared := len(pages) * pageSize
				require.LessOrEqual(t, shared, int(p.SeqLens[b]-qo), "request %d: a shared level holds one of its query tokens", b)
			}
		}
		require.Equal(t, p.KVPageIndices[p.KVIndptr[b]:p.KVIndptr[b+1]], pages, "request %d: cascade pages vs flat pages", b)
	}
}
