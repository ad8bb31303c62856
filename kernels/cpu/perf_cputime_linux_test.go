package cpu

import (
	"runtime"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// threadCPUTime is the CPU time of the calling OS thread
// (clock_gettime(CLOCK_THREAD_CPUTIME_ID)): unlike wall time it does not
// count time the thread waited for a core, so it is comparable across runs
// on a loaded machine.
func threadCPUTime() time.Duration {
	const clockThreadCPUTimeID = 3
	var ts syscall.Timespec
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		panic(errno)
	}
	return time.Duration(ts.Nano())
}

// BenchCPUTimeVs runs op and baseline alternately, b.N times each, on one
// locked OS thread, and reports the thread CPU time of each as throughput
// over bytes (op-cpu-MB/s, base-cpu-MB/s) and op's throughput as a
// percentage of the baseline's (op/base-%). Alternating the two keeps them
// under the same cache and memory-bandwidth conditions. op and baseline must
// run on the calling goroutine (e.g. a backend with one worker). Exported
// for the external test package.
func BenchCPUTimeVs(b *testing.B, bytes int64, op, baseline func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	op()
	baseline()
	b.ReportAllocs()
	var opT, baseT time.Duration
	for b.Loop() {
		t0 := threadCPUTime()
		op()
		t1 := threadCPUTime()
		baseline()
		t2 := threadCPUTime()
		opT += t1 - t0
		baseT += t2 - t1
	}
	mbps := func(d time.Duration) float64 { return float64(bytes) * float64(b.N) / d.Seconds() / 1e6 }
	b.ReportMetric(mbps(opT), "op-cpu-MB/s")
	b.ReportMetric(mbps(baseT), "base-cpu-MB/s")
	b.ReportMetric(100*baseT.Seconds()/opT.Seconds(), "op/base-%")
	b.ReportMetric(float64(opT.Nanoseconds())/float64(b.N), "op-cpu-ns")
}
