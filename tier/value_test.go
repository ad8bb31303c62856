package tier

import (
	"bytes"
	"testing"
	"time"

	"github.com/pagedkv/pagedkv/layout"
)

// FuzzDecodeValueForms feeds raw bytes to the three decoders of a page
// value: DecodeValue (contiguous), DecodeValueInto (copying the page bytes
// out) and DecodeValueParts (head, page bytes and checksum apart, split
// where the test format puts them). They must agree on every input: the
// same acceptance and the same value.
func FuzzDecodeValueForms(f *testing.F) {
	fm := PageFormat{Layout: layout.NHD, DType: layout.F16, PageSize: 2, NumKVHeads: 1, HeadDim: 2, Layers: 1}
	p := RemotePage{Tokens: []int32{5, 6}, Data: bytes.Repeat([]byte{7}, fm.PageBytes())}
	p.Parent = NamespaceRoot("", "", "")
	p.Digest = Next(nil, p.Parent, p.Tokens)
	good, err := EncodeValue(nil, fm, "ns", "all", &p)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(good)-1])
	// A value of a format with indexer pages (flags bit 0, two more fields).
	fi := fm
	fi.IndexerLayers, fi.IndexerTokenBytes = 1, 3
	pi := RemotePage{Digest: p.Digest, Parent: p.Parent, Tokens: p.Tokens, Data: bytes.Repeat([]byte{9}, fi.PageBytes())}
	withIdx, err := EncodeValue(nil, fi, "ns", "all", &pi)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(withIdx)
	// A value with a retention (flags bit 1, a 24-byte field).
	pr := p
	pr.Retention = Retention{Priority: 2, Hint: 1, Duration: time.Second, Left: time.Second}
	withRet, err := EncodeValueAt(nil, fm, "ns", "all", &pr, time.Unix(5, 0))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(withRet)
	off := ValueDataOffset(fm, "ns", "all")
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := DecodeValue(b, nil)
		if len(b) == len(good) {
			dst := make([]byte, fm.PageBytes())
			vi, errInto := DecodeValueInto(dst, b, nil)
			if (err == nil) != (errInto == nil) {
				t.Fatalf("DecodeValue: %v, DecodeValueInto: %v", err, errInto)
			}
			// The parts decoder is given the expected namespace and group
			// (reused when the value's equal them): it must decode a value
			// of any other as its own.
			vp, errParts := DecodeValueParts(b[:off], b[off:len(b)-4], b[len(b)-4:], nil, "ns", "all")
			if (err == nil) != (errParts == nil) {
				t.Fatalf("DecodeValue: %v, DecodeValueParts: %v", err, errParts)
			}
			if err == nil && (!bytes.Equal(dst, v.Data) || !bytes.Equal(vp.Data, v.Data) || vi.Digest != v.Digest || vp.Digest != v.Digest ||
				vi.Namespace != v.Namespace || vp.Namespace != v.Namespace || vp.Group != v.Group || vp.Format != v.Format) {
				t.Fatalf("the decoders disagree on an accepted value")
			}
		}
		if err == nil {
			q := RemotePage{Digest: v.Digest, Parent: v.Parent, Tokens: v.Tokens, Data: v.Data}
			// The retention re-encodes from the time its whole duration
			// was left.
			var at time.Time
			q.Retention, at = v.Retention.Whole()
			again, err := EncodeValueAt(nil, v.Format, v.Namespace, v.Group, &q, at)
			if err != nil || !bytes.Equal(again, b) {
				t.Fatalf("decode/encode is not the identity: %v", err)
			}
		}
	})
}
