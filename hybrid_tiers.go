package pagedkv

// The tiers of a HybridManager (docs/tiers.md, "Hybrid groups"): one host
// tier and one remote store below the one page pool, shared by the
// groups. A page of group g enters them under a digest chain of its own
// (the namespace's root followed by the group's identity), so no group
// ever reads another's pages; admission serves the prefix every group can
// serve from its device cache and then from the tiers (see
// [HybridManager.Add]). A tier copy moves a page ID's bytes in every
// layer's tensor, as a [CopyOp] does, whichever group holds it.

// TierCopies appends to dst the tier copies planned since the last call
// and returns it; see [Manager.TierCopies]. Page IDs are the pool's.
func (h *HybridManager) TierCopies(dst []TierCopy) []TierCopy { return h.core.tierCopies(dst) }

// TierCopiesInFlight returns the number of tier copies planned and not yet
// completed.
func (h *HybridManager) TierCopiesInFlight() int { return h.core.tierCopiesInFlight() }

// CompleteTierCopies records that the engine finished the copies ids; see
// [Manager.CompleteTierCopies]. A request's onloads in a group complete
// its admission there: its pages join that group's prefix cache, and a
// sliding or chunked group then releases the pages its attention no
// longer reads.
func (h *HybridManager) CompleteTierCopies(ids ...uint64) error {
	return h.core.completeTierCopies(ids)
}

// HostPage returns the bytes of host page h (nil without a host tier or a
// Format).
func (h *HybridManager) HostPage(p HostPageID) []byte { return h.core.hostPage(p) }

// HostCachedHashes appends the chain hash of every servable host page to
// dst and returns it.
func (h *HybridManager) HostCachedHashes(dst []uint64) []uint64 { return h.core.hostCachedHashes(dst) }

// Loading reports whether request id waits for onload copies in any group:
// it may not take part in a step (or fork) until they are complete.
func (h *HybridManager) Loading(id RequestID) bool { return h.core.loading(id) }
