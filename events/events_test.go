package events_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	pagedkv "github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/internal/churn"
	"github.com/pagedkv/pagedkv/internal/vllmwire"
)

// newTraffic drives a small Manager with random requests that share
// prefixes in a few namespaces (one with a LoRA adapter), so that pages are
// published, matched, evicted in subtrees and re-published.
func newTraffic(t testing.TB, seed uint64, sink *events.Recorder, numPages, pageSize int) *churn.Driver {
	cfg := pagedkv.Config{NumPages: numPages, PageSize: pageSize, HashSeed: 7}
	if sink != nil {
		cfg.CacheEvents = sink
	}
	m, err := pagedkv.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr := &churn.Driver{T: t, Rng: rand.New(rand.NewPCG(seed, 99)), M: m,
		Namespaces: []pagedkv.Namespace{{}, {Tenant: "b"}, {LoRA: "sql-adapter"}}}
	tr.Roots = churn.Roots(tr.Rng, pageSize)
	return tr
}

func cachedSet(m *pagedkv.Manager) vllmwire.Set {
	s := vllmwire.Set{}
	for _, h := range m.CachedHashes(nil) {
		s[h] = struct{}{}
	}
	return s
}

func sameSet(a, b vllmwire.Set) error {
	for h := range a {
		if _, ok := b[h]; !ok {
			return fmt.Errorf("hash %#x reconstructed but not cached", h)
		}
	}
	for h := range b {
		if _, ok := a[h]; !ok {
			return fmt.Errorf("hash %#x cached but not reconstructed", h)
		}
	}
	return nil
}

// TestRecorderReconstructsCache: decoding every batch with the independent
// decoder and applying it gives the Manager's cached set after every step,
// also when a stalled consumer makes the queue drop batches (the recorder
// then resynchronises with AllBlocksCleared and a snapshot).
func TestRecorderReconstructsCache(t *testing.T) {
	t.Parallel()
	for seed := range uint64(6) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			q, err := events.NewQueue(2)
			if err != nil {
				t.Fatal(err)
			}
			const numPages, pageSize = 40, 4
			rec, err := events.NewRecorder(events.RecorderConfig{NumPages: numPages, PageSize: pageSize}, q)
			if err != nil {
				t.Fatal(err)
			}
			tr := newTraffic(t, seed, rec, numPages, pageSize)
			enc := events.NewEncoder()
			set := vllmwire.Set{}
			stall := 0
			sawClear := false
			for step := range 400 {
				tr.Step()
				ok := rec.Flush()
				if stall > 0 {
					stall--
					continue
				}
				if tr.Rng.IntN(40) == 0 {
					stall = 2 + tr.Rng.IntN(4) // the consumer falls behind
				}
				for b := q.TryNext(); b != nil; b = q.TryNext() {
					payload := enc.AppendBatch(nil, b, 0)
					q.Done(b)
					dec, err := vllmwire.Decode(payload)
					if err != nil {
						t.Fatalf("step %d: %v", step, err)
					}
					for _, e := range dec.Events {
						sawClear = sawClear || e.Type == "AllBlocksCleared"
						if e.Type == "BlockStored" && (e.BlockSize != pageSize || *e.Medium != "GPU") {
							t.Fatalf("step %d: %+v", step, e)
						}
						if e.Type == "BlockStored" && e.LoRAName != nil && *e.LoRAName != "sql-adapter" {
							t.Fatalf("step %d: lora_name %q", step, *e.LoRAName)
						}
					}
					if err := set.Apply(dec); err != nil {
						t.Fatalf("step %d: %v", step, err)
					}
				}
				if ok {
					if err := sameSet(set, cachedSet(tr.M)); err != nil {
						t.Fatalf("step %d: %v", step, err)
					}
				}
			}
			st := rec.Stats()
			if st.DroppedSteps == 0 || st.Resyncs == 0 || !sawClear {
				t.Fatalf("the consumer never fell behind far enough: %+v", st)
			}
			t.Logf("%+v", st)
			if st.Pages == 0 {
				t.Fatal("no page events")
			}
		})
	}
}
