package pagedkv

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/internal/vllmwire"
)

// hybridEvents is a HybridManager's KV-event Recorder (one group per layer
// group, mirroring the host tier's pages when it has some) and what a
// subscriber reconstructs from its stream, decoded by internal/vllmwire:
// one page set per group_idx and medium.
type hybridEvents struct {
	t         *testing.T
	groups    []LayerGroup
	rec       *events.Recorder
	q         *events.Queue
	enc       *events.Encoder
	sets      vllmwire.GroupMedia
	stored    []int // BlockStored GPU pages per group
	hostPages int
	hostSeen  []int // BlockStored CPU pages per group
}

func hybridRecorderConfig(groups []LayerGroup, numPages, pageSize int) events.RecorderConfig {
	cfg := events.RecorderConfig{NumPages: numPages, PageSize: pageSize}
	for _, g := range groups {
		k, w := KVEventSpec(g)
		cfg.Groups = append(cfg.Groups, events.GroupConfig{SpecKind: k, SlidingWindow: w})
	}
	return cfg
}

// newHybridRecorder is a recorder of groups' events (hostPages host pages,
// 0: none) on a 4-batch queue.
func newHybridRecorder(t *testing.T, groups []LayerGroup, numPages, pageSize, hostPages int) (*events.Recorder, *events.Queue) {
	t.Helper()
	q, err := events.NewQueue(4)
	require.NoError(t, err)
	cfg := hybridRecorderConfig(groups, numPages, pageSize)
	cfg.HostPages = hostPages
	rec, err := events.NewRecorder(cfg, q)
	require.NoError(t, err)
	return rec, q
}

// newHybridEvents returns the events of a HybridManager of groups whose
// host tier has hostPages pages (0: none).
func newHybridEvents(t *testing.T, groups []LayerGroup, numPages, pageSize, hostPages int) *hybridEvents {
	rec, q := newHybridRecorder(t, groups, numPages, pageSize, hostPages)
	return &hybridEvents{t: t, groups: groups, rec: rec, q: q, enc: events.NewEncoder(), sets: vllmwire.GroupMedia{},
		stored: make([]int, len(groups)), hostPages: hostPages, hostSeen: make([]int, len(groups))}
}

