package pagedkv

import (
	"fmt"

	"github.com/pagedkv/pagedkv/prefixcache"
)

// KV events of state groups (docs/events.md, "State groups"): a state
// group's sink announces each checkpoint as one block, stored when the
// checkpoint is published and removed when it is evicted.

// StateEventSink is the sink of a state group (StateLayers) of a
// HybridManager's [GroupEventSink]: GroupSink(g) of a state group g must
// implement it (events.Recorder's group sinks do).
type StateEventSink interface {
	prefixcache.Sink
	// CheckpointStored: device page page holds the group's state after the
	// prefix whose last page is tokens, at chain hash hash, depth pages
	// deep (0: the first page); parentHash is the chain hash of the page
	// before it (hasParent false at depth 0), lora the namespace's LoRA
	// adapter. PageRemoved(page, hash) reports its eviction.
	CheckpointStored(page PageID, depth int, hash, parentHash uint64, hasParent bool, lora string, tokens []int32)
}

// kvEventSpecState is vLLM's kv_cache_spec_kind of a state group: vLLM
// describes Mamba-2, Gated DeltaNet and the other recurrent layers with
// one MambaSpec, whose kind is "mamba".
const kvEventSpecState = "mamba"

// announceCheckpoint reports checkpoint c, published by r for tokens, to
// every state group's sink: one block per group, the checkpoint's page in
// that group, named by the chain hash of its prefix's last page.
func (s *stateSet) announceCheckpoint(c *checkpoint, r *stateReq, tokens []int32, parent uint64, hasParent bool) {
	k := len(tokens) / s.ps
	last := tokens[(k-1)*s.ps : k*s.ps]
	for j, ev := range s.ev {
		ev.CheckpointStored(c.slot[j], k-1, c.key.hash, parent, hasParent, r.lora, last)
	}
}

// announceEvicted reports checkpoint c's eviction to every state group's
// sink.
func (s *stateSet) announceEvicted(c *checkpoint) {
	for j, ev := range s.ev {
		ev.PageRemoved(c.slot[j], c.key.hash)
	}
}

// parentHash returns the chain hash of the page before the last of
// tokens (k pages of r's prefix; r's root when k = 1): the hash r's chain had one page
// earlier. It hashes from r's namespace root (a rare path: publish keeps
// the value when it hashed the last page itself).
func (s *stateSet) parentHash(r *stateReq, tokens []int32) uint64 {
	h := r.root
	for d := 0; d+1 < len(tokens)/s.ps; d++ {
		h = s.hash.Page(h, tokens[d*s.ps:(d+1)*s.ps])
	}
	return h
}

// stateEventSinks returns the sinks of the state groups at stateAt, or an
// error naming the first group whose sink cannot announce checkpoints.
func stateEventSinks(sinks GroupEventSink, stateAt []int) ([]StateEventSink, error) {
	out := make([]StateEventSink, len(stateAt))
	for j, g := range stateAt {
		ev, ok := sinks.GroupSink(g).(StateEventSink)
		if !ok {
			return nil, fmt.Errorf("%w: CacheEvents' group %d sink (%T) is not a StateEventSink: a state group's checkpoints are announced through it", ErrBadConfig, g, sinks.GroupSink(g))
		}
		out[j] = ev
	}
	return out, nil
}

// groupIdx is the configured index (KV events' group_idx) of attention
// group i; attnAt is nil without state groups (the indexes are equal).
func groupIdx(attnAt []int, i int) int {
	if attnAt == nil {
		return i
	}
	return attnAt[i]
}
