package pagedkv

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/prefixcache"
)

type nopSink struct{}

func (nopSink) PageStored(prefixcache.PageID, uint64, prefixcache.PageID, uint64, prefixcache.Key, []int32) {
}
func (nopSink) PageRemoved(prefixcache.PageID, uint64) {}

// A HybridManager has no tiers, and publishes KV events only through a
// GroupEventSink (hybrid_events_test.go): a config asking for tiers, or
// giving a plain sink, is refused, naming the field, instead of building
// groups whose tier copies nobody can complete or whose events share one
// sink with nothing to tell the groups apart.
func TestNewHybridRefusesTiersAndEvents(t *testing.T) {
	groups := []LayerGroup{{Kind: FullAttention, NumLayers: 2}, {Kind: SlidingAttention, WindowTokens: 8, NumLayers: 2}}
	for name, c := range map[string]struct {
		cfg  Config
		want string
	}{
		"host pages":    {Config{Tiers: TierConfig{HostPages: 8}}, "Tiers.HostPages = 8"},
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
}
