// Package reference holds slow, obviously correct models of what the rest of
// pagedkv computes, for tests and fuzzers to compare against:
//
//   - pages.go: a map-based page allocator ([PageAllocModel]), a [][]page
//     page table ([PageTableModel]) and slow CSR checks and conversions;
//   - manager.go: the root package's Manager together with the prefix cache
//     it drives ([ManagerModel]): admission and prefix matching, steps with
//     copy-on-write, preemption, pins, eviction and the Stats counters;
//   - manager_spec.go: speculative steps (CommitSpec defined as the plain
//     step of the accepted tokens) and Truncate;
//   - hybrid.go: a hybrid model's layer groups ([HybridModel]): one
//     ManagerModel per group with the group's rule (full, sliding window,
//     chunked, MLA) and admission on the prefix every group serves;
//   - storage.go: where an element of a paged cache lives, what an append
//     writes (GQA and MLA) and how a float rounds into a narrow dtype;
//   - attention.go: a float64 model of FlashInfer's attention over a paged
//     cache (batch decode and prefill, MLA decode, merge of states, cascade).
//
// The models favour being plainly right over being fast: state is kept in
// maps and plain slices, formulas are written token by token, and every
// all-or-nothing operation either works on a copy that is kept only if
// every step succeeds ([PageTableModel.Reserve]) or checks every argument
// before its first change. They share no code with the packages they check
// (they import only the standard library and package layout), so a bug
// cannot hide in both.
//
// # Invariants
//
// Each stateful model checks its own arguments and returns an error instead
// of entering a state the real implementation could not reach; a failed
// call changes nothing. The stateless functions (attention, storage) take
// well-formed inputs from their tests and panic on a shape or dtype they do
// not model.
//
// # Concurrency
//
// Models are not safe for concurrent use. Package-level functions have no
// state and are safe for concurrent use.
//
// Only test code may import this package: tests, the fuzz/ package, the
// backend conformance suites in kernels/kernelstest and the simulator's
// dense verifier in internal/sim. Library code must not.
package reference
