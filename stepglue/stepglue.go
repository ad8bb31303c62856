// Package stepglue turns a [pagedkv.Plan] into the kernel calls that run its
// step: the device step of kernels/cuda ([cuda.StepPlan], one upload of the
// step's index arrays) and the CPU-memory calls of a [kernels.Backend] (decode,
// prefill, chunked prefill or cascade). It is the glue every Go engine would
// otherwise write again; internal/sim uses it.
//
// The destination structs are the caller's scratch: they are overwritten in
// place, their slices alias the Plan's arrays (valid until the next
// Reserve, as the Plan is), and nothing is allocated per step. A cascade
// plan's levels are the Plan's own ([kernels.CascadeLevel] is the one level
// type), so they are not copied.
//
// A [pagedkv.HybridPlan] is one Plan per group: build each group's step
// from hp.Groups[g] (after the pool-wide copies) and run it over the group's
// layers.
//
// Usage, per step and layer:
//
//	var dev cuda.StepPlan // or: var c stepglue.CPU, reused every step
//	plan, err := m.Reserve(ids, ntokens)
//	...
//	err = stepglue.Device(&dev, plan, geom, kernels.AttentionParams{NumQOHeads: hq})
//	err = step.Plan(&dev) // then step.Append and step.Attention per layer
//
//	err = stepglue.CPUStep(&c, plan, kernels.AttentionParams{NumQOHeads: hq})
//	// per layer:
//	err = c.AppendKV(backend, cache, k, v)
//	err = c.Attention(backend, cache, q, o) // cascade: q, o in Plan.Cascade.QueryRows order
//
// # Invariants
//
//   - [Check] runs first: a plan whose arrays disagree is refused
//     ([ErrBadPlan], naming the value) before dst is written.
//   - Nothing is copied or allocated: every array of dst is the Plan's own
//     (same start and length), cascade levels included.
//   - The attention's WindowLeft is always the plan's (the one given in the
//     AttentionParams is replaced), and a cascade runs every level with
//     the plan's CascadeWindowLeft.
//   - Every other field of the AttentionParams passes through unchanged,
//     Sinks (gpt-oss's attention sinks) included: a device step uploads
//     them with its plan, and a cascade, on the CPU or the device, gives them to its
//     last level only, so each row's sink is counted once.
//   - The kind follows from the plan alone ([pagedkv.Plan.AttentionKind],
//     the module's one decision, also behind the C ABI's
//     pagedkv_plan.attention_kind): Cascade when it has
//     a cascade layout, Chunked when it has Attn arrays, Decode when every
//     request has one row, Prefill otherwise; [Device] refuses only
//     Chunked ([ErrUnsupported]), [CPUStep] takes every kind.
//
// # Concurrency
//
// The functions are safe for concurrent use on distinct destinations; a
// CPU belongs to the goroutine running its step.
package stepglue

import (
	"errors"
	"fmt"

	"github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/appendkv"
	"github.com/pagedkv/pagedkv/cascade"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cuda"
	"github.com/pagedkv/pagedkv/layout"
)

// ErrBadPlan is wrapped when a Plan's arrays disagree with each other.
var ErrBadPlan = errors.New("stepglue: inconsistent plan")

// ErrUnsupported is wrapped when a Plan needs an attention the target
// cannot express (a chunked group's attention on a device step).
var ErrUnsupported = errors.New("stepglue: plan not supported by this target")

// KindOf returns the attention plan runs, [pagedkv.Plan.AttentionKind]
// (the module's one decision and enum, [kernels.AttentionKind]), after
// checking the plan.
func KindOf(plan *pagedkv.Plan) (kernels.AttentionKind, error) {
	if err := Check(plan); err != nil {
		return 0, err
	}
	return plan.AttentionKind(), nil
}

