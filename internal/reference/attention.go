package reference

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/pagedkv/pagedkv/layout"
)

// This file is the float64 model of FlashInfer's attention over a paged KV
// cache: batch decode, batch prefill (ragged queries), MLA decode, the merge
// of attention states and multi-level cascade attention. It is slow and
// dense on purpose: every request's keys and values are first gathered into
// plain [token][head][feature] slices with offset arithmetic written out here
// (not taken from package layout), then each query row is a two-pass softmax
// over the keys its mask lets it see. Element decoding is also written out
// here, so a wrong conversion table in the code under test shows up.

// Float decodes element i (an element index, not a byte offset) of a
// little-endian buffer of dtype dt into float64. The value is exact: every
// dtype here embeds in float64.
func Float(dt layout.DType, data []byte, i int64) float64 {
	switch dt {
	case layout.F32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:])))
	case layout.F16:
		return ieeeFloat(uint32(binary.LittleEndian.Uint16(data[2*i:])), 5, 10)
	case layout.BF16:
		// bf16 is the top half of a float32.
		return float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(data[2*i:])) << 16))
	case layout.E4M3:
		b := data[i]
		sign := 1.0
		if b&0x80 != 0 {
			sign = -1
		}
		exp, mant := int(b>>3)&0xf, float64(b&7)
		switch {
		case exp == 15 && mant == 7: // e4m3fn has NaN but no infinity
			return math.NaN()
		case exp == 0:
			return sign * math.Ldexp(mant, -9)
		}
		return sign * math.Ldexp(8+mant, exp-10)
	case layout.E5M2:
		return ieeeFloat(uint32(data[i]), 5, 2)
	}
	panic(fmt.Sprintf("reference: Float of dtype %v", dt))
}

// ieeeFloat decodes x, an IEEE 754 binary format of 1 sign bit, e exponent
// bits (bias 2^(e-1)-1) and m mantissa bits, with infinities and NaN (f16:
// e = 5, m = 10; e5m2: e = 5, m = 2).
func ieeeFloat(x uint32, e, m int) float64 {
	sign := 1.0
	if x>>(e+m)&1 != 0 {
		sign = -1
	}
	bias := 1<<(e-1) - 1
	exp, mant := int(x>>m)&(1<<e-1), float64(x&(1<<m-1))
	switch exp {
	case 0: // zero or subnormal: mant * 2^(1-bias-m)
		return sign * math.Ldexp(mant, 1-bias-m)
	case 1<<e - 1:
		if mant != 0 {
			return math.NaN()
		}
		return math.Inf(int(sign))
	}
	return sign * math.Ldexp(float64(int(1)<<m)+mant, exp-bias-m)
}

// Floats decodes a whole buffer of n elements.
func Floats(dt layout.DType, data []byte) []float64 {
	n := len(data) / dt.Size()
	out := make([]float64, n)
	for i := range out {
		out[i] = Float(dt, data, int64(i))
	}
	return out
}

// Rows3 reshapes a flat [a*b*c] slice into [a][b][c] (copying).
func Rows3(flat []float64, a, b, c int) [][][]float64 {
	if len(flat) != a*b*c {
		panic(fmt.Sprintf("reference: Rows3 of %d values as [%d,%d,%d]", len(flat), a, b, c))
	}
	out := make([][][]float64, a)
	for i := range out {
		out[i] = make([][]float64, b)
		for j := range out[i] {
			out[i][j] = append([]float64(nil), flat[(i*b+j)*c:(i*b+j+1)*c]...)
		}
	}
	return out
}

// Flat3 flattens [a][b][c] into one [a*b*c] slice, row-major: the inverse
// of [Rows3].
func Flat3(x [][][]float64) []float64 {
	var out []float64
	for _, a := range x {
		for _, b := range a {
			out = append(out, b...)
		}
	}
	return out
}

// Flat2 flattens [a][b] into one [a*b] slice, row-major.
func Flat2(x [][]float64) []float64 {
	var out []float64
	for _, a := range x {
		out = append(out, a...)
	}
	return out
}

