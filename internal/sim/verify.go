package sim

import (
	"errors"
	"fmt"
	"math"
	"slices"

	pagedkv "github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/internal/reference"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/quant"
)

// ErrVerify is wrapped by the error of a run whose output, or whose paged
// K/V, differs from the dense model.
var ErrVerify = errors.New("sim: verification failed")

// ErrCheck is wrapped when the Manager's plan or state disagrees with the
// simulator's own record of its requests (a token, a count, an array).
var ErrCheck = errors.New("sim: consistency check failed")

// verifier checks step outputs against the dense model: the K/V of a
// request rebuilt from its token ids alone (never read from the paged
// cache), and float64 attention over it (internal/reference).
type verifier struct {
	model *Model
	// specs [group]: each group's attention, which decides the dense keys
	// a query sees (one group for a dense model: full, or sliding
	// WindowTokens).
	specs      []pagedkv.LayerGroup
	atol, rtol float64   // |got - want| <= atol + rtol*|want|
	sinks      []float32 // the model's sink logits (nil: none), rebuilt from the model

	step int // the step being checked, for messages

	outputs  int64   // (row, head) outputs compared
	kvTokens int64   // tokens whose paged K/V (one layer, every head) were compared bit for bit
	maxErr   float64 // largest |got - want| seen
	drafts   int64   // of outputs, those of draft rows (speculative steps)

	groupOutputs []int64 // [group] outputs compared

	stateOutputs    int64 // of outputs, the recurrent layer's (state groups)
	restoredOutputs int64 // of stateOutputs, those of requests resumed from a state checkpoint

	mlaOutputs    int64 // of outputs, MLA groups'
	hitOutputs    int64 // of mlaOutputs, those of requests admitted on a prefix hit
	indexerTokens int64 // indexer entries (token, layer) read back bit for bit
	// of indexerTokens, those of positions a prefix hit served (their
	// pages came from the cache, a tier or a handoff)
	indexerHitTokens int64

	ctx                              []uint64
	q, kRow, vRow, wantK, wantV, got []float32
	codes, scales                    []byte // NVFP4 quantisation of one row
	keys, vals                       [][]float64
	flat                             []float64
}

func newVerifier(m *Model, specs []pagedkv.LayerGroup) *verifier {
	// Output rounding is one unit roundoff of the output dtype; the
	// float32 softmax adds far less than atol. A key or value of the wrong
	// token moves an output by about its weight, 1/seq_len, far more.
	u := map[layout.DType]float64{layout.F16: 0x1p-11, layout.BF16: 0x1p-8, layout.F32: 0x1p-24}[m.DType]
	d, hq, hkv := m.HeadDim, m.NumQOHeads, m.NumKVHeads
	return &verifier{
		model: m, specs: specs, groupOutputs: make([]int64, len(specs)), atol: 1e-4, rtol: 2 * u, sinks: m.SinkLogits(),
		q: make([]float32, hq*d), got: make([]float32, d),
		kRow: make([]float32, hkv*d), vRow: make([]float32, hkv*d), wantK: make([]float32, hkv*d), wantV: make([]float32, hkv*d),
		codes: make([]byte, d/2), scales: make([]byte, d/layout.NVFP4BlockSize),
	}
}

// kv writes the K and V rows the cache holds for the token with context
// hash ctx in layer: the model's rows, or for an NVFP4 cache their
// quantisation read back (e2m1 * block scale, without the global scale),
// which the kernels must have stored exactly.
func (v *verifier) kv(wantK, wantV []float32, ctx uint64, layer int) {
	m := v.model
	m.K(wantK, ctx, layer)
	m.V(wantV, ctx, layer)
	if m.CacheDType() != layout.NVFP4 {
		return
	}
	d, gs := m.HeadDim, float32(NVFP4GlobalScale)
	for _, row := range [][]float32{wantK, wantV} {
		for h := range m.NumKVHeads {
			r := row[h*d : (h+1)*d]
			quant.QuantizeNVFP4(v.codes, v.scales, r, gs)
			quant.DequantizeNVFP4(r, v.codes, v.scales)
		}
	}
}

// firstKey is the first key position a query at pos sees under spec's
// attention, written from the attention's definition (not from package
// layergroup, whose rules the Manager follows): sliding W reads the last W
// positions, chunked C the positions of pos's chunk so far, full and MLA
// every position.
func firstKey(spec pagedkv.LayerGroup, pos int) int {
	switch spec.Kind {
	case pagedkv.SlidingAttention:
		return max(0, pos-spec.WindowTokens+1)
	case pagedkv.ChunkedAttention:
		return pos - pos%spec.ChunkTokens
	}
	return 0
}

