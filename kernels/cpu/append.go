package cpu

import (
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/quant"
)

// appendChunkBytes is the amount of copying (K and V together) one goroutine
// takes at a time; appends below twice this run on the calling goroutine.
const appendChunkBytes = 64 << 10

// AppendPagedKVCache is flashinfer.page.append_paged_kv_cache: row i of
// AppendKey/AppendValue is written to token Positions[i] of request
// BatchIndices[i]. Equal dtypes copy bytes; f32/f16/bf16 rows into an fp8
// cache are divided by KScale/VScale in float32 and rounded to nearest even
// with saturation (layout.F32ToE4M3Sat / F32ToE5M2Sat); into an NVFP4 cache
// each head row is quantised block by block with KScale/VScale as the global
// scales (quant.QuantizeNVFP4), codes into the data pages and block scales
// into the scale pages. Nothing is written unless p validates.
func (b *Backend) AppendPagedKVCache(p *kernels.AppendParams) error {
	nnz, err := validRows(p, p.BatchIndices)
	if nnz == 0 || err != nil {
		return err
	}
	g := p.Cache.Geometry
	rowBytes := 2 * g.NumKVHeads * g.HeadDim * p.AppendKey.DType.Size() // K and V of one token
	per, chunks := b.appendChunks(nnz, rowBytes)
	if chunks == 1 {
		appendRows(p, 0, nnz) // no closure: the serial path does not allocate
		return nil
	}
	c := b.pool.get()
	c.kind, c.app, c.per, c.nnz = callAppend, p, per, nnz
	b.pool.run(c, chunks)
	b.pool.put(c)
	return nil
}

// appendChunks splits n rows of rowBytes into chunks of about
// appendChunkBytes for parallelFor; it returns one chunk (run inline) for
// small appends or a single worker.
func (b *Backend) appendChunks(n, rowBytes int) (per, chunks int) {
	per = max(appendChunkBytes/max(rowBytes, 1), 1)
	chunks = (n + per - 1) / per
	if chunks <= 2 || b.workers <= 1 {
		return n, 1
	}
	return per, chunks
}

// appendRows writes rows [lo, hi) of a validated append.
func appendRows(p *kernels.AppendParams, lo, hi int) {
	g := p.Cache.Geometry
	if g.DType == layout.NVFP4 {
		appendRowsNVFP4(p, lo, hi)
		return
	}
	t := &p.Table
	H, D, N := g.NumKVHeads, g.HeadDim, g.PageSize
	srcDT, dstDT := p.AppendKey.DType, g.DType
	srcES, dstES := srcDT.Size(), dstDT.Size()
	kSrc, vSrc := p.AppendKey.Data, p.AppendValue.Data
	kDst, vDst := p.Cache.KBuf(), p.Cache.VBuf()
	rowElems := H * D
	convert := srcDT != dstDT
	kScale, vScale := kernels.EffectiveScale(p.KScale), kernels.EffectiveScale(p.VScale)
	// Byte strides of the cache (layout.Paged's KOffset/VOffset, hoisted).
	strideH := int(g.StrideH()) * dstES
	strideN := int(g.StrideN()) * dstES
	stridePage := int(g.StridePage()) * dstES
	vPlane := int(g.VOffset(0, 0, 0, 0)) * dstES // V's offset from K: the K plane (Fused) or 0 (Split)
	srcRow := rowElems * srcES
	for i := lo; i < hi; i++ {
		req, pos := int(p.BatchIndices[i]), int(p.Positions[i])
		page := int(t.KVPageIndices[int(t.KVIndptr[req])+pos/N])
		entry := pos % N
		kOff := page*stridePage + entry*strideN
		vOff := kOff + vPlane
		src := i * srcRow
		if convert {
			for h := 0; h < H; h++ {
				s := src + h*D*srcES
				convertRow(kDst[kOff:kOff+D*dstES], dstDT, kSrc[s:s+D*srcES], srcDT, kScale)
				convertRow(vDst[vOff:vOff+D*dstES], dstDT, vSrc[s:s+D*srcES], srcDT, vScale)
				kOff += strideH
				vOff += strideH
			}
			continue
		}
		// The following rows that are the request's next positions in the
		// same page (a prefill chunk) go to the following entries.
		run := 1
		for i+run < hi && int(p.BatchIndices[i+run]) == req && int(p.Positions[i+run]) == pos+run && entry+run < N {
			run++
		}
		i += run - 1
		if g.Layout == layout.NHD {
			// All heads of a token are contiguous on both sides, and so are
			// the run's tokens: one copy each for K and V.
			n := run * srcRow
			copy(kDst[kOff:kOff+n], kSrc[src:src+n])
			copy(vDst[vOff:vOff+n], vSrc[src:src+n])
			continue
		}
		// HND: each row is H copies of D elements at the page's head
		// stride. K's rows first, then V's: fewer streams of scattered
		// writes at a time than interleaving K and V head by head.
		copyRowsHND(kDst[kOff:], kSrc[src:], H, run, D*dstES, strideH, srcRow)
		copyRowsHND(vDst[vOff:], vSrc[src:], H, run, D*dstES, strideH, srcRow)
	}
}

// copyRowsHND copies run rows of H heads of headBytes each from src (row r,
// head h at r*srcRow+h*headBytes) to dst (head h, row r at
// h*strideH+r*headBytes), row by row so that src is read in order (measured
// faster than head by head). With one head a run is contiguous on both
// sides and moves in one copy.
func copyRowsHND(dst, src []byte, H, run, headBytes, strideH, srcRow int) {
	if srcRow == headBytes { // H == 1
		n := run * headBytes
		copy(dst[:n], src[:n])
		return
	}
	for r := 0; r < run; r++ {
		d, s := r*headBytes, r*srcRow
		for h := 0; h < H; h++ {
			copy(dst[d:d+headBytes], src[s:s+headBytes])
			d += strideH
			s += headBytes
		}
	}
}

