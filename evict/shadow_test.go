package evict

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// refStack is the slow reference: one slice, most recent first, as long
// as the largest shadow; the LRU cache of size n holds its first n keys
// (LRU's inclusion property), so a reference hits in every shadow whose
// size is past the key's position.
type refStack struct {
	sizes [ShadowSizes]int
	keys  []uint64
}

// use moves k to the front (inserting it if insert) and returns its old
// position, or -1.
func (r *refStack) use(k uint64, insert bool) int {
	i := slices.Index(r.keys, k)
	if i < 0 && !insert {
		return -1
	}
	if i >= 0 {
		r.keys = slices.Delete(r.keys, i, i+1)
	}
	r.keys = slices.Insert(r.keys, 0, k)
	if len(r.keys) > r.sizes[ShadowSizes-1] {
		r.keys = r.keys[:r.sizes[ShadowSizes-1]]
	}
	return i
}

// At rate 1 every key is sampled, so the shadows are exact LRU caches of
// their sizes: each one's hits must be the reference stack's, under
// random references and touches (a touch moves a held key to the front)
// over a small key space, so every segment fills, demotes and evicts.
func TestShadowMatchesLRUs(t *testing.T) {
	rounds := 2000
	if raceEnabled {
		rounds /= 10
	}
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		pages := 8 + rng.IntN(40)
		s, err := NewShadow(pages, 1)
		require.NoError(t, err)
		ref := &refStack{}
		for i, f := range ShadowFactors {
			ref.sizes[i] = max(int(f*float64(pages)+0.5), MinShadowEntries+i)
		}
		var hits [ShadowSizes]int64
		keys := uint64(pages * (2 + rng.IntN(60)))
		for range rounds {
			k := rng.Uint64N(keys) * 0x9e3779b97f4a7c15
			if rng.IntN(4) == 0 {
				s.Touch(k)
				ref.use(k, false)
				continue
			}
			s.Ref(k)
			if at := ref.use(k, true); at >= 0 {
				for i, size := range ref.sizes {
					if at < size {
						hits[i]++
					}
				}
			}
		}
		require.Equal(t, hits, s.hits(), "seed %d", seed)
		e := s.Estimates()
		for i := range hits {
			require.InDelta(t, float64(hits[i])/float64(e.Sampled), e.HitRatio[i], 1e-12)
		}
	}
}

func TestShadowRefusesBadArguments(t *testing.T) {
	_, err := NewShadow(10, 1.5)
	require.ErrorContains(t, err, "rate 1.5")
	_, err = NewShadow(0, 0.5)
	require.ErrorContains(t, err, "0 pages")
}

// The stack's index under crowding: every key's home is one of the last
// two or the first position of the index, so probes wrap around its end
// and every deletion shifts entries back across it; the stack's hits must
// stay the reference's.
func TestShadowIndexWraps(t *testing.T) {
	s, err := NewShadow(MinShadowEntries, 1)
	require.NoError(t, err)
	mask := s.stack.mask
	var keys []uint64
	for k := uint64(1); len(keys) < 3*len(s.stack.key); k++ {
		if home := shadowMix(k) & mask; home >= mask-1 || home == 0 {
			keys = append(keys, k)
		}
	}
	ref := &refStack{}
	for i, f := range ShadowFactors {
		ref.sizes[i] = max(int(f*MinShadowEntries+0.5), MinShadowEntries+i)
	}
	rng := rand.New(rand.NewPCG(3, 3))
	var hits [ShadowSizes]int64
	rounds := 3000
	if raceEnabled {
		rounds /= 10
	}
	for range rounds {
		k := keys[rng.IntN(len(keys))]
		s.Ref(k)
		if at := ref.use(k, true); at >= 0 {
			for i, size := range ref.sizes {
				if at < size {
					hits[i]++
				}
			}
		}
	}
	require.Equal(t, hits, s.hits())
}
