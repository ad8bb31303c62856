package main

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"sync"
	"testing"
	"time"

	pagedkv "github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/appendkv"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/pagetable"
	"github.com/pagedkv/pagedkv/prefixcache"
)

func init() {
	register(&command{
		name:    "bench",
		summary: "run the key benchmarks, each next to its baseline or physical limit",
		usage:   "pagedkv bench [--benchtime D] [--short]",
		run:     runBench,
	})
}

const benchHelp = `
Runs each benchmark and its baseline with testing.Benchmark and prints one
row per pair: our cost per unit, the baseline's, and the ratio of our time
to the baseline's. Against a naive implementation a ratio below 1 means we
are faster; against a physical limit (memmove of the same bytes) 1 is the
floor and the ratio says how far above it we are.

Flags:
`

// benchPair is one row of the table.
type benchPair struct {
	name     string
	unit     string // what ours and the baseline are counted per
	baseline string // what the baseline is
	// perOp is the number of units one iteration handles (pages, requests,
	// tokens, bytes...), the same for both.
	perOp  float64
	bytes  bool // units are bytes: show GB/s instead of ns/unit
	ours   benchFunc
	versus benchFunc
}

// maxBenchtime bounds --benchtime: 12 benchmarks of a minute each is
// already a long run; a typo such as 1000h fails fast instead.
const maxBenchtime = time.Minute

func runBench(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("bench", benchHelp, stderr)
	benchtime := fs.Duration("benchtime", 500*time.Millisecond, "target run time of each benchmark")
	short := fs.Bool("short", false, "small sizes and 10ms per benchmark (for tests; the numbers are rough)")
	if code, ok := parseFlagsOnly(fs, args, stderr); !ok {
		return code
	}
	if *benchtime <= 0 || *benchtime > maxBenchtime {
		fmt.Fprintf(stderr, "pagedkv bench: --benchtime %v, want > 0 and at most %v\n", *benchtime, maxBenchtime)
		return exitUsage
	}
	d := *benchtime
	if *short {
		d = 10 * time.Millisecond
	}
	restore, err := setBenchtime(d)
	if err != nil {
		fmt.Fprintf(stderr, "pagedkv bench: %v\n", err)
		return exitFailure
	}
	defer restore()

	sz := fullSizes
	if *short {
		sz = shortSizes
	}
	pairs := benchPairs(sz)
	width := len("benchmark")
	for _, p := range pairs {
		width = max(width, len(p.name))
	}
	row := func(name, ours, allocs, base, ratio, what string) {
		fmt.Fprintf(stdout, "%-*s  %16s  %9s  %16s  %9s  %s\n", width, name, ours, allocs, base, ratio, what)
	}
	row("benchmark", "ours", "allocs/op", "baseline", "ratio", "baseline is")
	failed := false
	for _, p := range pairs {
		ours, err := runOne(p.ours)
		var base testing.BenchmarkResult
		if err == nil {
			base, err = runOne(p.versus)
		}
		if err != nil {
			failed = true
			row(p.name, "FAILED", "", "", "", err.Error())
			continue
		}
		o, v := perUnit(ours, p.perOp), perUnit(base, p.perOp)
		row(p.name, p.format(o), strconv.FormatInt(ours.AllocsPerOp(), 10), p.format(v), fmt.Sprintf("%.2fx", o/v), p.baseline)
	}
	fmt.Fprintln(stdout, "ratio = our time / the baseline's time per unit (below 1: faster than the baseline; against memmove, 1 is the floor)")
	if failed {
		return exitFailure
	}
	return exitOK
}

// perUnit is the nanoseconds per unit of one result.
func perUnit(r testing.BenchmarkResult, perOp float64) float64 {
	return float64(r.T.Nanoseconds()) / float64(r.N) / perOp
}

func (p *benchPair) format(nsPerUnit float64) string {
	if p.bytes {
		return fmt.Sprintf("%.2f GB/s", 1/nsPerUnit)
	}
	return fmt.Sprintf("%.3g ns/%s", nsPerUnit, p.unit)
}

// benchFunc is a benchmark that returns its failure instead of calling
// b.Fatal (testing.Benchmark discards failure messages).
type benchFunc func(b *testing.B) error

