//go:build cgo

package cuda_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/cpuemu"
	"github.com/pagedkv/pagedkv/internal/reference"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cuda"
	"github.com/pagedkv/pagedkv/layout"
)

// prefillCase is a batch prefill: the cache of a decodeCase (Lens keys per
// request) with QOLens query rows per request.
type prefillCase struct {
	decodeCase
	QOLens []int
	Causal bool
}

func (c prefillCase) String() string {
	return fmt.Sprintf("%s-qo%v-causal%v", c.decodeCase, strings.ReplaceAll(fmt.Sprint(c.QOLens), " ", ","), c.Causal)
}

// newPrefill fills the case's cache and q and returns its parameters.
func newPrefill(t *testing.T, seed uint64, c prefillCase) (kernels.PrefillParams, decodeFixture) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 78))
	f := newDecodeFixture(t, r, c.decodeCase)
	Hq, D := c.KVHeads*c.Group, c.HeadDim
	qo := []int32{0}
	for _, n := range c.QOLens {
		qo = append(qo, qo[len(qo)-1]+int32(n))
	}
	rows := int(qo[len(qo)-1])
	qv := make([]float32, rows*Hq*D)
	for i := range qv {
		qv[i] = float32(2*r.Float64() - 1)
	}
	p := kernels.PrefillParams{Q: kernels.TensorFromF32(c.Q, qv, rows, Hq, D), QOIndptr: qo, Cache: f.p.Cache,
		Table: f.p.Table, Causal: c.Causal, AttentionParams: f.p.AttentionParams,
		O: kernels.NewTensor(c.O, rows, Hq, D), LSE: make([]float32, rows*Hq)}
	return p, f
}

// checkPrefill runs the case on b and compares with internal/reference.
func checkPrefill(t *testing.T, b kernels.Backend, c prefillCase, seed uint64) {
	t.Helper()
	p, f := newPrefill(t, seed, c)
	require.NoError(t, b.BatchPrefill(&p), "%s on %s", c, b.Name())
	q := reference.Rows3(reference.Floats(c.Q, p.Q.Data), p.Q.Shape[0], p.Q.Shape[1], p.Q.Shape[2])
	wantO, wantLSE := reference.BatchPrefill(q, p.QOIndptr, f.ref, p.Table.KVIndptr, p.Table.KVPageIndices, p.Table.KVLastPageLen,
		reference.Logits{SMScale: c.SMScale, KScale: c.KScale, SoftCap: c.SoftCap, VScale: c.VScale, WindowLeft: c.WindowLeft, Causal: c.Causal})
	compareRows(t, fmt.Sprintf("%s on %s (seed %d)", c, b.Name(), seed), "row", c.O, p.O, p.LSE, wantO, wantLSE)
}

// prefillCases is the tiled kernel's random matrix: every cache dtype it
// takes with every head dim, GQA groups 1, 2, 3 (a tile of 21 rows), 4 and
// 8, page sizes 1 and 16, query chunks from 1 row to more than one tile
// (64 rows at group 1, 64/group rows else; more queries than keys too), causal or not, windows
// and soft caps, q and o in every activation dtype (so both precision
// splits run).
func prefillCases() []prefillCase {
	kvs := []layout.DType{layout.F16, layout.BF16, layout.E4M3, layout.E5M2}
	acts := []layout.DType{layout.F16, layout.F32, layout.BF16}
	dims := []int{64, 128, 256}
	groups := []struct{ heads, group int }{{2, 1}, {1, 2}, {1, 3}, {1, 4}, {2, 8}}
	shapes := []struct{ kv, qo []int }{
		{[]int{80, 0, 5}, []int{66, 0, 8}},
		{[]int{40}, []int{1}},
		{[]int{3, 75}, []int{3, 40}},
		{[]int{72}, []int{72}},
	}
	var cs []prefillCase
	i := 0
	for _, kv := range kvs {
		for _, D := range dims {
			for _, gr := range groups {
				sh := shapes[i%len(shapes)]
				// Keep the packed rows (query rows x group) of a case near
				// those of group 1, so the emulator's time stays flat: a tile
				// is 64/group rows, so every group still runs several tiles.
				qo := make([]int, len(sh.qo))
				for j, n := range sh.qo {
					qo[j] = n
					if gr.group > 1 && n > 1 {
						qo[j] = max(2, n*2/gr.group)
					}
					if D == 256 && n > 1 { // the most mma per key
						qo[j] = max(2, qo[j]/3)
					}
				}
				c := prefillCase{decodeCase: decodeCase{
					Layout: layout.KVLayout(i % 2), Form: layout.TensorForm(i / 2 % 2),
					KV: kv, Q: acts[i%3], O: acts[(i/3)%3],
					HeadDim: D, KVHeads: gr.heads, Group: gr.group,
					PageSize:   []int{1, 16}[i%2],
					Lens:       sh.kv,
					WindowLeft: []int{-1, -1, 0, 9, 50}[i%5],
				}, QOLens: qo, Causal: i%3 != 2}
				c.vary(i)
				cs = append(cs, c)
				i++
			}
		}
	}
	return cs
}

