package kvindex_test

import (
	"bufio"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pagedkv/pagedkv/kvindex"
)

// TestLibzmqPublisherJoinReplay: the subscriber follows a publisher on
// libzmq shaped after vLLM's ZmqEventPublisher
// (testdata/vllm_publisher.py: PUB and ROUTER, pyzmq and Python's
// msgpack), joining after the stream has started, replaying the start from
// the ROUTER and indexing every batch. It needs Debian's python3-zmq and
// python3-msgpack (.ci/run installs them); without them it is skipped,
// except under CI=true.
func TestLibzmqPublisherJoinReplay(t *testing.T) {
	const python = "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import zmq, msgpack").Run(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s cannot import zmq and msgpack (apt-get install python3-zmq python3-msgpack), and CI=true: %v", python, err)
		}
		t.Skipf("%s cannot import zmq and msgpack (apt-get install python3-zmq python3-msgpack): %v", python, err)
	}
	const batches = 60
	cmd := exec.Command(python, "testdata/vllm_publisher.py", strconv.Itoa(batches))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("the publisher: %v\n%s", err, stderr.String())
		}
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	fields := strings.Fields(line)
	if err != nil || len(fields) != 3 || fields[0] != "READY" {
		t.Fatalf("the publisher did not start: %q %v\n%s", line, err, stderr.String())
	}
	time.Sleep(200 * time.Millisecond) // join a running stream

	ix, err := kvindex.New(kvindex.Config{PageSize: 4, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := kvindex.NewSubscriber(ix, kvindex.SubscriberConfig{Topic: "kv@", JoinReplay: true},
		kvindex.Source{Name: "vllm", Endpoint: fields[1], ReplayEndpoint: fields[2]})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if !sub.WaitApplied(0, batches-1, time.Minute) {
		t.Fatalf("applied up to %d of %d batches: %+v", sub.Applied(0), batches, sub.Stats(0))
	}
	st := sub.Stats(0)
	if st.Replays == 0 || st.Replayed == 0 || st.Errors != 0 || st.Unrepaired != 0 || st.PeerErrors != 0 {
		t.Fatalf("stats %+v: want a join replay and no errors", st)
	}
	// Batch s stores s+1 and, for odd s, removes s (stored by batch
	// s-1): the odd hashes are gone, the even ones 2..batches stay.
	var want []uint64
	for h := uint64(2); h <= batches; h += 2 {
		want = append(want, h)
	}
	if got := ix.Blocks(0); !slices.Equal(got, want) {
		t.Fatalf("indexed %v\nwant    %v", got, want)
	}
	t.Logf("%+v", st)
}
