package cpu

import (
	"fmt"
	"testing"
)

// BenchmarkBatchDecodeCPUTime is BenchmarkBatchDecode's shape on one worker,
// timed in thread CPU time against a memmove of the same K/V bytes from the
// same cache, alternated with it (see BenchCPUTimeVs): op-cpu-MB/s is bytes
// of K/V read per CPU second.
func BenchmarkBatchDecodeCPUTime(b *testing.B) {
	const B, tokens, hq, hkv, d, pageSize = 32, 4096, 32, 8, 128, 16
	bench := newDecodeBench(b, B, tokens, hq, hkv, d, pageSize)
	b.Run(fmt.Sprintf("B=%d/Hq=%d/Hkv=%d/D=%d/L=%d/f16", B, hq, hkv, d, tokens), func(b *testing.B) {
		be := New(Config{Workers: 1})
		src := bench.p.Cache.Data[:bench.kvBytes]
		dst := make([]byte, len(src))
		BenchCPUTimeVs(b, bench.kvBytes, func() {
			if err := be.BatchDecode(bench.p); err != nil {
				b.Fatal(err)
			}
		}, func() { copy(dst, src) })
	})
}
