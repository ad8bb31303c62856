package kvindex_test

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/pagedkv/pagedkv/kvindex"
)

// The hostile-publisher test runs the subscriber in a child process (this
// test binary, re-executed), because on a transport that trusts frame
// headers the child dies of an unrecoverable panic or out-of-memory kill.
const (
	hostileEnv = "PAGEDKV_HOSTILE_PUBLISHER" // "PUB endpoint,replay endpoint" in the child
	// tinyFrames is how many tiny frames the publisher sends in one message,
	// and how many tiny one-frame messages after that.
	tinyFrames = 1_000_000
	// hostileHash is the block the last, well-formed message stores: the
	// subscriber still indexes after everything before it.
	hostileHash = 0x5eed
)

// maxRSSBytes is the child's stated peak-memory bound: its whole resident
// set, Go runtime and test binary included, stays below the subscriber's
// 64 MiB message limit. A transport that allocates what a 2^44-byte header
// declares exceeds it (or dies). Under the race detector, whose shadow
// memory grows with the memory the run touches (its 10^6 rejected
// messages allocate about 226 MiB in all), the bound is 256 MiB: seen
// 40-78 MiB there, against 13 MiB without it.
var maxRSSBytes int64 = 64 << 20

func init() {
	if kvindex.RaceEnabled {
		maxRSSBytes = 256 << 20
	}
}

// childReport is what the child prints as its last line.
type childReport struct {
	MaxRSSKiB  int64  // getrusage(RUSAGE_SELF).ru_maxrss
	TotalAlloc uint64 // runtime.MemStats, bytes allocated over the run
	HeapSys    uint64
	Stats      string // kvindex.SourceStats, %+v
	Blocks     []uint64
}

