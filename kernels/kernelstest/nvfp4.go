package kernelstest

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/reference"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// The NVFP4 suite: FlashInfer's packed NVFP4 cache (two e2m1 codes per byte
// in the data pages, one e4m3 scale per 16 elements in the kv_cache_sf scale
// pages, k_scale/v_scale the global scales). A quantising append must write
// exactly the reference model's bytes (internal/reference's own layout and
// quantiser) and nothing else; decode and prefill over an NVFP4 cache must
// match float64 attention over the dequantised cache within the same output
// tolerances as every other dtype (the absolute one scaled by the values'
// amplitude, up to 30 here: attnConfig.vAmp), and stay within the documented bound of
// float64 attention over the values before quantisation.

// nvfp4Iterations is iterations(n), a quarter of it under -race.
func nvfp4Iterations(n int) int {
	if raceEnabled {
		return max(1, iterations(n)/4)
	}
	return iterations(n)
}

// TestNVFP4 is the conformance suite for NVFP4 caches.
func TestNVFP4(t *testing.T, b kernels.Backend) {
	t.Run("append", func(t *testing.T) {
		seeds := nvfp4Iterations(2)
		for _, c := range nvfp4AppendCases() {
			t.Run(c.String(), func(t *testing.T) {
				for s := range seeds {
					CheckAppendNVFP4(t, b, c, uint64(s))
				}
			})
		}
	})
	t.Run("decode", func(t *testing.T) { RunNVFP4Decode(t, b, nvfp4Iterations(16)) })
	t.Run("prefill", func(t *testing.T) { RunNVFP4Prefill(t, b, nvfp4Iterations(16)) })
	t.Run("accuracy", func(t *testing.T) { testNVFP4Accuracy(t, b) })
	t.Run("invalid", func(t *testing.T) { testNVFP4Invalid(t, b) })
}

// RunNVFP4Decode runs the first n of the suite's random NVFP4 decode
// cases against the reference.
func RunNVFP4Decode(t *testing.T, b kernels.Backend, n int) {
	for i := range n {
		rng := seededRNG(t, 3700+uint64(i))
		a := randomNVFP4Attn(rng, 1+rng.IntN(4), pick(rng, 8, 40))
		runDecodeCase(t, b, rng, a, fmt.Sprintf("case %d", i))
	}
}

// RunNVFP4Prefill runs the first n of the suite's random NVFP4 prefill
// cases against the reference.
func RunNVFP4Prefill(t *testing.T, b kernels.Backend, n int) {
	for i := range n {
		rng := seededRNG(t, 3800+uint64(i))
		a := randomNVFP4Attn(rng, 1+rng.IntN(3), pick(rng, 6, 30))
		runPrefillCase(t, b, rng, a, rng.IntN(2) == 0, fmt.Sprintf("case %d", i))
	}
}

// nvfp4AppendCases: both layouts and forms, f32/f16/bf16 rows, page sizes 1,
// 3 and 16, head dims 16, 64 and 128.
func nvfp4AppendCases() []AppendCase {
	var cs []AppendCase
	for _, l := range []layout.KVLayout{layout.NHD, layout.HND} {
		for _, f := range []layout.TensorForm{layout.Fused, layout.Split} {
			for i, src := range []layout.DType{layout.F32, layout.F16, layout.BF16} {
				cs = append(cs, AppendCase{Layout: l, Form: f, DType: layout.NVFP4, SrcDType: src, PageSize: []int{1, 3, 16}[i],
					Heads: 1 + i, HeadDim: []int{16, 64, 128}[i], MaxBatch: 4, Shuffle: i == 1})
			}
		}
	}
	return cs
}

