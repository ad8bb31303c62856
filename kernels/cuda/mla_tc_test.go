//go:build cgo

package cuda_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/cpuemu"
	"github.com/pagedkv/pagedkv/internal/reference"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cuda"
	"github.com/pagedkv/pagedkv/layout"
)

// mlaTCCase is one MLA decode of TestMLADecodeKernels: the cache, heads,
// dtypes and key counts, the emulator's plan (SMs, MaxChunkTokens) and the
// kernels it must launch.
type mlaTCCase struct {
	KV, Q, O    layout.DType
	Form        layout.TensorForm
	PageSize, H int
	CKV, KPE    int
	Lens        []int
	SMs, Chunk  int
	Want        []string
	SMScale     float64
}

func (c mlaTCCase) String() string {
	return fmt.Sprintf("kv%v-q%v-o%v-%v-N%d-H%d-%d+%d-lens%v-sms%d-chunk%d", c.KV, c.Q, c.O, c.Form, c.PageSize, c.H,
		c.CKV, c.KPE, c.Lens, c.SMs, c.Chunk)
}

// runMLATC builds a random cache (scattered pages, NaN in every slot no
// request owns), runs MLA decode on the emulator behind a recording
// CountingDriver and checks o and lse against the float64 reference and the
// launched kernels against c.Want.
func runMLATC(t *testing.T, c mlaTCCase, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 0x3a))
	B := len(c.Lens)
	var indptr, indices []int32
	indptr = append(indptr, 0)
	pages := 0
	for _, n := range c.Lens {
		pages += (n + c.PageSize - 1) / c.PageSize
	}
	pages++ // one page no request owns
	perm := rng.Perm(pages)
	next := 0
	for _, n := range c.Lens {
		for range (n + c.PageSize - 1) / c.PageSize {
			indices = append(indices, int32(perm[next]))
			next++
		}
		indptr = append(indptr, int32(len(indices)))
	}
	g := layout.MLA{Form: c.Form, DType: c.KV, NumPages: pages, PageSize: c.PageSize, HeadDimCKV: c.CKV, HeadDimKPE: c.KPE}
	cache, err := kernels.NewMLACache(g)
	require.NoError(t, err)
	nan := float32(math.NaN())
	for p := range pages {
		for e := range c.PageSize {
			for d := range c.CKV {
				layout.StoreF32(c.KV, cache.CKVBuf(), int(g.CKVOffset(p, e, d)), nan)
			}
			for d := range c.KPE {
				layout.StoreF32(c.KV, cache.KPEBuf(), int(g.KPEOffset(p, e, d)), nan)
			}
		}
	}
	kvLen := make([]int32, B)
	for b, n := range c.Lens {
		kvLen[b] = int32(n)
		for tok := range n {
			p, e := int(indices[int(indptr[b])+tok/c.PageSize]), tok%c.PageSize
			for d := range c.CKV {
				layout.StoreF32(c.KV, cache.CKVBuf(), int(g.CKVOffset(p, e, d)), float32(2*rng.Float64()-1))
			}
			for d := range c.KPE {
				layout.StoreF32(c.KV, cache.KPEBuf(), int(g.KPEOffset(p, e, d)), float32(2*rng.Float64()-1))
			}
		}
	}
	randT := func(dt layout.DType, d int) kernels.Tensor {
		v := make([]float32, B*c.H*d)
		for i := range v {
			v[i] = float32(2*rng.Float64() - 1)
		}
		return kernels.TensorFromF32(dt, v, B, c.H, d)
	}
	p := &kernels.MLADecodeParams{QNope: randT(c.Q, c.CKV), QPE: randT(c.Q, c.KPE), Cache: cache,
		KVIndptr: indptr, KVPageIndices: indices, KVLen: kvLen, NumHeads: c.H, SMScale: c.SMScale,
		O: kernels.NewTensor(c.O, B, c.H, c.CKV), LSE: make([]float32, B*c.H)}
	b, cd := countingEmu(cpuemu.Config{NumSMs: c.SMs, MaxChunkTokens: c.Chunk})
	cd.Record = true
	require.NoError(t, b.MLADecode(p), "%v", c)
	var got []string
	for _, l := range cd.Launches() {
		got = append(got, l.Kernel)
		if strings.HasPrefix(l.Kernel, "mla_decode_tc_") { // mla_tc.cu's Smem<KV>::kBytes (static_assert there)
			assert.Equal(t, map[bool]int{true: 23072, false: 41504}[c.KV.Size() == 1], l.Shared, "%v: dynamic shared memory", c)
		}
	}
	assert.Equal(t, c.Want, got, "%v: launched kernels", c)
	assert.Equal(t, c.Want[0], cuda.MLAKernelFor(g, c.Q, c.Q, c.O), "%v: MLAKernelFor", c)

	ref := reference.MLACache{Form: g.Form, DType: g.DType, PageSize: g.PageSize, DCKV: g.HeadDimCKV, DKPE: g.HeadDimKPE,
		Data: cache.Data, CKV: cache.CKV, KPE: cache.KPE}
	qn := reference.Rows3(reference.Floats(c.Q, p.QNope.Data), B, c.H, c.CKV)
	qp := reference.Rows3(reference.Floats(c.Q, p.QPE.Data), B, c.H, c.KPE)
	wo, wl := reference.MLADecode(qn, qp, ref, indptr, indices, kvLen, c.SMScale)
	atol, rtol := outTol(c.O)
	o, w := p.O.F32(), reference.Flat3(wo)
	bad := 0
	for i := range w {
		if !(math.Abs(float64(o[i])-w[i]) <= atol+rtol*math.Abs(w[i])) && bad < 5 {
			bad++
			t.Errorf("%v: o[req %d, head %d, %d] = %v, want %v", c, i/(c.H*c.CKV), i/c.CKV%c.H, i%c.CKV, o[i], w[i])
		}
	}
	for i, wv := range reference.Flat2(wl) {
		gv := float64(p.LSE[i])
		ok := gv == wv || math.Abs(gv-wv) <= 1e-3+1e-4*math.Abs(wv)
		if !ok && bad < 10 {
			bad++
			t.Errorf("%v: lse[req %d, head %d] = %v, want %v", c, i/c.H, i%c.H, gv, wv)
		}
	}
}

