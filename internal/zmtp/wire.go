package zmtp

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Frame flags (ZMTP 3.0, RFC 23: bit 0 MORE, bit 1 LONG, bit 2 COMMAND;
// bits 3-7 are reserved and must be zero).
const (
	flagMore     = 0x01
	flagLong     = 0x02
	flagCommand  = 0x04
	flagReserved = 0xf8
)

const (
	greetingLen = 64
	// maxCommandBytes bounds a command frame's body (READY with a 255-byte
	// identity and a socket type is under 300 bytes).
	maxCommandBytes = 4096
	// bodyChunk is how much of a frame body is allocated before its bytes
	// have arrived: larger bodies grow with what the peer actually sends,
	// so a header that declares the limit and sends nothing costs nothing.
	bodyChunk = 64 << 10
	// frameOverhead is what each frame counts against the message limit
	// beyond its body (the slice header that holds it), so that a message
	// of many empty frames is bounded too.
	frameOverhead = 24
)

var (
	// ErrProtocol is a peer that broke ZMTP: a bad greeting, an unknown
	// mechanism, a malformed command, an incompatible socket type.
	ErrProtocol = errors.New("zmtp: protocol violation")
	// ErrTooLarge is a frame or message over the socket's limits, refused
	// from its header before anything is allocated for it.
	ErrTooLarge = errors.New("zmtp: message over the limit")
)

// greeting returns the 64-byte ZMTP 3.0 greeting with the NULL mechanism.
// Minor version 0: libzmq then speaks 3.0 to us (subscriptions as data
// messages with a leading 0x01/0x00, no heartbeats), which is what every
// ZMTP 3 implementation accepts.
func greeting() []byte {
	g := make([]byte, greetingLen)
	g[0] = 0xff
	g[9] = 0x7f
	g[10] = 3 // major
	g[11] = 0 // minor
	copy(g[12:32], "NULL")
	// g[32] as-server = 0 (NULL has no roles), g[33:64] filler.
	return g
}

// checkGreeting validates a peer's greeting: ZMTP 3.x signature and the
// NULL mechanism.
func checkGreeting(g []byte) error {
	if len(g) != greetingLen {
		return fmt.Errorf("%w: greeting of %d bytes, want %d", ErrProtocol, len(g), greetingLen)
	}
	if g[0] != 0xff || g[9]&1 == 0 {
		return fmt.Errorf("%w: greeting signature % x is not ZMTP's (ff … 7f)", ErrProtocol, g[:10])
	}
	if g[10] < 3 {
		return fmt.Errorf("%w: peer speaks ZMTP %d.%d, want 3.x", ErrProtocol, g[10], g[11])
	}
	mech := g[12:32]
	if name := bytes.TrimRight(mech, "\x00"); string(name) != "NULL" {
		return fmt.Errorf("%w: security mechanism %q, want \"NULL\"", ErrProtocol, name)
	}
	return nil
}

// appendFrame appends one frame (header and body) to dst.
func appendFrame(dst []byte, flags byte, body []byte) []byte {
	dst = appendFrameHeader(dst, flags, len(body))
	return append(dst, body...)
}

func appendFrameHeader(dst []byte, flags byte, n int) []byte {
	if n > 255 {
		dst = append(dst, flags|flagLong)
		return binary.BigEndian.AppendUint64(dst, uint64(n))
	}
	return append(dst, flags, byte(n))
}

// writeMessage writes frames as one message (MORE on all but the last).
func writeMessage(w *bufio.Writer, frames [][]byte) error {
	var hdr [9]byte
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags = flagMore
		}
		if _, err := w.Write(appendFrameHeader(hdr[:0], flags, len(f))); err != nil {
			return err
		}
		if _, err := w.Write(f); err != nil {
			return err
		}
	}
	return nil
}

// readyCommand returns the READY command frame announcing the socket type
// and, when not nil, the identity.
func readyCommand(socketType string, identity []byte) []byte {
	body := append([]byte{5}, "READY"...)
	body = appendProperty(body, "Socket-Type", []byte(socketType))
	if identity != nil {
		body = appendProperty(body, "Identity", identity)
	}
	return appendFrame(nil, flagCommand, body)
}

func appendProperty(dst []byte, name string, value []byte) []byte {
	dst = append(dst, byte(len(name)))
	dst = append(dst, name...)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(value)))
	return append(dst, value...)
}

// pongCommand answers a PING's data (a 2-byte TTL, then up to 16 bytes of
// context) with a PONG carrying the context.
func pongCommand(ping []byte) []byte {
	var context []byte
	if len(ping) > 2 {
		context = ping[2:min(len(ping), 2+16)]
	}
	return appendFrame(nil, flagCommand, append(append([]byte{4}, "PONG"...), context...))
}

// command is a parsed command frame.
type command struct {
	name string
	data []byte
}

func parseCommand(body []byte) (command, error) {
	if len(body) == 0 || int(body[0]) > len(body)-1 {
		return command{}, fmt.Errorf("%w: command frame of %d bytes has no complete name", ErrProtocol, len(body))
	}
	n := int(body[0])
	return command{name: string(body[1 : 1+n]), data: body[1+n:]}, nil
}

// metadata is what a peer's READY announces.
type metadata struct {
	socketType string
	identity   []byte
}

