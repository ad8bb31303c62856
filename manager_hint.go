package pagedkv

import (
	"fmt"

	"github.com/pagedkv/pagedkv/evict"
)

// Hint is a continuation hint (evict.Hint): what the engine expects of a
// chain once its request lets it go.
type Hint = evict.Hint

// The continuation hints.
const (
	HintNone    = evict.HintNone
	HintReuse   = evict.HintReuse
	HintNoReuse = evict.HintNoReuse
)

// HintContinuation sets the continuation hints of request id's cached
// pages: hints[i] for the request's i-th page (in token order; pages past
// len(hints), pages the request holds as private duplicates, and pages a
// window released are left as they are). Hints are monotone along a
// chain: a page before one hinted [HintReuse] is a prefix of a reused
// prefix, so it is hinted HintReuse too (a parent must not be evicted,
// with its subtree, for a dead hint while a child is hinted live). It is
// the prefix-cache-level
// input retention hints are built on: only the "adaptive" eviction policy
// reads hints (docs/replay.md); a page that serves a hit loses its hint.
// Call it before [Manager.Release], or while the request runs. It fails,
// changing nothing, with [ErrUnknownRequest], [ErrStepPending], or
// [ErrBadArgument] naming a hint outside the known ones.
func (m *Manager) HintContinuation(id RequestID, hints []Hint) error {
	for i, h := range hints {
		if h >= evict.NumHints {
			return fmt.Errorf("%w: hint %d of request %d's page %d, want 0..%d", ErrBadArgument, h, id, i, evict.NumHints-1)
		}
	}
	for _, g := range m.core.groups {
		if g.pending {
			return fmt.Errorf("%w: hint request %d", ErrStepPending, id)
		}
		if _, err := g.lookup("hint", id); err != nil {
			return err
		}
	}
	m.core.tick()
	for _, g := range m.core.groups {
		r := g.reqs[id]
		if !r.running {
			continue
		}
		pages := g.table.Pages(r.seq())
		skip := r.start / g.pageSize
		live := false
		for i := min(len(hints), len(pages)+skip) - 1; i >= skip; i-- {
			h := hints[i]
			live = live || h == HintReuse
			if live {
				h = HintReuse
			}
			if err := g.cache.Hint(h, pages[i-skip]); err != nil {
				panic(fmt.Sprintf("pagedkv: hint %d checked, refused by the cache: %v", h, err))
			}
		}
	}
	return nil
}
