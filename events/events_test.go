package events_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	pagedkv "github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/internal/vllmwire"
)

// traffic drives a small Manager with random requests that share prefixes
// in a few namespaces (one with a LoRA adapter), so that pages are
// published, matched, evicted in subtrees and re-published.
type traffic struct {
	t       testing.TB
	rng     *rand.Rand
	m       *pagedkv.Manager
	next    pagedkv.RequestID
	running []pagedkv.RequestID
	nss     []pagedkv.Namespace
	roots   [][]int32
}

func newTraffic(t testing.TB, seed uint64, sink *events.Recorder, numPages, pageSize int) *traffic {
	cfg := pagedkv.Config{NumPages: numPages, PageSize: pageSize, HashSeed: 7}
	if sink != nil {
		cfg.CacheEvents = sink
	}
	m, err := pagedkv.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr := &traffic{t: t, rng: rand.New(rand.NewPCG(seed, 99)), m: m,
		nss: []pagedkv.Namespace{{}, {Tenant: "b"}, {LoRA: "sql-adapter"}}}
	for i := range 4 {
		p := make([]int32, 3*pageSize+i)
		for j := range p {
			p[j] = int32(tr.rng.IntN(50))
		}
		tr.roots = append(tr.roots, p)
	}
	return tr
}

// step admits, steps and releases at random; it returns after one Commit
// (or a step the pool could not hold).
func (tr *traffic) step() {
	t, rng, m := tr.t, tr.rng, tr.m
	for len(tr.running) < 6 && rng.IntN(3) > 0 {
		prompt := slices.Clone(tr.roots[rng.IntN(len(tr.roots))])
		prompt = prompt[:rng.IntN(len(prompt))+1]
		for range rng.IntN(12) {
			prompt = append(prompt, int32(rng.IntN(50)))
		}
		tr.next++
		if _, err := m.Add(tr.next, pagedkv.Request{Namespace: tr.nss[rng.IntN(len(tr.nss))], Prompt: prompt}); err != nil {
			t.Fatal(err)
		}
		tr.running = append(tr.running, tr.next)
	}
	if rng.IntN(10) == 0 {
		m.Evict(rng.IntN(8))
	}
	var ids []pagedkv.RequestID
	var nt []int32
	for _, id := range tr.running {
		if left := len(m.Tokens(id)) - m.Computed(id); left > 0 {
			ids = append(ids, id)
			nt = append(nt, int32(min(left, 1+rng.IntN(9))))
		}
	}
	if _, err := m.Reserve(ids, nt); errors.Is(err, pagedkv.ErrOutOfPages) {
		victim := tr.running[len(tr.running)-1]
		if err := m.Release(victim); err != nil {
			t.Fatal(err)
		}
		tr.running = tr.running[:len(tr.running)-1]
		return
	} else if err != nil {
		t.Fatal(err)
	}
	sampled := make([]int32, len(ids))
	for b, id := range ids {
		sampled[b] = pagedkv.NoToken
		if m.Computed(id)+int(nt[b]) == len(m.Tokens(id)) && len(m.Tokens(id)) < 40 {
			sampled[b] = int32(rng.IntN(50))
		}
	}
	if err := m.Commit(sampled); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(tr.running); i++ {
		id := tr.running[i]
		if m.Computed(id) == len(m.Tokens(id)) && rng.IntN(4) == 0 {
			if err := m.Release(id); err != nil {
				t.Fatal(err)
			}
			tr.running = slices.Delete(tr.running, i, i+1)
			i--
		}
	}
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
				tr.step()
				ok := rec.Flush()
				if stall > 0 {
					stall--
					continue
				}
				if tr.rng.IntN(40) == 0 {
					stall = 2 + tr.rng.IntN(4) // the consumer falls behind
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
					if err := sameSet(set, cachedSet(tr.m)); err != nil {
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
