package main

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/internal/vllmwire"
)

// tierOptions is a host tier of host pages in the tier traces' format,
// with write-through (every published page is offloaded) and KV events.
func tierOptions(host int64) *abiOptions {
	return &abiOptions{Tiers: true, HostPages: host, Layout: 0, DType: 1, Heads: 1, Dim: 1, Layers: 1, WriteThrough: 1, Events: true}
}

// TestABITierStepIsAllocationFree: a decode step with tiers and KV events
// through the C ABI (reserve, commit, take the tier copies, complete them,
// drain the events), in steady state: pages fill and are offloaded
// (write-through), the host tier reclaims, a batch is encoded every step.
func TestABITierStepIsAllocationFree(t *testing.T) {
	const n = 32
	h, code := goCreateEx(abiConfig{NumPages: n * 200, PageSize: 16, HashSeed: 1}, tierOptions(64))
	if code != codeOK {
		t.Fatalf("create_ex: %d %s", code, goLastError())
	}
	defer goDestroy(h)
	ids, ones, sampled, nt := addDecodeRequests(t, h, n)
	plan := new(abiPlanC)
	if goReserve(h, ids, nt, n, plan) != codeOK || goCommit(h, sampled, n) != codeOK {
		t.Fatal("prefill failed")
	}
	batches := allocFreeTierSteps(t, h, "a decode step with tiers and KV events through the C ABI", sampled, n,
		func() int32 { return goReserve(h, ids, ones, n, plan) })
	st, _ := goTierStats(h)
	if batches < 5 || st[5] < 100 {
		t.Fatalf("the steps published %d batches and offloaded %d pages", batches, st[5])
	}
	t.Logf("%d event batches, %d pages offloaded, %d host pages in use", batches, st[5], st[1])
}

// allocFreeTierSteps checks that decode steps of h allocate nothing: reserve
// (dense or hybrid), commit, complete every tier copy and drain the KV
// events. It returns how many event batches the steps published.
func allocFreeTierSteps(t *testing.T, h uint64, what string, sampled []int32, n int, reserve func() int32) int {
	var copies []abiTierCopy
	done := make([]uint64, 0, 4*n)
	batches := 0
	checkStepAllocs(t, what, func() {
		if reserve() != codeOK || goCommit(h, sampled, int64(n)) != codeOK {
			t.Fatalf("step failed: %s", goLastError())
		}
		copies, done = completeTierCopies(t, h, copies, done)
		for p, code := goDrainEvents(h); p != nil; p, code = goDrainEvents(h) {
			if code != codeOK {
				t.Fatalf("drain: %s", goLastError())
			}
			batches++
		}
	})
	return batches
}

// completeTierCopies takes the tier copies planned and completes them all
// (copies and done are reused scratch).
func completeTierCopies(t testing.TB, h uint64, copies []abiTierCopy, done []uint64) ([]abiTierCopy, []uint64) {
	var code int32
	if copies, code = goTierCopies(h, copies); code != codeOK {
		t.Fatalf("tier copies: %s", goLastError())
	}
	done = done[:0]
	for _, c := range copies {
		done = append(done, c.ID)
	}
	if goCompleteTierCopies(h, done, int64(len(done))) != codeOK {
		t.Fatalf("complete: %s", goLastError())
	}
	return copies, done
}

// TestABIHybridTierStepIsAllocationFree: a hybrid decode step with a
// write-through host tier and KV events through the C ABI (hybrid_reserve,
// commit, take the tier copies of every group, complete them, drain the
// events) allocates nothing in steady state; each group's tier counters
// add up to the pool's, and the group stats keep their old, smaller size.
func TestABIHybridTierStepIsAllocationFree(t *testing.T) {
	// 64 host pages: a page boundary's 3*32 write-throughs find the host
	// tier full (no claim is tried); 128: every group offloads.
	for _, host := range []int64{64, 128} {
		t.Run(fmt.Sprintf("host%d", host), func(t *testing.T) { hybridTierSteps(t, host) })
	}
}

