package pagedkv

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/prefixcache"
)

type nopSink struct{}

func (nopSink) PageStored(prefixcache.PageID, uint64, prefixcache.PageID, uint64, prefixcache.Key, []int32) {
}
func (nopSink) PageRemoved(prefixcache.PageID, uint64) {}

// A HybridManager publishes KV events only through a GroupEventSink
// (hybrid_events_test.go), whose host pages, as for a Manager, must be the
// host tier's (its GroupSink(g) announces group g's host pages): a config
// giving a plain sink, or a sink mirroring another number of host pages,
// is refused, naming the field, instead of building groups whose events
// share one sink with nothing to tell the groups apart; tier settings
// without host pages are refused as for a Manager. Host pages alone, and
// host pages with a sink of as many, are accepted (hybrid_tiers_test.go,
// TestHybridTiersMatchModel).
func TestNewHybridRefusesTiersAndEvents(t *testing.T) {
	groups := []LayerGroup{{Kind: FullAttention, NumLayers: 2}, {Kind: SlidingAttention, WindowTokens: 8, NumLayers: 2}}
	for name, c := range map[string]struct {
		cfg  Config
		want string
	}{
		"host events, fewer host pages": {Config{Tiers: TierConfig{HostPages: 4}, CacheEvents: hostEventsRecorder(t, groups, 8)},
			"CacheEvents announces 8 host pages, Tiers.HostPages = 4"},
		"host events, no host tier": {Config{CacheEvents: hostEventsRecorder(t, groups, 8)},
			"CacheEvents announces 8 host pages, Tiers.HostPages = 0"},
		"no host events": {Config{Tiers: TierConfig{HostPages: 8}, CacheEvents: hostEventsRecorder(t, groups, 0)},
			"CacheEvents announces 0 host pages, Tiers.HostPages = 8"},
		"write-through": {Config{Tiers: TierConfig{WriteThrough: true}}, "Tiers.HostPages = 0"},
		"events":        {Config{CacheEvents: nopSink{}}, "CacheEvents = pagedkv.nopSink"},
	} {
		c.cfg.NumPages, c.cfg.PageSize = 16, 4
		_, err := NewHybrid(HybridConfig{Config: c.cfg, Groups: groups})
		require.ErrorIs(t, err, ErrBadConfig, name)
		require.True(t, strings.Contains(err.Error(), c.want), "%s: %v", name, err)
	}
	_, err := NewHybrid(HybridConfig{Config: Config{NumPages: 16, PageSize: 4}, Groups: groups})
	require.NoError(t, err)
	_, err = NewHybrid(HybridConfig{Config: Config{NumPages: 16, PageSize: 4, Tiers: TierConfig{HostPages: 8}}, Groups: groups})
	require.NoError(t, err)
	_, err = NewHybrid(HybridConfig{Config: Config{NumPages: 16, PageSize: 4, Tiers: TierConfig{HostPages: 8}, CacheEvents: hostEventsRecorder(t, groups, 8)}, Groups: groups})
	require.NoError(t, err)
}

// hostEventsRecorder is a Recorder of groups that mirrors hostPages host
// pages.
func hostEventsRecorder(t *testing.T, groups []LayerGroup, hostPages int) *events.Recorder {
	q, err := events.NewQueue(1)
	require.NoError(t, err)
	cfg := hybridRecorderConfig(groups, 16, 4)
	cfg.HostPages = hostPages
	rec, err := events.NewRecorder(cfg, q)
	require.NoError(t, err)
	return rec
}