// PagedKV is a paged GQA/MHA cache in the reference's own terms. Fused means
// one [pages, 2, ...] tensor in Data (K = [:,0], V = [:,1]); otherwise K and
// V are separate [pages, ...] buffers. Within a page, NHD stores
// [page_size, heads, head_dim] and HND stores [heads, page_size, head_dim].
type PagedKV struct {
	Layout     layout.KVLayout
	Form       layout.TensorForm
	DType      layout.DType
	NumPages   int
	PageSize   int
	NumKVHeads int
	HeadDim    int
	Data, K, V []byte
	// SF (Fused) or KSF and VSF (Split) are an NVFP4 cache's e4m3 block
	// scales (FlashInfer's kv_cache_sf); see nvfp4.go.
	SF, KSF, VSF []byte
}

// At returns element feat of head head of the token in (page, entry); kv is 0
// for K and 1 for V. For NVFP4 it is e2m1 * block scale.
func (c PagedKV) At(kv, page, entry, head, feat int) float64 {
	if c.DType == layout.NVFP4 {
		return c.nvfp4At(Slot{KV: kv, Page: page, Entry: entry, Head: head, Feat: feat})
	}
	N, H, D := int64(c.PageSize), int64(c.NumKVHeads), int64(c.HeadDim)
	// Index of the [N,H,D] or [H,N,D] block this element is in, then the
	// position inside that block.
	var block int64
	buf := c.Data
	if c.Form == layout.Fused {
		block = int64(page)*2 + int64(kv)
	} else {
		block = int64(page)
		buf = c.K
		if kv == 1 {
			buf = c.V
		}
	}
	var inBlock int64
	if c.Layout == layout.NHD {
		inBlock = (int64(entry)*H+int64(head))*D + int64(feat)
	} else {
		inBlock = (int64(head)*N+int64(entry))*D + int64(feat)
	}
	return Float(c.DType, buf, block*N*H*D+inBlock)
}

// SeqLen is FlashInfer's get_length: 0 for a request without pages, else
// (pages-1)*page_size + last_page_len.
func SeqLen(kvIndptr, kvLastPageLen []int32, pageSize, b int) int {
	np := int(kvIndptr[b+1] - kvIndptr[b])
	if np == 0 {
		return 0
	}
	return (np-1)*pageSize + int(kvLastPageLen[b])
}

// Gather returns request b's keys and values as [token][head][feat], token t
// read from entry t%page_size of page kvPageIndices[kvIndptr[b]+t/page_size].
func Gather(c PagedKV, kvIndptr, kvPageIndices, kvLastPageLen []int32, b int) (k, v [][][]float64) {
	return GatherLen(c, kvIndptr, kvPageIndices, b, SeqLen(kvIndptr, kvLastPageLen, c.PageSize, b))
}

// GatherLen is [Gather] with the token count given (MLA's kv_len style).
func GatherLen(c PagedKV, kvIndptr, kvPageIndices []int32, b, n int) (k, v [][][]float64) {
	k = make([][][]float64, n)
	v = make([][][]float64, n)
	for t := 0; t < n; t++ {
		page := int(kvPageIndices[int(kvIndptr[b])+t/c.PageSize])
		entry := t % c.PageSize
		k[t] = make([][]float64, c.NumKVHeads)
		v[t] = make([][]float64, c.NumKVHeads)
		for h := 0; h < c.NumKVHeads; h++ {
			k[t][h] = make([]float64, c.HeadDim)
			v[t][h] = make([]float64, c.HeadDim)
			for d := 0; d < c.HeadDim; d++ {
				k[t][h][d] = c.At(0, page, entry, h, d)
				v[t][h][d] = c.At(1, page, entry, h, d)
			}
		}
	}
	return k, v
}

// Logits are the scalar parameters of the logit transform and the masks.
type Logits struct {
	// SMScale multiplies q·k (0 means 1/sqrt(head_dim)). KScale (0 means 1) is
	// folded into it, as FlashInfer folds k_scale into sm_scale.
	SMScale, KScale float64
	// SoftCap > 0 maps a scaled logit s to SoftCap*tanh(s/SoftCap).
	SoftCap float64
	// VScale (0 means 1) multiplies the output, not the LSE.
	VScale float64
	// WindowLeft >= 0 keeps keys j >= p - WindowLeft for a query at absolute
	// position p; -1 keeps everything.
	WindowLeft int
	// Causal keeps keys j <= p.
	Causal bool
	// Sinks, when not nil, holds one sink logit per query head (FlashInfer's
	// `sinks`): a logit in the domain of the scaled, capped s_j (no scale or
	// cap applies to it) that joins the softmax and carries no value.
	Sinks []float64
}

