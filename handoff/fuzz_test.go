package handoff

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/heaptest"
)

// fuzzConfig has small limits: whatever a stream says, the reader may not
// allocate much past them.
func fuzzConfig() Config {
	cfg := testConfig()
	cfg.Limits = Limits{MaxPages: 8, MaxBytes: 8 << 10}
	cfg.check()
	return cfg
}

// fuzzAllocBound is what reading one stream of fuzzConfig may allocate:
// 8 pages of 512 bytes with their values' heads, tokens, runs, the MAC
// state and the read buffers, with room to spare.
const fuzzAllocBound = 256 << 10

// checkAccepted fails t unless the request r accepted from stream b is
// exactly what the writer produces for it on the same connection.
func checkAccepted(t *testing.T, cfg Config, r *Received, b []byte) {
	req := &Request{Tenant: r.Tenant, LoRA: r.LoRA, Salt: r.Salt, Tokens: r.Tokens, Runs: r.Runs, GroupTag: r.GroupTag, State: r.State, Retention: r.Retention}
	for _, p := range r.Pages {
		req.Pages = append(req.Pages, p.Data)
	}
	var again bytes.Buffer
	if err := WriteRequest(&again, cfg, testNonce, req); err != nil {
		t.Fatalf("accepted request does not write: %v", err)
	}
	// The reader takes one request and leaves what follows it.
	if again.Len() > len(b) || !bytes.Equal(again.Bytes(), b[:again.Len()]) {
		t.Fatalf("accepted stream is not the writer's")
	}
}

// readBounded reads stream b and fails t if that allocated more than
// fuzzAllocBound.
func readBounded(t *testing.T, cfg Config, b []byte) (*Received, error) {
	var r *Received
	var err error
	if grew := heaptest.Growth(func() { r, err = ReadRequest(bytes.NewReader(b), cfg, testNonce) }); grew > fuzzAllocBound {
		t.Fatalf("reading %d bytes allocated %d (err %v)", len(b), grew, err)
	}
	return r, err
}

// FuzzReadRequest feeds raw bytes to the stream reader (the deployment's
// key, a fixed nonce) with small limits: it never panics or allocates past
// the limits, and whatever it accepts is exactly the stream the writer
// produces for what it returned. Raw bytes rarely get past the head's
// tag: FuzzReadRequestSigned goes on from there.
func FuzzReadRequest(f *testing.F) {
	cfg := fuzzConfig()
	var good bytes.Buffer
	if err := WriteRequest(&good, cfg, testNonce, testRequest(1, 2, []int32{3, 4})); err != nil {
		f.Fatal(err)
	}
	f.Add(good.Bytes())
	f.Add(good.Bytes()[:40])
	f.Add([]byte("PKVH\x01\x00\x00\x00"))
	f.Add([]byte("PKVH\x03\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := readBounded(t, cfg, b); err == nil {
			checkAccepted(t, cfg, r, b)
		}
	})
}

// bodyBytes is the length of the namespace, tokens and runs a head says.
func bodyBytes(hd []byte) int {
	n := 0
	for i := range 3 {
		n += int(binary.LittleEndian.Uint16(hd[2*i:]))
	}
	n += int(binary.LittleEndian.Uint16(hd[6:]) &^ stateBit) // the group tag
	return n + 4*int(binary.LittleEndian.Uint32(hd[8:])) + 8*int(binary.LittleEndian.Uint32(hd[12:])) +
		retentionRangeBytes*int(binary.LittleEndian.Uint16(hd[20:]))
}

