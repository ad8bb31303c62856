package kvindex

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/pagedkv/pagedkv/prefixcache"
)

// ErrBadConfig reports an invalid configuration.
var ErrBadConfig = errors.New("kvindex: bad config")

// ErrBadEvent reports an event the index cannot apply (a block size other
// than the index's, or a group_idx beyond MaxGroups); the index is left as
// it was.
var ErrBadEvent = errors.New("kvindex: event does not fit the index")

// MaxGroups bounds the KV-cache groups (distinct group_idx values) an
// index keeps per replica; a batch that would name more is refused whole
// (ErrBadEvent). Hybrid models have a handful.
const MaxGroups = 1024

// DefaultMaxBlocks is Config.MaxBlocks' default: the (group, hash) entries
// one replica's index may hold. 2^20 pages of 16 tokens are 16M tokens of
// KV cache: about 5 TiB for a 70B model (320 KiB a token at 16 bits), 2
// TiB for an 8B one, more than a node's GPUs and CPU tier hold. A full
// replica costs the router about 36 MiB (docs/kvindex.md).
const DefaultMaxBlocks = 1 << 20

// shrinkMin is the map size (entries at its largest) below which a group's
// map is kept when it empties: Go maps do not give memory back when
// entries are deleted, so a group that held many more entries than it
// holds now gets a fresh map (see group.compact).
const shrinkMin = 64

// Media, as bits of an indexed block: a block counts as cached while any
// medium holds it.
const (
	mediumGPU uint8 = 1 << iota
	mediumCPU
	mediumOther
)

func mediumBit(m string) uint8 {
	switch m {
	case "", "GPU":
		return mediumGPU // vLLM's None is the GPU pool
	case "CPU":
		return mediumCPU
	}
	return mediumOther
}

// Config describes the engines whose events an Index reads: all replicas
// must run the same page size and hash chain (Manager HashSeed), as the
// router computes the chain itself.
type Config struct {
	PageSize int
	// Seed is the Managers' HashSeed (pagedkv.Manager.HashSeed); it must
	// not be 0.
	Seed uint64
	// Hash is the Managers' Config.Hash; nil for the default.
	Hash prefixcache.HashFunc
	// MaxBlocks bounds the (group, hash) entries the index holds for one
	// replica (ReplicaStats.GroupBlocks), so that a replica's stream cannot
	// grow the router's memory without end; 0: DefaultMaxBlocks. A
	// BlockStored of a new block when the replica is at the bound is not
	// indexed (counted in ReplicaStats.OverCap): the index under-reports
	// that replica until removals make room, and never over-reports.
	MaxBlocks int
}

// Index maps prefix hash chains to the replicas that cache them. It is safe
// for concurrent use: subscribers apply events while routers query.
type Index struct {
	pageSize  int
	maxBlocks int
	hasher    prefixcache.Hasher

	mu       sync.RWMutex
	replicas []*replica
}

// replica is one replica's indexed blocks, per KV-cache group.
type replica struct {
	name string
	// groups are every group_idx the replica's events have named (an event
	// without one is group 0), sorted by index. AllBlocksCleared and an
	// unrepaired gap empty them but keep them: a prefix hit needs every
	// group, and forgetting a group would let a later partial refill
	// over-report.
	groups []*group
	// entries is the (group, hash) entries of every group together: at
	// most the index's maxBlocks.
	entries int
	stats   ReplicaStats
}

// group is one KV-cache group's blocks on a replica.
type group struct {
	idx int
	// state: the group's BlockStored events name it a state group
	// (kv_cache_spec_kind "mamba"): its blocks are checkpoints, a prefix's
	// state at that block's end, not a contiguous chain.
	state  bool
	blocks map[uint64]uint8 // chain hash -> media holding it
	// peak is the most entries blocks has held: a Go map keeps the room
	// for them when they are deleted.
	peak int
}

// group returns replica group g, adding it if add is true (nil if it is
// not there and add is false).
func (rep *replica) group(g int, add bool) *group {
	i, ok := slices.BinarySearchFunc(rep.groups, g, func(x *group, g int) int { return x.idx - g })
	if ok {
		return rep.groups[i]
	}
	if !add {
		return nil
	}
	x := &group{idx: g, blocks: map[uint64]uint8{}}
	rep.groups = slices.Insert(rep.groups, i, x)
	return x
}

