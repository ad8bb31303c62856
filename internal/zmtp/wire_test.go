package zmtp

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/big"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/pagedkv/pagedkv/internal/heaptest"
)

// refItem is what the reference reader yields: a command or a message.
type refItem struct {
	command []byte
	message [][]byte
}

// refRead is the slow, obvious reading of a byte stream under the limits,
// straight from RFC 23's frame grammar: it looks at the whole input at
// once and does its size arithmetic in big integers. It returns the items
// read and how reading ended: "eof" (cleanly, between messages),
// "truncated", "protocol" or "too large".
func refRead(data []byte, maxMessage int64, maxFrames int) ([]refItem, string) {
	var items []refItem
	var cur [][]byte
	used := big.NewInt(0)
	pos := 0
	for {
		if pos == len(data) {
			if len(cur) == 0 {
				return items, "eof"
			}
			return items, "truncated"
		}
		flags := data[pos]
		pos++
		if flags&0xf8 != 0 {
			return items, "protocol"
		}
		more, long, cmd := flags&1 != 0, flags&2 != 0, flags&4 != 0
		sizeBytes := 1
		if long {
			sizeBytes = 8
		}
		if len(data)-pos < sizeBytes {
			return items, "truncated"
		}
		size := new(big.Int).SetBytes(data[pos : pos+sizeBytes])
		pos += sizeBytes
		if cmd {
			if len(cur) > 0 || more {
				return items, "protocol"
			}
			if size.Cmp(big.NewInt(maxCommandBytes)) > 0 {
				return items, "too large"
			}
		} else {
			if len(cur) == maxFrames {
				return items, "too large"
			}
			total := new(big.Int).Add(used, size)
			total.Add(total, big.NewInt(frameOverhead))
			if total.Cmp(big.NewInt(maxMessage)) > 0 {
				return items, "too large"
			}
		}
		n := int(size.Int64())
		if len(data)-pos < n {
			return items, "truncated"
		}
		body := data[pos : pos+n]
		pos += n
		if cmd {
			items = append(items, refItem{command: body})
			continue
		}
		cur = append(cur, body)
		used.Add(used, big.NewInt(int64(n)+frameOverhead))
		if !more {
			items = append(items, refItem{message: cur})
			cur, used = nil, big.NewInt(0)
		}
	}
}

// kindOf names how frameReader.next ended, in refRead's terms.
func kindOf(err error) string {
	switch {
	case errors.Is(err, io.EOF):
		return "eof"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "truncated"
	case errors.Is(err, ErrTooLarge):
		return "too large"
	case errors.Is(err, ErrProtocol):
		return "protocol"
	}
	return "other: " + err.Error()
}

// readAll runs frameReader over data until it fails.
func readAll(data []byte, maxMessage int64, maxFrames int) ([]refItem, error) {
	fr := &frameReader{r: bufio.NewReaderSize(bytes.NewReader(data), 16), maxMessage: maxMessage, maxFrames: maxFrames}
	var items []refItem
	for {
		cmd, msg, err := fr.next()
		if err != nil {
			return items, err
		}
		items = append(items, refItem{command: cmd, message: msg})
	}
}

