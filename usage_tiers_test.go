package pagedkv

import (
	"context"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/prefixcache"
	"github.com/pagedkv/pagedkv/tier"
)

// memStore is a RemoteStore in memory that names its medium: a fake disk
// (tier.Disk) or a fake Redis (medium tier.Remote, or no Medium method at
// all when plain). It keeps at most capacity pages, forgetting the oldest.
type memStore struct {
	medium   tier.Medium
	capacity int
	order    []tier.Digest
	pages    map[tier.Digest]memPage
}

type memPage struct {
	parent tier.Digest
	tokens []int32
	data   []byte
}

func newMemStore(medium tier.Medium, capacity int) *memStore {
	return &memStore{medium: medium, capacity: capacity, pages: map[tier.Digest]memPage{}}
}

func (s *memStore) Fetch(_ context.Context, pages []tier.RemotePage) int {
	for i := range pages {
		p, ok := s.pages[pages[i].Digest]
		if !ok || p.parent != pages[i].Parent || !slices.Equal(p.tokens, pages[i].Tokens) {
			return i
		}
		copy(pages[i].Data, p.data)
	}
	return len(pages)
}

func (s *memStore) Store(p *tier.RemotePage) bool {
	if _, ok := s.pages[p.Digest]; ok {
		return true
	}
	if len(s.order) == s.capacity {
		delete(s.pages, s.order[0])
		s.order = s.order[1:]
	}
	s.pages[p.Digest] = memPage{p.Parent, slices.Clone(p.Tokens), slices.Clone(p.Data)}
	s.order = append(s.order, p.Digest)
	return true
}

func (s *memStore) Stats() tier.RemoteStats { return tier.RemoteStats{} }

func (s *memStore) has(d tier.Digest) bool { _, ok := s.pages[d]; return ok }

// mediumMemStore is a memStore that says its medium.
type mediumMemStore struct{ *memStore }

func (s mediumMemStore) Medium() tier.Medium { return s.medium }

// usageOracle is the slow reference of an admission's reads: from what
// each tier holds just before it (the device cache's and the host tier's
// chain hashes, the stores' digests), the medium of each page of the
// prompt in the order an admission looks (device, host, then each store
// nearest first), each a leading run after the one before.
type usageOracle struct {
	m      *Manager
	stores []*memStore // nearest first
}

// noSource marks a page no tier holds.
const noSource tier.Medium = 255

// sources returns, per page of tokens an admission may match, the medium
// it would be read from (noSource past every run).
func (o *usageOracle) sources(ns Namespace, tokens []int32) []tier.Medium {
	m, ps := o.m, o.m.PageSize()
	if len(tokens) <= 1 {
		return nil
	}
	n := (len(tokens) - 1) / ps
	dev, host := map[uint64]bool{}, map[uint64]bool{}
	for _, h := range m.CachedHashes(nil) {
		dev[h] = true
	}
	for _, h := range m.HostCachedHashes(nil) {
		host[h] = true
	}
	hasher := prefixcache.NewHasher(m.HashSeed(), nil)
	g := m.core.groups[0]
	hv, d := g.cache.Key(ns).Hash(), g.tierRoot(ns)
	hashes, digests := make([]uint64, n), make([]tier.Digest, n)
	for j := range n {
		tok := tokens[j*ps : (j+1)*ps]
		hv, d = hasher.Page(hv, tok), tier.Next(nil, d, tok)
		hashes[j], digests[j] = hv, d
	}
	out := make([]tier.Medium, n)
	j := 0
	run := func(med tier.Medium, holds func(j int) bool) {
		for ; j < n && holds(j); j++ {
			out[j] = med
		}
	}
	run(tier.Device, func(j int) bool { return dev[hashes[j]] })
	run(tier.Host, func(j int) bool { return host[hashes[j]] })
	for _, s := range o.stores {
		run(s.medium, func(j int) bool { return s.has(digests[j]) })
	}
	run(noSource, func(int) bool { return true })
	return out
}

// admit runs an admission (Add or Resume) of request id on tokens in ns
// and checks the reads it added to the request's CacheUsage against the
// oracle; it returns the reads it expected.
func (o *usageOracle) admit(t *testing.T, id RequestID, ns Namespace, tokens []int32, noCache bool, do func() (int, error)) CacheUsage {
	t.Helper()
	src := o.sources(ns, tokens)
	before, _ := o.m.CacheUsage(id)
	matched, err := do()
	require.NoError(t, err)
	want := before
	if !noCache {
		for j := range matched / o.m.PageSize() {
			require.NotEqual(t, noSource, src[j], "request %d matched page %d that no tier held", id, j)
			want.add(src[j], int64(o.m.PageSize()))
		}
	}
	got, ok := o.m.CacheUsage(id)
	require.True(t, ok)
	got.WriteTokens = want.WriteTokens // writes are the device model's (manager_model_test.go)
	require.Equal(t, want, got, "request %d: reads after admitting %d tokens (sources %v)", id, matched, src)
	return got
}

