package layergroup

import "fmt"

// Groups that own no pages of their own.
//
// An Indexer group is DeepSeek sparse attention's indexer-K cache (V3.2:
// the lightning indexer's K, one per MLA layer). It follows an MLA group
// page for page through the identity map: the indexer page of MLA page p
// is page p of the indexer's own tensors (one per indexer layer, NumPages
// pages of IndexerLayout.PageBytes each), so it is allocated, freed,
// prefix-cached, evicted, preempted, copied (copy-on-write), moved to and
// from the tiers and announced exactly when its MLA page is: the pool
// holds one page ID for both. vLLM does the same by putting the indexer
// cache layers in their MLA layers' KV cache group (one block table,
// per-layer page bytes).
//
// A SharedKV group is layers that read another group's KV cache instead of
// writing their own (vLLM's kv_sharing_target_layer_name): it aliases the
// pages of its Target and owns no allocation. Its attention must be its
// target's: WindowTokens and ChunkTokens equal to the target's (a window
// that differs would read keys the target released).
//
// Both come after every group that owns pages in a model's groups, so the
// groups that own pages keep the indices 0..k-1.

const (
	// Indexer is DeepSeek sparse attention's indexer-K cache: it follows
	// the MLA group Target page for page (same page IDs), in tensors of
	// its own ([IndexerLayout]).
	Indexer Kind = 5
	// SharedKV is layers that read the KV cache of group Target and own
	// no pages (vLLM's kv_sharing_target_layer_name).
	SharedKV Kind = 6
)

// OwnsPages reports whether a group of s's kind holds pages of the pool:
// every kind but Indexer and SharedKV.
func (s Spec) OwnsPages() bool { return s.Kind != Indexer && s.Kind != SharedKV }

// attentionKind is the kind whose attention s runs: an Indexer's is its
// MLA group's (every page kept), a SharedKV group's its target's (sliding
// with its WindowTokens, chunked with its ChunkTokens, else full).
func (s *Spec) attentionKind() Kind {
	switch s.Kind {
	case Indexer:
		return MLA
	case SharedKV:
		switch {
		case s.WindowTokens > 0:
			return Sliding
		case s.ChunkTokens > 0:
			return Chunked
		}
		return Full
	}
	return s.Kind
}

// IndexerLayout is the byte layout of one page of one indexer layer, the
// one vLLM's indexer_k_quant_and_cache writes (csrc/cache_kernels.cu,
// DeepSeek V3.2): the fp8 e4m3 K of every token of the page first
// (PageSize*HeadDim bytes, token-major), then the float32 scales
// (HeadDim/QuantBlock per token, token-major). DeepSeek V3.2 has HeadDim
// 128 and QuantBlock 128: 132 bytes a token, one scale per token.
type IndexerLayout struct {
	PageSize, HeadDim, QuantBlock int
}

// IndexerLayout returns the layout of s's pages (an Indexer group) for
// pages of pageSize tokens.
func (s Spec) IndexerLayout(pageSize int) IndexerLayout {
	return IndexerLayout{PageSize: pageSize, HeadDim: s.IndexerHeadDim, QuantBlock: s.IndexerQuantBlock}
}

// ScalesPerToken is HeadDim/QuantBlock.
func (l IndexerLayout) ScalesPerToken() int { return l.HeadDim / l.QuantBlock }

// TokenBytes is one token's bytes: its K and its scales.
func (l IndexerLayout) TokenBytes() int { return l.HeadDim + 4*l.ScalesPerToken() }

// PageBytes is one page's bytes in one indexer layer.
func (l IndexerLayout) PageBytes() int { return l.PageSize * l.TokenBytes() }

// KOffset is the offset of entry e's K in a page.
func (l IndexerLayout) KOffset(e int) int { return e * l.HeadDim }

// ScaleOffset is the offset of entry e's first scale in a page.
func (l IndexerLayout) ScaleOffset(e int) int { return l.PageSize*l.HeadDim + 4*e*l.ScalesPerToken() }

// maxIndexerHeadDim bounds IndexerHeadDim (DeepSeek's is 128).
const maxIndexerHeadDim = 1 << 16