// CheckAppendNVFP4 runs one random quantising append of case c (rows of
// random bytes, NaN and infinities included; random global scales) on b and
// requires every byte of the data and scale buffers to equal the reference
// model's (which writes only the appended rows' codes and block scales, so
// any other byte changed fails too).
func CheckAppendNVFP4(t testing.TB, b kernels.Backend, c AppendCase, seed uint64) {
	t.Helper()
	f, p, ok := ranAppendCase(t, b, c, seed)
	if !ok {
		return
	}
	got, want := &p.Cache, &f.Want
	for i, pair := range [][2][]byte{{got.Data, want.Data}, {got.K, want.K}, {got.V, want.V}, {got.SF, want.SF}, {got.KSF, want.KSF}, {got.VSF, want.VSF}} {
		if bytes.Equal(pair[0], pair[1]) {
			continue
		}
		k := 0
		for pair[0][k] == pair[1][k] {
			k++
		}
		t.Fatalf("%v seed %d (k_scale %g v_scale %g): byte %d of %s is %#x, the reference has %#x",
			c, seed, p.KScale, p.VScale, k, []string{"Data", "K", "V", "SF", "KSF", "VSF"}[i], pair[0][k], pair[1][k])
	}
}

// randomNVFP4Attn draws an NVFP4 cache and attention scalars: values of
// magnitude A with global scales from FlashInfer's convention A/(6*448)
// (block scales use e4m3's whole range), 1 (small values get subnormal block
// scales) or A/6 (block scales near 1).
func randomNVFP4Attn(rng *rand.Rand, batch, maxLen int) *attnConfig {
	g := layout.Paged{
		Layout:     pick(rng, layout.NHD, layout.HND),
		Form:       pick(rng, layout.Fused, layout.Split),
		DType:      layout.NVFP4,
		PageSize:   pick(rng, 1, 2, 3, 5, 16),
		NumKVHeads: pick(rng, 1, 2, 3),
		HeadDim:    pick(rng, 16, 32, 64, 128),
	}
	group := pick(rng, 1, 2, 4)
	a := &attnConfig{
		hq:      g.NumKVHeads * group,
		qdt:     pick(rng, layout.F32, layout.F16, layout.BF16),
		odt:     pick(rng, layout.F32, layout.F16, layout.BF16),
		withLSE: rng.IntN(4) != 0,
	}
	a.ap = kernels.AttentionParams{NumQOHeads: a.hq, SMScale: pick(rng, 0, 0.05+rng.Float64()/2), WindowLeft: pick(rng, -1, -1, rng.IntN(maxLen+2))}
	if rng.IntN(4) == 0 {
		a.ap.LogitsSoftCap = pick(rng, 1.0, 30)
	}
	amp := pick(rng, 1.0, 1.0/16, 30)
	global := func() float64 { return pick(rng, amp/(6*448), 1, amp/6) }
	a.ap.KScale, a.ap.VScale = global(), global()
	lens := make([]int, batch)
	for b := range lens {
		lens[b] = pick(rng, 0, 1, 1+rng.IntN(maxLen), 1+rng.IntN(maxLen))
	}
	a.c, _ = nvfp4FromTokens(rng, g, lens, rng.IntN(3), a.ap.KScale, a.ap.VScale, func() float64 { return (2*rng.Float64() - 1) * amp })
	a.vAmp = amp
	return a
}

