package tier

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strconv"
	"time"

	"github.com/pagedkv/pagedkv/layout"
)

// Page value errors: a value (read from a remote store, a disk slot or a
// transfer stream) that wraps one of them is rejected.
var (
	// ErrCorruptValue: not a value this version writes (bad magic, version,
	// lengths, trailing bytes or checksum): truncated or damaged.
	ErrCorruptValue = errors.New("tier: corrupt page value")
	// ErrForeignValue: a valid value of another namespace, layer group or page
	// format.
	ErrForeignValue = errors.New("tier: foreign page value")
	// ErrStaleValue: a valid value of this deployment for another page: its
	// digest, parent or tokens differ from the ones asked for (a stale
	// value or a key collision).
	ErrStaleValue = errors.New("tier: page value of another page")
)

const (
	valueMagic   = "PKVP"
	valueVersion = 1
	// fixed header: magic, version, dtype, layout, flags, page size,
	// kv heads, head dim, layers; with flags&valueIndexer, then indexer
	// layers and indexer token bytes.
	valueHeaderBytes = 4 + 4 + 4*4
	// valueIndexer flags a format with indexer pages (PageFormat.IndexerLayers
	// > 0): a value without them is byte for byte what it was before.
	valueIndexer = 1
	// valueRetention flags a value with a retention field (retention.go)
	// after the fixed header: a page without retention is written without
	// it, byte for byte as before.
	valueRetention = 2
	// valueState flags a state group's checkpoint page (RemotePage.State,
	// Value.State): the page bytes are a recurrent state slot, not K/V
	// (docs/state-groups.md, "Tiers").
	valueState    = 4
	valueFlags    = valueIndexer | valueRetention | valueState
	valueCRCBytes = 4
)

// ValueCRCBytes is the length of a value's trailing CRC-32C.
const ValueCRCBytes = valueCRCBytes

// CRCTable is CRC-32C, the checksum of page values: hardware-accelerated
// (SSE4.2, ARMv8 CRC), so checking a page costs little next to moving it.
var CRCTable = crc32.MakeTable(crc32.Castagnoli)

// Value is a decoded page value: the self-verifying form of one page off
// the device that the Redis store keeps as a value, the disk tier in a
// slot and a handoff stream per page. Its slices alias the decoded bytes.
type Value struct {
	Format    PageFormat
	Namespace string
	Group     string
	Digest    Digest
	Parent    Digest
	Tokens    []int32
	Data      []byte
	// State: the value holds a state group's checkpoint page (flags bit
	// 0x04), as RemotePage.State.
	State bool
	// Retention is the page's retention when written (zero: none).
	Retention ValueRetention
}

// EncodedValueLen is the length of a value holding page p.
func EncodedValueLen(f PageFormat, namespace, group string) int {
	return headerBytes(f) + 2 + len(namespace) + 2 + len(group) + 2*32 + 4*f.PageSize + 4 + f.PageBytes() + valueCRCBytes
}

// EncodedValueLenOf is the length of the value of page p: EncodedValueLen,
// plus the retention field when p has a retention.
func EncodedValueLenOf(f PageFormat, namespace, group string, p *RemotePage) int {
	if p.Retention != (Retention{}) {
		return EncodedValueLen(f, namespace, group) + retentionBytes
	}
	return EncodedValueLen(f, namespace, group)
}

// EncodeValue appends the value of page p (format f, in namespace and group) to
// dst and returns it. p.Tokens must hold f.PageSize tokens and p.Data
// f.PageBytes() bytes; namespace and group are at most 65535 bytes. A
// page with a retention (p.Retention not zero) gets the retention field,
// its deadline on the wall clock now ([EncodeValueAt]).
func EncodeValue(dst []byte, f PageFormat, namespace, group string, p *RemotePage) ([]byte, error) {
	var now time.Time
	if p.Retention.Duration > 0 {
		now = time.Now()
	}
	return EncodeValueAt(dst, f, namespace, group, p, now)
}