func orOne(x float64) float64 {
	if x == 0 {
		return 1
	}
	return x
}

// Visible reports whether query row i of a request with qoLen queries and
// kvLen keys sees key j. The query sits at absolute position
// p = i + kvLen - qoLen (bottom-right alignment).
func Visible(i, j, qoLen, kvLen int, causal bool, windowLeft int) bool {
	p := i + kvLen - qoLen
	if causal && j > p {
		return false
	}
	if windowLeft >= 0 && j < p-windowLeft {
		return false
	}
	return j >= 0 && j < kvLen
}

// Attend is one query row over a list of keys: it returns
// o = sum_j softmax(s)_j * v_j and lse = log2(sum_j exp(s_j)) over the keys
// with visible[j], where s_j = cap*tanh(x_j*scale/cap) (or x_j*scale without
// a cap) and x_j = q·k_j. No visible key gives o = 0, lse = -inf.
func Attend(q []float64, keys, values [][]float64, visible []bool, scale, softCap float64, dv int) (o []float64, lse float64) {
	return AttendSink(q, keys, values, visible, scale, softCap, dv, math.Inf(-1))
}

// AttendSink is Attend with an attention sink: sink (natural log, -inf for
// none) is one more logit of the softmax whose value is zero, so
// o = sum_j exp(s_j) v_j / (exp(sink) + sum_j exp(s_j)) and
// lse = log2(exp(sink) + sum_j exp(s_j)). No visible key gives o = 0 and
// lse = sink/ln 2.
func AttendSink(q []float64, keys, values [][]float64, visible []bool, scale, softCap float64, dv int, sink float64) (o []float64, lse float64) {
	o = make([]float64, dv)
	s := make([]float64, len(keys))
	m := math.Inf(-1)
	for j := range keys {
		if !visible[j] {
			continue
		}
		x := 0.0
		for d := range q {
			x += q[d] * keys[j][d]
		}
		x *= scale
		if softCap > 0 {
			x = softCap * math.Tanh(x/softCap)
		}
		s[j] = x
		m = math.Max(m, x)
	}
	m = math.Max(m, sink)
	if math.IsInf(m, -1) {
		return o, m
	}
	sum := math.Exp(sink - m)
	for j := range keys {
		if visible[j] {
			sum += math.Exp(s[j] - m)
		}
	}
	for j := range keys {
		if !visible[j] {
			continue
		}
		w := math.Exp(s[j]-m) / sum
		for d := 0; d < dv; d++ {
			o[d] += w * values[j][d]
		}
	}
	return o, (m + math.Log(sum)) / math.Ln2
}

// headAttention is what every query row of a paged GQA attention shares:
// hq query heads, query head h reading kv head h/group, q·k scaled by scale
// (SMScale, or 1/sqrt(head_dim) when 0, times KScale, or 1 when 0), and the
// soft cap and VScale of lg.
type headAttention struct {
	hq, group, headDim int
	scale              float64
	lg                 Logits
}

// newHeadAttention reads hq from q [rows][Hq][D] (0 when q has no rows).
func newHeadAttention(q [][][]float64, c PagedKV, lg Logits) headAttention {
	hq := 0
	if len(q) > 0 {
		hq = len(q[0])
	}
	scale := lg.SMScale
	if scale == 0 {
		scale = 1 / math.Sqrt(float64(c.HeadDim))
	}
	scale *= orOne(lg.KScale)
	return headAttention{hq: hq, group: hq / c.NumKVHeads, headDim: c.HeadDim, scale: scale, lg: lg}
}