// randomStream writes random commands and messages near the limits, with
// short sizes sometimes written in the long form, and now and then a
// reserved flag, a command inside a message, a huge declared size or a
// truncation.
func randomStream(rng *rand.Rand, maxMessage int64, maxFrames int) []byte {
	var out []byte
	header := func(flags byte, n uint64) {
		if n > 255 || rng.IntN(4) == 0 {
			out = append(out, flags|flagLong)
			out = binary.BigEndian.AppendUint64(out, n)
			return
		}
		out = append(out, flags, byte(n))
	}
	body := func(n int) {
		for range n {
			out = append(out, byte(rng.IntN(256)))
		}
	}
	for range rng.IntN(8) {
		switch rng.IntN(20) {
		case 0:
			out = append(out, byte(rng.IntN(256))) // anything, reserved bits included
		case 1:
			header(0, []uint64{1 << 62, 1 << 44, 1<<63 + 5, ^uint64(0)}[rng.IntN(4)])
		case 2, 3:
			n := rng.IntN(maxCommandBytes + 2)
			if rng.IntN(2) == 0 {
				n = rng.IntN(40)
			}
			header(flagCommand|byte(rng.IntN(2)*rng.IntN(2)), uint64(n)) // MORE now and then
			body(n)
		default:
			frames := 1 + rng.IntN(maxFrames+2)
			left := int(maxMessage)
			for f := range frames {
				var flags byte
				if f < frames-1 {
					flags = flagMore
				}
				if rng.IntN(30) == 0 {
					flags |= flagCommand
				}
				n := rng.IntN(8)
				if rng.IntN(3) == 0 {
					n = max(0, left-frameOverhead+rng.IntN(3)-1) // the limit, and one either side
				}
				left -= n + frameOverhead
				header(flags, uint64(n))
				body(n)
			}
		}
	}
	if len(out) > 0 && rng.IntN(5) == 0 {
		out = out[:rng.IntN(len(out))]
	}
	return out
}

// TestFrameReaderMatchesModel: on random streams the reader yields what
// the reference yields and ends the same way.
func TestFrameReaderMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(28, 3))
	kinds := map[string]int{}
	for i := range 20_000 {
		maxMessage := int64(frameOverhead + rng.IntN(600))
		maxFrames := 1 + rng.IntN(5)
		data := randomStream(rng, maxMessage, maxFrames)
		want, wantEnd := refRead(data, maxMessage, maxFrames)
		got, err := readAll(data, maxMessage, maxFrames)
		kinds[wantEnd]++
		if gotEnd := kindOf(err); gotEnd != wantEnd || !itemsEqual(got, want) {
			t.Fatalf("run %d (max message %d, max frames %d), input % x:\nreader: %s, %s (%v)\nmodel:  %s, %s",
				i, maxMessage, maxFrames, data, describe(got), gotEnd, err, describe(want), wantEnd)
		}
	}
	for _, k := range []string{"eof", "truncated", "protocol", "too large"} {
		if kinds[k] < 500 {
			t.Errorf("only %d streams ended %q: the generator does not cover it (%v)", kinds[k], k, kinds)
		}
	}
	t.Logf("endings: %v", kinds)
}

func itemsEqual(a, b []refItem) bool {
	return slices.EqualFunc(a, b, func(x, y refItem) bool {
		return (x.message == nil) == (y.message == nil) && bytes.Equal(x.command, y.command) &&
			slices.EqualFunc(x.message, y.message, bytes.Equal)
	})
}

func describe(items []refItem) string {
	var sb strings.Builder
	for _, it := range items {
		if it.message == nil {
			fmt.Fprintf(&sb, "cmd[%x] ", it.command)
			continue
		}
		fmt.Fprintf(&sb, "msg%x ", it.message)
	}
	return sb.String()
}

