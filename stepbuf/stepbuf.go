// Package stepbuf lays out a step's plan arrays in one packed buffer of
// fixed capacity that the engine owns (pinned host memory it allocated,
// or any memory), so that one cudaMemcpyAsync, or one copy captured in a
// CUDA graph, moves the whole step to the GPU.
//
// A [Layout] is a table of rows: each row is one int32 array of the plan
// (an [Array] of a layer group, or of a cascade level of one) at a byte
// Offset with a capacity Cap in elements. Every Offset is a multiple of
// [Align], so a buffer whose base address is aligned to Align (every
// cudaHostAlloc'ed or cudaMalloc'ed buffer, every malloc'ed one on 64-bit
// Linux) has every row aligned to it, on the host and on the device copy.
// One more array is one more row: the rows are data, and the offsets of a
// layout depend only on its [Capacities] and its groups' [GroupSpec].
//
// The capacities bound a step: B <= MaxRequests requests, nnz <=
// MaxTokens rows, at most MaxPages pages in each group's page table
// (kv_indptr[B]) and at most MaxCascadeLevels cascade levels. Every other
// array is bounded by these (see [NewLayout]; a group's BlockTables by
// MaxRequests rows of its [GroupSpec].BlockTablesStride), so a step that
// fits the capacities fits every row.
//
// # Invariants
//
//   - Rows are in increasing Offset order, do not overlap, and each Offset
//     is a multiple of Align; Size is the end of the last row rounded up
//     to Align.
//   - The layout is a pure function of Capacities and the groups' specs.
//   - [Bind] never keeps a reference to memory it refused, and the views it
//     returns have capacity equal to their row's Cap, so an append past a
//     row reallocates instead of writing into the next row.
//
// A Layout is immutable and may be shared by any goroutines; a [Buffers]
// belongs to the goroutine that writes the steps.
package stepbuf

import (
	"errors"
	"fmt"
	"unsafe"
)

// Align is the alignment, in bytes, of every row's offset and of the base
// address [Bind] accepts.
const Align = 16

// HeaderLen is the length, in int32 elements, of the pool's and of each
// group's header row.
const HeaderLen = 8

// Limits of the capacities: an int32 index array never holds more than
// MaxCap entries, and a cascade is never deeper than MaxLevels.
const (
	MaxCap    = 1 << 28
	MaxLevels = 64
)

// Pool header fields (row PoolHeader, group -1).
const (
	PoolBatchSize = iota // B: requests of the step
	PoolNNZ              // nnz: rows (tokens) of the step
	PoolNumCopies        // copy-on-write copies in Copies
	PoolNumGroups        // layer groups of the layout
	PoolStep             // steps written since Bind, modulo 2^31
)

// Group header fields (row GroupHeader of each group).
const (
	GroupNumPages   = iota // kv_indptr[B]: entries of kv_page_indices
	GroupWindowLeft        // FlashInfer's window_left
	GroupNumLevels         // 0: run flat; else the cascade's levels
	GroupNumAttn           // A: a chunked group's attention entries (else 0)
	GroupAttnPages         // attn_kv_indptr[A]
)

// Array names one row's array; every name is FlashInfer's (or the C ABI's
// for the plan's own arrays).
type Array int

// The arrays. The pool's rows (group -1) are PoolHeader and Copies; every
// group has GroupHeader through SeqLens, a group with a BlockTablesStride
// BlockTables, a chunked group the Attn arrays, and, when
// MaxCascadeLevels > 0, QueryRows, CascadeWindowLeft, LevelBatchSize and
// per level the four Level arrays. New arrays are appended (the values are
// the C ABI's PAGEDKV_STEP_*).
const (
	PoolHeader         Array = iota // [HeaderLen] PoolBatchSize, ...
	Copies                          // [3*MaxRequests*groups] (src, dst, entries) triples
	GroupHeader                     // [HeaderLen] GroupNumPages, ...
	QOIndptr                        // [MaxRequests+1] qo_indptr / append_indptr
	BatchIndices                    // [MaxTokens]
	Positions                       // [MaxTokens]
	TokenIDs                        // [MaxTokens]
	TokenPositions                  // [MaxTokens]
	Drafts                          // [MaxRequests]
	KVIndptr                        // [MaxRequests+1]
	KVPageIndices                   // [MaxPages]
	KVLastPageLen                   // [MaxRequests]
	SeqLens                         // [MaxRequests]
	AttnQOIndptr                    // [MaxTokens+1] (chunked groups)
	AttnKVIndptr                    // [MaxTokens+1]
	AttnKVPageIndices               // [MaxPages]
	AttnKVLastPageLen               // [MaxTokens]
	AttnRequests                    // [MaxTokens]
	QueryRows                       // [MaxTokens] cascade row r holds plan row QueryRows[r]
	CascadeWindowLeft               // [MaxCascadeLevels]
	LevelBatchSize                  // [MaxCascadeLevels] entries of each level (its qo_indptr has one more)
	LevelQOIndptr                   // [MaxRequests+1] per level
	LevelKVIndptr                   // [MaxRequests+1] per level
	LevelKVPageIndices              // [MaxPages] per level
	LevelKVLastPageLen              // [MaxRequests] per level
	BlockTables                     // [MaxRequests*BlockTablesStride] block_tables [B, stride], row-major (groups with a stride)
	numArrays
)

