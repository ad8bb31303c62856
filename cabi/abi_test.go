package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/kernels"
)

// codeFor is the C code of a Go error (0 for nil), by the same table the
// library uses.
func codeFor(err error) int32 {
	if err == nil {
		return codeOK
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return int32(c.code)
		}
	}
	return codeInternal
}

// goPlanArrays is a Go plan in the shape abiPlan reads back.
func goPlanArrays(p *pagedkv.Plan) abiPlan {
	nz := func(s []int32) []int32 {
		if len(s) == 0 {
			return nil
		}
		return slices.Clone(s)
	}
	out := abiPlan{BatchSize: int64(len(p.QOIndptr) - 1), NNZ: int64(len(p.Positions)), WindowLeft: int64(p.WindowLeft),
		AttentionKind: int64(p.AttentionKind())}
	var copies []int32
	for _, c := range p.Copies {
		copies = append(copies, int32(c.Src), int32(c.Dst), c.Entries)
	}
	out.Arrays = map[string][]int32{
		"copies": copies, "qo_indptr": nz(p.QOIndptr), "batch_indices": nz(p.BatchIndices), "positions": nz(p.Positions),
		"token_ids": nz(p.TokenIDs), "token_positions": nz(p.TokenPositions), "kv_indptr": nz(p.KVIndptr),
		"kv_page_indices": nz(p.KVPageIndices), "kv_last_page_len": nz(p.KVLastPageLen), "seq_lens": nz(p.SeqLens),
		"query_rows": nil,
	}
	if l := p.Cascade; l != nil {
		out.Arrays["query_rows"] = nz(l.QueryRows())
		for _, lv := range l.Levels {
			out.Levels = append(out.Levels, map[string][]int32{
				"qo_indptr": nz(lv.QOIndptr), "kv_indptr": nz(lv.KVIndptr), "kv_indices": nz(lv.KVPageIndices),
				"kv_last_page_len": nz(lv.KVLastPageLen),
			})
		}
	}
	return out
}

func samePlan(a, b abiPlan) error {
	if a.BatchSize != b.BatchSize || a.NNZ != b.NNZ || a.WindowLeft != b.WindowLeft || a.AttentionKind != b.AttentionKind {
		return fmt.Errorf("batch %d/%d nnz %d/%d window_left %d/%d attention_kind %d/%d", a.BatchSize, b.BatchSize, a.NNZ, b.NNZ,
			a.WindowLeft, b.WindowLeft, a.AttentionKind, b.AttentionKind)
	}
	for k, v := range a.Arrays {
		if !slices.Equal(v, b.Arrays[k]) {
			return fmt.Errorf("%s: %v, want %v", k, v, b.Arrays[k])
		}
	}
	if len(a.Levels) != len(b.Levels) {
		return fmt.Errorf("%d cascade levels, want %d", len(a.Levels), len(b.Levels))
	}
	for i := range a.Levels {
		for k, v := range a.Levels[i] {
			if !slices.Equal(v, b.Levels[i][k]) {
				return fmt.Errorf("level %d %s: %v, want %v", i, k, v, b.Levels[i][k])
			}
		}
	}
	return nil
}

// abiPair is the library, called as C calls it, next to a Manager called
// directly: the reference for every result.
type abiPair struct {
	t    testing.TB
	h    uint64
	ref  *pagedkv.Manager
	plan abiPlanC // the caller's plan struct
	last *abiPlan // the last successful plan, read right after its reserve
	// lastTables is the last successful plan's padded block_tables.
	lastTables []int32
}

func newABIPair(t testing.TB, cfg abiConfig) *abiPair {
	h, code := goCreate(cfg)
	ref, err := pagedkv.New(pagedkv.Config{NumPages: int(cfg.NumPages), PageSize: int(cfg.PageSize),
		WindowTokens: int(cfg.WindowTokens), Priorities: int(cfg.Priorities), MaxPinnedPages: int(cfg.MaxPinnedPages),
		HashSeed: cfg.HashSeed, CascadeMinSavedPages: int(cfg.CascadeMinSavedPages), BlockTablesStride: int(cfg.BlockTablesStride)})
	if code != codeFor(err) {
		t.Fatalf("create %+v: code %d, Go %v", cfg, code, err)
	}
	if err != nil {
		return nil
	}
	t.Cleanup(func() {
		if c := goDestroy(h); c != codeOK {
			t.Errorf("destroy: %d", c)
		}
	})
	return &abiPair{t: t, h: h, ref: ref}
}

