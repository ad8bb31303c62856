package disk

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/pagedkv/pagedkv/tier"
)

// fuzzConfig: one segment of 4 slots.
func fuzzConfig(dir string) Config {
	cfg := testConfig(dir, 4)
	cfg.SegmentPages = 4
	return cfg
}

// fuzzSeedSegment is a real segment file holding three pages, the first
// with a retention (in its slot header).
func fuzzSeedSegment(f *testing.F) []byte {
	dir := f.TempDir()
	s, err := Open(fuzzConfig(dir))
	if err != nil {
		f.Fatal(err)
	}
	u := newUniverse(testFormat, 1, 3)
	for i := range u.chains[0] {
		p := u.chains[0][i]
		if i == 0 {
			p.Retention = tier.Retention{Priority: 2, Hint: 1, Duration: time.Hour, Left: time.Minute}
		}
		s.Store(&p)
	}
	if err := s.Close(); err != nil {
		f.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "seg-0000.pkvd"))
	if err != nil {
		f.Fatal(err)
	}
	return b
}

// FuzzSlot feeds raw bytes to the slot verifier as the bytes of one slot.
// It must never panic; whatever it accepts must be exactly a slot header
// and value the writer would produce for the decoded page.
func FuzzSlot(f *testing.F) {
	seg := fuzzSeedSegment(f)
	s := &Store{cfg: fuzzConfig("x"), dataOff: tier.ValueDataOffset(testFormat, testNamespace, DefaultGroup)}
	s.cfg.Group = DefaultGroup
	s.valueLen, s.valueOff, s.slotBytes = slotGeometry(s.cfg)
	for i := range 4 {
		slot := seg[segmentHeaderBytes+i*s.slotBytes : segmentHeaderBytes+(i+1)*s.slotBytes]
		if _, _, _, err := s.checkSlot(slot, nil); (err == nil) != (i < 3) {
			f.Fatalf("seed slot %d (a page written: %v) checks: %v", i, i < 3, err)
		}
		f.Add(slot)
	}
	f.Add([]byte("PKVS"))
	// A written slot whose header names a sequence that cannot be
	// continued (2^64-1), its header checksum valid: refused.
	wrap := slices.Clone(seg[segmentHeaderBytes : segmentHeaderBytes+s.slotBytes])
	h, err := decodeSlotHeader(wrap)
	if err != nil {
		f.Fatal(err)
	}
	h.Seq = math.MaxUint64
	h.encode(wrap)
	if _, _, _, err := s.checkSlot(wrap, nil); err == nil {
		f.Fatalf("a slot of sequence 2^64-1 checks")
	}
	f.Add(wrap)
	// A slot whose retention field is damaged behind a valid checksum.
	bad := slices.Clone(seg[segmentHeaderBytes : segmentHeaderBytes+s.slotBytes])
	if h, err = decodeSlotHeader(bad); err != nil || h.Ret.Priority != 2 {
		f.Fatalf("the seed's first slot has retention %+v: %v", h.Ret, err)
	}
	h.Ret.Hint = 7
	h.encode(bad)
	if _, _, _, err := s.checkSlot(bad, nil); err == nil {
		f.Fatalf("a slot of retention hint 7 checks")
	}
	f.Add(bad)
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 2*s.slotBytes {
			return
		}
		slot := make([]byte, s.slotBytes)
		copy(slot, b)
		h, v, _, err := s.checkSlot(slot, nil)
		if err != nil {
			return
		}
		if h.Seq == 0 || h.Seq > MaxSequence {
			t.Fatalf("accepted slot sequence %d, outside 1..%d", h.Seq, uint64(MaxSequence))
		}
		p := tier.RemotePage{Digest: v.Digest, Parent: v.Parent, Tokens: v.Tokens, Data: v.Data}
		val, err := tier.EncodeValue(nil, v.Format, v.Namespace, v.Group, &p)
		if err != nil {
			t.Fatalf("accepted value does not encode: %v", err)
		}
		if !bytes.Equal(val, slot[s.valueOff:s.valueOff+s.valueLen]) {
			t.Fatalf("accepted value is not its own encoding")
		}
		var hdr [slotHeaderBytes]byte
		h.encode(hdr[:])
		if !bytes.Equal(hdr[:], slot[:slotHeaderBytes]) {
			t.Fatalf("accepted slot header is not its own encoding")
		}
	})
}