// runOne runs f with testing.Benchmark and returns its first error.
func runOne(f benchFunc) (testing.BenchmarkResult, error) {
	var mu sync.Mutex
	var failure error
	r := testing.Benchmark(func(b *testing.B) {
		if err := f(b); err != nil {
			mu.Lock()
			failure = err
			mu.Unlock()
			b.FailNow()
		}
	})
	mu.Lock()
	defer mu.Unlock()
	if failure == nil && r.N == 0 {
		failure = errors.New("benchmark did not run")
	}
	return r, failure
}

var setBenchtimeOnce sync.Once

// setBenchtime sets testing's -test.benchtime, which testing.Benchmark
// reads, and returns a function that restores it.
func setBenchtime(d time.Duration) (restore func(), err error) {
	setBenchtimeOnce.Do(testing.Init) // registers the test.* flags (on flag.CommandLine, which main does not use)
	f := flag.Lookup("test.benchtime")
	if f == nil {
		return nil, errors.New("testing has no test.benchtime flag")
	}
	old := f.Value.String()
	if err := f.Value.Set(d.String()); err != nil {
		return nil, err
	}
	return func() { f.Value.Set(old) }, nil //nolint:errcheck // old was accepted before
}

// benchSizes are the problem sizes; --short uses small ones.
type benchSizes struct {
	allocPool, allocBatch    int
	decodeReqs, decodePrompt int // Manager decode step
	decodeReqsLarge          int // a second Manager row, the 4096 requests
	exportSeqs, exportTokens int
	appendRows               int
	attnReqs, attnTokens     int // CPU decode
	lookupTokens             int
}

var (
	fullSizes  = benchSizes{1 << 16, 16, 256, 512, 4096, 256, 4096, 256, 8, 1024, 8192}
	shortSizes = benchSizes{1 << 10, 16, 16, 64, 64, 16, 256, 16, 2, 64, 256}
)

// The attention geometry of the kernel benchmarks: a Llama-like layer.
const (
	benchHq, benchHkv, benchD, benchPageSize = 32, 8, 128, 16
)

