package fuzz

import (
	"testing"

	"github.com/pagedkv/pagedkv/kernels/cpu"
)

// specOps are the commands of FuzzSpecEngine: FuzzEngine's harness with
// the commands a speculative-decoding engine issues most, so the fuzzer
// spends its time on draft rollback (arguments as in engineOps).
var specOps = OpSet{"spec", "spec", "add", "fork", "truncate", "step", "preempt", "resume", "evict", "release"}

// FuzzSpecEngine drives the Manager through speculative steps
// (ReserveSpec/CommitSpec with random drafts and accept counts, some
// aborted), forks that share a partial page between branches, truncations
// into shared and cached pages, preemption and eviction, with real K/V
// storage, against reference.ManagerModel (whose CommitSpec is by
// definition the plain step of the accepted tokens). Checks as FuzzEngine:
// Audit, the model's errors, tokens, pages and Stats, and every kept
// token's K/V read back through the request's pages.
func FuzzSpecEngine(f *testing.F) {
	ops := specOps
	for _, s := range []struct {
		g    engineGeom
		prog []byte
	}{
		{engineGeom{0, 3, 14, 0}, ops.Prog("add", 0, 9, 0, "step", 0, 9, 0, "spec", 0, 1, 0, "spec", 0, 1, 1)},
		// Fork, both branches speculating on the shared partial page, one
		// re-verifying from drafts alone after a truncation.
		{engineGeom{0x00, 3, 20, 1}, ops.Prog("add", 0, 9, 0, "step", 0, 9, 0, "fork", 0, 0, 0, "spec", 0, 1, 1,
			"truncate", 1, 1, 0, "spec", 0, 0, 1, "spec", 0, 0, 1)},
		// Sliding window, small pool: drafts force eviction and preemption.
		{engineGeom{0x20, 1, 6, 2}, ops.Prog("add", 0, 7, 0, "step", 0, 7, 0, "add", 1, 7, 0, "spec", 0, 2, 1,
			"spec", 0, 2, 1, "preempt", 0, 0, 0, "resume", 0, 0, 0, "spec", 1, 3, 0x41)},
	} {
		f.Add(s.g.Flags, s.g.PageSize, s.g.NumPagesArg, s.g.Shape, s.prog)
	}
	backend := cpu.New(cpu.Config{Workers: 1})
	f.Fuzz(func(t *testing.T, flags, pageSize, numPages, shape uint8, prog []byte) {
		h := newEngineHarness(t, backend, engineGeom{flags, pageSize, numPages, shape})
		h.prog = Decode(nil, prog, len(specOps))
		if len(h.prog) > maxCmds {
			h.prog = h.prog[:maxCmds]
		}
		for i := range h.prog {
			h.prog[i].Op = engineOps.Op(specOps[h.prog[i].Op])
		}
		h.runProgram()
	})
}
