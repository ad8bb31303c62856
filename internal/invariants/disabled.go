//go:build !(invariants || race)

// This file must be kept in sync with enabled.go.

package invariants

// Enabled reports whether invariant checks run after each mutation. It is true
// in builds with the invariants tag or the race detector.
const Enabled = false
