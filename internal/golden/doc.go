// Package golden checks pagedkv against FlashInfer's semantics with reference
// cases in the format of testdata/golden/FORMAT.md (pagedkv-golden/1): one
// safetensors file per case holding the inputs of one operation (in.*), its
// scalar parameters (__metadata__) and the expected outputs (out.*).
//
// [Load] reads a case, [Find] lists the cases under directories, and
// [Runner.Run] runs a case's operation on a [kernels.Backend] (or on the
// host-side function for the page-table, bit-packing and mask operations)
// and compares every expected output: floats elementwise within
// |got - want| <= atol + rtol*|want| (the case's atol/rtol), integers, bytes
// and paged caches after an append exactly. A [Result] says pass or fail,
// the largest absolute and relative errors and where the worst element is.
// docs/golden.md explains how to produce and verify references.
//
// # Invariants
//
//   - A case is checked completely or it fails: an unknown op, a tensor or
//     parameter the op does not define, a missing output, a shape or dtype
//     that disagrees with the expectation, and a backend error are all
//     failures, never skips. (Extra knowledge is never silently ignored: a
//     parameter we do not implement would change FlashInfer's result.)
//   - Running a case never modifies the case: inputs are copied before an
//     operation writes into them.
//   - When the backend reports [kernels.ErrUnsupported] and the runner has a
//     Fallback backend, the case is rerun on the fallback from fresh inputs
//     and its Result says so; without a fallback it fails as unsupported.
//
// # Concurrency
//
// A Case is read-only after Load and may be shared. A Runner may run cases
// from several goroutines at once if its backends allow concurrent calls
// (kernels/cpu does).
package golden