// check compares the results of one operation and the state after it.
func (p *abiPair) check(op string, code int32, err error) {
	p.t.Helper()
	if want := codeFor(err); code != want {
		p.t.Fatalf("%s: code %d, Go says %d (%v)", op, code, want, err)
	}
	p.checkState(op)
}

func (p *abiPair) checkState(op string) {
	p.t.Helper()
	got, code := goStats(p.h)
	if code != codeOK || !slices.Equal(got, statsList(p.ref.Stats())) {
		p.t.Fatalf("after %s: stats %v (code %d), Go %v", op, got, code, statsList(p.ref.Stats()))
	}
	if code := goAudit(p.h); code != codeOK {
		p.t.Fatalf("after %s: audit failed with code %d", op, code)
	}
	if p.last != nil { // valid until the next successful reserve
		if err := samePlan(p.plan.read(), *p.last); err != nil {
			p.t.Fatalf("after %s: the last plan's arrays changed: %v", op, err)
		}
		if bt, _, _, code := goBlockTables(p.h, 0); code != codeOK || !slices.Equal(bt, p.lastTables) {
			p.t.Fatalf("after %s: the last plan's block_tables are %v (code %d), were %v", op, bt, code, p.lastTables)
		}
	}
}

// bad checks a call that the C layer must refuse before the Manager sees it.
func (p *abiPair) bad(op string, code int32) {
	p.t.Helper()
	if code != codeBadArgument {
		p.t.Fatalf("%s: code %d, want PAGEDKV_ERR_BAD_ARGUMENT", op, code)
	}
	p.checkState(op)
}

// FuzzABI decodes raw bytes into a sequence of C ABI calls, with the
// pointer and length mistakes a C caller can make (NULL with a length,
// negative and huge lengths, priorities and counts out of range), and runs
// them on the library and, where the C layer lets them through, on a Go
// Manager called directly. Every code must be what the Go error maps to,
// the stats equal, audit pass, and the last plan's arrays stay as they
// were until the next successful reserve.
// fuzzReader hands out a fuzz input's bytes one at a time, then zeros.
type fuzzReader []byte

func (r *fuzzReader) next() int {
	if len(*r) == 0 {
		return 0
	}
	b := int((*r)[0])
	*r = (*r)[1:]
	return b
}

func FuzzABI(f *testing.F) {
	f.Add([]byte{3, 2, 0, 0, 5, 1, 2, 3, 4, 5, 6, 1, 2, 0, 7, 0, 0, 1, 8, 6, 1, 6, 2, 0, 0})
	f.Add([]byte("\x08\x03\x01\x00\x10abcdefghijklmnop\x06\x02\x00\x02\x03\x07\x00\x02\x00\x10\x08\x06\x03\x02\x00\x01"))
	f.Add([]byte{0, 0, 0, 0, 0, 4, 12, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 6, 1, 0, 12, 7, 0, 1, 0, 0, 4, 12, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 2, 0, 1, 6, 2, 0, 1, 0, 1})
	f.Fuzz(abiRun)
}

// abiReserves counts the successful reserves abiRun compared with Go.
var abiReserves int

// TestABIMatchesGoOnRandomInputs runs FuzzABI's body on random inputs.
func TestABIMatchesGoOnRandomInputs(t *testing.T) {
	before := abiReserves
	defer func() { t.Logf("%d reserves compared with Go, block tables included", abiReserves-before) }()
	runs := 400
	if raceEnabled {
		runs = 40
	}
	rng := rand.New(rand.NewPCG(37, 1))
	for range runs {
		data := make([]byte, 400)
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		abiRun(t, data)
	}
}