func benchPairs(sz benchSizes) []benchPair {
	kvRow := int64(2 * benchHkv * benchD * layout.F16.Size()) // K+V of one token
	pairs := []benchPair{
		{
			name: fmt.Sprintf("alloc+free, batch %d", sz.allocBatch), unit: "page", perOp: float64(sz.allocBatch),
			baseline: "naive allocator: mutex, map of refcounts, free slice",
			ours:     func(b *testing.B) error { return benchAlloc(b, sz, false) },
			versus:   func(b *testing.B) error { return benchAlloc(b, sz, true) },
		},
		{
			name: "alloc+free, 1 page, owner-local Cache", unit: "page", perOp: 1,
			baseline: "naive allocator, one page",
			ours:     func(b *testing.B) error { return benchAllocCache(b, sz) },
			versus:   func(b *testing.B) error { one := sz; one.allocBatch = 1; return benchAlloc(b, one, true) },
		},
	}
	for _, n := range []int{sz.decodeReqs, sz.decodeReqsLarge} {
		msz := sz
		msz.decodeReqs = n
		pairs = append(pairs, benchPair{
			name: fmt.Sprintf("decode step, Manager, %d requests", n), unit: "request", perOp: float64(n),
			baseline: "memmove of the step's plan arrays",
			ours:     func(b *testing.B) error { return benchManagerDecode(b, msz) },
			versus: func(b *testing.B) error {
				n, err := managerPlanBytes(msz)
				if err != nil {
					return err
				}
				return benchMemmove(b, n)
			},
		})
	}
	return append(pairs, []benchPair{
		{
			name: fmt.Sprintf("CSR export, %d x %d tokens", sz.exportSeqs, sz.exportTokens), bytes: true, perOp: float64(exportBytes(sz)),
			baseline: "memmove of the same bytes",
			ours:     func(b *testing.B) error { return benchExport(b, sz) },
			versus:   func(b *testing.B) error { return benchMemmove(b, exportBytes(sz)) },
		},
		{
			name: fmt.Sprintf("append, cpu, %d rows f16 NHD", sz.appendRows), bytes: true, perOp: float64(int64(sz.appendRows) * kvRow),
			baseline: "memmove of the same bytes",
			ours:     func(b *testing.B) error { return benchAppend(b, sz, layout.NHD) },
			versus:   func(b *testing.B) error { return benchMemmove(b, int64(sz.appendRows)*kvRow) },
		},
		{
			name: fmt.Sprintf("append, cpu, %d rows f16 HND", sz.appendRows), bytes: true, perOp: float64(int64(sz.appendRows) * kvRow),
			baseline: "memmove of the same bytes",
			ours:     func(b *testing.B) error { return benchAppend(b, sz, layout.HND) },
			versus:   func(b *testing.B) error { return benchMemmove(b, int64(sz.appendRows)*kvRow) },
		},
		{
			name: fmt.Sprintf("decode, cpu, 1 worker, %d x %d tokens f16", sz.attnReqs, sz.attnTokens), bytes: true,
			perOp:    float64(int64(sz.attnReqs*sz.attnTokens) * kvRow),
			baseline: "memmove of the K/V read",
			ours:     func(b *testing.B) error { return benchDecode(b, sz, 1) },
			versus:   func(b *testing.B) error { return benchMemmove(b, int64(sz.attnReqs*sz.attnTokens)*kvRow) },
		},
		{
			name: fmt.Sprintf("decode, cpu, 2 workers, %d x %d tokens f16", sz.attnReqs, sz.attnTokens), bytes: true,
			perOp:    float64(int64(sz.attnReqs*sz.attnTokens) * kvRow),
			baseline: "the same decode on 1 worker (wall time: needs 2 idle cores)",
			ours:     func(b *testing.B) error { return benchDecode(b, sz, 2) },
			versus:   func(b *testing.B) error { return benchDecode(b, sz, 1) },
		},
		{
			name: fmt.Sprintf("prefix lookup, %d tokens", sz.lookupTokens), unit: "token", perOp: float64(sz.lookupTokens),
			baseline: "naive: SHA-256 chain per page + map",
			ours:     func(b *testing.B) error { return benchLookup(b, sz, false) },
			versus:   func(b *testing.B) error { return benchLookup(b, sz, true) },
		},
	}...)
}

// benchMemmove copies n bytes per iteration: the physical limit of
// producing (or reading) n bytes.
func benchMemmove(b *testing.B, n int64) error {
	src, dst := make([]byte, n), make([]byte, n)
	for i := range src {
		src[i] = byte(i)
	}
	b.SetBytes(n)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		copy(dst, src)
	}
	return nil
}

// naiveAllocator is what one writes first: a mutex, a map of reference
// counts and a slice of free pages, one lock per page.
type naiveAllocator struct {
	mu   sync.Mutex
	refs map[int32]int32
	free []int32
}

func (a *naiveAllocator) alloc(dst []int32) {
	for i := range dst {
		a.mu.Lock()
		p := a.free[len(a.free)-1]
		a.free = a.free[:len(a.free)-1]
		a.refs[p] = 1
		a.mu.Unlock()
		dst[i] = p
	}
}

func (a *naiveAllocator) release(pages []int32) {
	for _, p := range pages {
		a.mu.Lock()
		if a.refs[p]--; a.refs[p] == 0 {
			delete(a.refs, p)
			a.free = append(a.free, p)
		}
		a.mu.Unlock()
	}
}

// benchAlloc allocates and frees allocBatch pages per iteration from a pool
// half in use.
func benchAlloc(b *testing.B, sz benchSizes, naive bool) error {
	if naive {
		a := &naiveAllocator{refs: map[int32]int32{}}
		for p := sz.allocPool - 1; p >= 0; p-- {
			a.free = append(a.free, int32(p))
		}
		a.alloc(make([]int32, sz.allocPool/2))
		dst := make([]int32, sz.allocBatch)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			a.alloc(dst)
			a.release(dst)
		}
		return nil
	}
	a, err := allocator.New(allocator.Config{NumPages: sz.allocPool})
	if err != nil {
		return err
	}
	if err := a.Alloc(make([]allocator.PageID, sz.allocPool/2)); err != nil {
		return err
	}
	dst := make([]allocator.PageID, sz.allocBatch)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := a.Alloc(dst); err != nil {
			return err
		}
		if _, err := a.Release(dst...); err != nil {
			return err
		}
	}
	return nil
}

