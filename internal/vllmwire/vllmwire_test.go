package vllmwire

import (
	"encoding/binary"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func payload(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func stored(extra map[string]any) map[string]any {
	m := map[string]any{"type": "BlockStored", "block_hashes": []uint64{1 << 63, 5}, "parent_block_hash": nil,
		"token_ids": []int{1, 2, 3, 4}, "block_size": 2, "lora_id": nil, "medium": "GPU", "lora_name": nil}
	for k, v := range extra {
		if v == "DELETE" {
			delete(m, k)
			continue
		}
		m[k] = v
	}
	return m
}

// The oracle must accept vLLM's format and refuse what vLLM's decoder
// would refuse (or what vLLM never sends), or it could not catch an
// encoder bug.
func TestDecodeAcceptsAndRefuses(t *testing.T) {
	good := payload(t, []any{1.5, []any{stored(nil), map[string]any{"type": "BlockRemoved", "block_hashes": []uint64{5}, "medium": "GPU"},
		map[string]any{"type": "AllBlocksCleared"}}, 0})
	b, err := Decode(good)
	if err != nil || len(b.Events) != 3 || b.Events[0].BlockHashes[0] != 1<<63 || *b.DPRank != 0 {
		t.Fatalf("%+v, %v", b, err)
	}
	s := Set{}
	if err := s.Apply(b); err != nil || len(s) != 0 {
		t.Fatalf("apply: %v, %d left", err, len(s))
	}
	for name, bad := range map[string]any{
		"batch as a map":         map[string]any{"ts": 1.0, "events": []any{}},
		"integer ts":             []any{1, []any{}, 0},
		"array-form event":       []any{1.0, []any{[]any{"BlockStored", []uint64{1}, nil, []int{1, 2}, 2, nil, "GPU"}}, 0},
		"missing lora_name":      []any{1.0, []any{stored(map[string]any{"lora_name": "DELETE"})}, 0},
		"unknown field":          []any{1.0, []any{stored(map[string]any{"extra": 1})}, 0},
		"tokens != blocks*size":  []any{1.0, []any{stored(map[string]any{"token_ids": []int{1, 2, 3}})}, 0},
		"unknown tag":            []any{1.0, []any{map[string]any{"type": "BlockMoved"}}, 0},
		"removed without medium": []any{1.0, []any{map[string]any{"type": "BlockRemoved", "block_hashes": []uint64{1}}}, 0},
	} {
		if _, err := Decode(payload(t, bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := ParseMessage([][]byte{[]byte("t"), {1, 2}, good}); err == nil {
		t.Error("a 2-byte sequence frame was accepted")
	}
	if m, err := ParseMessage([][]byte{[]byte("t"), binary.BigEndian.AppendUint64(nil, 9), good}); err != nil || m.Seq != 9 {
		t.Errorf("%+v %v", m, err)
	}
	// A stream that removes what it never stored is inconsistent.
	orphan := payload(t, []any{1.0, []any{map[string]any{"type": "BlockRemoved", "block_hashes": []uint64{7}, "medium": "GPU"}}, 0})
	ob, err := Decode(orphan)
	if err != nil {
		t.Fatal(err)
	}
	if err := (Set{}).Apply(ob); err == nil {
		t.Error("removing an unknown block was accepted")
	}
}

// Media keeps one set per medium: the GPU's chains must be closed under
// parents, the CPU's need not be; Set refuses other media.
func TestMediaApply(t *testing.T) {
	gpu, cpu := "GPU", "CPU"
	p := uint64(1)
	stored := func(m *string, parent *uint64, hs ...uint64) Event {
		return Event{Type: "BlockStored", Medium: m, ParentBlockHash: parent, BlockHashes: hs}
	}
	removed := func(m *string, hs ...uint64) Event { return Event{Type: "BlockRemoved", Medium: m, BlockHashes: hs} }
	ms := Media{}
	if err := ms.Apply(Batch{Events: []Event{stored(&cpu, &p, 2, 3), stored(nil, nil, 1), stored(&gpu, &p, 2)}}); err != nil {
		t.Fatal(err)
	}
	if len(ms["CPU"]) != 2 || len(ms["GPU"]) != 2 {
		t.Fatalf("sets %v", ms)
	}
	if err := ms.Apply(Batch{Events: []Event{stored(&gpu, &[]uint64{9}[0], 4)}}); err == nil {
		t.Fatal("a GPU block under an uncached parent was accepted")
	}
	if err := ms.Apply(Batch{Events: []Event{removed(&cpu, 1)}}); err == nil {
		t.Fatal("removing a CPU block only the GPU holds was accepted")
	}
	if err := ms.Apply(Batch{Events: []Event{removed(&cpu, 2), {Type: "AllBlocksCleared"}}}); err != nil {
		t.Fatal(err)
	}
	if len(ms["CPU"]) != 0 || len(ms["GPU"]) != 0 {
		t.Fatalf("AllBlocksCleared left %v", ms)
	}
	if err := (Set{}).Apply(Batch{Events: []Event{stored(&cpu, nil, 5)}}); err == nil {
		t.Fatal("Set took a CPU event")
	}
}