// parseReady reads READY's properties: name-size (1 byte), name,
// value-size (4 bytes big-endian), value; names are case-insensitive.
func parseReady(data []byte) (metadata, error) {
	var md metadata
	for len(data) > 0 {
		n := int(data[0])
		if len(data) < 1+n+4 {
			return md, fmt.Errorf("%w: READY property truncated (%d bytes left for a %d-byte name and its size)", ErrProtocol, len(data)-1, n)
		}
		name := string(data[1 : 1+n])
		vlen := binary.BigEndian.Uint32(data[1+n:])
		data = data[1+n+4:]
		if uint64(vlen) > uint64(len(data)) {
			return md, fmt.Errorf("%w: READY property %q declares %d bytes, %d left", ErrProtocol, name, vlen, len(data))
		}
		value := data[:vlen]
		data = data[vlen:]
		switch {
		case strings.EqualFold(name, "Socket-Type"):
			md.socketType = string(value)
		case strings.EqualFold(name, "Identity"):
			if len(value) > 255 {
				return md, fmt.Errorf("%w: identity of %d bytes, at most 255", ErrProtocol, len(value))
			}
			md.identity = bytes.Clone(value)
		}
	}
	if md.socketType == "" {
		return md, fmt.Errorf("%w: READY without Socket-Type", ErrProtocol)
	}
	return md, nil
}

// frameReader reads frames and whole messages from a peer, checking every
// declared size against its limits before allocating for it.
type frameReader struct {
	r          *bufio.Reader
	maxMessage int64 // bytes of one message, frame bodies plus frameOverhead each
	maxFrames  int   // frames of one message
}

// next returns the next command (cmd != nil) or the next complete message.
func (fr *frameReader) next() (cmd []byte, msg [][]byte, err error) {
	var used int64
	for {
		flags, size, err := fr.header()
		if err != nil {
			if err == io.EOF && len(msg) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return nil, nil, err
		}
		if flags&flagCommand != 0 {
			if len(msg) > 0 {
				return nil, nil, fmt.Errorf("%w: command frame inside a message, after frame %d", ErrProtocol, len(msg))
			}
			if flags&flagMore != 0 {
				return nil, nil, fmt.Errorf("%w: command frame with the MORE flag", ErrProtocol)
			}
			if size > maxCommandBytes {
				return nil, nil, fmt.Errorf("%w: command frame of %d bytes, at most %d", ErrTooLarge, size, maxCommandBytes)
			}
			body, err := readBody(fr.r, int(size))
			return body, nil, err
		}
		if len(msg) >= fr.maxFrames {
			return nil, nil, fmt.Errorf("%w: more than %d frames in one message", ErrTooLarge, fr.maxFrames)
		}
		// used <= maxMessage always holds, so the subtraction is safe.
		if size > uint64(fr.maxMessage-used) || uint64(fr.maxMessage-used)-size < frameOverhead {
			return nil, nil, fmt.Errorf("%w: frame %d declares %d bytes after %d in the message; the limit is %d",
				ErrTooLarge, len(msg), size, used, fr.maxMessage)
		}
		body, err := readBody(fr.r, int(size))
		if err != nil {
			return nil, nil, err
		}
		used += int64(size) + frameOverhead
		msg = append(msg, body)
		if flags&flagMore == 0 {
			return nil, msg, nil
		}
	}
}

// header reads a frame's flags and declared body size.
func (fr *frameReader) header() (flags byte, size uint64, err error) {
	flags, err = fr.r.ReadByte()
	if err != nil {
		return 0, 0, err
	}
	if flags&flagReserved != 0 {
		return 0, 0, fmt.Errorf("%w: frame flags %#02x set reserved bits", ErrProtocol, flags)
	}
	if flags&flagLong == 0 {
		b, err := fr.r.ReadByte()
		return flags, uint64(b), eofIsUnexpected(err)
	}
	var buf [8]byte
	if _, err := io.ReadFull(fr.r, buf[:]); err != nil {
		return 0, 0, eofIsUnexpected(err)
	}
	return flags, binary.BigEndian.Uint64(buf[:]), nil
}

func eofIsUnexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// readBody reads n bytes (n already checked against the limits). Up to
// bodyChunk is allocated at once; beyond that the buffer grows with the
// bytes received, so memory follows what the peer sent, not what it
// declared.
func readBody(r io.Reader, n int) ([]byte, error) {
	if n <= bodyChunk {
		b := make([]byte, n)
		_, err := io.ReadFull(r, b)
		return b, eofIsUnexpected(err)
	}
	b := make([]byte, 0, bodyChunk)
	for len(b) < n {
		if len(b) == cap(b) {
			grown := make([]byte, len(b), min(2*cap(b), n))
			copy(grown, b)
			b = grown
		}
		m, err := r.Read(b[len(b):min(cap(b), n)])
		b = b[:len(b)+m]
		if err != nil && len(b) < n {
			return nil, eofIsUnexpected(err)
		}
	}
	return b, nil
}

// Handshake returns what a socket of type t with the given identity sends
// first: the greeting and READY. For tests and tools that speak raw ZMTP.
func Handshake(t Type, identity []byte) []byte {
	return append(greeting(), readyCommand(t.String(), identity)...)
}
