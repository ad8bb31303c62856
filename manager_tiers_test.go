package pagedkv

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/tier"
)

func newTierManager(t testing.TB, numPages, hostPages int, tc TierConfig) (*Manager, *tierEngine) {
	t.Helper()
	tc.HostPages = hostPages
	if tc.Format.Layers == 0 {
		tc.Format = tierFormat(4)
	}
	m, err := New(Config{NumPages: numPages, PageSize: 4, HashSeed: 3, Tiers: tc})
	require.NoError(t, err)
	return m, newTierEngine(t, m)
}

func audit(t testing.TB, m *Manager) {
	t.Helper()
	require.NoError(t, m.Audit(), describeTiers(m))
}

// The copy protocol end to end: eviction plans offloads and keeps the
// evicted pages until they complete; a later prompt with the same prefix is
// served from host pages through onload copies, and the request may not
// step (or fork) until they complete.
func TestHostTierOffloadThenOnload(t *testing.T) {
	m, e := newTierManager(t, 8, 8, TierConfig{})
	prompt := randTokens(rand.New(rand.NewPCG(1, 2)), 13) // 3 full pages + 1 token
	_, err := e.add(1, Request{Prompt: prompt})
	require.NoError(t, err)
	e.prefill(16, 1)
	e.check("after prefill")
	require.NoError(t, m.Release(1))
	require.Equal(t, 3, m.Stats().CachedPages)
	audit(t, m)

	require.Equal(t, 3, m.Evict(8))
	cs := m.TierCopies(nil)
	require.Len(t, cs, 3)
	for _, c := range cs {
		require.Equal(t, tier.ToHost, c.Dir)
	}
	e.issued = append(e.issued, cs...)
	st := m.Stats()
	require.Equal(t, 5, st.FreePages, "evicted pages wait for their offloads")
	require.Equal(t, 3, st.Tiers.InFlight)
	audit(t, m)

	// Not served while the offloads are in flight.
	n, err := e.add(2, Request{Prompt: prompt})
	require.NoError(t, err)
	require.Zero(t, n, "a host page being written was served")
	require.NoError(t, m.Release(2))

	e.complete(nil)
	st = m.Stats()
	require.Equal(t, 8, st.FreePages)
	require.EqualValues(t, 3, st.Tiers.OffloadedPages)
	require.EqualValues(t, 3*e.fmt.PageBytes(), st.Tiers.BytesToHost)
	audit(t, m)

	// Poison the freed device pages: an onload that did not happen would
	// serve these bytes.
	for i := range e.dev {
		e.dev[i] = 0xee
	}
	n, err = e.add(3, Request{Prompt: prompt})
	require.NoError(t, err)
	require.Equal(t, 12, n, "3 pages from the host tier")
	require.True(t, m.Loading(3))
	cs = m.TierCopies(nil)
	require.Len(t, cs, 3)
	for _, c := range cs {
		require.Equal(t, tier.ToDevice, c.Dir)
	}
	e.issued = append(e.issued, cs...)
	_, err = m.Reserve([]RequestID{3}, []int32{1})
	require.ErrorIs(t, err, ErrLoading)
	require.ErrorIs(t, m.Fork(3, 4), ErrLoading)
	audit(t, m)

	e.complete(nil)
	require.False(t, m.Loading(3))
	e.check("after onload")
	st = m.Stats()
	require.EqualValues(t, 12, st.Tiers.HostHitTokens)
	require.EqualValues(t, 12, st.PromptHitTokens)
	require.Equal(t, 3, st.CachedPages, "onloaded pages join the device cache")
	e.prefill(16, 3)
	e.check("after the rest")
	audit(t, m)
	e.drain()
}

