package pagedkv

import (
	"testing"
	"time"
)

// BenchmarkTierPlanning measures the Manager's cost per page of planning
// tier copies, in one run with its baselines:
//
//   - offload: Evict of a released 64-page prefix with a host tier (each
//     victim claims a host page and becomes a copy), against drop: the
//     same eviction without tiers;
//   - onload: Add of that prompt when its pages are on the host tier (a
//     SHA-256 digest, a verified host lookup, a device page and a copy per
//     page), against device-hit: Add when they are still cached on the
//     device (hash, probe, token compare per page).
//
// Engine work (running the copies) is excluded: only planning is timed.
// The metric is ns/page.
func BenchmarkTierPlanning(b *testing.B) {
	const pages, ps = 64, 16
	prompt := seqTokens(3, pages*ps+1)
	setup := func(b *testing.B, tiers bool) (*Manager, *tierEngine) {
		cfg := Config{NumPages: 4 * pages, PageSize: ps, HashSeed: 1}
		if tiers {
			cfg.Tiers = TierConfig{HostPages: 2 * pages}
		}
		m, err := New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		return m, &tierEngine{t: b, m: m, ps: ps}
	}
	fill := func(b *testing.B, m *Manager, id RequestID, prompt []int32) {
		if _, err := m.Add(id, Request{Prompt: prompt}); err != nil {
			b.Fatal(err)
		}
		for m.Computed(id) < len(prompt) {
			if _, err := m.Reserve([]RequestID{id}, []int32{int32(len(prompt) - m.Computed(id))}); err != nil {
				b.Fatal(err)
			}
			if err := m.Commit(nil); err != nil {
				b.Fatal(err)
			}
		}
		if err := m.Release(id); err != nil {
			b.Fatal(err)
		}
	}
	var buf []TierCopy
	var ids []uint64
	completeAll := func(m *Manager) {
		buf = m.TierCopies(buf[:0])
		ids = ids[:0]
		for _, c := range buf {
			ids = append(ids, c.ID)
		}
		if err := m.CompleteTierCopies(ids...); err != nil {
			b.Fatal(err)
		}
	}
	perPage := func(b *testing.B, d time.Duration) {
		b.ReportMetric(float64(d.Nanoseconds())/float64(b.N*pages), "ns/page")
	}
	evict := func(tiers bool) func(b *testing.B) {
		return func(b *testing.B) {
			m, _ := setup(b, tiers)
			var spent time.Duration
			b.ReportAllocs()
			for i := range b.N {
				fill(b, m, RequestID(i), seqTokens(i*pages*ps, pages*ps+1)) // a new prefix each time
				t := time.Now()
				if got := m.Evict(m.NumPages()); got != pages {
					b.Fatalf("evicted %d pages, want %d", got, pages)
				}
				spent += time.Since(t)
				completeAll(m)
			}
			perPage(b, spent)
		}
	}
	add := func(onHost bool) func(b *testing.B) {
		return func(b *testing.B) {
			m, _ := setup(b, true)
			fill(b, m, 0, prompt)
			var spent time.Duration
			b.ReportAllocs()
			for i := range b.N {
				if onHost {
					m.Evict(m.NumPages())
					completeAll(m)
				}
				id := RequestID(i + 1)
				t := time.Now()
				if got, err := m.Add(id, Request{Prompt: prompt}); err != nil || got != pages*ps {
					b.Fatalf("matched %d tokens (%v), want %d", got, err, pages*ps)
				}
				spent += time.Since(t)
				completeAll(m)
				if err := m.Release(id); err != nil {
					b.Fatal(err)
				}
			}
			perPage(b, spent)
		}
	}
	b.Run("offload", evict(true))
	b.Run("drop", evict(false))
	b.Run("onload", add(true))
	b.Run("device-hit", add(false))
}
