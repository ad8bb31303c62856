package pagedkv

import (
	"fmt"

	"github.com/pagedkv/pagedkv/layergroup"
	"github.com/pagedkv/pagedkv/tier"
)

// Groups that own no pages (docs/indexer-shared-kv.md): a DeepSeek
// sparse-attention indexer group (IndexerAttention) follows its MLA group
// page for page, and a shared-KV group (SharedKVAttention) aliases its
// target's pages. Neither is a group of the core: the core holds the
// groups that own pages (HybridConfig.Groups up to the first alias), and
// the facade maps an alias to its target for its pages, its Plan and its
// Stats. So an indexer page is allocated, freed, prefix-cached, evicted,
// preempted, copied, offloaded, onloaded and announced exactly when its
// MLA page is: it is the same page ID of the same pool, in the indexer's
// own tensors. The one thing that can separate them is bytes, so a tier
// format (Tiers.Format) must carry the indexer pages (IndexerLayers), and
// an engine copies them with every CopyOp and TierCopy of their page.

// The kinds of groups that own no pages.
const (
	IndexerAttention  = layergroup.Indexer
	SharedKVAttention = layergroup.SharedKV
)

// IndexerLayout is the byte layout of an indexer page (one layer); see
// [layergroup.IndexerLayout].
type IndexerLayout = layergroup.IndexerLayout

// aliases are a HybridManager's groups that own no pages and the plans it
// hands out for them.
type aliases struct {
	specs []LayerGroup // every group, in HybridConfig order
	// layouts[g] is indexer group g's page layout (Plan.Indexer).
	layouts []IndexerLayout
	// plan is the HybridPlan Reserve returns when there are aliases: the
	// core's, with one entry per alias after its groups; indexer plans
	// are copies of their MLA group's with Indexer set.
	plan     HybridPlan
	idxPlans []Plan
}

// newAliases returns the aliases of valid groups (nil: none).
func newAliases(groups []LayerGroup, pageSize int) *aliases {
	owners := layergroup.NumOwners(groups)
	if owners == len(groups) {
		return nil
	}
	a := &aliases{specs: groups, layouts: make([]IndexerLayout, len(groups)),
		plan: HybridPlan{Groups: make([]*Plan, len(groups))}, idxPlans: make([]Plan, len(groups))}
	for g, s := range groups {
		if s.Kind == IndexerAttention {
			a.layouts[g] = s.IndexerLayout(pageSize)
		}
	}
	return a
}

// checkIndexerFormat checks a hybrid pool's tier format against its
// indexer groups: with a format (Layers > 0), the indexer pages must
// travel in it (SGLang lost them on host round trips, #38031): the
// indexer groups' layer count (or their sum) and their token bytes. A
// format with indexer pages and no indexer group is another model's.
func checkIndexerFormat(f tier.PageFormat, groups []LayerGroup) error {
	if f.Layers == 0 {
		if f.IndexerLayers != 0 || f.IndexerTokenBytes != 0 {
			return fmt.Errorf("%w: Tiers.Format.IndexerLayers = %d, IndexerTokenBytes = %d without a format (Layers = 0)",
				ErrBadConfig, f.IndexerLayers, f.IndexerTokenBytes)
		}
		return nil
	}
	shared, sum, tokenBytes, first := 0, 0, 0, -1
	for g, s := range groups {
		if s.Kind != IndexerAttention {
			continue
		}
		tb := s.IndexerLayout(1).TokenBytes()
		if first >= 0 && tb != tokenBytes {
			return fmt.Errorf("%w: indexer groups %d and %d have %d and %d bytes a token: a tier format moves one indexer layout",
				ErrBadConfig, first, g, tokenBytes, tb)
		}
		if first < 0 {
			first, shared, tokenBytes = g, s.NumLayers, tb
		}
		sum += s.NumLayers
	}
	switch {
	case first < 0 && f.IndexerLayers != 0:
		return fmt.Errorf("%w: Tiers.Format.IndexerLayers = %d with no indexer group", ErrBadConfig, f.IndexerLayers)
	case first < 0:
		return nil
	case f.IndexerLayers == 0:
		return fmt.Errorf("%w: Tiers.Format.IndexerLayers = 0 with indexer group %d: a tier copy would move its MLA pages without their indexer pages "+
			"(want IndexerLayers = %d, IndexerTokenBytes = %d)", ErrBadConfig, first, shared, tokenBytes)
	case f.IndexerLayers != shared && f.IndexerLayers != sum:
		return fmt.Errorf("%w: Tiers.Format.IndexerLayers = %d, want %d (the indexer groups' layer count: they share the indexer tensors) or %d (their sum)",
			ErrBadConfig, f.IndexerLayers, shared, sum)
	case f.IndexerTokenBytes != tokenBytes:
		return fmt.Errorf("%w: Tiers.Format.IndexerTokenBytes = %d, indexer group %d has %d (IndexerHeadDim %d + 4 bytes per %d-element scale block)",
			ErrBadConfig, f.IndexerTokenBytes, first, tokenBytes, groups[first].IndexerHeadDim, groups[first].IndexerQuantBlock)
	}
	return nil
}