// clear empties every group's blocks; the groups stay known.
func (rep *replica) clear() {
	for _, x := range rep.groups {
		clear(x.blocks)
		x.compact()
	}
	rep.entries = 0
}

// compact gives a group's map back to the allocator when it holds half or
// less of what it held at its largest (and that was more than shrinkMin):
// a fresh map holds what is left. The room all of a replica's maps keep is
// then for at most 2 × its entries (2 × MaxBlocks) plus shrinkMin a group,
// whatever its stream stored and removed before; the copying costs at most
// one entry for every one removed.
func (x *group) compact() {
	n := len(x.blocks)
	if x.peak <= shrinkMin || n > x.peak/2 {
		return
	}
	m := make(map[uint64]uint8, n)
	for h, bits := range x.blocks {
		m[h] = bits
	}
	x.blocks, x.peak = m, n
}

// match is how many leading blocks of chain the replica can serve (by any
// medium): the minimum over its attention groups of each group's
// contiguous match from block 0, cut back, when it has state groups, to
// the deepest block every state group holds (a checkpoint at that
// prefix's end: pagedkv's HybridManager admission rule). A replica with no
// known group, or with state groups only, serves nothing.
func (rep *replica) match(chain []uint64) int {
	d, attention, states := len(chain), false, false
	for _, x := range rep.groups {
		if x.state {
			states = true
			continue
		}
		attention = true
		k := 0
		for k < d && x.blocks[chain[k]] != 0 {
			k++
		}
		d = k
	}
	if !attention {
		return 0
	}
	for states && d > 0 && !rep.statesHold(chain[d-1]) {
		d--
	}
	return d
}

// statesHold reports whether every state group holds block h.
func (rep *replica) statesHold(h uint64) bool {
	for _, x := range rep.groups {
		if x.state && x.blocks[h] == 0 {
			return false
		}
	}
	return true
}

// ReplicaStats are an index's cumulative counts for one replica and the
// size of its index now.
type ReplicaStats struct {
	Batches, Stored, Removed, Cleared int64
	// OverCap counts the block hashes of BlockStored events that were not
	// indexed because the replica held Config.MaxBlocks entries: the index
	// under-reports the replica (it holds a subset of the replica's
	// blocks), as with a clear, but keeps what it holds.
	OverCap int64
	// Unapplied counts the batches of the replica's stream that were not
	// applied in full (undecodable, or refused by Apply) and Restarts the
	// publisher restarts its stream showed (sequence numbers going back):
	// each cleared the replica's blocks, as the index could no longer know
	// which it holds.
	Unapplied, Restarts int64
	// Blocks is the number of distinct block hashes indexed now in any
	// group (len of [Index.Blocks]); a hash held by several groups counts
	// once.
	Blocks int
	// GroupBlocks is the number of (group, hash) entries indexed now: the
	// sum over groups of len([Index.GroupBlocks]). It equals Blocks for a
	// single-group replica.
	GroupBlocks int
	// Groups is the number of KV-cache groups the replica's events have
	// named (group_idx values, None counting as 0), cleared or not.
	Groups int
}

// New returns an empty index.
func New(cfg Config) (*Index, error) {
	if cfg.PageSize < 1 || cfg.Seed == 0 {
		return nil, fmt.Errorf("%w: page size %d, seed %d: want >= 1 and a non-zero seed (the Managers' HashSeed)", ErrBadConfig, cfg.PageSize, cfg.Seed)
	}
	if cfg.MaxBlocks < 0 {
		return nil, fmt.Errorf("%w: max blocks %d: want >= 0 (0: %d)", ErrBadConfig, cfg.MaxBlocks, DefaultMaxBlocks)
	}
	if cfg.MaxBlocks == 0 {
		cfg.MaxBlocks = DefaultMaxBlocks
	}
	return &Index{pageSize: cfg.PageSize, maxBlocks: cfg.MaxBlocks, hasher: prefixcache.NewHasher(cfg.Seed, cfg.Hash)}, nil
}

// AddReplica adds a replica with no cached blocks and returns its number
// (0, 1, ... in the order added).
func (ix *Index) AddReplica(name string) int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.replicas = append(ix.replicas, &replica{name: name})
	return len(ix.replicas) - 1
}

