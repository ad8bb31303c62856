package cuda

import (
	"fmt"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// The kernels.Backend methods: host memory in, host memory out. Each call
// validates its parameters with their shared Validate method, then runs the
// device-resident path of device.go and step.go on temporary device
// objects: upload the cache and the tensors, plan a step, launch, download
// the outputs. So every conformance test of the host API exercises the same
// plan, upload and launch code an engine's device-resident steps run; only
// the uploads and downloads around it are extra (and make the host API the
// wrong thing to time: it moves the whole cache twice per call).

// cpuCall collects the temporary device objects of one host-API call.
type cpuCall struct {
	b       *Backend
	tensors []DeviceTensor
	caches  []*DeviceKVCache
	mla     []*DeviceMLACache
	steps   []*Step
	err     error
}

func (h *cpuCall) free() {
	for _, t := range h.tensors {
		_ = h.b.FreeTensor(t)
	}
	for _, c := range h.caches {
		c.Free(h.b)
	}
	for _, c := range h.mla {
		c.Free(h.b)
	}
	for _, s := range h.steps {
		s.Free()
	}
}

// tensor allocates a device copy of t (uploaded unless upload is false).
func (h *cpuCall) tensor(t kernels.Tensor, upload bool) DeviceTensor {
	if h.err != nil {
		return DeviceTensor{}
	}
	d, err := h.b.AllocTensor(t.DType, t.Shape...)
	if err != nil {
		h.err = err
		return DeviceTensor{}
	}
	h.tensors = append(h.tensors, d)
	if upload {
		h.err = h.b.Upload(d, t)
	}
	return d
}

// lse allocates a device f32 [n] buffer for an optional LSE (none when
// want is false), uploading vals when given.
func (h *cpuCall) lse(n int, want bool, vals []float32) DeviceTensor {
	if !want {
		return DeviceTensor{DType: layout.F32, Shape: []int{n}}
	}
	d := h.tensor(kernels.Tensor{DType: layout.F32, Shape: []int{n}}, false)
	if h.err == nil && vals != nil {
		h.err = h.b.UploadF32(d, vals)
	}
	return d
}

// keep makes one device object with alloc unless the call has already
// failed, records it in *owned for free and any error in h.err.
func keep[T any](h *cpuCall, owned *[]*T, alloc func() (*T, error)) *T {
	if h.err != nil {
		return nil
	}
	d, err := alloc()
	if err != nil {
		h.err = err
		return nil
	}
	*owned = append(*owned, d)
	return d
}

func (h *cpuCall) cache(c *kernels.PagedKVCache) *DeviceKVCache {
	d := keep(h, &h.caches, func() (*DeviceKVCache, error) { return h.b.NewKVCache(c.Geometry) })
	if d != nil {
		h.err = h.b.UploadKVCache(d, c)
	}
	return d
}

func (h *cpuCall) step(lim StepLimits) *Step {
	return keep(h, &h.steps, func() (*Step, error) { return h.b.NewStep(lim) })
}

// download copies a device tensor into host memory.
func (h *cpuCall) download(dst kernels.Tensor, src DeviceTensor) {
	if h.err == nil {
		h.err = h.b.Download(dst, src)
	}
}

// launch runs the kernel once every upload has succeeded, then downloads
// its output do into o and its LSE dl into lse (none when lse is nil).
func (h *cpuCall) launch(run func() error, o kernels.Tensor, do DeviceTensor, lse []float32, dl DeviceTensor) error {
	if h.err != nil {
		return h.err
	}
	if err := run(); err != nil {
		return err
	}
	h.download(o, do)
	h.downloadF32(lse, dl)
	return h.err
}

func (h *cpuCall) downloadF32(dst []float32, src DeviceTensor) {
	if h.err == nil && dst != nil {
		h.err = h.b.DownloadF32(dst, src)
	}
}

// workItems is a work-item capacity that holds every split-KV plan of rows
// query rows over at most keys keys each: one item per row without split,
// ceil(keys/MaxChunkTokens) per row with forced chunks, and otherwise 0,
// the default of [StepLimits] (the scheduler fits its plan to it).
func (b *Backend) workItems(rows, keys int) int {
	if b.cfg.MaxChunkTokens < 0 {
		return rows
	}
	if c := b.cfg.MaxChunkTokens; c > 0 {
		return rows * max(1, (keys+c-1)/c)
	}
	return 0
}

func usedPages(t *kernels.PageTable) int { return int(t.KVIndptr[t.BatchSize()]) }

// pagedAttention runs the validated decode or prefill plan p (its rows
// query rows of q [rows, Hq, D]) through a step sized for it, with work
// items for the longest request's split-KV chunks.
func (b *Backend) pagedAttention(p *StepPlan, cache *kernels.PagedKVCache, q, o kernels.Tensor, lse []float32) error {
	if p.Rows == 0 {
		return nil
	}
	B := p.Table.BatchSize()
	maxLen := 0
	for r := range B {
		maxLen = max(maxLen, p.Table.SeqLen(r, cache.Geometry.PageSize))
	}
	return b.cpuAttention(p, cache, q, o, lse, StepLimits{MaxBatch: B, MaxPages: usedPages(&p.Table), MaxRows: p.Rows,
		MaxQOHeads: q.Shape[1], MaxHeadDim: q.Shape[2], MaxWorkItems: b.workItems(p.Rows, maxLen)})
}

// AppendPagedKVCache is flashinfer.page.append_paged_kv_cache on host
// memory (see the file comment): the rows of append_key/append_value are
// copied (or, into an fp8 cache, converted) into the K and V slots that
// batch_indices/positions name through the page table.
func (b *Backend) AppendPagedKVCache(p *kernels.AppendParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	nnz := len(p.BatchIndices)
	if nnz == 0 {
		return nil
	}
	h := &cpuCall{b: b}
	defer h.free()
	cache := h.cache(&p.Cache)
	key, val := h.tensor(p.AppendKey, true), h.tensor(p.AppendValue, true)
	s := h.step(StepLimits{MaxBatch: p.Table.BatchSize(), MaxPages: usedPages(&p.Table), MaxRows: nnz})
	if h.err != nil {
		return h.err
	}
	if err := s.Plan(&StepPlan{Geometry: p.Cache.Geometry, Table: p.Table, BatchIndices: p.BatchIndices, Positions: p.Positions}); err != nil {
		return err
	}
	if err := s.Append(cache, key, val, p.KScale, p.VScale); err != nil {
		return err
	}
	return b.DownloadKVCache(&p.Cache, cache)
}

// BatchDecode is BatchDecodeWithPagedKVCacheWrapper.run on host memory:
// one query per request, o = softmax(s) v with s = (q·k)*sm_scale
// (soft-capped, windowed) and the base-2 LSE. Long requests may be split
// into chunks (split-k) and merged on the device; see
// [Config.MaxChunkTokens].
func (b *Backend) BatchDecode(p *kernels.DecodeParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	return b.pagedAttention(&StepPlan{Geometry: p.Cache.Geometry, Table: p.Table, Attention: kernels.Decode, Rows: p.Q.Shape[0],
		AttentionParams: p.AttentionParams}, &p.Cache, p.Q, p.O, p.LSE)
}

// BatchPrefill is BatchPrefillWithPagedKVCacheWrapper.run on host memory:
// ragged queries, bottom-right causal when Causal, left window when
// WindowLeft >= 0. The tiled tensor-core kernel runs it for f16, bf16 and
// fp8 caches with head_dim 64, 128 or 256, the decode kernel with one work
// item per query row otherwise ([PrefillKernel], docs/kernels.md).
func (b *Backend) BatchPrefill(p *kernels.PrefillParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	return b.pagedAttention(&StepPlan{Geometry: p.Cache.Geometry, Table: p.Table, Attention: kernels.Prefill, Rows: p.Q.Shape[0],
		QOIndptr: p.QOIndptr, Causal: p.Causal, AttentionParams: p.AttentionParams}, &p.Cache, p.Q, p.O, p.LSE)
}

// CascadeLevels runs multi-level cascade attention on host memory through
// one device step (the levels' prefills and their merges on the device):
// cascade.Run's semantics, for tests and benchmarks of the device path.
func (b *Backend) CascadeLevels(levels []Level, q kernels.Tensor, cache *kernels.PagedKVCache, causal bool,
	ap kernels.AttentionParams, o kernels.Tensor, lse []float32) error {
	rows, Hq, D := 0, 0, 0
	if len(q.Shape) == 3 {
		rows, Hq, D = q.Shape[0], q.Shape[1], q.Shape[2]
	}
	lim := StepLimits{MaxRows: rows, MaxLevels: max(len(levels), 1), MaxQOHeads: Hq, MaxHeadDim: D}
	maxLen := 0
	for _, lv := range levels {
		t := lv.Table()
		if len(lv.KVIndptr) > 0 {
			lim.MaxBatch = max(lim.MaxBatch, len(lv.KVIndptr)-1)
			if int(lv.KVIndptr[len(lv.KVIndptr)-1]) <= len(lv.KVPageIndices) && lv.KVIndptr[len(lv.KVIndptr)-1] >= 0 {
				lim.MaxPages = max(lim.MaxPages, int(lv.KVIndptr[len(lv.KVIndptr)-1]))
			}
			if t.Validate(cache.Geometry.PageSize, cache.Geometry.NumPages) == nil {
				for r := range t.BatchSize() {
					maxLen = max(maxLen, t.SeqLen(r, cache.Geometry.PageSize))
				}
			}
		}
	}
	lim.MaxWorkItems = b.workItems(rows, maxLen)
	return b.cpuAttention(&StepPlan{Geometry: cache.Geometry, Attention: kernels.Cascade, Rows: rows, Levels: levels,
		Causal: causal, AttentionParams: ap, Table: kernels.PageTable{KVIndptr: []int32{0}}}, cache, q, o, lse, lim)
}

// cpuAttention validates the plan first (so that a bad index array fails
// before anything is allocated or copied), then uploads, runs and
// downloads.
func (b *Backend) cpuAttention(p *StepPlan, cache *kernels.PagedKVCache, q, o kernels.Tensor, lse []float32, lim StepLimits) error {
	h := &cpuCall{b: b}
	defer h.free()
	s := h.step(lim)
	if h.err != nil {
		return h.err
	}
	if err := s.Plan(p); err != nil {
		return err
	}
	dc := h.cache(cache)
	dq := h.tensor(q, true)
	do := h.tensor(o, false)
	dl := h.lse(len(lse), lse != nil, nil)
	return h.launch(func() error { return s.Attention(dc, dq, do, dl) }, o, do, lse, dl)
}

// AppendPagedMLAKVCache is flashinfer.page.append_paged_mla_kv_cache on host
// memory: rows of append_ckv and append_kpe are copied into ckv[page, entry]
// and kpe[page, entry] (split caches or one fused [pages, N, ckv+kpe]
// tensor).
func (b *Backend) AppendPagedMLAKVCache(p *kernels.MLAAppendParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	nnz := len(p.BatchIndices)
	if nnz == 0 {
		return nil
	}
	h := &cpuCall{b: b}
	defer h.free()
	B := len(p.KVIndptr) - 1
	s := h.step(StepLimits{MaxBatch: B, MaxPages: int(p.KVIndptr[B]), MaxRows: nnz})
	dc := h.mlaCache(&p.Cache)
	ckv, kpe := h.tensor(p.AppendCKV, true), h.tensor(p.AppendKPE, true)
	if h.err != nil {
		return h.err
	}
	if err := s.PlanMLA(&MLAStepPlan{Geometry: p.Cache.Geometry, KVIndptr: p.KVIndptr, KVPageIndices: p.KVPageIndices,
		KVLastPageLen: p.KVLastPageLen, BatchIndices: p.BatchIndices, Positions: p.Positions}); err != nil {
		return err
	}
	if err := s.MLAAppend(dc, ckv, kpe); err != nil {
		return err
	}
	return b.DownloadMLACache(&p.Cache, dc)
}

func (h *cpuCall) mlaCache(c *kernels.MLACache) *DeviceMLACache {
	d := keep(h, &h.mla, func() (*DeviceMLACache, error) { return h.b.NewMLACache(c.Geometry) })
	if d != nil {
		h.err = h.b.UploadMLACache(d, c)
	}
	return d
}

// MLADecode is BatchMLAPagedAttentionWrapper.run for decode on host memory:
// s = (q_nope·ckv + q_pe·kpe)*sm_scale, o = softmax(s)·ckv.
func (b *Backend) MLADecode(p *kernels.MLADecodeParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	B, H := p.QNope.Shape[0], p.QNope.Shape[1]
	if B == 0 {
		return nil
	}
	h := &cpuCall{b: b}
	defer h.free()
	s := h.step(StepLimits{MaxBatch: B, MaxPages: int(p.KVIndptr[B]), MaxRows: B,
		MaxQOHeads: H, MaxHeadDim: p.Cache.Geometry.HeadDimCKV}) // scratch for split-KV partials
	if h.err != nil {
		return h.err
	}
	if err := s.PlanMLA(&MLAStepPlan{Geometry: p.Cache.Geometry, KVIndptr: p.KVIndptr, KVPageIndices: p.KVPageIndices,
		Decode: true, KVLen: p.KVLen, NumHeads: p.NumHeads, SMScale: p.SMScale}); err != nil {
		return err
	}
	dc := h.mlaCache(&p.Cache)
	qn, qp := h.tensor(p.QNope, true), h.tensor(p.QPE, true)
	do := h.tensor(p.O, false)
	dl := h.lse(B*H, p.LSE != nil, nil)
	return h.launch(func() error { return s.MLADecode(dc, qn, qp, do, dl) }, p.O, do, p.LSE, dl)
}

// MergeState is flashinfer.merge_state on host memory (V may alias VA or
// VB and S may alias SA or SB).
func (b *Backend) MergeState(p *kernels.MergeStateParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	n, H := p.VA.Shape[0], p.VA.Shape[1]
	if n*H == 0 {
		return nil
	}
	h := &cpuCall{b: b}
	defer h.free()
	va, vb := h.tensor(p.VA, true), h.tensor(p.VB, true)
	sa, sb := h.lse(n*H, true, p.SA), h.lse(n*H, true, p.SB)
	v := h.tensor(p.V, false)
	s := h.lse(n*H, true, nil)
	return h.launch(func() error { return b.DeviceMergeState(va, sa, vb, sb, v, s) }, p.V, v, p.S, s)
}

// MergeStates is flashinfer.merge_states on host memory.
func (b *Backend) MergeStates(p *kernels.MergeStatesParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	n, ns, H := p.V.Shape[0], p.V.Shape[1], p.V.Shape[2]
	if n*H == 0 {
		return nil
	}
	h := &cpuCall{b: b}
	defer h.free()
	v := h.tensor(p.V, true)
	s := h.lse(n*ns*H, true, p.S)
	ov := h.tensor(p.OutV, false)
	os := h.lse(n*H, true, nil)
	return h.launch(func() error { return b.DeviceMergeStates(v, s, ov, os) }, p.OutV, ov, p.OutS, os)
}

// DeviceMergeState is merge_state on device tensors: va, vb, v [n, H, D]
// (f32/f16/bf16), sa, sb, s f32 [n*H]. v may be va or vb and s may be sa or
// sb. The LSE values live on the device, so unlike
// [kernels.MergeStateParams.Validate] they are not checked for NaN or +Inf:
// such a state poisons its row.
func (b *Backend) DeviceMergeState(va, sa, vb, sb, v, s DeviceTensor) error {
	if err := b.idle("DeviceMergeState"); err != nil {
		return err
	}
	const op = "merge_state"
	if len(va.Shape) != 3 {
		return fmt.Errorf("%s: %w: v_a has shape %v, want 3 dimensions", op, kernels.ErrInvalidTensor, va.Shape)
	}
	n, H, D := va.Shape[0], va.Shape[1], va.Shape[2]
	for _, c := range []struct {
		name string
		t    DeviceTensor
	}{{"v_a", va}, {"v_b", vb}, {"v", v}} {
		if err := c.t.checkActivation(op, c.name, n, H, D); err != nil {
			return err
		}
	}
	for _, c := range []struct {
		name string
		t    DeviceTensor
	}{{"s_a", sa}, {"s_b", sb}, {"s", s}} {
		if c.t.Ptr == 0 && n*H > 0 {
			return fmt.Errorf("%s: %w: %s is a null device pointer", op, kernels.ErrInvalidTensor, c.name)
		}
		if err := checkLSE(op, c.name, c.t, n*H); err != nil {
			return err
		}
	}
	var args []uint64
	return b.mergeState(uint64(va.Ptr), uint64(sa.Ptr), va.DType, uint64(vb.Ptr), uint64(sb.Ptr), vb.DType,
		uint64(v.Ptr), uint64(s.Ptr), v.DType, int64(n)*int64(H), int64(D), &args)
}

// DeviceMergeStates is merge_states on device tensors: v [n, S, H, D], s f32
// [n*S*H] in; outV [n, H, D], outS f32 [n*H] out (not overlapping the
// inputs). As for [Backend.DeviceMergeState], LSE values are not checked.
func (b *Backend) DeviceMergeStates(v, s, outV, outS DeviceTensor) error {
	if err := b.idle("DeviceMergeStates"); err != nil {
		return err
	}
	const op = "merge_states"
	if len(v.Shape) != 4 {
		return fmt.Errorf("%s: %w: v has shape %v, want [n, num_states, heads, head_dim]", op, kernels.ErrInvalidTensor, v.Shape)
	}
	n, ns, H, D := v.Shape[0], v.Shape[1], v.Shape[2], v.Shape[3]
	if err := v.checkActivation(op, "v", n, ns, H, D); err != nil {
		return err
	}
	if err := outV.checkActivation(op, "v_merged", n, H, D); err != nil {
		return err
	}
	for _, c := range []struct {
		name string
		t    DeviceTensor
		n    int
	}{{"s", s, n * ns * H}, {"s_merged", outS, n * H}} {
		if c.t.Ptr == 0 && c.n > 0 {
			return fmt.Errorf("%s: %w: %s is a null device pointer", op, kernels.ErrInvalidTensor, c.name)
		}
		if err := checkLSE(op, c.name, c.t, c.n); err != nil {
			return err
		}
	}
	if n*H == 0 {
		return nil
	}
	vc, _ := dtypeCode(v.DType)
	oc, _ := dtypeCode(outV.DType)
	args := []uint64{uint64(v.Ptr), uint64(s.Ptr), uint64(outV.Ptr), uint64(outS.Ptr), uint64(n), uint64(ns), uint64(H),
		uint64(D), uint64(vc), uint64(oc)}
	return b.launch("merge_states", Dim3{b.gridFor(n * H), 1, 1}, Dim3{threadsFor(int64(D)), 1, 1}, 0, args)
}