// nvfp4FromTokens builds an NVFP4 cache of geometry g (NumPages set here)
// where request b has lens[b] tokens on random pages, each K/V element drawn
// from value and quantised by the reference model under the global scales
// kScale/vScale. Every slot no token was written to has random codes and
// the NaN scale 0x7F, so reading it poisons the result. It also returns the
// values before quantisation, [b][t][kv][H*D].
func nvfp4FromTokens(rng *rand.Rand, g layout.Paged, lens []int, spare int, kScale, vScale float64, value func() float64) (*cacheCase, [][][2][]float64) {
	cache, indptr, indices, last := scatteredCache(rng, g, lens, spare)
	for _, buf := range [][]byte{cache.Data, cache.K, cache.V} {
		copy(buf, randomBytes(rng, len(buf)))
	}
	for _, buf := range [][]byte{cache.SF, cache.KSF, cache.VSF} {
		for i := range buf {
			buf[i] = 0x7f
		}
	}
	c := &cacheCase{cache: cache, table: kernels.PageTable{KVIndptr: indptr, KVPageIndices: indices, KVLastPageLen: last}, lens: lens}
	c.ref = refView(&c.cache)
	HD := g.NumKVHeads * g.HeadDim
	raw := make([][][2][]float64, len(lens))
	for b, n := range lens {
		raw[b] = make([][2][]float64, n)
		for t := range n {
			var rows [2][]byte
			for kv := range 2 {
				raw[b][t][kv] = make([]float64, HD)
				rows[kv] = make([]byte, 4*HD)
				for i := range HD {
					x := float32(value())
					raw[b][t][kv][i] = float64(x)
					layout.StoreF32(layout.F32, rows[kv], i, x)
				}
			}
			reference.Append(c.ref, reference.AppendInput{Key: rows[0], Value: rows[1], SrcDType: layout.F32,
				BatchIndices: []int32{int32(b)}, Positions: []int32{int32(t)}, KVIndptr: indptr, KVPageIndices: indices,
				KScale: kScale, VScale: vScale})
		}
	}
	return c, raw
}

// testNVFP4Accuracy bounds decode over an NVFP4 cache against float64
// attention over the values before quantisation (docs/quantisation.md,
// "NVFP4 attention bound"): with dk = k' - k and dv = v' - v the
// quantisation errors (k' = e2m1*scale*k_scale), a logit moves by at most
// D_j = sm_scale*|q.dk_j| and the softmax weights by at most a factor
// e^(2*max D_j), so each output feature is within
//
//	max_j |dv_j| + (e^(2*max_j D_j) - 1) * max_j |v_j|
//
// of the exact one, plus the output tolerance of the kernel's float32
// arithmetic. D_j is computed from the data, so the bound grows with the
// number of elements in a dot product (head_dim) only as the actual errors
// add up. It also reports the mean relative error seen.
func testNVFP4Accuracy(t *testing.T, b kernels.Backend) {
	var sumErr, sumAbs, ratio float64
	defer func() {
		t.Logf("nvfp4 decode vs float64 over unquantised K/V: mean |error| / mean |o| = %.4f; largest error / bound = %.3f", sumErr/sumAbs, ratio)
	}()
	for i := 0; i < nvfp4Iterations(3); i++ {
		rng := seededRNG(t, 3900+uint64(i))
		D := pick(rng, 64, 128)
		g := layout.Paged{Layout: pick(rng, layout.NHD, layout.HND), Form: layout.Fused, DType: layout.NVFP4, PageSize: 16, NumKVHeads: 2, HeadDim: D}
		hq := 4
		lens := []int{1 + rng.IntN(100), 1 + rng.IntN(20)}
		ks, vs := 1.0/(6*448), 1.0/(6*448) // FlashInfer's convention for values of magnitude <= 1
		c, raw := nvfp4FromTokens(rng, g, lens, 1, ks, vs, func() float64 { return 2*rng.Float64() - 1 })
		ap := kernels.AttentionParams{NumQOHeads: hq, KScale: ks, VScale: vs, WindowLeft: -1}
		B := len(lens)
		p := &kernels.DecodeParams{Q: randomQ(rng, layout.F32, B, hq, D), Cache: c.cache, Table: c.table, AttentionParams: ap,
			O: kernels.NewTensor(layout.F32, B, hq, D)}
		if skipUnsupported(t, b.BatchDecode(p), "nvfp4 accuracy") {
			return
		}
		q := reference.Rows3(reference.Floats(layout.F32, p.Q.Data), B, hq, D)
		o := p.O.F32()
		sm := 1 / math.Sqrt(float64(D))
		for bi, n := range lens {
			kq, vq := reference.Gather(c.ref, c.table.KVIndptr, c.table.KVPageIndices, c.table.KVLastPageLen, bi)
			for h := range hq {
				kvh := h / (hq / g.NumKVHeads)
				keys, vals := make([][]float64, n), make([][]float64, n)
				visible := make([]bool, n)
				delta, dvMax, vMax := 0.0, 0.0, 0.0
				for j := range n {
					keys[j], vals[j] = raw[bi][j][0][kvh*D:(kvh+1)*D], raw[bi][j][1][kvh*D:(kvh+1)*D]
					visible[j] = true
					dot := 0.0
					for f := range D {
						dot += q[bi][h][f] * (kq[j][kvh][f]*ks - keys[j][f])
						dvMax = max(dvMax, math.Abs(vq[j][kvh][f]*vs-vals[j][f]))
						vMax = max(vMax, math.Abs(vals[j][f]))
					}
					delta = max(delta, sm*math.Abs(dot))
				}
				want, _ := reference.Attend(q[bi][h], keys, vals, visible, sm, 0, D)
				bound := dvMax + math.Expm1(2*delta)*vMax + 1e-4
				for f := range D {
					got := float64(o[(bi*hq+h)*D+f])
					require.LessOrEqualf(t, math.Abs(got-want[f]), bound,
						"case %d request %d head %d feature %d: nvfp4 decode %v, float64 attention over unquantised K/V %v (bound %v: max|dv| %v, max logit shift %v)",
						i, bi, h, f, got, want[f], bound, dvMax, delta)
					sumErr += math.Abs(got - want[f])
					sumAbs += math.Abs(want[f])
					ratio = max(ratio, math.Abs(got-want[f])/bound)
				}
			}
		}
	}
}

