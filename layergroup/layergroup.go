// Package layergroup owns the rules of one KV-cache group of a hybrid
// attention model: which attention its layers run (full, sliding window,
// chunked local, MLA; the recurrent layers' State groups are in state.go),
// which tokens a request's pages must still hold after n computed tokens,
// FlashInfer's window_left for the group, the rows of a
// step a chunked group must attend separately, and which prefix a group can
// serve from the prefix cache. It holds no state: the root package's
// HybridManager keeps one page table and one prefix cache per group on one
// page pool and asks these functions what to keep, release and match.
//
// # Page size and bytes
//
// Every group uses the Manager's one page size in tokens, and a page of any
// group has the same bytes: the engine allocates L tensors of NumPages pages
// (K and V, or MLA's ckv/kpe), where L is every group's layer count, and
// layer j of every group uses tensor j. A page ID is held by one group at a
// time, so the groups never write each other's entries. Groups must
// therefore have equal layer counts; a model whose attention kinds come in
// unequal numbers (Gemma 3: five local layers per global one) is described
// as several groups of the same kind (five sliding groups and one full group
// of N/6 layers each), as vLLM's hybrid allocator does.
//
// # Invariants
//
//   - KeepFrom(n) <= n, is a multiple of the page size, never decreases as
//     n grows, and every key a query at position >= n may read under the
//     group's attention is at a position >= KeepFrom(n).
//   - A group can serve a cached prefix of L tokens when its cache holds the
//     pages covering [NeedFrom(L), L); the Manager's hit is the longest L
//     every group can serve.
//   - A valid State group's state fits one page: StateShape.Bytes() <=
//     StateShape.PageBytes <= 2*MaxStateBytes, every size computed without
//     overflow; a hybrid model has at least one group that is not State.
//   - Indexer and SharedKV groups (indexer.go) own no pages: they come
//     after every group that does, Owner maps each to the group whose pages
//     it uses (an Indexer's an MLA group, one Indexer each), and their keep
//     rule, window and segments are that group's.
//
// # Concurrency
//
// Specs are values; every function is pure and safe for concurrent use.
package layergroup

import (
	"errors"
	"fmt"
)

// Kind is a group's attention.
type Kind uint8

const (
	// Full attention over every earlier token.
	Full Kind = iota
	// Sliding attention over the last WindowTokens tokens (a query at
	// position q reads keys q-WindowTokens+1..q: FlashInfer's window_left =
	// WindowTokens-1).
	Sliding
	// Chunked local attention (Llama 4): a query at position q reads keys
	// from floor(q/ChunkTokens)*ChunkTokens to q.
	Chunked
	// MLA is full attention on MLA storage (DeepSeek): paged like Full.
	MLA
	// State is a recurrent layer (Mamba-2, Gated DeltaNet, KDA): a fixed
	// state per request instead of K/V per token (state.go).
	State
)

