package main

/*
#define PAGEDKV_NO_PROTOTYPES
#include "pagedkv.h"
*/
import "C"

import (
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/pagedkv/pagedkv"
)

// cabiClock is a manager's Config.Clock: monotonic from creation until
// pagedkv_set_clock, then the caller's.
type cabiClock struct {
	start  time.Time
	manual atomic.Bool
	now    atomic.Int64 // nanoseconds, while manual
}

func newClock() *cabiClock { return &cabiClock{start: time.Now()} }

func (c *cabiClock) read() time.Duration {
	if c.manual.Load() {
		return time.Duration(c.now.Load())
	}
	return time.Since(c.start)
}

// maxClockMillis is the latest time in milliseconds a time.Duration holds.
const maxClockMillis = int64(1<<63-1) / int64(time.Millisecond)

//export pagedkv_set_clock
func pagedkv_set_clock(id C.pagedkv_manager, nowMs C.int64_t) (code C.int32_t) {
	h, code := enter(id, "set_clock")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if nowMs < 0 || int64(nowMs) > maxClockMillis {
		return badArg("set_clock: now_ms = %d, want 0..%d", int64(nowMs), maxClockMillis)
	}
	now := time.Duration(nowMs) * time.Millisecond
	if !h.clock.manual.Load() || now > time.Duration(h.clock.now.Load()) {
		h.clock.now.Store(int64(now))
	}
	h.clock.manual.Store(true)
	return C.PAGEDKV_OK
}

//export pagedkv_set_retention
func pagedkv_set_retention(id C.pagedkv_manager, rid C.uint64_t, ranges *C.pagedkv_retention_range, n C.int64_t, size C.size_t) (code C.int32_t) {
	h, code := enter(id, "set_retention")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	switch {
	case size != C.sizeof_pagedkv_retention_range:
		return badArg("set_retention: range_size = %d, want sizeof(pagedkv_retention_range) = %d", uint64(size), C.sizeof_pagedkv_retention_range)
	case n < 0 || n > pagedkv.MaxRetentionRanges:
		return badArg("set_retention: n = %d ranges, want 0..%d", int64(n), pagedkv.MaxRetentionRanges)
	case n > 0 && ranges == nil:
		return badArg("set_retention: ranges is NULL with n = %d", int64(n))
	}
	var buf [pagedkv.MaxRetentionRanges]pagedkv.RetentionRange
	out := buf[:0]
	if n > 0 {
		for i, r := range unsafe.Slice(ranges, int(n)) {
			switch {
			case r.reserved != 0:
				return badArg("set_retention: ranges[%d].reserved = %d, want 0", i, int32(r.reserved))
			case r.duration_ms < 0 || int64(r.duration_ms) > maxMillis:
				return badArg("set_retention: ranges[%d].duration_ms = %d, want 0..%d", i, int64(r.duration_ms), maxMillis)
			case r.priority < 0 || r.priority > 255:
				return badArg("set_retention: ranges[%d].priority = %d, want 0..priorities-1", i, int32(r.priority))
			case r.session < 0 || r.session > 255:
				return badArg("set_retention: ranges[%d].session = %d, want a PAGEDKV_SESSION_*", i, int32(r.session))
			case r.start < 0 || int64(r.start) > pagedkv.MaxRequestTokens || r.end < 0 || int64(r.end) > pagedkv.MaxRequestTokens:
				return badArg("set_retention: ranges[%d] is tokens [%d, %d), want both in 0..%d", i, int64(r.start), int64(r.end), pagedkv.MaxRequestTokens)
			}
			out = append(out, pagedkv.RetentionRange{Start: int(r.start), End: int(r.end), Retention: pagedkv.Retention{
				Priority: pagedkv.Priority(r.priority), Duration: time.Duration(r.duration_ms) * time.Millisecond,
				Ephemeral: r.ephemeral != 0, Session: pagedkv.Session(r.session),
			}})
		}
	}
	if err := h.m.SetRetention(pagedkv.RequestID(rid), out); err != nil {
		return failErr(err)
	}
	return C.PAGEDKV_OK
}

//export pagedkv_pin_for
func pagedkv_pin_for(id C.pagedkv_manager, ns *C.pagedkv_namespace, tokens *C.int32_t, n C.int64_t, ttlMs C.int64_t,
	pin *C.uint64_t, pinned *C.int64_t) (code C.int32_t) {
	h, code := enter(id, "pin_for")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if ttlMs < 0 || int64(ttlMs) > maxMillis {
		return badArg("pin_for: ttl_ms = %d, want 0..%d", int64(ttlMs), maxMillis)
	}
	return pinWith("pin_for", h, ns, tokens, n, time.Duration(ttlMs)*time.Millisecond, pin, pinned)
}
