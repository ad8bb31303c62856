package redis

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"strings"
	"testing"
	"time"

	"github.com/pagedkv/pagedkv/internal/heaptest"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/tier"
)

// decodeAllocBound is what decoding and verifying a value of n bytes may
// allocate: Decode copies the namespace, group and tokens (disjoint parts
// of the n bytes), and Verify's errors quote at most 64 bytes of the
// value's strings and no tokens (quoting a 64 KiB namespace with %q once
// cost 27 bytes per byte). The factor 2 covers size-class rounding, the
// constant the fixed-size errors.
func decodeAllocBound(n int) uint64 { return 2*uint64(n) + 4096 }

// withCRC returns b with its last 4 bytes replaced by the CRC-32C of the
// rest, so the fuzzer's mutations reach the parser behind the checksum.
func withCRC(b []byte) []byte {
	if len(b) < 4 {
		return b
	}
	body := b[:len(b)-4]
	return binary.LittleEndian.AppendUint32(append([]byte(nil), body...), crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)))
}

// FuzzDecodeValue feeds raw bytes to the value decoder, as a Redis server
// (or whoever wrote the key) might return them, once as they are and once
// with a correct checksum. Decode must never panic or allocate from a
// length it has not checked: decoding and verifying n bytes allocates at
// most decodeAllocBound(n), measured on every input. Whatever it accepts
// must re-encode to exactly the same bytes (one encoding per value), and
// a value verifies as the wanted page only if it is that page's encoding
// but for the page bytes.
func FuzzDecodeValue(f *testing.F) {
	fm := tier.PageFormat{Layout: layout.NHD, DType: layout.F16, PageSize: 2, NumKVHeads: 1, HeadDim: 2, Layers: 1}
	want := tier.RemotePage{Tokens: []int32{5, 6}, Data: []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}}
	want.Parent = tier.NamespaceRoot("", "", "")
	want.Digest = tier.Next(nil, want.Parent, want.Tokens)
	good, err := Encode(nil, fm, "ns", "all", &want)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(good)-1])
	f.Add([]byte("PKVP"))
	f.Add([]byte{})
	other := want
	other.Tokens = []int32{5, 7}
	foreign, _ := Encode(nil, fm, "other", "all", &other)
	f.Add(foreign)
	// The costliest error: a foreign namespace of bytes %q escapes (27
	// bytes allocated per byte before errors cut what they quote).
	escaped, _ := Encode(nil, fm, strings.Repeat("\xff", 60000), "all", &want)
	f.Add(escaped)
	// A value with a retention field (flags bit 0x02).
	kept := want
	kept.Retention = tier.Retention{Priority: 2, Hint: 2, Duration: time.Minute, Left: time.Second}
	withRet, _ := tier.EncodeValueAt(nil, fm, "ns", "all", &kept, time.Unix(7, 0))
	f.Add(withRet)
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, in := range [][]byte{b, withCRC(b)} {
			checkDecode(t, in, fm, &want)
		}
	})
}

// checkDecode decodes and verifies b as a lookup of page want (format fm,
// namespace "ns", group "all") would, and checks the allocation bound,
// the encoding's uniqueness and that only want's identity verifies.
func checkDecode(t *testing.T, b []byte, fm tier.PageFormat, want *tier.RemotePage) {
	var v Value
	var decodeErr, verifyErr error
	decode := func() {
		v, decodeErr = Decode(b, nil)
		verifyErr = decodeErr
		if decodeErr == nil {
			verifyErr = v.Verify(fm, "ns", "all", want)
		}
	}
	// The process's allocation counter also sees the fuzzing engine's
	// goroutines: a count over the bound is taken again, and only one
	// that stays over it three times (decoding is deterministic) fails.
	alloc := heaptest.Growth(decode)
	for try := 1; try < 3 && alloc > decodeAllocBound(len(b)); try++ {
		alloc = min(alloc, heaptest.Growth(decode))
	}
	if alloc > decodeAllocBound(len(b)) {
		t.Fatalf("decoding and verifying %d bytes allocated %d bytes, over the bound of %d", len(b), alloc, decodeAllocBound(len(b)))
	}
	if decodeErr != nil {
		return
	}
	p := tier.RemotePage{Digest: v.Digest, Parent: v.Parent, Tokens: v.Tokens, Data: v.Data}
	var at time.Time
	p.Retention, at = v.Retention.Whole()
	again, err := tier.EncodeValueAt(nil, v.Format, v.Namespace, v.Group, &p, at)
	if err != nil {
		t.Fatalf("decoded value does not encode: %v", err)
	}
	if !bytes.Equal(again, b) {
		t.Fatalf("decode/encode is not the identity:\n in  %x\n out %x", b, again)
	}
	if verifyErr == nil {
		// Only the page bytes may differ from the wanted page's own
		// encoding: Verify checks every field of the identity. (The
		// bytes themselves cannot be checked against the digest, which
		// covers the tokens: see "Trust" in docs/tiers.md.)
		ident := *want
		ident.Data = v.Data
		ident.Retention = p.Retention
		if same, _ := tier.EncodeValueAt(nil, fm, "ns", "all", &ident, at); !bytes.Equal(same, b) {
			t.Fatalf("a value of another identity verified: %x", b)
		}
	}
}
