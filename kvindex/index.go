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
// than the index's); the index is left as it was.
var ErrBadEvent = errors.New("kvindex: event does not fit the index")

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
}

// Index maps prefix hash chains to the replicas that cache them. It is safe
// for concurrent use: subscribers apply events while routers query.
type Index struct {
	pageSize int
	hasher   prefixcache.Hasher

	mu       sync.RWMutex
	replicas []*replica
}

type replica struct {
	name   string
	blocks map[uint64]uint8 // chain hash -> media holding it
	stats  ReplicaStats
}

// ReplicaStats are an index's cumulative counts for one replica.
type ReplicaStats struct {
	Batches, Stored, Removed, Cleared int64
	Blocks                            int // blocks indexed now
}

// New returns an empty index.
func New(cfg Config) (*Index, error) {
	if cfg.PageSize < 1 || cfg.Seed == 0 {
		return nil, fmt.Errorf("%w: page size %d, seed %d: want >= 1 and a non-zero seed (the Managers' HashSeed)", ErrBadConfig, cfg.PageSize, cfg.Seed)
	}
	return &Index{pageSize: cfg.PageSize, hasher: prefixcache.NewHasher(cfg.Seed, cfg.Hash)}, nil
}

// AddReplica adds a replica with no cached blocks and returns its number
// (0, 1, ... in the order added).
func (ix *Index) AddReplica(name string) int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.replicas = append(ix.replicas, &replica{name: name, blocks: map[uint64]uint8{}})
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

// Apply applies a batch of replica r's events in order. A batch with a
// BlockStored of another block size is refused whole (ErrBadEvent).
func (ix *Index) Apply(r int, b *Batch) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	rep, err := ix.replica(r)
	if err != nil {
		return err
	}
	for i := range b.Events {
		if e := &b.Events[i]; e.Kind == BlockStored && e.BlockSize != ix.pageSize {
			return fmt.Errorf("%w: replica %d event %d stores blocks of %d tokens; the index uses %d", ErrBadEvent, r, i, e.BlockSize, ix.pageSize)
		}
	}
	rep.stats.Batches++
	for i := range b.Events {
		e := &b.Events[i]
		switch e.Kind {
		case AllBlocksCleared:
			clear(rep.blocks)
			rep.stats.Cleared++
		case BlockStored:
			bit := mediumBit(e.Medium)
			for _, h := range e.Hashes {
				rep.blocks[h] |= bit
			}
			rep.stats.Stored += int64(len(e.Hashes))
		case BlockRemoved:
			bit := mediumBit(e.Medium)
			for _, h := range e.Hashes {
				if m := rep.blocks[h] &^ bit; m != 0 {
					rep.blocks[h] = m
				} else {
					delete(rep.blocks, h)
				}
			}
			rep.stats.Removed += int64(len(e.Hashes))
		}
	}
	return nil
}

// clearReplica forgets everything about replica r (its stream could not be
// repaired).
func (ix *Index) clearReplica(r int) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	clear(ix.replicas[r].blocks)
}

// Hashes appends the chain hashes of the full pages of tokens in namespace
// ns to dst: what the Managers publish for that prefix.
func (ix *Index) Hashes(dst []uint64, ns prefixcache.Namespace, tokens []int32) []uint64 {
	return ix.hasher.Chain(dst, ns, ix.pageSize, tokens)
}

// Match appends to dst, for every replica, how many leading tokens of
// tokens (in namespace ns) it has cached, and returns it.
func (ix *Index) Match(dst []int, ns prefixcache.Namespace, tokens []int32) []int {
	return ix.MatchHashes(dst, ix.Hashes(nil, ns, tokens))
}

// MatchHashes is Match for a chain computed with [Index.Hashes].
func (ix *Index) MatchHashes(dst []int, chain []uint64) []int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	for _, rep := range ix.replicas {
		d := 0
		for d < len(chain) && rep.blocks[chain[d]] != 0 {
			d++
		}
		dst = append(dst, d*ix.pageSize)
	}
	return dst
}

// Blocks returns replica r's indexed chain hashes, sorted.
func (ix *Index) Blocks(r int) []uint64 {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	rep, err := ix.replica(r)
	if err != nil {
		return nil
	}
	out := make([]uint64, 0, len(rep.blocks))
	for h := range rep.blocks {
		out = append(out, h)
	}
	slices.Sort(out)
	return out
}

// Stats returns replica r's counts.
func (ix *Index) Stats(r int) ReplicaStats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	rep, err := ix.replica(r)
	if err != nil {
		return ReplicaStats{}
	}
	st := rep.stats
	st.Blocks = len(rep.blocks)
	return st
}
