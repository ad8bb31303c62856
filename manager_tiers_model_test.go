package pagedkv

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/internal/vllmwire"
	"github.com/pagedkv/pagedkv/tier"
)

// tierModelConfig is one randomized run with tiers.
type tierModelConfig struct {
	seed         uint64
	ops          int
	numPages     int
	hostPages    int
	ahead        int
	writeThrough bool
	remote       tier.RemoteStore
	spaces       []Namespace
	deadline     time.Duration
	src          rand.Source // the operations' randomness; nil: PCG(seed)
	// hook, if set, runs before each operation (to kill a server, say).
	hook func(op int)
	// usage, if set, returns hooks that check cache accounting around
	// admissions and releases (usage_tiers_test.go); the workload then
	// releases every request at the end.
	usage func(m *Manager) usageHooks
	// events attaches a KV-event Recorder: after every operation its batch
	// is encoded in vLLM's format, decoded with internal/vllmwire and
	// applied to a set that must equal the Manager's cached hashes (offloads,
	// onloads and evictions through the tiers included).
	events bool
	// retention gives requests random retention ranges (3 levels, lapses,
	// sessions, ephemeral tokens) on a clock that moves each operation,
	// drawn from their own source so the operations are the seed's.
	retention bool
}

// runTierModel drives a random workload through a Manager with tiers and,
// after every operation, runs Audit and checks the fake K/V of every page
// any request may attend (so every page served from the host tier or the
// remote store is checked against the values computed for its tokens);
// copies complete in random order at random times, as late as possible.
// It ends by draining: no page, host page or copy may be left behind.
func runTierModel(t *testing.T, c tierModelConfig) *Manager {
	src := c.src
	if src == nil {
		src = rand.NewPCG(c.seed, 77)
	}
	rng := rand.New(src)
	tc := TierConfig{HostPages: c.hostPages, Format: tierFormat(4), OffloadFreePages: c.ahead,
		WriteThrough: c.writeThrough, Remote: c.remote, RemoteDeadline: c.deadline}
	cfg := Config{NumPages: c.numPages, PageSize: 4, HashSeed: c.seed | 1, Tiers: tc}
	var (
		now  time.Duration
		rret *rand.Rand
	)
	if c.retention {
		rret = rand.New(rand.NewPCG(c.seed, 91))
		cfg.Priorities, cfg.Clock = 3, func() time.Duration { return now }
	}
	var (
		rec    *events.Recorder
		queue  *events.Queue
		enc    *events.Encoder
		evSet  vllmwire.Media
		nStore = map[string]int{}
	)
	if c.events {
		var err error
		queue, err = events.NewQueue(4)
		require.NoError(t, err)
		rec, err = events.NewRecorder(events.RecorderConfig{NumPages: c.numPages, HostPages: c.hostPages, PageSize: 4}, queue)
		require.NoError(t, err)
		cfg.CacheEvents, enc, evSet = rec, events.NewEncoder(), vllmwire.Media{}
	}
	m, err := New(cfg)
	require.NoError(t, err)
	e := newTierEngine(t, m)
	var hooks usageHooks
	if c.usage != nil {
		hooks = c.usage(m)
	}
	checkEvents := func(op int, what string) {
		if rec == nil {
			return
		}
		require.True(t, rec.Flush(), "op %d (%s): the event queue is full", op, what)
		for b := queue.TryNext(); b != nil; b = queue.TryNext() {
			dec, err := vllmwire.Decode(enc.AppendBatch(nil, b, 0))
			queue.Done(b)
			require.NoError(t, err, "op %d (%s)", op, what)
			for _, ev := range dec.Events {
				if ev.Type == "BlockStored" {
					nStore[*ev.Medium] += len(ev.BlockHashes)
				}
			}
			if err := evSet.Apply(dec); err != nil {
				t.Fatalf("op %d (%s): %v", op, what, err)
			}
		}
		// The set per medium equals the Manager's per tier: the device
		// cache (GPU) and the servable host pages (CPU).
		for _, tc := range []struct {
			medium string
			cached []uint64
		}{{"GPU", m.CachedHashes(nil)}, {"CPU", m.HostCachedHashes(nil)}} {
			got := evSet[tc.medium]
			if len(tc.cached) != len(got) {
				t.Fatalf("op %d (%s): %s events say %d pages cached, the Manager holds %d", op, what, tc.medium, len(got), len(tc.cached))
			}
			for _, h := range tc.cached {
				if _, ok := got[h]; !ok {
					t.Fatalf("op %d (%s): %s page %#x was never announced", op, what, tc.medium, h)
				}
			}
		}
		if len(evSet) > 2 {
			t.Fatalf("op %d (%s): events of media %v", op, what, slices.Collect(maps.Keys(evSet)))
		}
	}
	spaces := c.spaces
	if spaces == nil {
		spaces = []Namespace{{}, {Tenant: "b"}}
	}
	var next RequestID = 1
	pick := func(want func(RequestID) bool) (RequestID, bool) {
		var ids []RequestID
		for id := range e.ns {
			if m.Has(id) && want(id) {
				ids = append(ids, id)
			}
		}
		if len(ids) == 0 {
			return 0, false
		}
		slices.Sort(ids)
		return ids[rng.IntN(len(ids))], true
	}
	runnable := func(id RequestID) bool { return m.Running(id) && !m.Loading(id) }
	for op := range c.ops {
		if c.hook != nil {
			c.hook(op)
		}
		if rret != nil {
			now += time.Duration(rret.IntN(3)) * time.Second
		}
		var what string
		switch k := rng.IntN(20); {
		case k < 3:
			what = "add"
			ns := spaces[rng.IntN(len(spaces))]
			req := Request{Namespace: ns, Prompt: promptOf(rng.IntN(8), 1+rng.IntN(24))}
			if rret != nil {
				req.Retention = randomRetention(rret)
			}
			if hooks.admit != nil {
				hooks.admit(next, ns, req.Prompt, false, func() (int, error) { return e.add(next, req) })
			} else {
				_, err := e.add(next, req)
				require.NoError(t, err)
			}
			next++
		case k < 10:
			what = "step"
			var ids []RequestID
			var nt []int32
			for id := range e.ns {
				if runnable(id) && rng.IntN(3) > 0 {
					left := len(m.Tokens(id)) - m.Computed(id)
					ids = append(ids, id)
					nt = append(nt, int32(rng.IntN(min(left, 8)+1)))
				}
			}
			err := e.step(ids, nt, func(id RequestID) int32 { return int32(rng.IntN(50)) })
			if errors.Is(err, ErrOutOfPages) {
				if id, ok := pick(m.Running); ok {
					require.NoError(t, m.Preempt(id))
				}
			} else {
				require.NoError(t, err)
			}
		case k < 12:
			what = "release"
			if id, ok := pick(func(RequestID) bool { return true }); ok {
				require.NoError(t, m.Release(id))
				delete(e.ns, id)
				if hooks.released != nil {
					hooks.released(id)
				}
			}
		case k < 13:
			what = "preempt"
			if id, ok := pick(m.Running); ok {
				require.NoError(t, m.Preempt(id))
			}
		case k < 14:
			what = "resume"
			if id, ok := pick(func(id RequestID) bool { return !m.Running(id) }); ok {
				if hooks.admit != nil {
					hooks.admit(id, e.ns[id], m.Tokens(id), false, func() (int, error) { return m.Resume(id) })
				} else {
					_, err := m.Resume(id)
					require.NoError(t, err)
				}
			}
		case k < 15:
			what = "evict"
			m.Evict(1 + rng.IntN(4))
		case k < 16:
			what = "extend"
			if id, ok := pick(func(RequestID) bool { return true }); ok {
				require.NoError(t, m.Extend(id, promptOf(rng.IntN(8), 1+rng.IntN(5))...))
			}
		case k == 17 && rng.IntN(2) == 0:
			what = "truncate"
			if id, ok := pick(func(id RequestID) bool { return !m.Loading(id) }); ok {
				toks := m.Tokens(id)
				require.NoError(t, m.Truncate(id, rng.IntN(len(toks)+1)))
			}
		case k < 17:
			what = "fork"
			if id, ok := pick(runnable); ok {
				require.NoError(t, m.Fork(id, next))
				e.ns[next] = e.ns[id]
				next++
			}
		case k == 18 && rng.IntN(2) == 0:
			// The engine's IDs are an input: arbitrary ones must be
			// refused without a change.
			what = "complete bad ids"
			ids := []uint64{rng.Uint64(), rng.Uint64() & 0xffff_ffff}
			before := managerOwnStats(m)
			if err := m.CompleteTierCopies(ids...); err == nil {
				t.Fatalf("completing copies %v that were never issued succeeded", ids)
			}
			require.Equal(t, before, managerOwnStats(m))
		default:
			what = "complete"
			e.complete(func(int) bool { return rng.IntN(2) == 0 })
		}
		if err := m.Audit(); err != nil {
			t.Fatalf("op %d (%s): %v\n%s", op, what, err, describeTiers(m))
		}
		e.check(what)
		checkEvents(op, what)
	}
	if hooks.released != nil {
		for id := range e.ns {
			if m.Has(id) {
				require.NoError(t, m.Release(id))
				hooks.released(id)
			}
		}
	}
	e.drain()
	checkEvents(c.ops, "drain")
	if rec != nil {
		require.Positive(t, nStore["GPU"], "no BlockStored event on the GPU")
		require.Positive(t, nStore["CPU"], "no BlockStored event on the CPU")
	}
	return m
}

