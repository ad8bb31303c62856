package cpu

import (
	"math"
	"sort"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// Batch decode and batch prefill over a paged cache.
//
// Both run the same task split. Work is split into tasks of (a block of query
// rows, a block of kv heads); a task takes the Hq/Hkv query heads that share
// each kv head (the GQA group) for each of its rows, walks the keys of the
// request page by page and token by token, widens each K row and each V row
// to float32 once, and folds it into every query of the block that may see
// it with an online softmax ([onlineState]). So a task reads each K/V row it
// needs once, keeps O(rows*heads*head_dim) scratch whatever the sequence
// length, and computes in float32 from any cache dtype. A decode task,
// when there are enough requests, takes all kv heads, so it streams through
// each page in address order (NHD: a token's heads are contiguous), which
// the hardware prefetcher likes much better than one 2*head_dim-byte row
// per page-stride. A prefill task takes one kv head and about 64 queries of
// one request, which share every K/V row it reads.
//
// A task with a single query row (every decode task) works a page of keys
// at a time instead: it widens the page's K and V rows of its kv heads in
// address order, computes the block's logits, folds them into the online
// softmax with one maximum update per block, and accumulates four keys per
// pass over each accumulator row (runRowByPage).
//
// Every query row sees a contiguous key interval [lo, hi) (bottom-right
// causal and the left window both cut an interval), so masking is two
// comparisons per (row, key).

// prefillQueriesPerTask bounds the (row, head) queries of one prefill task:
// rows of one request share K/V, so a task takes about this many; decode
// rows belong to different requests, so a decode task has one row.
const prefillQueriesPerTask = 64

// tasksPerWorker is how many tasks per worker the split into kv-head
// blocks aims for, so that uneven requests still balance.
const tasksPerWorker = 4

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
	ksf, vsf []byte // NVFP4: the K and V scale views (byte = element offset / 16)
	es       int64  // bytes per element (0 for NVFP4: see widenAt)
	pageSize int
	strideP  int64
	strideN  int64
	strideH  int64

	kvIndptr, kvPageIndices, kvLastPageLen []int32
	qoIndptr                               []int32 // nil for decode: row b is request b's only query

	causal bool
	window int

	qScale   float32 // q is multiplied by this on load
	softCap  bool
	capLog2e float32 // cap*log2(e): logit2 = capLog2e*tanh(x/cap)
	invCap   float32
	vScale   float32
	ap       *kernels.AttentionParams // Sinks, folded in once per row at the end (sinkInto)

	o   []byte
	odt layout.DType
	lse []float32

	rowsPerTask    int
	kvHeadsPerTask int // kv heads per task: a divisor of hkv
	headBlocks     int // hkv / kvHeadsPerTask

	// Decode split by page ranges (splits > 1): partial holds, for row r,
	// split s and query head h, at ((r*splits+s)*hq+h)*(head_dim+2), the
	// split's acc, then m and l.
	splits  int
	partial []float32
}

