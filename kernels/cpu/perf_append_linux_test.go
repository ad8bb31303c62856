package cpu_test

import (
	"fmt"
	"testing"

	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/layout"
)

// BenchmarkAppendCPUTime is BenchmarkAppend's shapes on one worker, timed in
// thread CPU time against a memmove of the same bytes alternated with it
// (see cpu.BenchCPUTimeVs): op/base-% is the append's throughput as a
// percentage of memmove's.
func BenchmarkAppendCPUTime(b *testing.B) {
	for _, shape := range []struct {
		name        string
		nnz, perReq int
	}{{"decode", 256, 1}, {"prefill", 4096, 64}} {
		for _, l := range []layout.KVLayout{layout.NHD, layout.HND} {
			b.Run(fmt.Sprintf("%s/%v/f16", shape.name, l), func(b *testing.B) {
				p := benchAppend(l, shape.nnz, shape.perReq)
				be := cpu.New(cpu.Config{Workers: 1})
				dstK, dstV := make([]byte, len(p.AppendKey.Data)), make([]byte, len(p.AppendValue.Data))
				cpu.BenchCPUTimeVs(b, int64(len(dstK)+len(dstV)), func() {
					if err := be.AppendPagedKVCache(&p); err != nil {
						b.Fatal(err)
					}
				}, func() {
					copy(dstK, p.AppendKey.Data)
					copy(dstV, p.AppendValue.Data)
				})
			})
		}
	}
}