// EncodeValueAt is [EncodeValue] with the wall-clock time the retention's
// deadline is counted from.
func EncodeValueAt(dst []byte, f PageFormat, namespace, group string, p *RemotePage, now time.Time) ([]byte, error) {
	if err := p.Retention.Check(); err != nil {
		return dst, fmt.Errorf("tier: encode value: %w", err)
	}
	switch {
	case len(p.Tokens) != f.PageSize:
		return dst, fmt.Errorf("tier: encode value: %d tokens, want a page of %d", len(p.Tokens), f.PageSize)
	case len(p.Data) != f.PageBytes():
		return dst, fmt.Errorf("tier: encode value: %d bytes, want %d", len(p.Data), f.PageBytes())
	case len(namespace) > 0xffff || len(group) > 0xffff:
		return dst, fmt.Errorf("tier: encode value: namespace of %d bytes or group of %d, want <= 65535", len(namespace), len(group))
	}
	start := len(dst)
	dst = slices.Grow(dst, EncodedValueLenOf(f, namespace, group, p))
	dst = append(dst, valueMagic...)
	flags := byte(0)
	if f.IndexerLayers > 0 {
		flags = valueIndexer
	}
	if p.State {
		flags |= valueState
	}
	if p.Retention != (Retention{}) {
		flags |= valueRetention
	}
	dst = append(dst, valueVersion, byte(f.DType), byte(f.Layout), flags)
	for _, v := range [...]int{f.PageSize, f.NumKVHeads, f.HeadDim, f.Layers} {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(v))
	}
	if flags&valueIndexer != 0 {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(f.IndexerLayers))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(f.IndexerTokenBytes))
	}
	if flags&valueRetention != 0 {
		dst = appendRetention(dst, p.Retention, now)
	}
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(namespace)))
	dst = append(dst, namespace...)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(group)))
	dst = append(dst, group...)
	dst = append(dst, p.Digest[:]...)
	dst = append(dst, p.Parent[:]...)
	for _, t := range p.Tokens {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(t))
	}
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(p.Data)))
	crc := crc32.Checksum(dst[start:], CRCTable)
	// The page bytes are checksummed as they are copied, a cache-sized
	// piece at a time: one pass over them instead of two.
	for data := p.Data; len(data) > 0; {
		n := min(len(data), crcChunk)
		dst = append(dst, data[:n]...)
		crc = crc32.Update(crc, CRCTable, dst[len(dst)-n:])
		data = data[n:]
	}
	return binary.LittleEndian.AppendUint32(dst, crc), nil
}

// headerBytes is the fixed header's length for format f.
func headerBytes(f PageFormat) int {
	if f.IndexerLayers > 0 {
		return valueHeaderBytes + 8
	}
	return valueHeaderBytes
}

// crcChunk is the piece of page bytes copied and then checksummed while it
// is still in the L1/L2 cache.
const crcChunk = 16 << 10

// valueReader takes fields off a value, failing once it runs out.
type valueReader struct {
	b   []byte
	bad bool
}

