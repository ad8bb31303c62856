package pagedkv

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/internal/doclimits"
	"github.com/pagedkv/pagedkv/internal/sysmem"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/pagetable"
	"github.com/pagedkv/pagedkv/tier"
)

func fullGroups(n int) []LayerGroup {
	g := make([]LayerGroup, n)
	for i := range g {
		g[i] = LayerGroup{Kind: FullAttention, NumLayers: 1}
	}
	return g
}

// Issue 35: 65,536 groups of 4,096 pages (about 38 GiB of bookkeeping at
// page size 16) were not refused, and the Go runtime died out of memory,
// taking the C host process with it. NewHybrid now adds up what the
// configuration asks for before allocating anything and refuses it above
// MemoryLimit (by default this machine's physical memory), naming the
// groups, the pages, the bytes needed and the limit.
func TestNewHybridRefusesHugeConfig(t *testing.T) {
	cfg := HybridConfig{Config: Config{NumPages: 4096, PageSize: 16, HashSeed: 1}, Groups: fullGroups(1 << 16)}
	need := cfg.AllocBytes()
	require.Greater(t, need, int64(38<<30), "65,536 groups x 4,096 pages of 16 tokens")
	names := func(err error, limit string) {
		t.Helper()
		require.ErrorIs(t, err, ErrBadConfig)
		require.ErrorIs(t, err, sysmem.ErrTooLarge)
		for _, s := range []string{"a HybridManager of 65536 groups", "NumPages = 4096", "PageSize = 16",
			fmt.Sprintf("needs %d bytes", need), limit} {
			require.ErrorContains(t, err, s)
		}
	}
	cfg.MemoryLimit = 1 << 30
	_, err := NewHybrid(cfg)
	names(err, "MemoryLimit (1073741824 bytes)")

	cfg.MemoryLimit = 0 // this machine's physical memory
	if p, ok := sysmem.Physical(); !ok || p >= need {
		t.Logf("physical memory %d (known: %v) holds %d bytes: the default limit is not exercised here", p, ok, need)
		return
	}
	_, err = NewHybrid(cfg)
	names(err, "this machine's physical memory")
}

// Dense New had the same hole: the largest pool (2^24 pages of 256
// tokens, 16 priority levels of ARC) asks for about 22 GiB and used to
// die out of memory allocating its 16 GiB of cached tokens wherever that
// did not fit. It is refused by name like a hybrid one.
func TestNewRefusesHugeConfig(t *testing.T) {
	cfg := Config{NumPages: allocator.MaxPages, PageSize: 256, HashSeed: 1, Eviction: "arc", Priorities: 16, MemoryLimit: 1 << 30}
	need := cfg.AllocBytes()
	require.Greater(t, need, int64(20<<30))
	_, err := New(cfg)
	require.ErrorIs(t, err, ErrBadConfig)
	require.ErrorContains(t, err, fmt.Sprintf("a Manager, NumPages = 16777216, PageSize = 256, Tiers.HostPages = 0 needs %d bytes, more than MemoryLimit (1073741824 bytes)", need))
}

