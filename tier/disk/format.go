package disk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/pagedkv/pagedkv/tier"
)

// On-disk format, version 2 (docs/disk-tier.md):
//
//	segment file seg-NNNN.pkvd:
//	  [0, 4096)                     segment header
//	  [4096 + i*slotBytes, ...)     slot i
//	segment header: "PKVDSEG2", slot bytes, slots, segment number, value
//	  length, value offset (u32 each, little-endian), CRC-32C of the 28
//	  bytes before
//	slot: [0, 64) slot header, [valueOff, valueOff+value length) the page
//	  value (tier.EncodeValue: the Redis tier's format), the rest unused
//	  (zero as written). valueOff puts the value's page bytes on a 4 KiB
//	  boundary of the slot, and so of the file: reads and writes of them
//	  move whole, aligned file pages.
//	slot header: "PKVS", version 2, 3 zero bytes, sequence (u64), value
//	  length (u32), the value's own trailing CRC-32C (u32), CRC-32C of the
//	  24 bytes before; then, for a page with a retention hint, the 24-byte
//	  retention field of tier values (level, hint, duration, wall-clock
//	  deadline) and its CRC-32C (u32); all zero without one, so a slot
//	  without retention is what it was
//
// Version 1 (magic "PKVDSEG1", slot version 1) put the value right after
// the slot header; its directories are refused by name (ErrForeignDir).
//
// A slot is written whole, header first, with one write (of a run of
// slots). The header names the value's checksum, so a header from one
// write and a value from another (a crash in the middle of the write, or
// a power loss that kept some of its file pages and not others) never
// verify together; the sequence number orders two copies of one page.

const (
	segmentMagic       = "PKVDSEG2"
	segmentHeaderBytes = 4096
	segmentHeaderUsed  = 8 + 5*4 + 4
	slotMagic          = "PKVS"
	slotVersion        = 2
	slotHeaderBytes    = 64
	slotHeaderUsed     = 4 + 4 + 8 + 4 + 4 + 4
	// slotRetentionOff: the retention field and its checksum.
	slotRetentionOff  = slotHeaderUsed
	slotRetentionUsed = slotRetentionOff + tier.RetentionFieldBytes + 4
	slotAlign         = 4096
)

// Errors. Each wraps one of these and names the file, slot and value.
var (
	// ErrBadConfig reports an invalid [Config].
	ErrBadConfig = errors.New("disk: bad config")
	// ErrForeignDir: the directory's segment files were written for
	// another geometry (slot size, slot count or value length: another
	// page format, namespace or group) or are not segment files.
	ErrForeignDir = errors.New("disk: directory holds another store's segments")
	// ErrLocked: another process (or Store) has the directory open.
	ErrLocked = errors.New("disk: directory is in use")
	// ErrClosed: the store is closed.
	ErrClosed = errors.New("disk: store closed")
	// ErrNotRegularFile: LOCK or a segment file's name in the directory
	// is a symbolic link (dangling or not), a directory, a named pipe or
	// anything else but a regular file. The store never follows a link
	// out of its directory; the error names the path and what it is.
	ErrNotRegularFile = errors.New("disk: not a regular file")
)

// segmentHeader is the fixed header of a segment file.
type segmentHeader struct {
	SlotBytes, Slots, Segment, ValueLen, ValueOff uint32
}

func (h segmentHeader) encode(dst []byte) {
	clear(dst[:segmentHeaderBytes])
	copy(dst, segmentMagic)
	for i, v := range [...]uint32{h.SlotBytes, h.Slots, h.Segment, h.ValueLen, h.ValueOff} {
		binary.LittleEndian.PutUint32(dst[8+4*i:], v)
	}
	binary.LittleEndian.PutUint32(dst[segmentHeaderUsed-4:], crc32.Checksum(dst[:segmentHeaderUsed-4], tier.CRCTable))
}