// Replicas returns the number of replicas.
func (ix *Index) Replicas() int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return len(ix.replicas)
}

func (ix *Index) replica(r int) (*replica, error) {
	if r < 0 || r >= len(ix.replicas) {
		return nil, fmt.Errorf("%w: replica %d of %d", ErrBadConfig, r, len(ix.replicas))
	}
	return ix.replicas[r], nil
}

// Apply applies a batch of replica r's events in order, each to its
// group (Event.Group; group 0 without one). A block a BlockStored would
// add beyond Config.MaxBlocks entries for the replica is not indexed
// (ReplicaStats.OverCap; the rest of the batch is applied: that is no
// error). A batch with a BlockStored of another block size is refused
// whole (ErrBadEvent) and leaves the index as it was; a caller that
// follows a replica's stream must then treat the replica's blocks as
// unknown, as the batch's removals are lost (a Subscriber clears them).
func (ix *Index) Apply(r int, b *Batch) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.applyLocked(r, b)
}

func (ix *Index) applyLocked(r int, b *Batch) error {
	rep, err := ix.replica(r)
	if err != nil {
		return err
	}
	var added []int // groups the batch would add
	for i := range b.Events {
		e := &b.Events[i]
		if e.Kind == BlockStored && e.BlockSize != ix.pageSize {
			return fmt.Errorf("%w: replica %d event %d stores blocks of %d tokens; the index uses %d", ErrBadEvent, r, i, e.BlockSize, ix.pageSize)
		}
		if (e.Kind == BlockStored || e.Kind == BlockRemoved) && rep.group(e.Group, false) == nil && !slices.Contains(added, e.Group) {
			if len(rep.groups)+len(added) == MaxGroups {
				return fmt.Errorf("%w: replica %d event %d names group_idx %d, beyond the %d groups the index keeps per replica", ErrBadEvent, r, i, e.Group, MaxGroups)
			}
			added = append(added, e.Group)
		}
	}
	rep.stats.Batches++
	for i := range b.Events {
		e := &b.Events[i]
		switch e.Kind {
		case AllBlocksCleared:
			rep.clear()
			rep.stats.Cleared++
		case BlockStored:
			x := rep.group(e.Group, true)
			x.state = x.state || e.State
			bit := mediumBit(e.Medium)
			for _, h := range e.Hashes {
				if m, ok := x.blocks[h]; ok {
					x.blocks[h] = m | bit // another medium: no new entry
				} else if rep.entries < ix.maxBlocks {
					x.blocks[h] = bit
					rep.entries++
				} else {
					rep.stats.OverCap++
				}
			}
			x.peak = max(x.peak, len(x.blocks))
			rep.stats.Stored += int64(len(e.Hashes))
		case BlockRemoved:
			// A removal names its group: the group is known from now on,
			// even if it held none of the blocks.
			x := rep.group(e.Group, true)
			bit := mediumBit(e.Medium)
			for _, h := range e.Hashes {
				m, ok := x.blocks[h]
				switch {
				case !ok:
				case m&^bit != 0:
					x.blocks[h] = m &^ bit
				default:
					delete(x.blocks, h)
					rep.entries--
				}
			}
			x.compact()
			rep.stats.Removed += int64(len(e.Hashes))
		}
	}
	return nil
}

// Why a stream cleared its replica's blocks.
type clearCause uint8

const (
	causeGap       clearCause = iota // a gap a replay could not fill
	causeUnapplied                   // a batch not applied in full
	causeRestart                     // the publisher restarted
	causeAbandoned                   // a replay given up (SourceStats counts it)
)

// clearReplica forgets replica r's blocks, as its stream cannot tell
// which it holds; its groups stay known.
func (ix *Index) clearReplica(r int, cause clearCause) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.clearLocked(r, cause)
}

func (ix *Index) clearLocked(r int, cause clearCause) {
	rep := ix.replicas[r]
	rep.clear()
	switch cause {
	case causeUnapplied:
		rep.stats.Unapplied++
	case causeRestart:
		rep.stats.Restarts++
	}
}

