package main

/*
#include <stdlib.h>
#define PAGEDKV_NO_PROTOTYPES
#include "pagedkv.h"
*/
import "C"

import "unsafe"

// The state-group calls for the tests (test files cannot use cgo types).

// layerGroupWordsGo is sizeof(pagedkv_layer_group) in int64 words, and
// layerGroupWordsV1 its earlier size (group_size may be either).
const (
	layerGroupWordsGo = int(C.sizeof_pagedkv_layer_group / 8)
	layerGroupWordsV1 = int(layerGroupSizeV1 / 8)
)

// goHybridCreateWords calls pagedkv_hybrid_create with cfg and a
// state_checkpoint_every, and n groups given as raw int64 words of
// groupWords each (layerGroupWordsGo or layerGroupWordsV1), in C memory.
func goHybridCreateWords(cfg abiConfig, every int64, words []int64, n, groupWords int) (uint64, int32) {
	c := cfg.c()
	c.state_checkpoint_every = C.int64_t(every)
	gs := C.calloc(C.size_t(max(len(words), 1)), 8)
	defer C.free(gs)
	copy(unsafe.Slice((*int64)(gs), max(len(words), 1)), words)
	var h C.pagedkv_manager
	code := pagedkv_hybrid_create(&c, C.sizeof_pagedkv_config, (*C.pagedkv_layer_group)(gs), C.int64_t(n),
		C.size_t(8*groupWords), &h)
	return uint64(h), int32(code)
}

// goStateIndices is pagedkv_hybrid_state_indices' array (a copy).
func goStateIndices(h uint64, g int64) ([]int32, int32) {
	var a C.pagedkv_array
	code := pagedkv_hybrid_state_indices(C.pagedkv_manager(h), C.int64_t(g), &a)
	if code != C.PAGEDKV_OK || a.len == 0 {
		return nil, int32(code)
	}
	return append([]int32(nil), unsafe.Slice((*int32)(unsafe.Pointer(a.data)), int(a.len))...), int32(code)
}

// goNextStateCheckpoint is pagedkv_hybrid_next_state_checkpoint.
func goNextStateCheckpoint(h, id uint64) (int64, int32) {
	var v C.int64_t
	code := pagedkv_hybrid_next_state_checkpoint(C.pagedkv_manager(h), C.uint64_t(id), &v)
	return int64(v), int32(code)
}