// signFuzz makes raw bytes a stream whose tags verify: b is read as the
// prelude and head, then the namespace, tokens and runs (as long as the
// head says), then the pages, and the tags are put where the reader
// expects them, computed under the deployment's key. So the fuzzer drives
// everything a key holder could send.
func signFuzz(cfg Config, b []byte) []byte {
	var out bytes.Buffer
	s := newStreamWriter(&out, &cfg, &testNonce)
	take := func(n int) []byte {
		n = max(0, min(n, len(b)))
		v := b[:n]
		b = b[n:]
		return v
	}
	s.w.Write(take(preludeBytes))
	hd := take(headBytes)
	s.write(hd)
	if len(hd) < headBytes {
		s.flush()
		return out.Bytes()
	}
	s.checkpoint(tagHead)
	s.write(take(bodyBytes(hd)))
	if len(b) > 0 {
		s.checkpoint(tagHeader)
	}
	s.write(b)
	s.checkpoint(tagStream)
	s.flush()
	return out.Bytes()
}

// unsign is signFuzz's inverse for a whole stream: the stream without its
// tags.
func unsign(b []byte) []byte {
	hd := b[preludeBytes : preludeBytes+headBytes]
	body := bodyBytes(hd)
	out := append([]byte(nil), b[:preludeBytes+headBytes]...)
	b = b[preludeBytes+headBytes+TagBytes:]
	out = append(out, b[:body]...)
	b = b[body+TagBytes:]
	return append(out, b[:len(b)-TagBytes]...)
}

// FuzzReadRequestSigned is FuzzReadRequest past the tags: the fuzzer's
// bytes are a stream with its tags left out, put in by signFuzz. Counts,
// runs, tokens and values are all the fuzzer's; memory stays bounded and
// anything accepted is the writer's stream.
func FuzzReadRequestSigned(f *testing.F) {
	cfg := fuzzConfig()
	kept := testRequest(3, 2, []int32{7, 8})
	kept.Retention = []RetentionRange{{Start: 0, End: 4, Priority: 2, Duration: 1e9, Session: 1}, {Start: 4, Ephemeral: true}}
	for _, r := range []*Request{testRequest(1, 2, []int32{3, 4}), testRequest(2, 3, []int32{5, 1, 2}), {}, groupRequest(3), stateRequest(4, 3), kept} {
		var good bytes.Buffer
		if err := WriteRequest(&good, cfg, testNonce, r); err != nil {
			f.Fatal(err)
		}
		f.Add(unsign(good.Bytes()))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		b := signFuzz(cfg, raw)
		if r, err := readBounded(t, cfg, b); err == nil {
			checkAccepted(t, cfg, r, b)
		}
	})
}

// replayConn is a connection whose reads are a fixed byte string (a
// receiver's side of the conversation) and whose writes are dropped.
type replayConn struct {
	net.Conn // never called
	r        io.Reader
}

func (c replayConn) Read(b []byte) (int, error)  { return c.r.Read(b) }
func (c replayConn) Write(b []byte) (int, error) { return len(b), nil }

// receiverBytes is what a receiver with cfg's key sends on the connection
// of nonce: its hello and the two replies.
func receiverBytes(cfg Config, nonce Nonce, verdict, ack byte, msg string) []byte {
	b := append([]byte{'P', 'K', 'V', 'H', StreamVersion, helloAuth, 0, 0}, nonce[:]...)
	b = appendReply(b, &cfg, &nonce, replyVerdict, verdict, "")
	return appendReply(b, &cfg, &nonce, replyAck, ack, msg)
}

// verifiedAck reports whether b holds a hello and two replies, continue
// then admitted, whose tags verify under cfg's key: read here without
// the sender's code.
func verifiedAck(cfg Config, b []byte) bool {
	if len(b) < helloBytes || string(b[:5]) != "PKVH"+string(rune(StreamVersion)) {
		return false
	}
	var nonce Nonce
	copy(nonce[:], b[8:helloBytes])
	b = b[helloBytes:]
	for seq, want := range []byte{ackContinue, ackAdmitted} {
		if len(b) < 3 {
			return false
		}
		n := int(binary.LittleEndian.Uint16(b[1:]))
		if b[0] != want || len(b) < 3+n+TagBytes {
			return false
		}
		tag := cfg.replyTag(&nonce, byte(seq+1), b[0], b[3:3+n])
		if !bytes.Equal(tag[:], b[3+n:3+n+TagBytes]) {
			return false
		}
		b = b[3+n+TagBytes:]
	}
	return true
}