// testNVFP4Invalid: malformed NVFP4 caches and appends fail with the right
// sentinel and write nothing.
func testNVFP4Invalid(t *testing.T, b kernels.Backend) {
	f := NewAppendFixture(rand.New(rand.NewPCG(9, 9)), AppendCase{Layout: layout.NHD, Form: layout.Split, DType: layout.NVFP4, SrcDType: layout.F16, PageSize: 4, Heads: 2, HeadDim: 32, MaxBatch: 2})
	for _, tc := range []struct {
		name string
		mut  func(p *kernels.AppendParams)
		want error
	}{
		{"scale buffer short", func(p *kernels.AppendParams) { p.Cache.KSF = p.Cache.KSF[:len(p.Cache.KSF)-1] }, kernels.ErrInvalidCache},
		{"scale buffer missing", func(p *kernels.AppendParams) { p.Cache.VSF = nil }, kernels.ErrInvalidCache},
		{"fused scale buffer on a split cache", func(p *kernels.AppendParams) { p.Cache.SF = []byte{0} }, kernels.ErrInvalidCache},
		{"rows already nvfp4", func(p *kernels.AppendParams) {
			p.AppendKey.DType, p.AppendValue.DType = layout.NVFP4, layout.NVFP4
		}, kernels.ErrInvalidTensor},
		{"negative global scale", func(p *kernels.AppendParams) { p.KScale = -1 }, kernels.ErrInvalidScale},
		{"head_dim not a multiple of 16", func(p *kernels.AppendParams) { p.Cache.Geometry.HeadDim = 24 }, kernels.ErrInvalidCache},
	} {
		p := f.Params
		p.Cache = cloneCache(f.Before)
		tc.mut(&p)
		err := b.AppendPagedKVCache(&p)
		require.ErrorIs(t, err, tc.want, tc.name)
		require.True(t, bytes.Equal(p.Cache.K, f.Before.K) && bytes.Equal(p.Cache.V, f.Before.V) && bytes.Equal(p.Cache.KSF[:min(len(p.Cache.KSF), len(f.Before.KSF))], f.Before.KSF[:min(len(p.Cache.KSF), len(f.Before.KSF))]),
			"%s: a refused append wrote to the cache", tc.name)
	}
}
