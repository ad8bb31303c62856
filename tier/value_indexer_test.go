package tier

import (
	"bytes"
	"errors"
	"testing"

	"github.com/pagedkv/pagedkv/layout"
)

// TestValueIndexerFormat: a page format with indexer pages (DeepSeek
// sparse attention) is encoded with its indexer geometry (flag 1 and two
// more fields) and decodes to the same format and bytes; a value of the
// format without them is another deployment's; a format without indexer
// pages encodes as before (flags 0), and unknown flags are corrupt.
func TestValueIndexerFormat(t *testing.T) {
	plain := PageFormat{Layout: layout.NHD, DType: layout.F16, PageSize: 2, NumKVHeads: 1, HeadDim: 4, Layers: 2}
	withIdx := plain
	withIdx.IndexerLayers, withIdx.IndexerTokenBytes = 2, 132
	if err := withIdx.Validate(); err != nil {
		t.Fatal(err)
	}
	if got, want := withIdx.PageBytes(), plain.PageBytes()+2*2*132; got != want {
		t.Fatalf("page bytes %d, want %d", got, want)
	}
	if got, want := withIdx.IndexerOffset(1), plain.PageBytes()+2*132; got != want {
		t.Fatalf("indexer layer 1 at %d, want %d", got, want)
	}
	p := RemotePage{Tokens: []int32{5, 6}, Data: make([]byte, withIdx.PageBytes())}
	for i := range p.Data {
		p.Data[i] = byte(i * 7)
	}
	p.Parent = NamespaceRoot("", "", "")
	p.Digest = Next(nil, p.Parent, p.Tokens)
	b, err := EncodeValue(nil, withIdx, "ns", "g0", &p)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != EncodedValueLen(withIdx, "ns", "g0") || b[7] != valueIndexer {
		t.Fatalf("%d bytes (want %d), flags %d", len(b), EncodedValueLen(withIdx, "ns", "g0"), b[7])
	}
	v, err := DecodeValue(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v.Format != withIdx || !bytes.Equal(v.Data, p.Data) {
		t.Fatalf("decoded format %+v, want %+v (data equal: %v)", v.Format, withIdx, bytes.Equal(v.Data, p.Data))
	}
	if err := v.Verify(withIdx, "ns", "g0", &p); err != nil {
		t.Fatal(err)
	}
	if err := v.VerifyDeployment(plain, "ns", "g0"); !errors.Is(err, ErrForeignValue) {
		t.Fatalf("a value with indexer pages verified as one without: %v", err)
	}
	off := ValueDataOffset(withIdx, "ns", "g0")
	if _, err := DecodeValueParts(b[:off], b[off:len(b)-4], b[len(b)-4:], nil, "ns", "g0"); err != nil {
		t.Fatalf("parts: %v", err)
	}
	q := RemotePage{Digest: p.Digest, Parent: p.Parent, Tokens: p.Tokens, Data: p.Data[:plain.PageBytes()]}
	pb, err := EncodeValue(nil, plain, "ns", "g0", &q)
	if err != nil || pb[7] != 0 {
		t.Fatalf("plain value: %v, flags %d", err, pb[7])
	}
	pb[7] = 2
	if _, err := DecodeValue(pb, nil); !errors.Is(err, ErrCorruptValue) {
		t.Fatalf("unknown flags: %v", err)
	}
	for _, f := range []PageFormat{{IndexerLayers: 1}, {IndexerTokenBytes: 1}, {IndexerLayers: -1, IndexerTokenBytes: -1},
		{IndexerLayers: 1 << 20, IndexerTokenBytes: 1 << 20}} {
		bad := plain
		bad.IndexerLayers, bad.IndexerTokenBytes = f.IndexerLayers, f.IndexerTokenBytes
		if err := bad.Validate(); !errors.Is(err, ErrBadFormat) {
			t.Fatalf("indexer layers %d, token bytes %d: %v", f.IndexerLayers, f.IndexerTokenBytes, err)
		}
	}
}