// TestHugeHeadersAllocateNothing: a frame header that declares more than
// the limit is refused from the header, and one within the limit whose
// bytes never come costs what arrived plus one chunk, not what it
// declared.
func TestHugeHeadersAllocateNothing(t *testing.T) {
	const limit = 64 << 20
	for _, tc := range []struct {
		name  string
		input []byte
		want  string
	}{
		{"2^62", binary.BigEndian.AppendUint64([]byte{flagLong}, 1<<62), "declares 4611686018427387904 bytes after 0 in the message; the limit is 67108864"},
		{"2^44", binary.BigEndian.AppendUint64([]byte{flagLong}, 1<<44), "declares 17592186044416 bytes"},
		{"2^64-1", binary.BigEndian.AppendUint64([]byte{flagLong | flagMore}, ^uint64(0)), "declares 18446744073709551615 bytes"},
		{"limit+1 after a frame", append([]byte{flagMore, 1, 'x', flagLong}, binary.BigEndian.AppendUint64(nil, limit-2*frameOverhead)...), "declares 67108816 bytes after 25 in the message"},
		{"command 2^62", binary.BigEndian.AppendUint64([]byte{flagLong | flagCommand}, 1<<62), "command frame of 4611686018427387904 bytes, at most 4096"},
	} {
		var err error
		alloc := heaptest.Growth(func() { _, err = readAll(tc.input, limit, DefaultMaxFrames) })
		if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrTooLarge with %q", tc.name, err, tc.want)
		}
		if alloc > 4<<10 {
			t.Errorf("%s: allocated %d bytes before refusing", tc.name, alloc)
		}
	}
	// Within the limit, declared 60 MiB, 1 MiB sent: the buffer follows
	// the bytes (doubling from 64 KiB), so well under 60 MiB.
	input := append(binary.BigEndian.AppendUint64([]byte{flagLong}, 60<<20), make([]byte, 1<<20)...)
	var err error
	alloc := heaptest.Growth(func() { _, err = readAll(input, limit, DefaultMaxFrames) })
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("a truncated 60 MiB frame: %v, want io.ErrUnexpectedEOF", err)
	}
	// Doubling from 64 KiB keeps at most the bytes received times 4 (the
	// buffers left behind plus the last) and one chunk.
	if alloc > 4<<20+bodyChunk {
		t.Errorf("a 60 MiB frame with 1 MiB sent allocated %d bytes, want <= 4 MiB + 64 KiB", alloc)
	}
	t.Logf("a 60 MiB frame cut after 1 MiB allocated %d bytes", alloc)
}

func TestGreetingRefusals(t *testing.T) {
	good := greeting()
	if err := checkGreeting(good); err != nil {
		t.Fatalf("our own greeting: %v", err)
	}
	for _, tc := range []struct {
		name   string
		modify func(g []byte)
		want   string
	}{
		{"signature", func(g []byte) { g[0] = 'G' }, "signature 47 00"},
		{"ZMTP 1.0 signature", func(g []byte) { g[9] = 0x7e }, "is not ZMTP's"},
		{"version 2", func(g []byte) { g[10] = 2 }, "ZMTP 2.0"},
		{"PLAIN", func(g []byte) { copy(g[12:], "PLAIN") }, `mechanism "PLAIN"`},
		{"CURVE", func(g []byte) { copy(g[12:], "CURVE") }, `mechanism "CURVE"`},
		{"NULL with junk after", func(g []byte) { g[17] = 'x' }, `mechanism "NULL\x00x"`},
	} {
		g := bytes.Clone(good)
		tc.modify(g)
		if err := checkGreeting(g); !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrProtocol with %q", tc.name, err, tc.want)
		}
	}
}

func TestReadyRefusals(t *testing.T) {
	md, err := parseReady(appendProperty(appendProperty(nil, "socket-type", []byte("DEALER")), "IDENTITY", []byte("me")))
	if err != nil || md.socketType != "DEALER" || string(md.identity) != "me" {
		t.Fatalf("case-insensitive names: %+v %v", md, err)
	}
	long := appendProperty(appendProperty(nil, "Socket-Type", []byte("DEALER")), "Identity", make([]byte, 256))
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"no socket type", appendProperty(nil, "Identity", []byte("x")), "without Socket-Type"},
		{"value size 2^32-1", append(append([]byte{11}, "Socket-Type"...), 0xff, 0xff, 0xff, 0xff, 'P'), `"Socket-Type" declares 4294967295 bytes, 1 left`},
		{"name cut", []byte{20, 'a'}, "truncated"},
		{"identity of 256 bytes", long, "identity of 256 bytes"},
	} {
		if _, err := parseReady(tc.data); !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrProtocol with %q", tc.name, err, tc.want)
		}
	}
	if _, err := parseCommand([]byte{9, 'R'}); !errors.Is(err, ErrProtocol) {
		t.Errorf("a command name longer than its frame: %v", err)
	}
}
