package pagedkv_test

import (
	"fmt"

	"github.com/pagedkv/pagedkv"
)

// A gpt-oss-like model: sliding-window layers (W = 128) and full-attention
// layers on one page pool. The sliding group releases the pages that left
// its window at commit; its positions count from its first held page,
// while token positions (RoPE) stay absolute. README.md's hybrid Python
// example prints the same.
func ExampleHybridManager() {
	m, err := pagedkv.NewHybrid(pagedkv.HybridConfig{
		Config: pagedkv.Config{NumPages: 64, PageSize: 16, HashSeed: 1},
		Groups: []pagedkv.LayerGroup{
			{Kind: pagedkv.SlidingAttention, WindowTokens: 128, NumLayers: 1},
			{Kind: pagedkv.FullAttention, NumLayers: 1},
		},
	})
	if err != nil {
		panic(err)
	}
	prompt := make([]int32, 200)
	for i := range prompt {
		prompt[i] = int32(100 + i)
	}
	if _, err := m.Add(1, pagedkv.Request{Prompt: prompt}); err != nil {
		panic(err)
	}
	plan, err := m.Reserve([]pagedkv.RequestID{1}, []int32{200})
	if err != nil {
		panic(err)
	}
	for g, p := range plan.Groups {
		fmt.Println("group", g, "window_left", p.WindowLeft, "pages", p.KVIndptr[1])
	}
	if err := m.Commit([]int32{7}); err != nil {
		panic(err)
	}
	plan, err = m.Reserve([]pagedkv.RequestID{1}, []int32{1})
	if err != nil {
		panic(err)
	}
	for g, p := range plan.Groups {
		fmt.Println("group", g, "pages", p.KVIndptr[1], "positions", p.Positions, "token_positions", p.TokenPositions)
	}
	if err := m.Commit([]int32{8}); err != nil {
		panic(err)
	}
	fmt.Println("free pages", m.Stats().FreePages)
	// Output:
	// group 0 window_left 127 pages 13
	// group 1 window_left -1 pages 13
	// group 0 pages 9 positions [136] token_positions [200]
	// group 1 pages 13 positions [200] token_positions [200]
	// free pages 38
}

// A HybridManager with a host tier: the groups share it, each group's
// pages under digests of its own. Evicting offloads the idle cached pages
// (the engine runs the copies and completes them); the same prompt is then
// served from the host tier in every group, through onload copies that
// must complete before the request's next step.
func ExampleHybridManager_tiers() {
	m, err := pagedkv.NewHybrid(pagedkv.HybridConfig{
		Config: pagedkv.Config{NumPages: 32, PageSize: 4, HashSeed: 1, Tiers: pagedkv.TierConfig{HostPages: 16}},
		Groups: []pagedkv.LayerGroup{
			{Kind: pagedkv.SlidingAttention, WindowTokens: 6, NumLayers: 1},
			{Kind: pagedkv.FullAttention, NumLayers: 1},
		},
	})
	if err != nil {
		panic(err)
	}
	// engine runs the planned tier copies (here: nothing to move) and
	// reports them done.
	engine := func() {
		var ids []uint64
		for _, c := range m.TierCopies(nil) {
			ids = append(ids, c.ID) // copy page c.Device <-> host page c.Host, every layer
		}
		if err := m.CompleteTierCopies(ids...); err != nil {
			panic(err)
		}
	}
	prompt := []int32{5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}
	if _, err := m.Add(1, pagedkv.Request{Prompt: prompt}); err != nil {
		panic(err)
	}
	if _, err := m.Reserve([]pagedkv.RequestID{1}, []int32{13}); err != nil {
		panic(err)
	}
	if err := m.Commit([]int32{7}); err != nil {
		panic(err)
	}
	if err := m.Release(1); err != nil {
		panic(err)
	}
	fmt.Println("evicted", m.Evict(m.Stats().TotalPages))
	engine()
	hit, err := m.Add(2, pagedkv.Request{Prompt: prompt})
	if err != nil {
		panic(err)
	}
	fmt.Println("hit", hit, "loading", m.Loading(2))
	engine()
	s := m.Stats()
	fmt.Println("loading", m.Loading(2), "host hit tokens per group", s.Groups[0].HostHitTokens, s.Groups[1].HostHitTokens)
	// Output:
	// evicted 6
	// hit 12 loading true
	// loading false host hit tokens per group 12 12
}
