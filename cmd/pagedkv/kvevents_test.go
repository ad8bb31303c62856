package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pagedkv/pagedkv/internal/invariants"
	"github.com/pagedkv/pagedkv/internal/vllmwire"
	"github.com/pagedkv/pagedkv/internal/zmtp"
)

// raceArgs shrink a run under -race (invariant checks on every Manager
// call make steps about twenty times slower): a one-layer model checked
// every 8 steps. Plain `go test` runs the full sizes.
func raceArgs(requests int) []string {
	if !invariants.Enabled {
		return smallModel
	}
	return []string{"--requests", strconv.Itoa(requests), "--layers", "1", "--qo-heads", "2", "--kv-heads", "1", "--head-dim", "8", "--verify-every", "8"}
}

// syncBuffer is a strings.Builder safe to read while a run writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// kvSubscriber collects every message published on a KV-event socket.
type kvSubscriber struct {
	mu   sync.Mutex
	msgs []vllmwire.Message
}

// subscribeKV dials addr with a SUB socket (closed when the test ends) and
// collects every message it receives on a goroutine of its own.
func subscribeKV(t *testing.T, addr string) *kvSubscriber {
	t.Helper()
	sub, err := zmtp.New(zmtp.Config{Type: zmtp.SUB, ReconnectInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	if err := sub.Subscribe(""); err != nil {
		t.Fatal(err)
	}
	if err := sub.Connect(addr); err != nil {
		t.Fatal(err)
	}
	s := &kvSubscriber{}
	go func() {
		for {
			m, err := sub.Recv()
			if err != nil {
				return
			}
			msg, err := vllmwire.ParseMessage(m.Frames)
			if err != nil {
				t.Error(err)
				return
			}
			s.mu.Lock()
			s.msgs = append(s.msgs, msg)
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *kvSubscriber) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.msgs)
}

// messages returns the messages received so far.
func (s *kvSubscriber) messages() []vllmwire.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.msgs)
}

