package pagedkv

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/tier"
)

// tierEngine is a fake engine for tier tests: device pages are bytes in the
// tier byte format (one layer, one K/V head, head dim 2, f32: a token's K is
// 8 bytes, its V another 8), and each token's K is the context hash of its
// namespace and every token up to it (V is its complement). Steps write
// those values; tier copies move bytes between device pages and the
// Manager's host pages, executed only when the test completes them, so a
// source reused or a destination read before completion shows up as a
// wrong value in check.
type tierEngine struct {
	t      testing.TB
	m      *Manager
	ps     int
	fmt    tier.PageFormat
	dev    []byte // [page][PageBytes]
	issued []TierCopy
	buf    []TierCopy
	ns     map[RequestID]Namespace

	copiedToHost, copiedToDevice int
}

func tierFormat(ps int) tier.PageFormat {
	return tier.PageFormat{Layout: layout.NHD, DType: layout.F32, PageSize: ps, NumKVHeads: 1, HeadDim: 2, Layers: 1}
}

func newTierEngine(t testing.TB, m *Manager) *tierEngine {
	f := tierFormat(m.PageSize())
	return &tierEngine{t: t, m: m, ps: m.PageSize(), fmt: f, dev: make([]byte, m.NumPages()*f.PageBytes()),
		ns: map[RequestID]Namespace{}}
}

// ctxHash is the fake K of tokens[pos] in ns.
func ctxHash(ns Namespace, tokens []int32, pos int) uint64 {
	h := uint64(0x9e3779b97f4a7c15)
	for _, s := range []string{ns.Tenant, ns.LoRA, ns.Salt} {
		for _, c := range []byte(s) {
			h = (h ^ uint64(c)) * 0x100000001b3
		}
		h = (h ^ 0xff) * 0x100000001b3
	}
	for _, t := range tokens[:pos+1] {
		h = (h ^ uint64(uint32(t))) * 0x100000001b3
		h ^= h >> 29
	}
	return h | 1 // never 0: 0 is "never written"
}

func (e *tierEngine) page(p PageID) []byte {
	n := e.fmt.PageBytes()
	return e.dev[int(p)*n : (int(p)+1)*n]
}

func (e *tierEngine) write(p PageID, entry int, k uint64) {
	pg := e.page(p)
	plane := e.fmt.PlaneBytes()
	binary.LittleEndian.PutUint64(pg[entry*8:], k)
	binary.LittleEndian.PutUint64(pg[plane+entry*8:], ^k)
}

func (e *tierEngine) read(p PageID, entry int) (k, v uint64) {
	pg := e.page(p)
	plane := e.fmt.PlaneBytes()
	return binary.LittleEndian.Uint64(pg[entry*8:]), binary.LittleEndian.Uint64(pg[plane+entry*8:])
}

// add admits a request and records its namespace.
func (e *tierEngine) add(id RequestID, req Request) (int, error) {
	n, err := e.m.Add(id, req)
	if err == nil {
		e.ns[id] = req.Namespace
	}
	return n, err
}

// take moves the Manager's newly planned copies to the issued list.
func (e *tierEngine) take() {
	e.buf = e.m.TierCopies(e.buf[:0])
	e.issued = append(e.issued, e.buf...)
}

// run performs copy c (at completion time: as late as an engine may).
func (e *tierEngine) run(c TierCopy) {
	hp := e.m.HostPage(c.Host)
	require.Len(e.t, hp, e.fmt.PageBytes(), "host page %d", c.Host)
	if c.Dir == tier.ToHost {
		copy(hp, e.page(c.Device))
		e.copiedToHost++
	} else {
		copy(e.page(c.Device), hp)
		e.copiedToDevice++
	}
}

// complete runs and completes the issued copies chosen by pick (all when
// pick is nil).
func (e *tierEngine) complete(pick func(i int) bool) {
	e.take()
	var ids []uint64
	kept := e.issued[:0]
	for i, c := range e.issued {
		if pick == nil || pick(i) {
			e.run(c)
			ids = append(ids, c.ID)
		} else {
			kept = append(kept, c)
		}
	}
	e.issued = kept
	// With no spare capacity, a copy planned while completing (a
	// write-through of a page an onload let its request publish) moves the
	// copies array: completeCopy once kept a pointer into the old one, and
	// the completed copy stayed live (Audit: "8 tier copies live, the
	// counter says 7"). Without the clip that took ~100 runs to show.
	if t := e.m.core.tiers; t != nil {
		t.copies = slices.Clip(t.copies)
	}
	require.NoError(e.t, e.m.CompleteTierCopies(ids...))
}