// abiRun is FuzzABI's body.
func abiRun(t *testing.T, data []byte) {
	{
		next := (*fuzzReader)(&data).next
		cfg := abiConfig{NumPages: int64(8 + next()%32), PageSize: int64(1 + next()%6), Priorities: 3, MaxPinnedPages: 4,
			HashSeed: 7, CascadeMinSavedPages: 1}
		if w := next() % 4; w > 0 {
			cfg.WindowTokens = int64(2 * w)
		}
		// Padded block tables (none, or a stride some steps exceed), from
		// the bytes already read so the corpus keeps its meaning.
		cfg.BlockTablesStride = (cfg.NumPages + cfg.PageSize) % 7
		p := newABIPair(t, cfg)
		// lenMode picks a length mistake: 0 none, 1 NULL with a length, 2
		// negative, 3 too large for any buffer.
		length := func(n int) (int64, bool, bool) {
			switch next() % 16 {
			case 1:
				return int64(n + 1), true, false
			case 2:
				return -1 - int64(next()), false, false
			case 3:
				return maxLen + int64(next()), false, false
			}
			return int64(n), false, true
		}
		tokens := func() []int32 {
			n := next() % 12
			out := make([]int32, n)
			for i := range out {
				out[i] = int32(next()%8) - int32(next()/250) // mostly small, sometimes negative
			}
			return out
		}
		id := func() uint64 { return uint64(1 + next()%6) }
		for ops := 0; len(data) > 0 && ops < 64; ops++ {
			switch op := next() % 14; op {
			case 0:
				rid, prompt := id(), tokens()
				n, isNil, ok := length(len(prompt))
				prio := int32(next()%5) - 1
				if next()%9 == 0 {
					prio = 300
				}
				req := abiRequest{Prompt: prompt, PromptLen: n, Priority: prio}
				if isNil {
					req.Prompt = nil
				}
				if next()%7 == 0 {
					req.Tenant = "t"
				}
				matched, code := goAdd(p.h, rid, req)
				if !ok || prio < 0 || prio > 255 {
					p.bad("add", code)
					continue
				}
				m, err := p.ref.Add(pagedkv.RequestID(rid), pagedkv.Request{Namespace: pagedkv.Namespace{Tenant: req.Tenant},
					Prompt: prompt, Priority: pagedkv.Priority(prio)})
				if err == nil && int64(m) != matched {
					t.Fatalf("add %d: matched %d, Go %d", rid, matched, m)
				}
				p.check("add", code, err)
			case 1:
				rid, toks := id(), tokens()
				n, isNil, ok := length(len(toks))
				arg := toks
				if isNil {
					arg = nil
				}
				code := goExtend(p.h, rid, arg, n)
				if !ok {
					p.bad("extend", code)
					continue
				}
				p.check("extend", code, p.ref.Extend(pagedkv.RequestID(rid), toks...))
			case 2:
				a, b := id(), id()
				p.check("fork", goFork(p.h, a, b), p.ref.Fork(pagedkv.RequestID(a), pagedkv.RequestID(b)))
			case 3:
				rid := id()
				p.check("preempt", goPreempt(p.h, rid), p.ref.Preempt(pagedkv.RequestID(rid)))
			case 4:
				rid := id()
				matched, code := goResume(p.h, rid)
				m, err := p.ref.Resume(pagedkv.RequestID(rid))
				if err == nil && int64(m) != matched {
					t.Fatalf("resume %d: matched %d, Go %d", rid, matched, m)
				}
				p.check("resume", code, err)
			case 5:
				rid := id()
				p.check("release", goRelease(p.h, rid), p.ref.Release(pagedkv.RequestID(rid)))
			case 6, 7:
				nb := next() % 5
				ids := make([]uint64, nb)
				rids := make([]pagedkv.RequestID, nb)
				nt := make([]int32, nb)
				for i := range ids {
					ids[i] = id()
					rids[i] = pagedkv.RequestID(ids[i])
					nt[i] = int32(next()%8) - int32(next()/250)
				}
				n, isNil, ok := length(nb)
				argIDs := ids
				if isNil {
					argIDs = nil
				}
				spec := next()%3 == 0
				var code int32
				var drafts [][]int32
				if spec {
					// Drafts as C passes them: draft_indptr and one flat array,
					// sometimes with a broken indptr.
					indptr, flat := []int32{0}, []int32{}
					for range nb {
						d := tokens()
						d = d[:min(len(d), next()%3)]
						drafts = append(drafts, d)
						flat = append(flat, d...)
						indptr = append(indptr, int32(len(flat)))
					}
					broken := next()%8 == 0
					if broken {
						// Never past the end of flat: the library would read
						// beyond the caller's buffer, as it would in C.
						i, d := next()%len(indptr), int32(next()%3)-1
						if i < len(indptr)-1 || d < 0 {
							indptr[i] += d
						}
					}
					code = goReserveSpec(p.h, argIDs, nt, n, indptr, flat, &p.plan)
					okIndptr := indptr[0] == 0
					for i := 1; i < len(indptr); i++ {
						okIndptr = okIndptr && indptr[i] >= indptr[i-1] && indptr[i] <= int32(len(flat))
					}
					if !ok || !okIndptr {
						p.bad("reserve_spec", code)
						continue
					}
					if broken {
						// A still-valid indptr regroups the flat drafts.
						for i := range drafts {
							drafts[i] = flat[indptr[i]:indptr[i+1]]
						}
					}
				} else {
					code = goReserve(p.h, argIDs, nt, n, &p.plan)
					if !ok {
						p.bad("reserve", code)
						continue
					}
				}
				var plan *pagedkv.Plan
				var err error
				if spec {
					plan, err = p.ref.ReserveSpec(rids, nt, drafts)
				} else {
					plan, err = p.ref.Reserve(rids, nt)
				}
				if err == nil {
					want := goPlanArrays(plan)
					if e := samePlan(p.plan.read(), want); e != nil && code == codeOK {
						t.Fatalf("reserve %v %v: %v", ids, nt, e)
					}
					p.last = &want
					bt, stride, maxSeqLen, c := goBlockTables(p.h, 0)
					wantBT := plan.BlockTables
					if len(wantBT) == 0 {
						wantBT = nil
					}
					if c != codeOK || !slices.Equal(bt, wantBT) || stride != cfg.BlockTablesStride || maxSeqLen != stride*cfg.PageSize {
						t.Fatalf("reserve %v %v: block_tables %v stride %d max_seq_len %d (code %d), Go %v stride %d", ids, nt, bt, stride, maxSeqLen, c, plan.BlockTables, cfg.BlockTablesStride)
					}
					p.lastTables = slices.Clone(bt)
					abiReserves++
				}
				p.check("reserve", code, err)
			case 8:
				nb := next() % 6
				sampled := make([]int32, nb)
				for i := range sampled {
					sampled[i] = int32(next()%6) - 1
				}
				n, isNil, ok := length(nb)
				arg := sampled
				if isNil {
					arg = nil
				}
				if next()%3 == 0 {
					accepted := make([]int32, next()%6)
					for i := range accepted {
						accepted[i] = int32(next()%4) - int32(next()/250)
					}
					code := goCommitSpec(p.h, accepted, int64(len(accepted)), arg, n)
					if !ok {
						p.bad("commit_spec", code)
						continue
					}
					var s []int32
					if arg != nil {
						s = sampled
					}
					p.check("commit_spec", code, p.ref.CommitSpec(accepted, s))
					continue
				}
				code := goCommit(p.h, arg, n)
				if !ok {
					p.bad("commit", code)
					continue
				}
				p.check("commit", code, p.ref.Commit(sampled))
			case 9:
				p.check("abort", goAbort(p.h), p.ref.Abort())
			case 10:
				n := int64(next()%4) - int64(next()/250)
				freed, code := goEvict(p.h, n)
				if n < 0 {
					p.bad("evict", code)
					continue
				}
				if f := p.ref.Evict(int(n)); int64(f) != freed {
					t.Fatalf("evict %d: freed %d, Go %d", n, freed, f)
				}
				p.check("evict", code, nil)
			case 11:
				toks := tokens()
				pin, pinned, code := goPin(p.h, toks, int64(len(toks)))
				rpin, rn, err := p.ref.Pin(pagedkv.Namespace{}, toks)
				if err == nil && (uint64(rpin) != pin || int64(rn) != pinned) {
					t.Fatalf("pin: %d %d, Go %d %d", pin, pinned, rpin, rn)
				}
				p.check("pin", code, err)
			case 13:
				rid, n := id(), int64(next()%12)-int64(next()/250)
				code := goTruncate(p.h, rid, n)
				if n < 0 {
					p.bad("truncate", code)
					continue
				}
				p.check("truncate", code, p.ref.Truncate(pagedkv.RequestID(rid), int(n)))
			case 12:
				pin := uint64(next() % 4)
				if next()%2 == 0 {
					// A handle that is not this one.
					if code := goAudit(p.h + 1 + uint64(next())); code != codeBadHandle {
						t.Fatalf("audit of a bad handle: code %d", code)
					}
					continue
				}
				p.check("unpin", goUnpin(p.h, pin), p.ref.Unpin(pagedkv.PinID(pin)))
			}
		}
	}
}

