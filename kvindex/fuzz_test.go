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
	var out [][]byte
	for _, b := range []any{
		[]any{1.5, []any{stored, removed, cleared}, 0},
		[]any{2.0, []any{legacy, []any{"BlockRemoved", []uint64{9}}, []any{"AllBlocksCleared"}}},
		[]any{3.0, []any{}, nil},
		[]any{4.0, []any{stored, stored1, removed1, storedArr}, 0},
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
// index as it was. Decoding allocates at most c = DecodeAllocPerByte (10)
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
	})
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
