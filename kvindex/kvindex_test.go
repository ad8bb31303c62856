package kvindex_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	pagedkv "github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/internal/churn"
	"github.com/pagedkv/pagedkv/kvindex"
)

// replica is a Manager publishing its events over loopback ZMQ, driven by
// random requests that share prefixes.
type replica struct {
	*churn.Driver
	pub *events.Publisher
	rec *events.Recorder
}

const (
	testPages    = 40
	testPageSize = 4
	testSeed     = 7
)

func newReplica(t testing.TB, seed uint64, roots [][]int32) *replica {
	pub, err := events.NewPublisher(events.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Mode: events.Bind,
		ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv-events"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	rec, err := pub.NewRecorder(events.RecorderConfig{NumPages: testPages, PageSize: testPageSize})
	if err != nil {
		t.Fatal(err)
	}
	m, err := pagedkv.New(pagedkv.Config{NumPages: testPages, PageSize: testPageSize, HashSeed: testSeed, CacheEvents: rec})
	if err != nil {
		t.Fatal(err)
	}
	return &replica{Driver: &churn.Driver{T: t, Rng: rand.New(rand.NewPCG(seed, 5)), M: m, Roots: roots,
		Namespaces: []pagedkv.Namespace{{}, {Tenant: "b"}, {LoRA: "adapter"}}}, pub: pub, rec: rec}
}

func sources(reps []*replica) []kvindex.Source {
	var out []kvindex.Source
	for i, r := range reps {
		out = append(out, kvindex.Source{Name: fmt.Sprint("replica-", i), Endpoint: r.pub.Endpoint(), ReplayEndpoint: r.pub.ReplayEndpoint()})
	}
	return out
}

// TestSubscriberReconstructsCaches: over loopback ZMQ, the page set the
// index reconstructs for each replica equals the Manager's cached set after
// every step, with a subscriber that loses 10% of the messages (repaired by
// replay) and one that joins late (replaying from sequence 0).
func TestSubscriberReconstructsCaches(t *testing.T) {
	t.Parallel()
	const nrep, steps, joinAt = 2, 150, 60
	rng := rand.New(rand.NewPCG(3, 3))
	roots := churn.Roots(rng, testPageSize)
	reps := make([]*replica, nrep)
	for i := range reps {
		reps[i] = newReplica(t, uint64(i), roots)
	}
	newIndex := func() *kvindex.Index {
		ix, err := kvindex.New(kvindex.Config{PageSize: testPageSize, Seed: testSeed})
		if err != nil {
			t.Fatal(err)
		}
		return ix
	}
	lossy := newIndex()
	// Lose is called from every source's goroutine: a pure function of the
	// message loses about one in nine.
	lose := func(src int, seq uint64) bool { return (seq*2654435761+uint64(src)*40503)%9 == 4 }
	subLossy, err := kvindex.NewSubscriber(lossy, kvindex.SubscriberConfig{Topic: "kv", ReplayTimeout: 5 * time.Second,
		Lose: lose}, sources(reps)...)
	if err != nil {
		t.Fatal(err)
	}
	defer subLossy.Close()
	for _, r := range reps {
		if !r.pub.WaitSubscribed(5 * time.Second) {
			t.Fatal("no subscription reached the publisher")
		}
	}
	var late *kvindex.Index
	var subLate *kvindex.Subscriber
	check := func(step int, ix *kvindex.Index, sub *kvindex.Subscriber, what string) {
		for i, r := range reps {
			seq := r.pub.Stats().LastSeq
			if !sub.WaitApplied(i, seq, 10*time.Second) {
				t.Fatalf("step %d: %s subscriber applied %d of replica %d, published %d (stats %+v)", step, what, sub.Applied(i), i, seq, sub.Stats(i))
			}
			want := r.M.CachedHashes(nil)
			slices.Sort(want)
			if got := ix.Blocks(sub.Replica(i)); !slices.Equal(got, want) {
				t.Fatalf("step %d: %s subscriber has %d blocks for replica %d, the Manager caches %d", step, what, len(got), i, len(want))
			}
		}
	}
	for step := range steps {
		if step == joinAt {
			late = newIndex()
			if subLate, err = kvindex.NewSubscriber(late, kvindex.SubscriberConfig{JoinReplay: true}, sources(reps)...); err != nil {
				t.Fatal(err)
			}
			defer subLate.Close()
			time.Sleep(50 * time.Millisecond) // let the subscription reach the publishers
		}
		// Mostly one step per check; every tenth round a burst of steps,
		// so that lost messages also show up as gaps before the next.
		burst := 1
		if step%10 == 9 {
			burst = 5
		}
		for range burst {
			for _, r := range reps {
				r.Step()
				if !r.rec.Flush() {
					t.Fatal("the publisher's queue is full")
				}
				if !r.pub.WaitSent(5 * time.Second) {
					t.Fatal("the publisher did not send")
				}
			}
		}
		check(step, lossy, subLossy, "lossy")
		if subLate != nil {
			check(step, late, subLate, "late")
		}
	}
	var lost, gaps, replayed int64
	for i := range reps {
		st := subLossy.Stats(i)
		lost, gaps, replayed = lost+st.Lost, gaps+st.Gaps, replayed+st.Replayed
		if st.Errors != 0 || st.Unrepaired != 0 {
			t.Errorf("replica %d: %+v", i, st)
		}
		if st := subLate.Stats(i); st.Replays == 0 || st.Errors != 0 {
			t.Errorf("late joiner, replica %d: %+v", i, st)
		}
	}
	if lost == 0 || gaps == 0 || replayed < lost {
		t.Errorf("lost %d messages, %d gaps, replayed %d", lost, gaps, replayed)
	}
	t.Logf("lost %d messages, %d gaps detected, %d batches replayed", lost, gaps, replayed)
}

// TestMatch: the index answers per replica how many leading tokens are
// cached, computing the Managers' chain itself.
func TestMatch(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 1))
	roots := churn.Roots(rng, testPageSize)
	reps := []*replica{newReplica(t, 1, roots), newReplica(t, 2, roots)}
	ix, err := kvindex.New(kvindex.Config{PageSize: testPageSize, Seed: testSeed})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := kvindex.NewSubscriber(ix, kvindex.SubscriberConfig{}, sources(reps)...)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	for _, r := range reps {
		r.pub.WaitSubscribed(5 * time.Second)
	}
	// Replica 0 computes a 3-page prompt in the LoRA namespace; replica 1
	// the same tokens in the default namespace.
	prompt := roots[0][:3*testPageSize]
	ns := pagedkv.Namespace{LoRA: "adapter"}
	for i, r := range reps {
		nsi := ns
		if i == 1 {
			nsi = pagedkv.Namespace{}
		}
		if _, err := r.M.Add(1, pagedkv.Request{Namespace: nsi, Prompt: append(slices.Clone(prompt), 1)}); err != nil {
			t.Fatal(err)
		}
		if _, err := r.M.Reserve([]pagedkv.RequestID{1}, []int32{int32(len(prompt) + 1)}); err != nil {
			t.Fatal(err)
		}
		if err := r.M.Commit(nil); err != nil {
			t.Fatal(err)
		}
		r.rec.Flush()
		r.pub.WaitSent(5 * time.Second)
		if !sub.WaitApplied(i, r.pub.Stats().LastSeq, 5*time.Second) {
			t.Fatal("not applied")
		}
	}
	query := append(slices.Clone(prompt), 9, 9, 9, 9, 9)
	if got := ix.Match(nil, ns, query); !slices.Equal(got, []int{3 * testPageSize, 0}) {
		t.Fatalf("LoRA namespace: matched %v, want [12 0]", got)
	}
	if got := ix.Match(nil, pagedkv.Namespace{}, query); !slices.Equal(got, []int{0, 3 * testPageSize}) {
		t.Fatalf("default namespace: matched %v, want [0 12]", got)
	}
	if got := ix.Match(nil, ns, query[:2*testPageSize+1]); !slices.Equal(got, []int{2 * testPageSize, 0}) {
		t.Fatalf("shorter query: matched %v, want [8 0]", got)
	}
	// The Manager agrees on what it would reuse.
	if n, err := reps[0].M.Add(2, pagedkv.Request{Namespace: ns, Prompt: query}); err != nil || n != 3*testPageSize {
		t.Fatalf("the Manager matched %d (%v)", n, err)
	}
}
