package sim

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"

	pagedkv "github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/layout"
)

// The simulator's recurrent layer: what a state group's layers (Mamba-2,
// Gated DeltaNet) compute, reduced to a tiny deterministic recurrence that
// keeps the property a prefix checkpoint depends on: a token's output is a
// function of the state, and the state of every token before it.
//
// Each layer of a state group keeps stateFloats float32 values per request
// in the request's state slot: page StateIndices[b] of the layer's cache
// tensor, at the start of the page's K data (the page an engine would view
// as conv state then recurrent state). For each token, in position order,
//
//	s[i] = a*s[i] + x[i]   (x: the first stateFloats values of Model.V for the token)
//	y    = sum_i s[i]*q[i] (q: the first stateFloats values of Model.Q), in order i = 0..
//
// every operation rounded to float32 (explicit conversions keep the
// compiler from fusing them), so the same tokens give the same bits. A
// step whose request starts at position 0 starts from a zero state
// (has_initial_state false); otherwise it reads the slot, as an engine's
// kernel does. The verifier recomputes y from token 0 and compares bits.
const (
	stateFloats = 8
	stateDecay  = float32(0.75)
)

// stateBytes is the bytes of a recurrent layer's state in a page.
const stateBytes = 4 * stateFloats

// recur advances state s by the token whose model values are x and
// returns its output for queries q.
func recur(s, x, q []float32) float32 {
	for i := range stateFloats {
		s[i] = float32(stateDecay*s[i]) + x[i]
	}
	var y float32
	for i := range stateFloats {
		y = y + float32(s[i]*q[i])
	}
	return y
}

// validateStateModel checks that the model's cache pages can hold the
// recurrent layer's state where the engine keeps it: the first K row of a
// page (one head's HeadDim values), in a dtype stored whole.
func (c *Config) validateStateModel() error {
	g := layout.Paged{Layout: c.KVLayout, Form: layout.Fused, DType: c.Model.CacheDType(), HeadDim: c.Model.HeadDim}
	switch {
	case c.Model.CacheDType() == layout.NVFP4:
		return fmt.Errorf("%w: kv dtype nvfp4 with state groups: the simulator's recurrent layer keeps float32 states in the cache pages", ErrBadConfig)
	case g.RowBytes() < stateBytes:
		return fmt.Errorf("%w: head dim %d of %v with state groups: the recurrent layer's %d-byte state lives in a page's first K row of %d bytes; want head dim x dtype bytes >= %d",
			ErrBadConfig, c.Model.HeadDim, c.Model.CacheDType(), stateBytes, g.RowBytes(), stateBytes)
	case c.SpecTokens > 0:
		return fmt.Errorf("%w: spec tokens %d with state groups: a recurrent state cannot roll back rejected drafts", ErrBadConfig, c.SpecTokens)
	}
	return nil
}

// stateSlot is the bytes of page p's state in cache tensor j.
func (e *engine) stateSlot(j int, p int32) []byte {
	off := e.geom.DataOffset(e.geom.KOffset(int(p), 0, 0, 0))
	return e.caches[j].KBuf()[off : off+stateBytes]
}

