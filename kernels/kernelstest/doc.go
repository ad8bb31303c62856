// Package kernelstest is the conformance suite every [kernels.Backend] runs:
// exported functions such as TestAppend(t, b) and TestMLAAppend(t, b) that a
// backend's own tests call with an instance of the backend. The suites build
// random batches and caches, run the backend, and compare the result with the
// slow models of internal/reference, which share no code with the backends.
//
// A backend may decline a combination (dtype, head_dim, ...) by returning an
// error that wraps [kernels.ErrUnsupported]; the suites then log the skipped
// combination with t.Log and go on. Any other error, or a declined call that
// should have been rejected as invalid, fails the test.
//
// # Invariants
//
//   - Every check compares with the reference model, never with the backend
//     under test, and failures describe the first differing elements by
//     (K/V, page, entry, head, feature), not as "mismatch".
//   - Random inputs come from seeded generators, so a failure reproduces.
//
// # Concurrency
//
// The suite functions call t.Run and must be called from the test goroutine;
// they do not use t.Parallel, so a backend needs no internal locking for
// them.
package kernelstest
