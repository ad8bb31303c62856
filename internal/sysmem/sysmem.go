// Package sysmem tells how much physical memory this machine has, so that a
// pool asked for more memory than the machine can ever give refuses the
// configuration by name instead of being killed by the kernel's OOM killer
// halfway through initialising its bookkeeping.
//
// # Invariants
//
//   - [Check] refuses exactly the sizes above the limit (the machine's
//     physical memory when the limit is 0), with an error that wraps
//     [ErrTooLarge] and names what, the bytes needed and the limit; where
//     the platform gives no figure and the limit is 0 it refuses nothing.
//   - [MulAdd] never wraps: a size computed from untrusted counts saturates
//     at the largest int64, which every limit then refuses.
//
// # Concurrency
//
// Every function is safe for concurrent use.
package sysmem

import (
	"errors"
	"fmt"
)

// ErrTooLarge reports a request for more memory than the limit.
var ErrTooLarge = errors.New("sysmem: more memory than the limit")

// Physical returns the machine's physical memory in bytes, and false where
// the platform gives no figure (then callers apply no limit of their own).
func Physical() (int64, bool) { return physical() }

// Check returns nil if need bytes fit limit, or, with limit 0, the
// machine's physical memory (no check where that is unknown). The error
// wraps ErrTooLarge and names what, need and the limit.
func Check(what string, need, limit int64) error {
	source := "MemoryLimit"
	if limit == 0 {
		p, ok := Physical()
		if !ok {
			return nil
		}
		limit, source = p, "this machine's physical memory"
	}
	if need > limit {
		return fmt.Errorf("%w: %s needs %d bytes, more than %s (%d bytes)", ErrTooLarge, what, need, source, limit)
	}
	return nil
}

// MulAdd returns a*b + c, saturating at the largest int64 instead of
// wrapping (a, b, c >= 0), for sizes computed from untrusted counts.
func MulAdd(a, b, c int64) int64 {
	const maxInt64 = int64(^uint64(0) >> 1)
	if a != 0 && b > (maxInt64-c)/a {
		return maxInt64
	}
	return a*b + c
}
