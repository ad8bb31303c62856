// Package heaptest measures what a piece of code allocates on the heap, for
// the tests that bound what hostile input may cost (standard library only).
//
// # Invariants
//
//   - Growth counts every byte allocated while f runs, freed or not
//     (TotalAlloc, not HeapAlloc), so a garbage collection during f cannot
//     hide an allocation; it also counts what other goroutines allocate
//     meanwhile, so a bound checked with it is an upper bound.
package heaptest

import "runtime"

// Growth returns the bytes the process allocated on the heap while f ran
// (runtime.MemStats.TotalAlloc after f less before).
func Growth(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
