package pagedkv

import (
	"testing"

	"github.com/pagedkv/pagedkv/evict"
)

// BenchmarkDecodeStepEviction is BenchmarkDecodeStep under eviction
// pressure, once per eviction policy in the same run: 256 requests decode
// one token per step; a request reaching 256 tokens is released and
// replaced by a new one whose prompt shares 48 tokens with one of 32
// families; the pool holds the running requests and 512 cached pages, so
// every step publishes filled pages and evicts. Reported per running
// request, with evictions per step; LRU is the baseline the others are
// compared with (docs/replay.md).
func BenchmarkDecodeStepEviction(b *testing.B) {
	const ps, nreq, shared, promptLen, maxLen, families = 16, 256, 48, 64, 256, 32
	for _, policy := range evict.Names() {
		b.Run(policy, func(b *testing.B) {
			m := mustNew(b, Config{NumPages: nreq*maxLen/ps + 512, PageSize: ps, HashSeed: 1, Eviction: policy})
			ids := make([]RequestID, nreq)
			nt := make([]int32, nreq)
			sampled := make([]int32, nreq)
			prompts := make([][]int32, 4*nreq) // built up front: the timed loop measures the Manager alone
			for i := range prompts {
				prompts[i] = append(seqTokens((i%families)*7919, shared), seqTokens(1_000_000+i*131, promptLen-shared)...)
			}
			next := RequestID(0)
			admit := func(i int) {
				ids[i] = next
				if _, err := m.Add(next, Request{Prompt: prompts[int(next)%len(prompts)], CapacityTokens: maxLen + 1}); err != nil {
					b.Fatal(err)
				}
				next++
			}
			for i := range ids {
				admit(i)
			}
			evicted := m.Stats().EvictedPages
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				for i, id := range ids {
					if len(m.Tokens(id)) >= maxLen {
						if err := m.Release(id); err != nil {
							b.Fatal(err)
						}
						admit(i)
					}
					nt[i] = int32(min(len(m.Tokens(ids[i]))-m.Computed(ids[i]), ps))
					sampled[i] = NoToken
					if m.Computed(ids[i])+int(nt[i]) == len(m.Tokens(ids[i])) {
						sampled[i] = int32(i)
					}
				}
				if _, err := m.Reserve(ids, nt); err != nil {
					b.Fatal(err)
				}
				if err := m.Commit(sampled); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/nreq, "ns/request")
			b.ReportMetric(float64(m.Stats().EvictedPages-evicted)/float64(b.N), "evictions/step")
		})
	}
}
