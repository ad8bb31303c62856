package kvindex_test

import (
	"testing"
	"time"

	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/kvindex"
	"github.com/pagedkv/pagedkv/prefixcache"
)

// restartPublisher publishes on the given endpoints ("tcp://127.0.0.1:0"
// for free ports) with a Recorder of testPageSize pages.
func restartPublisher(t *testing.T, endpoint, replay string) (*events.Publisher, *events.Recorder) {
	t.Helper()
	pub, err := events.NewPublisher(events.PublisherConfig{Endpoint: endpoint, Mode: events.Bind, ReplayEndpoint: replay, Topic: "kv-events"})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := pub.NewRecorder(events.RecorderConfig{NumPages: testPages, PageSize: testPageSize})
	if err != nil {
		t.Fatal(err)
	}
	return pub, rec
}

// storeChain has the recorder announce pages *next, *next+1, ... holding
// chain, each the child of the one before, as one batch.
func storeChain(t *testing.T, pub *events.Publisher, rec *events.Recorder, next *int, chain []uint64) {
	t.Helper()
	tokens := make([]int32, testPageSize)
	for i, h := range chain {
		page, parent, parentHash := prefixcache.PageID(*next), prefixcache.PageID(-1), uint64(0)
		if i > 0 {
			parent, parentHash = page-1, chain[i-1]
		}
		rec.PageStored(page, h, parent, parentHash, prefixcache.Key{}, tokens)
		*next++
	}
	if !rec.Flush() || !pub.WaitSent(5*time.Second) {
		t.Fatal("the publisher did not send")
	}
}

// TestSubscriberTakesARestartedPublisher: a publisher sends batches 0..3,
// then restarts on the same endpoints with an empty cache and sends its
// new run from sequence 0. The subscriber must forget the old run's blocks
// and index the new run's (the old code ignored every batch numbered at
// most 3, so it kept matching 16 tokens the replica no longer holds and
// never indexed the new ones).
func TestSubscriberTakesARestartedPublisher(t *testing.T) {
	t.Parallel()
	pub, rec := restartPublisher(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
	endpoint, replay := pub.Endpoint(), pub.ReplayEndpoint()
	ix, err := kvindex.New(kvindex.Config{PageSize: testPageSize, Seed: testSeed})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := kvindex.NewSubscriber(ix, kvindex.SubscriberConfig{Topic: "kv"}, kvindex.Source{Name: "r", Endpoint: endpoint, ReplayEndpoint: replay})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if !pub.WaitSubscribed(5 * time.Second) {
		t.Fatal("no subscription reached the publisher")
	}
	old := []uint64{101, 102, 103, 104}
	next := 0
	for _, h := range old { // one page a batch: sequences 0..3
		storeChain(t, pub, rec, &next, []uint64{h})
	}
	if !sub.WaitApplied(0, 3, 10*time.Second) {
		t.Fatalf("applied %d of 4 batches (stats %+v)", sub.Applied(0), sub.Stats(0))
	}
	if got := ix.MatchHashes(nil, old)[0]; got != 4*testPageSize {
		t.Fatalf("before the restart the index matches %d tokens, want %d", got, 4*testPageSize)
	}
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	pub2, rec2 := restartPublisher(t, endpoint, replay)
	defer pub2.Close()
	if !pub2.WaitSubscribed(10 * time.Second) {
		t.Fatal("the subscriber did not reconnect to the restarted publisher")
	}
	fresh, next2 := []uint64{201, 202}, 0
	deadline := time.Now().Add(10 * time.Second)
	for ix.MatchHashes(nil, fresh)[0] != 2*testPageSize {
		if time.Now().After(deadline) {
			t.Fatalf("the new run's chain matched %d tokens, want %d; the old run's %d (stats %+v, index %+v)",
				ix.MatchHashes(nil, fresh)[0], 2*testPageSize, ix.MatchHashes(nil, old)[0], sub.Stats(0), ix.Stats(0))
		}
		storeChain(t, pub2, rec2, &next2, fresh) // resent: the first may precede the subscription
		time.Sleep(20 * time.Millisecond)
	}
	if got := ix.MatchHashes(nil, old)[0]; got != 0 {
		t.Fatalf("after the restart the index matches %d tokens of the old run's blocks, want 0", got)
	}
	if st := ix.Stats(0); st.Restarts != 1 {
		t.Fatalf("index stats %+v: want one restart", st)
	}
}
