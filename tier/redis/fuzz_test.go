package redis

import (
	"bytes"
	"testing"

	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/tier"
)

// FuzzDecodeValue feeds raw bytes to the value decoder, as a Redis server
// (or whoever wrote the key) might return them. Decode must never panic
// or allocate from a length it has not checked; whatever it accepts must
// re-encode to exactly the same bytes (one encoding per value), and a
// value verifies as the wanted page only if its bytes are that page's
// encoding.
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
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := Decode(b, nil)
		if err != nil {
			return
		}
		p := tier.RemotePage{Digest: v.Digest, Parent: v.Parent, Tokens: v.Tokens, Data: v.Data}
		again, err := Encode(nil, v.Format, v.Namespace, v.Group, &p)
		if err != nil {
			t.Fatalf("decoded value does not encode: %v", err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("decode/encode is not the identity:\n in  %x\n out %x", b, again)
		}
		if v.Verify(fm, "ns", "all", &want) == nil && !bytes.Equal(b, good) {
			t.Fatalf("a value other than the page's encoding verified: %x", b)
		}
	})
}