func (r *valueReader) take(n int) []byte {
	if r.bad || n < 0 || n > len(r.b) {
		r.bad = true
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *valueReader) u16() int {
	if b := r.take(2); b != nil {
		return int(binary.LittleEndian.Uint16(b))
	}
	return 0
}

func (r *valueReader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

// DecodeValue parses b strictly: every length must fit exactly, nothing may
// follow the checksum, and the checksum must match. tokens is reused for
// Value.Tokens when large enough. Errors wrap [ErrCorruptValue].
func DecodeValue(b []byte, tokens []int32) (Value, error) {
	var v Value
	if len(b) < valueHeaderBytes+valueCRCBytes {
		return v, fmt.Errorf("%w: %d bytes, shorter than a header", ErrCorruptValue, len(b))
	}
	body := b[:len(b)-valueCRCBytes]
	if got, want := binary.LittleEndian.Uint32(b[len(body):]), crc32.Checksum(body, CRCTable); got != want {
		return v, fmt.Errorf("%w: checksum %#x, computed %#x", ErrCorruptValue, got, want)
	}
	return parseValueBody(body, nil, tokens, "", "")
}

// DecodeValueInto is [DecodeValue] that also copies the page bytes into
// dst (len(dst) must be the format's PageBytes), checksumming them as they
// are copied: one pass over the bytes instead of a check and then a copy.
// The structure is parsed before the checksum is known, so on an error dst
// may hold some of b's bytes: use dst only when it returns nil. The
// returned Value's Data aliases b.
func DecodeValueInto(dst []byte, b []byte, tokens []int32) (Value, error) {
	if len(b) < valueHeaderBytes+valueCRCBytes {
		return Value{}, fmt.Errorf("%w: %d bytes, shorter than a header", ErrCorruptValue, len(b))
	}
	body := b[:len(b)-valueCRCBytes]
	v, err := parseValueBody(body, nil, tokens, "", "")
	if err != nil {
		return Value{}, err
	}
	if len(dst) != len(v.Data) {
		return Value{}, fmt.Errorf("tier: decode value into %d bytes, the page has %d", len(dst), len(v.Data))
	}
	crc := crc32.Checksum(body[:len(body)-len(v.Data)], CRCTable)
	for data, out := v.Data, dst; len(data) > 0; {
		n := min(len(data), crcChunk)
		copy(out, data[:n])
		crc = crc32.Update(crc, CRCTable, out[:n])
		data, out = data[n:], out[n:]
	}
	if got := binary.LittleEndian.Uint32(b[len(body):]); got != crc {
		return Value{}, fmt.Errorf("%w: checksum %#x, computed %#x", ErrCorruptValue, got, crc)
	}
	return v, nil
}

// ValueDataOffset is the offset of the page bytes in a value of format f,
// namespace and group: a reader can place them apart from the rest
// ([DecodeValueParts]).
func ValueDataOffset(f PageFormat, namespace, group string) int {
	return EncodedValueLen(f, namespace, group) - f.PageBytes() - valueCRCBytes
}

// DecodeValueParts is [DecodeValue] of a value read in three parts: head
// (the bytes before the page bytes, [ValueDataOffset] of them), data (the
// page bytes, read straight into their destination) and tail (the 4-byte
// checksum). It checks exactly what DecodeValue checks; Value.Data is
// data. A reader that expects one deployment's values passes its
// namespace and group: a value naming the same ones gets those strings
// (nothing allocated), any other its own.
func DecodeValueParts(head, data, tail []byte, tokens []int32, namespace, group string) (Value, error) {
	if len(tail) != valueCRCBytes {
		return Value{}, fmt.Errorf("%w: a checksum of %d bytes", ErrCorruptValue, len(tail))
	}
	v, err := parseValueBody(head, data, tokens, namespace, group)
	if err != nil {
		return Value{}, err
	}
	if got, want := binary.LittleEndian.Uint32(tail), crc32.Update(crc32.Checksum(head, CRCTable), CRCTable, data); got != want {
		return Value{}, fmt.Errorf("%w: checksum %#x, computed %#x", ErrCorruptValue, got, want)
	}
	return v, nil
}

// parseValueBody parses a value without its checksum: every length must
// fit exactly and nothing may follow the page bytes. With data, body ends
// where the page bytes begin and data holds them. A namespace or group
// equal to namespace or group reuses that string.
func parseValueBody(body, data []byte, tokens []int32, namespace, group string) (Value, error) {
	var v Value
	r := valueReader{b: body}
	if string(r.take(4)) != valueMagic {
		return v, fmt.Errorf("%w: bad magic", ErrCorruptValue)
	}
	h := r.take(4)
	if h[0] != valueVersion || h[3]&^valueFlags != 0 {
		return v, fmt.Errorf("%w: version %d (want %d), flags %#x (want bits of %#x)", ErrCorruptValue, h[0], valueVersion, h[3], valueFlags)
	}
	v.State = h[3]&valueState != 0
	dims := [4]uint32{r.u32(), r.u32(), r.u32(), r.u32()}
	for i, d := range dims {
		if d == 0 || d > MaxPageBytes {
			return v, fmt.Errorf("%w: geometry field %d = %d", ErrCorruptValue, i, d)
		}
	}
	v.Format = PageFormat{DType: layout.DType(h[1]), Layout: layout.KVLayout(h[2]),
		PageSize: int(dims[0]), NumKVHeads: int(dims[1]), HeadDim: int(dims[2]), Layers: int(dims[3])}
	if h[3]&valueIndexer != 0 {
		il, itb := r.u32(), r.u32()
		if il == 0 || il > MaxPageBytes || itb == 0 || itb > MaxPageBytes {
			return v, fmt.Errorf("%w: indexer layers %d, indexer token bytes %d", ErrCorruptValue, il, itb)
		}
		v.Format.IndexerLayers, v.Format.IndexerTokenBytes = int(il), int(itb)
	}
	if h[3]&valueRetention != 0 {
		b := r.take(retentionBytes)
		if b == nil {
			return v, fmt.Errorf("%w: truncated (%d bytes)", ErrCorruptValue, len(body)+valueCRCBytes)
		}
		ret, err := parseRetention(b)
		if err != nil {
			return v, fmt.Errorf("%w: %w", ErrCorruptValue, err)
		}
		v.Retention = ret
	}
	if err := v.Format.Validate(); err != nil {
		return v, fmt.Errorf("%w: %w", ErrCorruptValue, err)
	}
	v.Namespace = stringOf(r.take(r.u16()), namespace)
	v.Group = stringOf(r.take(r.u16()), group)
	copy(v.Digest[:], r.take(32))
	copy(v.Parent[:], r.take(32))
	raw := r.take(4 * v.Format.PageSize)
	n := int(r.u32())
	if data != nil {
		v.Data = data
		if n != len(data) {
			r.bad = true
		}
	} else {
		v.Data = r.take(n)
	}
	switch {
	case r.bad:
		return Value{}, fmt.Errorf("%w: truncated (%d bytes)", ErrCorruptValue, len(body)+valueCRCBytes)
	case len(r.b) != 0:
		return Value{}, fmt.Errorf("%w: %d bytes after the page", ErrCorruptValue, len(r.b))
	case n != v.Format.PageBytes():
		return Value{}, fmt.Errorf("%w: %d page bytes, the format says %d", ErrCorruptValue, n, v.Format.PageBytes())
	}
	if cap(tokens) < v.Format.PageSize {
		tokens = make([]int32, v.Format.PageSize)
	}
	v.Tokens = tokens[:v.Format.PageSize]
	for i := range v.Tokens {
		v.Tokens[i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return v, nil
}

// stringOf returns b as a string: known if they are equal (the comparison
// allocates nothing), else a copy.
func stringOf(b []byte, known string) string {
	if string(b) == known {
		return known
	}
	return string(b)
}

// Verify reports whether v is exactly page p of format f in namespace and
// group; the error wraps [ErrForeignValue] or [ErrStaleValue] and names the field.
func (v *Value) Verify(f PageFormat, namespace, group string, p *RemotePage) error {
	if err := v.VerifyDeployment(f, namespace, group); err != nil {
		return err
	}
	if err := v.verifyKind(p); err != nil {
		return err
	}
	switch {
	case v.Digest != p.Digest:
		return fmt.Errorf("%w: digest %s, want %s", ErrStaleValue, v.Digest.String()[:16], p.Digest.String()[:16])
	case v.Parent != p.Parent:
		return fmt.Errorf("%w: parent %s, want %s", ErrStaleValue, v.Parent.String()[:16], p.Parent.String()[:16])
	case !slices.Equal(v.Tokens, p.Tokens):
		i := 0
		for i < len(v.Tokens) && i < len(p.Tokens) && v.Tokens[i] == p.Tokens[i] {
			i++
		}
		return fmt.Errorf("%w: %d tokens, want %d; the first difference at token %d", ErrStaleValue, len(v.Tokens), len(p.Tokens), i)
	}
	return nil
}

// VerifyDeployment reports whether v is a value of format f in namespace
// and group; the error wraps [ErrForeignValue] and names the field.
func (v *Value) VerifyDeployment(f PageFormat, namespace, group string) error {
	switch {
	case v.Namespace != namespace:
		return fmt.Errorf("%w: namespace %s, want %q", ErrForeignValue, quoteCut(v.Namespace), namespace)
	case v.Group != group:
		return fmt.Errorf("%w: group %s, want %q", ErrForeignValue, quoteCut(v.Group), group)
	case v.Format != f:
		return fmt.Errorf("%w: format %+v, want %+v", ErrForeignValue, v.Format, f)
	}
	return nil
}

// verifyKind reports whether v is of p's kind: a state checkpoint page
// (flags bit 0x04) or K/V.
func (v *Value) verifyKind(p *RemotePage) error {
	if v.State != p.State {
		return fmt.Errorf("%w: a value with state flag %v, want %v (a state checkpoint page and a K/V page are never one another)", ErrForeignValue, v.State, p.State)
	}
	return nil
}

// maxQuoted bounds the bytes of a value's string an error quotes: the
// writer chose them, and %q of 64 KiB of escapes once cost 27 bytes of
// allocation per byte of the value.
const maxQuoted = 64

// quoteCut quotes s, cut to maxQuoted bytes (marked with its length).
func quoteCut(s string) string {
	if len(s) <= maxQuoted {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:maxQuoted], len(s))
}

// CheckDigest reports whether v's digest is the chain digest of its parent
// and tokens ([Next]): a value that names itself consistently. A store that
// rebuilds its index from values it finds (the disk tier after a restart)
// indexes only those. scratch is as for Next.
func (v *Value) CheckDigest(scratch []byte) error {
	if d := Next(scratch, v.Parent, v.Tokens); d != v.Digest {
		return fmt.Errorf("%w: digest %s is not the digest of its parent %s and tokens (%s)",
			ErrCorruptValue, v.Digest.String()[:16], v.Parent.String()[:16], d.String()[:16])
	}
	return nil
}
