package quant_test

// End-to-end tests of FlashInfer's fp8 KV cache through the kernels.Backend
// interface: append f16/bf16 rows into an e4m3/e5m2 cache with a per-tensor
// scale (or append pre-quantised fp8 rows), then decode with k_scale folded
// into sm_scale and v_scale applied to the output. They run on the cpu
// backend and on the CUDA kernels compiled for the CPU (internal/cpuemu),
// with and without split-k. The scalar fp8 conversions themselves are tested
// exhaustively in package layout.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/cpuemu"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/layout"
)

// FlashInfer's tolerance for fp8 decode (tests/attention/
// test_decode_fp8_calibration_scale.py): |x - e| <= atol + rtol*|e|.
const fp8Atol, fp8Rtol = 1e-2, 2e-2

type namedBackend struct {
	name string
	kernels.Backend
}

func fp8Backends() []namedBackend {
	return []namedBackend{
		{"cpu", cpu.New(cpu.Config{})},
		{"emu", cpuemu.New(cpuemu.Config{})},
		{"emu-splitk16", cpuemu.New(cpuemu.Config{MaxChunkTokens: 16})},
	}
}

func fp8Encode(dt layout.DType) func(float32) uint8 {
	if dt == layout.E5M2 {
		return layout.F32ToE5M2Sat
	}
	return layout.F32ToE4M3Sat
}

// TestFP8WorkedExample: one request, one key. With sm_scale 1, k_scale 2,
// v_scale 3, q = [1, 0], K_fp8 = [1, 0.5], V_fp8 = [0.5, -1]:
// the only logit is q·K_real = 1*2 = 2, so o = v_scale*V_fp8 = [1.5, -3] and
// lse = 2/ln 2 = 2.8853900817779268 (v_scale does not enter the LSE).
func TestFP8WorkedExample(t *testing.T) {
	for _, be := range fp8Backends() {
		for _, dt := range []layout.DType{layout.E4M3, layout.E5M2} {
			t.Run(be.name+"/"+dt.String(), func(t *testing.T) {
				enc := fp8Encode(dt)
				cache, err := kernels.NewPagedKVCache(layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: dt,
					NumPages: 1, PageSize: 1, NumKVHeads: 1, HeadDim: 2})
				require.NoError(t, err)
				copy(cache.Data, []byte{enc(1), enc(0.5), enc(0.5), enc(-1)}) // K then V of page 0
				p := &kernels.DecodeParams{
					Q:     kernels.TensorFromF32(layout.F16, []float32{1, 0}, 1, 1, 2),
					Cache: cache, Table: kernels.PageTable{KVIndptr: []int32{0, 1}, KVPageIndices: []int32{0}, KVLastPageLen: []int32{1}},
					AttentionParams: kernels.AttentionParams{NumQOHeads: 1, SMScale: 1, WindowLeft: -1, KScale: 2, VScale: 3},
					O:               kernels.NewTensor(layout.F32, 1, 1, 2), LSE: make([]float32, 1)}
				require.NoError(t, be.BatchDecode(p))
				assert.InDeltaSlice(t, []float32{1.5, -3}, p.O.F32(), 1e-6)
				assert.InDelta(t, 2/math.Ln2, p.LSE[0], 1e-5)
			})
		}
	}
}

