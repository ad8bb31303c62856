package tier

import "context"

// A store says where the pages it serves come from, so that a Manager can
// account each page a request reads by the medium that served it (the
// per-request cache reads of docs/cache-usage.md).

// MediumStore is implemented by a [RemoteStore] that names the medium it
// serves from: the disk store says [Disk], the Redis store [Remote]. A
// store without the method is taken as [Remote] ([StoreMedium]).
type MediumStore interface {
	Medium() Medium
}

// MediaFetcher is implemented by a [RemoteStore] made of several stores (a
// [Chain]): FetchMedia is its Fetch that also sets media[i], for each page
// i it filled, to the medium of the store that served it. len(media) must
// be at least len(pages).
type MediaFetcher interface {
	FetchMedia(ctx context.Context, pages []RemotePage, media []Medium) int
}

// StoreMedium returns the medium s serves from: s.Medium() when s is a
// [MediumStore], else [Remote].
func StoreMedium(s RemoteStore) Medium {
	if ms, ok := s.(MediumStore); ok {
		return ms.Medium()
	}
	return Remote
}

// FetchMedia is s.Fetch(ctx, pages) that also sets media[i] to the medium
// that served page i, for each page it filled: through s's own FetchMedia
// when s is a [MediaFetcher], else [StoreMedium](s) for every page.
// len(media) must be at least len(pages); it allocates nothing of its own.
func FetchMedia(ctx context.Context, s RemoteStore, pages []RemotePage, media []Medium) int {
	if mf, ok := s.(MediaFetcher); ok {
		return mf.FetchMedia(ctx, pages, media[:len(pages)])
	}
	n := s.Fetch(ctx, pages)
	n = max(0, min(n, len(pages)))
	m := StoreMedium(s)
	for i := range n {
		media[i] = m
	}
	return n
}

// MediumRank orders media by distance from the device: Device 0, Host 1,
// Disk 2, Remote 3 (any other value ranks last). Accounting that must name
// one medium for a page that several layer groups read from different
// tiers names the farthest.
func MediumRank(m Medium) int {
	switch m {
	case Device:
		return 0
	case Host:
		return 1
	case Disk:
		return 2
	case Remote:
		return 3
	}
	return 4
}
