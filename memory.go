package pagedkv

import (
	"fmt"
	"unsafe"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/internal/sysmem"
	"github.com/pagedkv/pagedkv/layergroup"
	"github.com/pagedkv/pagedkv/pagetable"
	"github.com/pagedkv/pagedkv/prefixcache"
	"github.com/pagedkv/pagedkv/tier"
	"github.com/pagedkv/pagedkv/tier/host"
)

// The memory a configuration asks for, bounded by Config.MemoryLimit
// before anything is allocated, so that a configuration no machine can
// hold (65,536 layer groups of 4,096 pages of 16 tokens ask for 38 GiB) is
// refused by name instead of killing the process, and with it an engine
// that embeds the library through the C ABI.

// groupFixedBytes is what a group costs besides its pages: its Manager,
// page table and prefix cache with their maps and buffers as New leaves
// them, and the HybridManager's per-group slots (measured, rounded up).
const groupFixedBytes = 8 << 10

// AllocBytes is the memory [New] allocates for cfg, or that cfg's
// bookkeeping takes as the pool fills (saturating at the largest int64):
// the allocator's two words per page; the prefix cache's node, PageSize
// tokens and index slots per page (prefixcache.AllocBytes, with the ARC
// policy's ghost lists); the cascade planner's mark per page; with a host
// tier its bookkeeping per device and host page and the host pool
// (host.AllocBytes: the pages' bytes unless Tiers.HostMemory holds them);
// and a few KiB for the Manager itself. Requests' own memory (prompts,
// page tables) grows with the requests and is not counted.
// Config.MemoryLimit bounds it.
func (cfg Config) AllocBytes() int64 { return allocBytes(&cfg, 1) }

// AllocBytes is what [NewHybrid] allocates for cfg: [Config.AllocBytes]
// with the per-group part (prefix cache, planner, Manager) once per group
// and the pool-wide part (allocator, tiers) once.
// HybridConfig.MemoryLimit bounds it.
func (cfg HybridConfig) AllocBytes() int64 {
	return allocBytes(&cfg.Config, layergroup.NumOwners(cfg.Groups))
}

func allocBytes(cfg *Config, groups int) int64 {
	n := int64(min(max(cfg.NumPages, 0), allocator.MaxPages+1))
	pageSize := int64(min(max(cfg.PageSize, 0), pagetable.MaxPageSize+1))
	perGroup := prefixcache.AllocBytes(prefixcache.Config{NumPages: int(n), PageSize: int(pageSize),
		Priorities: cfg.Priorities, Eviction: cfg.Eviction, ShadowRate: cfg.MissRatioSampling})
	perGroup += n*int64(unsafe.Sizeof(uint64(0))) + groupFixedBytes // cascadePlanner.mark
	need := sysmem.MulAdd(int64(max(groups, 0)), perGroup, allocator.AllocBytes(int(n)))
	t := &cfg.Tiers
	if t.HostPages <= 0 {
		return need
	}
	need = sysmem.MulAdd(n, int64(unsafe.Sizeof(pageMeta{}))+4*pageSize, need)
	hostPages := int64(t.HostPages)
	need = sysmem.MulAdd(hostPages, int64(unsafe.Sizeof(tier.Digest{})+unsafe.Sizeof(hostName{}))+1, need)
	pageBytes := 0
	if t.Format.Layers != 0 && t.Format.Validate() == nil {
		pageBytes = t.Format.PageBytes()
	}
	hostNeed := host.AllocBytes(host.Config{NumPages: t.HostPages, PageSize: int(pageSize), PageBytes: pageBytes, Memory: t.HostMemory})
	return sysmem.MulAdd(1, hostNeed, need)
}

// checkMemory refuses cfg (groups layer groups; what names the manager)
// when its AllocBytes exceed MemoryLimit, or, with MemoryLimit 0, this
// machine's physical memory. It runs before anything is allocated. Page
// counts and sizes out of range are left to the checks that name them.
func checkMemory(cfg *Config, groups int, what string) error {
	if cfg.MemoryLimit < 0 {
		return fmt.Errorf("%w: MemoryLimit = %d, want >= 0 (0: this machine's physical memory)", ErrBadConfig, cfg.MemoryLimit)
	}
	if cfg.NumPages < 1 || cfg.NumPages > allocator.MaxPages || cfg.PageSize < 1 || cfg.PageSize > pagetable.MaxPageSize {
		return nil
	}
	what = fmt.Sprintf("%s, NumPages = %d, PageSize = %d, Tiers.HostPages = %d", what, cfg.NumPages, cfg.PageSize, cfg.Tiers.HostPages)
	if err := sysmem.Check(what, allocBytes(cfg, groups), cfg.MemoryLimit); err != nil {
		return fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	return nil
}