// newEvictedToHost is a 4-page Manager with a 4-page host tier whose one
// request (9 tokens) was prefilled and released, and its 2 full pages
// evicted to the host tier: their offloads are planned, not yet done.
func newEvictedToHost(t *testing.T) (*Manager, *tierEngine) {
	t.Helper()
	m, e := newTierManager(t, 4, 4, TierConfig{})
	_, err := e.add(1, Request{Prompt: seqTokens(0, 9)})
	require.NoError(t, err)
	e.prefill(16, 1)
	require.NoError(t, m.Release(1))
	require.Equal(t, 2, m.Evict(4))
	return m, e
}

// A page evicted to the host tier is not reused before its offload
// completes, even when a step wants it.
func TestEvictedPageWaitsForItsOffload(t *testing.T) {
	m, e := newEvictedToHost(t)
	e.take()

	_, err := e.add(2, Request{Prompt: seqTokens(100, 16)})
	require.NoError(t, err)
	before := m.Stats()
	_, err = m.Reserve([]RequestID{2}, []int32{16})
	require.ErrorIs(t, err, ErrOutOfPages, "the step needs the pages whose offloads are in flight")
	require.Equal(t, before, m.Stats())
	audit(t, m)

	e.complete(nil)
	require.NoError(t, e.step([]RequestID{2}, []int32{16}, func(RequestID) int32 { return 1 }))
	e.check("after the step")
	e.drain()
}

func TestCompleteTierCopiesRejectsBadIDs(t *testing.T) {
	m, e := newEvictedToHost(t)
	before := m.Stats()
	// Planned but not yet handed out: not completable.
	require.ErrorIs(t, m.CompleteTierCopies(1<<32), ErrBadArgument)
	cs := m.TierCopies(nil)
	require.Len(t, cs, 2)
	for _, ids := range [][]uint64{
		{cs[0].ID, cs[0].ID},         // repeated
		{cs[0].ID, cs[1].ID + 1<<32}, // wrong generation
		{cs[0].ID, 99},               // unknown slot
	} {
		require.ErrorIs(t, m.CompleteTierCopies(ids...), ErrBadArgument, "%v", ids)
		require.Equal(t, before, m.Stats(), "a refused completion changed the Manager")
		audit(t, m)
	}
	e.issued = cs
	e.complete(nil)
	require.ErrorIs(t, m.CompleteTierCopies(cs[0].ID), ErrBadArgument, "completed twice")
	e.drain()
}

// Releasing or preempting a loading request leaves its onload pages to the
// copies, which free them on completion.
func TestReleaseWhileLoading(t *testing.T) {
	m, e := newTierManager(t, 8, 8, TierConfig{})
	prompt := seqTokens(0, 13)
	_, err := e.add(1, Request{Prompt: prompt})
	require.NoError(t, err)
	e.prefill(16, 1)
	require.NoError(t, m.Release(1))
	require.Equal(t, 3, m.Evict(8))
	e.complete(nil)

	n, err := e.add(2, Request{Prompt: prompt})
	require.NoError(t, err)
	require.Equal(t, 12, n)
	e.take()
	require.NoError(t, m.Preempt(2))
	require.Equal(t, 5, m.Stats().FreePages, "onload destinations stay with their copies")
	audit(t, m)
	e.complete(nil)
	require.Equal(t, 8, m.Stats().FreePages)
	audit(t, m)

	// Resume is a new admission: served from the host tier again.
	n, err = m.Resume(2)
	require.NoError(t, err)
	require.Equal(t, 12, n)
	e.take()
	require.NoError(t, m.Release(2))
	audit(t, m)
	e.drain()
}