func (k Kind) String() string {
	switch k {
	case Full:
		return "full"
	case Sliding:
		return "sliding"
	case Chunked:
		return "chunked"
	case MLA:
		return "mla"
	case State:
		return "state"
	case Indexer:
		return "indexer"
	case SharedKV:
		return "shared_kv"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// ErrBadSpec reports an invalid Spec; the message names the field.
var ErrBadSpec = errors.New("layergroup: bad spec")

// Spec describes one group.
type Spec struct {
	Kind Kind
	// WindowTokens is W for Sliding (>= 1); 0 otherwise.
	WindowTokens int
	// ChunkTokens is C for Chunked (a positive multiple of the page size, so
	// chunks start on page boundaries); 0 otherwise.
	ChunkTokens int
	// NumLayers is the number of layers in the group (>= 1).
	NumLayers int
	// State is a State group's per-layer state (state.go); zero otherwise.
	State StateShape

	// Target is, for an Indexer or SharedKV group, the index of the group
	// whose pages it follows or aliases (indexer.go); 0 for every other
	// kind.
	Target int
	// IndexerHeadDim and IndexerQuantBlock are an Indexer group's K head
	// dimension and the elements per float32 scale (IndexerLayout); 0 for
	// every other kind.
	IndexerHeadDim, IndexerQuantBlock int
}

// Validate checks s for a Manager with the given page size.
func (s Spec) Validate(pageSize int) error {
	if done, err := s.validateAlias(); done {
		return err
	}
	switch {
	case s.Kind > State:
		return fmt.Errorf("%w: Kind = %d, want full, sliding, chunked, mla, state, indexer or shared_kv", ErrBadSpec, s.Kind)
	case s.NumLayers < 1:
		return fmt.Errorf("%w: %v group with NumLayers = %d, want >= 1", ErrBadSpec, s.Kind, s.NumLayers)
	case s.Kind == Sliding && (s.WindowTokens < 1 || s.WindowTokens > 1<<31-1):
		return fmt.Errorf("%w: sliding group with WindowTokens = %d, want 1..2^31-1", ErrBadSpec, s.WindowTokens)
	case s.Kind != Sliding && s.WindowTokens != 0:
		return fmt.Errorf("%w: %v group with WindowTokens = %d, want 0", ErrBadSpec, s.Kind, s.WindowTokens)
	case s.Kind == Chunked && (s.ChunkTokens < 1 || pageSize < 1 || s.ChunkTokens%pageSize != 0 || s.ChunkTokens > 1<<31-1):
		return fmt.Errorf("%w: chunked group with ChunkTokens = %d, want a positive multiple of the page size %d",
			ErrBadSpec, s.ChunkTokens, pageSize)
	case s.Kind != Chunked && s.ChunkTokens != 0:
		return fmt.Errorf("%w: %v group with ChunkTokens = %d, want 0", ErrBadSpec, s.Kind, s.ChunkTokens)
	case s.Kind == State:
		return s.State.validate()
	case s.State != StateShape{}:
		return fmt.Errorf("%w: %v group with a State shape, want none", ErrBadSpec, s.Kind)
	}
	return nil
}

// ValidateGroups checks a hybrid model's groups: each valid, and every
// group with the same layer count (see the package doc).
func ValidateGroups(groups []Spec, pageSize int) error {
	if len(groups) == 0 {
		return fmt.Errorf("%w: no groups", ErrBadSpec)
	}
	for g, s := range groups {
		if err := s.Validate(pageSize); err != nil {
			return fmt.Errorf("groups[%d]: %w", g, err)
		}
		if s.OwnsPages() && s.NumLayers != groups[0].NumLayers {
			return fmt.Errorf("%w: groups[%d] has %d layers and groups[0] %d: a page has the same bytes in every group, "+
				"so split unequal kinds into groups of equal layer counts", ErrBadSpec, g, s.NumLayers, groups[0].NumLayers)
		}
	}
	if err := validateAliases(groups); err != nil {
		return err
	}
	// After validateAliases, an alias group implies an attention target.
	for _, s := range groups {
		if s.Kind != State {
			return nil
		}
	}
	return fmt.Errorf("%w: %d groups, all of kind state: a hybrid model needs an attention group, whose pages make a prefix hit", ErrBadSpec, len(groups))
}

// Attention is what a group's attention keeps and reads of a request: the
// kind whose attention the group runs (an Indexer's is MLA, a SharedKV
// group's its target's) and that kind's window or chunk. It is three
// words, so a step reads it per request without copying the Spec (Spec's
// methods below are Attention's).
type Attention struct {
	Kind                      Kind
	WindowTokens, ChunkTokens int
}

// Attention returns the attention s runs.
func (s *Spec) Attention() Attention {
	return Attention{Kind: s.attentionKind(), WindowTokens: s.WindowTokens, ChunkTokens: s.ChunkTokens}
}

// WindowLeft is FlashInfer's window_left for the group: WindowTokens-1 for
// Sliding, -1 otherwise (a chunked group's limit is in its page ranges; see
// Segments).
func (s Spec) WindowLeft() int { return s.Attention().WindowLeft() }

// WindowLeft is [Spec.WindowLeft].
func (a Attention) WindowLeft() int {
	if a.Kind == Sliding {
		return a.WindowTokens - 1
	}
	return -1
}

// KeepTokens is the number of trailing computed tokens a request must keep
// after n computed tokens, as pagetable.Table.ReleaseWindow takes it: the
// pages entirely before n-KeepTokens(n) can go. -1 means keep everything.
func (s Spec) KeepTokens(n int) int { return s.Attention().KeepTokens(n) }

// KeepTokens is [Spec.KeepTokens].
func (a Attention) KeepTokens(n int) int {
	switch a.Kind {
	case Sliding:
		return a.WindowTokens
	case Chunked:
		return n % a.ChunkTokens
	}
	return -1
}

// KeepFrom returns the first token a request must still hold after n
// computed tokens, rounded down to a page boundary (the page table's
// Start after release).
func (s Spec) KeepFrom(n, pageSize int) int { return s.Attention().KeepFrom(n, pageSize) }

// KeepFrom is [Spec.KeepFrom].
func (a Attention) KeepFrom(n, pageSize int) int {
	k := a.KeepTokens(n)
	if k < 0 || n-k <= 0 {
		return 0
	}
	return (n - k) / pageSize * pageSize
}

// NeedFrom returns the first token whose page a group needs cached to serve
// a prefix of L tokens (the next query is at position L).
func (s Spec) NeedFrom(L, pageSize int) int { return s.Attention().KeepFrom(L, pageSize) }

// Segment is a run of a request's rows in one step that attends to one
// contiguous range of its keys: rows [Row, Row+Rows) of the request, keys
// [KeyFrom, KeyTo) in absolute positions.
type Segment struct {
	Row, Rows      int
	KeyFrom, KeyTo int
}

// Segments appends to dst how the rows of a request that has computed
// `computed` tokens and appends `rows` more split into attention segments:
// one segment for every kind but Chunked, which gets one per chunk its rows
// touch (a query never reads a key of an earlier chunk, so rows past a
// chunk boundary attend from the boundary). keepFrom is the first token the
// request holds. Keys of a segment end at its last row (causal).
func (s Spec) Segments(dst []Segment, computed, rows, keepFrom int) []Segment {
	return s.Attention().Segments(dst, computed, rows, keepFrom)
}

// Segments is [Spec.Segments].
func (a Attention) Segments(dst []Segment, computed, rows, keepFrom int) []Segment {
	if rows == 0 {
		return dst
	}
	if a.Kind != Chunked {
		return append(dst, Segment{Row: 0, Rows: rows, KeyFrom: keepFrom, KeyTo: computed + rows})
	}
	c := a.ChunkTokens
	for r := 0; r < rows; {
		q := computed + r
		chunk := q / c * c
		end := min(computed+rows, chunk+c)
		dst = append(dst, Segment{Row: r, Rows: end - q, KeyFrom: max(chunk, keepFrom), KeyTo: end})
		r = end - computed
	}
	return dst
}

// Visible reports whether a query at position q reads the key at position
// k under the group's attention (the dense definition the tests check
// paged attention against).
func (s Spec) Visible(q, k int) bool { return s.Attention().Visible(q, k) }

// Visible is [Spec.Visible].
func (a Attention) Visible(q, k int) bool {
	if k > q || k < 0 {
		return false
	}
	switch a.Kind {
	case Sliding:
		return q-k < a.WindowTokens
	case Chunked:
		return k/a.ChunkTokens == q/a.ChunkTokens
	}
	return true
}
