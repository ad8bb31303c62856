package fuzz

import "errors"

// errorPair pairs a real package's sentinel error with the reference
// model's sentinel for the same condition.
type errorPair struct{ real, model error }

// matchErrors is the error check every model-based target makes after an
// operation: real and model must both succeed, or both fail with errors of
// the same class (errors.Is agrees on every pair of classes); otherwise it
// calls fatalf. It counts failures in seen ("out of pages" for errors that
// wrap outOfPages, "other error" otherwise), so a target can assert that its
// workloads reach them, and reports whether the operation succeeded.
func matchErrors(fatalf func(string, ...any), seen map[string]int, classes []errorPair, outOfPages error, what string, real, model error) bool {
	same := (real == nil) == (model == nil)
	for _, c := range classes {
		same = same && errors.Is(real, c.real) == errors.Is(model, c.model)
	}
	if !same {
		fatalf("%s: real error %v, model error %v", what, real, model)
	}
	switch {
	case real == nil:
	case errors.Is(real, outOfPages):
		seen["out of pages"]++
	default:
		seen["other error"]++
	}
	return real == nil
}

// pickLive returns the live ID a selects, or an unknown ID (1<<40) for
// a == 255 or no live IDs: the harnesses' way to aim a call at a
// sequence or request.
func pickLive[ID ~uint64](live []ID, a uint8) ID {
	if len(live) == 0 || a == 255 {
		return 1 << 40
	}
	return live[int(a)%len(live)]
}
