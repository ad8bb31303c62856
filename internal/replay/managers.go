package replay

import "github.com/pagedkv/pagedkv"

// bookkeeper is what the replay asks of a Manager or a HybridManager.
type bookkeeper interface {
	Add(id pagedkv.RequestID, req pagedkv.Request) (int, error)
	Commit(sampled []int32) error
	Release(id pagedkv.RequestID) error
	Preempt(id pagedkv.RequestID) error
	Resume(id pagedkv.RequestID) (int, error)
	Tokens(id pagedkv.RequestID) []int32
	Computed(id pagedkv.RequestID) int
	// reserve is Reserve without the plan (the replay runs no kernels).
	reserve(ids []pagedkv.RequestID, ntokens []int32) error
	// stats are the pool's and the token counters (every group's, for a
	// HybridManager).
	stats() pagedkv.Stats
	// tierCopies and completeTierCopies drive the tiers. A HybridManager
	// has tiers too, but the replay runs one without them (newBookkeeper
	// refuses a hybrid model with a tier), so hybridManager's are empty.
	tierCopies(dst []pagedkv.TierCopy) []pagedkv.TierCopy
	completeTierCopies(ids ...uint64) error
}

// plainManager is a pagedkv.Manager as a bookkeeper.
type plainManager struct{ *pagedkv.Manager }

func (p plainManager) reserve(ids []pagedkv.RequestID, ntokens []int32) error {
	_, err := p.Reserve(ids, ntokens)
	return err
}
func (p plainManager) stats() pagedkv.Stats { return p.Stats() }
func (p plainManager) tierCopies(dst []pagedkv.TierCopy) []pagedkv.TierCopy {
	return p.TierCopies(dst)
}
func (p plainManager) completeTierCopies(ids ...uint64) error { return p.CompleteTierCopies(ids...) }

// hybridManager is a pagedkv.HybridManager (a --model preset) as a
// bookkeeper: every layer group on one pool, a hit only where every group
// serves the prefix.
type hybridManager struct{ *pagedkv.HybridManager }

func (h hybridManager) reserve(ids []pagedkv.RequestID, ntokens []int32) error {
	_, err := h.Reserve(ids, ntokens)
	return err
}
func (h hybridManager) stats() pagedkv.Stats                                 { return h.Stats().Stats }
func (h hybridManager) tierCopies(dst []pagedkv.TierCopy) []pagedkv.TierCopy { return dst }
func (h hybridManager) completeTierCopies(...uint64) error                   { return nil }