var arrayNames = [...]string{
	PoolHeader: "header", Copies: "copies", GroupHeader: "group_header",
	QOIndptr: "qo_indptr", BatchIndices: "batch_indices", Positions: "positions",
	TokenIDs: "token_ids", TokenPositions: "token_positions", Drafts: "drafts",
	KVIndptr: "kv_indptr", KVPageIndices: "kv_page_indices", KVLastPageLen: "kv_last_page_len", SeqLens: "seq_lens",
	AttnQOIndptr: "attn_qo_indptr", AttnKVIndptr: "attn_kv_indptr", AttnKVPageIndices: "attn_kv_page_indices",
	AttnKVLastPageLen: "attn_kv_last_page_len", AttnRequests: "attn_requests",
	QueryRows: "query_rows", CascadeWindowLeft: "cascade_window_left", LevelBatchSize: "level_batch_size",
	LevelQOIndptr: "level_qo_indptr", LevelKVIndptr: "level_kv_indptr",
	LevelKVPageIndices: "level_kv_indices", LevelKVLastPageLen: "level_kv_last_page_len",
	BlockTables: "block_tables",
}

// String returns the array's name (the names of the C ABI's and Python's
// layout tables).
func (a Array) String() string {
	if a >= 0 && a < numArrays {
		return arrayNames[a]
	}
	return fmt.Sprintf("Array(%d)", int(a))
}

// NumArrays is the number of Array values (0 .. NumArrays-1).
const NumArrays = int(numArrays)

// Capacities bound the steps a layout holds.
type Capacities struct {
	MaxRequests      int // B of a step, >= 1
	MaxTokens        int // nnz of a step, >= 1
	MaxPages         int // kv_indptr[B] of each group, >= 1
	MaxCascadeLevels int // 0: no cascade rows (cascade plans are then run flat); <= MaxLevels
}

// GroupSpec is what of a layer group the layout depends on.
type GroupSpec struct {
	Chunked bool // the group has the Attn rows
	// BlockTablesStride, when > 0, gives the group a BlockTables row of
	// MaxRequests*BlockTablesStride entries (the padded block_tables
	// [B, stride] of its plan); at most MaxCap entries in all.
	BlockTablesStride int
}

// IsLevel reports whether a is a per-level array (one row per cascade
// level).
func (a Array) IsLevel() bool { return a >= LevelQOIndptr && a <= LevelKVLastPageLen }

// Row is one array of a layout.
type Row struct {
	Array  Array
	Group  int // -1 for the pool's rows
	Level  int // the cascade level of a Level* row, else -1
	Offset int // bytes from the buffer's start, a multiple of Align
	Cap    int // capacity in int32 elements
}

// Layout is the packed layout of one buffer.
type Layout struct {
	Caps   Capacities
	Groups []GroupSpec
	Rows   []Row
	Size   int // bytes the buffer needs
	// index[g+1][a] is the row of array a of group g (-1 absent); level
	// rows are at index + level.
	index [][NumArrays]int
}

// Errors of NewLayout and Bind.
var (
	ErrBadCapacity = errors.New("stepbuf: bad capacity")
	ErrTooSmall    = errors.New("stepbuf: buffer too small")
	ErrMisaligned  = errors.New("stepbuf: buffer misaligned")
)

