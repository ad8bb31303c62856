package pagedkv

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/evict"
	"github.com/pagedkv/pagedkv/handoff"
	"github.com/pagedkv/pagedkv/internal/redistest"
	"github.com/pagedkv/pagedkv/prefixcache"
	"github.com/pagedkv/pagedkv/tier"
)

// retainedTierManager is a Manager of 8 pages of 4 tokens, 3 levels, on
// the clock now, with an 8-page host tier above remote (nil: none).
func retainedTierManager(t *testing.T, now *time.Duration, hostPages int, remote tier.RemoteStore) (*Manager, *tierEngine) {
	t.Helper()
	m, err := New(Config{NumPages: 8, PageSize: 4, HashSeed: 3, Priorities: 3, Clock: func() time.Duration { return *now },
		Tiers: TierConfig{HostPages: hostPages, Format: tierFormat(4), Remote: remote, RemoteDeadline: 5 * time.Second}})
	require.NoError(t, err)
	return m, newTierEngine(t, m)
}

// cachedRetention returns the retention of every cached device page of
// m's group 0 with a level above 0.
func cachedRetention(m *Manager) []prefixcache.PageRetention {
	var out []prefixcache.PageRetention
	c := m.core.groups[0].cache
	for p := range PageID(8) {
		if r := c.RetentionOf(p); r.Priority > 0 {
			out = append(out, r)
		}
	}
	return out
}

// hostRetention returns the retention of every host page with a level.
func hostRetention(m *Manager) []tier.Retention {
	var out []tier.Retention
	h := m.core.tiers.host
	for p := range HostPageID(h.NumPages()) {
		if r := h.Retention(p); r.Priority > 0 {
			out = append(out, r)
		}
	}
	return out
}

var keep = []RetentionRange{{Retention: Retention{Priority: 2, Duration: 10 * time.Second, Session: SessionContinues}}}

// device → host → device: an evicted page's retention (level, what is
// left of its lapse, hint) rides to its host page, the host tier reclaims
// lower levels first, and an onload gives the page its retention back.
func TestRetentionTravelsThroughTheHostTier(t *testing.T) {
	now := new(time.Duration)
	m, e := retainedTierManager(t, now, 4, nil)
	kept, other := seqTokens(0, 9), seqTokens(100, 9)
	_, err := e.add(1, Request{Prompt: kept, Retention: keep})
	require.NoError(t, err)
	e.prefill(16, 1)
	require.NoError(t, m.Release(1)) // idle from 0 s: lapses at 10 s
	*now = 3 * time.Second
	require.Equal(t, 2, m.Evict(8))
	e.complete(nil)
	want := tier.Retention{Priority: 2, Hint: uint8(evict.HintReuse), Duration: 10 * time.Second, Left: 7 * time.Second}
	require.Equal(t, []tier.Retention{want, want}, hostRetention(m))
	audit(t, m)

	// Two unhinted pages fill the host tier; two more push out the
	// unhinted ones, not the older hinted ones.
	_, err = e.add(2, Request{Prompt: other})
	require.NoError(t, err)
	e.prefill(16, 2)
	require.NoError(t, m.Release(2))
	require.Equal(t, 2, m.Evict(8))
	e.complete(nil)
	_, err = e.add(3, Request{Prompt: seqTokens(200, 9)})
	require.NoError(t, err)
	e.prefill(16, 3)
	require.NoError(t, m.Release(3))
	require.Equal(t, 2, m.Evict(8))
	e.complete(nil)
	require.Len(t, hostRetention(m), 2, "the hinted pages stay")
	n, err := e.add(4, Request{Prompt: other})
	require.NoError(t, err)
	require.Zero(t, n, "the unhinted pages were reclaimed")
	require.NoError(t, m.Release(4))

	// Onload at 5 s: the device pages get level 2, the whole lapse (a use
	// restarts it) and the hint back.
	*now = 5 * time.Second
	n, err = e.add(5, Request{Prompt: kept})
	require.NoError(t, err)
	require.Equal(t, 8, n)
	e.complete(nil)
	back := prefixcache.PageRetention{Priority: 2, Hint: evict.HintReuse, Lapse: 10 * time.Second, Left: 10 * time.Second}
	require.Equal(t, []prefixcache.PageRetention{back, back}, cachedRetention(m))
	e.check("after the onload")
	require.NoError(t, m.Release(5))
	audit(t, m)

	// In the host tier the level lapses at its deadline (5 s + 10 s: the
	// onload was a use).
	*now = 15 * time.Second
	_, err = e.add(6, Request{Prompt: seqTokens(300, 9)}) // a lookup below the device: the host tier's time moves
	require.NoError(t, err)
	require.NoError(t, m.Release(6))
	require.Zero(t, len(hostRetention(m)), "lapsed in the host tier: %v", hostRetention(m))
	audit(t, m)
	e.drain()
}