// check flushes the step's events, applies them, and compares every
// group's reconstructed set with the group's prefix cache.
func (e *hybridEvents) check(h *HybridManager, what string) {
	t := e.t
	t.Helper()
	require.True(t, e.rec.Flush(), "%s: the event queue is full", what)
	for b := e.q.TryNext(); b != nil; b = e.q.TryNext() {
		dec, err := vllmwire.Decode(e.enc.AppendBatch(nil, b, 0))
		e.q.Done(b)
		require.NoError(t, err, what)
		for _, ev := range dec.Events {
			if ev.Type != "BlockStored" {
				continue
			}
			g := int(*ev.GroupIdx)
			require.Less(t, g, len(e.groups), "%s: group_idx %d", what, g)
			wk, ww := KVEventSpec(e.groups[g])
			require.NotNil(t, ev.SpecKind, "%s: group %d stored without kv_cache_spec_kind", what, g)
			require.Equal(t, wk, *ev.SpecKind, "%s: group %d's kv_cache_spec_kind", what, g)
			if ww > 0 {
				require.NotNil(t, ev.SlidingWindow, "%s: sliding group %d without its window", what, g)
				require.Equal(t, int64(ww), *ev.SlidingWindow, what)
			} else {
				require.Nil(t, ev.SlidingWindow, "%s: group %d (%s) sent a sliding window", what, g, wk)
			}
			if ev.Medium != nil && *ev.Medium == events.MediumCPU {
				require.Positive(t, e.hostPages, "%s: a CPU page without a host tier", what)
				e.hostSeen[g] += len(ev.BlockHashes)
			} else {
				require.True(t, ev.Medium != nil && *ev.Medium == events.MediumGPU, "%s: medium %v", what, ev.Medium)
				e.stored[g] += len(ev.BlockHashes)
			}
		}
		if err := e.sets.Apply(dec); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	for g, m := range h.core.groups {
		cached := m.cache.AppendHashes(nil)
		got := e.sets[int64(g)]["GPU"]
		if len(cached) != len(got) {
			t.Fatalf("%s: group %d: events say %d pages cached, the group caches %d", what, g, len(got), len(cached))
		}
		for _, hv := range cached {
			if _, ok := got[hv]; !ok {
				t.Fatalf("%s: group %d's cached page %#x was never announced", what, g, hv)
			}
		}
	}
	e.checkHost(h, what)
}

// checkHost compares every group's reconstructed CPU set with the host
// tier's servable pages of the group: the host pool's ready pages (its own
// state, not the tier's record of what it announced), each under the chain
// hash and group the tier named it with (Audit checks those names against
// the device caches' pages of the same digest).
func (e *hybridEvents) checkHost(h *HybridManager, what string) {
	t := e.t
	t.Helper()
	want := make([]map[uint64]bool, len(h.core.groups))
	for g := range want {
		want[g] = map[uint64]bool{}
	}
	if tr := h.core.tiers; tr != nil {
		for p := range tr.host.NumPages() {
			if _, _, ready, _, ok := tr.host.Entry(HostPageID(p)); ok && ready {
				n := tr.hostName[p]
				require.False(t, want[n.group][n.hash], "%s: group %d holds host hash %#x twice", what, n.group, n.hash)
				want[n.group][n.hash] = true
			}
		}
	}
	for g := range h.core.groups {
		got := e.sets[int64(g)]["CPU"]
		if e.hostPages == 0 {
			require.Empty(t, got, "%s: group %d: CPU pages without host events", what, g)
			continue
		}
		if len(got) != len(want[g]) {
			t.Fatalf("%s: group %d: events say %d host pages, the host tier serves %d", what, g, len(got), len(want[g]))
		}
		for hv := range want[g] {
			if _, ok := got[hv]; !ok {
				t.Fatalf("%s: group %d's host page %#x was never announced", what, g, hv)
			}
		}
	}
}

func (x *hybridModelHarness) checkEvents(op int) {
	if x.ev != nil {
		x.ev.check(x.hh.h, fmt.Sprint("op ", op))
	}
}

// checkEventsSeen: every group published pages, so the per-group check
// compared non-empty streams.
func (x *hybridModelHarness) checkEventsSeen() {
	if x.ev == nil {
		return
	}
	for g, n := range x.ev.stored {
		require.Positive(x.t, n, "group %d published no page", g)
	}
}

// NewHybrid takes a CacheEvents sink only with one sink per group whose
// specs are the groups' (vLLM's kv_cache_spec_kind and sliding window), and
// names what is wrong otherwise.
func TestNewHybridEventsConfig(t *testing.T) {
	groups := []LayerGroup{{Kind: FullAttention, NumLayers: 2}, {Kind: SlidingAttention, WindowTokens: 8, NumLayers: 2}}
	q, err := events.NewQueue(1)
	require.NoError(t, err)
	mk := func(cfg events.RecorderConfig) *events.Recorder {
		r, err := events.NewRecorder(cfg, q)
		require.NoError(t, err)
		return r
	}
	good := hybridRecorderConfig(groups, 16, 4)
	swapped := hybridRecorderConfig([]LayerGroup{groups[1], groups[0]}, 16, 4)
	window := hybridRecorderConfig(groups, 16, 4)
	window.Groups[1].SlidingWindow = 9
	for name, c := range map[string]struct {
		rec  *events.Recorder
		want string
	}{
		"no groups":  {mk(events.RecorderConfig{NumPages: 16, PageSize: 4}), "*events.Recorder with 0 groups in a hybrid config of 2 groups"},
		"one group":  {mk(hybridRecorderConfig(groups[:1], 16, 4)), "with 1 groups in a hybrid config of 2 groups"},
		"swapped":    {mk(swapped), `CacheEvents group 0 has kv_cache_spec_kind "sliding_window", sliding window 8; the full group's are "full_attention", 0`},
		"bad window": {mk(window), `CacheEvents group 1 has kv_cache_spec_kind "sliding_window", sliding window 9; the sliding group's are "sliding_window", 8`},
	} {
		_, err := NewHybrid(HybridConfig{Config: Config{NumPages: 16, PageSize: 4, CacheEvents: c.rec}, Groups: groups})
		require.ErrorIs(t, err, ErrBadConfig, name)
		require.ErrorContains(t, err, c.want, name)
	}
	h, err := NewHybrid(HybridConfig{Config: Config{NumPages: 16, PageSize: 4, CacheEvents: mk(good)}, Groups: groups})
	require.NoError(t, err)
	// HashSeed 0: the groups share the seed group 0 picked.
	require.Equal(t, h.core.groups[0].cache.Seed(), h.core.groups[1].cache.Seed())
}
