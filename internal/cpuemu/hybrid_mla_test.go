//go:build cgo

package cpuemu

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/kernels/cuda"
	"github.com/pagedkv/pagedkv/layout"
)

// TestHybridMLAGroupDecode runs the MLA config's group (DeepSeek: MLA on
// every layer) through the MLA kernels: a HybridManager's plans append
// ckv/kpe rows with append_paged_mla_kv_cache (prefill in chunks of 5),
// and every decode step runs MLA decode over the group's pages on the CPU
// backend and on the CUDA kernel compiled for the CPU; each must equal
// dense float64 MLA attention over the request's whole sequence
// (logits q_nope.ckv + q_pe.kpe, output the weighted ckv). Two caches: f32
// with small head dims (the CUDA-core mla_decode_f32_c1 on the emulator)
// and f16 with FlashInfer's 512+64 and f16 q and o (mla_decode_tc_f16, the
// tensor-core kernel, in the precision FlashInfer computes it: the dense
// reference takes the f16-rounded cache and q, the tolerance is f16's).
func TestHybridMLAGroupDecode(t *testing.T) {
	for _, c := range []struct {
		dt     layout.DType
		dc, dk int
		tol    float64
		kernel string
	}{{layout.F32, 32, 16, 1e-5, "mla_decode_f32_c1"}, {layout.F16, 512, 64, 2e-3, "mla_decode_tc_f16"}} {
		t.Run(fmt.Sprintf("%v-%d+%d", c.dt, c.dc, c.dk), func(t *testing.T) {
			g := layout.MLA{Form: layout.Fused, DType: c.dt, NumPages: 1, PageSize: 1, HeadDimCKV: c.dc, HeadDimKPE: c.dk}
			require.Equal(t, c.kernel, cuda.MLAKernelFor(g, c.dt, c.dt, c.dt))
			testHybridMLA(t, c.dt, c.dc, c.dk, c.tol)
		})
	}
}