// TestHostilePublisher: a publisher endpoint sends a frame header that
// declares 2^62 bytes, then one declaring 2^44, then one message of 10^6
// tiny frames, then 10^6 tiny one-frame messages, then a valid batch; the
// replay endpoint sends a 2^62-byte header too. The subscriber (in a child
// process) disconnects each offending connection as soon as the header
// arrives, reports the peer with its endpoint, keeps its peak memory under
// maxRSSBytes, and indexes the valid batch at the end.
func TestHostilePublisher(t *testing.T) {
	if eps := os.Getenv(hostileEnv); eps != "" {
		hostileChild(t, eps)
		return
	}
	pubLn, replayLn := loopbackPair(t)
	pubEP, replayEP := "tcp://"+pubLn.Addr().String(), "tcp://"+replayLn.Addr().String()

	cmd := exec.Command(os.Args[0], "-test.run=^TestHostilePublisher$", "-test.v")
	cmd.Env = append(os.Environ(), hostileEnv+"="+pubEP+","+replayEP)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	childDone := make(chan error, 1)
	go func() { childDone <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
	}()

	go hostileReplay(replayLn)
	phases := make(chan string, 8)
	go hostilePublisher(pubLn, phases)

	select {
	case err := <-childDone:
		for len(phases) > 0 {
			t.Log(<-phases)
		}
		if err != nil {
			t.Fatalf("the subscriber's process failed: %v\n%s", err, tail(out.String(), 3000))
		}
	case <-time.After(4 * time.Minute):
		t.Fatalf("the subscriber's process did not finish\n%s", tail(out.String(), 3000))
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var rep childReport
	for _, l := range lines {
		if s, ok := strings.CutPrefix(l, "REPORT "); ok {
			if err := json.Unmarshal([]byte(s), &rep); err != nil {
				t.Fatal(err)
			}
		}
	}
	if rep.MaxRSSKiB == 0 {
		t.Fatalf("no report from the child:\n%s", tail(out.String(), 3000))
	}
	t.Logf("child: peak RSS %.1f MiB (bound %d MiB), %.1f MiB allocated in all, heap %.1f MiB; %s",
		float64(rep.MaxRSSKiB)/1024, maxRSSBytes>>20, float64(rep.TotalAlloc)/(1<<20), float64(rep.HeapSys)/(1<<20), rep.Stats)
	if rep.MaxRSSKiB*1024 > maxRSSBytes {
		t.Errorf("peak RSS %d KiB, over the bound of %d MiB", rep.MaxRSSKiB, maxRSSBytes>>20)
	}
	// The three offending PUB connections and the replay connection.
	for _, want := range []string{"PeerErrors:4 ", "LastPeerErr:zmtp: peer tcp://"} {
		if !strings.Contains(rep.Stats, want) {
			t.Errorf("stats %s: want %q", rep.Stats, want)
		}
	}
	if !strings.Contains(rep.Stats, "peer "+pubEP+": ") && !strings.Contains(rep.Stats, "peer "+replayEP+": ") {
		t.Errorf("stats %s name neither endpoint (%s, %s)", rep.Stats, pubEP, replayEP)
	}
	if !strings.Contains(rep.Stats, fmt.Sprintf("Errors:%d ", tinyFrames)) {
		t.Errorf("stats %s: want every one of the %d tiny messages refused by the decoder", rep.Stats, tinyFrames)
	}
	if !slices.Equal(rep.Blocks, []uint64{hostileHash}) {
		t.Errorf("indexed blocks %v, want [%#x] from the last, valid batch", rep.Blocks, hostileHash)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// hostileChild is the subscriber's process: it follows the hostile
// endpoints until the valid batch is indexed and prints its report.
func hostileChild(t *testing.T, eps string) {
	pubEP, replayEP, _ := strings.Cut(eps, ",")
	ix, err := kvindex.New(kvindex.Config{PageSize: 4, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := kvindex.NewSubscriber(ix, kvindex.SubscriberConfig{}, kvindex.Source{Name: "hostile", Endpoint: pubEP, ReplayEndpoint: replayEP})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	deadline := time.Now().Add(3 * time.Minute)
	for len(ix.Blocks(0)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the valid batch was not indexed: %+v", sub.Stats(0))
		}
		time.Sleep(10 * time.Millisecond)
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rep, _ := json.Marshal(childReport{MaxRSSKiB: ru.Maxrss, TotalAlloc: ms.TotalAlloc, HeapSys: ms.HeapSys,
		Stats: fmt.Sprintf("%+v", sub.Stats(0)), Blocks: ix.Blocks(0)})
	fmt.Printf("REPORT %s\n", rep)
}

// zmtpHandshake does a ZMTP 3.0 NULL handshake as socketType, written out
// byte by byte (not with internal/zmtp), and reads the peer's greeting and
// READY.
func zmtpHandshake(conn net.Conn, socketType string) (*bufio.Reader, error) {
	greeting := make([]byte, 64)
	greeting[0], greeting[9], greeting[10] = 0xff, 0x7f, 3
	copy(greeting[12:], "NULL")
	ready := append([]byte{5}, "READY"...)
	ready = append(append(ready, 11), "Socket-Type"...)
	ready = binary.BigEndian.AppendUint32(ready, uint32(len(socketType)))
	ready = append(ready, socketType...)
	if _, err := conn.Write(append(append(greeting, 0x04, byte(len(ready))), ready...)); err != nil {
		return nil, err
	}
	r := bufio.NewReader(conn)
	if _, err := io.ReadFull(r, make([]byte, 64)); err != nil {
		return nil, fmt.Errorf("greeting: %w", err)
	}
	return r, skipFrame(r)
}

// skipFrame reads one (short) frame.
func skipFrame(r *bufio.Reader) error {
	var hdr [2]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	_, err := io.ReadFull(r, make([]byte, hdr[1]))
	return err
}

// longHeader is a data frame header declaring n bytes.
func longHeader(n uint64) []byte { return binary.BigEndian.AppendUint64([]byte{0x02}, n) }

// hostilePublisher serves the PUB endpoint: one hostile phase per
// connection, each on a fresh connection after the subscriber dropped
// the previous one, then the tiny messages and the valid batch.
func hostilePublisher(ln net.Listener, phases chan<- string) {
	tinyMsg := make([]byte, 0, 3*tinyFrames)
	for range tinyFrames {
		tinyMsg = append(tinyMsg, 0x01, 1, 'x') // MORE, 1 byte
	}
	tinyMsg = append(tinyMsg, 0x00, 1, 'x')
	tinyMsgs := make([]byte, 0, 3*tinyFrames)
	for range tinyFrames {
		tinyMsgs = append(tinyMsgs, 0x00, 1, 'x')
	}
	hostile := []struct {
		name  string
		bytes []byte
	}{
		{"a frame header declaring 2^62 bytes", longHeader(1 << 62)},
		{"a frame header declaring 2^44 bytes", longHeader(1 << 44)},
		{fmt.Sprintf("one message of %d tiny frames", tinyFrames+1), tinyMsg},
	}
	for _, h := range hostile {
		conn, r, err := acceptHandshake(ln, "PUB")
		if err != nil {
			phases <- fmt.Sprintf("%s: %v", h.name, err)
			return
		}
		if err := skipFrame(r); err != nil { // the subscription
			phases <- fmt.Sprintf("%s: no subscription: %v", h.name, err)
			return
		}
		start := time.Now()
		go conn.Write(h.bytes) // the subscriber may stop reading midway
		// The subscriber must drop the connection without reading a body.
		_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
		_, err = r.ReadByte()
		phases <- fmt.Sprintf("%s: the subscriber dropped the connection after %v (%v)", h.name, time.Since(start).Round(time.Millisecond), err)
		conn.Close()
	}
	conn, r, err := acceptHandshake(ln, "PUB")
	if err != nil {
		phases <- fmt.Sprintf("last connection: %v", err)
		return
	}
	defer conn.Close()
	if err := skipFrame(r); err != nil {
		phases <- fmt.Sprintf("last connection: no subscription: %v", err)
		return
	}
	payload, err := msgpack.Marshal([]any{1.0, []any{map[string]any{"type": "BlockStored", "block_hashes": []uint64{hostileHash},
		"parent_block_hash": nil, "token_ids": []int{1, 2, 3, 4}, "block_size": 4, "lora_id": nil, "medium": "GPU", "lora_name": nil}}, 0})
	if err != nil {
		phases <- fmt.Sprintf("the valid batch: %v", err)
		return
	}
	valid := append([]byte{0x01, 0, 0x01, 8}, binary.BigEndian.AppendUint64(nil, 0)...) // topic "", seq 0
	valid = append(append(valid, 0x00, byte(len(payload))), payload...)
	if _, err := conn.Write(append(tinyMsgs, valid...)); err != nil {
		phases <- fmt.Sprintf("tiny messages: %v", err)
	}
	_, _ = io.Copy(io.Discard, r) // until the child is done
}

func acceptHandshake(ln net.Listener, socketType string) (net.Conn, *bufio.Reader, error) {
	conn, err := ln.Accept()
	if err != nil {
		return nil, nil, err
	}
	r, err := zmtpHandshake(conn, socketType)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, r, nil
}

// hostileReplay serves the replay endpoint: the first connection gets a
// 2^62-byte frame header, later ones a quiet ROUTER.
func hostileReplay(ln net.Listener) {
	for first := true; ; first = false {
		conn, r, err := acceptHandshake(ln, "ROUTER")
		if err != nil {
			return
		}
		if first {
			_, _ = conn.Write(longHeader(1 << 62))
		}
		go func() {
			defer conn.Close()
			_, _ = io.Copy(io.Discard, r)
		}()
	}
}