// TestMLADecodeKernels pins which MLA decode kernel each shape launches
// (the tensor-core mla_decode_tc_* for 16-bit and fp8 caches with
// FlashInfer's 512+64 head dims, _hilo when q or o is not of the mma type,
// merge_partial_states after a split; the CUDA-core mla_decode_<kv>_c<CK>
// for f32 caches and other head dims) and checks each result against the
// float64 reference: every cache dtype, fused and split rows, page sizes 1
// to 64, head counts 1 to 128 (16 per CTA, 17 and 20 leave a partial tile),
// split-KV off, forced (chunks of 24 and 16 keys, not tile-aligned) and
// planned for a small GPU (4 SMs), and requests without keys.
func TestMLADecodeKernels(t *testing.T) {
	const merge = "merge_partial_states"
	f16, bf16, f32, e4, e5 := layout.F16, layout.BF16, layout.F32, layout.E4M3, layout.E5M2
	fused, split := layout.Fused, layout.Split
	cases := []mlaTCCase{
		{KV: f16, Q: f16, O: f16, Form: fused, PageSize: 16, H: 16, Lens: []int{37, 0, 64}, Chunk: -1, Want: []string{"mla_decode_tc_f16"}},
		{KV: bf16, Q: bf16, O: bf16, Form: split, PageSize: 1, H: 20, Lens: []int{19, 50}, Chunk: 24, Want: []string{"mla_decode_tc_bf16", merge}},
		{KV: e4, Q: f16, O: f16, Form: fused, PageSize: 64, H: 1, Lens: []int{100}, Chunk: -1, Want: []string{"mla_decode_tc_e4m3"}},
		{KV: e5, Q: bf16, O: f32, Form: split, PageSize: 2, H: 32, Lens: []int{33, 5, 0}, Chunk: 16, Want: []string{"mla_decode_tc_e5m2_hilo", merge}},
		{KV: f16, Q: f32, O: f32, Form: split, PageSize: 16, H: 128, Lens: []int{24}, Chunk: -1, Want: []string{"mla_decode_tc_f16_hilo"}},
		{KV: bf16, Q: f32, O: f32, Form: fused, PageSize: 4, H: 64, Lens: []int{70, 3}, Chunk: 24, Want: []string{"mla_decode_tc_bf16_hilo", merge}},
		{KV: e4, Q: bf16, O: bf16, Form: split, PageSize: 16, H: 17, Lens: []int{260}, SMs: 4, Want: []string{"mla_decode_tc_e4m3", merge}},
		{KV: f16, Q: bf16, O: f16, Form: fused, PageSize: 8, H: 2, Lens: []int{21}, Chunk: -1, Want: []string{"mla_decode_tc_f16"}},
		{KV: bf16, Q: f16, O: bf16, Form: split, PageSize: 8, H: 2, Lens: []int{21}, Chunk: -1, Want: []string{"mla_decode_tc_bf16_hilo"}},
		{KV: bf16, Q: bf16, O: f16, Form: split, PageSize: 8, H: 2, Lens: []int{21}, Chunk: -1, Want: []string{"mla_decode_tc_bf16_hilo"}},
		{KV: e5, Q: f16, O: f16, Form: fused, PageSize: 3, H: 16, Lens: []int{0}, Chunk: -1, Want: []string{"mla_decode_tc_e5m2"}},
		{KV: f32, Q: f32, O: f32, Form: fused, PageSize: 16, H: 16, Lens: []int{20, 7}, Want: []string{"mla_decode_f32_c16"}},
		{KV: f16, Q: f16, O: f16, Form: split, PageSize: 4, H: 20, CKV: 16, KPE: 4, Lens: []int{20, 7}, Want: []string{"mla_decode_f16_c1"}},
		{KV: bf16, Q: bf16, O: bf16, Form: fused, PageSize: 4, H: 3, CKV: 256, KPE: 64, Lens: []int{9}, Want: []string{"mla_decode_bf16_c8"}},
	}
	for i, c := range cases {
		if c.CKV == 0 {
			c.CKV, c.KPE = 512, 64
		}
		c.SMScale = 1 / math.Sqrt(192)
		t.Run(c.String(), func(t *testing.T) { runMLATC(t, c, uint64(i)) })
	}
}