// convertRow writes src (dtype srcDT) divided by scale into dst (fp8 dstDT),
// rounding to nearest even and saturating. It widens through a stack buffer
// so that each dtype's row loop is the specialised one in package layout.
func convertRow(dst []byte, dstDT layout.DType, src []byte, srcDT layout.DType, scale float32) {
	var buf [256]float32
	srcES := srcDT.Size()
	for len(dst) > 0 {
		row := buf[:min(len(dst), len(buf))]
		layout.LoadRowF32(row, srcDT, src)
		for j := range row {
			row[j] /= scale
		}
		layout.StoreRowF32Sat(dst, dstDT, row)
		dst, src = dst[len(row):], src[len(row)*srcES:]
	}
}

// appendRowsNVFP4 quantises rows [lo, hi) of a validated append into an
// NVFP4 cache: each head row of K and V, 16-element block by block.
func appendRowsNVFP4(p *kernels.AppendParams, lo, hi int) {
	g := p.Cache.Geometry
	t := &p.Table
	H, D, N := g.NumKVHeads, g.HeadDim, g.PageSize
	srcDT := p.AppendKey.DType
	srcES := srcDT.Size()
	kScale, vScale := kernels.EffectiveScale(p.KScale), kernels.EffectiveScale(p.VScale)
	c := &p.Cache
	for i := lo; i < hi; i++ {
		req, pos := int(p.BatchIndices[i]), int(p.Positions[i])
		page := int(t.KVPageIndices[int(t.KVIndptr[req])+pos/N])
		entry := pos % N
		for h := 0; h < H; h++ {
			s := (i*H + h) * D * srcES
			quantizeRowNVFP4(c.KBuf(), c.KSFBuf(), g, g.KOffset(page, entry, h, 0), p.AppendKey.Data[s:s+D*srcES], srcDT, kScale)
			quantizeRowNVFP4(c.VBuf(), c.VSFBuf(), g, g.VOffset(page, entry, h, 0), p.AppendValue.Data[s:s+D*srcES], srcDT, vScale)
		}
	}
}

// quantizeRowNVFP4 quantises the head row src (dtype srcDT) under global
// scale gs into the NVFP4 row at element offset off of data and its scales.
// It widens through a stack buffer of whole 16-element blocks.
func quantizeRowNVFP4(data, sf []byte, g layout.Paged, off int64, src []byte, srcDT layout.DType, gs float32) {
	var buf [256]float32
	codes, scales := data[g.DataOffset(off):], sf[g.ScaleOffset(off):]
	srcES := srcDT.Size()
	for n := g.HeadDim; n > 0; {
		row := buf[:min(n, len(buf))]
		layout.LoadRowF32(row, srcDT, src)
		quant.QuantizeNVFP4(codes, scales, row, gs)
		n -= len(row)
		src, codes, scales = src[len(row)*srcES:], codes[len(row)/2:], scales[len(row)/layout.NVFP4BlockSize:]
	}
}

// AppendPagedMLAKVCache is flashinfer.page.append_paged_mla_kv_cache: row i
// of AppendCKV/AppendKPE is copied (bytes; the dtypes equal the cache's) to
// token Positions[i] of request BatchIndices[i], into the ckv and kpe parts
// of its slot (fused or split storage). Nothing is written unless p
// validates.
func (b *Backend) AppendPagedMLAKVCache(p *kernels.MLAAppendParams) error {
	nnz, err := validRows(p, p.BatchIndices)
	if nnz == 0 || err != nil {
		return err
	}
	g := p.Cache.Geometry
	per, chunks := b.appendChunks(nnz, (g.HeadDimCKV+g.HeadDimKPE)*g.DType.Size())
	if chunks == 1 {
		appendMLARows(p, 0, nnz)
		return nil
	}
	b.parallelFor(chunks, func(c int) { appendMLARows(p, c*per, min((c+1)*per, nnz)) })
	return nil
}

// appendMLARows copies rows [lo, hi) of a validated MLA append.
func appendMLARows(p *kernels.MLAAppendParams, lo, hi int) {
	g := p.Cache.Geometry
	es := g.DType.Size()
	ckvDst, kpeDst := p.Cache.CKVBuf(), p.Cache.KPEBuf()
	nc, nk := g.HeadDimCKV*es, g.HeadDimKPE*es
	N := g.PageSize
	for i := lo; i < hi; i++ {
		req, pos := int(p.BatchIndices[i]), int(p.Positions[i])
		page := int(p.KVPageIndices[int(p.KVIndptr[req])+pos/N])
		entry := pos % N
		c := int(g.CKVOffset(page, entry, 0)) * es
		k := int(g.KPEOffset(page, entry, 0)) * es
		copy(ckvDst[c:c+nc], p.AppendCKV.Data[i*nc:(i+1)*nc])
		copy(kpeDst[k:k+nk], p.AppendKPE.Data[i*nk:(i+1)*nk])
	}
}

// validRows validates p (an append's params) and returns its number of
// rows, len(batchIndices); 0 with a nil error means nothing to append.
func validRows(p interface{ Validate() error }, batchIndices []int32) (int, error) {
	if err := p.Validate(); err != nil {
		return 0, err
	}
	return len(batchIndices), nil
}
