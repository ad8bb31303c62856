package main

import (
	"runtime"
	"strings"
	"sync"
	"testing"
)

// TestBusyTimeout: a call that finds another thread's call in flight gets
// PAGEDKV_ERR_BUSY at once by default; after pagedkv_set_busy_timeout it
// waits that long first (and says so), and with -1 it waits until the
// call in flight ends, then runs. Bad timeouts are refused and change
// nothing; a waiting call on a handle destroyed meanwhile gets
// PAGEDKV_ERR_BAD_HANDLE instead of waiting forever.
func TestBusyTimeout(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	h, code := goCreate(abiConfig{NumPages: 8, PageSize: 4})
	if code != codeOK {
		t.Fatalf("create: %d %s", code, goLastError())
	}
	release := goHold(h)
	if code := goAudit(h); code != codeBusy || !strings.HasSuffix(goLastError(), "is in use by another thread") {
		t.Fatalf("audit while busy: %d %q, want BUSY at once", code, goLastError())
	}
	for _, bad := range []int64{-2, -1 << 40, 24*3600*1000 + 1} {
		if code := goSetBusyTimeout(h, bad); code != codeBadArgument || !strings.Contains(goLastError(), "timeout_ms = ") {
			t.Errorf("set_busy_timeout(%d): %d %q, want BAD_ARGUMENT naming it", bad, code, goLastError())
		}
	}
	if code := goAudit(h); code != codeBusy || strings.Contains(goLastError(), "waited") {
		t.Errorf("after bad timeouts, audit: %d %q, want BUSY at once (the default kept)", code, goLastError())
	}
	if code := goSetBusyTimeout(h, 2); code != codeOK {
		t.Fatalf("set_busy_timeout(2): %d %s", code, goLastError())
	}
	if code := goAudit(h); code != codeBusy || !strings.HasSuffix(goLastError(), "(waited pagedkv_set_busy_timeout's 2ms)") {
		t.Errorf("audit while busy with a 2 ms timeout: %d %q", code, goLastError())
	}
	if code := goSetBusyTimeout(h, -1); code != codeOK {
		t.Fatalf("set_busy_timeout(-1): %d %s", code, goLastError())
	}
	var wg sync.WaitGroup
	got := make([]int32, 4)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = goAudit(h) // each waits for the held flag, then for the others
		}()
	}
	release()
	wg.Wait()
	for i, code := range got {
		if code != codeOK {
			t.Errorf("waiting audit %d: %d, want OK once the call in flight ended", i, code)
		}
	}

	// Destroyed while a call waits: the waiter returns BAD_HANDLE.
	release = goHold(h)
	done := make(chan int32)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		done <- goAudit(h)
	}()
	hd := lookupHandle(h)
	destroyHeld(hd, h)
	if code := <-done; code != codeBadHandle {
		t.Errorf("a call waiting while the handle was destroyed: %d, want BAD_HANDLE", code)
	}
	_ = release // the flag stays set on a destroyed handle, as destroy leaves it
}

// TestLockFreeCalls: the calls documented lock-free answer while another
// thread's call holds the handle (a hybrid manager with tiers and events).
func TestLockFreeCalls(t *testing.T) {
	o := tierOptions(8)
	o.Groups = []abiGroup{{Kind: 1, WindowTokens: 8, NumLayers: 1}, {NumLayers: 1}}
	o.Layers = 2
	h, code := goCreateEx(abiConfig{NumPages: 16, PageSize: 4, HashSeed: 1}, o)
	if code != codeOK {
		t.Fatalf("hybrid_create_ex: %d %s", code, goLastError())
	}
	defer goDestroy(h)
	release := goHold(h)
	defer release()
	for i, code := range goLockFree(h) {
		if code != codeOK {
			t.Errorf("lock-free call %d while busy: %d %s", i, code, goLastError())
		}
	}
	if code := goAudit(h); code != codeBusy {
		t.Errorf("audit while busy: %d, want BUSY", code)
	}
}