func hybridTierSteps(t *testing.T, host int64) {
	const n = 32
	o := tierOptions(host)
	o.Layers, o.Groups = int64(len(hybridGroups)), hybridGroups
	h, code := goCreateEx(abiConfig{NumPages: n * 200, PageSize: 16, HashSeed: 1}, o)
	if code != codeOK {
		t.Fatalf("hybrid create_ex: %d %s", code, goLastError())
	}
	defer goDestroy(h)
	ids, ones, sampled, nt := addDecodeRequests(t, h, n)
	plan := newCHybridPlan(len(hybridGroups))
	defer plan.free()
	if goHybridReserveC(h, ids, nt, n, plan) != codeOK || goCommit(h, sampled, n) != codeOK {
		t.Fatal("prefill failed")
	}
	batches := allocFreeTierSteps(t, h, "a hybrid decode step with a host tier and KV events through the C ABI", sampled, n,
		func() int32 { return goHybridReserveC(h, ids, ones, n, plan) })
	if batches < 5 {
		t.Fatalf("the steps published %d event batches", batches)
	}
	st, _ := goTierStats(h)
	var offloaded int64
	for g := range hybridGroups {
		gs, code := goGroupStats(h, int64(g), 13*8)
		if code != codeOK {
			t.Fatal(goLastError())
		}
		if gs[11] == 0 && host == 128 {
			t.Errorf("group %d offloaded nothing: %v", g, gs)
		}
		offloaded += gs[11]
		old, _ := goGroupStats(h, int64(g), 9*8)
		if !slices.Equal(old[:9], gs[:9]) || old[9] != -1 {
			t.Errorf("group %d in the old 9-field struct: %v, want %v and -1 past it", g, old, gs[:9])
		}
	}
	if st[5] < 100 || offloaded != st[5] || (host == 64 && st[10] == 0) {
		t.Fatalf("the steps offloaded %d pages, the groups %d; host full %d times", st[5], offloaded, st[10])
	}
	t.Logf("%d pages offloaded, %d host pages in use, host full %d times", st[5], st[1], st[10])
}