// applyOrClear applies a batch of replica r's stream, or, if Apply refuses
// it, clears the replica's blocks under the same lock: a query sees the
// replica before the batch or cleared, never what the batch would have
// left out.
func (ix *Index) applyOrClear(r int, b *Batch) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	err := ix.applyLocked(r, b)
	if err != nil {
		ix.clearLocked(r, causeUnapplied)
	}
	return err
}

// Hashes appends the chain hashes of the full pages of tokens in namespace
// ns to dst: what the Managers publish for that prefix.
func (ix *Index) Hashes(dst []uint64, ns prefixcache.Namespace, tokens []int32) []uint64 {
	return ix.hasher.Chain(dst, ns, ix.pageSize, tokens)
}

// Match appends to dst, for every replica, how many leading tokens of
// tokens (in namespace ns) it has cached, and returns it. A replica with
// several KV-cache groups has cached a prefix only when every group holds
// all of its blocks: see [Index.MatchHashes].
func (ix *Index) Match(dst []int, ns prefixcache.Namespace, tokens []int32) []int {
	return ix.MatchHashes(dst, ix.Hashes(nil, ns, tokens))
}

// MatchHashes is Match for a chain computed with [Index.Hashes]. A
// replica's match is PageSize times the minimum, over the group_idx values
// its events have named, of the number of leading blocks of chain the
// group holds (by any medium), counted from block 0 up to the first the
// group lacks: pagedkv's HybridManager admission rule. For a single-group
// replica it is the number of leading blocks the replica holds. State
// groups (a BlockStored with kv_cache_spec_kind "mamba") hold checkpoints,
// not chains: the match is then cut back to the deepest block, within the
// other groups' match, that every state group holds; a replica with state
// groups only matches nothing. An engine admitting a prompt leaves its
// last token to compute: its hit is MatchHashes of the chain of all but
// the last token.
func (ix *Index) MatchHashes(dst []int, chain []uint64) []int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	for _, rep := range ix.replicas {
		dst = append(dst, rep.match(chain)*ix.pageSize)
	}
	return dst
}

// Blocks returns the chain hashes replica r holds in any group, sorted and
// without repeats.
func (ix *Index) Blocks(r int) []uint64 { return readReplica(ix, r, (*replica).union) }

// readReplica returns read(replica r) under the read lock; the zero T when
// r is not a replica.
func readReplica[T any](ix *Index, r int, read func(*replica) T) T {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	rep, err := ix.replica(r)
	if err != nil {
		var zero T
		return zero
	}
	return read(rep)
}

// union returns the sorted distinct hashes of every group.
func (rep *replica) union() []uint64 {
	n := 0
	for _, x := range rep.groups {
		n += len(x.blocks)
	}
	out := make([]uint64, 0, n)
	for _, x := range rep.groups {
		for h := range x.blocks {
			out = append(out, h)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// GroupBlocks returns the chain hashes replica r holds in group g
// (group_idx; 0 for events without one), sorted; nil for a group the
// replica's events never named.
func (ix *Index) GroupBlocks(r, g int) []uint64 {
	return readReplica(ix, r, func(rep *replica) []uint64 {
		x := rep.group(g, false)
		if x == nil {
			return nil
		}
		out := make([]uint64, 0, len(x.blocks))
		for h := range x.blocks {
			out = append(out, h)
		}
		slices.Sort(out)
		return out
	})
}

// Groups returns the group_idx values replica r's events have named
// (events without one count as 0), sorted.
func (ix *Index) Groups(r int) []int {
	return readReplica(ix, r, func(rep *replica) []int {
		out := make([]int, len(rep.groups))
		for i, x := range rep.groups {
			out[i] = x.idx
		}
		return out
	})
}

// Stats returns replica r's counts.
func (ix *Index) Stats(r int) ReplicaStats { return readReplica(ix, r, (*replica).statsNow) }

// statsNow is the replica's ReplicaStats with its group and block counts.
func (rep *replica) statsNow() ReplicaStats {
	st := rep.stats
	st.Groups = len(rep.groups)
	for _, x := range rep.groups {
		st.GroupBlocks += len(x.blocks)
	}
	switch len(rep.groups) {
	case 0:
	case 1:
		st.Blocks = st.GroupBlocks
	default:
		st.Blocks = len(rep.union())
	}
	return st
}
