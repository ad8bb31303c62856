package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/safetensors"
)

// Cases the project has never seen: other seeds and sizes, written with the
// safetensors writer, with expectations computed here by slow float64
// models of FORMAT.md that share no code with the implementation.

// newCase is one generated case before it is written.
type newCase struct {
	name    string
	meta    map[string]string
	tensors []safetensors.Tensor
}

func (c *newCase) i32(name string, v []int32) {
	c.tensors = append(c.tensors, safetensors.I32Tensor(name, []int{len(v)}, v))
}

func (c *newCase) f32(name string, shape []int, v []float64) {
	f := make([]float32, len(v))
	for i, x := range v {
		f[i] = float32(x)
	}
	c.tensors = append(c.tensors, safetensors.F32Tensor(name, shape, f))
}

func (c *newCase) u8(name string, shape []int, v []byte) {
	c.tensors = append(c.tensors, safetensors.U8Tensor(name, shape, v))
}

// writeNewCases writes generated cases into dir and returns how many.
func writeNewCases(t *testing.T, dir string, seeds int) int {
	t.Helper()
	gens := []func(*rand.Rand) *newCase{genSeqLens, genBatchIndices, genPackBits, genSegmentPackBits, genMergeState, genMergeStates, genDecode, genAppend, genMask}
	n := 0
	for seed := 1; seed <= seeds; seed++ {
		for g, gen := range gens {
			c := gen(rand.New(rand.NewPCG(uint64(seed), uint64(g))))
			c.meta["format"] = "pagedkv-golden/1"
			name := fmt.Sprintf("%s_seed%d", c.meta["op"], seed)
			c.meta["case"] = name
			require.NoError(t, safetensors.WriteFile(filepath.Join(dir, name+".safetensors"), c.meta, c.tensors))
			n++
		}
	}
	return n
}

// randomLens returns b lengths in [lo, hi].
func randomLens(r *rand.Rand, b, lo, hi int) []int32 {
	out := make([]int32, b)
	for i := range out {
		out[i] = int32(lo + r.IntN(hi-lo+1))
	}
	return out
}

func prefix(lens []int32) []int32 {
	out := make([]int32, len(lens)+1)
	for i, l := range lens {
		out[i+1] = out[i] + l
	}
	return out
}

func genSeqLens(r *rand.Rand) *newCase {
	b, pageSize := 1+r.IntN(20), 1+r.IntN(64)
	pages := randomLens(r, b, 0, 9)
	last := make([]int32, b)
	want := make([]int32, b)
	for i, p := range pages {
		if p > 0 {
			last[i] = int32(1 + r.IntN(pageSize))
			want[i] = (p-1)*int32(pageSize) + last[i]
		}
	}
	c := &newCase{meta: map[string]string{"op": "get_seq_lens", "page_size": strconv.Itoa(pageSize)}}
	c.i32("in.kv_indptr", prefix(pages))
	c.i32("in.kv_last_page_len", last)
	c.i32("out.seq_lens", want)
	return c
}

func genBatchIndices(r *rand.Rand) *newCase {
	b := 1 + r.IntN(10)
	appendLens := randomLens(r, b, 0, 12)
	seqLens := make([]int32, b)
	var bi, pos []int32
	for i, a := range appendLens {
		seqLens[i] = a + int32(r.IntN(30))
		for k := int32(0); k < a; k++ {
			bi = append(bi, int32(i))
			pos = append(pos, seqLens[i]-a+k)
		}
	}
	c := &newCase{meta: map[string]string{"op": "get_batch_indices_positions", "nnz": strconv.Itoa(len(bi))}}
	c.i32("in.append_indptr", prefix(appendLens))
	c.i32("in.seq_lens", seqLens)
	c.i32("out.batch_indices", bi)
	c.i32("out.positions", pos)
	return c
}

// packModel packs bits one at a time: bit k of byte k/8 (little) or bit
// 7-k%8 (big).
func packModel(x []byte, little bool) []byte {
	out := make([]byte, (len(x)+7)/8)
	for k, v := range x {
		if v == 0 {
			continue
		}
		if little {
			out[k/8] |= 1 << (k % 8)
		} else {
			out[k/8] |= 1 << (7 - k%8)
		}
	}
	return out
}

func randomBits(r *rand.Rand, n int) []byte {
	x := make([]byte, n)
	for i := range x {
		x[i] = byte(r.IntN(2))
	}
	return x
}

