package main

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/internal/doclimits"
	"github.com/pagedkv/pagedkv/internal/sysmem"
)

func abiFullGroups(n int) []abiGroup {
	g := make([]abiGroup, n)
	for i := range g {
		g[i] = abiGroup{NumLayers: 1}
	}
	return g
}

// Issue 35: pagedkv_hybrid_create with 65,536 groups of 4,096 pages was
// not refused: the Go runtime died out of memory and took the C host
// process with it. It is now PAGEDKV_ERR_BAD_CONFIG naming the groups, the
// pages, the bytes needed and the limit (cfg.memory_limit, or by default
// this machine's physical memory), before anything is allocated.
func TestHybridCreateRefusesHugeConfig(t *testing.T) {
	runtime.LockOSThread() // goLastError reads this thread's message
	defer runtime.UnlockOSThread()
	groups := abiFullGroups(maxGroups)
	need := pagedkv.HybridConfig{Config: pagedkv.Config{NumPages: 4096, PageSize: 16}, Groups: make([]pagedkv.LayerGroup, maxGroups)}.AllocBytes()
	check := func(cfg abiConfig, limit string) {
		t.Helper()
		h, code := goHybridCreate(cfg, groups)
		msg := goLastError()
		if code != codeBadConfig || h != 0 {
			t.Fatalf("hybrid_create of 65536 groups x 4096 pages: code %d, handle %d (%s), want PAGEDKV_ERR_BAD_CONFIG", code, h, msg)
		}
		for _, s := range []string{"65536 groups", "NumPages = 4096", "PageSize = 16", fmt.Sprintf("needs %d bytes", need), limit} {
			if !strings.Contains(msg, s) {
				t.Errorf("hybrid_create's error %q does not say %q", msg, s)
			}
		}
	}
	check(abiConfig{NumPages: 4096, PageSize: 16, MemoryLimit: 1 << 30}, "MemoryLimit (1073741824 bytes)")
	if p, ok := sysmem.Physical(); ok && p < need {
		check(abiConfig{NumPages: 4096, PageSize: 16}, "physical memory")
	}
}

// memory_limit refuses a small configuration one byte short of what it
// asks for and accepts it at exactly that; a caller built with the header
// before memory_limit (cfg_size without it) gets the default, whatever
// lies past its struct.
func TestConfigMemoryLimit(t *testing.T) {
	runtime.LockOSThread() // goLastError reads this thread's message
	defer runtime.UnlockOSThread()
	groups := abiFullGroups(4)
	need := pagedkv.HybridConfig{Config: pagedkv.Config{NumPages: 4096, PageSize: 16}, Groups: make([]pagedkv.LayerGroup, 4)}.AllocBytes()
	cfg := abiConfig{NumPages: 4096, PageSize: 16, HashSeed: 1, MemoryLimit: need - 1}
	if h, code := goHybridCreate(cfg, groups); code != codeBadConfig || !strings.Contains(goLastError(), fmt.Sprintf("needs %d bytes, more than MemoryLimit (%d bytes)", need, need-1)) {
		t.Fatalf("memory_limit %d: code %d, handle %d: %s", need-1, code, h, goLastError())
	}
	cfg.MemoryLimit = need
	h, code := goHybridCreate(cfg, groups)
	if code != codeOK {
		t.Fatalf("memory_limit %d: code %d: %s", need, code, goLastError())
	}
	goDestroy(h)
	cfg.MemoryLimit = -5
	if _, code := goHybridCreate(cfg, groups); code != codeBadConfig || !strings.Contains(goLastError(), "MemoryLimit = -5") {
		t.Fatalf("memory_limit -5: code %d: %s", code, goLastError())
	}
	cfg.MemoryLimit = 1 // past an old caller's struct: never read
	h, code = goHybridCreateSized(cfg, groups, configSizes[1])
	if code != codeOK {
		t.Fatalf("cfg_size %d (no memory_limit): code %d: %s", configSizes[1], code, goLastError())
	}
	goDestroy(h)
	if _, code := goHybridCreateSized(cfg, groups, configSizes[1]+4); code != codeBadArgument ||
		!strings.Contains(goLastError(), fmt.Sprintf("cfg_size = %d, want sizeof(pagedkv_config) = %d (or %d, without state_checkpoint_every, or %d, without pin_budget, or %d, without block_tables_stride, or %d, without memory_limit)",
			configSizes[1]+4, configSizes[0], configSizes[4], configSizes[3], configSizes[2], configSizes[1])) {
		t.Fatalf("cfg_size %d: code %d: %s", configSizes[1]+4, code, goLastError())
	}
	// A caller from before block_tables_stride: a stride past its struct
	// (here one no pool allows) is never read.
	cfg.MemoryLimit, cfg.BlockTablesStride = 0, 1<<40
	h, code = goHybridCreateSized(cfg, groups, configSizes[2])
	if code != codeOK {
		t.Fatalf("cfg_size %d (no block_tables_stride): code %d: %s", configSizes[2], code, goLastError())
	}
	goDestroy(h)
	if _, code := goHybridCreateSized(cfg, groups, configSizes[0]); code != codeBadConfig || !strings.Contains(goLastError(), "BlockTablesStride = 1099511627776, want 0..NumPages = 4096") {
		t.Fatalf("block_tables_stride 2^40: code %d: %s", code, goLastError())
	}
}

// The limits docs/c-abi.md publishes ("Memory").
func TestCABIDocLimits(t *testing.T) {
	doclimits.Check(t, "docs/c-abi.md", map[string]any{
		"cabi.maxGroups":              maxGroups,
		"sizeof(pagedkv_config)":      configSizes[0],
		"cabi.configSizeV2":           configSizes[1],
		"cabi.configSizeV3":           configSizes[2],
		"cabi.configSizeV4":           configSizes[3],
		"cabi.configSizeV5":           configSizes[4],
		"pagedkv_config.memory_limit": pagedkv.Config{}.MemoryLimit,
	})
}
