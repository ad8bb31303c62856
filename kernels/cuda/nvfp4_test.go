//go:build cgo

package cuda_test

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/cpuemu"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/layout"
)

// nvfp4Case is one NVFP4 cache filled by a quantising append of random rows
// and attended by decode and prefill.
type nvfp4Case struct {
	g          layout.Paged
	group      int
	lens, qo   []int
	src        layout.DType // append rows
	qdt, odt   layout.DType
	sinks      bool
	window     int
	causal     bool
	kScale     float64
	vScale     float64
	chunk      int // cpuemu MaxChunkTokens (0: the launcher's plan)
	amp        float64
	table      kernels.PageTable
	appendKeys int
}

func (c *nvfp4Case) String() string {
	return fmt.Sprintf("%v/%v/N%d/H%d/D%d/g%d/lens%v/qo%v/%v->%v/sinks%v/win%d/causal%v/chunk%d",
		c.g.Layout, c.g.Form, c.g.PageSize, c.g.NumKVHeads, c.g.HeadDim, c.group, c.lens, c.qo, c.qdt, c.odt, c.sinks, c.window, c.causal, c.chunk)
}

// randomNVFP4Case draws a case: the tiled prefill's head dims (64, 128,
// 256) and per-row ones (16, 48), GQA groups 1 to 8, sinks, windows and
// forced split-KV chunks.
func randomNVFP4Case(r *rand.Rand) *nvfp4Case {
	pick := func(xs ...int) int { return xs[r.IntN(len(xs))] }
	c := &nvfp4Case{
		g: layout.Paged{Layout: []layout.KVLayout{layout.NHD, layout.HND}[r.IntN(2)], Form: []layout.TensorForm{layout.Fused, layout.Split}[r.IntN(2)],
			DType: layout.NVFP4, PageSize: pick(1, 3, 16), NumKVHeads: pick(1, 2), HeadDim: pick(16, 48, 64, 128, 256)},
		group:  pick(1, 2, 4, 8),
		src:    []layout.DType{layout.F32, layout.F16, layout.BF16}[r.IntN(3)],
		qdt:    []layout.DType{layout.F32, layout.F16, layout.BF16}[r.IntN(3)],
		odt:    []layout.DType{layout.F32, layout.F16, layout.F32}[r.IntN(3)],
		sinks:  r.IntN(2) == 0,
		window: pick(-1, -1, 5, 40),
		causal: r.IntN(3) != 0,
		chunk:  pick(0, 0, 7),
		amp:    []float64{1, 1.0 / 16, 30}[r.IntN(3)],
	}
	global := func() float64 { return []float64{c.amp / (6 * 448), 1, c.amp / 6}[r.IntN(3)] }
	c.kScale, c.vScale = global(), global()
	B := 1 + r.IntN(3)
	var pages []int32
	c.table.KVIndptr = []int32{0}
	for range B {
		n := pick(1, 2+r.IntN(20), 10+r.IntN(30))
		if raceEnabled { // the CPU backend runs about tenfold slower
			n = pick(1, 2+r.IntN(12))
		}
		c.lens = append(c.lens, n)
		c.qo = append(c.qo, min(n, pick(1, 1+r.IntN(n), n)))
		np := (n + c.g.PageSize - 1) / c.g.PageSize
		for range np {
			pages = append(pages, int32(len(pages)))
		}
		c.table.KVIndptr = append(c.table.KVIndptr, int32(len(pages)))
		c.table.KVLastPageLen = append(c.table.KVLastPageLen, int32(n-(np-1)*c.g.PageSize))
		c.appendKeys += n
	}
	c.g.NumPages = len(pages) + 2 // two pages no request names: never touched
	r.Shuffle(len(pages), func(i, j int) { pages[i], pages[j] = pages[j], pages[i] })
	c.table.KVPageIndices = pages
	return c
}

// randomTensor is a [shape] tensor of dtype dt with values in [-amp, amp).
func randomTensor(r *rand.Rand, dt layout.DType, amp float64, shape ...int) kernels.Tensor {
	n := 1
	for _, s := range shape {
		n *= s
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = float32((2*r.Float64() - 1) * amp)
	}
	return kernels.TensorFromF32(dt, v, shape...)
}

