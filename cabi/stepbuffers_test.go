package main

import (
	"encoding/binary"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/pagedkv/pagedkv/stepbuf"
)

// TestABIStepBuffers binds C memory to a dense handle: a decode step
// through pagedkv_reserve writes its arrays there (the plan points into
// it, with the values of an unbound twin), allocates nothing, and unbind
// returns the plan to the library's buffers.
func TestABIStepBuffers(t *testing.T) {
	runtime.LockOSThread() // goLastError reads this thread's message
	defer runtime.UnlockOSThread()
	const n = 16
	h, ids, ones, sampled, _ := decodeABI(t, n)
	defer goDestroy(h)
	twin, _, _, _, _ := decodeABI(t, n)
	defer goDestroy(twin)
	rows, size, code := goStepLayout(h, n, 4*n, 16*n, 2)
	if code != codeOK {
		t.Fatalf("step_layout: %d: %s", code, goLastError())
	}
	if rows[0].Array != int32(stepbuf.PoolHeader) || rows[0].Group != -1 || size%stepbuf.Align != 0 {
		t.Fatalf("layout: %+v, size %d", rows[:2], size)
	}
	mem := newCMem(int(size), 0)
	defer mem.free(0)
	if code := goBindStepBuffers(h, mem, n, 4*n, 16*n, 2); code != codeOK {
		t.Fatalf("bind: %d: %s", code, goLastError())
	}
	plan, want := newCPlan(), newCPlan()
	defer plan.free()
	defer want.free()
	lo, hi := uintptr(mem.base), uintptr(mem.base)+uintptr(mem.size)
	for step := range 20 {
		if goReserveC(h, ids, ones, n, plan) != codeOK || goReserveC(twin, ids, ones, n, want) != codeOK {
			t.Fatalf("reserve: %s", goLastError())
		}
		got, w := plan.read(), want.read()
		for name, a := range w.Arrays {
			if !equal32(a, got.Arrays[name]) {
				t.Fatalf("step %d: %s = %v, twin %v", step, name, got.Arrays[name], a)
			}
		}
		if p := plan.kvIndptrData(); p < lo || p >= hi {
			t.Fatalf("step %d: kv_indptr at %#x, outside the bound memory [%#x, %#x)", step, p, lo, hi)
		}
		if b := binary.LittleEndian.Uint32(mem.bytes()[4*stepbuf.PoolBatchSize:]); b != n {
			t.Fatalf("step %d: header batch_size %d", step, b)
		}
		if goCommit(h, sampled, n) != codeOK || goCommit(twin, sampled, n) != codeOK {
			t.Fatal(goLastError())
		}
	}
	checkStepAllocs(t, "a decode step into bound step buffers", func() {
		if goReserveC(h, ids, ones, n, plan) != codeOK || goCommit(h, sampled, n) != codeOK {
			t.Fatalf("step failed: %s", goLastError())
		}
	})
	if goUnbindStepBuffers(h) != codeOK || goReserveC(h, ids, ones, n, plan) != codeOK {
		t.Fatal(goLastError())
	}
	if p := plan.kvIndptrData(); p >= lo && p < hi {
		t.Fatal("after unbind the plan still points into the unbound memory")
	}
}

