package kvindex

import (
	"encoding/binary"
	"errors"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// seedPayloads are valid payloads in both event forms, written with the
// generic msgpack encoder.
func seedPayloads(t testing.TB) [][]byte {
	stored := map[string]any{"type": "BlockStored", "block_hashes": []uint64{1 << 63, 7}, "parent_block_hash": nil,
		"token_ids": []int{1, 2, 3, 4, 5, 6, 7, 8}, "block_size": 4, "lora_id": nil, "medium": "GPU", "lora_name": "a",
		"extra_keys": []any{nil, []any{map[string]any{"type": "lora", "name": "a"}}}, "group_idx": 0}
	removed := map[string]any{"type": "BlockRemoved", "block_hashes": []any{[]byte("0123456789"), uint64(7)}, "medium": "CPU"}
	cleared := map[string]any{"type": "AllBlocksCleared"}
	legacy := []any{"BlockStored", []uint64{9}, uint64(7), []int{1, 2, 3, 4}, 4, nil, "GPU"}
	// A hybrid stream: the same blocks under two groups, one group's
	// removal (map and array form, the array's group_idx positional).
	stored1 := map[string]any{"type": "BlockStored", "block_hashes": []uint64{1 << 63, 7}, "parent_block_hash": nil,
		"token_ids": []int{1, 2, 3, 4, 5, 6, 7, 8}, "block_size": 4, "medium": "GPU", "group_idx": 1,
		"kv_cache_spec_kind": "sliding_window", "kv_cache_spec_sliding_window": 128}
	removed1 := []any{"BlockRemoved", []uint64{7}, "GPU", 1}
	storedArr := []any{"BlockStored", []uint64{9}, nil, []int{1, 2, 3, 4}, 4, nil, "GPU", nil, nil, 2}
	// A state group's checkpoint (kv_cache_spec_kind "mamba"), its
	// parent in no group; and the array form with the kind positional.
	ckpt := map[string]any{"type": "BlockStored", "block_hashes": []uint64{7}, "parent_block_hash": uint64(1 << 63),
		"token_ids": []int{5, 6, 7, 8}, "block_size": 4, "medium": "GPU", "group_idx": 2, "kv_cache_spec_kind": "mamba"}
	ckptArr := []any{"BlockStored", []uint64{9}, nil, []int{1, 2, 3, 4}, 4, nil, "GPU", nil, nil, 3, "mamba"}
	var out [][]byte
	for _, b := range []any{
		[]any{1.5, []any{stored, removed, cleared}, 0},
		[]any{2.0, []any{legacy, []any{"BlockRemoved", []uint64{9}}, []any{"AllBlocksCleared"}}},
		[]any{3.0, []any{}, nil},
		[]any{4.0, []any{stored, stored1, removed1, storedArr}, 0},
		[]any{5.0, []any{stored, stored1, ckpt, ckptArr, removed1}, 0},
	} {
		p, err := msgpack.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

func TestDecodeSeeds(t *testing.T) {
	for i, p := range seedPayloads(t) {
		b, err := DecodeBatch(p)
		if err != nil {
			t.Fatalf("seed %d: %v", i, err)
		}
		if i == 0 && (len(b.Events) != 3 || b.Events[0].LoRAName != "a" || !b.Events[0].HasGroup || b.Events[0].HasParent ||
			b.Events[1].Hashes[0] != binary.BigEndian.Uint64([]byte("23456789")) || b.Events[1].Medium != "CPU") {
			t.Fatalf("seed 0 decoded as %+v", b)
		}
		if i == 1 && (!b.Events[0].HasParent || b.Events[0].Parent != 7 || b.Events[1].Kind != BlockRemoved) {
			t.Fatalf("seed 1 decoded as %+v", b)
		}
		if i == 4 && (b.Events[1].State || !b.Events[2].State || !b.Events[3].State || b.Events[3].Group != 3) {
			t.Fatalf("seed 4 (state checkpoints) decoded as %+v", b)
		}
	}
	// Each malformed payload is refused with an error naming the value.
	for _, bad := range []any{
		[]any{1.0},
		[]any{"x", []any{}},
		[]any{1.0, []any{map[string]any{"type": "BlockStored", "block_hashes": []int{1}, "token_ids": []int{1, 2}, "block_size": 4}}},
		[]any{1.0, []any{map[string]any{"type": "Nope"}}},
		[]any{1.0, []any{map[string]any{"block_hashes": []int{1}}}},
		[]any{1.0, []any{map[string]any{"type": "BlockRemoved", "block_hashes": []int{}}}},
		[]any{1.0, []any{map[string]any{"type": "BlockStored", "block_hashes": []int{1}, "token_ids": []int{-1}, "block_size": 1}}},
	} {
		p, _ := msgpack.Marshal(bad)
		if _, err := DecodeBatch(p); !errors.Is(err, ErrDecode) {
			t.Errorf("%v: err = %v, want ErrDecode", bad, err)
		}
	}
}

// FuzzDecode feeds raw bytes as a PUB message (topic, sequence, payload)
// and as a replay reply; decoding never panics, a decoded batch is well
// formed, and applying it to an index either succeeds or fails leaving the
// index as it was. Applied to an index capped at fuzzMaxBlocks entries a
// replica and already 2 short of it, a batch leaves at most the cap, a
// subset of what the uncapped index holds, and every group's map within
// the room compact allows; Apply allocates at most checkApplyAllocs'
// bound, linear in the batch's hashes and groups (so, with the decoder's
// bound, in the payload's bytes). Decoding allocates at most c = DecodeAllocPerByte (10)
// bytes per payload byte plus DecodeAllocOverhead (4 KiB), measured for
// every input as the growth of runtime.MemStats.TotalAlloc around
// DecodeBatch (checkDecodeAllocs; the process's count, so fuzz with
// -parallel 1 for an exact figure; a worker's own background allocations
// are within the constant).
func FuzzDecode(f *testing.F) {
	for _, p := range seedPayloads(f) {
		f.Add([]byte("kv-events"), binary.BigEndian.AppendUint64(nil, 3), p)
	}
	f.Add([]byte{}, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, []byte{})
	f.Add([]byte{}, []byte{1}, []byte{0x93, 0xcb})
	for _, code := range hugeFieldCodes {
		f.Add([]byte("kv-events"), binary.BigEndian.AppendUint64(nil, 4), hugeUnknownField(code))
	}
	f.Add([]byte("kv-events"), binary.BigEndian.AppendUint64(nil, 5), capSeed(f))
	f.Fuzz(func(t *testing.T, topic, seq, payload []byte) {
		if _, err := ParseMessage([][]byte{topic, seq, payload}); (err == nil) != (len(seq) == 8) {
			t.Fatalf("ParseMessage with a %d-byte sequence: %v", len(seq), err)
		}
		for _, frames := range [][][]byte{{nil, topic, seq, payload}, {seq, payload}, {topic, seq, payload}} {
			_, _, _ = parseReply(frames)
		}
		measuredErr := checkDecodeAllocs(t, payload)
		b, err := DecodeBatch(payload)
		if (err == nil) != (measuredErr == nil) {
			t.Fatalf("decoding the same payload twice: %v, then %v", measuredErr, err)
		}
		if err != nil {
			if !errors.Is(err, ErrDecode) {
				t.Fatalf("error %v is not ErrDecode", err)
			}
			return
		}
		for _, e := range b.Events {
			if err := e.check(); err != nil {
				t.Fatalf("decoded an ill-formed event: %v", err)
			}
		}
		ix, err := New(Config{PageSize: 4, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		r := ix.AddReplica("r")
		if err := ix.Apply(r, &Batch{Events: []Event{{Kind: BlockStored, Hashes: []uint64{1}, BlockSize: 4, Tokens: make([]int32, 4)}}}); err != nil {
			t.Fatal(err)
		}
		before, groupsBefore, stBefore := ix.Blocks(r), ix.Groups(r), ix.Stats(r)
		if err := ix.Apply(r, &b); err != nil {
			if !errors.Is(err, ErrBadEvent) {
				t.Fatalf("apply: %v", err)
			}
			if after := ix.Blocks(r); !slices.Equal(before, after) || !slices.Equal(groupsBefore, ix.Groups(r)) || ix.Stats(r) != stBefore {
				t.Fatalf("a refused batch changed the index: %v -> %v, groups %v -> %v", before, after, groupsBefore, ix.Groups(r))
			}
			return
		}
		checkGroups(t, ix, r, b)
		checkCapped(t, b)
	})
}

// fuzzMaxBlocks is the cap of FuzzDecode's capped index: above shrinkMin,
// so that removals can make compact rebuild a map.
const fuzzMaxBlocks = 2 * shrinkMin

// cappedFuzzIndex is an index capped at fuzzMaxBlocks (or uncapped) whose
// one replica holds blocks 1..fuzzMaxBlocks-2 in group 0 on the GPU.
func cappedFuzzIndex(t testing.TB, maxBlocks int) *Index {
	ix, err := New(Config{PageSize: 4, Seed: 1, MaxBlocks: maxBlocks})
	if err != nil {
		t.Fatal(err)
	}
	r := ix.AddReplica("r")
	hs := make([]uint64, fuzzMaxBlocks-2)
	for i := range hs {
		hs[i] = uint64(i + 1)
	}
	if err := ix.Apply(r, &Batch{Events: []Event{{Kind: BlockStored, Hashes: hs, BlockSize: 4, Tokens: make([]int32, 4*len(hs))}}}); err != nil {
		t.Fatal(err)
	}
	return ix
}

// capSeed is a payload that fills the capped index past its cap, removes
// most of its blocks (a compaction), and stores in a second group.
func capSeed(t testing.TB) []byte {
	var fill, drop []uint64
	for h := range uint64(100) {
		fill = append(fill, 1000+h)
		drop = append(drop, 1+h)
	}
	p, err := msgpack.Marshal([]any{1.0, []any{
		map[string]any{"type": "BlockStored", "block_hashes": fill, "token_ids": make([]int, 4*len(fill)), "block_size": 4},
		map[string]any{"type": "BlockRemoved", "block_hashes": drop},
		map[string]any{"type": "BlockStored", "block_hashes": fill[:8], "token_ids": make([]int, 32), "block_size": 4, "group_idx": 3, "medium": "CPU"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// applyAllocBound is what Apply may allocate for a batch: a constant, per
// group the batch names (a group, its map, its slot in the replica's
// list), and per hash of its BlockStored and BlockRemoved events (a map
// grows to at most twice its entries, and compact copies at most one
// entry for every one removed).
func applyAllocBound(b *Batch) uint64 {
	const overhead, perGroup, perHash = 4 << 10, 1 << 10, 64
	groups := map[int]bool{}
	hashes := 0
	for _, e := range b.Events {
		if e.Kind != AllBlocksCleared {
			groups[e.Group] = true
			hashes += len(e.Hashes)
		}
	}
	return uint64(overhead + perGroup*len(groups) + perHash*hashes)
}

// checkCapped applies b (which an uncapped index took) to a capped index
// near its cap and checks the cap, the subset and the room, and Apply's
// allocations (the least of decodeMeasurements runs on fresh indexes).
func checkCapped(t *testing.T, b Batch) {
	ref := cappedFuzzIndex(t, 0)
	if err := ref.Apply(0, &b); err != nil {
		t.Fatalf("the uncapped index refused what another took: %v", err)
	}
	bound := applyAllocBound(&b)
	var ix *Index
	var got uint64
	for i := range decodeMeasurements {
		ix = cappedFuzzIndex(t, fuzzMaxBlocks)
		var err error
		n := bytesAllocatedBy(func() { err = ix.Apply(0, &b) })
		if err != nil {
			t.Fatalf("the capped index refused what the uncapped took: %v", err)
		}
		if i == 0 || n < got {
			got = n
		}
		if got <= bound {
			break
		}
	}
	if got > bound {
		t.Fatalf("Apply allocated %d bytes, over the bound %d", got, bound)
	}
	rep, want := ix.replicas[0], ref.replicas[0]
	entries := 0
	for _, x := range rep.groups {
		entries += len(x.blocks)
		if x.peak > shrinkMin && len(x.blocks) <= x.peak/2 {
			t.Fatalf("group %d holds %d entries in a map that held %d: not compacted", x.idx, len(x.blocks), x.peak)
		}
		y := want.group(x.idx, false)
		for h, bits := range x.blocks {
			if y == nil || bits&^y.blocks[h] != 0 {
				t.Fatalf("the capped index holds group %d block %d on media %02b; the uncapped one does not", x.idx, h, bits)
			}
		}
	}
	st, refSt := ix.Stats(0), ref.Stats(0)
	if entries != rep.entries || entries > fuzzMaxBlocks || st.GroupBlocks != entries {
		t.Fatalf("the capped index holds %d entries (counted %d, stats %d); the cap is %d", entries, rep.entries, st.GroupBlocks, fuzzMaxBlocks)
	}
	if st.OverCap == 0 && refSt.GroupBlocks != st.GroupBlocks {
		t.Fatalf("the capped index holds %d entries, the uncapped %d, and none was over the cap", st.GroupBlocks, refSt.GroupBlocks)
	}
}

// checkGroups checks an index's per-group invariants after it applied b:
// every group_idx of b is known, Blocks is the union of the groups'
// blocks, and a chain's match is at most every group's contiguous match
// and equal to the least of them.
func checkGroups(t *testing.T, ix *Index, r int, b Batch) {
	groups := ix.Groups(r)
	for i, e := range b.Events {
		if e.Kind != AllBlocksCleared && !slices.Contains(groups, e.Group) {
			t.Fatalf("event %d's group %d is not among the replica's groups %v", i, e.Group, groups)
		}
	}
	var union []uint64
	entries := 0
	for _, g := range groups {
		gb := ix.GroupBlocks(r, g)
		union = append(union, gb...)
		entries += len(gb)
	}
	slices.Sort(union)
	union = slices.Compact(union)
	if got := ix.Blocks(r); !slices.Equal(got, union) {
		t.Fatalf("Blocks %v, the union of the groups %v", got, union)
	}
	if st := ix.Stats(r); st.Blocks != len(union) || st.GroupBlocks != entries || st.Groups != len(groups) {
		t.Fatalf("stats %+v: %d distinct blocks, %d entries, %d groups", st, len(union), entries, len(groups))
	}
	// A chain of the event's hashes in order, then of every indexed hash.
	for _, chain := range [][]uint64{eventChain(b), union} {
		want := len(chain)
		for _, g := range groups {
			held := ix.GroupBlocks(r, g)
			d := 0
			for d < len(chain) && slices.Contains(held, chain[d]) {
				d++
			}
			want = min(want, d)
		}
		if len(groups) == 0 {
			want = 0
		}
		if got := ix.MatchHashes(nil, chain)[0]; got != want*ix.pageSize {
			t.Fatalf("chain %v matched %d tokens; the least group match is %d pages", chain, got, want)
		}
	}
}

func eventChain(b Batch) []uint64 {
	var chain []uint64
	for _, e := range b.Events {
		chain = append(chain, e.Hashes...)
	}
	return chain
}