// runState executes state group g's plan (the copies done) over the
// group's layers: each request's rows advance the state in its slot, and
// samples of the group are verified after the layer that computes them.
func (e *engine) runState(g int, plan *pagedkv.Plan, reqs []*reqState, samples []sample, v *verifier, st *stepTimes) error {
	if len(plan.StateIndices) != len(plan.Requests) {
		return fmt.Errorf("%w: state plan with %d state_indices for %d requests", ErrCheck, len(plan.StateIndices), len(plan.Requests))
	}
	nnz := len(plan.TokenIDs)
	e.ctx = e.ctx[:0]
	for b := range plan.Requests {
		r := reqs[b]
		for i := plan.QOIndptr[b]; i < plan.QOIndptr[b+1]; i++ {
			pos := int(plan.TokenPositions[i])
			if pos >= len(r.tokens) || r.tokens[pos] != plan.TokenIDs[i] {
				return fmt.Errorf("%w: state plan row %d: request %s has token %d at position %d, the simulator has %v",
					ErrCheck, i, r.name(), plan.TokenIDs[i], pos, tokenAt(r.tokens, pos))
			}
			e.ctx = append(e.ctx, r.ctx[pos])
		}
	}
	if len(e.ctx) != nnz {
		return fmt.Errorf("%w: state plan with %d rows, qo_indptr covers %d", ErrCheck, nnz, len(e.ctx))
	}
	if cap(e.stateOut) < nnz {
		e.stateOut = make([]float32, nnz, nnz+nnz/2)
	}
	e.stateOut = e.stateOut[:nnz]
	m := &e.model
	groups := m.Layers / len(e.caches)
	var s [stateFloats]float32
	for j := range e.caches {
		l := j*groups + g
		t := time.Now()
		for b := range plan.Requests {
			lo, hi := int(plan.QOIndptr[b]), int(plan.QOIndptr[b+1])
			if lo == hi {
				continue
			}
			slot := e.stateSlot(j, plan.StateIndices[b])
			s = [stateFloats]float32{}
			if plan.TokenPositions[lo] > 0 {
				for i := range s {
					s[i] = math.Float32frombits(binary.LittleEndian.Uint32(slot[4*i:]))
				}
			}
			for i := lo; i < hi; i++ {
				m.V(e.rows[:m.NumKVHeads*m.HeadDim], e.ctx[i], l)
				copy(e.xRow[:], e.rows[:stateFloats])
				m.Q(e.rows[:m.NumQOHeads*m.HeadDim], e.ctx[i], l)
				e.stateOut[i] = recur(s[:], e.xRow[:], e.rows[:stateFloats])
			}
			for i := range s {
				binary.LittleEndian.PutUint32(slot[4*i:], math.Float32bits(s[i]))
			}
		}
		t1 := time.Now()
		st.model += t1.Sub(t)
		for _, smp := range samples {
			if smp.group != g || smp.layer != l {
				continue
			}
			if err := v.checkState(e, plan, reqs, smp); err != nil {
				return err
			}
		}
		st.verify += time.Since(t1)
	}
	return nil
}

// checkState verifies sample s of state group s.group: the recurrent
// layer's output at query row s.row, recomputed from token 0 of the
// request, must equal the engine's bit for bit (the engine resumed from
// the slot the plan named, after the plan's copies).
func (v *verifier) checkState(e *engine, plan *pagedkv.Plan, reqs []*reqState, s sample) error {
	m := v.model
	r := reqs[s.batch]
	pos := int(plan.TokenPositions[s.row])
	v.ctx = m.Contexts(v.ctx[:0], r.ns, r.tokens[:pos+1])
	var st [stateFloats]float32
	var x [stateFloats]float32
	var want float32
	for t := 0; t <= pos; t++ {
		m.V(v.kRow, v.ctx[t], s.layer)
		copy(x[:], v.kRow[:stateFloats])
		m.Q(v.q, v.ctx[t], s.layer)
		want = recur(st[:], x[:], v.q[:stateFloats])
	}
	got := e.stateOut[s.row]
	if math.Float32bits(got) != math.Float32bits(want) {
		restored := ""
		if r.restored > 0 {
			restored = fmt.Sprintf(", resumed from a state checkpoint at %d tokens", r.restored)
		}
		return fmt.Errorf("%w at step %d: request %s, layer %d%s: recurrent output at position %d is %v, recomputing from token 0 gives %v%s",
			ErrVerify, v.step, r.name(), s.layer, v.groupTag(s.group), pos, got, want, restored)
	}
	v.outputs++
	v.groupOutputs[s.group]++
	v.stateOutputs++
	if r.restored > 0 {
		v.restoredOutputs++
	}
	return nil
}