// decodeSegmentHeader parses the first bytes of a segment file.
func decodeSegmentHeader(b []byte) (segmentHeader, error) {
	var h segmentHeader
	switch {
	case len(b) < segmentHeaderUsed:
		return h, fmt.Errorf("segment header of %d bytes, want %d", len(b), segmentHeaderUsed)
	case string(b[:8]) != segmentMagic:
		return h, fmt.Errorf("magic %q, want %q", b[:8], segmentMagic)
	}
	if got, want := binary.LittleEndian.Uint32(b[segmentHeaderUsed-4:]), crc32.Checksum(b[:segmentHeaderUsed-4], tier.CRCTable); got != want {
		return h, fmt.Errorf("segment header checksum %#x, computed %#x", got, want)
	}
	h.SlotBytes = binary.LittleEndian.Uint32(b[8:])
	h.Slots = binary.LittleEndian.Uint32(b[12:])
	h.Segment = binary.LittleEndian.Uint32(b[16:])
	h.ValueLen = binary.LittleEndian.Uint32(b[20:])
	h.ValueOff = binary.LittleEndian.Uint32(b[24:])
	return h, nil
}

// slotHeader is the header of one slot.
type slotHeader struct {
	Seq      uint64
	ValueLen uint32
	ValueCRC uint32 // the value's own trailing CRC-32C
	// Ret is the page's retention when written (zero: none).
	Ret tier.ValueRetention
}

func (h slotHeader) encode(dst []byte) {
	clear(dst[:slotHeaderBytes])
	copy(dst, slotMagic)
	dst[4] = slotVersion
	binary.LittleEndian.PutUint64(dst[8:], h.Seq)
	binary.LittleEndian.PutUint32(dst[16:], h.ValueLen)
	binary.LittleEndian.PutUint32(dst[20:], h.ValueCRC)
	binary.LittleEndian.PutUint32(dst[24:], crc32.Checksum(dst[:24], tier.CRCTable))
	if h.Ret != (tier.ValueRetention{}) {
		f := tier.AppendValueRetention(dst[slotRetentionOff:slotRetentionOff], h.Ret)
		binary.LittleEndian.PutUint32(dst[slotRetentionOff+len(f):], crc32.Checksum(f, tier.CRCTable))
	}
}

// Sequence numbers. The writer numbers slots 1, 2, 3, ... across the
// store's life; the restart scan continues after the highest it finds.
const (
	// MaxSequence is the highest sequence a slot may hold: a slot header
	// naming a higher one (2^64-1 among them, after which the next would
	// wrap to 0) is dropped as torn, however well its checksums verify.
	MaxSequence = 1<<63 - 1
	// RenumberAbove: when the highest sequence recovered is above it
	// (never, by the writer alone: 2^62 pages), Open renumbers the
	// recovered slots 1..n in their order and rewrites their headers, so
	// the writer always has at least 2^62 sequences left.
	RenumberAbove = 1 << 62
)

// errEmptySlot: a slot whose header is all zero (never written, or
// cleared after the restart scan dropped it).
var errEmptySlot = errors.New("empty slot")