func TestTiersMatchModel(t *testing.T) {
	t.Parallel()
	var hostHits int64
	for seed := range uint64(12) {
		m := runTierModel(t, tierModelConfig{seed: seed, ops: 1500, numPages: 12 + int(seed%3)*4, hostPages: 6 + int(seed%4)*4,
			ahead: int(seed % 3), writeThrough: seed%2 == 1, events: seed%3 == 0})
		st := m.Stats()
		hostHits += st.Tiers.HostHitTokens
	}
	require.Positive(t, hostHits, "the workload never hit the host tier")
}

// randomRetention draws 0 to 3 retention ranges over a prompt of up to 24
// tokens.
func randomRetention(rng *rand.Rand) []RetentionRange {
	out := make([]RetentionRange, rng.IntN(4))
	for i := range out {
		start := rng.IntN(24)
		out[i] = RetentionRange{Start: start, Retention: Retention{Priority: Priority(rng.IntN(3)), Session: Session(rng.IntN(3)),
			Ephemeral: rng.IntN(8) == 0}}
		if rng.IntN(2) == 0 {
			out[i].End = start + 1 + rng.IntN(12)
		}
		if rng.IntN(2) == 0 {
			out[i].Duration = time.Duration(1+rng.IntN(10)) * time.Second
		}
	}
	return out
}

