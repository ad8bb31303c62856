package tier

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// mapStore is a RemoteStore over a map, for the chain's tests.
type mapStore struct {
	pages map[Digest][]byte
	st    RemoteStats
}

func (m *mapStore) Fetch(_ context.Context, pages []RemotePage) int {
	m.st.Lookups++
	for i := range pages {
		b, ok := m.pages[pages[i].Digest]
		if !ok {
			m.st.Misses++
			return i
		}
		copy(pages[i].Data, b)
		m.st.Hits++
	}
	return len(pages)
}

func (m *mapStore) Store(p *RemotePage) bool {
	m.pages[p.Digest] = append([]byte(nil), p.Data...)
	m.st.Stored++
	return true
}

func (m *mapStore) Stats() RemoteStats { return m.st }

// chainOf returns a prefix of n one-token pages, page i holding token i
// and the byte i.
func chainOf(n int) []RemotePage {
	var pages []RemotePage
	d := NamespaceRoot("", "", "")
	for i := range n {
		nd := Next(nil, d, []int32{int32(i)})
		pages = append(pages, RemotePage{Digest: nd, Parent: d, Tokens: []int32{int32(i)}, Data: []byte{byte(i)}})
		d = nd
	}
	return pages
}

func TestChainFetchesInOrderAndPromotes(t *testing.T) {
	near, far := &mapStore{pages: map[Digest][]byte{}}, &mapStore{pages: map[Digest][]byte{}}
	c := Chain(near, far)
	pages := chainOf(4)
	require.True(t, c.Store(&pages[0]))
	for i := 1; i < 3; i++ {
		far.Store(&pages[i]) // only the far store has pages 1 and 2
	}
	got := make([]RemotePage, 4)
	for i := range got {
		got[i] = pages[i]
		got[i].Data = []byte{0xff}
	}
	require.Equal(t, 3, c.Fetch(context.Background(), got))
	for i := range 3 {
		require.Equal(t, []byte{byte(i)}, got[i].Data)
	}
	require.Len(t, near.pages, 3, "pages 1 and 2 were promoted to the near store")
	require.EqualValues(t, 2, c.Stats().Lookups)
	require.EqualValues(t, 3, c.Stats().Hits)
	require.EqualValues(t, 2, c.Stats().Misses)
}