// With write-through every published page is copied to the host tier, so
// on-demand eviction by a step loses nothing.
func TestWriteThroughMakesEvictionLossless(t *testing.T) {
	m, e := newTierManager(t, 6, 16, TierConfig{WriteThrough: true})
	prompt := seqTokens(0, 13)
	_, err := e.add(1, Request{Prompt: prompt})
	require.NoError(t, err)
	e.prefill(16, 1)
	e.take()
	require.Len(t, e.issued, 3, "one write-through per published page")
	e.complete(nil)
	require.NoError(t, m.Release(1))

	_, err = e.add(2, Request{Prompt: seqTokens(500, 24)})
	require.NoError(t, err)
	e.prefill(24, 2) // evicts the cached pages on demand
	st := m.Stats()
	require.Zero(t, st.Tiers.DroppedPages, "backed pages are dropped without loss")
	require.NoError(t, m.Release(2))
	e.complete(nil)

	n, err := e.add(3, Request{Prompt: prompt})
	require.NoError(t, err)
	require.Equal(t, 12, n)
	e.complete(nil)
	e.check("after onload")
	e.drain()
}

// Without a host copy, on-demand eviction drops pages and counts them;
// OffloadFreePages evicts ahead through the host tier instead.
func TestEvictAheadOffloads(t *testing.T) {
	for _, ahead := range []int{0, 4} {
		m, e := newTierManager(t, 8, 16, TierConfig{OffloadFreePages: ahead})
		for i := range 4 {
			id := RequestID(i + 1)
			_, err := e.add(id, Request{Prompt: seqTokens(100*i, 9)})
			require.NoError(t, err)
			e.prefill(16, id)
			require.NoError(t, m.Release(id))
			e.complete(nil)
			audit(t, m)
		}
		st := m.Stats()
		if ahead == 0 {
			require.Positive(t, st.Tiers.DroppedPages)
			require.Zero(t, st.Tiers.OffloadedPages)
		} else {
			require.Zero(t, st.Tiers.DroppedPages)
			require.Positive(t, st.Tiers.OffloadedPages)
			require.GreaterOrEqual(t, st.FreePages, ahead)
		}
		e.drain()
	}
}

func TestTierConfigRejected(t *testing.T) {
	for name, tc := range map[string]TierConfig{
		"negative host pages":   {HostPages: -1},
		"remote without host":   {Remote: nopRemote{}},
		"ahead without host":    {OffloadFreePages: 2},
		"remote without format": {HostPages: 4, Remote: nopRemote{}},
		"bad format":            {HostPages: 4, Format: tier.PageFormat{Layers: 1}},
		"format page size":      {HostPages: 4, Format: tierFormat(8)},
		"memory size":           {HostPages: 4, Format: tierFormat(4), HostMemory: make([]byte, 3)},
		"ahead above the pool":  {HostPages: 4, OffloadFreePages: 9},
		"negative deadline":     {HostPages: 4, RemoteDeadline: -1},
		// Issue 28: the geometry's product wrapped int64 (0 bytes with 16
		// layers, -2^63 with 3) and the format was accepted.
		"format wraps to 0":    {HostPages: 4, Format: wrappingFormat(1<<30, 16)},
		"format wraps below 0": {HostPages: 4, Format: wrappingFormat(1<<29, 3)},
	} {
		_, err := New(Config{NumPages: 8, PageSize: 4, Tiers: tc})
		require.ErrorIs(t, err, ErrBadConfig, name)
		if tc.Format.HeadDim == 1<<30 {
			require.ErrorContains(t, err, fmt.Sprintf("layers %d", tc.Format.Layers), name)
		}
	}
}

// wrappingFormat is a page format of the pool's page size whose byte
// count wraps int64 when multiplied without checks (issue 28): 4 tokens x
// 2^29 heads x 2^30 dims x 2 bytes x 2 planes x 3 layers is -2^63 wrapped.
func wrappingFormat(heads, layers int) tier.PageFormat {
	return tier.PageFormat{Layout: layout.NHD, DType: layout.F16, PageSize: 4, NumKVHeads: heads, HeadDim: 1 << 30, Layers: layers}
}

type nopRemote struct{}

func (nopRemote) Fetch(context.Context, []tier.RemotePage) int { return 0 }
func (nopRemote) Store(*tier.RemotePage) bool                  { return false }
func (nopRemote) Stats() tier.RemoteStats                      { return tier.RemoteStats{} }