// TestABIMessages checks that failures name the bad value through the
// calling thread's buffer.
func TestABIMessages(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	p := newABIPair(t, abiConfig{NumPages: 8, PageSize: 4, HashSeed: 1})
	for _, c := range []struct {
		call func() int32
		want string
	}{
		{func() int32 { return goExtend(p.h, 42, []int32{1}, 1) }, "extend request 42"},
		{func() int32 { return goExtend(p.h, 1, nil, 3) }, "tokens is NULL with length 3"},
		{func() int32 { return goCommit(p.h, nil, 0) }, "no step is reserved"},
		{func() int32 { return goReserve(p.h, []uint64{1}, []int32{1}, -7, nil) }, "ids length -7"},
		{func() int32 { return goAudit(p.h + 99) }, fmt.Sprintf("no manager with handle %d", p.h+99)},
	} {
		code := c.call()
		if msg := goLastError(); code == codeOK || !strings.Contains(msg, c.want) {
			t.Errorf("code %d, message %q, want it to contain %q", code, msg, c.want)
		}
	}
}

// TestStaleCallerMemoryIsNeverShaded: the plan struct a caller passes to
// pagedkv_reserve holds the previous plan's pointers (or garbage), and the
// library must overwrite them without reading them. A pointer-typed store
// into it would run Go's write barrier, which during a collection shades
// the slot's old value; a stale pointer to a freed Go object then kills the
// process ("found pointer to free object", seen in the Python tests under
// load). Here every word of a C-memory plan holds the address of a freed
// Go object before each reserve, while collections run back to back.
func TestStaleCallerMemoryIsNeverShaded(t *testing.T) {
	h, ids, ones, sampled, _ := decodeABI(t, 16)
	defer goDestroy(h)
	p := newCPlan()
	defer p.free()
	reserveOverStaleWords(t, h, 20000, p.fillWords, func() int32 { return goReserveC(h, ids, ones, int64(len(ids)), p) }, func(i int) {
		if got := p.read(); got.BatchSize != int64(len(ids)) || len(got.Arrays["kv_indptr"]) != len(ids)+1 || got.Levels != nil {
			t.Fatalf("step %d: the plan read back is wrong: batch %d, kv_indptr %v, %d levels", i, got.BatchSize, got.Arrays["kv_indptr"], len(got.Levels))
		}
	})
	_ = sampled
}