// device → host → Redis → (another Manager) host → device: the retention
// rides in the Redis value and comes back on the other replica's device.
func TestRetentionTravelsThroughRedis(t *testing.T) {
	srv := redistest.Start(t)
	now := new(time.Duration)
	sa, sb := newRedisStore(t, srv), newRedisStore(t, srv)
	a, ea := retainedTierManager(t, now, 8, sa)
	prompt := seqTokens(0, 9)
	long := []RetentionRange{{Retention: Retention{Priority: 2, Duration: time.Hour, Session: SessionEnded}}}
	_, err := ea.add(1, Request{Prompt: prompt, Retention: long})
	require.NoError(t, err)
	ea.prefill(16, 1)
	ea.complete(nil) // write-through: to host, then Redis
	flushStore(t, sa)
	require.NoError(t, a.Release(1))

	b, eb := retainedTierManager(t, now, 8, sb)
	n, err := eb.add(1, Request{Prompt: prompt})
	require.NoError(t, err)
	require.Equal(t, 8, n, "served from Redis")
	got := hostRetention(b)
	require.Len(t, got, 2)
	for _, r := range got {
		require.Equal(t, uint8(2), r.Priority)
		require.Equal(t, uint8(evict.HintNoReuse), r.Hint)
		require.Equal(t, time.Hour, r.Duration)
		require.Greater(t, r.Left, 59*time.Minute, "the onload restarted it")
	}
	eb.complete(nil)
	back := prefixcache.PageRetention{Priority: 2, Hint: evict.HintNoReuse, Lapse: time.Hour, Left: time.Hour}
	require.Equal(t, []prefixcache.PageRetention{back, back}, cachedRetention(b))
	eb.check("after the onload from Redis")
	audit(t, b)

	// b gave no Duration of its own: the one from Redis started its clock,
	// so the pages, idle from their release, lapse an hour later.
	*now += 5 * time.Minute
	require.NoError(t, b.Release(1))
	*now += 59 * time.Minute
	_, err = eb.add(2, Request{Prompt: seqTokens(100, 3)}) // any operation reads the clock
	require.NoError(t, err)
	require.Len(t, cachedRetention(b), 2, "not yet lapsed")
	*now += 2 * time.Minute
	_, err = eb.add(3, Request{Prompt: seqTokens(200, 3)})
	require.NoError(t, err)
	require.Empty(t, cachedRetention(b), "lapsed to level 0 an hour after their release")
	audit(t, b)
	eb.drain()
	ea.drain()
}

// device → host → disk → (a restarted process) host → device: the
// retention rides in the slot header and survives the restart.
func TestRetentionTravelsThroughDisk(t *testing.T) {
	dir := t.TempDir()
	now := new(time.Duration)
	sa := openDiskStore(t, dir, 16)
	a, ea := retainedTierManager(t, now, 8, sa)
	prompt := seqTokens(0, 9)
	long := []RetentionRange{{Retention: Retention{Priority: 1, Duration: time.Hour, Session: SessionContinues}}}
	_, err := ea.add(1, Request{Prompt: prompt, Retention: long})
	require.NoError(t, err)
	ea.prefill(16, 1)
	ea.complete(nil) // write-through: to host, then disk
	ea.drain()
	require.NoError(t, a.Audit())
	closeDiskStore(t, sa)

	sb := openDiskStore(t, dir, 16)
	b, eb := retainedTierManager(t, now, 8, sb)
	n, err := eb.add(1, Request{Prompt: prompt})
	require.NoError(t, err)
	require.Equal(t, 8, n, "served from disk")
	eb.complete(nil)
	back := prefixcache.PageRetention{Priority: 1, Hint: evict.HintReuse, Lapse: time.Hour, Left: time.Hour}
	require.Equal(t, []prefixcache.PageRetention{back, back}, cachedRetention(b))
	eb.check("after the onload from disk")
	audit(t, b)
	eb.drain()
}

