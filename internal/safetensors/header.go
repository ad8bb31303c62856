package safetensors

import (
	"fmt"
	"math"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// The header is parsed by hand rather than with encoding/json: its schema is
// tiny and fixed, and a purpose-built parser can refuse what the format does
// not allow (duplicate keys, unknown fields, signed or fractional
// dimensions, invalid UTF-8, as the Rust implementation does), bound every
// list before allocating it, and allocate about once per tensor, so that what
// Parse allocates stays a small multiple of the header's length.

// entry is one tensor as declared in the header.
type entry struct {
	name       string
	dtype      DType
	shape      []int
	begin, end uint64
}

type headerParser struct {
	b   []byte
	pos int
}

func (p *headerParser) errorf(tensor, format string, args ...any) error {
	return malformed(tensor, "header JSON at byte %d: %s", p.pos, fmt.Sprintf(format, args...))
}

func (p *headerParser) skipSpace() {
	for p.pos < len(p.b) {
		switch p.b[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// peek returns the next non-space byte (0 at the end).
func (p *headerParser) peek() byte {
	p.skipSpace()
	if p.pos >= len(p.b) {
		return 0
	}
	return p.b[p.pos]
}

func (p *headerParser) expect(tensor string, c byte) error {
	if got := p.peek(); got != c {
		return p.errorf(tensor, "want %q, found %s", c, p.describe())
	}
	p.pos++
	return nil
}

// describe names what is at the current position, for messages.
func (p *headerParser) describe() string {
	if p.pos >= len(p.b) {
		return "the end of the header"
	}
	end := min(p.pos+16, len(p.b))
	return fmt.Sprintf("%q", p.b[p.pos:end])
}

// parseHeader parses the header JSON: one object whose members are tensor
// entries and an optional "__metadata__" object of strings.
func parseHeader(b []byte) (entries []entry, meta map[string]string, err error) {
	if !utf8.Valid(b) {
		return nil, nil, malformed("", "header is not valid UTF-8")
	}
	p := &headerParser{b: b}
	meta = map[string]string{}
	if p.peek() != '{' {
		return nil, nil, p.errorf("", "the header is not a JSON object (found %s)", p.describe())
	}
	p.pos++
	sawMeta := false
	for first := true; ; first = false {
		if p.peek() == '}' && first {
			p.pos++
			break
		}
		key, err := p.str("")
		if err != nil {
			return nil, nil, err
		}
		if err := p.expect(key, ':'); err != nil {
			return nil, nil, err
		}
		switch key {
		case MetadataKey:
			if sawMeta {
				return nil, nil, p.errorf("", "__metadata__ appears twice")
			}
			sawMeta = true
			if err := p.metadata(meta); err != nil {
				return nil, nil, err
			}
		case "":
			return nil, nil, p.errorf("", "a tensor has an empty name")
		default:
			e, err := p.entry(key)
			if err != nil {
				return nil, nil, err
			}
			entries = append(entries, e)
		}
		c := p.peek()
		p.pos++
		if c == '}' {
			break
		}
		if c != ',' {
			p.pos--
			return nil, nil, p.errorf("", "want ',' or '}' after the entry %q, found %s", key, p.describe())
		}
	}
	if p.peek() != 0 {
		return nil, nil, p.errorf("", "trailing data after the header's JSON object: %s", p.describe())
	}
	return entries, meta, nil
}

// metadata parses `null` or an object of string values into meta.
func (p *headerParser) metadata(meta map[string]string) error {
	if p.literal("null") {
		return nil
	}
	if p.peek() != '{' {
		return p.errorf("", "__metadata__ is not an object of strings (found %s)", p.describe())
	}
	p.pos++
	if p.peek() == '}' {
		p.pos++
		return nil
	}
	for {
		k, err := p.str("")
		if err != nil {
			return err
		}
		if err := p.expect("", ':'); err != nil {
			return err
		}
		if p.peek() != '"' {
			return p.errorf("", "__metadata__: the value of %q is not a string (found %s)", k, p.describe())
		}
		v, err := p.str("")
		if err != nil {
			return err
		}
		if _, dup := meta[k]; dup {
			return p.errorf("", "__metadata__: key %q appears twice", k)
		}
		meta[k] = v
		c := p.peek()
		p.pos++
		if c == '}' {
			return nil
		}
		if c != ',' {
			p.pos--
			return p.errorf("", "__metadata__: want ',' or '}', found %s", p.describe())
		}
	}
}

// entry parses {"dtype": ..., "shape": [...], "data_offsets": [b, e]}, each
// field exactly once, in any order.
func (p *headerParser) entry(name string) (entry, error) {
	e := entry{name: name}
	if err := p.expect(name, '{'); err != nil {
		return e, err
	}
	var seenDType, seenShape, seenOffsets bool
	for p.peek() != '}' {
		if seenDType || seenShape || seenOffsets {
			if err := p.expect(name, ','); err != nil {
				return e, err
			}
		}
		field, err := p.str(name)
		if err != nil {
			return e, err
		}
		if err := p.expect(name, ':'); err != nil {
			return e, err
		}
		switch field {
		case "dtype":
			if seenDType {
				return e, p.errorf(name, "field \"dtype\" appears twice")
			}
			seenDType = true
			if p.peek() != '"' {
				return e, p.errorf(name, "dtype is not a string (found %s)", p.describe())
			}
			s, err := p.str(name)
			if err != nil {
				return e, err
			}
			dt, err := ParseDType(s)
			if err != nil {
				err.(*Error).Tensor = name
				return e, err
			}
			e.dtype = dt
		case "shape":
			if seenShape {
				return e, p.errorf(name, "field \"shape\" appears twice")
			}
			seenShape = true
			var buf [MaxRank]uint64
			vals, err := p.uints(buf[:0], name, "shape")
			if err != nil {
				return e, err
			}
			e.shape = make([]int, len(vals))
			for i, d := range vals {
				if d > math.MaxInt {
					return e, p.errorf(name, "dimension %d of the shape, %d, does not fit an int", i, d)
				}
				e.shape[i] = int(d)
			}
		case "data_offsets":
			if seenOffsets {
				return e, p.errorf(name, "field \"data_offsets\" appears twice")
			}
			seenOffsets = true
			var buf [2]uint64
			vals, err := p.uints(buf[:0], name, "data_offsets")
			if err != nil {
				return e, err
			}
			if len(vals) != 2 {
				return e, p.errorf(name, "data_offsets has %d values, want 2 (begin, end)", len(vals))
			}
			e.begin, e.end = vals[0], vals[1]
		default:
			return e, p.errorf(name, "unknown field %q (want dtype, shape, data_offsets)", field)
		}
	}
	p.pos++ // '}'
	switch {
	case !seenDType:
		return e, malformed(name, "no dtype")
	case !seenShape:
		return e, malformed(name, "no shape")
	case !seenOffsets:
		return e, malformed(name, "no data_offsets")
	}
	return e, nil
}

// token returns the text from the current position up to the next
// delimiter (at most 24 bytes), for messages.
func (p *headerParser) token() []byte {
	end := p.pos
	for end < len(p.b) && end-p.pos < 24 {
		switch p.b[end] {
		case ',', ']', '}', ' ', '\t', '\n', '\r':
			return p.b[p.pos:end]
		}
		end++
	}
	return p.b[p.pos:end]
}

// literal consumes word if it comes next.
func (p *headerParser) literal(word string) bool {
	p.skipSpace()
	if len(p.b)-p.pos >= len(word) && string(p.b[p.pos:p.pos+len(word)]) == word {
		p.pos += len(word)
		return true
	}
	return false
}

// uints parses an array of at most cap(dst) non-negative decimal integers
// without sign, fraction, exponent or leading zeros into dst, so that a long
// array costs nothing before it is refused.
func (p *headerParser) uints(dst []uint64, tensor, what string) ([]uint64, error) {
	if err := p.expect(tensor, '['); err != nil {
		return nil, p.errorf(tensor, "%s is not an array of non-negative integers (found %s)", what, p.describe())
	}
	if p.peek() == ']' {
		p.pos++
		return dst, nil
	}
	for {
		p.skipSpace()
		start := p.pos
		for p.pos < len(p.b) && p.b[p.pos] >= '0' && p.b[p.pos] <= '9' {
			p.pos++
		}
		digits := p.b[start:p.pos]
		if c := p.peek(); len(digits) == 0 || c != ',' && c != ']' {
			p.pos = start
			return nil, p.errorf(tensor, "%s: element %q is not a non-negative integer", what, p.token())
		}
		if len(digits) > 1 && digits[0] == '0' {
			p.pos = start
			return nil, p.errorf(tensor, "%s: element %q has a leading zero", what, digits)
		}
		v, err := strconv.ParseUint(string(digits), 10, 64)
		if err != nil {
			return nil, p.errorf(tensor, "%s: element %.24s overflows 64 bits", what, digits)
		}
		if len(dst) == cap(dst) {
			return nil, p.errorf(tensor, "%s has more than %d values", what, cap(dst))
		}
		dst = append(dst, v)
		c := p.peek()
		p.pos++
		if c == ']' {
			break
		}
	}
	return dst, nil
}

// str parses a JSON string. Strings without escapes (all the format
// produces) cost one allocation.
func (p *headerParser) str(tensor string) (string, error) {
	if p.peek() != '"' {
		return "", p.errorf(tensor, "want a string, found %s", p.describe())
	}
	p.pos++
	start := p.pos
	for p.pos < len(p.b) {
		c := p.b[p.pos]
		switch {
		case c == '"':
			s := string(p.b[start:p.pos])
			p.pos++
			return s, nil
		case c == '\\':
			return p.escapedStr(tensor, start)
		case c < 0x20:
			return "", p.errorf(tensor, "control character 0x%02x in a string", c)
		}
		p.pos++
	}
	return "", p.errorf(tensor, "unterminated string")
}

// escapedStr finishes a string that contains a backslash escape.
func (p *headerParser) escapedStr(tensor string, start int) (string, error) {
	out := append([]byte(nil), p.b[start:p.pos]...)
	for p.pos < len(p.b) {
		c := p.b[p.pos]
		switch {
		case c == '"':
			p.pos++
			return string(out), nil
		case c < 0x20:
			return "", p.errorf(tensor, "control character 0x%02x in a string", c)
		case c != '\\':
			out = append(out, c)
			p.pos++
			continue
		}
		if p.pos+1 >= len(p.b) {
			break
		}
		esc := p.b[p.pos+1]
		p.pos += 2
		switch esc {
		case '"', '\\', '/':
			out = append(out, esc)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := p.hex4()
			if !ok {
				return "", p.errorf(tensor, "bad \\u escape")
			}
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if p.pos+1 < len(p.b) && p.b[p.pos] == '\\' && p.b[p.pos+1] == 'u' {
					p.pos += 2
					if r2, ok = p.hex4(); !ok {
						return "", p.errorf(tensor, "bad \\u escape")
					}
				}
				r = utf16.DecodeRune(r, r2) // U+FFFD for a lone surrogate, as encoding/json does
			}
			out = utf8.AppendRune(out, r)
		default:
			return "", p.errorf(tensor, "bad escape \\%c", esc)
		}
	}
	return "", p.errorf(tensor, "unterminated string")
}

func (p *headerParser) hex4() (rune, bool) {
	if len(p.b)-p.pos < 4 {
		return 0, false
	}
	var r rune
	for _, c := range p.b[p.pos : p.pos+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	p.pos += 4
	return r, true
}