// NewLayout returns the layout of caps for groups (one for a dense
// Manager). The bounds that make every row fit a step within caps: at most
// one copy per request and group (copy-on-write of its shared last page);
// a chunked group's attention has at most one entry per row and reads a
// subset of its pages; a cascade level has at most one entry per request
// and at most the group's pages.
func NewLayout(caps Capacities, groups []GroupSpec) (*Layout, error) {
	check := func(name string, v, lo, hi int) error {
		if v < lo || v > hi {
			return fmt.Errorf("%w: %s = %d, want %d..%d", ErrBadCapacity, name, v, lo, hi)
		}
		return nil
	}
	if err := errors.Join(check("MaxRequests", caps.MaxRequests, 1, MaxCap-1),
		check("MaxTokens", caps.MaxTokens, 1, MaxCap-1), check("MaxPages", caps.MaxPages, 1, MaxCap),
		check("MaxCascadeLevels", caps.MaxCascadeLevels, 0, MaxLevels),
		check("groups", len(groups), 1, 1024)); err != nil {
		return nil, err
	}
	for g, spec := range groups {
		if s := spec.BlockTablesStride; s < 0 || s > 0 && int64(s)*int64(caps.MaxRequests) > MaxCap {
			return nil, fmt.Errorf("%w: group %d: BlockTablesStride = %d, want 0..%d (MaxRequests = %d rows of at most %d entries in all)",
				ErrBadCapacity, g, s, MaxCap/caps.MaxRequests, caps.MaxRequests, MaxCap)
		}
	}
	l := &Layout{Caps: caps, Groups: append([]GroupSpec(nil), groups...), index: make([][NumArrays]int, len(groups)+1)}
	for g := range l.index {
		for a := range l.index[g] {
			l.index[g][a] = -1
		}
	}
	R, T, P, L := caps.MaxRequests, caps.MaxTokens, caps.MaxPages, caps.MaxCascadeLevels
	off := 0
	add := func(a Array, g, level, n int) {
		if level <= 0 {
			l.index[g+1][a] = len(l.Rows)
		}
		l.Rows = append(l.Rows, Row{Array: a, Group: g, Level: level, Offset: off, Cap: n})
		off += (4*n + Align - 1) / Align * Align
	}
	add(PoolHeader, -1, -1, HeaderLen)
	add(Copies, -1, -1, 3*R*len(groups))
	for g, spec := range groups {
		add(GroupHeader, g, -1, HeaderLen)
		for _, a := range []Array{QOIndptr, BatchIndices, Positions, TokenIDs, TokenPositions, Drafts,
			KVIndptr, KVPageIndices, KVLastPageLen, SeqLens} {
			add(a, g, -1, l.bound(a))
		}
		if spec.BlockTablesStride > 0 {
			add(BlockTables, g, -1, R*spec.BlockTablesStride)
		}
		if spec.Chunked {
			for _, a := range []Array{AttnQOIndptr, AttnKVIndptr, AttnKVPageIndices, AttnKVLastPageLen, AttnRequests} {
				add(a, g, -1, l.bound(a))
			}
		}
		if L > 0 {
			add(QueryRows, g, -1, T)
			add(CascadeWindowLeft, g, -1, L)
			add(LevelBatchSize, g, -1, L)
			for lv := range L {
				for _, a := range []Array{LevelQOIndptr, LevelKVIndptr, LevelKVPageIndices, LevelKVLastPageLen} {
					add(a, g, lv, l.bound(a))
				}
			}
		}
	}
	_ = P
	l.Size = off
	return l, nil
}

// bound is the capacity of array a's row.
func (l *Layout) bound(a Array) int {
	R, T, P := l.Caps.MaxRequests, l.Caps.MaxTokens, l.Caps.MaxPages
	switch a {
	case QOIndptr, KVIndptr, LevelQOIndptr, LevelKVIndptr:
		return R + 1
	case Drafts, KVLastPageLen, SeqLens, LevelKVLastPageLen:
		return R
	case BatchIndices, Positions, TokenIDs, TokenPositions, AttnKVLastPageLen, AttnRequests, QueryRows:
		return T
	case AttnQOIndptr, AttnKVIndptr:
		return T + 1
	case KVPageIndices, AttnKVPageIndices, LevelKVPageIndices:
		return P
	}
	panic("stepbuf: no bound for " + a.String())
}

// Find returns the index in Rows of array a of group g (-1 for the pool's
// rows) and, for a Level* array, of cascade level level; -1 if the layout
// has no such row.
func (l *Layout) Find(a Array, g, level int) int {
	if a < 0 || a >= numArrays || g < -1 || g+1 >= len(l.index) {
		return -1
	}
	i := l.index[g+1][a]
	if i < 0 {
		return -1
	}
	if a.IsLevel() {
		if level < 0 || level >= l.Caps.MaxCascadeLevels {
			return -1
		}
		return i + 4*level
	}
	return i
}

// Buffers is a layout bound to memory: every row as an int32 slice.
type Buffers struct {
	Layout *Layout
	Mem    []byte
	// Rows[i] is Layout.Rows[i]'s memory, of length and capacity Cap.
	Rows [][]int32
}

// Bind checks that mem holds lay (len(mem) >= lay.Size, base address a
// multiple of Align) and returns its rows. Bind keeps mem, and a Buffers
// writes into it until the caller stops using it.
func Bind(mem []byte, lay *Layout) (*Buffers, error) {
	if len(mem) < lay.Size {
		return nil, fmt.Errorf("%w: %d bytes, the layout needs %d (capacities %+v, %d groups)",
			ErrTooSmall, len(mem), lay.Size, lay.Caps, len(lay.Groups))
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	if base%Align != 0 {
		return nil, fmt.Errorf("%w: base address %#x is not a multiple of %d", ErrMisaligned, base, Align)
	}
	b := &Buffers{Layout: lay, Mem: mem[:lay.Size:lay.Size], Rows: make([][]int32, len(lay.Rows))}
	for i, r := range lay.Rows {
		if r.Cap > 0 {
			b.Rows[i] = unsafe.Slice((*int32)(unsafe.Pointer(&mem[r.Offset])), r.Cap)
		} else {
			b.Rows[i] = []int32{}
		}
	}
	return b, nil
}

// Row returns the slice of array a of group g (and level), or nil when the
// layout has no such row.
func (b *Buffers) Row(a Array, g, level int) []int32 {
	if i := b.Layout.Find(a, g, level); i >= 0 {
		return b.Rows[i]
	}
	return nil
}
