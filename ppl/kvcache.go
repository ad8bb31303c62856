package ppl

import (
	"fmt"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// maxInlineDh is the largest head dim whose row scratch lives on the stack;
// larger rows allocate once per call.
const maxInlineDh = 512

// KeyValueCacheParams are the inputs and outputs of one
// dynamic_batching.KeyValueCache call (one layer, a batch of B requests).
//
// Request b brings seqlen_b = SeqStarts[b+1]-SeqStarts[b] new tokens, rows
// SeqStarts[b]:SeqStarts[b+1] of CurrentKey/CurrentValue, which are stored at
// positions StartPos[b] .. StartPos[b]+seqlen_b-1 of its sequence. Its packed
// outputs are its kv_len_b = KVStarts[b+1]-KVStarts[b] keys and values,
// positions 0..kv_len_b-1 (the past ones and the new ones), so kv_len_b must
// equal StartPos[b] + seqlen_b. The scalars max_seqlen and max_kvlen of the
// PPL operator are derived from the starts and not taken.
type KeyValueCacheParams struct {
	CurrentKey, CurrentValue kernels.Tensor // [SeqStarts[B], H, Dh]: f32, f16 or bf16
	SeqStarts                []int64        // [B+1], SeqStarts[0] == 0, non-decreasing
	StartPos                 []int64        // [B], >= 0
	Addressing                              // KVStarts [B+1], CacheStarts, MaxPages
	LayerIdx                 int            // layer_idx in [0, num_layer)
	// Key and Value are the outputs [KVStarts[B], H*NumRepeat, Dh] (f32, f16
	// or bf16): row KVStarts[b]+p, head j holds cache head j/NumRepeat of
	// position p of request b, dequantised.
	Key, Value kernels.Tensor
}

// KeyValueCache runs PPL's dynamic_batching.KeyValueCache on the CPU: it
// writes the current keys and values into c at their slots (rounded to the
// cache dtype, or group-quantised with new scales), then gathers every
// request's keys and values, dequantised and with each head repeated
// NumRepeat times, into the packed outputs. All writes happen before all
// reads, as in PPL's two kernels, so a request reads the tokens it just
// stored. When the input (or output) dtype equals an unquantised cache's
// dtype the copy is bit-exact.
//
// Everything is validated before anything is written; on error neither c
// nor the outputs change. Two requests whose slots overlap are not an error:
// the later request's values win. KeyValueCache runs on the calling
// goroutine and does not allocate for head dims up to 512.
func KeyValueCache(c *Cache, p *KeyValueCacheParams) error {
	if err := validateKeyValueCache(c, p); err != nil {
		return err
	}
	g := &c.Geometry
	var stack [maxInlineDh]float32
	var stackBytes [4 * maxInlineDh]byte
	buf, bbuf := stack[:0], stackBytes[:0]
	if g.HeadDim > maxInlineDh {
		buf, bbuf = make([]float32, 0, g.HeadDim), make([]byte, 0, 4*g.HeadDim)
	}
	buf = buf[:g.HeadDim]

	B := len(p.StartPos)
	for b := 0; b < B; b++ {
		for row := p.SeqStarts[b]; row < p.SeqStarts[b+1]; row++ {
			slot := int(g.Slot(&p.Addressing, b, p.StartPos[b]+row-p.SeqStarts[b]))
			for h := 0; h < g.NumKVHeads; h++ {
				c.storeInput(&p.CurrentKey, int(row), h, p.LayerIdx, 0, slot, buf)
				c.storeInput(&p.CurrentValue, int(row), h, p.LayerIdx, 1, slot, buf)
			}
		}
	}
	for b := 0; b < B; b++ {
		for pos := int64(0); pos < p.KVLen(b); pos++ {
			slot := int(g.Slot(&p.Addressing, b, pos))
			row := int(p.KVStarts[b] + pos)
			for h := 0; h < g.NumKVHeads; h++ {
				c.loadOutput(&p.Key, row, h, p.LayerIdx, 0, slot, buf, bbuf)
				c.loadOutput(&p.Value, row, h, p.LayerIdx, 1, slot, buf, bbuf)
			}
		}
	}
	return nil
}

// storeInput writes head h of row of t ([rows, H, Dh]) into cache row
// (layer, kv, slot, h), through buf unless it can copy bytes.
func (c *Cache) storeInput(t *kernels.Tensor, row, h, layer, kv, slot int, buf []float32) {
	g := &c.Geometry
	es := t.DType.Size()
	off := ((row*g.NumKVHeads + h) * g.HeadDim) * es
	src := t.Data[off : off+g.HeadDim*es]
	if !g.Quantised() && t.DType == g.DType {
		copy(c.rowBytes(layer, kv, slot, h), src)
		return
	}
	layout.LoadRowF32(buf, t.DType, src)
	c.StoreRow(layer, kv, slot, h, buf)
}

// loadOutput writes cache row (layer, kv, slot, h) into the NumRepeat output
// heads h*R .. h*R+R-1 of row of out ([rows, H*R, Dh]).
func (c *Cache) loadOutput(out *kernels.Tensor, row, h, layer, kv, slot int, buf []float32, bbuf []byte) {
	g := &c.Geometry
	es := out.DType.Size()
	n := g.HeadDim * es
	var src []byte
	if !g.Quantised() && out.DType == g.DType {
		src = c.rowBytes(layer, kv, slot, h)
	} else {
		c.LoadRow(buf, layer, kv, slot, h)
		src = bbuf[:n]
		layout.StoreRowF32(src, out.DType, buf)
	}
	R := g.NumRepeat
	off := ((row*g.NumKVHeads + h) * R * g.HeadDim) * es
	for r := 0; r < R; r++ {
		copy(out.Data[off+r*n:off+(r+1)*n], src)
	}
}

// validateKeyValueCache checks every input against c's geometry.
func validateKeyValueCache(c *Cache, p *KeyValueCacheParams) error {
	if err := c.Validate(); err != nil {
		return err
	}
	g := &c.Geometry
	if p.LayerIdx < 0 || p.LayerIdx >= g.NumLayers {
		return fmt.Errorf("%w: layer_idx %d outside [0, num_layer %d)", ErrOutOfRange, p.LayerIdx, g.NumLayers)
	}
	B := len(p.StartPos)
	if err := validateStarts("seqstarts", p.SeqStarts, B); err != nil {
		return err
	}
	if err := g.ValidateAddressing(&p.Addressing, B); err != nil {
		return err
	}
	for b := 0; b < B; b++ {
		seqLen, sp := p.SeqStarts[b+1]-p.SeqStarts[b], p.StartPos[b]
		if sp < 0 {
			return fmt.Errorf("%w: start_pos[%d] = %d < 0", ErrInvalidStarts, b, sp)
		}
		if kv := p.KVLen(b); sp > kv || kv-sp != seqLen {
			return fmt.Errorf("%w: request %d: kv_len %d (kvstarts) != start_pos %d + seqlen %d (seqstarts)", ErrInvalidStarts, b, kv, sp, seqLen)
		}
	}
	H, D := g.NumKVHeads, g.HeadDim
	for _, in := range []struct {
		name string
		t    *kernels.Tensor
		rows int64
		h    int
	}{
		{"current_key", &p.CurrentKey, p.SeqStarts[B], H},
		{"current_value", &p.CurrentValue, p.SeqStarts[B], H},
		{"key", &p.Key, p.KVStarts[B], H * g.NumRepeat},
		{"value", &p.Value, p.KVStarts[B], H * g.NumRepeat},
	} {
		if err := checkFloatTensor(in.name, in.t, in.rows, in.h, D); err != nil {
			return err
		}
	}
	return nil
}

// checkFloatTensor checks that t is an f32, f16 or bf16 tensor of shape
// [rows, heads, dim].
func checkFloatTensor(name string, t *kernels.Tensor, rows int64, heads, dim int) error {
	if t.DType != layout.F32 && t.DType != layout.F16 && t.DType != layout.BF16 {
		return fmt.Errorf("%w: %s has dtype %v, want f32, f16 or bf16", kernels.ErrInvalidTensor, name, t.DType)
	}
	if rows > int64(layout.MaxElements) {
		return fmt.Errorf("%w: %s would have %d rows", kernels.ErrInvalidTensor, name, rows)
	}
	return t.CheckShape(name, int(rows), heads, dim)
}
