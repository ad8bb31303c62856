package handoff

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/pagedkv/pagedkv/tier"
)

// Store holds admitted requests' pages for the decode Manager: a
// [tier.RemoteStore] that serves them (read-only: the Manager's write-
// through Store calls are declined) until they are forgotten.
type Store struct {
	cfg      Config
	maxPages int

	mu      sync.Mutex
	pages   map[tier.Digest]*held
	admits  map[uint64][]tier.Digest
	nextID  uint64
	holding int
	as      AdmitStats

	c tier.RemoteCounters // declined writes count as Dropped
}

type held struct {
	page tier.RemotePage
	refs int // admitted requests holding the page (shared prefixes)
}

var _ tier.RemoteStore = (*Store)(nil)

// NewStore returns a store holding at most maxPages pages.
func NewStore(cfg Config, maxPages int) (*Store, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if maxPages < 1 {
		return nil, fmt.Errorf("%w: maxPages = %d, want >= 1", ErrBadConfig, maxPages)
	}
	return &Store{cfg: cfg, maxPages: maxPages, pages: map[tier.Digest]*held{}, admits: map[uint64][]tier.Digest{}}, nil
}

// Admission is what [Store.Admit] did with a request.
type Admission struct {
	// ID is the admission's handle for Forget.
	ID uint64
	// Pages is the request's pages: Fresh + Same + Held.
	Pages int
	// Fresh pages were not held: the request's bytes were taken.
	Fresh int
	// Same pages were held (the same digest, from an earlier admission)
	// with equal bytes: what is served is the request's bytes.
	Same int
	// Held pages were held with other bytes: the store serves the earlier
	// admission's bytes, not the request's (answered "already held").
	Held int
}

// AdmitStats counts what Admit did since the store was made.
type AdmitStats struct {
	Admissions  int64 // requests admitted
	AlreadyHeld int64 // of those, with at least one page already held with other bytes
	Refused     int64 // requests refused (ErrFull)
	FreshPages  int64 // pages taken
	SamePages   int64 // pages already held with equal bytes
	HeldPages   int64 // pages already held with other bytes: not taken
}

// Admit adds every page of r (verified by ReadRequest) and returns the
// admission (its ID is the handle for Forget); when they do not fit it
// admits none and returns ErrFull. A page whose digest is already held
// keeps the bytes it was first admitted with: the admission counts it as
// Same when r's bytes are equal, as Held when not (r's were not taken),
// and holds a reference on it either way.
func (s *Store) Admit(r *Received) (Admission, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := Admission{Pages: len(r.Pages)}
	for i := range r.Pages {
		p := &r.Pages[i]
		switch h, ok := s.pages[p.Digest]; {
		case !ok:
			a.Fresh++
		case bytes.Equal(h.page.Data, p.Data):
			a.Same++
		default:
			a.Held++
		}
	}
	if s.holding+a.Fresh > s.maxPages {
		s.as.Refused++
		return Admission{}, fmt.Errorf("%w: %d new pages, %d of %d held", ErrFull, a.Fresh, s.holding, s.maxPages)
	}
	s.nextID++
	a.ID = s.nextID
	ds := make([]tier.Digest, len(r.Pages))
	for i := range r.Pages {
		p := r.Pages[i]
		ds[i] = p.Digest
		h, ok := s.pages[p.Digest]
		if !ok {
			h = &held{page: p}
			s.pages[p.Digest] = h
			s.holding++
		} else if p.Retention != (tier.Retention{}) {
			h.page.Retention = p.Retention // the latest hint wins
		}
		h.refs++
	}
	s.admits[a.ID] = ds
	s.as.Admissions++
	if a.Held > 0 {
		s.as.AlreadyHeld++
	}
	s.as.FreshPages += int64(a.Fresh)
	s.as.SamePages += int64(a.Same)
	s.as.HeldPages += int64(a.Held)
	return a, nil
}

// AdmitStats returns the admission counters.
func (s *Store) AdmitStats() AdmitStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.as
}

// fits reports whether a request of n pages could ever fit the store.
func (s *Store) fits(n int) bool { return n <= s.maxPages }

// Forget drops admission id's hold on its pages (the decode Manager has
// them now, or will recompute them); it reports whether id was admitted.
func (s *Store) Forget(id uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	ds, ok := s.admits[id]
	if !ok {
		return false
	}
	delete(s.admits, id)
	for _, d := range ds {
		h := s.pages[d]
		if h.refs--; h.refs == 0 {
			delete(s.pages, d)
			s.holding--
		}
	}
	return true
}

// Held is the number of pages held.
func (s *Store) Held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holding
}

// Fetch implements [tier.RemoteStore]: the leading pages held whose
// parent and tokens equal the request's.
func (s *Store) Fetch(_ context.Context, pages []tier.RemotePage) int {
	if !s.c.Lookup(len(pages)) {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range pages {
		p := &pages[i]
		h, ok := s.pages[p.Digest]
		if !ok || h.page.Parent != p.Parent || h.page.State != p.State || !slices.Equal(h.page.Tokens, p.Tokens) || len(p.Data) != len(h.page.Data) {
			s.c.Misses.Add(1)
			return i
		}
		copy(p.Data, h.page.Data)
		p.Retention = h.page.Retention
		s.c.Hits.Add(1)
		s.c.BytesIn.Add(int64(len(p.Data)))
	}
	return len(pages)
}

// Store implements [tier.RemoteStore]: the store holds only admitted
// requests, so it declines.
func (s *Store) Store(*tier.RemotePage) bool {
	s.c.Dropped.Add(1)
	return false
}

// Stats implements [tier.RemoteStore] (declined writes count as Dropped).
func (s *Store) Stats() tier.RemoteStats { return s.c.Snapshot() }

// CheckInvariants checks the reference counts against the admissions.
func (s *Store) CheckInvariants() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	refs := map[tier.Digest]int{}
	for _, ds := range s.admits {
		for _, d := range ds {
			refs[d]++
		}
	}
	if len(refs) != len(s.pages) || s.holding != len(s.pages) {
		return fmt.Errorf("handoff: %d pages held, %d referenced, counter %d", len(s.pages), len(refs), s.holding)
	}
	for d, h := range s.pages {
		if refs[d] != h.refs {
			return fmt.Errorf("handoff: page %s has %d references, %d admissions hold it", d.String()[:16], h.refs, refs[d])
		}
	}
	return nil
}
