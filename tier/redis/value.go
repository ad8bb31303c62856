package redis

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strconv"

	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/tier"
)

// Value errors: a fetched value that wraps one of them is rejected.
var (
	// ErrCorrupt: not a value this version writes (bad magic, version,
	// lengths, trailing bytes or checksum): truncated or damaged.
	ErrCorrupt = errors.New("redis: corrupt value")
	// ErrForeign: a valid value of another namespace, layer group or page
	// format.
	ErrForeign = errors.New("redis: foreign value")
	// ErrStale: a valid value of this deployment for another page: its
	// digest, parent or tokens differ from the ones asked for (a stale
	// value or a key collision).
	ErrStale = errors.New("redis: value of another page")
)

const (
	magic   = "PKVP"
	version = 1
	// fixed header: magic, version, dtype, layout, reserved, page size,
	// kv heads, head dim, layers.
	headerBytes = 4 + 4 + 4*4
	crcBytes    = 4
)

// CRC-32C: hardware-accelerated (SSE4.2, ARMv8 CRC), so checking a page
// costs little next to moving it.
var crcTable = crc32.MakeTable(crc32.Castagnoli)

// Value is a decoded value. Its slices alias the decoded bytes.
type Value struct {
	Format    tier.PageFormat
	Namespace string
	Group     string
	Digest    tier.Digest
	Parent    tier.Digest
	Tokens    []int32
	Data      []byte
}

// EncodedLen is the length of a value holding page p.
func EncodedLen(f tier.PageFormat, namespace, group string) int {
	return headerBytes + 2 + len(namespace) + 2 + len(group) + 2*32 + 4*f.PageSize + 4 + f.PageBytes() + crcBytes
}

// Encode appends the value of page p (format f, in namespace and group) to
// dst and returns it. p.Tokens must hold f.PageSize tokens and p.Data
// f.PageBytes() bytes; namespace and group are at most 65535 bytes.
func Encode(dst []byte, f tier.PageFormat, namespace, group string, p *tier.RemotePage) ([]byte, error) {
	switch {
	case len(p.Tokens) != f.PageSize:
		return dst, fmt.Errorf("redis: encode: %d tokens, want a page of %d", len(p.Tokens), f.PageSize)
	case len(p.Data) != f.PageBytes():
		return dst, fmt.Errorf("redis: encode: %d bytes, want %d", len(p.Data), f.PageBytes())
	case len(namespace) > 0xffff || len(group) > 0xffff:
		return dst, fmt.Errorf("redis: encode: namespace of %d bytes or group of %d, want <= 65535", len(namespace), len(group))
	}
	start := len(dst)
	dst = slices.Grow(dst, EncodedLen(f, namespace, group))
	dst = append(dst, magic...)
	dst = append(dst, version, byte(f.DType), byte(f.Layout), 0)
	for _, v := range [...]int{f.PageSize, f.NumKVHeads, f.HeadDim, f.Layers} {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(v))
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
	dst = append(dst, p.Data...)
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], crcTable)), nil
}

// reader takes fields off a value, failing once it runs out.
type reader struct {
	b   []byte
	bad bool
}

func (r *reader) take(n int) []byte {
	if r.bad || n < 0 || n > len(r.b) {
		r.bad = true
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u16() int {
	if b := r.take(2); b != nil {
		return int(binary.LittleEndian.Uint16(b))
	}
	return 0
}

func (r *reader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

// Decode parses b strictly: every length must fit exactly, nothing may
// follow the checksum, and the checksum must match. tokens is reused for
// Value.Tokens when large enough. Errors wrap [ErrCorrupt].
func Decode(b []byte, tokens []int32) (Value, error) {
	var v Value
	if len(b) < headerBytes+crcBytes {
		return v, fmt.Errorf("%w: %d bytes, shorter than a header", ErrCorrupt, len(b))
	}
	body := b[:len(b)-crcBytes]
	if got, want := binary.LittleEndian.Uint32(b[len(body):]), crc32.Checksum(body, crcTable); got != want {
		return v, fmt.Errorf("%w: checksum %#x, computed %#x", ErrCorrupt, got, want)
	}
	r := reader{b: body}
	if string(r.take(4)) != magic {
		return v, fmt.Errorf("%w: bad magic", ErrCorrupt)
	}
	h := r.take(4)
	if h[0] != version || h[3] != 0 {
		return v, fmt.Errorf("%w: version %d (want %d), reserved byte %d (want 0)", ErrCorrupt, h[0], version, h[3])
	}
	dims := [4]uint32{r.u32(), r.u32(), r.u32(), r.u32()}
	for i, d := range dims {
		if d == 0 || d > tier.MaxPageBytes {
			return v, fmt.Errorf("%w: geometry field %d = %d", ErrCorrupt, i, d)
		}
	}
	v.Format = tier.PageFormat{DType: layout.DType(h[1]), Layout: layout.KVLayout(h[2]),
		PageSize: int(dims[0]), NumKVHeads: int(dims[1]), HeadDim: int(dims[2]), Layers: int(dims[3])}
	if err := v.Format.Validate(); err != nil {
		return v, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	v.Namespace = string(r.take(r.u16()))
	v.Group = string(r.take(r.u16()))
	copy(v.Digest[:], r.take(32))
	copy(v.Parent[:], r.take(32))
	raw := r.take(4 * v.Format.PageSize)
	n := int(r.u32())
	v.Data = r.take(n)
	switch {
	case r.bad:
		return Value{}, fmt.Errorf("%w: truncated (%d bytes)", ErrCorrupt, len(b))
	case len(r.b) != 0:
		return Value{}, fmt.Errorf("%w: %d bytes after the page", ErrCorrupt, len(r.b))
	case n != v.Format.PageBytes():
		return Value{}, fmt.Errorf("%w: %d page bytes, the format says %d", ErrCorrupt, n, v.Format.PageBytes())
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

// Verify reports whether v is exactly page p of format f in namespace and
// group; the error wraps [ErrForeign] or [ErrStale] and names the field.
func (v *Value) Verify(f tier.PageFormat, namespace, group string, p *tier.RemotePage) error {
	switch {
	case v.Namespace != namespace:
		return fmt.Errorf("%w: namespace %s, want %q", ErrForeign, quoteCut(v.Namespace), namespace)
	case v.Group != group:
		return fmt.Errorf("%w: group %s, want %q", ErrForeign, quoteCut(v.Group), group)
	case v.Format != f:
		return fmt.Errorf("%w: format %+v, want %+v", ErrForeign, v.Format, f)
	case v.Digest != p.Digest:
		return fmt.Errorf("%w: digest %s, want %s", ErrStale, v.Digest.String()[:16], p.Digest.String()[:16])
	case v.Parent != p.Parent:
		return fmt.Errorf("%w: parent %s, want %s", ErrStale, v.Parent.String()[:16], p.Parent.String()[:16])
	case !slices.Equal(v.Tokens, p.Tokens):
		i := 0
		for i < len(v.Tokens) && i < len(p.Tokens) && v.Tokens[i] == p.Tokens[i] {
			i++
		}
		return fmt.Errorf("%w: %d tokens, want %d; the first difference at token %d", ErrStale, len(v.Tokens), len(p.Tokens), i)
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