// FuzzSegmentFile writes raw bytes as a store's only segment file and
// opens it: Open refuses it by name (ErrForeignDir) or recovers only
// pages that verify, each served with the K/V its slot holds, every slot
// accounted for, and the index consistent; the store then goes on: a new
// page stored is served (whatever sequences the file held) and survives
// a restart. Memory stays bounded: Open reads fixed-size pieces whatever
// the file says.
func FuzzSegmentFile(f *testing.F) {
	seg := fuzzSeedSegment(f)
	f.Add(seg)
	f.Add(seg[:segmentHeaderBytes+100])
	f.Add(seg[:20])
	f.Add([]byte{})
	// Slot 2's sequence set to 2^64-1 and to MaxSequence, its header
	// checksum valid: the first is dropped, the second renumbered.
	for _, seq := range []uint64{math.MaxUint64, MaxSequence} {
		b := slices.Clone(seg)
		geo := fuzzConfig("x")
		geo.Group = DefaultGroup
		_, _, slotBytes := slotGeometry(geo)
		hdr := b[segmentHeaderBytes+2*slotBytes:]
		h, err := decodeSlotHeader(hdr)
		if err != nil {
			f.Fatal(err)
		}
		h.Seq = seq
		h.encode(hdr)
		f.Add(b)
	}
	extra := newUniverse(testFormat, 3, 2).chains[2][1] // not in the seed
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 64<<10 {
			return
		}
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "seg-0000.pkvd"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := Open(fuzzConfig(dir))
		if err != nil {
			if !errors.Is(err, ErrForeignDir) {
				t.Fatalf("Open: %v, want ErrForeignDir or success", err)
			}
			return
		}
		defer s.Close()
		if err := s.CheckInvariants(); err != nil {
			t.Fatal(err)
		}
		rec := s.Recovery()
		if rec.Recovered+rec.Empty+rec.Torn+rec.Foreign+rec.Duplicate != rec.Slots {
			t.Fatalf("slots not accounted for: %+v", rec)
		}
		for d, slot := range s.index {
			f, off := s.slotAt(int(slot))
			raw := make([]byte, s.slotBytes)
			if _, err := f.ReadAt(raw, off); err != nil {
				t.Fatal(err)
			}
			_, v, _, err := s.checkSlot(raw, nil)
			if err != nil || v.Digest != d {
				t.Fatalf("indexed slot %d does not verify: %v", slot, err)
			}
			req := []tier.RemotePage{{Digest: d, Parent: v.Parent, Tokens: v.Tokens, Data: make([]byte, len(v.Data))}}
			if s.Fetch(context.Background(), req) != 1 || !bytes.Equal(req[0].Data, v.Data) {
				t.Fatalf("indexed page %s not served as its slot holds it", d)
			}
		}
		if s.nextSeq < 1 || s.nextSeq > RenumberAbove+1 {
			t.Fatalf("next sequence %d after Open, want 1..2^62+1", s.nextSeq)
		}
		if _, held := s.index[extra.Digest]; held {
			return
		}
		if !s.Store(&extra) {
			t.Fatal("Store refused a page")
		}
		flush(t, s)
		if err := s.CheckInvariants(); err != nil {
			t.Fatal(err)
		}
		if fetchChecked(t, s, request([]tier.RemotePage{extra})) != 1 {
			t.Fatal("the page stored after Open is not served")
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s2, err := Open(fuzzConfig(dir))
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		if fetchChecked(t, s2, request([]tier.RemotePage{extra})) != 1 {
			t.Fatal("the page stored after Open is lost on restart")
		}
	})
}
