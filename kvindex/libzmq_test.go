package kvindex_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pagedkv/pagedkv/internal/pythontest"
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
	pythontest.Require(t, "zmq", "msgpack")
	const batches = 60
	pub := pythontest.Start(t, "testdata/vllm_publisher.py", strconv.Itoa(batches))
	defer pub.Stdin.Close()
	var line string
	select {
	case line = <-pub.Lines:
	case <-time.After(time.Minute):
	}
	fields := strings.Fields(line)
	if len(fields) != 3 || fields[0] != "READY" {
		t.Fatalf("the publisher did not start: %q", line)
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
