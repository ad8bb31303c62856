// Package cpu is the pure-Go [kernels.Backend]: the default backend, used by
// the CLI on machines without a GPU and as the reference the CUDA kernels are
// compared with. Work is split across goroutines (up to Config.Workers).
//
// A *Backend is safe for concurrent use; calls do not retain their arguments.
package cpu

import (
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
	var wg sync.WaitGroup
	wg.Add(w)
	for g := 0; g < w; g++ {
		go func() {
			defer wg.Done()
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
}