// step reserves, writes every appended row, and commits with sampled
// tokens from next (NoToken where the request has known tokens left).
func (e *tierEngine) step(ids []RequestID, nt []int32, next func(RequestID) int32) error {
	p, err := e.m.Reserve(ids, nt)
	if err != nil {
		return err
	}
	e.take()
	for _, c := range p.Copies {
		pg := e.page(c.Src)
		plane := e.fmt.PlaneBytes()
		d := e.page(c.Dst)
		copy(d[:int(c.Entries)*8], pg[:int(c.Entries)*8])
		copy(d[plane:plane+int(c.Entries)*8], pg[plane:plane+int(c.Entries)*8])
	}
	for i := range p.TokenIDs {
		b := p.BatchIndices[i]
		id := p.Requests[b]
		pos := int(p.Positions[i])
		page := PageID(p.KVPageIndices[int(p.KVIndptr[b])+pos/e.ps])
		e.write(page, pos%e.ps, ctxHash(e.ns[id], e.m.Tokens(id), int(p.TokenPositions[i])))
	}
	sampled := make([]int32, len(ids))
	for b, id := range ids {
		sampled[b] = NoToken
		if e.m.Computed(id)+int(nt[b]) == len(e.m.Tokens(id)) && next != nil {
			sampled[b] = next(id)
		}
	}
	return e.m.Commit(sampled)
}

// check verifies the K/V of every computed token of every running request
// that is not loading (what attention may read), wherever its page came
// from: the device cache, the host tier or the remote store.
func (e *tierEngine) check(what string) {
	e.t.Helper()
	for id, ns := range e.ns {
		if !e.m.Running(id) || e.m.Loading(id) {
			continue
		}
		pages, start := e.m.Pages(id)
		toks := e.m.Tokens(id)
		for pos := start; pos < e.m.Computed(id); pos++ {
			p := pages[(pos-start)/e.ps]
			k, v := e.read(p, (pos-start)%e.ps)
			want := ctxHash(ns, toks, pos)
			if k != want || v != ^want {
				e.t.Fatalf("%s: request %d token %d on page %d holds K %#x V %#x, want %#x/%#x", what, id, pos, p, k, v, want, ^want)
			}
		}
	}
}

// drain completes every copy, releases every request and evicts the whole
// cache: every device page must then be free and no copy in flight (no
// leak in any tier).
func (e *tierEngine) drain() {
	e.complete(nil)
	for id := range e.ns {
		if e.m.Has(id) {
			require.NoError(e.t, e.m.Release(id))
		}
	}
	e.ns = map[RequestID]Namespace{}
	e.complete(nil)
	for e.m.Evict(e.m.NumPages()) > 0 {
		e.complete(nil)
	}
	e.complete(nil)
	require.NoError(e.t, e.m.Audit())
	st := e.m.Stats()
	require.Equal(e.t, st.TotalPages, st.FreePages, "device pages leaked: %+v", st)
	require.Zero(e.t, st.Tiers.InFlight, "tier copies left in flight")
	require.Zero(e.t, e.m.TierCopiesInFlight())
	free, writing, ready, reclaimable := e.m.core.tiers.host.Usage()
	require.Zero(e.t, writing, "host pages left writing")
	require.Equal(e.t, ready, reclaimable, "host pages left with readers")
	require.Equal(e.t, e.m.core.tiers.host.NumPages(), free+ready, "host pages leaked")
}

// prefill computes every known token of ids (chunks of up to chunk).
func (e *tierEngine) prefill(chunk int, ids ...RequestID) {
	for {
		var run []RequestID
		var nt []int32
		for _, id := range ids {
			if left := len(e.m.Tokens(id)) - e.m.Computed(id); left > 0 {
				run = append(run, id)
				nt = append(nt, int32(min(left, chunk)))
			}
		}
		if len(run) == 0 {
			return
		}
		require.NoError(e.t, e.step(run, nt, nil))
	}
}

func randTokens(rng *rand.Rand, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(rng.IntN(50))
	}
	return out
}

func describeTiers(m *Manager) string {
	st := m.Stats()
	return fmt.Sprintf("free %d used %d evictable %d cached %d | host %d/%d in flight %d", st.FreePages, st.UsedPages,
		st.EvictablePages, st.CachedPages, st.Tiers.HostUsedPages, st.Tiers.HostPages, st.Tiers.InFlight)
}

var _ = slices.Equal[[]int32]