// reserveOverStaleWords runs steps reserves (each aborted) on handle h
// under back-to-back collections; before each, fill sets every word of the
// caller's out memory to a freed Go object's address, and check reads the
// plan back every steps/20 reserves.
func reserveOverStaleWords(t *testing.T, h uint64, steps int, fill func(uintptr), reserve func() int32, check func(step int)) {
	freed := underGCPressure(t)
	for i := range steps {
		fill(freed[i%len(freed)])
		if code := reserve(); code != codeOK {
			t.Fatalf("step %d: reserve: code %d: %s", i, code, goLastError())
		}
		if i%(steps/20) == 0 {
			check(i)
		}
		if code := goAbort(h); code != codeOK {
			t.Fatalf("step %d: abort: code %d", i, code)
		}
	}
}

// checkStepAllocs fails if step allocates after 50 warm-up runs.
func checkStepAllocs(t *testing.T, what string, step func()) {
	for range 50 {
		step()
	}
	if a := testing.AllocsPerRun(100, step); a != 0 {
		t.Fatalf("%s allocates %.1f times", what, a)
	}
}

// underGCPressure runs collections back to back until the test ends, on
// a heap of many small objects (which keeps each mark phase, when the write
// barrier is on, long), and returns addresses of freed Go objects.
func underGCPressure(t *testing.T) []uintptr {
	ballast := make([]*[2]*int, 1<<18)
	for i := range ballast {
		ballast[i] = new([2]*int)
	}
	freed, kept := freedObjects(4096)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				runtime.GC()
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-done
		runtime.KeepAlive(ballast)
		runtime.KeepAlive(kept)
	})
	return freed
}