// The reads of every admission (Add and Resume after preemption) in a
// random workload over a host tier and a store chain (a disk of bounded
// capacity above a Redis, or a plain remote store) equal what the tiers
// held just before it; the pool's totals are every request's summed,
// released ones included; a write never comes from an onload.
func TestCacheUsageReadsMatchTiers(t *testing.T) {
	t.Parallel()
	seeds := uint64(12)
	if raceEnabled {
		seeds = 3
	}
	var total CacheUsage
	for seed := range seeds {
		disk, redis := newMemStore(tier.Disk, 6+int(seed%3)*4), newMemStore(tier.Remote, 1<<20)
		var stores []*memStore
		var remote tier.RemoteStore
		switch seed % 3 {
		case 0:
			remote, stores = tier.Chain(mediumMemStore{disk}, mediumMemStore{redis}), []*memStore{disk, redis}
		case 1:
			remote, stores = tier.Chain(mediumMemStore{disk}, redis), []*memStore{disk, redis} // no Medium: remote
		default:
			remote, stores = redis, []*memStore{redis}
		}
		released := map[RequestID]CacheUsage{}
		m := runTierModel(t, tierModelConfig{seed: seed, ops: 600, numPages: 12 + int(seed%3)*4, hostPages: 6 + int(seed%4)*2,
			remote: remote, usage: checkUsage(t, stores, released)})
		st := m.Stats()
		var sum CacheUsage
		for _, u := range released {
			sum.DeviceReadTokens += u.DeviceReadTokens
			sum.HostReadTokens += u.HostReadTokens
			sum.DiskReadTokens += u.DiskReadTokens
			sum.RemoteReadTokens += u.RemoteReadTokens
			sum.WriteTokens += u.WriteTokens
		}
		require.Equal(t, sum, st.CacheUsage, "seed %d: the pool's totals are not the released requests' summed", seed)
		// A published page is a write of the request that computed it or
		// an onloaded one (a read): never more writes than publications.
		require.LessOrEqual(t, st.CacheUsage.WriteTokens, st.PublishedPages*int64(m.PageSize()))
		require.Equal(t, st.Tiers.HostHitTokens, st.CacheUsage.HostReadTokens, "seed %d: one group: host hits are host reads", seed)
		require.Equal(t, st.Tiers.RemoteHitTokens, st.CacheUsage.DiskReadTokens+st.CacheUsage.RemoteReadTokens, "seed %d", seed)
		total.DeviceReadTokens += st.CacheUsage.DeviceReadTokens
		total.HostReadTokens += st.CacheUsage.HostReadTokens
		total.DiskReadTokens += st.CacheUsage.DiskReadTokens
		total.RemoteReadTokens += st.CacheUsage.RemoteReadTokens
		total.WriteTokens += st.CacheUsage.WriteTokens
	}
	// Every source was exercised.
	require.Positive(t, total.DeviceReadTokens, "%+v", total)
	require.Positive(t, total.HostReadTokens, "%+v", total)
	require.Positive(t, total.DiskReadTokens, "%+v", total)
	require.Positive(t, total.RemoteReadTokens, "%+v", total)
	require.Positive(t, total.WriteTokens, "%+v", total)
}

// usageHooks let runTierModel's workload check cache accounting: admit
// wraps each Add and Resume (do runs it), released runs after a Release.
type usageHooks struct {
	admit    func(id RequestID, ns Namespace, tokens []int32, noCache bool, do func() (int, error))
	released func(id RequestID)
}

// checkUsage returns runTierModel's usage hooks: every admission's reads
// checked against the usageOracle over stores (nearest first), and every
// released request's usage read once into released (if not nil).
func checkUsage(t *testing.T, stores []*memStore, released ...map[RequestID]CacheUsage) func(m *Manager) usageHooks {
	return func(m *Manager) usageHooks {
		o := &usageOracle{m: m, stores: stores}
		return usageHooks{
			admit: func(id RequestID, ns Namespace, tokens []int32, noCache bool, do func() (int, error)) {
				o.admit(t, id, ns, tokens, noCache, do)
			},
			released: func(id RequestID) {
				u, ok := m.CacheUsage(id)
				require.True(t, ok, "request %d: usage not kept after release", id)
				_, again := m.CacheUsage(id)
				require.False(t, again, "request %d: usage read twice after release", id)
				for _, r := range released {
					r[id] = u
				}
			},
		}
	}
}