// TestABIHybridTierEvents: a hybrid handle with a host tier and KV events
// (pagedkv_hybrid_create_ex with opts.tiers and opts.events) announces each
// group's device and host pages: random adds, steps, releases, evictions
// and copy completions, every drained batch decoded by the independent
// vLLM decoder (internal/vllmwire) into page sets per group_idx and
// medium. After every round each group's GPU set has the group's cached
// page count and the CPU sets together are exactly the host tier's
// servable hashes (pagedkv_cached_hashes, PAGEDKV_MEDIUM_CPU); every
// event carries a group_idx below the number of groups.
func TestABIHybridTierEvents(t *testing.T) {
	groups := []abiGroup{{Kind: 1, WindowTokens: 8, NumLayers: 1}, {Kind: 0, NumLayers: 1}}
	o := tierOptions(24)
	o.Layers, o.Groups = int64(len(groups)), groups
	h, code := goCreateEx(abiConfig{NumPages: 40, PageSize: 4, HashSeed: 1}, o)
	if code != codeOK {
		t.Fatalf("hybrid create_ex with tiers and events: %d %s", code, goLastError())
	}
	defer goDestroy(h)
	rng := rand.New(rand.NewPCG(3, 9))
	sets := vllmwire.GroupMedia{}
	plan := newCHybridPlan(len(groups))
	defer plan.free()
	var copies []abiTierCopy
	var done []uint64
	var live []uint64
	pend := map[uint64]int32{} // tokens a request has to compute
	steps := 0
	next := uint64(1)
	cpu := make([]int, len(groups))
	for round := range 300 {
		switch k := rng.IntN(6); {
		case k < 2:
			prompt := make([]int32, 1+rng.IntN(20))
			base := int32(rng.IntN(4)) * 100
			for i := range prompt {
				prompt[i] = base + int32(i)
			}
			if hit, code := goAdd(h, next, abiRequest{Prompt: prompt, PromptLen: int64(len(prompt)), CapacityTokens: 256}); code == codeOK {
				live = append(live, next)
				pend[next] = int32(int64(len(prompt)) - hit)
			}
			next++
		case k < 4:
			if len(live) > 0 {
				copies, done = completeTierCopies(t, h, copies, done) // no request left loading
				nt := make([]int32, len(live))
				for i, id := range live {
					nt[i] = pend[id]
				}
				if c := goHybridReserveC(h, live, nt, int64(len(live)), plan); c != codeOK {
					// Out of pages: the engine gives up its oldest request.
					if c != codeOutOfPages || goRelease(h, live[0]) != codeOK {
						t.Fatalf("round %d: reserve: %d %s", round, c, goLastError())
					}
					delete(pend, live[0])
					live = live[1:]
				} else {
					sampled := make([]int32, len(live))
					for i, id := range live {
						sampled[i] = int32(rng.IntN(3))
						pend[id] = 1
					}
					if goCommit(h, sampled, int64(len(live))) != codeOK {
						t.Fatalf("round %d: commit: %s", round, goLastError())
					}
					steps++
				}
			}
		case k < 5:
			if len(live) > 0 {
				i := rng.IntN(len(live))
				delete(pend, live[i])
				if goRelease(h, live[i]) != codeOK {
					t.Fatalf("round %d: release: %s", round, goLastError())
				}
				live = slices.Delete(live, i, i+1)
			}
		default:
			goEvict(h, int64(1+rng.IntN(8)))
		}
		copies, done = completeTierCopies(t, h, copies, done)
		for p, code := goDrainEvents(h); p != nil; p, code = goDrainEvents(h) {
			if code != codeOK {
				t.Fatalf("round %d: drain: %s", round, goLastError())
			}
			b, err := vllmwire.Decode(bytes.Clone(p))
			if err != nil {
				t.Fatalf("round %d: payload %x: %v", round, p, err)
			}
			for _, e := range b.Events {
				if e.Type == "AllBlocksCleared" {
					continue
				}
				if e.GroupIdx == nil || *e.GroupIdx < 0 || *e.GroupIdx >= int64(len(groups)) {
					t.Fatalf("round %d: %s with group_idx %v", round, e.Type, e.GroupIdx)
				}
				if e.Type == "BlockStored" && e.Medium != nil && *e.Medium == "CPU" {
					cpu[*e.GroupIdx] += len(e.BlockHashes)
				}
			}
			if err := sets.Apply(b); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if goAudit(h) != codeOK {
			t.Fatalf("round %d: audit: %s", round, goLastError())
		}
		host, code := goCachedHashes(h, 1, 64)
		if code != codeOK {
			t.Fatalf("round %d: cached_hashes: %s", round, goLastError())
		}
		var announced []uint64
		for g := range groups {
			for hv := range sets[int64(g)]["CPU"] {
				announced = append(announced, hv)
			}
			gs, _ := goGroupStats(h, int64(g), 13*8)
			if int64(len(sets[int64(g)]["GPU"])) != gs[1] {
				t.Fatalf("round %d: group %d: %d GPU pages announced, %d cached", round, g, len(sets[int64(g)]["GPU"]), gs[1])
			}
		}
		slices.Sort(announced)
		slices.Sort(host)
		if !slices.Equal(announced, host) {
			t.Fatalf("round %d: CPU pages announced %x, the host tier serves %x", round, announced, host)
		}
	}
	for g, n := range cpu {
		if n == 0 {
			t.Errorf("group %d announced no host page", g)
		}
	}
	if steps < 20 {
		t.Errorf("only %d steps ran", steps)
	}
	t.Logf("%d steps; host pages announced per group: %v", steps, cpu)
}

// TestDrainedEventsDecodeAsVLLM: what pagedkv_drain_events hands out is
// a KVEventBatch that the independent decoder of vLLM's format reads.
func TestDrainedEventsDecodeAsVLLM(t *testing.T) {
	h, code := goCreateEx(abiConfig{NumPages: 16, PageSize: 4, HashSeed: 1}, tierOptions(8))
	if code != codeOK {
		t.Fatal(goLastError())
	}
	defer goDestroy(h)
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	if _, code := goAdd(h, 1, abiRequest{Prompt: prompt, PromptLen: 9}); code != codeOK {
		t.Fatal(goLastError())
	}
	plan := new(abiPlanC)
	if goReserve(h, []uint64{1}, []int32{9}, 1, plan) != codeOK || goCommit(h, []int32{3}, 1) != codeOK {
		t.Fatal(goLastError())
	}
	copies, _ := goTierCopies(h, nil)
	var ids []uint64
	for _, c := range copies {
		ids = append(ids, c.ID)
	}
	if goCompleteTierCopies(h, ids, int64(len(ids))) != codeOK {
		t.Fatal(goLastError())
	}
	var got []string
	for p, _ := goDrainEvents(h); p != nil; p, _ = goDrainEvents(h) {
		b, err := vllmwire.Decode(bytes.Clone(p))
		if err != nil {
			t.Fatalf("payload %x: %v", p, err)
		}
		for _, e := range b.Events {
			got = append(got, e.Type+" "+*e.Medium)
		}
	}
	s := strings.Join(got, "\n")
	if strings.Count(s, "BlockStored") != 2 || !strings.Contains(s, "GPU") || !strings.Contains(s, "CPU") {
		t.Fatalf("events:\n%s", s)
	}
}

// FuzzTierOptions decodes raw bytes into pagedkv_create_ex's options
// (tiers with their format, host memory, Redis and disk stores, events;
// wrong sizes, NULLs with lengths, out-of-range values) and checks that
// the call either makes a manager that then runs a few steps with tier
// copies and events and passes its audit, or fails with
// PAGEDKV_ERR_BAD_ARGUMENT or PAGEDKV_ERR_BAD_CONFIG and a message, never
// a panic. Host pages and geometry are drawn small or far out of range,
// so memory stays bounded.
func FuzzTierOptions(f *testing.F) {
	f.Add([]byte{1, 8, 0, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1, 0, 0})
	f.Add([]byte{1, 8, 0, 2, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 1, 0, 0, 3})
	f.Add([]byte{1, 200, 1, 9, 255, 1, 1, 2, 5, 5, 0, 0, 0, 0, 0, 0})
	// Hybrid with a write-through host tier of 8 pages (2 layers), and the
	// same with KV events (each group's host pages announced).
	f.Add([]byte{1, 8, 0, 1, 1, 1, 2, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Add([]byte{1, 8, 0, 1, 1, 1, 2, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1})
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		next := (*fuzzReader)(&data).next
		// pick is a small value, or one far out of range.
		pick := func(small int) int64 {
			switch v := next(); {
			case v == 255:
				return -1
			case v == 254:
				return 1 << 40
			case v == 253:
				return maxLen
			default:
				return int64(v % small)
			}
		}
		o := &abiOptions{Tiers: next()%4 > 0, HostPages: pick(33), Layout: pick(3), DType: pick(7), Heads: pick(5),
			Dim: pick(9), Layers: pick(4), DeadlineUS: pick(1000) * 1000, OffloadFree: pick(10), WriteThrough: int64(next() % 2)}
		if v := next() % 8; v == 1 {
			o.HostMemoryLen = pick(4096) // NULL with a length
		} else if v == 2 {
			o.HostMemory = make([]byte, next()*64)
			o.HostMemoryLen = int64(len(o.HostMemory))
		}
		if next()%4 == 1 {
			o.Redis = &abiStore{S: [3]string{"127.0.0.1:1", strings.Repeat("n", next()%3), strings.Repeat("{", next()%2)},
				Ints: [6]int64{int64(next() % 2), pick(8), pick(8), pick(100), pick(100), 1}}
		}
		if next()%4 == 1 {
			o.Disk = &abiStore{S: [3]string{dir + "/" + strings.Repeat("d", 1+next()%2), "ns", ""}, Ints: [6]int64{pick(16), pick(4), pick(8), -1}}
		}
		o.Events = next()%2 == 1
		o.QueueBatches, o.Rank = pick(8), pick(4)
		switch next() % 16 {
		case 1:
			o.OptsSize = 8
		case 2:
			o.TiersSize = 1
		case 3:
			o.EventsSize = 3
		case 4:
			o.RedisSize = 5
		case 5:
			o.DiskSize = 7
		}
		hybrid := next()%4 == 1
		if hybrid { // a sliding and a full group: tiers, events (of host pages too) and pins
			o.Groups = []abiGroup{{Kind: 1, WindowTokens: 6, NumLayers: 1}, {Kind: 0, NumLayers: 1}}
		}
		h, code := goCreateEx(abiConfig{NumPages: 16, PageSize: 4, HashSeed: 1}, o)
		switch code {
		case codeOK:
		case codeBadArgument, codeBadConfig:
			if h != 0 || goLastError() == "" {
				t.Fatalf("failed create_ex: handle %d, message %q", h, goLastError())
			}
			return
		default:
			t.Fatalf("create_ex = %d: %s", code, goLastError())
		}
		defer goDestroy(h)
		prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
		plan := new(abiPlanC)
		hplan := newCHybridPlan(2)
		defer hplan.free()
		var copies []abiTierCopy
		for i := range uint64(4) {
			goAdd(h, i+1, abiRequest{Prompt: prompt, PromptLen: int64(len(prompt))})
			reserved := int32(codeOK)
			if hybrid {
				reserved = goHybridReserveC(h, []uint64{i + 1}, []int32{10}, 1, hplan)
			} else {
				reserved = goReserve(h, []uint64{i + 1}, []int32{10}, 1, plan)
			}
			if reserved == codeOK {
				goCommit(h, []int32{3}, 1)
			}
			goRelease(h, i+1)
			goEvict(h, 16)
			copies, _ = goTierCopies(h, copies)
			for _, c := range copies {
				if code := goCompleteTierCopies(h, []uint64{c.ID}, 1); code != codeOK {
					t.Fatalf("complete %d: %s", c.ID, goLastError())
				}
			}
			for p, _ := goDrainEvents(h); p != nil; p, _ = goDrainEvents(h) {
				if _, err := vllmwire.Decode(bytes.Clone(p)); err != nil {
					t.Fatalf("payload %x: %v", p, err)
				}
			}
			if goAudit(h) != codeOK {
				t.Fatalf("audit: %s", goLastError())
			}
			if hybrid { // the groups' tier counters add up to the pool's
				st, _ := goTierStats(h)
				var sum [4]int64
				for g := range int64(2) {
					gs, _ := goGroupStats(h, g, 13*8)
					for k := range sum {
						sum[k] += gs[9+k]
					}
				}
				if !slices.Equal(sum[:], st[3:7]) {
					t.Fatalf("the groups' tier counters add up to %v, the pool's are %v", sum, st[3:7])
				}
			}
		}
	})
}

// BenchmarkABITierStep: a decode step of 32 requests with a write-through
// host tier and KV events (reserve, commit, take and complete the tier
// copies, drain and encode the event batches): "go" calls the Manager,
// its Recorder and the encoder directly, "abi" the exported functions (from
// Go, without the cgo transition). Every 1000 steps the manager is made
// again, off the clock, so the pool never runs out.
func BenchmarkABITierStep(b *testing.B) {
	const n = 32
	cfg := pagedkv.Config{NumPages: n * 80, PageSize: 16, HashSeed: 1,
		Tiers: pagedkv.TierConfig{HostPages: 64, Format: traceFormat, WriteThrough: true}}
	cfg.Tiers.Format.PageSize = 16
	b.Run("go", func(b *testing.B) {
		var m *pagedkv.Manager
		var rec *events.Recorder
		var q *events.Queue
		enc := events.NewEncoder()
		ids := make([]pagedkv.RequestID, n)
		nt, ones, sampled := make([]int32, n), make([]int32, n), make([]int32, n)
		var copies []pagedkv.TierCopy
		var done []uint64
		var payload []byte
		benchSteps(b, func() {
			c := cfg
			var err error
			if rec, q, err = newRecorder(recorderConfig(c, nil), DefaultEventBatches); err != nil {
				b.Fatal(err)
			}
			c.CacheEvents = rec
			if m, err = pagedkv.New(c); err != nil {
				b.Fatal(err)
			}
			prefillGo(b, m, ids, nt, ones, sampled)
		}, func() {
			if _, err := m.Reserve(ids, ones); err != nil {
				b.Fatal(err)
			}
			if err := m.Commit(sampled); err != nil {
				b.Fatal(err)
			}
			rec.Flush()
			copies = m.TierCopies(copies[:0])
			done = done[:0]
			for _, c := range copies {
				done = append(done, c.ID)
			}
			if err := m.CompleteTierCopies(done...); err != nil {
				b.Fatal(err)
			}
			for bt := nextBatch(rec, q); bt != nil; bt = nextBatch(rec, q) {
				payload = enc.AppendBatch(payload[:0], bt, 0)
				q.Done(bt)
			}
		})
	})
	b.Run("abi", func(b *testing.B) {
		var h uint64
		var ids []uint64
		var ones, sampled, nt []int32
		plan := new(abiPlanC)
		var copies []abiTierCopy
		var done []uint64
		defer func() { goDestroy(h) }()
		benchSteps(b, func() {
			if h != 0 {
				goDestroy(h)
			}
			var code int32
			if h, code = goCreateEx(abiConfig{NumPages: n * 80, PageSize: 16, HashSeed: 1}, tierOptions(64)); code != codeOK {
				b.Fatal(goLastError())
			}
			ids, ones, sampled, nt = addDecodeRequests(b, h, n)
			if goReserve(h, ids, nt, n, plan) != codeOK || goCommit(h, sampled, n) != codeOK {
				b.Fatal(goLastError())
			}
		}, func() {
			if goReserve(h, ids, ones, n, plan) != codeOK || goCommit(h, sampled, n) != codeOK {
				b.Fatal(goLastError())
			}
			copies, _ = goTierCopies(h, copies)
			done = done[:0]
			for _, c := range copies {
				done = append(done, c.ID)
			}
			if goCompleteTierCopies(h, done, int64(len(done))) != codeOK {
				b.Fatal(goLastError())
			}
			for p, _ := goDrainEvents(h); p != nil; p, _ = goDrainEvents(h) {
			}
		})
	})
}

// benchSteps runs step b.N times after setup, and setup again (off the
// clock) every 1000 steps.
func benchSteps(b *testing.B, setup, step func()) {
	const fresh = 1000
	setup()
	b.ReportAllocs()
	for i := range b.N {
		if i%fresh == fresh-1 {
			b.StopTimer()
			setup()
			b.StartTimer()
		}
		step()
	}
}