// TestPrefillTiledRandom runs the tiled tensor-core prefill over its
// matrix against the reference: the even cases unsplit, the odd ones split
// into 19-key chunks (each case once on the emulator, whose mma twin costs
// about a thousand fiber switches; a GPU runs every case both ways).
func TestPrefillTiledRandom(t *testing.T) {
	for _, b := range testBackends(t) {
		t.Run(b.label, func(t *testing.T) {
			for i, c := range prefillCases() {
				skip := (b.label == "emu" && i%2 == 1) || (b.label == "emu-split19" && i%2 == 0)
				if skip || (testing.Short() && i%4 >= 2) {
					continue
				}
				t.Run(c.String(), func(t *testing.T) { checkPrefill(t, b, c, uint64(i)) })
			}
		})
	}
}

// TestPrefillKernelSelection asserts which kernel each prefill shape
// launches (docs/kernels.md, "Prefill"): the tiled tensor-core kernel for
// f16, bf16, e4m3 and e5m2 caches with head_dim 64, 128 or 256; the per-row
// decode kernel for an f32 cache and every other head dim. Nothing else
// runs (and split-k adds merge_partial_states); decode never takes the
// tiled kernel.
func TestPrefillKernelSelection(t *testing.T) {
	tests := []struct {
		kv      layout.DType
		D       int
		group   int
		want    string
		wantDec string
	}{
		{layout.F16, 128, 4, "batch_prefill_paged_f16_d128", "batch_decode_paged_tc_f16_d128"},
		{layout.BF16, 64, 1, "batch_prefill_paged_bf16_d64", "batch_decode_paged_bf16_v2"},
		{layout.E4M3, 256, 8, "batch_prefill_paged_e4m3_d256", "batch_decode_paged_tc_e4m3_d256"},
		{layout.E5M2, 128, 3, "batch_prefill_paged_e5m2_d128", "batch_decode_paged_tc_e5m2_d128"},
		{layout.F16, 64, 2, "batch_prefill_paged_f16_d64", "batch_decode_paged_tc_f16_d64"},
		{layout.BF16, 256, 1, "batch_prefill_paged_bf16_d256", "batch_decode_paged_bf16_v8"},
		// the per-row path, stated in docs/kernels.md
		{layout.F32, 128, 4, "batch_decode_paged_f32_v4", "batch_decode_paged_f32_v4"},
		{layout.F16, 96, 2, "batch_decode_paged_f16_v4", "batch_decode_paged_f16_v4"},
		{layout.BF16, 32, 1, "batch_decode_paged_bf16_v1", "batch_decode_paged_bf16_v1"},
		{layout.E4M3, 8, 1, "batch_decode_paged_e4m3_v1", "batch_decode_paged_e4m3_v1"},
	}
	for _, tc := range tests {
		for _, split := range []int{0, 7} {
			name := fmt.Sprintf("%v-D%d-g%d-split%d", tc.kv, tc.D, tc.group, split)
			t.Run(name, func(t *testing.T) {
				b, cd := countingEmu(cpuemu.Config{MaxChunkTokens: split})
				cd.Record = true
				c := prefillCase{decodeCase: decodeCase{Layout: layout.NHD, Form: layout.Fused, KV: tc.kv, Q: layout.F16, O: layout.F16,
					HeadDim: tc.D, KVHeads: 1, Group: tc.group, PageSize: 4, Lens: []int{20, 9}, WindowLeft: -1},
					QOLens: []int{5, 2}, Causal: true}
				g := layout.Paged{Layout: c.Layout, Form: c.Form, DType: c.KV, PageSize: c.PageSize, NumKVHeads: 1, HeadDim: c.HeadDim}
				name, err := cuda.PrefillKernel(g, tc.group)
				require.NoError(t, err)
				require.Equal(t, tc.want, name)
				checkPrefill(t, b, c, 3)
				var got []string
				for _, l := range cd.Launches() {
					if l.Kernel != "append_paged_kv_cache_u16" {
						got = append(got, l.Kernel)
					}
				}
				want := []string{tc.want}
				if split > 0 {
					want = append(want, "merge_partial_states")
				}
				require.Equal(t, want, got)

				// decode of the same cache: a decode kernel (tensor-core for groups >= 2).
				f := newDecodeFixture(t, rand.New(rand.NewPCG(4, 77)), c.decodeCase)
				require.NoError(t, b.BatchDecode(&f.p))
				require.Equal(t, tc.wantDec, cd.Launches()[0].Kernel)
			})
		}
	}
	_, err := cuda.PrefillKernel(layout.Paged{DType: layout.F16, NumKVHeads: 2, HeadDim: 128}, 3)
	require.ErrorIs(t, err, kernels.ErrInvalidAttention)
}