// TestFP8AppendConvertsWithScale pins the append conversion on values by
// hand: x/k_scale rounded to nearest even, saturating at the largest finite
// value. k_scale = 4: 1000 -> 250 -> e4m3 256 (0x78; neighbours 240 and
// 256); -3000 -> -750 -> -448 (0xFE, saturated); 1 -> 0.25 (0x28);
// 0.0078125 -> 2^-9, e4m3's smallest subnormal (0x01).
func TestFP8AppendConvertsWithScale(t *testing.T) {
	for _, be := range fp8Backends() {
		t.Run(be.name, func(t *testing.T) {
			cache, err := kernels.NewPagedKVCache(layout.Paged{Layout: layout.NHD, Form: layout.Split, DType: layout.E4M3,
				NumPages: 1, PageSize: 1, NumKVHeads: 1, HeadDim: 64})
			require.NoError(t, err)
			vals := make([]float32, 64)
			copy(vals, []float32{1000, -3000, 1, 0.0078125})
			p := &kernels.AppendParams{
				AppendKey: kernels.TensorFromF32(layout.F16, vals, 1, 1, 64), AppendValue: kernels.TensorFromF32(layout.F16, vals, 1, 1, 64),
				BatchIndices: []int32{0}, Positions: []int32{0}, Cache: cache,
				Table:  kernels.PageTable{KVIndptr: []int32{0, 1}, KVPageIndices: []int32{0}, KVLastPageLen: []int32{1}},
				KScale: 4, VScale: 1000}
			require.NoError(t, be.AppendPagedKVCache(p))
			assert.Equal(t, []byte{0x78, 0xfe, 0x28, 0x01, 0, 0}, cache.K[:6], "K = e4m3(x/4)")
			// v_scale 1000: 1000 -> 1 (0x38), -3000 -> -3 (0xC4), 1 -> 0.001 = 0.512
			// subnormal steps of 2^-9 -> 0x01, 0.0078125 -> 7.8e-6 -> 0.
			assert.Equal(t, []byte{0x38, 0xc4, 0x01, 0x00}, cache.V[:4], "V = e4m3(x/1000)")
		})
	}
}

// TestFP8DecodeMatchesDequantisedCache is the acceptance test: f16/bf16 K/V
// appended into an fp8 cache with per-tensor scales (and, separately,
// pre-quantised fp8 rows appended as they are) must give, through decode with
// k_scale and v_scale, the decode of the dequantised f32 cache
// (k_scale*K_fp8, v_scale*V_fp8) within FlashInfer's fp8 tolerance. The
// append itself must store exactly fp8(x/scale).
func TestFP8DecodeMatchesDequantisedCache(t *testing.T) {
	ref := cpu.New(cpu.Config{})
	for _, be := range fp8Backends() {
		for _, dt := range []layout.DType{layout.E4M3, layout.E5M2} {
			for _, kvl := range []layout.KVLayout{layout.NHD, layout.HND} {
				for _, in := range []layout.DType{layout.F16, layout.BF16, dt} {
					name := fmt.Sprintf("%s/%v/%v/in=%v", be.name, dt, kvl, in)
					t.Run(name, func(t *testing.T) {
						s := newFP8Scenario(t, rand.New(rand.NewPCG(uint64(dt), uint64(kvl))), dt, kvl)
						s.append(t, be, in)
						dO, dLSE := s.compareDecode(t, be, ref)
						t.Logf("max |o - o_ref| = %.3g, max |lse - lse_ref| = %.3g (quantisation vs f16: o %.3g)", dO, dLSE, s.quantEffect(t, ref))
					})
				}
			}
		}
	}
}

// fp8Scenario: 3 requests of 13, 1 and 30 tokens, 2 kv heads, 4 query heads,
// head_dim 64, pages of 4 tokens in a shuffled pool of 16 pages.
type fp8Scenario struct {
	dt             layout.DType
	geom           layout.Paged
	table          kernels.PageTable
	k, v           [][]float32 // [token of the batch] -> [H*D] real values (already f16/bf16-exact)
	batch, pos     []int32
	kScale, vScale float64
	cache          kernels.PagedKVCache
	q              kernels.Tensor
	rng            *rand.Rand
}