// freedObjects returns the addresses of n pointer-holding Go objects that
// were allocated, dropped and swept: free slots of spans that stay in use,
// since the object allocated after each freed one is kept.
func freedObjects(n int) (freed []uintptr, kept []*[4]*int) {
	freed = make([]uintptr, n)
	for i := range freed {
		freed[i] = newObjectAddr()
		kept = append(kept, new([4]*int))
	}
	runtime.GC()
	runtime.GC()
	return freed, kept
}

// escape makes newObjectAddr's object a heap object (a pointer turned into
// an integer does not escape, so it would live on the stack).
var escape *[4]*int

func newObjectAddr() uintptr {
	escape = new([4]*int)
	addr := uintptr(unsafe.Pointer(escape))
	escape = nil
	return addr
}

// decodeABI makes a Manager behind the ABI with n requests of 64 prompt
// tokens each, prefilled.
func decodeABI(t testing.TB, n int) (h uint64, ids []uint64, ones, sampled []int32, plan *abiPlanC) {
	h, code := goCreate(abiConfig{NumPages: int64(n * 200), PageSize: 16, HashSeed: 1, BlockTablesStride: 200})
	if code != codeOK {
		t.Fatal(code)
	}
	ids, ones, sampled, nt := addDecodeRequests(t, h, n)
	plan = new(abiPlanC)
	if goReserve(h, ids, nt, int64(n), plan) != codeOK || goCommit(h, sampled, int64(n)) != codeOK {
		t.Fatal("prefill failed")
	}
	return h, ids, ones, sampled, plan
}

// addDecodeRequests adds n requests of 64 prompt tokens to handle h and
// returns their ids, ntokens for a decode step (ones), a sampled token
// each, and ntokens for their prefill.
// decodePrompt is request i's 64 prompt tokens in the decode benchmarks.
func decodePrompt(i int) []int32 {
	prompt := make([]int32, 64)
	for j := range prompt {
		prompt[j] = int32(64*i + j)
	}
	return prompt
}

// prefillGo is addDecodeRequests and the prefill step on a Manager.
func prefillGo(tb testing.TB, m *pagedkv.Manager, ids []pagedkv.RequestID, nt, ones, sampled []int32) {
	for i := range ids {
		ids[i], nt[i], ones[i], sampled[i] = pagedkv.RequestID(i+1), 64, 1, 7
		if _, err := m.Add(ids[i], pagedkv.Request{Prompt: decodePrompt(i), CapacityTokens: 4096}); err != nil {
			tb.Fatal(err)
		}
	}
	if _, err := m.Reserve(ids, nt); err != nil {
		tb.Fatal(err)
	}
	if err := m.Commit(sampled); err != nil {
		tb.Fatal(err)
	}
}