// benchAllocCache allocates and frees one page per iteration through an
// owner-local allocator.Cache, from a pool half in use.
func benchAllocCache(b *testing.B, sz benchSizes) error {
	a, err := allocator.New(allocator.Config{NumPages: sz.allocPool})
	if err != nil {
		return err
	}
	if err := a.Alloc(make([]allocator.PageID, sz.allocPool/2)); err != nil {
		return err
	}
	c := a.NewCache()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		p, err := c.Alloc()
		if err != nil {
			return err
		}
		if _, err := c.Release(p); err != nil {
			return err
		}
	}
	return nil
}

// decodeManager is a Manager with decodeReqs requests of decodePrompt
// prefilled tokens each, ready to decode.
type decodeManager struct {
	m       *pagedkv.Manager
	ids     []pagedkv.RequestID
	ones    []int32
	sampled []int32
}

// benchDecodeSteps is how many decode steps a decodeManager has room for.
const benchDecodeSteps = 1024

func newDecodeManager(sz benchSizes) (*decodeManager, error) {
	n, ps := sz.decodeReqs, benchPageSize
	m, err := pagedkv.New(pagedkv.Config{NumPages: n * ((sz.decodePrompt+benchDecodeSteps)/ps + 2), PageSize: ps, HashSeed: 1})
	if err != nil {
		return nil, err
	}
	d := &decodeManager{m: m}
	prompt := make([]int32, sz.decodePrompt)
	counts := make([]int32, n)
	for i := range n {
		for j := range prompt {
			prompt[j] = int32(i*sz.decodePrompt + j) // no two requests share a page
		}
		id := pagedkv.RequestID(i + 1)
		if _, err := m.Add(id, pagedkv.Request{Prompt: prompt, CapacityTokens: sz.decodePrompt + benchDecodeSteps + 1}); err != nil {
			return nil, err
		}
		d.ids = append(d.ids, id)
		d.ones = append(d.ones, 1)
		d.sampled = append(d.sampled, 7)
		counts[i] = int32(sz.decodePrompt)
	}
	if _, err := m.Reserve(d.ids, counts); err != nil {
		return nil, err
	}
	return d, m.Commit(d.sampled)
}

func (d *decodeManager) step() (*pagedkv.Plan, error) {
	p, err := d.m.Reserve(d.ids, d.ones)
	if err != nil {
		return nil, err
	}
	return p, d.m.Commit(d.sampled)
}

// benchManagerDecode is one decode step of decodeReqs requests per
// iteration: Reserve (with the plan's arrays) and Commit (publishing the
// pages that fill). A fresh Manager replaces the old one, untimed, every
// benchDecodeSteps steps.
func benchManagerDecode(b *testing.B, sz benchSizes) error {
	d, err := newDecodeManager(sz)
	if err != nil {
		return err
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i > 0 && i%benchDecodeSteps == 0 {
			b.StopTimer()
			if d, err = newDecodeManager(sz); err != nil {
				return err
			}
			b.StartTimer()
		}
		if _, err := d.step(); err != nil {
			return err
		}
	}
	return nil
}

// managerPlanBytes is the size of the int32 arrays of one decode step's
// plan, measured on a real step.
func managerPlanBytes(sz benchSizes) (int64, error) {
	d, err := newDecodeManager(sz)
	if err != nil {
		return 0, err
	}
	p, err := d.step()
	if err != nil {
		return 0, err
	}
	return 4 * int64(len(p.QOIndptr)+len(p.BatchIndices)+len(p.Positions)+len(p.TokenIDs)+len(p.TokenPositions)+
		len(p.KVIndptr)+len(p.KVPageIndices)+len(p.KVLastPageLen)+len(p.SeqLens)), nil
}

