package kvindex

import (
	"encoding/binary"
	"runtime"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// bytesAllocatedBy returns the heap bytes f allocates: the whole process's
// count, taken with GOMAXPROCS 1 (as testing.AllocsPerRun does) so that
// other goroutines rarely run meanwhile; tests that use it run alone.
func bytesAllocatedBy(f func()) uint64 {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// decodeMeasurements is how many times checkDecodeAllocs decodes a payload
// over the bound before it fails: the least count is DecodeBatch's own.
// Under -fuzz the worker's goroutine that talks to the coordinator may
// allocate during a measurement (6,568 bytes were seen once for a 66-byte
// payload that costs 992-1,256); the decoder allocates the same on every
// run (a sync.Pool refilled after a GC adds a few hundred bytes).
const decodeMeasurements = 3

// decodeAllocBound is what DecodeBatch may allocate for a payload of n bytes.
func decodeAllocBound(n int) uint64 {
	return uint64(DecodeAllocPerByte*n + DecodeAllocOverhead)
}

// checkDecodeAllocs decodes payload and fails if it allocated more than
// the stated bound; it returns the decode error.
func checkDecodeAllocs(t testing.TB, payload []byte) error {
	t.Helper()
	var err error
	bound := decodeAllocBound(len(payload))
	got := bytesAllocatedBy(func() { _, err = DecodeBatch(payload) })
	for range decodeMeasurements - 1 {
		if got <= bound {
			break
		}
		got = min(got, bytesAllocatedBy(func() { _, err = DecodeBatch(payload) }))
	}
	if got > bound {
		t.Fatalf("decoding %d bytes allocated %d bytes, over the bound %d (%d per byte + %d): err %v",
			len(payload), got, bound, DecodeAllocPerByte, DecodeAllocOverhead, err)
	}
	return err
}

// hugeFieldCodes are the msgpack codes of hugeUnknownField: str32, bin32,
// ext32.
var hugeFieldCodes = []byte{0xdb, 0xc6, 0xc9}

// hugeUnknownField is a 41-byte (42 with ext32's type byte) payload whose
// one event has an unknown field declared as a 1 MiB value of the given
// code and no body: [1.0, [{"type": "AllBlocksCleared", "x": <code> 2^20}]].
func hugeUnknownField(code byte) []byte {
	p := []byte{0x92, 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0, 0x91, 0x82, 0xa4, 't', 'y', 'p', 'e', 0xb0}
	p = append(p, "AllBlocksCleared"...)
	p = append(p, 0xa1, 'x', code)
	p = binary.BigEndian.AppendUint32(p, 1<<20)
	if code == 0xc9 {
		p = append(p, 1) // the extension type
	}
	return p
}

// An unknown field declared as a 1 MiB str32 (or ext32, or bin32) in a
// 41-byte message: the library's Skip allocated the declared length
// before finding the input short.
func TestUnknownHugeFieldAllocatesNothing(t *testing.T) {
	for _, code := range hugeFieldCodes {
		p := hugeUnknownField(code)
		if err := checkDecodeAllocs(t, p); err == nil {
			t.Fatalf("code %#x: a %d-byte payload declaring 1 MiB decoded", code, len(p))
		}
		// The same field, present in full, is skipped.
		whole := append(append([]byte{}, p...), make([]byte, 1<<20)...)
		if err := checkDecodeAllocs(t, whole); err != nil {
			t.Fatalf("code %#x: the whole field: %v", code, err)
		}
	}
}

// A batch of 10^6 one-byte hashes costs 8 bytes a hash (it cost 88 with a
// formatted context string per hash).
func TestMillionHashesAllocateLinearly(t *testing.T) {
	const n = 1_000_000
	// [1.0, [["BlockRemoved", [0, 1, ..., 99, 0, ...]]]], every hash a
	// positive fixint of one byte.
	p := []byte{0x92, 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0, 0x91, 0x92, 0xac}
	p = append(p, "BlockRemoved"...)
	p = binary.BigEndian.AppendUint32(append(p, 0xdd), n) // array32
	for i := range n {
		p = append(p, byte(i%100))
	}
	var b Batch
	var err error
	got := bytesAllocatedBy(func() { b, err = DecodeBatch(p) })
	if err != nil || len(b.Events) != 1 || len(b.Events[0].Hashes) != n {
		t.Fatalf("decode: %v", err)
	}
	perByte := float64(got) / float64(len(p))
	t.Logf("%d bytes in, %d allocated (%.2f per byte)", len(p), got, perByte)
	if perByte > 9 {
		t.Fatalf("%.2f bytes allocated per input byte, want at most 9 (8 a one-byte hash)", perByte)
	}
}

// Every seed and a hostile collection stay within the stated bound.
func TestDecodeAllocatesWithinItsBound(t *testing.T) {
	for _, p := range seedPayloads(t) {
		if err := checkDecodeAllocs(t, p); err != nil {
			t.Fatal(err)
		}
	}
	// Many of the shortest events, and a deep nest of unknown arrays.
	var many []any
	for range 10000 {
		many = append(many, []any{"BlockRemoved", []uint64{1}})
	}
	p, _ := msgpack.Marshal([]any{1.0, many})
	if err := checkDecodeAllocs(t, p); err != nil {
		t.Fatal(err)
	}
	var nest any = 1
	for range 15 {
		nest = []any{nest, nest}
	}
	p, _ = msgpack.Marshal([]any{1.0, []any{map[string]any{"type": "AllBlocksCleared", "deep": nest}}})
	if err := checkDecodeAllocs(t, p); err != nil {
		t.Fatal(err)
	}
}
