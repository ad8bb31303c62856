package kvindex_test

import (
	"testing"
	"time"

	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/kvindex"
	"github.com/pagedkv/pagedkv/prefixcache"
)

const benchPageSize = 16

// traffic records steps of synthetic cache traffic on a Recorder: each step
// stores a chain of `pages` pages and removes the previous step's chain
// (children first), so the cached set stays bounded.
type traffic struct {
	rec             *events.Recorder
	pages, numPages int
	base, prev      int // the next chain's first page; the previous chain's (-1: none)
	toks            []int32
}

func newTraffic(rec *events.Recorder, pages, numPages int) *traffic {
	return &traffic{rec: rec, pages: pages, numPages: numPages, prev: -1, toks: make([]int32, benchPageSize)}
}

func hashOf(p prefixcache.PageID) uint64 { return uint64(p)*0x9e3779b97f4a7c15 + 1 }

func (t *traffic) step() {
	if t.prev >= 0 {
		for p := t.pages - 1; p >= 0; p-- {
			t.rec.PageRemoved(prefixcache.PageID(t.prev+p), hashOf(prefixcache.PageID(t.prev+p)))
		}
	}
	parent := prefixcache.PageID(-1)
	for p := range t.pages {
		pg := prefixcache.PageID(t.base + p)
		t.rec.PageStored(pg, hashOf(pg), parent, hashOf(parent), prefixcache.Key{}, t.toks)
		parent = pg
	}
	t.prev, t.base = t.base, (t.base+t.pages)%t.numPages
}

// BenchmarkPublishIndex measures the whole path over loopback ZeroMQ: a
// Recorder's batches (8 pages stored and 8 removed per step: 2 events)
// encoded and published, received, decoded and applied to the router's
// index. events/s and pages/s are end to end (the clock stops when the
// index has applied the last batch).
func BenchmarkPublishIndex(b *testing.B) {
	const numPages, perStep = 1 << 12, 8
	pub, err := events.NewPublisher(events.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Mode: events.Bind, ReplayEndpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	rec, err := pub.NewRecorder(events.RecorderConfig{NumPages: numPages, PageSize: benchPageSize})
	if err != nil {
		b.Fatal(err)
	}
	ix, err := kvindex.New(kvindex.Config{PageSize: benchPageSize, Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	sub, err := kvindex.NewSubscriber(ix, kvindex.SubscriberConfig{}, kvindex.Source{Name: "r", Endpoint: pub.Endpoint(), ReplayEndpoint: pub.ReplayEndpoint()})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	pub.WaitSubscribed(5 * time.Second)
	tr := newTraffic(rec, perStep, numPages)
	b.ResetTimer()
	for range b.N {
		tr.step()
		for !rec.Flush() { // the queue is full: let the publisher catch up rather than resync
			time.Sleep(time.Microsecond)
		}
	}
	pub.WaitSent(time.Minute)
	if !sub.WaitApplied(0, pub.Stats().LastSeq, time.Minute) {
		b.Fatalf("indexed %d of %d batches: %+v %+v", sub.Applied(0)+1, pub.Stats().LastSeq+1, sub.Stats(0), pub.Stats())
	}
	b.StopTimer()
	ps := pub.Stats()
	sec := b.Elapsed().Seconds()
	b.ReportMetric(float64(ps.Events)/sec, "events/s")
	b.ReportMetric(float64(ps.Pages)/sec, "pages/s")
	b.ReportMetric(float64(ps.Bytes)/float64(max(ps.Batches, 1)), "B/batch")
}

// BenchmarkEncode is the publisher's encoding cost alone, and
// BenchmarkDecodeApply the router's decode-and-index cost alone, per batch
// of the same traffic (2 events, 16 pages).
func BenchmarkEncode(b *testing.B) {
	q, _ := events.NewQueue(2)
	rec, _ := events.NewRecorder(events.RecorderConfig{NumPages: 1 << 12, PageSize: benchPageSize}, q)
	tr := newTraffic(rec, 8, 1<<12)
	enc := events.NewEncoder()
	var payload []byte
	b.ReportAllocs()
	for range b.N {
		tr.step()
		rec.Flush()
		bt := q.TryNext()
		payload = enc.AppendBatch(payload[:0], bt, 0)
		q.Done(bt)
	}
	b.ReportMetric(float64(len(payload)), "B/batch")
}

func BenchmarkDecodeApply(b *testing.B) {
	q, _ := events.NewQueue(2)
	rec, _ := events.NewRecorder(events.RecorderConfig{NumPages: 1 << 12, PageSize: benchPageSize}, q)
	tr := newTraffic(rec, 8, 1<<12)
	enc := events.NewEncoder()
	var payloads [][]byte
	for range 512 {
		tr.step()
		rec.Flush()
		bt := q.TryNext()
		payloads = append(payloads, enc.AppendBatch(nil, bt, 0))
		q.Done(bt)
	}
	ix, _ := kvindex.New(kvindex.Config{PageSize: benchPageSize, Seed: 1})
	r := ix.AddReplica("r")
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		bt, err := kvindex.DecodeBatch(payloads[i%len(payloads)])
		if err != nil {
			b.Fatal(err)
		}
		if err := ix.Apply(r, &bt); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(2*float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