func newFP8Scenario(t *testing.T, rng *rand.Rand, dt layout.DType, kvl layout.KVLayout) *fp8Scenario {
	const N, H, D = 4, 2, 64
	lens := []int{13, 1, 30}
	s := &fp8Scenario{dt: dt, rng: rng,
		geom: layout.Paged{Layout: kvl, Form: layout.Fused, DType: dt, NumPages: 16, PageSize: N, NumKVHeads: H, HeadDim: D}}
	perm := rng.Perm(16)
	s.table.KVIndptr = []int32{0}
	var amaxK, amaxV float64
	for b, n := range lens {
		pages := (n + N - 1) / N
		for j := 0; j < pages; j++ {
			s.table.KVPageIndices = append(s.table.KVPageIndices, int32(perm[0]))
			perm = perm[1:]
		}
		s.table.KVIndptr = append(s.table.KVIndptr, int32(len(s.table.KVPageIndices)))
		s.table.KVLastPageLen = append(s.table.KVLastPageLen, int32((n-1)%N+1))
		for p := 0; p < n; p++ {
			k, v := make([]float32, H*D), make([]float32, H*D)
			for i := range k {
				// f16-exact values (bf16 rounding is applied by the tensor).
				k[i] = layout.F16ToF32(layout.F32ToF16(float32(rng.NormFloat64() * 2)))
				v[i] = layout.F16ToF32(layout.F32ToF16(float32(rng.NormFloat64())))
				amaxK, amaxV = max(amaxK, math.Abs(float64(k[i]))), max(amaxV, math.Abs(float64(v[i])))
			}
			s.k, s.v = append(s.k, k), append(s.v, v)
			s.batch, s.pos = append(s.batch, int32(b)), append(s.pos, int32(p))
		}
	}
	// FlashInfer's calibration: scale = amax/256 (e4m3 keeps values up to 448).
	s.kScale, s.vScale = amaxK/256, amaxV/256
	var err error
	s.cache, err = kernels.NewPagedKVCache(s.geom)
	require.NoError(t, err)
	qv := make([]float32, len(lens)*4*D)
	for i := range qv {
		qv[i] = float32(rng.NormFloat64())
	}
	s.q = kernels.TensorFromF32(layout.F16, qv, len(lens), 4, D)
	return s
}

// append appends every token with rows of dtype in (f16/bf16 converted by
// the backend with the scales, or fp8 codes computed here and copied), and
// checks that the cache holds fp8(x/scale) exactly.
func (s *fp8Scenario) append(t *testing.T, be kernels.Backend, in layout.DType) {
	g := s.geom
	H, D, nnz := g.NumKVHeads, g.HeadDim, len(s.k)
	enc := fp8Encode(s.dt)
	ks, vs := float32(s.kScale), float32(s.vScale)
	flat := func(rows [][]float32) []float32 {
		var out []float32
		for _, r := range rows {
			out = append(out, r...)
		}
		return out
	}
	key, value := kernels.TensorFromF32(in, flat(s.k), nnz, H, D), kernels.TensorFromF32(in, flat(s.v), nnz, H, D)
	p := &kernels.AppendParams{AppendKey: key, AppendValue: value, BatchIndices: s.batch, Positions: s.pos,
		Cache: s.cache, Table: s.table, KScale: s.kScale, VScale: s.vScale}
	if in == s.dt { // pre-quantised: the caller divides and rounds, the append copies
		for i, x := range flat(s.k) {
			key.Data[i] = enc(x / ks)
		}
		for i, x := range flat(s.v) {
			value.Data[i] = enc(x / vs)
		}
		p.KScale, p.VScale = 0, 0
	}
	require.NoError(t, be.AppendPagedKVCache(p))

	x := make([]float32, H*D)
	for i := range s.k {
		page, entry, err := s.table.Locate(int(s.batch[i]), int(s.pos[i]), g.PageSize)
		require.NoError(t, err)
		for kv, rows := range [][][]float32{s.k, s.v} {
			scale := []float32{ks, vs}[kv]
			// What the backend saw: the row rounded to the input dtype (fp8 input: f16 values).
			src := in
			if in == s.dt {
				src = layout.F16
			}
			layout.LoadRowF32(x, src, kernels.TensorFromF32(src, rows[i], H*D).Data)
			for h := 0; h < H; h++ {
				for d := 0; d < D; d++ {
					off := g.KOffset(page, entry, h, d)
					if kv == 1 {
						off = g.VOffset(page, entry, h, d)
					}
					want := enc(x[h*D+d] / scale)
					if got := s.cache.Data[off]; got != want {
						t.Fatalf("token %d (request %d pos %d) kv %d head %d feat %d: x=%g scale=%g: cache byte %#02x, want fp8(x/scale) = %#02x (%g)",
							i, s.batch[i], s.pos[i], kv, h, d, x[h*D+d], scale, got, want, layout.LoadF32(s.dt, []byte{want}, 0))
					}
				}
			}
		}
	}
}