// Check reports, wrapping [ErrBadPlan] and naming the value, the first
// disagreement among plan's array lengths: the batch B = len(Requests) must
// match QOIndptr, KVIndptr, KVLastPageLen and SeqLens, the rows
// QOIndptr[B] must match BatchIndices, Positions and TokenIDs, KVIndptr[B]
// must fit KVPageIndices, the Attn arrays must agree with each other, and
// CascadeWindowLeft with the cascade's levels. Index values are checked by
// the kernels' own validator when the step runs.
func Check(plan *pagedkv.Plan) error {
	if plan == nil {
		return fmt.Errorf("%w: nil plan", ErrBadPlan)
	}
	b := len(plan.Requests)
	switch {
	case len(plan.QOIndptr) != b+1:
		return fmt.Errorf("%w: len(QOIndptr) = %d, want len(Requests)+1 = %d", ErrBadPlan, len(plan.QOIndptr), b+1)
	case len(plan.KVIndptr) != b+1:
		return fmt.Errorf("%w: len(KVIndptr) = %d, want len(Requests)+1 = %d", ErrBadPlan, len(plan.KVIndptr), b+1)
	case len(plan.KVLastPageLen) != b:
		return fmt.Errorf("%w: len(KVLastPageLen) = %d, want len(Requests) = %d", ErrBadPlan, len(plan.KVLastPageLen), b)
	case len(plan.SeqLens) != b:
		return fmt.Errorf("%w: len(SeqLens) = %d, want len(Requests) = %d", ErrBadPlan, len(plan.SeqLens), b)
	}
	rows := int(plan.QOIndptr[b])
	switch {
	case plan.QOIndptr[0] != 0 || rows < 0:
		return fmt.Errorf("%w: QOIndptr = %v does not run from 0 to a row count", ErrBadPlan, plan.QOIndptr)
	case len(plan.BatchIndices) != rows:
		return fmt.Errorf("%w: len(BatchIndices) = %d, want QOIndptr[%d] = %d", ErrBadPlan, len(plan.BatchIndices), b, rows)
	case len(plan.Positions) != rows:
		return fmt.Errorf("%w: len(Positions) = %d, want QOIndptr[%d] = %d", ErrBadPlan, len(plan.Positions), b, rows)
	case len(plan.TokenIDs) != rows:
		return fmt.Errorf("%w: len(TokenIDs) = %d, want QOIndptr[%d] = %d", ErrBadPlan, len(plan.TokenIDs), b, rows)
	case int(plan.KVIndptr[b]) > len(plan.KVPageIndices) || plan.KVIndptr[b] < 0:
		return fmt.Errorf("%w: KVIndptr[%d] = %d, but len(KVPageIndices) = %d", ErrBadPlan, b, plan.KVIndptr[b], len(plan.KVPageIndices))
	}
	if plan.AttnQOIndptr != nil {
		n := len(plan.AttnQOIndptr) - 1
		switch {
		case n < 0:
			return fmt.Errorf("%w: AttnQOIndptr is empty", ErrBadPlan)
		case len(plan.AttnKVIndptr) != n+1:
			return fmt.Errorf("%w: len(AttnKVIndptr) = %d, want len(AttnQOIndptr) = %d", ErrBadPlan, len(plan.AttnKVIndptr), n+1)
		case len(plan.AttnKVLastPageLen) != n:
			return fmt.Errorf("%w: len(AttnKVLastPageLen) = %d, want len(AttnQOIndptr)-1 = %d", ErrBadPlan, len(plan.AttnKVLastPageLen), n)
		case int(plan.AttnQOIndptr[n]) != rows:
			return fmt.Errorf("%w: AttnQOIndptr[%d] = %d, want the plan's rows QOIndptr[%d] = %d", ErrBadPlan, n, plan.AttnQOIndptr[n], b, rows)
		case int(plan.AttnKVIndptr[n]) > len(plan.AttnKVPageIndices) || plan.AttnKVIndptr[n] < 0:
			return fmt.Errorf("%w: AttnKVIndptr[%d] = %d, but len(AttnKVPageIndices) = %d", ErrBadPlan, n, plan.AttnKVIndptr[n], len(plan.AttnKVPageIndices))
		}
	}
	if plan.Cascade != nil {
		nl := len(plan.Cascade.Levels)
		switch {
		case nl == 0:
			return fmt.Errorf("%w: Cascade has no levels", ErrBadPlan)
		case plan.CascadeWindowLeft != nil && len(plan.CascadeWindowLeft) != nl:
			return fmt.Errorf("%w: len(CascadeWindowLeft) = %d, want len(Cascade.Levels) = %d", ErrBadPlan, len(plan.CascadeWindowLeft), nl)
		}
		for l, lv := range plan.Cascade.Levels {
			if n := len(lv.QOIndptr); n == 0 || int(lv.QOIndptr[n-1]) != rows {
				return fmt.Errorf("%w: Cascade.Levels[%d].QOIndptr = %v does not end at the plan's rows QOIndptr[%d] = %d", ErrBadPlan, l, lv.QOIndptr, b, rows)
			}
		}
	}
	return nil
}

// table is plan's page table after the append (its own arrays).
func table(plan *pagedkv.Plan) kernels.PageTable {
	return kernels.PageTable{KVIndptr: plan.KVIndptr, KVPageIndices: plan.KVPageIndices, KVLastPageLen: plan.KVLastPageLen}
}

// Device fills dst with plan's device step over caches of geometry geom:
// the append of the plan's rows at Table, and the attention (Decode,
// Prefill or Cascade; causal) with ap, whose WindowLeft is replaced by the
// plan's. A windowed cascade runs every level with the plan's WindowLeft,
// which is exact for the Manager's cascades (see Plan.CascadeWindowLeft).
// A chunked group's plan wraps [ErrUnsupported]: its attention table is not
// the append table, which one StepPlan cannot hold; run it with [CPUStep].
// dst's previous contents are overwritten; nothing is allocated.
func Device(dst *cuda.StepPlan, plan *pagedkv.Plan, geom layout.Paged, ap kernels.AttentionParams) error {
	if err := Check(plan); err != nil {
		return err
	}
	k := plan.AttentionKind()
	if k == kernels.Chunked {
		return fmt.Errorf("%w: a device step of a %s plan (AttnQOIndptr %v)", ErrUnsupported, k, plan.AttnQOIndptr)
	}
	ap.WindowLeft = plan.WindowLeft
	*dst = cuda.StepPlan{Geometry: geom,
		Table:        table(plan),
		BatchIndices: plan.BatchIndices, Positions: plan.Positions,
		Attention: k, Rows: len(plan.TokenIDs), QOIndptr: plan.QOIndptr, Causal: true, AttentionParams: ap}
	if k == kernels.Cascade {
		dst.Levels = plan.Cascade.Levels
	}
	return nil
}