// startSimulate runs simulate with args on its own goroutine and returns
// once its PUB socket is bound (it then waits for a subscriber): dialing a
// port nobody listens on yet can connect the socket to itself (TCP
// simultaneous open on an ephemeral port).
func startSimulate(t *testing.T, args []string) (done <-chan int, out, errOut *syncBuffer) {
	t.Helper()
	out, errOut = &syncBuffer{}, &syncBuffer{}
	ch := make(chan int, 1)
	go func() { ch <- runSimulate(args, out, errOut) }()
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(errOut.String(), "publishing KV events on") {
		select {
		case code := <-ch:
			t.Fatalf("simulate exited %d before publishing\n%s\n%s", code, out.String(), errOut.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("simulate did not start publishing")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return ch, out, errOut
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestSimulateKVEvents: a subscriber that decodes with internal/vllmwire
// (written from vLLM's definitions; no code shared with the publisher)
// receives and decodes every event of a simulate run: contiguous sequence
// numbers from 0 up to what the run reports, a consistent page set, and
// the replay socket returns the run's batches byte for byte.
func TestSimulateKVEvents(t *testing.T) {
	t.Parallel()
	addr := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	replayAddr := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	args := append([]string{"--kv-events", addr, "--kv-events-replay", replayAddr, "--kv-events-linger", "6s",
		"--kv-events-wait", "1m", "--requests", "24", "--quiet"}, raceArgs(16)...)
	done, simOut, simErr := startSimulate(t, args)

	sub := subscribeKV(t, addr)

	// The run ends with --kv-events-linger of replay service: once the
	// stream is quiet, replay from sequence 5 as vLLM's example subscriber
	// does (a REQ-style envelope, here on a DEALER with an identity).
	count := sub.count
	for last, since := -1, time.Now(); ; time.Sleep(50 * time.Millisecond) {
		if n := count(); n != last {
			last, since = n, time.Now()
		} else if n > 0 && time.Since(since) > 2500*time.Millisecond {
			break
		}
		if time.Since(since) > 2*time.Minute {
			t.Fatal("no KV events")
		}
	}
	dealer, err := zmtp.New(zmtp.Config{Type: zmtp.DEALER, Identity: []byte("kvevents-test")})
	if err != nil {
		t.Fatal(err)
	}
	defer dealer.Close()
	if err := dealer.Connect(replayAddr); err != nil {
		t.Fatal(err)
	}
	if err := dealer.Send([][]byte{{}, binary.BigEndian.AppendUint64(nil, 5)}); err != nil {
		t.Fatal(err)
	}
	atReplay := count()
	var replayed [][]byte
	for {
		m, err := dealer.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Frames) != 4 || len(m.Frames[0]) != 0 {
			t.Fatalf("replay reply of %d frames", len(m.Frames))
		}
		if seq := int64(binary.BigEndian.Uint64(m.Frames[2])); seq == -1 {
			if len(m.Frames[1]) != 0 || len(m.Frames[3]) != 0 {
				t.Fatal("end marker with a topic or payload")
			}
			break
		}
		replayed = append(replayed, m.Frames[1:]...)
	}

	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("simulate exited %d\n%s\n%s", code, simOut.String(), simErr.String())
		}
	case <-time.After(5 * time.Minute):
		t.Fatal("simulate did not finish")
	}
	res := struct{ out string }{simOut.String()}
	line := regexp.MustCompile(`(?m)^kv events:\s+(\d+) batches \(seq 0\.\.(-?\d+)\), (\d+) events, (\d+) pages`).FindStringSubmatch(res.out)
	if line == nil {
		t.Fatalf("no kv events line in\n%s", res.out)
	}
	batches, _ := strconv.Atoi(line[1])
	nevents, _ := strconv.Atoi(line[3])
	if batches < 10 {
		t.Fatalf("only %d batches published", batches)
	}
	msgs := sub.messages()
	if len(msgs) != batches {
		t.Fatalf("received %d messages, the run published %d", len(msgs), batches)
	}
	set := vllmwire.Set{}
	decoded, stored := 0, 0
	for i, m := range msgs {
		if m.Seq != int64(i) || m.Topic != "kv-events" {
			t.Fatalf("message %d: seq %d topic %q", i, m.Seq, m.Topic)
		}
		b, err := vllmwire.Decode(m.Payload)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if b.DPRank == nil || *b.DPRank != 0 || b.TS < 1e9 {
			t.Fatalf("message %d: ts %v rank %v", i, b.TS, b.DPRank)
		}
		for _, e := range b.Events {
			if e.Type == "BlockStored" {
				stored++
				if e.BlockSize != 16 || e.Medium == nil || *e.Medium != "GPU" {
					t.Fatalf("message %d: %+v", i, e)
				}
			}
		}
		decoded += len(b.Events)
		if err := set.Apply(b); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	if decoded != nevents || stored == 0 {
		t.Fatalf("decoded %d events (%d stored), the run published %d", decoded, stored, nevents)
	}

	// The replay holds every batch published when it was asked (a slow
	// step may have made the stream look quiet before the run ended).
	if len(replayed)%3 != 0 || len(replayed)/3 < atReplay-5 || len(replayed)/3 > batches-5 {
		t.Fatalf("replay from 5 returned %d frames; %d batches had arrived, %d were published", len(replayed), atReplay, batches)
	}
	for i := 0; i < len(replayed); i += 3 {
		msg, err := vllmwire.ParseMessage(replayed[i : i+3])
		want := int64(5 + i/3)
		if err != nil || msg.Seq != want || msg.Topic != "kv-events" || string(msg.Payload) != string(msgs[want].Payload) {
			t.Fatalf("replayed %d (%v), want %d with the published payload", msg.Seq, err, want)
		}
	}
}

// TestSimulateReplicas: with --replicas 4 on the default workload,
// prefix-aware routing over the replicas' KV events hits the prefix cache
// more than round robin, and every replica still verifies attention. Under
// -race the workload is cut to its first 32 requests (the default run takes
// minutes there); plain `go test` runs all of it.
func TestSimulateReplicas(t *testing.T) {
	t.Parallel()
	var out, errOut strings.Builder
	code := runSimulate(append([]string{"--replicas", "4", "--quiet"}, raceArgs(32)...), &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), errOut.String())
	}
	m := regexp.MustCompile(`(?m)^prefix hits:\s+prefix-aware (\d+) of (\d+) prompt tokens \([\d.]+%\); round-robin (\d+) of (\d+) prompt`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no prefix hits line in\n%s", out.String())
	}
	pa, _ := strconv.Atoi(m[1])
	rr, _ := strconv.Atoi(m[3])
	if m[2] != m[4] || pa <= rr {
		t.Fatalf("prefix-aware hit %s of %s tokens, round robin %s of %s: want more\n%s", m[1], m[2], m[3], m[4], out.String())
	}
	if !regexp.MustCompile(`(?m)^verification:\s+passed on every replica`).MatchString(out.String()) {
		t.Fatalf("verification did not pass:\n%s", out.String())
	}
	t.Logf("prefix-aware %d, round robin %d of %s prompt tokens hit", pa, rr, m[2])

	// Flags that only make sense for one replica are refused.
	for _, bad := range [][]string{{"--replicas", "2", "--kv-events", "tcp://127.0.0.1:1"}, {"--replicas", "0"}, {"--replicas", "65"}} {
		var o, e strings.Builder
		if code := runSimulate(append(bad, "--quiet"), &o, &e); code != exitUsage || !strings.Contains(e.String(), "--replicas") {
			t.Errorf("%v: exit %d, stderr %q", bad, code, e.String())
		}
	}
}

