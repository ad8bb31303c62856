// Package heaptest measures what a piece of code allocates on the heap, for
// the tests that bound what hostile input may cost (standard library only).
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