func genPackBits(r *rand.Rand) *newCase {
	x := randomBits(r, r.IntN(100))
	little := r.IntN(2) == 0
	order := map[bool]string{true: "little", false: "big"}[little]
	c := &newCase{meta: map[string]string{"op": "packbits", "bitorder": order}}
	c.u8("in.x", []int{len(x)}, x)
	y := packModel(x, little)
	c.u8("out.y", []int{len(y)}, y)
	return c
}

func genSegmentPackBits(r *rand.Rand) *newCase {
	lens := randomLens(r, 1+r.IntN(6), 0, 20)
	indptr := prefix(lens)
	x := randomBits(r, int(indptr[len(lens)]))
	var y []byte
	outIndptr := []int32{0}
	for i := range lens {
		seg := packModel(x[indptr[i]:indptr[i+1]], true)
		y = append(y, seg...)
		outIndptr = append(outIndptr, int32(len(y)))
	}
	c := &newCase{meta: map[string]string{"op": "segment_packbits", "bitorder": "little"}}
	c.u8("in.x", []int{len(x)}, x)
	c.i32("in.indptr", indptr)
	c.u8("out.y", []int{len(y)}, y)
	c.i32("out.indptr", outIndptr)
	return c
}

// f32s returns n float32-representable values in [-scale, scale].
func f32s(r *rand.Rand, n int, scale float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = float64(float32((2*r.Float64() - 1) * scale))
	}
	return out
}

// mergeModel merges states (v_i, s_i) with base-2 LSEs in float64.
func mergeModel(vs [][]float64, ss []float64) (v []float64, s float64) {
	d := len(vs[0])
	v = make([]float64, d)
	m := math.Inf(-1)
	for _, x := range ss {
		m = math.Max(m, x)
	}
	if math.IsInf(m, -1) {
		return v, m
	}
	sum := 0.0
	for _, x := range ss {
		sum += math.Exp2(x - m)
	}
	s = m + math.Log2(sum)
	for i, vi := range vs {
		w := math.Exp2(ss[i] - s)
		for k := range v {
			v[k] += w * vi[k]
		}
	}
	return v, s
}

// lses returns n LSE values, some -inf (an empty state).
func lses(r *rand.Rand, n int) []float64 {
	out := f32s(r, n, 8)
	for i := range out {
		if r.IntN(6) == 0 {
			out[i] = math.Inf(-1)
		}
	}
	return out
}

func genMergeState(r *rand.Rand) *newCase {
	n, h, d := 1+r.IntN(5), 1+r.IntN(4), 1+r.IntN(40)
	va, vb := f32s(r, n*h*d, 2), f32s(r, n*h*d, 2)
	sa, sb := lses(r, n*h), lses(r, n*h)
	var v, s []float64
	for i := 0; i < n*h; i++ {
		vi, si := mergeModel([][]float64{va[i*d : (i+1)*d], vb[i*d : (i+1)*d]}, []float64{sa[i], sb[i]})
		v, s = append(v, vi...), append(s, si)
	}
	c := &newCase{meta: map[string]string{"op": "merge_state", "atol": "1e-5", "rtol": "1e-5"}}
	c.f32("in.v_a", []int{n, h, d}, va)
	c.f32("in.s_a", []int{n, h}, sa)
	c.f32("in.v_b", []int{n, h, d}, vb)
	c.f32("in.s_b", []int{n, h}, sb)
	c.f32("out.v", []int{n, h, d}, v)
	c.f32("out.s", []int{n, h}, s)
	return c
}

func genMergeStates(r *rand.Rand) *newCase {
	n, ns, h, d := 1+r.IntN(4), 1+r.IntN(6), 1+r.IntN(3), 1+r.IntN(32)
	vin, sin := f32s(r, n*ns*h*d, 2), lses(r, n*ns*h)
	var v, s []float64
	for row := 0; row < n; row++ {
		for hh := 0; hh < h; hh++ {
			var vs [][]float64
			var ss []float64
			for k := 0; k < ns; k++ {
				i := (row*ns+k)*h + hh
				vs, ss = append(vs, vin[i*d:(i+1)*d]), append(ss, sin[i])
			}
			vi, si := mergeModel(vs, ss)
			v, s = append(v, vi...), append(s, si)
		}
	}
	c := &newCase{meta: map[string]string{"op": "merge_states", "atol": "1e-5", "rtol": "1e-5"}}
	c.f32("in.v", []int{n, ns, h, d}, vin)
	c.f32("in.s", []int{n, ns, h}, sin)
	c.f32("out.v", []int{n, h, d}, v)
	c.f32("out.s", []int{n, h}, s)
	return c
}

