// Package cpu is the pure-Go [kernels.Backend]: the default backend, used by
// the CLI on machines without a GPU and as the reference the CUDA kernels are
// compared with. Work is split across goroutines (up to Config.Workers).
//
// A *Backend is safe for concurrent use; calls do not retain their arguments.
package cpu

import (
	"fmt"
	"runtime"
	"sync"
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
}

// New returns a CPU backend.
func New(cfg Config) *Backend {
	w := cfg.Workers
	if w <= 0 {
		w = runtime.GOMAXPROCS(0)
	}
	return &Backend{workers: w}
}

// Name returns "cpu".
func (b *Backend) Name() string { return "cpu" }

// parallelFor runs fn(i) for i in [0, n) on up to b.workers goroutines,
// handing out indices in order. It runs inline when n or the worker count is 1.
//
// Every op validates its parameters before it gets here, so fn cannot fail
// on caller input. Should a bug panic in a worker anyway, the panic is
// caught there, the other workers stop taking tasks, and it is raised again
// on the caller's goroutine once all have returned: a caller's recover sees
// it, and no worker goroutine can take the process down.
func (b *Backend) parallelFor(n int, fn func(i int)) {
	w := b.workers
	if w > n {
		w = n
	}
	if w <= 1 {
		for i := 0; i < n; i++ {
			fn(i)
		}
		return
	}
	var next sync.Mutex
	i := 0
	var failure any
	var wg sync.WaitGroup
	wg.Add(w)
	for g := 0; g < w; g++ {
		go func() {
			defer wg.Done()
			defer func() {
				if p := recover(); p != nil {
					next.Lock()
					if failure == nil {
						failure = p
					}
					i = n // no more tasks for anyone
					next.Unlock()
				}
			}()
			for {
				next.Lock()
				j := i
				i++
				next.Unlock()
				if j >= n {
					return
				}
				fn(j)
			}
		}()
	}
	wg.Wait()
	if failure != nil {
		panic(fmt.Sprintf("kernels/cpu: a worker panicked: %v", failure))
	}
}
