// Package kernelstest is the conformance suite every [kernels.Backend] runs:
// exported functions TestAppend, TestMLAAppend, TestDecode, TestPrefill,
// TestMLADecode, TestMergeState, TestMergeStates and TestHostileIndices, each
// taking (t, b), that
// a backend's own tests call with an instance of the backend. The suites run
// FlashInfer's worked examples, build random batches and caches, run the
// backend, and compare the result with the slow models of
// internal/reference, which share no code with the backends. The append
// fixtures (NewAppendFixture, CheckAppend, CacheDiff and their MLA twins)
// are exported for fuzzers and benchmarks too, as is CheckRawIndices, the
// canary check every backend's raw-array fuzz target runs (DecodeRaw turns
// fuzz bytes into arrays of any length holding any int32).
//
// A backend may decline a combination (dtype, head_dim, ...) by returning an
// error that wraps [kernels.ErrUnsupported]; the suites then log the skipped
// combination with t.Log and go on. Any other error, or a declined call that
// should have been rejected as invalid, fails the test.
//
// # Invariants
//
//   - Every random case is compared with the reference model, never with
//     the backend under test; only the property tests (a window equals
//     truncating the cache, a huge soft cap equals none) compare the backend
//     with itself on inputs whose results must agree.
//   - Failures describe the first differing elements, not "mismatch": caches
//     by (K/V, page, entry, head, feature), attention outputs by (row, head,
//     feature).
//   - In the attention suites, cache slots that hold no token of the batch
//     are NaN, so a read past a request's length fails loudly.
//   - Invalid parameters must fail with the documented sentinel and leave
//     every output byte unchanged.
//   - Random inputs come from seeded generators, so a failure reproduces.
//
// # Concurrency
//
// The suite functions call t.Run and must be called from the test goroutine;
// they do not use t.Parallel, so a backend needs no internal locking for
// them.
package kernelstest