func addDecodeRequests(t testing.TB, h uint64, n int) (ids []uint64, ones, sampled, nt []int32) {
	ids, ones, sampled, nt = make([]uint64, n), make([]int32, n), make([]int32, n), make([]int32, n)
	for i := range ids {
		ids[i], ones[i], sampled[i], nt[i] = uint64(i+1), 1, 7, 64
		if _, code := goAdd(h, ids[i], abiRequest{Prompt: decodePrompt(i), PromptLen: 64, CapacityTokens: 4096}); code != codeOK {
			t.Fatal(code)
		}
	}
	return ids, ones, sampled, nt
}

// TestABIStepIsAllocationFree pins the C layer's per-step cost: a decode
// step through pagedkv_reserve and pagedkv_commit allocates nothing (the
// handle's pins and buffers are reused).
func TestABIStepIsAllocationFree(t *testing.T) {
	h, ids, ones, sampled, plan := decodeABI(t, 64)
	defer goDestroy(h)
	checkStepAllocs(t, "a decode step through the C ABI", func() {
		if goReserve(h, ids, ones, int64(len(ids)), plan) != codeOK || goCommit(h, sampled, int64(len(ids))) != codeOK {
			t.Fatal("step failed")
		}
	})
}

// BenchmarkABIDecodeStep measures the C layer's own cost (handle lookup,
// busy flag, recover, plan export and pins) on top of the Manager's step:
// "go" calls the Manager directly, "abi" the exported functions (from Go,
// so without the cgo transition itself; python/bench_step.py measures that
// too). Every 2000 steps the requests are made again (off the clock), so
// the pool never runs out.
func BenchmarkABIDecodeStep(b *testing.B) {
	const n, fresh = 256, 2000
	b.Run("go", func(b *testing.B) {
		var m *pagedkv.Manager
		ids := make([]pagedkv.RequestID, n)
		nt, ones, sampled := make([]int32, n), make([]int32, n), make([]int32, n)
		setup := func() {
			var err error
			if m, err = pagedkv.New(pagedkv.Config{NumPages: n * 200, PageSize: 16, HashSeed: 1}); err != nil {
				b.Fatal(err)
			}
			prefillGo(b, m, ids, nt, ones, sampled)
		}
		setup()
		b.ReportAllocs()
		steps := 0
		for b.Loop() {
			if steps++; steps%fresh == 0 {
				b.StopTimer()
				setup()
				b.StartTimer()
			}
			if _, err := m.Reserve(ids, ones); err != nil {
				b.Fatal(err)
			}
			if err := m.Commit(sampled); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("abi", func(b *testing.B) {
		h, ids, ones, sampled, plan := decodeABI(b, n)
		b.ReportAllocs()
		steps := 0
		for b.Loop() {
			if steps++; steps%fresh == 0 {
				b.StopTimer()
				goDestroy(h)
				h, ids, ones, sampled, plan = decodeABI(b, n)
				b.StartTimer()
			}
			if goReserve(h, ids, ones, n, plan) != codeOK || goCommit(h, sampled, n) != codeOK {
				b.Fatal("step failed")
			}
		}
		goDestroy(h)
	})
}

// The header's PAGEDKV_ATTENTION_* are kernels.AttentionKind's numbers, so
// pagedkv_plan.attention_kind is the Go decision as it is.
func TestAttentionKindNumbers(t *testing.T) {
	h := headerAttentionKinds()
	for _, k := range []kernels.AttentionKind{kernels.Decode, kernels.Prefill, kernels.Cascade, kernels.Chunked} {
		if got, ok := h[k.String()]; !ok || got != int64(k) {
			t.Errorf("PAGEDKV_ATTENTION_%s = %d (in header: %v), want %d", strings.ToUpper(k.String()), got, ok, int64(k))
		}
	}
	if len(h) != 4 {
		t.Errorf("the header has %d attention kinds, want 4", len(h))
	}
}