// owner is the core group whose pages group g uses.
func (h *HybridManager) owner(g int) int {
	if h.alias == nil {
		return g
	}
	return layergroup.Owner(h.alias.specs, g)
}

// aliasPlan returns p (the core's plan) with an entry for every group
// that owns no pages: a shared-KV group's is its target's Plan (the same
// arrays), an indexer group's a copy of its MLA group's (the same page
// arrays: the identity map) with Indexer set. It allocates nothing.
func (h *HybridManager) aliasPlan(p *HybridPlan) *HybridPlan {
	a := h.alias
	if a == nil {
		return p
	}
	out := &a.plan
	out.Requests, out.Copies = p.Requests, p.Copies
	copy(out.Groups, p.Groups)
	for g := len(p.Groups); g < len(a.specs); g++ {
		s := a.specs[g]
		if s.Kind == SharedKVAttention {
			out.Groups[g] = p.Groups[s.Target]
			continue
		}
		ip := &a.idxPlans[g]
		*ip = *p.Groups[s.Target]
		ip.Indexer = &a.layouts[g]
		out.Groups[g] = ip
	}
	return out
}

// groupStatsOf returns group g's numbers: a group that owns no pages holds
// nothing of its own (its pages are counted in its target's).
func (h *HybridManager) groupStatsOf(g int) GroupStats {
	if o := h.owner(g); o != g {
		return GroupStats{Kind: h.alias.specs[g].Kind}
	}
	return h.core.groupStats(g)
}

// auditAliases checks the groups that own no pages against the core: each
// maps to a group of the core of the kind it needs (an indexer to an MLA
// group), and while a step is reserved, the plan handed out gives a
// shared-KV group its target's Plan and an indexer group its MLA group's
// page arrays and its layout.
func (h *HybridManager) auditAliases() error {
	a := h.alias
	if a == nil {
		return nil
	}
	n := h.core.numGroups() // the configured groups that own pages
	for g := n; g < len(a.specs); g++ {
		s := a.specs[g]
		o := h.owner(g)
		if o < 0 || o >= n || s.Kind == IndexerAttention && h.core.groupSpec(o).Kind != MLAAttention ||
			s.Kind == SharedKVAttention && h.core.groupSpec(o).Kind > MLAAttention {
			return fmt.Errorf("%w: group %d (%v) maps to group %d of %d", errPool, g, s.Kind, o, n)
		}
		if !h.core.pending() || a.plan.Groups[g] == nil {
			continue
		}
		p, t := a.plan.Groups[g], a.plan.Groups[o]
		switch {
		case s.Kind == SharedKVAttention && p != t:
			return fmt.Errorf("%w: shared-KV group %d's plan is not its target %d's", errPool, g, o)
		case s.Kind == IndexerAttention && (p.Indexer == nil || len(p.KVPageIndices) != len(t.KVPageIndices) ||
			len(p.KVPageIndices) > 0 && &p.KVPageIndices[0] != &t.KVPageIndices[0]):
			return fmt.Errorf("%w: indexer group %d's plan does not name its MLA group %d's pages", errPool, g, o)
		}
	}
	return nil
}