func testHybridMLA(t *testing.T, dt layout.DType, dc, dk int, tol float64) {
	const ps, heads, npages = 4, 4, 64
	h, err := pagedkv.NewHybrid(pagedkv.HybridConfig{Config: pagedkv.Config{NumPages: npages, PageSize: ps, HashSeed: 1},
		Groups: []pagedkv.LayerGroup{{Kind: pagedkv.MLAAttention, NumLayers: 1}}})
	require.NoError(t, err)
	cache, err := kernels.NewMLACache(layout.MLA{Form: layout.Fused, DType: dt, NumPages: npages, PageSize: ps,
		HeadDimCKV: dc, HeadDimKPE: dk})
	require.NoError(t, err)
	round := func(x float64) float32 { // to the cache's dtype and back
		var b [4]byte
		layout.StoreF32(dt, b[:], 0, float32(x))
		return layout.LoadF32(dt, b[:], 0)
	}
	ckv := func(tok, pos int32, d int) float32 {
		return round(math.Sin(float64(int(tok)*31+int(pos)*7+d*11) * 0.37))
	}
	kpe := func(tok, pos int32, d int) float32 {
		return round(math.Cos(float64(int(tok)*17+int(pos)*5+d*13) * 0.29))
	}
	goBE, emu := cpu.New(cpu.Config{Workers: 1}), New(Config{NumSMs: 4})
	ids := []pagedkv.RequestID{1, 2}
	for i, id := range ids {
		_, err := h.Add(id, pagedkv.Request{Prompt: seq(40+30*i, 13+4*i)})
		require.NoError(t, err)
	}
	const scale = 0.15
	decodes := 0
	for step := range 30 {
		nt, decode := stepTokens(h, ids, 5)
		p, err := h.Reserve(ids, nt)
		require.NoError(t, err)
		require.Empty(t, p.Copies)
		gp := p.Groups[0]
		require.Equal(t, -1, gp.WindowLeft)
		nnz := len(gp.Positions)
		ac, ak := make([]float32, 0, nnz*dc), make([]float32, 0, nnz*dk)
		for r := range nnz {
			for d := range dc {
				ac = append(ac, ckv(gp.TokenIDs[r], gp.TokenPositions[r], d))
			}
			for d := range dk {
				ak = append(ak, kpe(gp.TokenIDs[r], gp.TokenPositions[r], d))
			}
		}
		require.NoError(t, goBE.AppendPagedMLAKVCache(&kernels.MLAAppendParams{
			AppendCKV: kernels.TensorFromF32(dt, ac, nnz, dc), AppendKPE: kernels.TensorFromF32(dt, ak, nnz, dk),
			BatchIndices: gp.BatchIndices, Positions: gp.Positions, Cache: cache,
			KVIndptr: gp.KVIndptr, KVPageIndices: gp.KVPageIndices, KVLastPageLen: gp.KVLastPageLen}))
		if decode {
			decodes++
			B := len(ids)
			qn, qp := make([]float32, B*heads*dc), make([]float32, B*heads*dk)
			for i := range qn {
				qn[i] = round(math.Cos(float64(i*13+step) * 0.71))
			}
			for i := range qp {
				qp[i] = round(math.Sin(float64(i*7+step) * 0.53))
			}
			kvLen := make([]int32, B)
			for b := range B {
				kvLen[b] = (gp.KVIndptr[b+1]-gp.KVIndptr[b]-1)*ps + gp.KVLastPageLen[b]
			}
			for _, be := range []struct {
				name string
				b    kernels.Backend
			}{{"cpu", goBE}, {"emu", emu}} {
				dp := kernels.MLADecodeParams{QNope: kernels.TensorFromF32(dt, qn, B, heads, dc),
					QPE: kernels.TensorFromF32(dt, qp, B, heads, dk), Cache: cache,
					KVIndptr: gp.KVIndptr, KVPageIndices: gp.KVPageIndices, KVLen: kvLen, NumHeads: heads, SMScale: scale,
					O: kernels.NewTensor(dt, B, heads, dc)}
				require.NoError(t, be.b.MLADecode(&dp))
				got := dp.O.F32()
				for b, id := range ids {
					tokens := h.Tokens(id)
					qpos := int(gp.TokenPositions[b])
					require.Equal(t, qpos+1, int(kvLen[b]))
					for hd := range heads {
						row := b*heads + hd
						want := denseMLA(tokens, qpos, qn[row*dc:(row+1)*dc], qp[row*dk:(row+1)*dk], scale, ckv, kpe)
						for d := range dc {
							require.InDelta(t, want[d], got[row*dc+d], tol,
								fmt.Sprintf("%s step %d request %d head %d feat %d", be.name, step, id, hd, d))
						}
					}
				}
			}
		}
		commitStep(t, h, ids, nt, step)
	}
	require.Greater(t, decodes, 20)
}

// denseMLA is float64 MLA attention of one head's query at qpos over every
// token of the sequence up to it.
func denseMLA(tokens []int32, qpos int, qn, qp []float32, scale float64,
	ckv, kpe func(tok, pos int32, d int) float32) []float64 {
	logits := make([]float64, qpos+1)
	mx := math.Inf(-1)
	for k := range logits {
		s := 0.0
		for d := range qn {
			s += float64(qn[d]) * float64(ckv(tokens[k], int32(k), d))
		}
		for d := range qp {
			s += float64(qp[d]) * float64(kpe(tokens[k], int32(k), d))
		}
		logits[k] = s * scale
		mx = max(mx, logits[k])
	}
	out := make([]float64, len(qn))
	sum := 0.0
	for k, l := range logits {
		w := math.Exp(l - mx)
		sum += w
		for d := range out {
			out[d] += w * float64(ckv(tokens[k], int32(k), d))
		}
	}
	for d := range out {
		out[d] /= sum
	}
	return out
}