// pagedGeometry is a random paged cache with a page table over it.
type pagedGeometry struct {
	hnd                     bool
	pages, n, heads, d      int
	kvIndptr, kvPageIndices []int32
	kvLastPageLen, seqLens  []int32
}

// newPaged assigns distinct random pages to requests of the given lengths.
func newPaged(r *rand.Rand, seqLens []int32, n, heads, d int) pagedGeometry {
	g := pagedGeometry{hnd: r.IntN(2) == 0, n: n, heads: heads, d: d, seqLens: seqLens}
	counts := make([]int32, len(seqLens))
	g.kvLastPageLen = make([]int32, len(seqLens))
	total := 0
	for i, l := range seqLens {
		if l > 0 {
			counts[i] = (l + int32(n) - 1) / int32(n)
			g.kvLastPageLen[i] = l - (counts[i]-1)*int32(n)
		}
		total += int(counts[i])
	}
	g.pages = total + r.IntN(4)
	perm := r.Perm(g.pages)
	for _, p := range perm[:total] {
		g.kvPageIndices = append(g.kvPageIndices, int32(p))
	}
	g.kvIndptr = prefix(counts)
	return g
}

func (g *pagedGeometry) shape() []int {
	if g.hnd {
		return []int{g.pages, 2, g.heads, g.n, g.d}
	}
	return []int{g.pages, 2, g.n, g.heads, g.d}
}

func (g *pagedGeometry) layout() string { return map[bool]string{true: "HND", false: "NHD"}[g.hnd] }

// offset is the element offset of K (kv=0) or V (kv=1) of token t of
// request b, head h, feature f, in the 5-D tensor.
func (g *pagedGeometry) offset(b, t, kv, h, f int) int {
	page := int(g.kvPageIndices[int(g.kvIndptr[b])+t/g.n])
	entry := t % g.n
	if g.hnd {
		return (((page*2+kv)*g.heads+h)*g.n+entry)*g.d + f
	}
	return (((page*2+kv)*g.n+entry)*g.heads+h)*g.d + f
}

func (g *pagedGeometry) tables(c *newCase) {
	c.i32("in.kv_indptr", g.kvIndptr)
	c.i32("in.kv_indices", g.kvPageIndices)
	c.i32("in.kv_last_page_len", g.kvLastPageLen)
}

func genDecode(r *rand.Rand) *newCase {
	b, kvHeads, group, d, n := 1+r.IntN(4), 1+r.IntN(2), 1+r.IntN(3), 8*(1+r.IntN(4)), 1+r.IntN(5)
	hq := kvHeads * group
	seqLens := randomLens(r, b, 0, 20) // 0: a request without pages
	g := newPaged(r, seqLens, n, kvHeads, d)
	cache := f32s(r, g.pages*2*n*kvHeads*d, 1)
	q := f32s(r, b*hq*d, 1)
	smScale := 1 / math.Sqrt(float64(d))
	window := -1
	if r.IntN(2) == 0 {
		window = r.IntN(6)
	}
	softCap := 0.0
	if r.IntN(2) == 0 {
		softCap = 1 + float64(r.IntN(30))
	}
	o := make([]float64, b*hq*d)
	lse := make([]float64, b*hq)
	for req := 0; req < b; req++ {
		L := int(seqLens[req])
		for h := 0; h < hq; h++ {
			kvh := h / group
			var logits []float64
			var keys []int
			for t := 0; t < L; t++ {
				if window >= 0 && t < L-1-window {
					continue
				}
				x := 0.0
				for f := 0; f < d; f++ {
					x += q[(req*hq+h)*d+f] * cache[g.offset(req, t, 0, kvh, f)]
				}
				s := x * smScale
				if softCap > 0 {
					s = softCap * math.Tanh(s/softCap)
				}
				logits, keys = append(logits, s), append(keys, t)
			}
			if len(keys) == 0 {
				lse[req*hq+h] = math.Inf(-1)
				continue
			}
			m := math.Inf(-1)
			for _, s := range logits {
				m = math.Max(m, s)
			}
			sum := 0.0
			for _, s := range logits {
				sum += math.Exp(s - m)
			}
			for k, t := range keys {
				p := math.Exp(logits[k]-m) / sum
				for f := 0; f < d; f++ {
					o[(req*hq+h)*d+f] += p * cache[g.offset(req, t, 1, kvh, f)]
				}
			}
			lse[req*hq+h] = (m + math.Log(sum)) / math.Ln2
		}
	}
	c := &newCase{meta: map[string]string{
		"op": "batch_decode", "kv_layout": g.layout(), "page_size": strconv.Itoa(n),
		"num_qo_heads": strconv.Itoa(hq), "num_kv_heads": strconv.Itoa(kvHeads), "head_dim": strconv.Itoa(d),
		"sm_scale": strconv.FormatFloat(smScale, 'g', -1, 64), "window_left": strconv.Itoa(window),
		"logits_soft_cap": strconv.FormatFloat(softCap, 'g', -1, 64), "atol": "1e-4", "rtol": "1e-4",
	}}
	c.f32("in.q", []int{b, hq, d}, q)
	c.f32("in.paged_kv_cache", g.shape(), cache)
	g.tables(c)
	c.f32("out.o", []int{b, hq, d}, o)
	c.f32("out.lse", []int{b, hq}, lse)
	return c
}

