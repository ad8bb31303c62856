// Package reference holds slow, obviously correct models of what the rest of
// pagedkv computes, for tests and fuzzers to compare against: a map-based
// page allocator and a [][]page page table (pages.go), and a float64 model of
// FlashInfer's attention over a paged cache (attention.go).
//
// The models favour being plainly right over being fast: state is kept in
// maps and plain slices, all-or-nothing operations work on a copy that is
// kept only if every step succeeds, and formulas are written token by token.
// They share no code with the packages they check (they import only the
// standard library and package layout), so a bug cannot hide in both.
//
// # Invariants
//
// Each model checks its own arguments and returns an error instead of
// entering a state the real implementation could not reach; a failed call
// changes nothing.
//
// # Concurrency
//
// Models are not safe for concurrent use. Package-level functions have no
// state and are safe for concurrent use.
//
// Nothing outside tests and the fuzz/ package may import this package.
package reference