// row attends one query row qRow [Hq][D] over keys k and values v
// ([token][kv head][feat]) where visible[j] lets it see key j, and returns
// o [Hq][D] (multiplied by VScale) and lse [Hq] (base 2, without VScale).
func (a headAttention) row(qRow [][]float64, k, v [][][]float64, visible []bool) (o [][]float64, lse []float64) {
	o = make([][]float64, a.hq)
	lse = make([]float64, a.hq)
	for h := 0; h < a.hq; h++ {
		kh, vh := headRows(k, h/a.group), headRows(v, h/a.group)
		sink := math.Inf(-1)
		if a.lg.Sinks != nil {
			sink = a.lg.Sinks[h]
		}
		o[h], lse[h] = AttendSink(qRow[h], kh, vh, visible, a.scale, a.lg.SoftCap, a.headDim, sink)
		for d := range o[h] {
			o[h][d] *= orOne(a.lg.VScale)
		}
	}
	return o, lse
}

// BatchPrefill is batch prefill over a paged cache: q is [nnz_qo][Hq][D];
// request b's queries are rows qoIndptr[b]:qoIndptr[b+1], the last qo_len
// tokens of its kv_len keys. Query head h reads kv head h/(Hq/H). It returns
// o [nnz_qo][Hq][D] and lse [nnz_qo][Hq] (base 2).
func BatchPrefill(q [][][]float64, qoIndptr []int32, c PagedKV, kvIndptr, kvPageIndices, kvLastPageLen []int32, lg Logits) (o [][][]float64, lse [][]float64) {
	heads := newHeadAttention(q, c, lg)
	o = make([][][]float64, len(q))
	lse = make([][]float64, len(q))
	for b := 0; b+1 < len(qoIndptr); b++ {
		k, v := Gather(c, kvIndptr, kvPageIndices, kvLastPageLen, b)
		qoLen, kvLen := int(qoIndptr[b+1]-qoIndptr[b]), len(k)
		for i := 0; i < qoLen; i++ {
			r := int(qoIndptr[b]) + i
			visible := make([]bool, kvLen)
			for j := range visible {
				visible[j] = Visible(i, j, qoLen, kvLen, lg.Causal, lg.WindowLeft)
			}
			o[r], lse[r] = heads.row(q[r], k, v, visible)
		}
	}
	return o, lse
}

// BatchDecode is batch decode: one query per request (q [B][Hq][D]), which
// sits after all of its request's keys. It is BatchPrefill with qo_len 1.
func BatchDecode(q [][][]float64, c PagedKV, kvIndptr, kvPageIndices, kvLastPageLen []int32, lg Logits) (o [][][]float64, lse [][]float64) {
	qoIndptr := make([]int32, len(q)+1)
	for i := range qoIndptr {
		qoIndptr[i] = int32(i)
	}
	lg.Causal = false // the only query is the last position; causal changes nothing
	return BatchPrefill(q, qoIndptr, c, kvIndptr, kvPageIndices, kvLastPageLen, lg)
}

func headRows(x [][][]float64, h int) [][]float64 {
	out := make([][]float64, len(x))
	for t := range x {
		out[t] = x[t][h]
	}
	return out
}

// MLACache is an MLA paged cache: ckv [pages, N, DCKV] and kpe [pages, N,
// DKPE], either one [pages, N, DCKV+DKPE] buffer (Fused, in Data; kpe starts
// DCKV elements into each row) or two buffers (CKV, KPE).
type MLACache struct {
	Form       layout.TensorForm
	DType      layout.DType
	PageSize   int
	DCKV, DKPE int
	Data       []byte
	CKV, KPE   []byte
}

func (m MLACache) row(page, entry int) (ckv, kpe []float64) {
	slot := int64(page)*int64(m.PageSize) + int64(entry)
	ckv = make([]float64, m.DCKV)
	kpe = make([]float64, m.DKPE)
	if m.Form == layout.Fused {
		base := slot * int64(m.DCKV+m.DKPE)
		for d := range ckv {
			ckv[d] = Float(m.DType, m.Data, base+int64(d))
		}
		for d := range kpe {
			kpe[d] = Float(m.DType, m.Data, base+int64(m.DCKV+d))
		}
		return ckv, kpe
	}
	for d := range ckv {
		ckv[d] = Float(m.DType, m.CKV, slot*int64(m.DCKV)+int64(d))
	}
	for d := range kpe {
		kpe[d] = Float(m.DType, m.KPE, slot*int64(m.DKPE)+int64(d))
	}
	return ckv, kpe
}