// TestABIStepBuffersRefuseBadMemory: NULL, too small, misaligned, a bad
// caps_size or capacity, and a step over a capacity fail naming the value.
func TestABIStepBuffersRefuseBadMemory(t *testing.T) {
	runtime.LockOSThread() // goLastError reads this thread's message
	defer runtime.UnlockOSThread()
	h, ids, ones, _, _ := decodeABI(t, 4)
	defer goDestroy(h)
	_, size, _ := goStepLayout(h, 2, 8, 8, 0)
	small, odd := newCMem(int(size)-4, 0), newCMem(int(size), 4)
	defer small.free(0)
	defer odd.free(4)
	for _, tc := range []struct {
		call func() int32
		msg  string
	}{
		{func() int32 { return goBindStepBuffersSized(h, nil, 64, unsafe.Sizeof(cCaps(0, 0, 0, 0))) }, "mem is NULL"},
		{func() int32 { return goBindStepBuffers(h, small, 2, 8, 8, 0) }, "the layout needs"},
		{func() int32 { return goBindStepBuffers(h, odd, 2, 8, 8, 0) }, "is not a multiple of 16"},
		{func() int32 { return goBindStepBuffersSized(h, odd.base, 64, 8) }, "caps_size = 8, want sizeof(pagedkv_step_capacities) = 32"},
		{func() int32 { return goBindStepBuffers(h, odd, 0, 8, 8, 0) }, "MaxRequests = 0"},
	} {
		if code := tc.call(); code != codeBadArgument || !strings.Contains(goLastError(), tc.msg) {
			t.Errorf("code %d, %q; want PAGEDKV_ERR_BAD_ARGUMENT naming %q", code, goLastError(), tc.msg)
		}
	}
	ok := newCMem(int(size), 0)
	defer ok.free(0)
	if goBindStepBuffers(h, ok, 2, 8, 8, 0) != codeOK {
		t.Fatal(goLastError())
	}
	plan := newCPlan()
	defer plan.free()
	if code := goReserveC(h, ids, ones, 4, plan); code != codeBadArgument || !strings.Contains(goLastError(), "the step has 4 requests, MaxRequests = 2") {
		t.Fatalf("reserve over capacity: code %d, %q", code, goLastError())
	}
}

func equal32(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestABIHybridStepBuffers: a hybrid handle's step through
// pagedkv_hybrid_reserve is written into the bound C memory (every group's
// plan points into it, the chunked group's attention arrays too), with the
// values of an unbound twin, allocation-free.
func TestABIHybridStepBuffers(t *testing.T) {
	runtime.LockOSThread() // goLastError reads this thread's message
	defer runtime.UnlockOSThread()
	const n = 8
	h, ids, ones, sampled, plan := hybridDecodeABI(t, n)
	defer goDestroy(h)
	defer plan.free()
	twin, _, _, _, want := hybridDecodeABI(t, n)
	defer goDestroy(twin)
	defer want.free()
	_, size, code := goStepLayout(h, n, n, 16*n, 2)
	if code != codeOK {
		t.Fatal(goLastError())
	}
	mem := newCMem(int(size), 0)
	defer mem.free(0)
	if goBindStepBuffers(h, mem, n, n, 16*n, 2) != codeOK {
		t.Fatal(goLastError())
	}
	lo, hi := uintptr(mem.base), uintptr(mem.base)+uintptr(mem.size)
	for step := range 40 { // across chunk boundaries (chunks of 32) and window releases
		if goHybridReserveC(h, ids, ones, n, plan) != codeOK || goHybridReserveC(twin, ids, ones, n, want) != codeOK {
			t.Fatalf("reserve: %s", goLastError())
		}
		_, got := plan.read()
		_, w := want.read()
		for g := range w {
			for name, a := range w[g].Arrays {
				if !equal32(a, got[g].Arrays[name]) {
					t.Fatalf("step %d group %d: %s = %v, twin %v", step, g, name, got[g].Arrays[name], a)
				}
			}
			for name, a := range w[g].Hybrid {
				if !equal32(a, got[g].Hybrid[name]) {
					t.Fatalf("step %d group %d: %s = %v, twin %v", step, g, name, got[g].Hybrid[name], a)
				}
			}
			kv, attn := plan.groupData(g)
			if kv < lo || kv >= hi || len(w[g].Hybrid["attn_requests"]) > 0 && (attn < lo || attn >= hi) {
				t.Fatalf("step %d group %d: arrays at %#x, %#x, outside the bound memory", step, g, kv, attn)
			}
		}
		if goCommit(h, sampled, n) != codeOK || goCommit(twin, sampled, n) != codeOK {
			t.Fatal(goLastError())
		}
	}
	checkStepAllocs(t, "a hybrid decode step into bound step buffers", func() {
		if goHybridReserveC(h, ids, ones, n, plan) != codeOK || goCommit(h, sampled, n) != codeOK {
			t.Fatalf("step failed: %s", goLastError())
		}
	})
}