// check verifies sample s of the step that e just computed for layer
// s.layer of group s.group (plan is the group's): first every K/V row the
// request holds in that layer's cache, bit for bit, then the output of
// query row s.row, head s.head, against float64 attention over the dense
// K/V of the whole sequence, keys chosen by the group's attention.
func (v *verifier) check(e *engine, plan *pagedkv.Plan, reqs []*reqState, table *kernels.PageTable, s sample) error {
	m := v.model
	r := reqs[s.batch]
	d, hkv := m.HeadDim, m.NumKVHeads
	pos := int(plan.TokenPositions[s.row])
	start := pos - int(plan.Positions[s.row]) // first token the request's pages hold
	held := int(plan.SeqLens[s.batch])
	end := start + held // tokens with K/V after this step's appends
	if end > len(r.tokens) {
		return fmt.Errorf("%w: request %s holds %d tokens from %d, but has only %d", ErrCheck, r.name(), held, start, len(r.tokens))
	}
	v.ctx = m.Contexts(v.ctx[:0], r.ns, r.tokens[:end])

	// The paged K/V of every held token equals the model's.
	cache := &e.caches[s.layer/len(v.specs)]
	wantK, wantV := v.wantK, v.wantV
	for t := start; t < end; t++ {
		if err := cache.GatherToken(v.kRow, v.vRow, table, s.batch, t-start); err != nil {
			return fmt.Errorf("%w: request %s token %d: %w", ErrCheck, r.name(), t, err)
		}
		v.kv(wantK, wantV, v.ctx[t], s.layer)
		for i := range wantK {
			if v.kRow[i] != wantK[i] || v.vRow[i] != wantV[i] {
				kv, got, want := "K", v.kRow[i], wantK[i]
				if v.kRow[i] == wantK[i] {
					kv, got, want = "V", v.vRow[i], wantV[i]
				}
				return fmt.Errorf("%w at step %d: request %s, layer %d%s: paged %s of token %d (position %d, kv head %d, feature %d) is %v, the dense model has %v",
					ErrVerify, v.step, r.name(), s.layer, v.groupTag(s.group), kv, r.tokens[t], t, i/d, i%d, got, want)
			}
		}
	}
	v.kvTokens += int64(end - start)

	// Float64 attention of the query over the dense keys it may see.
	lo := firstKey(v.specs[s.group], pos)
	n := pos + 1 - lo
	kvh := s.head / (m.NumQOHeads / hkv)
	v.flat = slices.Grow(v.flat[:0], 2*n*d)[:2*n*d]
	v.keys, v.vals = v.keys[:0], v.vals[:0]
	gs := 1.0 // the global scale: an NVFP4 cache holds K/V divided by it
	if m.CacheDType() == layout.NVFP4 {
		gs = float64(float32(NVFP4GlobalScale))
	}
	for j := lo; j <= pos; j++ {
		v.kv(wantK, wantV, v.ctx[j], s.layer)
		kr, vr := v.flat[2*(j-lo)*d:][:d], v.flat[(2*(j-lo)+1)*d:][:d]
		for f := range d {
			kr[f], vr[f] = float64(wantK[kvh*d+f])*gs, float64(wantV[kvh*d+f])*gs
		}
		v.keys, v.vals = append(v.keys, kr), append(v.vals, vr)
	}
	m.Q(v.q, v.ctx[pos], s.layer)
	q := make([]float64, d)
	for f := range d {
		q[f] = float64(v.q[s.head*d+f])
	}
	visible := make([]bool, n)
	for j := range visible {
		visible[j] = true
	}
	sink := math.Inf(-1)
	if v.sinks != nil {
		sink = float64(v.sinks[s.head])
	}
	want, _ := reference.AttendSink(q, v.keys, v.vals, visible, 1/math.Sqrt(float64(d)), 0, d, sink)

	es := m.DType.Size()
	layout.LoadRowF32(v.got, m.DType, e.o.Data[(s.row*m.NumQOHeads+s.head)*d*es:])
	if at, worst := v.compare(v.got, want); at >= 0 {
		return fmt.Errorf("%w at step %d: request %s, layer %d%s, head %d, query at position %d over %d keys: feature %d is %.6g, dense float64 attention gives %.6g (|diff| %.3g > %.3g + %.3g*|want|)",
			ErrVerify, v.step, r.name(), s.layer, v.groupTag(s.group), s.head, pos, n, at, v.got[at], want[at], worst, v.atol, v.rtol)
	}
	v.outputs++
	v.groupOutputs[s.group]++
	if s.row >= int(plan.QOIndptr[s.batch+1]-plan.Drafts[s.batch]) {
		v.drafts++
	}
	return nil
}

// compare checks an output row got against want within the tolerance; it
// returns the worst feature out of it (-1: none) and its |diff|, and keeps
// maxErr.
func (v *verifier) compare(got []float32, want []float64) (at int, worst float64) {
	at = -1
	for f := range want {
		diff := math.Abs(float64(got[f]) - want[f])
		// Written so that NaN fails: diff > tol is false for a NaN diff,
		// !(diff <= tol) is true. A NaN or infinite output, or a
		// non-finite expected value, is ranked worst.
		if !(diff <= v.atol+v.rtol*math.Abs(want[f])) {
			rank := diff
			if math.IsNaN(rank) {
				rank = math.Inf(1)
			}
			if at < 0 || rank > worst {
				worst, at = rank, f
			}
		}
		if math.IsNaN(diff) {
			diff = math.Inf(1)
		}
		v.maxErr = max(v.maxErr, diff)
	}
	return at, worst
}

// groupTag names group g's attention in messages of a hybrid model (" (sliding
// 128)"); empty for a dense model.
func (v *verifier) groupTag(g int) string {
	if len(v.specs) < 2 {
		return ""
	}
	return " (" + groupString(v.specs[g]) + ")"
}