// MLADecode is MLA decode in absorbed form: for request b (kvLen[b] tokens
// in pages kvPageIndices[kvIndptr[b]:kvIndptr[b+1]]) and head h,
// s_j = (qNope[b][h]·ckv_j + qPE[b][h]·kpe_j) * smScale and
// o[b][h] = sum_j softmax(s)_j ckv_j; lse is base 2.
func MLADecode(qNope, qPE [][][]float64, c MLACache, kvIndptr, kvPageIndices, kvLen []int32, smScale float64) (o [][][]float64, lse [][]float64) {
	o = make([][][]float64, len(qNope))
	lse = make([][]float64, len(qNope))
	for b := range qNope {
		n := int(kvLen[b])
		keys := make([][]float64, n)
		vals := make([][]float64, n)
		visible := make([]bool, n)
		for t := 0; t < n; t++ {
			ckv, kpe := c.row(int(kvPageIndices[int(kvIndptr[b])+t/c.PageSize]), t%c.PageSize)
			keys[t] = append(append([]float64(nil), ckv...), kpe...)
			vals[t] = ckv
			visible[t] = true
		}
		o[b] = make([][]float64, len(qNope[b]))
		lse[b] = make([]float64, len(qNope[b]))
		for h := range qNope[b] {
			q := append(append([]float64(nil), qNope[b][h]...), qPE[b][h]...)
			o[b][h], lse[b][h] = Attend(q, keys, vals, visible, smScale, 0, c.DCKV)
		}
	}
	return o, lse
}

// MergeState merges two attention states with base-2 LSEs: weights
// 2^sa and 2^sb. (anything, -inf) is the identity; two -inf states give
// (0, -inf).
func MergeState(va []float64, sa float64, vb []float64, sb float64) (v []float64, s float64) {
	return MergeStates([][]float64{va, vb}, []float64{sa, sb}, len(va))
}

// MergeStates merges n states: s = log2 sum_i 2^{s_i},
// v = sum_i 2^{s_i - s} v_i. No state (or only -inf states) gives (0, -inf).
func MergeStates(vs [][]float64, ss []float64, d int) (v []float64, s float64) {
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
	for i, x := range ss {
		w := math.Exp2(x-m) / sum
		for k := range v {
			v[k] += w * vs[i][k]
		}
	}
	return v, m + math.Log2(sum)
}

// CascadeLevel is one level of multi-level cascade attention: QOIndptr
// splits the query rows into groups, and the CSR page table gives each
// group's own KV segment at this level.
type CascadeLevel struct {
	QOIndptr, KVIndptr, KVPageIndices, KVLastPageLen []int32
}

// Cascade is multi-level cascade attention computed directly: query row r
// attends, in one softmax, every key of the group that contains r on every
// level; on the last level only, and only when lg.Causal, keys are masked
// bottom-right within that group (row i of a group with qo_len rows and
// kv_len keys sees key j <= i + kv_len - qo_len). The window is not applied
// (FlashInfer would apply it per level). It returns o [nnz][Hq][D] and
// lse [nnz][Hq].
func Cascade(q [][][]float64, levels []CascadeLevel, c PagedKV, lg Logits) (o [][][]float64, lse [][]float64) {
	heads := newHeadAttention(q, c, lg)
	o = make([][][]float64, len(q))
	lse = make([][]float64, len(q))
	for r := range q {
		var k, v [][][]float64
		var visible []bool
		for l, lv := range levels {
			g := 0
			for int(lv.QOIndptr[g+1]) <= r {
				g++
			}
			gk, gv := Gather(c, lv.KVIndptr, lv.KVPageIndices, lv.KVLastPageLen, g)
			qoLen, i := int(lv.QOIndptr[g+1]-lv.QOIndptr[g]), r-int(lv.QOIndptr[g])
			for j := range gk {
				visible = append(visible, l < len(levels)-1 || Visible(i, j, qoLen, len(gk), lg.Causal, -1))
			}
			k, v = append(k, gk...), append(v, gv...)
		}
		o[r], lse[r] = heads.row(q[r], k, v, visible)
	}
	return o, lse
}
