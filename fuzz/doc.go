// Package fuzz holds the cross-package, model-based fuzz targets of pagedkv:
// targets whose state spans several packages (allocator, page table, prefix
// cache, append planning, the CPU backend, the Manager), so they belong to
// none of them. Package-local targets stay beside the code they check; see
// docs/fuzzing.md for the list of every target in the module and the
// invariant each one checks.
//
// # Programs
//
// Every target reads its input as a program: a short header of geometry
// arguments, then a byte string decoded by [Decode] into fixed-size
// commands ([Cmd], [CmdSize] bytes each: an op code and three argument
// bytes). Op codes are read modulo [OpSpace]; codes a target does not know
// are skipped, and a trailing partial command is ignored, so every byte
// string is a valid program and the fuzzer's mutations stay meaningful. The
// targets run each command on the real packages and on a slow model
// (internal/reference, or a dense per-request model written out in the
// test) and check, after every command, the invariants of every package
// involved (CheckInvariants / Audit) and the agreement with the model.
//
// # Invariants
//
//   - [Decode] and [Encode] are inverse on programs of known commands:
//     Decode(Encode(p), n) == p whenever every op code in p is below n, and
//     Encode(Decode(b, n)) is the canonical form of b (its known commands).
//   - The fuzz targets change no shared state: each run builds its own pool,
//     tables and caches.
//
// Crashers found by go test -fuzz are fixed and committed, renamed after
// what they exercise, under testdata/fuzz/<Target>/, so the plain go test
// run replays them.
//
// # Concurrency
//
// Decode, Encode and [OpSet.Format] have no state and are safe for
// concurrent use. Nothing imports this package; its targets run under
// go test.
package fuzz
