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
	"github.com/pagedkv/pagedkv/layergroup"
	"github.com/pagedkv/pagedkv/layout"
)

// TestHybridGroupsDecodeOnEmu runs a HybridManager's decode steps for the
// four hybrid configs (gpt-oss-like, Gemma-3-like, Llama-4-like, MLA-paged)
// through the CUDA decode kernel compiled for the CPU: for every group, the
// kernel over the group's pages with its window_left must equal dense
// float64 attention over the request's whole sequence with that group's
// visibility rule (sliding window, chunk, or everything). K/V is appended
// by the Go backend from (token, position), so a page the group released
// too early, a wrong start or a wrong window shows as a wrong output.
func TestHybridGroupsDecodeOnEmu(t *testing.T) {
	const ps, heads, dim = 4, 2, 8
	sl := func(w int) pagedkv.LayerGroup {
		return pagedkv.LayerGroup{Kind: pagedkv.SlidingAttention, WindowTokens: w, NumLayers: 1}
	}
	full := pagedkv.LayerGroup{Kind: pagedkv.FullAttention, NumLayers: 1}
	chunk := pagedkv.LayerGroup{Kind: pagedkv.ChunkedAttention, ChunkTokens: 8, NumLayers: 1}
	configs := map[string][]pagedkv.LayerGroup{
		"gpt-oss-like": {sl(6), full},
		"gemma-3-like": {sl(9), sl(9), sl(9), sl(9), sl(9), full},
		"llama-4-like": {chunk, chunk, chunk, full},
		"mla":          {{Kind: pagedkv.MLAAttention, NumLayers: 1}},
	}
	kv := func(which int, tok, pos int32, h, d int) float32 {
		return float32(math.Sin(float64(int(tok)*31+int(pos)*7+h*3+d*11+which*101) * 0.37))
	}
	for name, groups := range configs {
		t.Run(name, func(t *testing.T) {
			h, err := pagedkv.NewHybrid(pagedkv.HybridConfig{Config: pagedkv.Config{NumPages: 256, PageSize: ps, HashSeed: 1}, Groups: groups})
			require.NoError(t, err)
			g := layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F32, NumPages: 256, PageSize: ps, NumKVHeads: heads, HeadDim: dim}
			cache, err := kernels.NewPagedKVCache(g)
			require.NoError(t, err)
			goBE, emu := cpu.New(cpu.Config{Workers: 1}), New(Config{NumSMs: 4})
			prompts := map[pagedkv.RequestID][]int32{1: seq(40, 21), 2: seq(70, 10)}
			for id, p := range prompts {
				_, err := h.Add(id, pagedkv.Request{Prompt: p})
				require.NoError(t, err)
			}
			ids := []pagedkv.RequestID{1, 2}
			decodes := 0
			for step := range 40 {
				nt, decode := stepTokens(h, ids, 6)
				p, err := h.Reserve(ids, nt)
				require.NoError(t, err)
				copyPages(cache, p.Copies)
				for _, gp := range p.Groups {
					appendRows(t, goBE, cache, gp, kv)
				}
				if decode {
					decodes++
					for gi, gp := range p.Groups {
						spec := h.Group(gi)
						B, D := len(ids), dim
						q := make([]float32, B*heads*D)
						for i := range q {
							q[i] = float32(math.Cos(float64(i*13+step) * 0.71))
						}
						dp := kernels.DecodeParams{Q: kernels.TensorFromF32(layout.F32, q, B, heads, D), Cache: cache,
							Table:           kernels.PageTable{KVIndptr: gp.KVIndptr, KVPageIndices: gp.KVPageIndices, KVLastPageLen: gp.KVLastPageLen},
							AttentionParams: kernels.AttentionParams{NumQOHeads: heads, WindowLeft: gp.WindowLeft},
							O:               kernels.NewTensor(layout.F32, B, heads, D)}
						require.Equal(t, spec.WindowLeft(), gp.WindowLeft)
						require.NoError(t, emu.BatchDecode(&dp))
						got := dp.O.F32()
						for b, id := range ids {
							tokens := h.Tokens(id)
							qpos := int(gp.TokenPositions[b])
							for hd := range heads {
								want := dense(spec, tokens, qpos, q[(b*heads+hd)*D:(b*heads+hd+1)*D], hd, kv)
								for d := range D {
									require.InDelta(t, want[d], got[(b*heads+hd)*D+d], 1e-5,
										fmt.Sprintf("%s group %d (%v) step %d request %d head %d feat %d", name, gi, spec.Kind, step, id, hd, d))
								}
							}
						}
					}
				}
				commitStep(t, h, ids, nt, step)
			}
			require.Greater(t, decodes, 30)
			require.Positive(t, h.Stats().WindowReleasedPages+int64(btoi(len(groups) == 1)))
		})
	}
}