// validateAlias checks the fields of one spec that the alias kinds add; it
// is done (and Validate returns err) for an Indexer or SharedKV spec. The
// rules that need the other groups are validateAliases'.
func (s Spec) validateAlias() (done bool, err error) {
	if s.OwnsPages() {
		if s.Target != 0 || s.IndexerHeadDim != 0 || s.IndexerQuantBlock != 0 {
			return true, fmt.Errorf("%w: %v group with Target = %d, IndexerHeadDim = %d, IndexerQuantBlock = %d, want 0 (only indexer and shared_kv groups name a target)",
				ErrBadSpec, s.Kind, s.Target, s.IndexerHeadDim, s.IndexerQuantBlock)
		}
		return false, nil
	}
	switch {
	case s.NumLayers < 1:
		return true, fmt.Errorf("%w: %v group with NumLayers = %d, want >= 1", ErrBadSpec, s.Kind, s.NumLayers)
	case s.Target < 0:
		return true, fmt.Errorf("%w: %v group with Target = %d, want a group index", ErrBadSpec, s.Kind, s.Target)
	case s.State != StateShape{}:
		return true, fmt.Errorf("%w: %v group with a State shape, want none (only state groups hold a state)", ErrBadSpec, s.Kind)
	case s.Kind == SharedKV && (s.IndexerHeadDim != 0 || s.IndexerQuantBlock != 0):
		return true, fmt.Errorf("%w: shared_kv group with IndexerHeadDim = %d, IndexerQuantBlock = %d, want 0", ErrBadSpec, s.IndexerHeadDim, s.IndexerQuantBlock)
	case s.Kind == SharedKV && (s.WindowTokens < 0 || s.ChunkTokens < 0 || s.WindowTokens > 0 && s.ChunkTokens > 0):
		return true, fmt.Errorf("%w: shared_kv group with WindowTokens = %d, ChunkTokens = %d, want its target's (at most one of them > 0)",
			ErrBadSpec, s.WindowTokens, s.ChunkTokens)
	case s.Kind == Indexer && (s.WindowTokens != 0 || s.ChunkTokens != 0):
		return true, fmt.Errorf("%w: indexer group with WindowTokens = %d, ChunkTokens = %d, want 0 (it follows an MLA group, which keeps every page)",
			ErrBadSpec, s.WindowTokens, s.ChunkTokens)
	case s.Kind == Indexer && (s.IndexerHeadDim < 1 || s.IndexerHeadDim > maxIndexerHeadDim):
		return true, fmt.Errorf("%w: indexer group with IndexerHeadDim = %d, want 1..%d (DeepSeek V3.2: 128)", ErrBadSpec, s.IndexerHeadDim, maxIndexerHeadDim)
	case s.Kind == Indexer && (s.IndexerQuantBlock < 1 || s.IndexerHeadDim%s.IndexerQuantBlock != 0):
		return true, fmt.Errorf("%w: indexer group with IndexerQuantBlock = %d, want a divisor of IndexerHeadDim = %d (DeepSeek V3.2: 128)",
			ErrBadSpec, s.IndexerQuantBlock, s.IndexerHeadDim)
	}
	return true, nil
}

// validateAliases checks the rules between the groups: every Indexer and
// SharedKV group after every group that owns pages; an Indexer's Target
// an MLA group, with at most one Indexer each; a SharedKV group's Target
// a group that owns pages, whose attention (WindowTokens, ChunkTokens) is
// the SharedKV group's.
func validateAliases(groups []Spec) error {
	owners := 0
	for owners < len(groups) && groups[owners].OwnsPages() {
		owners++
	}
	indexed := make(map[int]int)
	for g := owners; g < len(groups); g++ {
		s := groups[g]
		if s.OwnsPages() {
			return fmt.Errorf("%w: groups[%d] (%v) follows groups[%d] (%v): list every group that owns pages before the indexer and shared_kv groups",
				ErrBadSpec, g, s.Kind, owners, groups[owners].Kind)
		}
		if s.Target >= len(groups) {
			return fmt.Errorf("%w: groups[%d] (%v) has Target = %d, want a group index 0..%d", ErrBadSpec, g, s.Kind, s.Target, len(groups)-1)
		}
		t := groups[s.Target]
		switch {
		case s.Kind == Indexer && t.Kind != MLA:
			return fmt.Errorf("%w: groups[%d] (indexer) has Target = %d, a %v group: an indexer follows the pages of an MLA group", ErrBadSpec, g, s.Target, t.Kind)
		case s.Kind == Indexer && indexed[s.Target] > 0:
			return fmt.Errorf("%w: groups[%d] and groups[%d] are both indexers of MLA group %d: one indexer group per MLA group",
				ErrBadSpec, indexed[s.Target]-1, g, s.Target)
		case s.Kind == SharedKV && !t.OwnsPages():
			return fmt.Errorf("%w: groups[%d] (shared_kv) has Target = %d, itself a %v group: share the KV of a group that owns pages",
				ErrBadSpec, g, s.Target, t.Kind)
		case s.Kind == SharedKV && t.Kind > MLA:
			return fmt.Errorf("%w: groups[%d] (shared_kv) has Target = %d, a %v group: only full, sliding, chunked and mla KV can be shared",
				ErrBadSpec, g, s.Target, t.Kind)
		case s.Kind == SharedKV && (s.WindowTokens != t.WindowTokens || s.ChunkTokens != t.ChunkTokens):
			return fmt.Errorf("%w: groups[%d] (shared_kv) has WindowTokens = %d, ChunkTokens = %d; its target groups[%d] (%v) has %d, %d: a shared KV cache is read with its own attention",
				ErrBadSpec, g, s.WindowTokens, s.ChunkTokens, s.Target, t.Kind, t.WindowTokens, t.ChunkTokens)
		}
		if s.Kind == Indexer {
			indexed[s.Target] = g + 1
		}
	}
	return nil
}

// Owner returns the group whose pages group g of groups uses: g for a
// group that owns pages, its Target for an Indexer or SharedKV group.
// groups must be valid (ValidateGroups).
func Owner(groups []Spec, g int) int {
	if groups[g].OwnsPages() {
		return g
	}
	return groups[g].Target
}

// NumOwners returns how many of valid groups own pages (they come first).
func NumOwners(groups []Spec) int {
	n := 0
	for n < len(groups) && groups[n].OwnsPages() {
		n++
	}
	return n
}