// exportTable is a page table of exportSeqs sequences of exportTokens
// tokens each.
func exportTable(sz benchSizes) (*pagetable.Table, []pagetable.SeqID, error) {
	pages := sz.exportSeqs * (sz.exportTokens/benchPageSize + 1)
	a, err := allocator.New(allocator.Config{NumPages: pages})
	if err != nil {
		return nil, nil, err
	}
	t, err := pagetable.New(pagetable.Config{PageSize: benchPageSize, Allocator: a})
	if err != nil {
		return nil, nil, err
	}
	ids := make([]pagetable.SeqID, sz.exportSeqs)
	counts := make([]int32, sz.exportSeqs)
	for i := range ids {
		ids[i], counts[i] = pagetable.SeqID(i+1), int32(sz.exportTokens)
		if err := t.Add(ids[i]); err != nil {
			return nil, nil, err
		}
	}
	_, err = t.Reserve(nil, ids, counts)
	return t, ids, err
}

// exportBytes is what ExportTo writes: KVIndptr, KVPageIndices,
// KVLastPageLen and SeqLens, 4 bytes per element.
func exportBytes(sz benchSizes) int64 {
	pages := sz.exportSeqs * ((sz.exportTokens + benchPageSize - 1) / benchPageSize)
	return 4 * int64((sz.exportSeqs+1)+pages+2*sz.exportSeqs)
}

func benchExport(b *testing.B, sz benchSizes) error {
	t, ids, err := exportTable(sz)
	if err != nil {
		return err
	}
	var csr pagetable.CSR
	if err := t.ExportTo(&csr, ids); err != nil {
		return err
	}
	b.SetBytes(exportBytes(sz))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := t.ExportTo(&csr, ids); err != nil {
			return err
		}
	}
	return nil
}

// benchAppend appends one decode row to each of appendRows requests (one
// page each, the row at entry 15) per iteration, with appendkv on the CPU
// backend on one worker, into a cache of layout l.
func benchAppend(b *testing.B, sz benchSizes, l layout.KVLayout) error {
	n := sz.appendRows
	g := layout.Paged{Layout: l, Form: layout.Fused, DType: layout.F16, NumPages: n, PageSize: benchPageSize,
		NumKVHeads: benchHkv, HeadDim: benchD}
	cache, err := kernels.NewPagedKVCache(g)
	if err != nil {
		return err
	}
	indptr, indices, last, qo, seqLens := make([]int32, n+1), make([]int32, n), make([]int32, n), make([]int32, n+1), make([]int32, n)
	for i := range n {
		indptr[i+1], indices[i], last[i], qo[i+1], seqLens[i] = int32(i+1), int32(n-1-i), benchPageSize, int32(i+1), benchPageSize
	}
	table := kernels.PageTable{KVIndptr: indptr, KVPageIndices: indices, KVLastPageLen: last}
	var plan appendkv.Plan
	if err := plan.Build(qo, seqLens); err != nil {
		return err
	}
	k, v := kernels.NewTensor(layout.F16, n, benchHkv, benchD), kernels.NewTensor(layout.F16, n, benchHkv, benchD)
	backend := cpu.New(cpu.Config{Workers: 1})
	in := appendkv.Input{AppendKey: k, AppendValue: v, Cache: &cache, Table: &table}
	b.SetBytes(int64(len(k.Data) + len(v.Data)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := plan.Run(backend, in); err != nil {
			return err
		}
	}
	return nil
}

// benchDecode is one CPU batch decode of attnReqs requests of attnTokens
// tokens per iteration, on the given number of workers.
func benchDecode(b *testing.B, sz benchSizes, workers int) error {
	B, L := sz.attnReqs, sz.attnTokens
	pagesPer := (L + benchPageSize - 1) / benchPageSize
	g := layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F16, NumPages: B * pagesPer, PageSize: benchPageSize,
		NumKVHeads: benchHkv, HeadDim: benchD}
	cache, err := kernels.NewPagedKVCache(g)
	if err != nil {
		return err
	}
	for i := range cache.Data { // small finite f16 values
		if i%2 == 1 {
			cache.Data[i] = 0x30 | byte(i/2)&0x3
		}
	}
	indptr, indices, last := make([]int32, B+1), make([]int32, B*pagesPer), make([]int32, B)
	for r := range B {
		indptr[r+1] = int32((r + 1) * pagesPer)
		last[r] = int32(L - (pagesPer-1)*benchPageSize)
	}
	for i := range indices {
		indices[i] = int32((i * 7919) % len(indices)) // scattered pages
	}
	q := kernels.NewTensor(layout.F16, B, benchHq, benchD)
	p := &kernels.DecodeParams{Q: q, Cache: cache, Table: kernels.PageTable{KVIndptr: indptr, KVPageIndices: indices, KVLastPageLen: last},
		AttentionParams: kernels.AttentionParams{NumQOHeads: benchHq, WindowLeft: -1}, O: kernels.NewTensor(layout.F16, B, benchHq, benchD)}
	backend := cpu.New(cpu.Config{Workers: workers})
	b.SetBytes(int64(B*L) * int64(2*benchHkv*benchD*layout.F16.Size()))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := backend.BatchDecode(p); err != nil {
			return err
		}
	}
	return nil
}