// prefill → decode: the request's retention ranges travel with its pages;
// the decode Manager's cache gives the onloaded pages their retention
// back (from the store, per page) and takes the ranges for Add.
func TestRetentionTravelsThroughTheHandoff(t *testing.T) {
	key := handoff.NewNonce()
	hcfg := handoff.Config{Namespace: "test-model", Format: tierFormat(4), Key: key[:]}
	st, err := handoff.NewStore(hcfg, 8)
	require.NoError(t, err)
	now := new(time.Duration)
	p, ep := retainedTierManager(t, now, 8, nil)
	ranges := []RetentionRange{{Start: 0, End: 4, Retention: Retention{Priority: 2, Duration: time.Minute, Session: SessionContinues}},
		{Start: 4, Retention: Retention{Priority: 1}}}
	prompt := seqTokens(300, 13) // 3 full pages
	_, err = ep.add(1, Request{Prompt: prompt, Retention: ranges})
	require.NoError(t, err)
	ep.prefill(16, 1)
	req := exportRequest(t, p, ep, 1, Namespace{})
	for _, r := range ranges {
		req.Retention = append(req.Retention, handoff.RetentionRange{Start: r.Start, End: r.End, Priority: uint8(r.Priority),
			Duration: r.Duration, Ephemeral: r.Ephemeral, Session: uint8(r.Session)})
	}
	var b bytes.Buffer
	require.NoError(t, handoff.WriteRequest(&b, hcfg, handoff.Nonce{}, req))
	got, err := handoff.ReadRequest(&b, hcfg, handoff.Nonce{})
	require.NoError(t, err)
	_, err = st.Admit(got)
	require.NoError(t, err)

	d, ed := retainedTierManager(t, now, 8, st)
	var back []RetentionRange
	for _, r := range got.Retention {
		back = append(back, RetentionRange{Start: r.Start, End: r.End, Retention: Retention{Priority: Priority(r.Priority),
			Duration: r.Duration, Ephemeral: r.Ephemeral, Session: Session(r.Session)}})
	}
	require.Equal(t, ranges, back, "the ranges arrive as sent")
	n, err := ed.add(1, Request{Prompt: prompt})
	require.NoError(t, err)
	require.Equal(t, 12, n)
	ed.complete(nil)
	ed.check("after the onload from the handoff")
	require.Equal(t, []prefixcache.PageRetention{
		{Priority: 2, Hint: evict.HintReuse, Lapse: time.Minute, Left: time.Minute},
		{Priority: 1}, {Priority: 1},
	}, cachedRetention(d), "the decode side's cache honours the ranges")
	audit(t, d)
	ed.drain()
	ep.drain()
}

// KV events carry no retention: a Manager whose requests have retention
// hints (not ephemeral, and all at one level, so the victims are the
// same) publishes byte for byte the events of one whose requests have
// none, through offloads, reclaims and onloads.
func TestRetentionLeavesEventsUnchanged(t *testing.T) {
	run := func(ranges []RetentionRange) [][]byte {
		q, err := events.NewQueue(64)
		require.NoError(t, err)
		rec, err := events.NewRecorder(events.RecorderConfig{NumPages: 8, PageSize: 4, HostPages: 4}, q)
		require.NoError(t, err)
		now := new(time.Duration)
		m, err := New(Config{NumPages: 8, PageSize: 4, HashSeed: 3, Priorities: 3, Clock: func() time.Duration { return *now },
			CacheEvents: rec, Tiers: TierConfig{HostPages: 4, Format: tierFormat(4)}})
		require.NoError(t, err)
		e := newTierEngine(t, m)
		var out [][]byte
		flush := func() {
			require.True(t, rec.Flush())
			enc := events.NewEncoder()
			for b := q.TryNext(); b != nil; b = q.TryNext() {
				w := enc.AppendBatch(nil, b, 0)
				clear(w[2:10]) // the batch's ts (float64 after 0x93 0xcb): the flush's wall clock
				out = append(out, w)
				q.Done(b)
			}
		}
		for i, prompt := range [][]int32{seqTokens(0, 9), seqTokens(100, 9), seqTokens(200, 9), seqTokens(0, 13)} {
			*now += time.Second
			id := RequestID(i + 1)
			_, err := e.add(id, Request{Prompt: prompt, Retention: ranges})
			require.NoError(t, err)
			e.complete(nil)
			e.prefill(16, id)
			require.NoError(t, m.Release(id))
			m.Evict(8)
			e.complete(nil)
			flush()
		}
		e.drain()
		flush()
		return out
	}
	plain := run(nil)
	// Every page at one level, without a lapse: the same victims, so any
	// difference would be the retention itself.
	hinted := run([]RetentionRange{{Retention: Retention{Priority: 2, Session: SessionContinues}}})
	require.NotEmpty(t, plain)
	require.Equal(t, plain, hinted)
}
