package cpu

import (
	"math"
	"sort"
	"sync"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// Batch decode and batch prefill over a paged cache.
//
// Both run the same loop. Work is split into tasks of (a block of query
// rows, one kv head); a task takes the Hq/Hkv query heads that share the kv
// head (the GQA group) for each of its rows, walks the keys of the request
// page by page, widens each K row and each V row to float32 once, and folds
// it into every query of the block that may see it with an online softmax
// ([onlineState]). So a task reads each K/V row of its request once, keeps
// O(rows*group*head_dim) scratch whatever the sequence length, and computes
// in float32 from any cache dtype.
//
// Every query row sees a contiguous key interval [lo, hi) (bottom-right
// causal and the left window both cut an interval), so masking is two
// comparisons per (row, key).

// decodeRowsPerTask and prefillQueriesPerTask size the tasks: decode rows
// belong to different requests (nothing to share), prefill rows of one
// request share K/V, so a prefill task takes about 64 (row, head) queries.
const prefillQueriesPerTask = 64

// attnJob is one validated decode or prefill call in the form the workers use.
type attnJob struct {
	q        []byte
	qdt      layout.DType
	nnz      int // rows of q
	hq, hkv  int
	group    int // hq / hkv
	headDim  int
	cacheDT  layout.DType
	kbuf     []byte // the K view: element offset page*stridePage + head*strideH + entry*strideN
	vbuf     []byte // the V view, same strides
	pageSize int
	strideP  int64
	strideN  int64
	strideH  int64

	kvIndptr, kvIndices, kvLastPageLen []int32
	qoIndptr                           []int32 // nil for decode: row b is request b's only query

	causal bool
	window int

	qScale   float32 // q is multiplied by this on load
	softCap  bool
	capLog2e float32 // cap*log2(e): logit2 = capLog2e*tanh(x/cap)
	invCap   float32
	vScale   float32

	o   []byte
	odt layout.DType
	lse []float32

	rowsPerTask int
}

func newAttnJob(q kernels.Tensor, cache *kernels.PagedKVCache, table *kernels.PageTable, ap *kernels.AttentionParams, o kernels.Tensor, lse []float32) attnJob {
	g := cache.Geometry
	j := attnJob{
		q: q.Data, qdt: q.DType, nnz: q.Shape[0], hq: q.Shape[1], hkv: g.NumKVHeads, headDim: g.HeadDim,
		cacheDT: g.DType, pageSize: g.PageSize,
		strideP: g.StridePage(), strideN: g.StrideN(), strideH: g.StrideH(),
		kvIndptr: table.KVIndptr, kvIndices: table.KVIndices, kvLastPageLen: table.KVLastPageLen,
		window: ap.WindowLeft, vScale: float32(ap.EffectiveVScale()),
		o: o.Data, odt: o.DType, lse: lse,
	}
	j.group = j.hq / j.hkv
	es := int64(g.DType.Size())
	j.kbuf = cache.KBuf()
	j.vbuf = cache.VBuf()
	if g.Form == layout.Fused {
		j.vbuf = j.vbuf[g.PlaneElements()*es:] // V = [:, 1] starts one plane after K
	}
	scale := ap.EffectiveSMScale(g.HeadDim)
	if ap.LogitsSoftCap > 0 {
		j.softCap = true
		j.qScale = float32(scale)
		j.capLog2e = float32(ap.LogitsSoftCap * math.Log2E)
		j.invCap = float32(1 / ap.LogitsSoftCap)
	} else {
		j.qScale = float32(scale * math.Log2E) // work in the base-2 domain, as FlashInfer does
	}
	return j
}

// BatchDecode implements [kernels.Backend.BatchDecode]: one query per
// request, attending its request's keys (the last WindowLeft+1 of them when
// WindowLeft >= 0).
func (b *Backend) BatchDecode(p *kernels.DecodeParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	j := newAttnJob(p.Q, &p.Cache, &p.Table, &p.AttentionParams, p.O, p.LSE)
	j.rowsPerTask = 1
	b.runAttention(&j)
	return nil
}

// BatchPrefill implements [kernels.Backend.BatchPrefill]: ragged queries,
// bottom-right causal when Causal, left window when WindowLeft >= 0.
func (b *Backend) BatchPrefill(p *kernels.PrefillParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	j := newAttnJob(p.Q, &p.Cache, &p.Table, &p.AttentionParams, p.O, p.LSE)
	j.qoIndptr = p.QOIndptr
	j.causal = p.Causal
	j.rowsPerTask = max(1, prefillQueriesPerTask/j.group)
	b.runAttention(&j)
	return nil
}

func (b *Backend) runAttention(j *attnJob) {
	blocks := (j.nnz + j.rowsPerTask - 1) / j.rowsPerTask
	b.parallelFor(blocks*j.hkv, func(task int) {
		sc := attnScratchPool.Get().(*attnScratch)
		j.runTask(sc, task/j.hkv, task%j.hkv)
		attnScratchPool.Put(sc)
	})
}

// attnScratch is one worker's scratch for one task; tasks borrow it from
// attnScratchPool, so steady-state calls allocate none.
type attnScratch struct {
	q      []float32 // [queries][head_dim], pre-scaled
	acc    []float32 // [queries][head_dim]
	st     []onlineState
	lo, hi []int // [rows] visible key interval [lo, hi)
	krow   []float32
	vrow   []float32
	out    []float32
	s      []float32 // [queries] logits of the current key; NaN-free
}

var attnScratchPool = sync.Pool{New: func() any { return new(attnScratch) }}

func growF(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

func (sc *attnScratch) reserve(rows, queries, d int) {
	sc.q = growF(sc.q, queries*d)
	sc.acc = growF(sc.acc, queries*d)
	sc.s = growF(sc.s, queries)
	if cap(sc.st) < queries {
		sc.st = make([]onlineState, queries)
	}
	sc.st = sc.st[:queries]
	if cap(sc.lo) < rows {
		sc.lo, sc.hi = make([]int, rows), make([]int, rows)
	}
	sc.lo, sc.hi = sc.lo[:rows], sc.hi[:rows]
	sc.krow = growF(sc.krow, d)
	sc.vrow = growF(sc.vrow, d)
	sc.out = growF(sc.out, d)
}

// requestOf returns the request whose queries include row r.
func (j *attnJob) requestOf(r int) int {
	if j.qoIndptr == nil {
		return r
	}
	B := len(j.qoIndptr) - 1
	// First request b with qoIndptr[b+1] > r (skips requests with no queries).
	return sort.Search(B, func(b int) bool { return int(j.qoIndptr[b+1]) > r })
}

func (j *attnJob) qoRange(b int) (start, end int) {
	if j.qoIndptr == nil {
		return b, b + 1
	}
	return int(j.qoIndptr[b]), int(j.qoIndptr[b+1])
}

func (j *attnJob) seqLen(b int) int {
	pages := int(j.kvIndptr[b+1] - j.kvIndptr[b])
	if pages == 0 {
		return 0
	}
	return (pages-1)*j.pageSize + int(j.kvLastPageLen[b])
}

// runTask handles rows [block*rowsPerTask, ...) for kv head kvh, one request
// segment at a time.
func (j *attnJob) runTask(sc *attnScratch, block, kvh int) {
	r := block * j.rowsPerTask
	end := min(r+j.rowsPerTask, j.nnz)
	b := j.requestOf(r)
	for r < end {
		_, qoEnd := j.qoRange(b)
		segEnd := min(end, qoEnd)
		if segEnd > r {
			j.runSegment(sc, b, kvh, r, segEnd)
			r = segEnd
		}
		b++
	}
}

// runSegment computes rows [r0, r1) of request b (all query heads of kv
// head kvh).
func (j *attnJob) runSegment(sc *attnScratch, b, kvh, r0, r1 int) {
	D, g := j.headDim, j.group
	rows := r1 - r0
	nq := rows * g
	sc.reserve(rows, nq, D)
	qoStart, qoEnd := j.qoRange(b)
	qoLen, kvLen := qoEnd-qoStart, j.seqLen(b)

	// Visible interval of each row, and the union [jlo, jhi).
	jlo, jhi := kvLen, 0
	for ri := 0; ri < rows; ri++ {
		p := (r0 + ri - qoStart) + kvLen - qoLen // absolute position, bottom-right aligned
		lo, hi := 0, kvLen
		if j.causal {
			hi = min(hi, p+1)
		}
		if j.window >= 0 {
			lo = max(lo, p-j.window)
		}
		if hi < lo {
			hi = lo
		}
		sc.lo[ri], sc.hi[ri] = lo, hi
		if lo < hi {
			jlo, jhi = min(jlo, lo), max(jhi, hi)
		}
	}

	// Load the queries of the block, pre-scaled.
	qes := j.qdt.Size()
	for ri := 0; ri < rows; ri++ {
		for gh := 0; gh < g; gh++ {
			qi := ri*g + gh
			off := ((r0+ri)*j.hq + kvh*g + gh) * D
			qrow := sc.q[qi*D : (qi+1)*D]
			layout.LoadRowF32(qrow, j.qdt, j.q[off*qes:])
			scaleInPlace(j.qScale, qrow)
			clear(sc.acc[qi*D : (qi+1)*D])
			sc.st[qi] = onlineState{m: negInf}
		}
	}

	es := int64(j.cacheDT.Size())
	pageBase := int(j.kvIndptr[b])
	for t := jlo; t < jhi; {
		// All keys of this page in [t, jhi).
		page := int64(j.kvIndices[pageBase+t/j.pageSize])
		entry := t % j.pageSize
		stop := min(jhi, t-entry+j.pageSize)
		base := page*j.strideP + int64(kvh)*j.strideH
		for ; t < stop; t, entry = t+1, entry+1 {
			off := (base + int64(entry)*j.strideN) * es
			layout.LoadRowF32(sc.krow, j.cacheDT, j.kbuf[off:])
			seen := false
			for ri := 0; ri < rows; ri++ {
				if t < sc.lo[ri] || t >= sc.hi[ri] {
					continue
				}
				seen = true
				for gh := 0; gh < g; gh++ {
					qi := ri*g + gh
					x := dot(sc.q[qi*D:(qi+1)*D], sc.krow)
					if j.softCap {
						x = j.capLog2e * float32(math.Tanh(float64(x*j.invCap)))
					}
					sc.s[qi] = x
				}
			}
			if !seen {
				continue
			}
			layout.LoadRowF32(sc.vrow, j.cacheDT, j.vbuf[off:])
			for ri := 0; ri < rows; ri++ {
				if t < sc.lo[ri] || t >= sc.hi[ri] {
					continue
				}
				for gh := 0; gh < g; gh++ {
					qi := ri*g + gh
					sc.st[qi].update(sc.s[qi], sc.vrow, sc.acc[qi*D:(qi+1)*D])
				}
			}
		}
	}

	oes := j.odt.Size()
	for ri := 0; ri < rows; ri++ {
		for gh := 0; gh < g; gh++ {
			qi := ri*g + gh
			h := kvh*g + gh
			lse := sc.st[qi].finish(sc.out, sc.acc[qi*D:(qi+1)*D], j.vScale)
			off := ((r0+ri)*j.hq + h) * D
			layout.StoreRowF32(j.o[off*oes:], j.odt, sc.out)
			if j.lse != nil {
				j.lse[(r0+ri)*j.hq+h] = lse
			}
		}
	}
}