// The randomized tier workload with retention hints: levels, lapses and
// hints ride through offloads, write-through, reclaims and onloads while
// Audit (the host pool's retention invariants included), the fake K/V
// and the KV events check every operation.
func TestTiersMatchModelWithRetention(t *testing.T) {
	t.Parallel()
	var hostHits, lapsed int64
	for seed := range uint64(6) {
		m := runTierModel(t, tierModelConfig{seed: seed, ops: 1000, numPages: 12 + int(seed%3)*4, hostPages: 4 + int(seed%3)*2,
			ahead: int(seed % 3), writeThrough: seed%2 == 1, events: seed%3 == 0, retention: true})
		hostHits += m.Stats().Tiers.HostHitTokens
		require.Positive(t, m.core.tiers.host.Counters().Reclaimed, "seed %d: the host tier never reclaimed", seed)
		lapsed += m.core.tiers.host.Counters().Lapsed
	}
	require.Positive(t, hostHits, "the workload never hit the host tier")
	require.Positive(t, lapsed, "no level lapsed in the host tier")
}

// FuzzTiers drives the randomized tier workload from raw bytes: the first
// byte picks the pool sizes, evict-ahead and write-through, the rest are
// the operations' random draws (which ops, which requests, which copies
// complete, arbitrary copy IDs), read by hybrid_test.go's byteSource. Audit and the fake-K/V check run after
// every operation, and every admission's cache reads are checked against
// what the tiers held before it (usage_tiers_test.go); the run must drain
// without a leak in any tier.
func FuzzTiers(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	f.Add(make([]byte, 64))
	f.Add([]byte("\x07 tiers: add, step, evict, complete, onload, release"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 || len(data) > 4096 {
			return
		}
		h := data[0]
		runTierModel(t, tierModelConfig{ops: len(data) / 4, numPages: 8 + int(h%4)*4, hostPages: 4 + int(h>>2%4)*4,
			ahead: int(h >> 4 % 3), writeThrough: h&0x80 != 0, src: &byteSource{data: data[1:]}, usage: checkUsage(t, nil)})
	})
}

// A CacheEvents Recorder must mirror the host tier it is told about: one
// sized for another number of host pages is refused, naming both.
func TestTierEventsHostPagesMismatch(t *testing.T) {
	q, err := events.NewQueue(1)
	require.NoError(t, err)
	for _, c := range []struct{ rec, host int }{{0, 8}, {4, 8}, {8, 0}} {
		rec, err := events.NewRecorder(events.RecorderConfig{NumPages: 16, HostPages: c.rec, PageSize: 4}, q)
		require.NoError(t, err)
		tc := TierConfig{HostPages: c.host}
		_, err = New(Config{NumPages: 16, PageSize: 4, Tiers: tc, CacheEvents: rec})
		require.ErrorIs(t, err, ErrBadConfig)
		require.ErrorContains(t, err, fmt.Sprintf("CacheEvents announces %d host pages, Tiers.HostPages = %d", c.rec, c.host))
	}
}

// managerOwnStats is m's counters less the remote store's: a Redis store
// writes in the background, so its Stored and BytesOut move between two
// reads while the Manager itself stands still.
func managerOwnStats(m *Manager) Stats {
	s := m.Stats()
	s.Tiers.Remote = tier.RemoteStats{}
	return s
}
