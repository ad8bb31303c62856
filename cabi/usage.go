package main

/*
#include <stdlib.h>
#include <string.h>
#define PAGEDKV_NO_PROTOTYPES
#include "pagedkv.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/pagedkv/pagedkv"
)

// The cache reads and writes of a request and of the pool
// (pagedkv.CacheUsage; docs/c-abi.md, "Cache usage").

// usageFields are pagedkv_cache_usage's fields in order.
func usageFields(u pagedkv.CacheUsage, dropped int64) [7]int64 {
	return [7]int64{u.ReadTokens(), u.DeviceReadTokens, u.HostReadTokens, u.DiskReadTokens, u.RemoteReadTokens, u.WriteTokens, dropped}
}

//export pagedkv_get_cache_usage
func pagedkv_get_cache_usage(id C.pagedkv_manager, rid C.uint64_t, out *C.pagedkv_cache_usage, size C.size_t) (code C.int32_t) {
	h, code := enter(id, "cache_usage")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if out == nil {
		return badArg("cache_usage: out is NULL")
	}
	u, ok := h.m.CacheUsage(pagedkv.RequestID(rid))
	if !ok {
		return failErr(fmt.Errorf("%w: cache_usage of request %d: not held, or released and already read (or one of more than %d released unread)",
			pagedkv.ErrUnknownRequest, uint64(rid), pagedkv.KeptCacheUsages))
	}
	v := usageFields(u, 0)
	writeInt64s(unsafe.Pointer(out), size, v[:])
	return C.PAGEDKV_OK
}

//export pagedkv_get_cache_usage_totals
func pagedkv_get_cache_usage_totals(id C.pagedkv_manager, out *C.pagedkv_cache_usage, size C.size_t) (code C.int32_t) {
	defer recoverTo(&code)
	s, code, ok := snapshot(id, "cache_usage_totals", unsafe.Pointer(out))
	if !ok {
		return code
	}
	v := usageFields(s.CacheUsage, s.CacheUsageDropped)
	if unsafe.Sizeof(v) != C.sizeof_pagedkv_cache_usage {
		panic("cabi: pagedkv_cache_usage and usageFields have different field counts")
	}
	writeInt64s(unsafe.Pointer(out), size, v[:])
	return C.PAGEDKV_OK
}
