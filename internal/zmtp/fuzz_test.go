package zmtp

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/pagedkv/pagedkv/internal/heaptest"
)

// Limits of the fuzzed reader: frames up to 1 MiB, so that bodies take
// the path that grows with the bytes received; few frames, so that the
// fuzzer reaches the frame limit.
const (
	fuzzMaxMessage = 1 << 20
	fuzzMaxFrames  = 8
	// fuzzAllocPerByte bounds the heap bytes the reader allocates per input
	// byte: an empty frame is 2 input bytes and costs its slot in the
	// message's frame slice (24 bytes, up to twice over while the slice
	// grows), and a large body at most 4 bytes per byte received (buffers
	// doubling). fuzzAllocSlack covers the part of a body allocated before
	// its bytes arrive (one chunk) and the reader's buffer.
	fuzzAllocPerByte = 32
	fuzzAllocSlack   = bodyChunk + 8<<10
)

// FuzzReader feeds raw bytes to what reads a peer: the greeting check,
// then the frame reader, with READY parsed when the first item is a
// command. It checks that the reader yields exactly what the reference
// reader (refRead) yields, that nothing returned breaks the limits, and
// that the heap bytes allocated stay within fuzzAllocPerByte × input +
// fuzzAllocSlack, whatever sizes the input declares.
func FuzzReader(f *testing.F) {
	ready := append(greeting(), readyCommand("PUB", nil)...)
	f.Add(append(bytes.Clone(ready), appendFrame(appendFrame(nil, flagMore, []byte("kv")), 0, []byte("payload"))...))
	f.Add(append(bytes.Clone(ready), binary.BigEndian.AppendUint64([]byte{flagLong}, 1<<62)...))
	f.Add(append(bytes.Clone(ready), binary.BigEndian.AppendUint64([]byte{flagLong}, 1<<44)...))
	f.Add(append(bytes.Clone(ready), bytes.Repeat([]byte{flagMore, 1, 'x'}, 100)...))
	// A frame just under the limit whose body never comes.
	f.Add(append(append(bytes.Clone(ready), binary.BigEndian.AppendUint64([]byte{flagLong}, fuzzMaxMessage-100)...), "only this"...))
	f.Add(append(greeting(), readyCommand("DEALER", []byte("id"))...))
	rng := rand.New(rand.NewPCG(1, 2))
	for range 8 {
		f.Add(append(bytes.Clone(ready), randomStream(rng, 4096, fuzzMaxFrames)...))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < greetingLen || checkGreeting(data[:greetingLen]) != nil {
			return
		}
		stream := data[greetingLen:]
		var alloc uint64
		var err error
		alloc = heaptest.Growth(func() { err = drain(stream) })
		if limit := uint64(fuzzAllocPerByte*len(data) + fuzzAllocSlack); alloc > limit {
			t.Fatalf("reading %d bytes allocated %d bytes, over %d", len(data), alloc, limit)
		}
		got, err2 := readAll(stream, fuzzMaxMessage, fuzzMaxFrames)
		if kindOf(err) != kindOf(err2) {
			t.Fatalf("two reads of one input ended %v and %v", err, err2)
		}
		want, wantEnd := refRead(stream, fuzzMaxMessage, fuzzMaxFrames)
		if kindOf(err2) != wantEnd || !itemsEqual(got, want) {
			t.Fatalf("reader: %s, %v\nmodel:  %s, %s", describe(got), err2, describe(want), wantEnd)
		}
		for i, it := range got {
			if it.message == nil {
				if len(it.command) > maxCommandBytes {
					t.Fatalf("item %d: a command of %d bytes", i, len(it.command))
				}
				if i == 0 {
					if cmd, err := parseCommand(it.command); err == nil && cmd.name == "READY" {
						md, err := parseReady(cmd.data)
						if err == nil && (md.socketType == "" || len(md.identity) > 255) {
							t.Fatalf("READY accepted as %+v", md)
						}
					}
				}
				continue
			}
			if len(it.message) > fuzzMaxFrames || messageBytes(it.message) > fuzzMaxMessage {
				t.Fatalf("item %d: a message of %d frames, %d bytes", i, len(it.message), messageBytes(it.message))
			}
		}
	})
}

// drain reads every item of stream, keeping none.
func drain(stream []byte) error {
	fr := &frameReader{r: bufio.NewReaderSize(bytes.NewReader(stream), 16), maxMessage: fuzzMaxMessage, maxFrames: fuzzMaxFrames}
	for {
		if _, _, err := fr.next(); err != nil {
			return err
		}
	}
}