// naivePageKey is vLLM's key of a page: the SHA-256 of its parent's key and
// its tokens (little-endian int32), hashed in buf (32+4*len(tokens) bytes).
func naivePageKey(buf []byte, parent [32]byte, tokens []int32) [32]byte {
	copy(buf, parent[:])
	for j, t := range tokens {
		binary.LittleEndian.PutUint32(buf[32+4*j:], uint32(t))
	}
	return sha256.Sum256(buf)
}

// benchLookup looks up a fully cached prompt of lookupTokens tokens (among
// two other cached prompts) per iteration.
func benchLookup(b *testing.B, sz benchSizes, naive bool) error {
	ps, npages := benchPageSize, sz.lookupTokens/benchPageSize
	prompts := make([][]int32, 3)
	for i := range prompts {
		prompts[i] = make([]int32, sz.lookupTokens)
		for j := range prompts[i] {
			prompts[i][j] = int32((i*sz.lookupTokens + j) * 31 % 32000)
		}
	}
	prompt := prompts[2]
	if naive {
		// vLLM's scheme: a page's key is the SHA-256 of its parent's key
		// and its tokens.
		index := map[[32]byte]int32{}
		buf := make([]byte, 32+4*ps)
		for _, p := range prompts {
			var parent [32]byte
			for i := range npages {
				parent = naivePageKey(buf, parent, p[i*ps:(i+1)*ps])
				index[parent] = int32(len(index))
			}
		}
		dst := make([]int32, 0, npages)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			dst = dst[:0]
			var parent [32]byte
			for i := range npages {
				parent = naivePageKey(buf, parent, prompt[i*ps:(i+1)*ps])
				page, ok := index[parent]
				if !ok {
					break
				}
				dst = append(dst, page)
			}
			if len(dst) != npages {
				return fmt.Errorf("matched %d pages, want %d", len(dst), npages)
			}
		}
		return nil
	}
	a, err := allocator.New(allocator.Config{NumPages: 3 * npages})
	if err != nil {
		return err
	}
	c, err := prefixcache.New(prefixcache.Config{NumPages: 3 * npages, PageSize: ps, Refs: a, Seed: 1})
	if err != nil {
		return err
	}
	key := c.Key(prefixcache.Namespace{Tenant: "bench"})
	for _, p := range prompts {
		pages := make([]allocator.PageID, npages)
		if err := a.Alloc(pages); err != nil {
			return err
		}
		h := prefixcache.Handle{}
		for i, pg := range pages {
			if h, _, err = c.Publish(h, key, pg, p[i*ps:(i+1)*ps], 0); err != nil {
				return err
			}
		}
	}
	dst := make([]allocator.PageID, 0, npages)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		got, _ := c.Match(dst[:0], key, prompt, npages)
		if len(got) != npages {
			return fmt.Errorf("matched %d pages, want %d", len(got), npages)
		}
	}
	return nil
}

// benchNames lists the rows bench prints, in order (for tests).
func benchNames(sz benchSizes) []string {
	var names []string
	for _, p := range benchPairs(sz) {
		names = append(names, p.name)
	}
	return names
}