// TestMLAStepAllocationFree pins the MLA decode step's host path on the
// tensor-core kernel, split-KV included (work items, merge_indptr, the
// launch and the merge launch): once a Step has seen a step of a shape, a
// step of that shape allocates nothing.
func TestMLAStepAllocationFree(t *testing.T) {
	for chunk, launches := range map[int]int{-1: 1, 16: 2} {
		cd := &cuda.CountingDriver{Driver: &nopDriver{}}
		b := cuda.NewWithDriver("nop", cd, cuda.Config{MaxChunkTokens: chunk})
		g := layout.MLA{Form: layout.Fused, DType: layout.F16, NumPages: 64, PageSize: 16, HeadDimCKV: 512, HeadDimKPE: 64}
		cache, err := b.NewMLACache(g)
		require.NoError(t, err)
		s, err := b.NewStep(cuda.StepLimits{MaxBatch: 8, MaxPages: 64, MaxRows: 8, MaxQOHeads: 32, MaxHeadDim: 512})
		require.NoError(t, err)
		p := &cuda.MLAStepPlan{Geometry: g, KVIndptr: []int32{0, 3, 5, 9}, KVPageIndices: []int32{1, 2, 3, 4, 5, 6, 7, 8, 9},
			Decode: true, KVLen: []int32{40, 20, 60}, NumHeads: 20, SMScale: 0.1}
		t3 := func(d int) cuda.DeviceTensor {
			x, err := b.AllocTensor(layout.F16, 3, 20, d)
			require.NoError(t, err)
			return x
		}
		qn, qp, o := t3(512), t3(64), t3(512)
		run := func() {
			require.NoError(t, s.PlanMLA(p))
			require.NoError(t, s.MLADecode(cache, qn, qp, o, cuda.DeviceTensor{}))
		}
		run()
		n := cd.Traffic().Launches
		run()
		assert.Equal(t, launches, cd.Traffic().Launches-n, "chunk %d: launches per step", chunk)
		assert.Zero(t, testing.AllocsPerRun(20, run), "chunk %d", chunk)
	}
}