// commitStep commits a hybrid step in which every request that reaches the
// end of its tokens samples token 200+step, and audits the manager.
func commitStep(t *testing.T, h *pagedkv.HybridManager, ids []pagedkv.RequestID, nt []int32, step int) {
	t.Helper()
	sampled := make([]int32, len(ids))
	for b, id := range ids {
		sampled[b] = pagedkv.NoToken
		if h.Computed(id)+int(nt[b]) == len(h.Tokens(id)) {
			sampled[b] = int32(200 + step)
		}
	}
	require.NoError(t, h.Commit(sampled))
	require.NoError(t, h.Audit())
}

func seq(from, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(from + i)
	}
	return out
}

func copyPages(c kernels.PagedKVCache, copies []pagedkv.CopyOp) {
	g := c.Geometry
	for _, op := range copies {
		for ent := range int(op.Entries) {
			for _, off := range []func(page, entry, head, feat int) int64{g.KOffset, g.VOffset} {
				src, dst := off(int(op.Src), ent, 0, 0)*4, off(int(op.Dst), ent, 0, 0)*4
				copy(c.Data[dst:dst+int64(g.NumKVHeads*g.HeadDim*4)], c.Data[src:])
			}
		}
	}
}

func appendRows(t *testing.T, be kernels.Backend, c kernels.PagedKVCache, p *pagedkv.Plan, kv func(int, int32, int32, int, int) float32) {
	g := c.Geometry
	nnz := len(p.Positions)
	if nnz == 0 {
		return
	}
	k, v := make([]float32, 0, nnz*g.NumKVHeads*g.HeadDim), make([]float32, 0, nnz*g.NumKVHeads*g.HeadDim)
	for r := range nnz {
		for h := range g.NumKVHeads {
			for d := range g.HeadDim {
				k = append(k, kv(0, p.TokenIDs[r], p.TokenPositions[r], h, d))
				v = append(v, kv(1, p.TokenIDs[r], p.TokenPositions[r], h, d))
			}
		}
	}
	require.NoError(t, be.AppendPagedKVCache(&kernels.AppendParams{
		AppendKey:    kernels.TensorFromF32(layout.F32, k, nnz, g.NumKVHeads, g.HeadDim),
		AppendValue:  kernels.TensorFromF32(layout.F32, v, nnz, g.NumKVHeads, g.HeadDim),
		BatchIndices: p.BatchIndices, Positions: p.Positions, Cache: c,
		Table: kernels.PageTable{KVIndptr: p.KVIndptr, KVPageIndices: p.KVPageIndices, KVLastPageLen: p.KVLastPageLen},
	}))
}

// dense is float64 attention of one query head at position qpos over every
// key of the sequence the group's rule makes visible.
func dense(spec layergroup.Spec, tokens []int32, qpos int, q []float32, hd int, kv func(int, int32, int32, int, int) float32) []float64 {
	D := len(q)
	scale := 1 / math.Sqrt(float64(D))
	var logits []float64
	var keys []int
	for k := 0; k <= qpos; k++ {
		if !spec.Visible(qpos, k) {
			continue
		}
		s := 0.0
		for d := range D {
			s += float64(q[d]) * float64(kv(0, tokens[k], int32(k), hd, d))
		}
		logits, keys = append(logits, s*scale), append(keys, k)
	}
	mx := math.Inf(-1)
	for _, l := range logits {
		mx = max(mx, l)
	}
	out := make([]float64, D)
	sum := 0.0
	for i, l := range logits {
		w := math.Exp(l - mx)
		sum += w
		for d := range D {
			out[d] += w * float64(kv(1, tokens[keys[i]], int32(keys[i]), hd, d))
		}
	}
	for d := range out {
		out[d] /= sum
	}
	return out
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// stepTokens is each request's next step, at most chunk of its tokens left
// to compute, and whether every request decodes (one token each).
func stepTokens(h *pagedkv.HybridManager, ids []pagedkv.RequestID, chunk int) (nt []int32, decode bool) {
	nt = make([]int32, len(ids))
	decode = true
	for b, id := range ids {
		nt[b] = int32(min(len(h.Tokens(id))-h.Computed(id), chunk))
		decode = decode && nt[b] == 1
	}
	return nt, decode
}
