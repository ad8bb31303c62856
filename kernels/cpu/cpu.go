// Package cpu is the pure-Go [kernels.Backend]: the default backend, used by
// the CLI on machines without a GPU and as the reference the CUDA kernels are
// compared with. Work is split into tasks run by up to Config.Workers
// goroutines: the caller and a persistent pool of Workers-1 helpers,
// started with the first parallel call and stopped when the Backend is
// garbage collected. Decode splits by (request, kv heads) when there are
// enough requests and by page ranges of each request, merged like
// merge_states, when there are few. On amd64 with AVX2, FMA and F16C the
// decode inner loops run in assembly generated with avo (see gen.go);
// -tags purego, or any other CPU, runs the pure-Go loops they are tested
// against.
//
// # Invariants
//
//   - A call validates everything (package kernels' Validate methods)
//     before any task starts, so a refused call writes nothing, and no
//     task reads or writes outside the tensors it was given.
//   - How the work is split depends on Workers, never what is computed:
//     the page-range split of a decode merges its partial states as
//     merge_states does, so a split changes rounding only, and every split
//     stays within the conformance suite's tolerances.
//   - The assembly loops and the pure-Go loops they replace are tested
//     against each other; -tags purego runs the latter everywhere.
//   - The helper goroutines hold the pool, never the Backend, so an
//     unreachable Backend is collected and its helpers exit.
//
// # Concurrency
//
// A *Backend is safe for concurrent use; calls do not retain their arguments.
// Steady-state decode and append calls allocate nothing.
package cpu

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/pagedkv/pagedkv/kernels"
)

// Config configures a CPU backend.
type Config struct {
	// Workers is the number of goroutines an operation may use; 0 means
	// runtime.GOMAXPROCS(0).
	Workers int
}

// Backend is the pure-Go implementation of kernels.Backend.
type Backend struct {
	workers int
	pool    *pool
}

// New returns a CPU backend.
func New(cfg Config) *Backend {
	w := cfg.Workers
	if w <= 0 {
		w = runtime.GOMAXPROCS(0)
	}
	b := &Backend{workers: w, pool: &pool{workers: w}}
	// The helpers hold the pool, never the Backend, so an unreachable
	// Backend is collected and its helpers told to exit.
	runtime.AddCleanup(b, func(p *pool) { p.stop() }, b.pool)
	return b
}

// Name returns "cpu".
func (b *Backend) Name() string { return "cpu" }

// pool runs calls' tasks on the caller and workers-1 helper goroutines.
type pool struct {
	workers int

	mu   sync.Mutex
	free []*call      // idle calls for reuse
	wake []chan *call // one per helper, started with the first parallel call
}

// callKind says which operation a call runs.
type callKind uint8

const (
	callFunc   callKind = iota // fn(i): merges, MLA decode
	callAttn                   // decode and prefill tasks of attn
	callAppend                 // append chunks of app
)

// call is one operation in flight: what its tasks do and how they are
// handed out. Calls are reused, with their per-worker scratch, so that a
// steady-state decode or append allocates nothing.
type call struct {
	kind callKind
	fn   func(i int)
	attn attnJob
	app  *kernels.AppendParams
	per  int // append rows per task
	nnz  int // append rows in all

	n    int          // tasks
	next atomic.Int64 // next task to hand out
	wg   sync.WaitGroup

	// failure is the first panic of a worker (a bug: every op validates its
	// parameters first), re-raised on the caller's goroutine by run.
	mu      sync.Mutex
	failure any

	scratch []attnScratch // one per worker: 0 is the caller, h+1 helper h
	partial []float32     // a split decode's partial states (attnJob.partial)
}

func (p *pool) get() *call {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.free); n > 0 {
		c := p.free[n-1]
		p.free = p.free[:n-1]
		return c
	}
	return &call{scratch: make([]attnScratch, p.workers)}
}

// put returns c for reuse, dropping its references to the caller's data.
func (p *pool) put(c *call) {
	c.fn, c.attn, c.app = nil, attnJob{}, nil
	p.mu.Lock()
	p.free = append(p.free, c)
	p.mu.Unlock()
}

// workerHook, when set (by benchmarks), is called by each worker as it
// starts (start true) and ends its share of a call, on that worker's
// goroutine and OS thread.
var workerHook func(w int, start bool)

// run runs c's n tasks on up to p.workers goroutines and returns when all
// are done. It runs inline when n or the worker count is 1. Should a task
// panic on any worker, the others stop taking tasks and the panic is
// raised again here, on the caller's goroutine, once all have returned: a
// caller's recover sees it, and no helper can take the process down.
func (p *pool) run(c *call, n int) {
	c.n = n
	c.next.Store(0)
	c.failure = nil
	w := min(p.workers, n)
	if w <= 1 {
		c.work(0)
		return
	}
	p.mu.Lock()
	if p.wake == nil {
		p.start()
	}
	wake := p.wake
	p.mu.Unlock()
	c.wg.Add(w - 1)
	for h := 0; h < w-1; h++ {
		wake[h] <- c
	}
	c.guardedWork(0)
	c.wg.Wait()
	if c.failure != nil {
		panic(fmt.Sprintf("kernels/cpu: a worker panicked: %v", c.failure))
	}
}

// guardedWork is work that records a panic in c instead of propagating it,
// and stops the hand-out of tasks.
func (c *call) guardedWork(w int) {
	defer func() {
		if r := recover(); r != nil {
			c.mu.Lock()
			if c.failure == nil {
				c.failure = r
			}
			c.mu.Unlock()
			c.next.Store(int64(c.n)) // no more tasks for anyone
		}
	}()
	c.work(w)
}

// start launches the helpers; p.mu is held.
func (p *pool) start() {
	p.wake = make([]chan *call, p.workers-1)
	for h := range p.wake {
		ch := make(chan *call, 16)
		p.wake[h] = ch
		go func() {
			for c := range ch {
				c.guardedWork(h + 1)
				c.wg.Done()
			}
		}()
	}
}

// stop ends the helpers (the Backend is gone).
func (p *pool) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ch := range p.wake {
		close(ch)
	}
	p.wake = nil
}

// work runs c's tasks as worker w until none is left.
func (c *call) work(w int) {
	if h := workerHook; h != nil {
		// Stay on one OS thread, so that the thread's CPU clock is this
		// worker's for the whole share.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		h(w, true)
		defer h(w, false)
	}
	for {
		i := int(c.next.Add(1) - 1)
		if i >= c.n {
			return
		}
		switch c.kind {
		case callFunc:
			c.fn(i)
		case callAttn:
			c.attn.task(&c.scratch[w], i)
		case callAppend:
			appendRows(c.app, i*c.per, min((i+1)*c.per, c.nnz))
		}
	}
}

// parallelFor runs fn(i) for i in [0, n) on up to b.workers goroutines.
// It runs inline when n or the worker count is 1. (fn is a closure: the
// hot paths use calls of their own kind instead, which do not allocate.)
func (b *Backend) parallelFor(n int, fn func(i int)) {
	if b.workers <= 1 || n <= 1 {
		for i := 0; i < n; i++ {
			fn(i)
		}
		return
	}
	c := b.pool.get()
	c.kind, c.fn = callFunc, fn
	b.pool.run(c, n)
	b.pool.put(c)
}