// FuzzSendReplies feeds raw bytes to a sender as the receiver's side of
// the conversation (its hello, verdict and acknowledgement): it never
// panics or allocates past its own buffers, and it reports success only
// when both replies verify under the key, whatever the bytes claim.
func FuzzSendReplies(f *testing.F) {
	cfg := fuzzConfig()
	req := testRequest(1, 2, []int32{3, 4})
	n := Nonce{5}
	f.Add(receiverBytes(cfg, n, ackContinue, ackAdmitted, "1"))
	f.Add(receiverBytes(cfg, n, ackContinue, ackAlreadyHeld, "admission 1: 1 of 2 pages"))
	f.Add(receiverBytes(cfg, n, ackBusy, ackRefused, "busy"))
	f.Add(appendRefusal(nil, "handoff: bad stream: stream version 3"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var err error
		if grew := heaptest.Growth(func() { err = send(replayConn{r: bytes.NewReader(b)}, &cfg, req) }); grew > 1<<20 {
			t.Fatalf("%d reply bytes: the sender allocated %d", len(b), grew)
		}
		if err == nil && !verifiedAck(cfg, b) {
			t.Fatalf("the sender believed an acknowledgement that does not verify")
		}
	})
}

// FuzzSendReplies' seeds do what they say.
func TestSendReadsReplies(t *testing.T) {
	cfg := fuzzConfig()
	req := testRequest(1, 2, []int32{3, 4})
	n := Nonce{5}
	run := func(b []byte) error { return send(replayConn{r: bytes.NewReader(b)}, &cfg, req) }
	require.NoError(t, run(receiverBytes(cfg, n, ackContinue, ackAdmitted, "1")))
	require.ErrorIs(t, run(receiverBytes(cfg, n, ackContinue, ackAlreadyHeld, "1 of 2")), ErrAlreadyHeld)
	err := run(receiverBytes(cfg, n, ackBusy, ackRefused, "x"))
	require.ErrorIs(t, err, ErrBusy)
	require.ErrorIs(t, err, ErrRefused)
	require.ErrorIs(t, run(appendRefusal(nil, "too many")), ErrRefused)
	other := cfg
	other.Key = []byte("not the deployment's key (32 b).")
	require.ErrorIs(t, run(receiverBytes(other, n, ackContinue, ackAdmitted, "1")), ErrAuth)
	b := receiverBytes(cfg, n, ackContinue, ackAdmitted, "1")
	b[len(b)-TagBytes-1] = '2' // the admission's message changed under its tag
	require.ErrorIs(t, run(b), ErrAuth)
}

// FuzzRetentionRange feeds raw bytes to a retention range's parser: it
// never panics, accepts only a range within the limits, and what it
// accepts is exactly what the writer writes for it.
func FuzzRetentionRange(f *testing.F) {
	f.Add(appendRetentionRange(nil, RetentionRange{Start: 4, End: 8, Priority: 3, Duration: 5e9, Session: 1}))
	f.Add(appendRetentionRange(nil, RetentionRange{Start: 9, Ephemeral: true}))
	f.Add(make([]byte, retentionRangeBytes))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) != retentionRangeBytes {
			return
		}
		r, err := parseRetentionRange(0, b)
		if err != nil {
			return
		}
		if err := checkRetention([]RetentionRange{r}); err != nil {
			t.Fatalf("accepted range %+v does not check: %v", r, err)
		}
		if again := appendRetentionRange(nil, r); !bytes.Equal(again, b) {
			t.Fatalf("accepted range %x re-encodes to %x", b, again)
		}
	})
}