func newAttnJob(q kernels.Tensor, cache *kernels.PagedKVCache, table *kernels.PageTable, ap *kernels.AttentionParams, o kernels.Tensor, lse []float32) attnJob {
	g := cache.Geometry
	j := attnJob{
		q: q.Data, qdt: q.DType, nnz: q.Shape[0], hq: q.Shape[1], hkv: g.NumKVHeads, headDim: g.HeadDim,
		cacheDT: g.DType, pageSize: g.PageSize,
		strideP: g.StridePage(), strideN: g.StrideN(), strideH: g.StrideH(),
		kvIndptr: table.KVIndptr, kvPageIndices: table.KVPageIndices, kvLastPageLen: table.KVLastPageLen,
		window: ap.WindowLeft, vScale: float32(ap.EffectiveVScale()), ap: ap,
		o: o.Data, odt: o.DType, lse: lse,
	}
	j.group = j.hq / j.hkv
	j.es = int64(g.DType.Size())
	j.kbuf, j.ksf = cache.KBuf(), cache.KSFBuf()
	j.vbuf, j.vsf = cache.VBuf(), cache.VSFBuf()
	if g.Form == layout.Fused && g.NumPages > 0 {
		// V = [:, 1] starts one plane after K. A pool of 0 pages has no
		// plane (and a valid table names no page of it).
		j.vbuf = j.vbuf[g.DataOffset(g.PlaneElements()):]
		if g.DType == layout.NVFP4 {
			j.vsf = j.vsf[g.ScaleOffset(g.PlaneElements()):]
		}
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

// attnCall takes a pooled call and sets it up as the attention of q over
// cache through t (newAttnJob), returning it and its job.
func (b *Backend) attnCall(q kernels.Tensor, cache *kernels.PagedKVCache, t *kernels.PageTable, ap *kernels.AttentionParams,
	o kernels.Tensor, lse []float32) (*call, *attnJob) {
	c := b.pool.get()
	c.kind = callAttn
	c.attn = newAttnJob(q, cache, t, ap, o, lse)
	return c, &c.attn
}

// BatchDecode implements [kernels.Backend.BatchDecode]: one query per
// request, attending its request's keys (the last WindowLeft+1 of them when
// WindowLeft >= 0).
func (b *Backend) BatchDecode(p *kernels.DecodeParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	c, j := b.attnCall(p.Q, &p.Cache, &p.Table, &p.AttentionParams, p.O, p.LSE)
	j.rowsPerTask = 1
	if j.splits = b.decodeSplits(j); j.splits > 1 {
		j.kvHeadsPerTask, j.headBlocks = j.hkv, 1
		n := j.nnz * j.splits * j.hq * (j.headDim + 2)
		c.partial = growF(c.partial, n)
		j.partial = c.partial
		b.pool.run(c, j.nnz*j.splits)
		sc := &c.scratch[0]
		sc.out = growF(sc.out, j.headDim)
		j.mergeSplits(sc.out)
	} else {
		j.kvHeadsPerTask = b.kvHeadsPerTask(j.nnz, j.hkv)
		b.runAttention(c)
	}
	b.pool.put(c)
	return nil
}

// BatchPrefill implements [kernels.Backend.BatchPrefill]: ragged queries,
// bottom-right causal when Causal, left window when WindowLeft >= 0.
func (b *Backend) BatchPrefill(p *kernels.PrefillParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	c, j := b.attnCall(p.Q, &p.Cache, &p.Table, &p.AttentionParams, p.O, p.LSE)
	j.qoIndptr = p.QOIndptr
	j.causal = p.Causal
	// Prefill rows of one request share each K/V row, so a task takes many
	// rows of one kv head rather than every kv head of a few rows: the
	// accumulators of ~64 queries stay in L1/L2.
	j.kvHeadsPerTask = 1
	j.rowsPerTask = max(1, prefillQueriesPerTask/j.group)
	b.runAttention(c)
	b.pool.put(c)
	return nil
}

// kvHeadsPerTask picks the largest divisor of hkv that still leaves about
// tasksPerWorker tasks per worker for rows query rows.
func (b *Backend) kvHeadsPerTask(rows, hkv int) int {
	per := hkv
	if b.workers <= 1 {
		return per // nothing to balance: read each page whole
	}
	for per > 1 && rows*(hkv/per) < tasksPerWorker*b.workers {
		per--
		for hkv%per != 0 {
			per--
		}
	}
	return per
}

// runAttention runs the tasks of c.attn: blocks of query rows times
// blocks of kv heads.
func (b *Backend) runAttention(c *call) {
	j := &c.attn
	j.headBlocks = j.hkv / j.kvHeadsPerTask
	blocks := (j.nnz + j.rowsPerTask - 1) / j.rowsPerTask
	b.pool.run(c, blocks*j.headBlocks)
}

// task runs task i of the job with scratch sc.
func (j *attnJob) task(sc *attnScratch, i int) {
	if j.splits > 1 {
		b := i / j.splits
		j.runSegment(sc, b, 0, b, b+1, i%j.splits)
		return
	}
	j.runTask(sc, i/j.headBlocks, (i%j.headBlocks)*j.kvHeadsPerTask)
}

// Long sequences: a decode of few requests is split by page ranges, each
// task taking every kv head of one request over its part of the pages
// (reading pages whole, in address order) and leaving a partial state
// (acc, m, l) per query head; mergeSplits combines them as merge_states
// does. Splitting by kv heads instead would read each page in slices.

// minSplitPages is the fewest pages a split takes: below it the merge and
// the per-task set-up cost more than a second worker saves.
const minSplitPages = 16

// decodeSplits returns how many page ranges each request of a decode on
// the given workers is split into (1: none).
func (b *Backend) decodeSplits(j *attnJob) int {
	if b.workers <= 1 || j.nnz == 0 || j.nnz >= tasksPerWorker*b.workers {
		return 1
	}
	// Twice the usual tasks per worker: splits of long sequences are big,
	// so the last one to finish decides the balance.
	want := 2 * tasksPerWorker * b.workers
	maxPages := 0
	for r := 0; r < j.nnz; r++ {
		maxPages = max(maxPages, int(j.kvIndptr[r+1]-j.kvIndptr[r]))
	}
	return max(1, min((want+j.nnz-1)/j.nnz, maxPages/minSplitPages))
}

// splitRange returns part split of the key interval [jlo, jhi), cut at
// page boundaries into j.splits nearly equal page ranges (possibly empty).
func (j *attnJob) splitRange(jlo, jhi, split int) (lo, hi int) {
	if jlo >= jhi {
		return jlo, jlo
	}
	N := j.pageSize
	p0, p1 := jlo/N, (jhi+N-1)/N
	per := (p1 - p0 + j.splits - 1) / j.splits
	lo = max(jlo, (p0+split*per)*N)
	hi = min(jhi, (p0+(split+1)*per)*N)
	if hi < lo {
		hi = lo
	}
	return lo, hi
}

// mergeSplits writes each decode row's output and LSE from its splits'
// partial states: with M the largest m, L = sum_s l_s 2^(m_s-M) and
// o = vScale * sum_s acc_s 2^(m_s-M) / L, LSE = M + log2 L.
func (j *attnJob) mergeSplits(out []float32) {
	D, S := j.headDim, j.splits
	oes := j.odt.Size()
	for r := 0; r < j.nnz; r++ {
		for h := 0; h < j.hq; h++ {
			m := negInf
			for s := 0; s < S; s++ {
				m = max(m, j.partial[((r*S+s)*j.hq+h)*(D+2)+D])
			}
			clear(out)
			l := float32(0)
			if m != negInf {
				for s := 0; s < S; s++ {
					ps := j.partial[((r*S+s)*j.hq+h)*(D+2):][:D+2]
					if ps[D] == negInf {
						continue
					}
					w := exp2Neg(ps[D] - m)
					l += w * ps[D+1]
					axpy(w, ps[:D], out)
				}
			}
			// The partial states hold no sink: it joins here, once.
			st := onlineState{m: m, l: l}
			j.sinkInto(&st, h, out)
			lse := st.finish(out, out, j.vScale)
			off := (r*j.hq + h) * D
			layout.StoreRowF32(j.o[off*oes:], j.odt, out)
			if j.lse != nil {
				j.lse[r*j.hq+h] = lse
			}
		}
	}
}

// sinkInto folds query head h's sink, if any, into the finished state
// (st, acc) of a row: one more key of logit sink*log2(e) and value zero.
// It is called once per row, on the whole row's state, never on a partial
// state that is merged later, so a sink is counted once however the keys
// are split.
func (j *attnJob) sinkInto(st *onlineState, h int, acc []float32) {
	if j.ap.Sinks != nil {
		st.weight(j.ap.SinkLog2(h), acc)
	}
}

// attnScratch is one worker's scratch for one task; each call keeps one
// per worker, so steady-state calls allocate none.
type attnScratch struct {
	q      []float32 // [queries][head_dim], pre-scaled
	acc    []float32 // [queries][head_dim]
	st     []onlineState
	lo, hi []int // [rows] visible key interval [lo, hi)
	krow   []float32
	vrow   []float32
	out    []float32
	s      []float32 // [queries] logits of the current key; NaN-free

	// One-row segments (decode) work a page of keys at a time.
	kblk, vblk []float32 // [page_size*kv heads][head_dim] widened K and V rows
	sblk       []float32 // [group][page_size] logits, then weights
}

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

// runTask handles rows [block*rowsPerTask, ...) for kv heads
// [kvh0, kvh0+kvHeadsPerTask), one request segment at a time.
func (j *attnJob) runTask(sc *attnScratch, block, kvh0 int) {
	r := block * j.rowsPerTask
	end := min(r+j.rowsPerTask, j.nnz)
	b := j.requestOf(r)
	for r < end {
		_, qoEnd := j.qoRange(b)
		segEnd := min(end, qoEnd)
		if segEnd > r {
			j.runSegment(sc, b, kvh0, r, segEnd, -1)
			r = segEnd
		}
		b++
	}
}

// runSegment computes rows [r0, r1) of request b for the query heads of kv
// heads [kvh0, kvh0+kvHeadsPerTask). Query qi = ri*qh + hh*g + gh is row
// r0+ri, query head (kvh0+hh)*g + gh, where qh = kvHeadsPerTask*g; the
// queries of one row are contiguous in sc.q, sc.acc and sc.s.
func (j *attnJob) runSegment(sc *attnScratch, b, kvh0, r0, r1, split int) {
	D, g, nkv := j.headDim, j.group, j.kvHeadsPerTask
	qh := nkv * g
	rows := r1 - r0
	sc.reserve(rows, rows*qh, D)
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
	if split >= 0 {
		jlo, jhi = j.splitRange(jlo, jhi, split)
	}

	// Load the queries of the block, pre-scaled. Query heads
	// kvh0*g .. kvh0*g+qh-1 are contiguous in q.
	qes := j.qdt.Size()
	for ri := 0; ri < rows; ri++ {
		off := ((r0+ri)*j.hq + kvh0*g) * D
		qrow := sc.q[ri*qh*D : (ri+1)*qh*D]
		widenRow(qrow, j.qdt, j.q[off*qes:])
		scaleInPlace(j.qScale, qrow)
		clear(sc.acc[ri*qh*D : (ri+1)*qh*D])
		for qi := ri * qh; qi < (ri+1)*qh; qi++ {
			sc.st[qi] = onlineState{m: negInf}
		}
	}

	if rows == 1 && j.fusedNarrow() {
		j.runRowByPageNarrow(sc, b, kvh0, jlo, jhi)
	} else if rows == 1 {
		j.runRowByPage(sc, b, kvh0, jlo, jhi)
	} else {
		j.runRowsByKey(sc, b, kvh0, rows, jlo, jhi)
	}

	if split >= 0 { // a partial state, merged by mergeSplits
		for i := 0; i < qh; i++ {
			h := kvh0*g + i
			ps := j.partial[((r0*j.splits+split)*j.hq+h)*(D+2):][:D+2]
			copy(ps, sc.acc[i*D:(i+1)*D])
			ps[D], ps[D+1] = sc.st[i].m, sc.st[i].l
		}
		return
	}
	oes := j.odt.Size()
	for ri := 0; ri < rows; ri++ {
		for i := 0; i < qh; i++ {
			qi := ri*qh + i
			h := kvh0*g + i
			j.sinkInto(&sc.st[qi], h, sc.acc[qi*D:(qi+1)*D])
			lse := sc.st[qi].finish(sc.out, sc.acc[qi*D:(qi+1)*D], j.vScale)
			off := ((r0+ri)*j.hq + h) * D
			layout.StoreRowF32(j.o[off*oes:], j.odt, sc.out)
			if j.lse != nil {
				j.lse[(r0+ri)*j.hq+h] = lse
			}
		}
	}
}

// runRowByPage folds keys [jlo, jhi) of request b into the one row's
// queries of kv heads [kvh0, kvh0+kvHeadsPerTask), a page (block of keys)
// at a time: for each kv head, widen the block's K rows, compute the
// group's logits two keys by four queries at a time, fold them into the
// online softmax with one maximum update per block, widen the V rows and
// accumulate four keys per pass over acc.
func (j *attnJob) runRowByPage(sc *attnScratch, b, kvh0, jlo, jhi int) {
	D, g, nkv, N := j.headDim, j.group, j.kvHeadsPerTask, j.pageSize
	sc.kblk = growF(sc.kblk, N*nkv*D)
	sc.vblk = growF(sc.vblk, N*nkv*D)
	sc.sblk = growF(sc.sblk, g*N)
	pageBase := int(j.kvIndptr[b])
	for t := jlo; t < jhi; {
		page := int64(j.kvPageIndices[pageBase+t/N])
		entry := t % N
		T := min(jhi, t-entry+N) - t
		off := page*j.strideP + int64(kvh0)*j.strideH + int64(entry)*j.strideN
		// Widen the block in address order; row (t, hh) lands at
		// t*ts + hh*hs of kblk/vblk.
		ts, hs := j.widenBlock(sc.kblk, j.kbuf, j.ksf, off, T)
		j.widenBlock(sc.vblk, j.vbuf, j.vsf, off, T)
		sblk := sc.sblk[:g*T]
		for hh := 0; hh < nkv; hh++ {
			q0 := hh * g
			logitsBlock(sblk, sc.q[q0*D:(q0+g)*D], sc.kblk[hh*hs:], ts, g, T, D)
			if j.softCap {
				for i, x := range sblk {
					sblk[i] = j.capLog2e * float32(math.Tanh(float64(x*j.invCap)))
				}
			}
			for gh := 0; gh < g; gh++ {
				acc := sc.acc[(q0+gh)*D : (q0+gh+1)*D]
				p := sblk[gh*T : (gh+1)*T]
				sc.st[q0+gh].weightBlock(p, acc)
				axpyBlock(acc, p, sc.vblk[hh*hs:], ts, D)
			}
		}
		t += T
	}
}

// widenBlock widens the rows of T consecutive entries and the task's kv
// heads, starting at element offset off of buf, into dst in address order,
// and returns the strides (in elements) of dst between entries and between
// heads.
func (j *attnJob) widenBlock(dst []float32, buf, sf []byte, off int64, T int) (ts, hs int) {
	D, nkv := j.headDim, j.kvHeadsPerTask
	if j.strideH == int64(D) { // NHD: an entry's heads are contiguous
		for t := 0; t < T; t++ {
			j.widenAt(dst[t*nkv*D:(t+1)*nkv*D], buf, sf, off+int64(t)*j.strideN)
		}
		return nkv * D, D
	}
	// HND: a head's entries are contiguous.
	for hh := 0; hh < nkv; hh++ {
		j.widenAt(dst[hh*T*D:(hh+1)*T*D], buf, sf, off+int64(hh)*j.strideH)
	}
	return D, T * D
}

// widenAt widens len(dst) elements of the cache view buf (with scale view sf
// for NVFP4) from element offset off, which starts a head row.
func (j *attnJob) widenAt(dst []float32, buf, sf []byte, off int64) {
	if j.cacheDT == layout.NVFP4 {
		layout.LoadRowNVFP4(dst, buf[off/2:], sf[off/layout.NVFP4BlockSize:])
		return
	}
	widenRow(dst, j.cacheDT, buf[off*j.es:])
}

// runRowsByKey folds keys [jlo, jhi) of request b into the queries of rows
// rows (each with its own visible interval sc.lo/sc.hi) of kv heads
// [kvh0, kvh0+kvHeadsPerTask), key by key.
func (j *attnJob) runRowsByKey(sc *attnScratch, b, kvh0, rows, jlo, jhi int) {
	D, g, nkv := j.headDim, j.group, j.kvHeadsPerTask
	qh := nkv * g
	pageBase := int(j.kvIndptr[b])
	for t := jlo; t < jhi; {
		// All keys of this page in [t, jhi).
		page := int64(j.kvPageIndices[pageBase+t/j.pageSize])
		entry := t % j.pageSize
		stop := min(jhi, t-entry+j.pageSize)
		base := page*j.strideP + int64(kvh0)*j.strideH
		for ; t < stop; t, entry = t+1, entry+1 {
			visible := false
			for ri := 0; ri < rows && !visible; ri++ {
				visible = sc.lo[ri] <= t && t < sc.hi[ri]
			}
			if !visible {
				continue
			}
			tokOff := base + int64(entry)*j.strideN
			for hh := 0; hh < nkv; hh++ {
				j.widenAt(sc.krow, j.kbuf, j.ksf, tokOff+int64(hh)*j.strideH)
				for ri := 0; ri < rows; ri++ {
					if t < sc.lo[ri] || t >= sc.hi[ri] {
						continue
					}
					q0 := ri*qh + hh*g
					s := sc.s[q0 : q0+g]
					dotRows(s, sc.q[q0*D:(q0+g)*D], sc.krow, D)
					if j.softCap {
						for i, x := range s {
							s[i] = j.capLog2e * float32(math.Tanh(float64(x*j.invCap)))
						}
					}
				}
			}
			for hh := 0; hh < nkv; hh++ {
				j.widenAt(sc.vrow, j.vbuf, j.vsf, tokOff+int64(hh)*j.strideH)
				for ri := 0; ri < rows; ri++ {
					if t < sc.lo[ri] || t >= sc.hi[ri] {
						continue
					}
					q0 := ri*qh + hh*g
					acc := sc.acc[q0*D : (q0+g)*D]
					p := sc.s[q0 : q0+g] // logits in, weights out
					for gh := range p {
						p[gh] = sc.st[q0+gh].weight(p[gh], acc[gh*D:(gh+1)*D])
					}
					axpyRows(p, sc.vrow, acc, D)
				}
			}
		}
	}
}
