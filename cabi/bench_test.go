package main

import (
	"math"
	"runtime"
	"strings"
	"testing"
)

// The benchmark hook refuses out-of-range arguments with BAD_ARGUMENT
// naming them, even where a sum of them would wrap past int64 (INT64_MAX
// warm and steps once wrapped to a small total and failed later as
// OUT_OF_PAGES), and runs a small workload.
func TestBenchDecodeStepsBounds(t *testing.T) {
	runtime.LockOSThread() // goLastError reads this thread's message
	defer runtime.UnlockOSThread()
	const maxInt64 = math.MaxInt64
	for _, a := range [][5]int64{
		{1, 3, maxInt64, maxInt64, 65536}, // issue 28: wrapped to OUT_OF_PAGES
		{1, maxInt64, 1, 1, 16},
		{1, 1, 1, maxInt64, 16},
		{1, 1, maxInt64 - 1, 1, 16},
		{1, 1 << 20, 0, 1, 16}, // one token past the bound
		{0, 1, 0, 1, 16},
		{1<<16 + 1, 1, 0, 1, 16},
		{1, 1, 0, 1, 0},
		{1, 1, -1, 1, 16},
	} {
		_, code := goBenchDecodeSteps(a[0], a[1], a[2], a[3], a[4])
		if code != codeBadArgument {
			t.Errorf("bench_decode_steps%v: code %d (%s), want PAGEDKV_ERR_BAD_ARGUMENT", a, code, goLastError())
			continue
		}
		if msg := goLastError(); !strings.Contains(msg, "bench_decode_steps") {
			t.Errorf("bench_decode_steps%v: message %q does not name the call", a, msg)
		}
	}
	ns, code := goBenchDecodeSteps(2, 3, 1, 2, 16)
	if code != codeOK || ns <= 0 {
		t.Errorf("a valid run: code %d (%s), ns %d", code, goLastError(), ns)
	}
}