// FuzzPrefillTiled turns bytes into a small valid prefill the tiled kernel
// takes (cache dtype, head dim 64 or 128, group 1-8, page size, up to 3
// requests of up to 40 keys and 0-44 query rows, causal, window, soft cap,
// q/o dtypes, split-k chunk) and compares the emulator with the reference.
// Every size is bounded, so memory is too.
func FuzzPrefillTiled(f *testing.F) {
	f.Add([]byte{0, 0, 0, 3, 20, 20, 1, 0, 0, 0, 0})
	f.Add([]byte{2, 1, 7, 0, 33, 40, 0, 9, 1, 1, 5, 3, 2, 7, 1})
	f.Add([]byte{3, 0, 2, 15, 1, 44, 1, 4, 0, 2, 0, 39, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		at := 0
		pick := func(n int) int {
			v := 0
			if at < len(data) {
				v = int(data[at])
			}
			at++
			return v % n
		}
		kvs := []layout.DType{layout.F16, layout.BF16, layout.E4M3, layout.E5M2}
		acts := []layout.DType{layout.F16, layout.F32, layout.BF16}
		c := prefillCase{decodeCase: decodeCase{Layout: layout.KVLayout(pick(2)), Form: layout.TensorForm(pick(2)),
			KV: kvs[pick(4)], HeadDim: []int{64, 128}[pick(2)], KVHeads: 1, Group: 1 + pick(8), PageSize: 1 + pick(16)}}
		B := 1 + pick(3)
		for range B {
			c.Lens = append(c.Lens, pick(41))
			c.QOLens = append(c.QOLens, pick(45))
		}
		c.Causal = pick(2) == 1
		c.WindowLeft = pick(50) - 1
		if pick(3) == 0 {
			c.SoftCap = 1 + float64(pick(30))
		}
		c.Q, c.O = acts[pick(3)], acts[pick(3)]
		if c.KV == layout.E4M3 || c.KV == layout.E5M2 {
			c.KScale, c.VScale = 0.25, 0.5
		}
		b := cpuemu.New(cpuemu.Config{NumSMs: 4, MaxChunkTokens: pick(24)})
		checkPrefill(t, b, c, uint64(len(data)))
	})
}

// TestPrefillTiledHugeWindow: a window wider than 2^31 keys (window_left
// is 64-bit) is no window, also for rows before the first key (more
// queries than keys: negative positions).
func TestPrefillTiledHugeWindow(t *testing.T) {
	b := cpuemu.New(cpuemu.Config{})
	for _, w := range []int{1<<31 - 1, 1<<31 + 5, 1 << 40} {
		c := prefillCase{decodeCase: decodeCase{Layout: layout.NHD, Form: layout.Fused, KV: layout.F16, Q: layout.F16, O: layout.F32,
			HeadDim: 64, KVHeads: 1, Group: 2, PageSize: 16, Lens: []int{20, 3}, WindowLeft: w},
			QOLens: []int{20, 9}, Causal: w%2 == 1}
		checkPrefill(t, b, c, uint64(w%97))
	}
}
