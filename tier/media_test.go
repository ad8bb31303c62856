package tier

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// diskLike is a mapStore that says it is a disk.
type diskLike struct{ *mapStore }

func (diskLike) Medium() Medium { return Disk }

// A chain names the store that served each page: a store with a Medium
// method by it, one without as Remote; a nested chain names its own
// stores'; and FetchMedia on a plain store names it for every page.
func TestFetchMediaNamesTheServingStore(t *testing.T) {
	disk, redis := diskLike{&mapStore{pages: map[Digest][]byte{}}}, &mapStore{pages: map[Digest][]byte{}}
	pages := chainOf(5)
	for i := range 2 {
		disk.Store(&pages[i])
	}
	for i := 2; i < 4; i++ {
		redis.Store(&pages[i])
	}
	fresh := func() []RemotePage {
		got := make([]RemotePage, len(pages))
		for i := range got {
			got[i] = pages[i]
			got[i].Data = []byte{0xff}
		}
		return got
	}
	for _, c := range []RemoteStore{Chain(disk, redis), Chain(Chain(disk), redis)} {
		media := []Medium{9, 9, 9, 9, 9}
		require.Equal(t, 4, FetchMedia(context.Background(), c, fresh(), media))
		require.Equal(t, []Medium{Disk, Disk, Remote, Remote, 9}, media)
		// The promoted pages are now on the disk.
		delete(redis.pages, pages[2].Digest)
		delete(redis.pages, pages[3].Digest)
		media = []Medium{9, 9, 9, 9, 9}
		require.Equal(t, 4, FetchMedia(context.Background(), c, fresh(), media))
		require.Equal(t, []Medium{Disk, Disk, Disk, Disk, 9}, media)
		for i := 2; i < 4; i++ {
			delete(disk.pages, pages[i].Digest)
			redis.Store(&pages[i])
		}
	}
	media := []Medium{9, 9, 9}
	require.Equal(t, 2, FetchMedia(context.Background(), disk, fresh()[:3], media))
	require.Equal(t, []Medium{Disk, Disk, 9}, media)
	require.Equal(t, 0, FetchMedia(context.Background(), redis, fresh()[:3], media))
	require.Equal(t, Remote, StoreMedium(redis))
	require.Equal(t, []int{0, 1, 2, 3}, []int{MediumRank(Device), MediumRank(Host), MediumRank(Disk), MediumRank(Remote)})
	require.Equal(t, "disk", Disk.String())
}
