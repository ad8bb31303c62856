package events_test

import (
	"testing"

	pagedkv "github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/events"
)

// stepper decodes a batch of requests on a Manager with a Recorder; every
// step publishes pages (one request in four fills a page per step) and, as
// the pool runs short, evicts the pages of finished requests, which are
// replaced by new requests on a fresh prompt.
type stepper struct {
	m       *pagedkv.Manager
	rec     *events.Recorder
	q       *events.Queue
	enc     *events.Encoder
	payload []byte
	ids     []pagedkv.RequestID
	nt      []int32
	sampled []int32
}

const (
	stepPageSize = 16
	stepRequests = 32
	stepMaxLen   = 256
)

func newStepper(tb testing.TB, withEvents bool) *stepper {
	const numPages = stepRequests*stepMaxLen/stepPageSize + 64
	s := &stepper{ids: make([]pagedkv.RequestID, stepRequests), nt: make([]int32, stepRequests), sampled: make([]int32, stepRequests)}
	cfg := pagedkv.Config{NumPages: numPages, PageSize: stepPageSize, HashSeed: 1}
	if withEvents {
		var err error
		if s.q, err = events.NewQueue(4); err != nil {
			tb.Fatal(err)
		}
		if s.rec, err = events.NewRecorder(events.RecorderConfig{NumPages: numPages, PageSize: stepPageSize}, s.q); err != nil {
			tb.Fatal(err)
		}
		cfg.CacheEvents = s.rec
		s.enc = events.NewEncoder()
	}
	m, err := pagedkv.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	s.m = m
	for i := range s.ids {
		s.ids[i] = pagedkv.RequestID(i)
		prompt := make([]int32, 1+i%stepPageSize)
		for j := range prompt {
			prompt[j] = int32(i*131 + j)
		}
		if _, err := m.Add(s.ids[i], pagedkv.Request{Prompt: prompt, CapacityTokens: stepMaxLen + 1}); err != nil {
			tb.Fatal(err)
		}
	}
	return s
}

// step runs one decode step (Reserve, Commit) and, with events, flushes
// the recorder and lets the consumer take and encode the batch.
func (s *stepper) step(tb testing.TB) { s.advance(tb, true) }

// advance runs one decode step and, with events, flushes the recorder and
// takes the batches, encoding them when encode is set.
func (s *stepper) advance(tb testing.TB, encode bool) {
	for i, id := range s.ids {
		s.nt[i] = int32(len(s.m.Tokens(id)) - s.m.Computed(id))
		s.sampled[i] = int32(i + len(s.m.Tokens(id)))
	}
	if _, err := s.m.Reserve(s.ids, s.nt); err != nil {
		tb.Fatal(err)
	}
	if err := s.m.Commit(s.sampled); err != nil {
		tb.Fatal(err)
	}
	if s.rec != nil {
		s.rec.Flush()
		for b := s.q.TryNext(); b != nil; b = s.q.TryNext() {
			if encode {
				s.payload = s.enc.AppendBatch(s.payload[:0], b, 0)
			}
			s.q.Done(b)
		}
	}
}

// TestStepAllocFree pins the per-step path with events on (sink calls,
// Flush, the hand-off and the consumer's encoding into a reused buffer) at
// zero allocations once the recycled batches have grown.
func TestStepAllocFree(t *testing.T) {
	s := newStepper(t, true)
	for range 64 {
		s.step(t)
	}
	allocs := testing.AllocsPerRun(64, func() { s.step(t) })
	if allocs != 0 {
		t.Fatalf("%v allocations per step with events", allocs)
	}
	if st := s.rec.Stats(); st.Pages == 0 || st.DroppedSteps != 0 {
		t.Fatalf("the steps published nothing: %+v", st)
	}
}

// BenchmarkStepEvents measures a Manager's decode step (32 requests, one
// in 16 filling a page per step) without events and with a Recorder
// attached (sink calls and Flush, the consumer draining the queue without
// encoding): the step overhead of events, goal < 20%. Per published page
// cost is reported as ns/page.
func BenchmarkStepEvents(b *testing.B) {
	for _, with := range []bool{false, true} {
		name := "events=off"
		if with {
			name = "events=on"
		}
		b.Run(name, func(b *testing.B) {
			s := newStepper(b, with)
			s.enc = nil
			var pages int64
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if len(s.m.Tokens(s.ids[0])) >= stepMaxLen {
					b.StopTimer()
					if with {
						pages += s.rec.Stats().Pages
					}
					s = newStepper(b, with)
					s.enc = nil
					b.StartTimer()
				}
				s.stepNoEncode(b)
			}
			if with {
				pages += s.rec.Stats().Pages
				b.ReportMetric(float64(pages)/float64(b.N), "pages/op")
			}
		})
	}
}

func (s *stepper) stepNoEncode(tb testing.TB) { s.advance(tb, false) }