// decodeSlotHeader parses a slot header; b holds at least slotHeaderBytes.
func decodeSlotHeader(b []byte) (slotHeader, error) {
	var h slotHeader
	if len(b) < slotHeaderBytes {
		return h, fmt.Errorf("slot header of %d bytes, want %d", len(b), slotHeaderBytes)
	}
	if isZero(b[:slotHeaderBytes]) {
		return h, errEmptySlot
	}
	switch {
	case string(b[:4]) != slotMagic:
		return h, fmt.Errorf("slot magic %q, want %q", b[:4], slotMagic)
	case b[4] != slotVersion || b[5] != 0 || b[6] != 0 || b[7] != 0:
		return h, fmt.Errorf("slot version %d (want %d) or reserved bytes %x not zero", b[4], slotVersion, b[5:8])
	case !isZero(b[slotRetentionUsed:slotHeaderBytes]):
		return h, fmt.Errorf("slot header padding not zero")
	}
	if f := b[slotRetentionOff : slotRetentionUsed-4]; !isZero(b[slotRetentionOff:slotRetentionUsed]) {
		if got, want := binary.LittleEndian.Uint32(b[slotRetentionUsed-4:]), crc32.Checksum(f, tier.CRCTable); got != want {
			return h, fmt.Errorf("slot retention checksum %#x, computed %#x", got, want)
		}
		ret, err := tier.ParseValueRetention(f)
		if err != nil {
			return h, fmt.Errorf("slot %w", err)
		}
		h.Ret = ret
	}
	if got, want := binary.LittleEndian.Uint32(b[24:]), crc32.Checksum(b[:24], tier.CRCTable); got != want {
		return h, fmt.Errorf("slot header checksum %#x, computed %#x", got, want)
	}
	h.Seq = binary.LittleEndian.Uint64(b[8:])
	h.ValueLen = binary.LittleEndian.Uint32(b[16:])
	h.ValueCRC = binary.LittleEndian.Uint32(b[20:])
	if h.Seq == 0 || h.Seq > MaxSequence {
		return h, fmt.Errorf("slot sequence %d outside 1..%d (a sequence the writer cannot continue)", h.Seq, uint64(MaxSequence))
	}
	return h, nil
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// Drop reasons reported by the restart scan ([Recovery]).
type DropReason uint8

const (
	// DropTorn: the slot header or the value failed its checksum, or
	// they come from different writes: a write cut by a crash.
	DropTorn DropReason = iota
	// DropForeign: a verified value of another namespace, group or
	// format, or a value length this store does not write.
	DropForeign
	// DropDuplicate: an older copy of a page another slot holds with a
	// higher sequence.
	DropDuplicate
)

func (r DropReason) String() string {
	switch r {
	case DropTorn:
		return "torn"
	case DropForeign:
		return "foreign"
	case DropDuplicate:
		return "duplicate"
	}
	return fmt.Sprintf("DropReason(%d)", uint8(r))
}

// checkSlot verifies one slot's bytes (header, then value) against the
// store's namespace, group and format: the verified value (its tokens in
// tokens when large enough), or why the slot is dropped.
func (s *Store) checkSlot(b []byte, tokens []int32) (slotHeader, tier.Value, DropReason, error) {
	head := s.valueOff + s.dataOff
	end := s.valueOff + s.valueLen
	return s.checkSlotParts(b[:head], b[head:end-tier.ValueCRCBytes], b[end-tier.ValueCRCBytes:end], tokens)
}

// checkSlotParts is checkSlot of a slot read in parts: meta (the slot up
// to the value's page bytes: the slot header, unused bytes, the value's
// head), data (the page bytes) and tail (the value's checksum).
func (s *Store) checkSlotParts(meta, data, tail []byte, tokens []int32) (slotHeader, tier.Value, DropReason, error) {
	h, err := decodeSlotHeader(meta)
	if err != nil {
		return h, tier.Value{}, DropTorn, err
	}
	if int(h.ValueLen) != s.valueLen {
		return h, tier.Value{}, DropForeign, fmt.Errorf("value length %d, this store writes %d", h.ValueLen, s.valueLen)
	}
	if got := binary.LittleEndian.Uint32(tail); got != h.ValueCRC {
		return h, tier.Value{}, DropTorn, fmt.Errorf("value checksum %#x, the slot header says %#x (header and value of different writes)", got, h.ValueCRC)
	}
	v, err := tier.DecodeValueParts(meta[s.valueOff:], data, tail, tokens, s.cfg.Namespace, s.cfg.Group)
	if err != nil {
		return h, v, DropTorn, err
	}
	// The value's own identity: only its deployment is checked here (the
	// page is checked against the request by the caller).
	if err := v.VerifyDeployment(s.cfg.Format, s.cfg.Namespace, s.cfg.Group); err != nil {
		return h, v, DropForeign, err
	}
	return h, v, 0, nil
}