// CPU is one step's calls of a [kernels.Backend] on CPU memory: the append table and the
// parameters of its one attention call. Only the member of Kind is set;
// [CPU.Attention] fills in the tensors per layer and makes the call.
type CPU struct {
	Kind kernels.AttentionKind
	// Table is the page table after the append, for the append (and for
	// decode and prefill attention).
	Table kernels.PageTable
	// Append is the step's append (the plan's own QOIndptr, SeqLens,
	// BatchIndices and Positions): [CPU.AppendKV] runs it with
	// [appendkv.Plan.Run], the module's one append runner.
	Append  appendkv.Plan
	Decode  kernels.DecodeParams  // Kind Decode
	Prefill kernels.PrefillParams // Kind Prefill and Chunked (over the Attn arrays)
	// Cascade is set for Kind Cascade: the Plan's levels with
	// CascadeWindowLeft per level (WindowLeft -1). Its queries and output
	// are in cascade row order: reorder with Plan.Cascade.QueryRows.
	Cascade cascade.Params

	cache          kernels.PagedKVCache // AppendKV's cache during the call
	kScale, vScale float64              // the cache's k_scale/v_scale (ap's), for AppendKV's quantising append
}

// CPUStep fills dst with plan's backend calls, with ap for the attention
// (ap.WindowLeft is replaced by the plan's). dst's previous contents are
// overwritten; nothing is allocated.
func CPUStep(dst *CPU, plan *pagedkv.Plan, ap kernels.AttentionParams) error {
	if err := Check(plan); err != nil {
		return err
	}
	ap.WindowLeft = plan.WindowLeft
	*dst = CPU{Kind: plan.AttentionKind(), Table: table(plan), kScale: ap.KScale, vScale: ap.VScale}
	dst.Append = appendkv.Plan{AppendIndptr: plan.QOIndptr, SeqLens: plan.SeqLens, BatchIndices: plan.BatchIndices, Positions: plan.Positions}
	switch dst.Kind {
	case kernels.Cascade:
		dst.Cascade = cascade.Params{Levels: plan.Cascade.Levels, Causal: true, AttentionParams: ap, LevelWindowLeft: plan.CascadeWindowLeft}
		dst.Cascade.WindowLeft = -1
	case kernels.Chunked:
		dst.Prefill = kernels.PrefillParams{QOIndptr: plan.AttnQOIndptr,
			Table:  kernels.PageTable{KVIndptr: plan.AttnKVIndptr, KVPageIndices: plan.AttnKVPageIndices, KVLastPageLen: plan.AttnKVLastPageLen},
			Causal: true, AttentionParams: ap}
	case kernels.Decode:
		dst.Decode = kernels.DecodeParams{Table: dst.Table, AttentionParams: ap}
	default:
		dst.Prefill = kernels.PrefillParams{QOIndptr: plan.QOIndptr, Table: dst.Table, Causal: true, AttentionParams: ap}
	}
	return nil
}

// AppendKV appends the step's K/V rows k and v ([rows, Hkv, D], in the
// plan's row order) to one layer's cache on backend b.
func (h *CPU) AppendKV(b kernels.Backend, cache kernels.PagedKVCache, k, v kernels.Tensor) error {
	// The cache goes through h (Run's Input holds a pointer, which would
	// move a parameter to the heap) and is dropped after the call.
	h.cache = cache
	err := h.Append.Run(b, appendkv.Input{AppendKey: k, AppendValue: v, Cache: &h.cache, Table: &h.Table, KScale: h.kScale, VScale: h.vScale})
	h.cache = kernels.PagedKVCache{}
	return err
}

// Attention runs h's attention on backend b over one layer's cache: q and
// o are [rows, Hq, D], in cascade row order for Kind Cascade.
func (h *CPU) Attention(b kernels.Backend, cache kernels.PagedKVCache, q, o kernels.Tensor) error {
	switch h.Kind {
	case kernels.Cascade:
		h.Cascade.Q, h.Cascade.Cache, h.Cascade.O = q, cache, o
		return cascade.Run(b, &h.Cascade)
	case kernels.Decode:
		h.Decode.Q, h.Decode.Cache, h.Decode.O = q, cache, o
		return b.BatchDecode(&h.Decode)
	case kernels.Prefill, kernels.Chunked:
		h.Prefill.Q, h.Prefill.Cache, h.Prefill.O = q, cache, o
		return b.BatchPrefill(&h.Prefill)
	}
	return fmt.Errorf("%w: CPU.Kind = %v; build it with CPUStep", ErrBadPlan, h.Kind)
}