// runNVFP4Case appends the case's tokens on both backends (the caches must
// come out byte for byte equal), then runs decode and prefill on both and
// returns the largest |emu - cpu| of the outputs over amp and whether an
// element differed by more than the output tolerance.
func runNVFP4Case(t *testing.T, r *rand.Rand, c *nvfp4Case) float64 {
	t.Helper()
	emu, host := cpuemu.New(cpuemu.Config{MaxChunkTokens: c.chunk}), cpu.New(cpu.Config{})
	H, D := c.g.NumKVHeads, c.g.HeadDim
	var bi, pos []int32
	for b, n := range c.lens {
		for p := range n {
			bi, pos = append(bi, int32(b)), append(pos, int32(p))
		}
	}
	key := randomTensor(r, c.src, c.amp, c.appendKeys, H, D)
	val := randomTensor(r, c.src, c.amp, c.appendKeys, H, D)
	caches := [2]kernels.PagedKVCache{}
	for i, b := range []kernels.Backend{host, emu} {
		cache, err := kernels.NewPagedKVCache(c.g)
		require.NoError(t, err)
		ap := kernels.AppendParams{Cache: cache, Table: c.table, AppendKey: key, AppendValue: val, BatchIndices: bi, Positions: pos,
			KScale: c.kScale, VScale: c.vScale}
		require.NoError(t, b.AppendPagedKVCache(&ap), "%s: append on %s", c, b.Name())
		caches[i] = ap.Cache
	}
	for i, pair := range [][2][]byte{{caches[0].Data, caches[1].Data}, {caches[0].K, caches[1].K}, {caches[0].V, caches[1].V},
		{caches[0].SF, caches[1].SF}, {caches[0].KSF, caches[1].KSF}, {caches[0].VSF, caches[1].VSF}} {
		require.True(t, bytes.Equal(pair[0], pair[1]), "%s: the emulator's append differs from the CPU backend's in %s",
			c, []string{"Data", "K", "V", "SF", "KSF", "VSF"}[i])
	}
	hq := H * c.group
	ap := kernels.AttentionParams{NumQOHeads: hq, KScale: c.kScale, VScale: c.vScale, WindowLeft: c.window}
	if c.sinks {
		ap.Sinks = make([]float32, hq)
		for h := range ap.Sinks {
			ap.Sinks[h] = float32(4*r.Float64() - 2)
		}
	}
	B := len(c.lens)
	worst := 0.0
	// compare checks the emulator's output (index 1) against the CPU's (0).
	compare := func(what string, o [2]kernels.Tensor, lse [2][]float32) {
		atol, rtol := nvfp4Tol(c.odt)
		g, w := o[1].F32(), o[0].F32()
		for i := range w {
			d := math.Abs(float64(g[i]) - float64(w[i]))
			worst = max(worst, d/c.amp)
			require.LessOrEqual(t, d, (atol+rtol*math.Abs(float64(w[i])))*c.amp, "%s: %s o[%d] emu %g cpu %g", c, what, i, g[i], w[i])
		}
		for i := range lse[0] {
			a, b := float64(lse[1][i]), float64(lse[0][i])
			require.True(t, a == b || math.Abs(a-b) <= 1e-3+1e-4*math.Abs(b), "%s: %s lse[%d] emu %g cpu %g", c, what, i, a, b)
		}
	}
	q := randomTensor(r, c.qdt, 1, B, hq, D)
	var outs [2]kernels.Tensor
	var lses [2][]float32
	for i, b := range []kernels.Backend{host, emu} {
		outs[i], lses[i] = kernels.NewTensor(c.odt, B, hq, D), make([]float32, B*hq)
		p := kernels.DecodeParams{Q: q, Cache: caches[i], Table: c.table, AttentionParams: ap, O: outs[i], LSE: lses[i]}
		require.NoError(t, b.BatchDecode(&p), "%s: decode on %s", c, b.Name())
	}
	compare("decode", outs, lses)
	qo := []int32{0}
	for _, n := range c.qo {
		qo = append(qo, qo[len(qo)-1]+int32(n))
	}
	rows := int(qo[B])
	q = randomTensor(r, c.qdt, 1, rows, hq, D)
	for i, b := range []kernels.Backend{host, emu} {
		outs[i], lses[i] = kernels.NewTensor(c.odt, rows, hq, D), make([]float32, rows*hq)
		p := kernels.PrefillParams{Q: q, QOIndptr: qo, Cache: caches[i], Table: c.table, Causal: c.causal, AttentionParams: ap,
			O: outs[i], LSE: lses[i]}
		require.NoError(t, b.BatchPrefill(&p), "%s: prefill on %s", c, b.Name())
	}
	compare("prefill", outs, lses)
	return worst
}

// nvfp4Tol is the emulator-vs-CPU tolerance of an NVFP4 output (relative to
// the values' amplitude): both attend the same dequantised values (exact in
// f32 and in f16, so the tensor cores' f16 operands lose nothing); they
// differ by summation order, and the tiled prefill by q and p rounded to
// f16 (with their rounding errors as second products when q or o is f32),
// i.e. the output tolerance of every other cache dtype (outTol).
func nvfp4Tol(odt layout.DType) (atol, rtol float64) { return outTol(odt) }

// TestNVFP4EmuMatchesCPU runs NVFP4 caches through the CUDA kernels on the
// emulator and through the CPU backend: the quantising append writes the
// same bytes (data and scale pages), and decode (the CUDA-core kernel) and
// prefill (tiled at head_dim 64/128/256, per-row decode at 16 and 48),
// with sinks, windows and forced split-KV, agree within the output
// tolerance.
func TestNVFP4EmuMatchesCPU(t *testing.T) {
	n := 16
	if raceEnabled || testing.Short() {
		n = 2
	}
	worst := 0.0
	for i := range n {
		r := rand.New(rand.NewPCG(uint64(i), 37))
		c := randomNVFP4Case(r)
		worst = max(worst, runNVFP4Case(t, r, c))
	}
	t.Logf("largest |emu - cpu| / amplitude over %d cases: %.3g", n, worst)
}
