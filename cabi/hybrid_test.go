package main

import (
	"slices"
	"strings"
	"testing"
)

// hybridGroups is a model with every kind of group a step must export: a
// sliding window, chunked local attention and full attention.
var hybridGroups = []abiGroup{{Kind: 1, WindowTokens: 32, NumLayers: 1}, {Kind: 2, ChunkTokens: 32, NumLayers: 1}, {NumLayers: 1}}

// hybridDecodeABI is decodeABI for a hybrid handle: n requests of 64
// prompt tokens, prefilled, and the out arguments of a hybrid reserve in C
// memory.
func hybridDecodeABI(t testing.TB, n int) (h uint64, ids []uint64, ones, sampled []int32, plan cHybridPlan) {
	h, code := goHybridCreate(abiConfig{NumPages: int64(n) * 64, PageSize: 16, HashSeed: 1, BlockTablesStride: 64}, hybridGroups)
	if code != codeOK {
		t.Fatalf("hybrid_create: code %d: %s", code, goLastError())
	}
	ids, ones, sampled, nt := addDecodeRequests(t, h, n)
	plan = newCHybridPlan(len(hybridGroups))
	if goHybridReserveC(h, ids, nt, int64(n), plan) != codeOK || goCommit(h, sampled, int64(n)) != codeOK {
		t.Fatal("prefill failed")
	}
	return h, ids, ones, sampled, plan
}

// TestABIHybridStepIsAllocationFree: a hybrid decode step through
// pagedkv_hybrid_reserve and pagedkv_commit allocates nothing once the
// buffers have grown, across window releases and chunk boundaries.
func TestABIHybridStepIsAllocationFree(t *testing.T) {
	h, ids, ones, sampled, plan := hybridDecodeABI(t, 32)
	defer goDestroy(h)
	defer plan.free()
	checkStepAllocs(t, "a hybrid decode step through the C ABI", func() {
		if goHybridReserveC(h, ids, ones, int64(len(ids)), plan) != codeOK || goCommit(h, sampled, int64(len(ids))) != codeOK {
			t.Fatalf("step failed: %s", goLastError())
		}
	})
	copies, groups := plan.read()
	if len(copies) != 0 || len(groups) != 3 || groups[0].WindowLeft != 31 || groups[1].WindowLeft != -1 ||
		len(groups[1].Hybrid["attn_requests"]) != len(ids) || groups[0].Hybrid["attn_requests"] != nil {
		t.Fatalf("the plan read back is wrong: copies %v, %d groups, %+v", copies, len(groups), groups)
	}
}

// TestHybridStaleCallerMemoryIsNeverShaded is TestStaleCallerMemoryIsNeverShaded
// for the hybrid out arguments: every word of the copies descriptor and of
// every group plan holds a freed Go object's address before each reserve,
// while collections run back to back.
func TestHybridStaleCallerMemoryIsNeverShaded(t *testing.T) {
	h, ids, ones, _, plan := hybridDecodeABI(t, 8)
	defer goDestroy(h)
	defer plan.free()
	reserveOverStaleWords(t, h, 5000, plan.fillWords, func() int32 { return goHybridReserveC(h, ids, ones, int64(len(ids)), plan) }, func(i int) {
		_, groups := plan.read()
		for g, gp := range groups {
			if gp.BatchSize != int64(len(ids)) || len(gp.Arrays["kv_indptr"]) != len(ids)+1 {
				t.Fatalf("step %d group %d: the plan read back is wrong: batch %d, kv_indptr %v", i, g, gp.BatchSize, gp.Arrays["kv_indptr"])
			}
			// The padded table names the CSR's pages, row by row.
			bt, stride, _, code := goBlockTables(h, int64(g))
			indptr, pages := gp.Arrays["kv_indptr"], gp.Arrays["kv_page_indices"]
			if code != codeOK || stride != 64 || len(bt) != len(ids)*64 {
				t.Fatalf("step %d group %d: block_tables of %d entries, stride %d, code %d", i, g, len(bt), stride, code)
			}
			for b := range ids {
				row := bt[b*64 : (b+1)*64]
				n := int(indptr[b+1] - indptr[b])
				if !slices.Equal(row[:n], pages[indptr[b]:indptr[b+1]]) || slices.ContainsFunc(row[n:], func(v int32) bool { return v != 0 }) {
					t.Fatalf("step %d group %d request %d: block_tables row %v, kv_page_indices %v", i, g, b, row, pages[indptr[b]:indptr[b+1]])
				}
			}
		}
	})
}

func TestABIBlockTablesBadInput(t *testing.T) {
	h, _, _, _, plan := hybridDecodeABI(t, 2)
	defer goDestroy(h)
	defer plan.free()
	for _, c := range []struct {
		call func() int32
		want string
	}{
		{func() int32 { return goBlockTablesBad(h, 3, false, 0) }, "group = 3, the manager has 3 groups"},
		{func() int32 { return goBlockTablesBad(h, -1, false, 0) }, "group = -1"},
		{func() int32 { return goBlockTablesBad(h, 0, true, 0) }, "out is NULL"},
		{func() int32 { return goBlockTablesBad(h, 0, false, 8) }, "size = 8, want sizeof(pagedkv_block_tables) = 40"},
	} {
		code := c.call()
		if msg := goLastError(); code != codeBadArgument || !strings.Contains(msg, c.want) {
			t.Errorf("code %d, message %q, want PAGEDKV_ERR_BAD_ARGUMENT and %q", code, msg, c.want)
		}
	}
}
