// Package invariants switches expensive self-checks on and off at build time.
//
// [Enabled] is true when the binary is built with the invariants build tag or
// with the race detector (-race), and false otherwise. Stateful types test it
// after each mutating call and, when it is set, check the part of their state
// that the call touched, so that a broken invariant is reported at the call
// that broke it instead of steps later:
//
//	if invariants.Enabled {
//		a.checkTouched(pages)
//	}
//
// Because Enabled is a constant, the check and everything it calls is removed
// by the compiler from ordinary builds.
//
// [NoCopy] marks a struct that must not be copied, for go vet's copylocks
// check.
//
// # Invariants
//
// Exactly one of enabled.go and disabled.go is compiled, so Enabled always
// has one value per build.
//
// # Concurrency
//
// The package has no state; it is safe for concurrent use.
//
// It imports nothing.
package invariants
