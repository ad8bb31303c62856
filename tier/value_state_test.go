package tier

import (
	"bytes"
	"errors"
	"testing"

	"github.com/pagedkv/pagedkv/layout"
)

// TestValueStateFlag: a state checkpoint page (RemotePage.State) is
// encoded with flags bit 0x04, decodes with Value.State and its bytes,
// verifies only as a state page, and a K/V page's value never verifies as
// a state page of the same digest (nor the other way).
func TestValueStateFlag(t *testing.T) {
	for _, f := range []PageFormat{
		{Layout: layout.NHD, DType: layout.F16, PageSize: 2, NumKVHeads: 1, HeadDim: 4, Layers: 2},
		{Layout: layout.HND, DType: layout.BF16, PageSize: 2, NumKVHeads: 1, HeadDim: 4, Layers: 1, IndexerLayers: 1, IndexerTokenBytes: 132},
	} {
		p := RemotePage{Tokens: []int32{5, 6}, Data: make([]byte, f.PageBytes()), State: true}
		for i := range p.Data {
			p.Data[i] = byte(i*5 + 1)
		}
		p.Parent = NamespaceRoot("t", "", "")
		p.Digest = Next(nil, p.Parent, p.Tokens)
		b, err := EncodeValue(nil, f, "ns", "all", &p)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != EncodedValueLen(f, "ns", "all") || b[7]&valueState == 0 {
			t.Fatalf("%d bytes (want %d), flags %#x", len(b), EncodedValueLen(f, "ns", "all"), b[7])
		}
		v, err := DecodeValue(b, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !v.State || v.Format != f || !bytes.Equal(v.Data, p.Data) {
			t.Fatalf("decoded state %v format %+v (want %+v), data equal %v", v.State, v.Format, f, bytes.Equal(v.Data, p.Data))
		}
		if err := v.Verify(f, "ns", "all", &p); err != nil {
			t.Fatal(err)
		}
		kv := p
		kv.State = false
		if err := v.Verify(f, "ns", "all", &kv); !errors.Is(err, ErrForeignValue) {
			t.Fatalf("a state value verified as a K/V page of the same digest: %v", err)
		}
		kb, err := EncodeValue(nil, f, "ns", "all", &kv)
		if err != nil || kb[7]&valueState != 0 {
			t.Fatalf("K/V value: %v, flags %#x", err, kb[7])
		}
		kvv, err := DecodeValue(kb, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := kvv.Verify(f, "ns", "all", &p); !errors.Is(err, ErrForeignValue) {
			t.Fatalf("a K/V value verified as a state page of the same digest: %v", err)
		}
		off := ValueDataOffset(f, "ns", "all")
		if pv, err := DecodeValueParts(b[:off], b[off:len(b)-4], b[len(b)-4:], nil, "ns", "all"); err != nil || !pv.State {
			t.Fatalf("parts: state %v, %v", pv.State, err)
		}
		// Flipping the state bit breaks the checksum.
		b[7] ^= valueState
		if _, err := DecodeValue(b, nil); !errors.Is(err, ErrCorruptValue) {
			t.Fatalf("flipped state bit: %v", err)
		}
	}
}
