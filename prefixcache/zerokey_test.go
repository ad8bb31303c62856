package prefixcache

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/allocator"
)

// The zero Key is the default namespace, as its doc says: a page published
// under Key{} is found through Key(Namespace{}) and the other way round,
// whatever the seed; other namespaces still never see it.
func TestZeroKeyIsTheDefaultNamespace(t *testing.T) {
	for _, seed := range []uint64{0, 1, 0xdeadbeef} {
		a, err := allocator.New(allocator.Config{NumPages: 8})
		require.NoError(t, err)
		c, err := New(Config{NumPages: 8, PageSize: 2, Refs: a, Seed: seed})
		require.NoError(t, err)
		pages := make([]PageID, 2)
		require.NoError(t, a.Alloc(pages))
		tokens := []int32{1, 2, 3, 4}
		h, added, err := c.Publish(Handle{}, Key{}, pages[0], tokens[:2], 0)
		require.NoError(t, err)
		require.True(t, added)
		_, added, err = c.Publish(h, c.Key(Namespace{}), pages[1], tokens[2:], 0)
		require.NoError(t, err)
		require.True(t, added)

		got, _ := c.Match(nil, c.Key(Namespace{}), tokens, 2)
		require.Equal(t, pages, got, "seed %d: Key{} page not found through Key(Namespace{})", seed)
		got, _ = c.Match(nil, Key{}, tokens, 2)
		require.Equal(t, pages, got, "seed %d", seed)
		got, _ = c.Match(nil, c.Key(Namespace{Tenant: "x"}), tokens, 2)
		require.Empty(t, got)
		require.NoError(t, c.CheckInvariants())
	}
}