// A small limit refuses a configuration the default accepts, one byte
// over AllocBytes, and accepts it at AllocBytes: the limit bounds exactly
// what AllocBytes counts, for a HybridManager and a Manager alike.
func TestMemoryLimitBoundsAllocBytes(t *testing.T) {
	hcfg := HybridConfig{Config: Config{NumPages: 4096, PageSize: 16, HashSeed: 1}, Groups: fullGroups(4)}
	dcfg := Config{NumPages: 4096, PageSize: 16, HashSeed: 1}
	hneed, dneed := hcfg.AllocBytes(), dcfg.AllocBytes()
	require.Greater(t, hneed, 3*dneed, "four groups cost more than three Managers' caches")

	hcfg.MemoryLimit = hneed - 1
	_, err := NewHybrid(hcfg)
	require.ErrorIs(t, err, ErrBadConfig)
	require.ErrorContains(t, err, fmt.Sprintf("a HybridManager of 4 groups, NumPages = 4096, PageSize = 16, Tiers.HostPages = 0 needs %d bytes, more than MemoryLimit (%d bytes)", hneed, hneed-1))
	hcfg.MemoryLimit = hneed
	_, err = NewHybrid(hcfg)
	require.NoError(t, err)

	dcfg.MemoryLimit = dneed - 1
	_, err = New(dcfg)
	require.ErrorIs(t, err, ErrBadConfig)
	require.ErrorContains(t, err, fmt.Sprintf("a Manager, NumPages = 4096, PageSize = 16, Tiers.HostPages = 0 needs %d bytes, more than MemoryLimit (%d bytes)", dneed, dneed-1))
	dcfg.MemoryLimit = dneed
	_, err = New(dcfg)
	require.NoError(t, err)

	for _, bad := range []int64{-1, -1 << 40} {
		dcfg.MemoryLimit, hcfg.MemoryLimit = bad, bad
		_, err = New(dcfg)
		require.ErrorIs(t, err, ErrBadConfig)
		require.ErrorContains(t, err, fmt.Sprintf("MemoryLimit = %d, want >= 0", bad))
		_, err = NewHybrid(hcfg)
		require.ErrorIs(t, err, ErrBadConfig)
		require.ErrorContains(t, err, fmt.Sprintf("MemoryLimit = %d, want >= 0", bad))
	}
}

// AllocBytes is not a guess: what NewHybrid keeps on the heap is within
// it (and within a quarter of it: the limit is not padded).
func TestAllocBytesCoversTheHeap(t *testing.T) {
	for _, cfg := range []HybridConfig{
		{Config: Config{NumPages: 1 << 14, PageSize: 16, HashSeed: 1}, Groups: fullGroups(8)},
		{Config: Config{NumPages: 1 << 14, PageSize: 4, HashSeed: 1, Eviction: "arc", Priorities: 2,
			Tiers: TierConfig{HostPages: 1 << 12, Format: tier.PageFormat{Layout: layout.NHD, DType: layout.F16,
				PageSize: 4, NumKVHeads: 2, HeadDim: 8, Layers: 3}}}, Groups: fullGroups(3)},
	} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		h, err := NewHybrid(cfg)
		require.NoError(t, err)
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(h)
		held, need := int64(after.HeapAlloc)-int64(before.HeapAlloc), cfg.AllocBytes()
		// 1 MiB of slack for whatever else the test binary allocates meanwhile.
		require.LessOrEqual(t, held, need+1<<20, "%d groups, NumPages %d: the heap grew by %d bytes, AllocBytes says %d", len(cfg.Groups), cfg.NumPages, held, need)
		if cfg.Eviction != "arc" { // ARC's ghosts are counted, not yet taken
			require.Greater(t, held, need*3/4, "AllocBytes %d overstates the %d bytes held", need, held)
		}
	}
}

// Counts out of range are still refused by the checks that name them,
// not by the memory check, and a configuration that cannot be computed
// saturates instead of wrapping.
func TestMemoryCheckKeepsRangeErrors(t *testing.T) {
	_, err := New(Config{NumPages: 1 << 30, PageSize: 16})
	require.ErrorIs(t, err, ErrBadConfig)
	require.ErrorContains(t, err, "NumPages = 1073741824, want 1..16777216")
	_, err = NewHybrid(HybridConfig{Config: Config{NumPages: 16, PageSize: 1 << 20}, Groups: fullGroups(2)})
	require.ErrorIs(t, err, ErrBadConfig)
	require.ErrorContains(t, err, "1048576")
	huge := HybridConfig{Config: Config{NumPages: 1 << 40, PageSize: 1 << 40, Tiers: TierConfig{HostPages: 1 << 62}}, Groups: fullGroups(1 << 20)}
	require.Equal(t, int64(1<<63-1), huge.AllocBytes())
}

// The limits docs/manager.md publishes ("Memory a configuration asks for").
func TestManagerDocLimits(t *testing.T) {
	doclimits.Check(t, "docs/manager.md", map[string]any{
		"pagedkv.Config.MemoryLimit": Config{}.MemoryLimit,
		"allocator.MaxPages":         allocator.MaxPages,
		"pagetable.MaxPageSize":      pagetable.MaxPageSize,
	})
}