// TestSimulateKVEventsPython: a subscriber on libzmq (pyzmq) and Python's
// msgpack, written from vLLM's definitions (tools/kvevents_subscriber.py),
// receives and checks every event of a simulate run and replays it. It
// needs Debian's python3-zmq and python3-msgpack (.ci/run installs them);
// without them it is skipped, except under CI=true, where it fails.
func TestSimulateKVEventsPython(t *testing.T) {
	t.Parallel()
	const python = "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import zmq, msgpack").Run(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s cannot import zmq and msgpack (apt-get install python3-zmq python3-msgpack): %v", python, err)
		}
		t.Skipf("%s cannot import zmq and msgpack (apt-get install python3-zmq python3-msgpack): %v", python, err)
	}
	addr := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	replayAddr := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	// The run lingers 8s after its last step: the script calls the stream
	// done after 3s of quiet and then replays.
	cmd := exec.Command(python, "../../tools/kvevents_subscriber.py", addr, replayAddr, "kv-events", "3")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	args := append([]string{"--kv-events", addr, "--kv-events-replay", replayAddr, "--kv-events-linger", "8s",
		"--kv-events-wait", "1m", "--requests", "24", "--pages", "48", "--host-pages", "24", "--quiet"}, raceArgs(16)...)
	done, out, errOut := startSimulate(t, args)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != "READY" {
		t.Fatalf("the subscriber did not start: %q %s", lines.Text(), stderr.String())
	}
	if code := <-done; code != 0 {
		t.Fatalf("simulate exited %d\n%s\n%s", code, out.String(), errOut.String())
	}
	if !lines.Scan() {
		t.Fatalf("no result from the subscriber: %s", stderr.String())
	}
	var got struct {
		Messages, Events, Stored, Removed, Cleared, Replayed, Blocks int
		StoredCPU                                                    int `json:"stored_cpu"` // host-tier pages (--host-pages)
	}
	if err := json.Unmarshal([]byte(lines.Text()), &got); err != nil {
		t.Fatalf("%v: %q", err, lines.Text())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the subscriber failed: %v\n%s", err, stderr.String())
	}
	m := regexp.MustCompile(`(?m)^kv events:\s+(\d+) batches \(seq 0\.\.\d+\), (\d+) events, (\d+) pages`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no kv events line in\n%s", out.String())
	}
	batches, _ := strconv.Atoi(m[1])
	nevents, _ := strconv.Atoi(m[2])
	pages, _ := strconv.Atoi(m[3])
	if got.Messages != batches || got.Events != nevents || got.Stored+got.Removed != pages || got.Replayed != batches-1 || got.Stored == 0 || got.StoredCPU == 0 {
		t.Fatalf("the Python subscriber saw %+v; the run published %d batches, %d events, %d pages", got, batches, nevents, pages)
	}
	t.Logf("libzmq subscriber: %+v", got)
}