func genAppend(r *rand.Rand) *newCase {
	b, heads, d, n := 1+r.IntN(4), 1+r.IntN(3), 4*(1+r.IntN(8)), 1+r.IntN(8)
	before := randomLens(r, b, 0, 15)
	added := randomLens(r, b, 0, 6)
	after := make([]int32, b)
	for i := range after {
		after[i] = before[i] + added[i]
	}
	g := newPaged(r, after, n, heads, d)
	cache := f32s(r, g.pages*2*n*heads*d, 1)
	want := append([]float64(nil), cache...)
	var bi, pos []int32
	var keys, values []float64
	for req := 0; req < b; req++ {
		for t := before[req]; t < after[req]; t++ {
			bi, pos = append(bi, int32(req)), append(pos, t)
			k, v := f32s(r, heads*d, 3), f32s(r, heads*d, 3)
			keys, values = append(keys, k...), append(values, v...)
			for h := 0; h < heads; h++ {
				for f := 0; f < d; f++ {
					want[g.offset(req, int(t), 0, h, f)] = k[h*d+f]
					want[g.offset(req, int(t), 1, h, f)] = v[h*d+f]
				}
			}
		}
	}
	c := &newCase{meta: map[string]string{"op": "append_paged_kv_cache", "kv_layout": g.layout(), "page_size": strconv.Itoa(n)}}
	c.f32("in.append_key", []int{len(bi), heads, d}, keys)
	c.f32("in.append_value", []int{len(bi), heads, d}, values)
	c.i32("in.batch_indices", bi)
	c.i32("in.positions", pos)
	g.tables(c)
	c.f32("in.paged_kv_cache", g.shape(), cache)
	c.f32("out.paged_kv_cache", g.shape(), want)
	return c
}

// genMask draws block_diagonal_causal_local_from_bottomright: within block
// b, with shift = kv - q, query i sees keys i+shift-w+1 .. i+shift.
func genMask(r *rand.Rand) *newCase {
	b, w := 1+r.IntN(5), 1+r.IntN(5)
	q := randomLens(r, b, 0, 5)
	kv := make([]int32, b)
	for i := range kv {
		kv[i] = q[i] + int32(r.IntN(5))
		if kv[i] == 0 {
			kv[i] = 1
		}
	}
	qs, ks := prefix(q), prefix(kv)
	rows, cols := int(qs[b]), int(ks[b])
	allowed := make([]byte, rows*cols)
	for blk := 0; blk < b; blk++ {
		shift := int(kv[blk] - q[blk])
		for i := 0; i < int(q[blk]); i++ {
			for j := 0; j < int(kv[blk]); j++ {
				if j <= i+shift && j >= i+shift-w+1 {
					allowed[(int(qs[blk])+i)*cols+int(ks[blk])+j] = 1
				}
			}
		}
	}
	c := &newCase{meta: map[string]string{"op": "attention_mask", "mask": "block_diagonal_causal_local_from_bottomright", "window_size": strconv.Itoa(w)}}
	c.i32("in.q_seqlen", q)
	c.i32("in.kv_seqlen", kv)
	c.u8("out.allowed", []int{rows, cols}, allowed)
	return c
}
