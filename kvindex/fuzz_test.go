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
	var out [][]byte
	for _, b := range []any{
		[]any{1.5, []any{stored, removed, cleared}, 0},
		[]any{2.0, []any{legacy, []any{"BlockRemoved", []uint64{9}}, []any{"AllBlocksCleared"}}},
		[]any{3.0, []any{}, nil},
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
// and as a replay reply; decoding never panics or allocates beyond the
// input, a decoded batch is well formed, and applying it to an index either
// succeeds or fails leaving the index as it was.
func FuzzDecode(f *testing.F) {
	for _, p := range seedPayloads(f) {
		f.Add([]byte("kv-events"), binary.BigEndian.AppendUint64(nil, 3), p)
	}
	f.Add([]byte{}, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, []byte{})
	f.Add([]byte{}, []byte{1}, []byte{0x93, 0xcb})
	f.Fuzz(func(t *testing.T, topic, seq, payload []byte) {
		if _, err := ParseMessage([][]byte{topic, seq, payload}); (err == nil) != (len(seq) == 8) {
			t.Fatalf("ParseMessage with a %d-byte sequence: %v", len(seq), err)
		}
		for _, frames := range [][][]byte{{nil, topic, seq, payload}, {seq, payload}, {topic, seq, payload}} {
			_, _, _ = parseReply(frames)
		}
		b, err := DecodeBatch(payload)
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
		before := ix.Blocks(r)
		if err := ix.Apply(r, &b); err != nil {
			if !errors.Is(err, ErrBadEvent) {
				t.Fatalf("apply: %v", err)
			}
			if after := ix.Blocks(r); !slices.Equal(before, after) {
				t.Fatalf("a refused batch changed the index: %v -> %v", before, after)
			}
		}
	})
}
