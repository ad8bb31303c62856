package ppl

import (
	"fmt"
	"math"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// DecodeParams are the arguments of [Decode]: one query token per request
// attending all kv_len_b keys of its request in layer LayerIdx of a PPL
// cache, addressed as the KeyValueCache operator addresses them.
type DecodeParams struct {
	Q          kernels.Tensor // [B, H*NumRepeat, Dh]: f32, f16 or bf16
	Addressing                // KVStarts [B+1] (kv_len_b keys each), CacheStarts, MaxPages
	LayerIdx   int
	// SMScale multiplies q·k; 0 means 1/sqrt(Dh). It must be finite.
	SMScale float64
	O       kernels.Tensor // output [B, H*NumRepeat, Dh]: f32, f16 or bf16
	LSE     []float32      // output [B*H*NumRepeat] base-2 LSE, or nil
}

// Decode is batch decode over a PPL cache, dequantising on read: for
// request b and query head j (cache head j/NumRepeat, FlashInfer's GQA rule)
// it computes s_i = SMScale * q·k_i over the request's keys, then
// o = softmax(s)·v and lse = log2(sum_i exp(s_i)) (base 2, as FlashInfer).
// A request with no keys gets o = 0 and lse = -inf. Keys and values are read
// exactly as [Cache.LoadRow] returns them (code*scale for a quantised
// cache), so Decode equals FlashInfer's decode over the dequantised cache up
// to float rounding. Accumulation is in float64.
//
// Everything is validated first; on error nothing is written. Decode runs on
// the calling goroutine and allocates its scratch once per call.
func Decode(c *Cache, p *DecodeParams) error {
	if err := c.Validate(); err != nil {
		return err
	}
	g := &c.Geometry
	B := p.BatchSize()
	Hq, D, R := g.NumKVHeads*g.NumRepeat, g.HeadDim, g.NumRepeat
	switch {
	case p.LayerIdx < 0 || p.LayerIdx >= g.NumLayers:
		return fmt.Errorf("%w: layer_idx %d outside [0, num_layer %d)", ErrOutOfRange, p.LayerIdx, g.NumLayers)
	case math.IsNaN(p.SMScale) || math.IsInf(p.SMScale, 0):
		return fmt.Errorf("%w: sm_scale %g is not finite", ErrInvalidGeometry, p.SMScale)
	case p.LSE != nil && len(p.LSE) != B*Hq:
		return fmt.Errorf("%w: lse has length %d, want batch %d x heads %d", kernels.ErrInvalidTensor, len(p.LSE), B, Hq)
	}
	if err := g.ValidateAddressing(&p.Addressing, B); err != nil {
		return err
	}
	if err := checkFloatTensor("q", &p.Q, int64(B), Hq, D); err != nil {
		return err
	}
	if err := checkFloatTensor("o", &p.O, int64(B), Hq, D); err != nil {
		return err
	}
	scale := p.SMScale
	if scale == 0 {
		scale = 1 / math.Sqrt(float64(D))
	}

	// Scratch for one (request, cache head): R query rows, R accumulators,
	// one K and one V row.
	q := make([]float32, R*D)
	acc := make([]float64, R*D)
	m, d := make([]float64, R), make([]float64, R)
	k, v := make([]float32, D), make([]float32, D)
	for b := 0; b < B; b++ {
		n := p.KVLen(b)
		for h := 0; h < g.NumKVHeads; h++ {
			qOff := (b*Hq + h*R) * D
			es := p.Q.DType.Size()
			layout.LoadRowF32(q, p.Q.DType, p.Q.Data[qOff*es:(qOff+R*D)*es])
			clear(acc)
			for r := range m {
				m[r], d[r] = math.Inf(-1), 0
			}
			for pos := int64(0); pos < n; pos++ {
				slot := int(g.Slot(&p.Addressing, b, pos))
				c.LoadRow(k, p.LayerIdx, 0, slot, h)
				c.LoadRow(v, p.LayerIdx, 1, slot, h)
				for r := 0; r < R; r++ {
					qr, ar := q[r*D:(r+1)*D], acc[r*D:(r+1)*D]
					var dot float64
					for i, x := range qr {
						dot += float64(x) * float64(k[i])
					}
					s := dot * scale
					// Online softmax: keep m = max s, d = sum exp(s - m), acc = sum exp(s - m) v.
					if s > m[r] {
						f := math.Exp(m[r] - s) // 0 on the first key (m = -inf)
						d[r] = d[r]*f + 1
						for i, x := range v {
							ar[i] = ar[i]*f + float64(x)
						}
						m[r] = s
						continue
					}
					w := math.Exp(s - m[r])
					d[r] += w
					for i, x := range v {
						ar[i] += w * float64(x)
					}
				}
			}
			oOff := qOff * p.O.DType.Size()
			for r := 0; r < R; r++ {
				row := q[r*D : (r+1)*D] // reuse as the float32 output row
				for i := range row {
					if d[r] > 0 {
						row[i] = float32(acc[r*D+i] / d[r])
					} else {
						row[i] = 0
					}
				}
				if p.LSE != nil {
					lse := math.Inf(-1)
					if d[r] > 0 {
						lse = (m[r] + math.Log(d[r])) * math.Log2E
					}
					p.LSE[b*Hq+h*R+r] = float32(lse)
				}
			}
			layout.StoreRowF32(p.O.Data[oOff:], p.O.DType, q)
		}
	}
	return nil
}
