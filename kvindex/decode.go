package kvindex

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// ErrDecode reports a message or payload that is not a KV-event batch in
// vLLM's format; the message names the bad value.
var ErrDecode = errors.New("kvindex: bad event message")

// Kind is an event's type (vLLM's tag).
type Kind uint8

const (
	BlockStored Kind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

// kindTags are vLLM's event tags, by Kind (none for the invalid 0):
// String prints them and the decoder reads them (kindOf).
var kindTags = [...]string{BlockStored: "BlockStored", BlockRemoved: "BlockRemoved", AllBlocksCleared: "AllBlocksCleared"}

func (k Kind) String() string {
	if k != 0 && int(k) < len(kindTags) {
		return kindTags[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Event is one decoded KV event. Hashes are vLLM's block hashes as 64-bit
// values: integers as they are, byte strings by their last 8 bytes read
// big-endian (as llm-d does).
type Event struct {
	Kind      Kind
	Hashes    []uint64
	Parent    uint64
	HasParent bool
	Tokens    []int32
	BlockSize int
	Medium    string // "" when None
	LoRAName  string // "" when None
	Group     int
	HasGroup  bool
	// State is true for a BlockStored whose kv_cache_spec_kind is "mamba":
	// a state group's checkpoints (vLLM's MambaSpec; docs/events.md, "State
	// groups"), which Index.Match treats as such.
	State bool
}

// Batch is one decoded KVEventBatch.
type Batch struct {
	TS     float64
	Events []Event
	DPRank int
}

// Message is one PUB message: [topic, 8-byte big-endian sequence, payload].
type Message struct {
	Topic   string
	Seq     uint64
	Payload []byte
}

// ParseMessage checks the framing of a PUB message.
func ParseMessage(frames [][]byte) (Message, error) {
	if len(frames) != 3 {
		return Message{}, fmt.Errorf("%w: %d frames, want 3 (topic, sequence, payload)", ErrDecode, len(frames))
	}
	if len(frames[1]) != 8 {
		return Message{}, fmt.Errorf("%w: sequence frame of %d bytes, want 8", ErrDecode, len(frames[1]))
	}
	return Message{Topic: string(frames[0]), Seq: binary.BigEndian.Uint64(frames[1]), Payload: frames[2]}, nil
}

// replyEnd is what parseReply returns for the end-of-replay marker.
const replyEnd = math.MaxUint64

// parseReply reads one replay reply as a DEALER receives it: ["", topic,
// seq, payload] (vLLM since replies carry the topic), ["", seq, payload]
// (earlier vLLM), or either without the empty delimiter. The end marker
// has sequence -1 and an empty payload; it is returned as replyEnd.
func parseReply(frames [][]byte) (seq uint64, payload []byte, err error) {
	if len(frames) > 0 && len(frames[0]) == 0 && len(frames) >= 3 && (len(frames) == 4 || len(frames[1]) == 8) {
		frames = frames[1:]
	}
	switch len(frames) {
	case 3:
		frames = frames[1:]
	case 2:
	default:
		return 0, nil, fmt.Errorf("%w: replay reply of %d frames", ErrDecode, len(frames))
	}
	if len(frames[0]) != 8 {
		return 0, nil, fmt.Errorf("%w: replay sequence frame of %d bytes, want 8", ErrDecode, len(frames[0]))
	}
	seq = binary.BigEndian.Uint64(frames[0])
	if seq == replyEnd {
		return replyEnd, nil, nil
	}
	return seq, frames[1], nil
}

// decoder reads one payload with bounds checked against the bytes left, so
// that no declared length makes it allocate more than the input.
type decoder struct {
	in []byte
	r  *bytes.Reader
	d  *msgpack.Decoder
}

// Decoding costs O(input): DecodeBatch allocates at most
// DecodeAllocPerByte bytes for each byte of payload, plus
// DecodeAllocOverhead, whatever the payload declares. The bound is met by
// construction: every declared length is checked against the bytes left
// before anything is made; the events array is sized by the shortest
// possible event (sizeof(Event) = 128 bytes per minEventBytes = 16 bytes
// of input, plus the one-hash array inside it); a hash costs 8 bytes per
// input byte at worst, a token 4, a string its own length (rounded to the
// allocator's size class), and unknown fields nothing. FuzzDecode and
// TestDecodeAllocatesWithinItsBound measure it.
const (
	DecodeAllocPerByte  = 10
	DecodeAllocOverhead = 4 << 10
)

// DecodeBatch decodes a payload. It accepts events in vLLM's current map
// form and in the earlier array form (array_like=True), and ignores fields
// it does not know, so newer vLLM versions stay readable.
func DecodeBatch(payload []byte) (Batch, error) {
	dec := decoder{in: payload, r: bytes.NewReader(payload)}
	dec.d = msgpack.NewDecoder(dec.r)
	b, err := dec.batch()
	if err != nil {
		return Batch{}, fmt.Errorf("%w: %w", ErrDecode, err)
	}
	if dec.r.Len() != 0 {
		return Batch{}, fmt.Errorf("%w: %d bytes after the batch", ErrDecode, dec.r.Len())
	}
	return b, nil
}

func (dec *decoder) batch() (Batch, error) {
	n, err := dec.arrayLen("batch")
	if err != nil {
		return Batch{}, err
	}
	if n < 2 || n > 3 {
		return Batch{}, fmt.Errorf("batch is an array of %d, want [ts, events, data_parallel_rank]", n)
	}
	var b Batch
	if b.TS, err = dec.d.DecodeFloat64(); err != nil {
		return Batch{}, fmt.Errorf("ts: %w", err)
	}
	ne, err := dec.arrayLen("events")
	if err != nil {
		return Batch{}, err
	}
	// No event is shorter than minEventBytes, so this is the most a batch
	// of the bytes left can hold: the events cost at most
	// sizeof(Event)/minEventBytes bytes a byte of input, with no regrowth.
	b.Events = make([]Event, 0, min(ne, dec.r.Len()/minEventBytes))
	for i := range ne {
		ev, err := dec.event()
		if err != nil {
			return Batch{}, fmt.Errorf("event %d: %w", i, err)
		}
		b.Events = append(b.Events, ev)
	}
	if n == 3 {
		if ok, err := dec.nilNext(); err != nil {
			return Batch{}, err
		} else if !ok {
			r, err := dec.d.DecodeInt64()
			if err != nil || r < 0 || r > math.MaxInt32 {
				return Batch{}, fmt.Errorf("data_parallel_rank %d: %v", r, err)
			}
			b.DPRank = int(r)
		}
	}
	return b, nil
}

// minEventBytes is the shortest event's encoding: ["BlockRemoved", [h]]
// in the array form (1 + 13 + 2 bytes).
const minEventBytes = 16

// arrayLen reads an array header (nil is an error).
func (dec *decoder) arrayLen(what string) (int, error) {
	c, err := dec.d.PeekCode()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	if !msgpcode.IsFixedArray(c) && c != msgpcode.Array16 && c != msgpcode.Array32 {
		return 0, fmt.Errorf("%s: msgpack code %#x, want an array", what, c)
	}
	n, err := dec.d.DecodeArrayLen()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	if n > dec.r.Len() {
		return 0, fmt.Errorf("%s: array of %d elements in %d bytes", what, n, dec.r.Len())
	}
	return n, nil
}

// nilNext consumes a nil and reports true, or reports false.
func (dec *decoder) nilNext() (bool, error) {
	c, err := dec.d.PeekCode()
	if err != nil {
		return false, err
	}
	if c == msgpcode.Nil {
		return true, dec.d.DecodeNil()
	}
	return false, nil
}

// str reads a string or nil ("").
func (dec *decoder) str(what string) (string, error) {
	c, err := dec.d.PeekCode()
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	if c == msgpcode.Nil {
		return "", dec.d.DecodeNil()
	}
	if !msgpcode.IsString(c) {
		return "", fmt.Errorf("%s: msgpack code %#x, want a string", what, c)
	}
	body, err := dec.body()
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	return string(body), nil
}

// isString reads a string or nil and reports whether it is want, without
// copying it.
func (dec *decoder) isString(what, want string) (bool, error) {
	c, err := dec.d.PeekCode()
	if err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	if c == msgpcode.Nil {
		return false, dec.d.DecodeNil()
	}
	if !msgpcode.IsString(c) {
		return false, fmt.Errorf("%s: msgpack code %#x, want a string", what, c)
	}
	body, err := dec.body()
	if err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	return string(body) == want, nil
}

// body reads a str or bin header and returns its body as a view of the
// input (no copy), bounded by the bytes left.
func (dec *decoder) body() ([]byte, error) {
	n, err := dec.d.DecodeBytesLen()
	if err != nil {
		return nil, err
	}
	off := len(dec.in) - dec.r.Len()
	if err := dec.discard(n); err != nil {
		return nil, err
	}
	return dec.in[off : off+n : off+n], nil
}

// fieldName reads a map key and returns the known field it names, as
// that field's constant string (no allocation), or "" for a field this
// decoder does not read.
func (dec *decoder) fieldName() (string, error) {
	c, err := dec.d.PeekCode()
	if err != nil {
		return "", fmt.Errorf("field name: %w", err)
	}
	if !msgpcode.IsString(c) {
		return "", fmt.Errorf("field name: msgpack code %#x, want a string", c)
	}
	body, err := dec.body()
	if err != nil {
		return "", fmt.Errorf("field name: %w", err)
	}
	for _, f := range knownFields {
		if string(body) == f {
			return f, nil
		}
	}
	return "", nil
}

// knownFields are the map-form fields the decoder reads; a field's bit in
// mapEvent's seen mask is its index here.
var knownFields = [...]string{"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "medium", "lora_name", "group_idx", "kv_cache_spec_kind"}

// specState is the kv_cache_spec_kind of a state group (vLLM's MambaSpec).
const specState = "mamba"

// hash reads an ExternalBlockHash: an integer, or bytes (last 8, big-endian).
// A byte hash is read in place, without a copy.
func (dec *decoder) hash() (uint64, error) {
	c, err := dec.d.PeekCode()
	if err != nil {
		return 0, err
	}
	if msgpcode.IsBin(c) || msgpcode.IsString(c) {
		b, err := dec.body()
		if err != nil {
			return 0, err
		}
		if len(b) == 0 {
			return 0, fmt.Errorf("empty byte hash")
		}
		var v [8]byte
		copy(v[8-min(8, len(b)):], b[max(0, len(b)-8):])
		return binary.BigEndian.Uint64(v[:]), nil
	}
	if c == msgpcode.Nil {
		return 0, fmt.Errorf("nil hash")
	}
	return dec.d.DecodeUint64() // negative integers keep their bits
}

// hashes reads an array of hashes. Its context (the field and the index)
// is formatted only for an error, so a long array costs 8 bytes a hash.
func (dec *decoder) hashes(what string) ([]uint64, error) {
	n, err := dec.arrayLen(what)
	if err != nil {
		return nil, err
	}
	hs := make([]uint64, 0, n) // n <= the bytes left: every hash takes one
	for i := range n {
		h, err := dec.hash()
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", what, i, err)
		}
		hs = append(hs, h)
	}
	return hs, nil
}

func (dec *decoder) tokens() ([]int32, error) {
	n, err := dec.arrayLen("token_ids")
	if err != nil {
		return nil, err
	}
	ts := make([]int32, 0, n)
	for i := range n {
		v, err := dec.d.DecodeInt64()
		if err != nil || v < 0 || v > math.MaxInt32 {
			return nil, fmt.Errorf("token_ids[%d] = %d: want 0..2^31-1 (%v)", i, v, err)
		}
		ts = append(ts, int32(v))
	}
	return ts, nil
}

func (dec *decoder) optInt(what string, lo, hi int64) (v int64, present bool, err error) {
	isNil, err := dec.nilNext()
	if err != nil || isNil {
		return 0, false, err
	}
	v, err = dec.d.DecodeInt64()
	if err != nil || v < lo || v > hi {
		return 0, false, fmt.Errorf("%s = %d: want %d..%d (%v)", what, v, lo, hi, err)
	}
	return v, true, nil
}

func (dec *decoder) event() (Event, error) {
	c, err := dec.d.PeekCode()
	if err != nil {
		return Event{}, err
	}
	if msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32 {
		return dec.mapEvent()
	}
	return dec.arrayEvent()
}

func kindOf(tag string) (Kind, error) {
	if i := slices.Index(kindTags[:], tag); i > 0 {
		return Kind(i), nil
	}
	return 0, fmt.Errorf("unknown event tag %q", tag)
}

// field decodes one named field into ev; unknown names are skipped.
func (dec *decoder) field(ev *Event, name string) error {
	var err error
	switch name {
	case "block_hashes":
		ev.Hashes, err = dec.hashes("block_hashes")
	case "parent_block_hash":
		var isNil bool
		if isNil, err = dec.nilNext(); err == nil && !isNil {
			ev.Parent, err = dec.hash()
			ev.HasParent = err == nil
		}
	case "token_ids":
		ev.Tokens, err = dec.tokens()
	case "block_size":
		var v int64
		v, _, err = dec.optInt("block_size", 1, math.MaxInt32)
		ev.BlockSize = int(v)
	case "medium":
		ev.Medium, err = dec.str("medium")
	case "lora_name":
		ev.LoRAName, err = dec.str("lora_name")
	case "group_idx":
		var v int64
		v, ev.HasGroup, err = dec.optInt("group_idx", 0, math.MaxInt32)
		ev.Group = int(v)
	case "kv_cache_spec_kind":
		ev.State, err = dec.isString("kv_cache_spec_kind", specState)
	default:
		err = dec.skip(0)
	}
	return err
}

// maxDepth bounds the nesting of skipped values (vLLM's deepest unknown
// field, extra_keys, nests three deep), so hostile input cannot recurse
// without bound.
const maxDepth = 16

// skip skips one value of a field this decoder does not read.
func (dec *decoder) skip(depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("value nested deeper than %d", maxDepth)
	}
	c, err := dec.d.PeekCode()
	if err != nil {
		return err
	}
	n := 0
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		if n, err = dec.arrayLen("skipped array"); err != nil {
			return err
		}
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		if n, err = dec.d.DecodeMapLen(); err != nil {
			return err
		}
		if n > dec.r.Len() {
			return fmt.Errorf("skipped map of %d entries in %d bytes", n, dec.r.Len())
		}
		n *= 2
	default:
		return dec.skipScalar(c)
	}
	for range n {
		if err := dec.skip(depth + 1); err != nil {
			return err
		}
	}
	return nil
}

// skipScalar skips a value that is not an array or a map, reading its
// length header itself and checking the declared body against the bytes
// left before moving past it: nothing is allocated, whatever it declares.
// (msgpack.Decoder.Skip allocates a str32, bin32 or ext32 body's declared
// length before it finds the input short: 1 MiB for a 41-byte message.)
func (dec *decoder) skipScalar(c byte) error {
	if _, err := dec.r.ReadByte(); err != nil {
		return err
	}
	var body int // bytes after the code and the length header
	switch {
	case c <= msgpcode.PosFixedNumHigh, c >= msgpcode.NegFixedNumLow, c == msgpcode.Nil, c == msgpcode.False, c == msgpcode.True:
	case msgpcode.IsFixedString(c):
		body = int(c & msgpcode.FixedStrMask)
	case c == msgpcode.Uint8, c == msgpcode.Int8:
		body = 1
	case c == msgpcode.Uint16, c == msgpcode.Int16:
		body = 2
	case c == msgpcode.Uint32, c == msgpcode.Int32, c == msgpcode.Float:
		body = 4
	case c == msgpcode.Uint64, c == msgpcode.Int64, c == msgpcode.Double:
		body = 8
	case c == msgpcode.FixExt1, c == msgpcode.FixExt2, c == msgpcode.FixExt4, c == msgpcode.FixExt8, c == msgpcode.FixExt16:
		body = 1 + 1<<(c-msgpcode.FixExt1) // the type byte, then 1..16 bytes
	case c == msgpcode.Str8, c == msgpcode.Bin8, c == msgpcode.Ext8:
		n, err := dec.uintN(1)
		if err != nil {
			return err
		}
		body = n
	case c == msgpcode.Str16, c == msgpcode.Bin16, c == msgpcode.Ext16:
		n, err := dec.uintN(2)
		if err != nil {
			return err
		}
		body = n
	case c == msgpcode.Str32, c == msgpcode.Bin32, c == msgpcode.Ext32:
		n, err := dec.uintN(4)
		if err != nil {
			return err
		}
		body = n
	default:
		return fmt.Errorf("msgpack code %#x is not a value", c)
	}
	if c == msgpcode.Ext8 || c == msgpcode.Ext16 || c == msgpcode.Ext32 {
		body++ // the extension's type byte
	}
	return dec.discard(body)
}

// uintN reads an n-byte big-endian length.
func (dec *decoder) uintN(n int) (int, error) {
	var b [4]byte
	if _, err := io.ReadFull(dec.r, b[4-n:]); err != nil {
		return 0, fmt.Errorf("%d-byte length: %w", n, err)
	}
	return int(binary.BigEndian.Uint32(b[:])), nil
}

// discard moves past n bytes of the input, which must hold them.
func (dec *decoder) discard(n int) error {
	if n < 0 || n > dec.r.Len() {
		return fmt.Errorf("%d bytes declared, %d left", n, dec.r.Len())
	}
	_, err := dec.r.Seek(int64(n), io.SeekCurrent)
	return err
}

// check validates a decoded event's shape.
func (ev *Event) check() error {
	switch ev.Kind {
	case BlockStored:
		if len(ev.Hashes) == 0 || ev.BlockSize < 1 || len(ev.Tokens) != len(ev.Hashes)*ev.BlockSize {
			return fmt.Errorf("BlockStored of %d hashes, %d tokens, block size %d: want tokens = hashes * block size > 0",
				len(ev.Hashes), len(ev.Tokens), ev.BlockSize)
		}
	case BlockRemoved:
		if len(ev.Hashes) == 0 {
			return fmt.Errorf("BlockRemoved without hashes")
		}
	}
	return nil
}

func (dec *decoder) mapEvent() (Event, error) {
	n, err := dec.d.DecodeMapLen()
	if err != nil {
		return Event{}, err
	}
	if n < 1 || 2*n > dec.r.Len() {
		return Event{}, fmt.Errorf("event map of %d entries in %d bytes", n, dec.r.Len())
	}
	var ev Event
	var seen uint // bit i: knownFields[i] was read
	for range n {
		k, err := dec.fieldName()
		if err != nil {
			return Event{}, err
		}
		if k == "" { // a field this decoder does not read
			if err := dec.skip(0); err != nil {
				return Event{}, fmt.Errorf("unknown field: %w", err)
			}
			continue
		}
		bit := uint(1) << slices.Index(knownFields[:], k)
		if seen&bit != 0 {
			return Event{}, fmt.Errorf("field %q twice", k)
		}
		seen |= bit
		if k == "type" {
			tag, err := dec.str("type")
			if err != nil {
				return Event{}, err
			}
			if ev.Kind, err = kindOf(tag); err != nil {
				return Event{}, err
			}
			continue
		}
		if err := dec.field(&ev, k); err != nil {
			return Event{}, fmt.Errorf("%s: %w", k, err)
		}
	}
	if ev.Kind == 0 {
		return Event{}, fmt.Errorf("event without a \"type\" tag")
	}
	return ev, ev.check()
}

// Positional fields of the array form, after the tag.
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
)

func (dec *decoder) arrayEvent() (Event, error) {
	n, err := dec.arrayLen("event")
	if err != nil {
		return Event{}, err
	}
	if n < 1 {
		return Event{}, fmt.Errorf("empty event array")
	}
	tag, err := dec.str("tag")
	if err != nil {
		return Event{}, err
	}
	var ev Event
	if ev.Kind, err = kindOf(tag); err != nil {
		return Event{}, err
	}
	var names []string
	switch ev.Kind {
	case BlockStored:
		names = storedFields
	case BlockRemoved:
		names = removedFields
	}
	for i := 1; i < n; i++ {
		name := "unknown"
		if i-1 < len(names) {
			name = names[i-1]
		}
		if err := dec.field(&ev, name); err != nil {
			return Event{}, fmt.Errorf("%s: %w", name, err)
		}
	}
	return ev, ev.check()
}