// dequantised returns the f32 cache holding k_scale*K_fp8 and v_scale*V_fp8.
func (s *fp8Scenario) dequantised(t *testing.T) kernels.PagedKVCache {
	g := s.geom
	g.DType = layout.F32
	c, err := kernels.NewPagedKVCache(g)
	require.NoError(t, err)
	half := int(s.geom.PlaneElements())
	for i, code := range s.cache.Data {
		scale := float32(s.kScale)
		if i/half%2 == 1 { // fused tensor: planes alternate K, V per page
			scale = float32(s.vScale)
		}
		layout.StoreF32(layout.F32, c.Data, i, layout.LoadF32(s.dt, []byte{code}, 0)*scale)
	}
	return c
}

func (s *fp8Scenario) decode(t *testing.T, be kernels.Backend, cache kernels.PagedKVCache, ks, vs float64) (o []float32, lse []float32) {
	B, Hq, D := s.q.Shape[0], s.q.Shape[1], s.q.Shape[2]
	p := &kernels.DecodeParams{Q: s.q, Cache: cache, Table: s.table,
		AttentionParams: kernels.AttentionParams{NumQOHeads: Hq, WindowLeft: -1, KScale: ks, VScale: vs},
		O:               kernels.NewTensor(layout.F32, B, Hq, D), LSE: make([]float32, B*Hq)}
	require.NoError(t, be.BatchDecode(p))
	return p.O.F32(), p.LSE
}

// compareDecode checks decode over the fp8 cache on be against the cpu
// backend's decode over the dequantised f32 cache and returns the largest
// differences.
func (s *fp8Scenario) compareDecode(t *testing.T, be, ref kernels.Backend) (dO, dLSE float64) {
	o, lse := s.decode(t, be, s.cache, s.kScale, s.vScale)
	wo, wlse := s.decode(t, ref, s.dequantised(t), 0, 0)
	for i := range wo {
		e := float64(wo[i])
		require.LessOrEqual(t, math.Abs(float64(o[i])-e), fp8Atol+fp8Rtol*math.Abs(e), "o[%d]: fp8 %g, dequantised %g", i, o[i], e)
		dO = max(dO, math.Abs(float64(o[i])-e))
	}
	for i := range wlse {
		e := float64(wlse[i])
		require.LessOrEqual(t, math.Abs(float64(lse[i])-e), fp8Atol+fp8Rtol*math.Abs(e), "lse[%d]: fp8 %g, dequantised %g", i, lse[i], e)
		dLSE = max(dLSE, math.Abs(float64(lse[i])-e))
	}
	return dO, dLSE
}

// quantEffect is the largest |o| difference between decode over the
// dequantised fp8 cache and over the original f16 values (for the log: the
// cost of fp8 storage, not a property of the kernels).
func (s *fp8Scenario) quantEffect(t *testing.T, ref kernels.Backend) float64 {
	g := s.geom
	g.DType = layout.F16
	c, err := kernels.NewPagedKVCache(g)
	require.NoError(t, err)
	for i := range s.k {
		page, entry, err := s.table.Locate(int(s.batch[i]), int(s.pos[i]), g.PageSize)
		require.NoError(t, err)
		for h := 0; h < g.NumKVHeads; h++ {
			D := g.HeadDim
			layout.StoreRowF32(c.Data[2*g.KOffset(page, entry, h, 0):], layout.F16, s.k[i][h*D:(h+1)*D])
			layout.StoreRowF32(c.Data[2*g.VOffset(page, entry, h, 0):], layout.F16, s.v[i][h*D:(h+1)*D])
		}
	}
	o16, _ := s.decode(t, ref, c, 0, 0)
	o8, _ := s.decode(t, ref, s.dequantised(t), 0, 0)
	worst := 0.0
	for i := range o16 {
		worst = max(worst, math.Abs(float64(o16[i]-o8[i])))
	}
	return worst
}
