//go:build cgo

package cuda_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/cpuemu"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/kernels/cuda"
	"github.com/pagedkv/pagedkv/kernels/kernelstest"
	"github.com/pagedkv/pagedkv/layout"
)

// countingEmu is the emulator behind a CountingDriver.
func countingEmu(cfg cpuemu.Config) (*cuda.Backend, *cuda.CountingDriver) {
	cd := &cuda.CountingDriver{Driver: cpuemu.NewDriver(cfg.NumSMs)}
	return cuda.NewWithDriver("emu", cd, cuda.Config{MaxChunkTokens: cfg.MaxChunkTokens}), cd
}

// trafficBackends are the device backends the traffic tests count on: a
// fresh emulator (newEmu, called per use) and, under -tags cuda with a
// device, the GPU (whose Backend counts its Driver too).
func trafficBackends(t *testing.T) []func() *cuda.Backend {
	bs := []func() *cuda.Backend{func() *cuda.Backend { b, _ := countingEmu(cpuemu.Config{}); return b }}
	if g := gpuDevice(t); g != nil {
		bs = append(bs, func() *cuda.Backend { return g })
	}
	return bs
}

// engine is a minimal serving loop on the device-resident API: one cache
// allocated once, requests that grow by one token per decode step, pages
// taken from a free list.
type engine struct {
	t     *testing.T
	b     *cuda.Backend
	g     layout.Paged
	cache *cuda.DeviceKVCache
	step  *cuda.Step
	rng   *rand.Rand
	lens  []int
	pages [][]int32
	free  []int32
	hq    int
}

func newEngine(t *testing.T, b *cuda.Backend, g layout.Paged, hq, maxBatch int, seed uint64) *engine {
	cache, err := b.NewKVCache(g)
	require.NoError(t, err)
	t.Cleanup(func() { cache.Free(b) })
	step, err := b.NewStep(cuda.StepLimits{MaxBatch: maxBatch, MaxPages: g.NumPages, MaxRows: 4096, MaxQOHeads: hq, MaxHeadDim: g.HeadDim})
	require.NoError(t, err)
	t.Cleanup(step.Free)
	e := &engine{t: t, b: b, g: g, cache: cache, step: step, rng: rand.New(rand.NewPCG(seed, 1)), hq: hq}
	for p := g.NumPages - 1; p >= 0; p-- {
		e.free = append(e.free, int32(p))
	}
	return e
}

// grow adds n tokens to request r (reserving pages) and returns the
// append rows (batch index r, positions).
func (e *engine) grow(r, n int, bi, pos []int32) ([]int32, []int32) {
	for i := 0; i < n; i++ {
		if e.lens[r]%e.g.PageSize == 0 {
			p := e.free[len(e.free)-1]
			e.free = e.free[:len(e.free)-1]
			e.pages[r] = append(e.pages[r], p)
		}
		bi, pos = append(bi, int32(r)), append(pos, int32(e.lens[r]))
		e.lens[r]++
	}
	return bi, pos
}

func (e *engine) table() kernels.PageTable {
	t := kernels.PageTable{KVIndptr: []int32{0}}
	for r := range e.lens {
		t.KVPageIndices = append(t.KVPageIndices, e.pages[r]...)
		t.KVIndptr = append(t.KVIndptr, int32(len(t.KVPageIndices)))
		last := int32(0)
		if e.lens[r] > 0 {
			last = int32((e.lens[r]-1)%e.g.PageSize + 1)
		}
		t.KVLastPageLen = append(t.KVLastPageLen, last)
	}
	return t
}

func (e *engine) randTensor(shape ...int) kernels.Tensor {
	n := 1
	for _, d := range shape {
		n *= d
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = e.rng.Float32()*2 - 1
	}
	return kernels.TensorFromF32(e.g.DType, v, shape...)
}

// TestStepDecodeTraffic counts what crosses the Driver in a decode step of
// B requests: the step's plan moves exactly its index arrays in one copy
// (O(B + pages)); append and attention move nothing; the explicit uploads
// of the new K/V rows and q and the download of o are the only other
// traffic. The cache never crosses, and the traffic is the same for a pool
// 16 times larger.
func TestStepDecodeTraffic(t *testing.T) {
	for _, newBackend := range trafficBackends(t) {
		for _, pool := range []int{64, 1024} {
			stepDecodeTraffic(t, newBackend(), pool)
		}
	}
}

func stepDecodeTraffic(t *testing.T, b *cuda.Backend, pool int) {
	g := layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F16, NumPages: pool, PageSize: 16, NumKVHeads: 2, HeadDim: 64}
	const B, hq = 6, 4
	cd := b // counts its Driver
	before := cd.Traffic()
	e := newEngine(t, b, g, hq, B, 1)
	setup := cd.Traffic().Sub(before)
	assert.Zero(t, setup.HtoDBytes, "allocating the cache and the step uploads nothing")
	e.lens, e.pages = make([]int, B), make([][]int32, B)

	// Prefill-sized append of each prompt, then decode steps.
	var bi, pos []int32
	for r := range B {
		bi, pos = e.grow(r, 20+7*r, bi, pos)
	}
	// mirror is the cache as the CPU backend's appends of the same
	// rows leave it.
	mirror, err := kernels.NewPagedKVCache(g)
	require.NoError(t, err)
	c := cpu.New(cpu.Config{})
	appendRows := func(bi, pos []int32) {
		tab := e.table()
		k, err := b.AllocTensor(g.DType, len(bi), g.NumKVHeads, g.HeadDim)
		require.NoError(t, err)
		defer func() { require.NoError(t, b.FreeTensor(k)) }()
		hk := e.randTensor(len(bi), g.NumKVHeads, g.HeadDim)
		require.NoError(t, c.AppendPagedKVCache(&kernels.AppendParams{AppendKey: hk, AppendValue: hk, BatchIndices: bi,
			Positions: pos, Cache: mirror, Table: tab}))
		require.NoError(t, b.Upload(k, hk))
		require.NoError(t, e.step.Plan(&cuda.StepPlan{Geometry: g, Table: tab, BatchIndices: bi, Positions: pos}))
		require.NoError(t, e.step.Append(e.cache, k, k, 0, 0))
	}
	appendRows(bi, pos)

	q, err := b.AllocTensor(g.DType, B, hq, g.HeadDim)
	require.NoError(t, err)
	o, err := b.AllocTensor(layout.F32, B, hq, g.HeadDim)
	require.NoError(t, err)
	kv, err := b.AllocTensor(g.DType, B, g.NumKVHeads, g.HeadDim)
	require.NoError(t, err)
	defer func() {
		for _, x := range []cuda.DeviceTensor{q, o, kv} {
			require.NoError(t, b.FreeTensor(x))
		}
	}()
	hostO := kernels.NewTensor(layout.F32, B, hq, g.HeadDim)
	for step := 0; step < 3; step++ {
		bi, pos = bi[:0], pos[:0]
		for r := range B {
			bi, pos = e.grow(r, 1, bi, pos)
		}
		tab := e.table()
		pages := int(tab.KVIndptr[B])

		t0 := cd.Traffic()
		hkv := e.randTensor(B, g.NumKVHeads, g.HeadDim)
		require.NoError(t, b.Upload(kv, hkv))
		require.NoError(t, b.Upload(q, e.randTensor(B, hq, g.HeadDim)))
		t1 := cd.Traffic()
		require.NoError(t, e.step.Plan(&cuda.StepPlan{Geometry: g, Table: tab, BatchIndices: bi, Positions: pos,
			Attention: kernels.Decode, Rows: B, AttentionParams: kernels.AttentionParams{NumQOHeads: hq, WindowLeft: -1}}))
		t2 := cd.Traffic()
		require.NoError(t, e.step.Append(e.cache, kv, kv, 0, 0))
		require.NoError(t, e.step.Attention(e.cache, q, o, cuda.DeviceTensor{}))
		t3 := cd.Traffic()
		require.NoError(t, b.Download(hostO, o))
		t4 := cd.Traffic()
		require.NoError(t, c.AppendPagedKVCache(&kernels.AppendParams{AppendKey: hkv, AppendValue: hkv, BatchIndices: bi,
			Positions: pos, Cache: mirror, Table: tab}))

		// The plan: one copy of kv_indptr, kv_last_page_len, the work
		// items (4 int32 per request, no split-k at this size),
		// batch_indices, positions and kv_indices.
		plan := t2.Sub(t1)
		wantIndex := 4 * ((B + 1) + B + 4*B + 2*B + pages)
		assert.Equal(t, 1, plan.HtoDCopies, "one asynchronous copy per step")
		assert.Equal(t, int64(wantIndex), plan.HtoDBytes, "index bytes of a step of %d requests over %d pages", B, pages)
		assert.Equal(t, wantIndex, e.step.UploadedBytes())
		assert.Zero(t, plan.Launches+plan.Allocs+plan.DtoHCopies)
		// Append and attention: launches only.
		run := t3.Sub(t2)
		assert.Equal(t, cuda.Traffic{Launches: 2}, run, "append + decode launch with no host traffic")
		// The whole step: new K/V rows, q, index arrays, o.
		kvBytes := int64(B * g.NumKVHeads * g.HeadDim * 2)
		qBytes := int64(B * hq * g.HeadDim * 2)
		oBytes := int64(B * hq * g.HeadDim * 4)
		all := t4.Sub(t0)
		assert.Equal(t, kvBytes+qBytes+int64(wantIndex), all.HtoDBytes, "step %d", step)
		assert.Equal(t, oBytes, all.DtoHBytes)
		assert.Less(t, all.HtoDBytes+all.DtoHBytes, e.cache.CacheBytes()/4, "a step moves far less than the cache")
	}

	// The result equals the CPU backend on a downloaded copy of the cache.
	host, err := kernels.NewPagedKVCache(g)
	require.NoError(t, err)
	require.NoError(t, b.DownloadKVCache(&host, e.cache))
	require.Equal(t, mirror.Data, host.Data, "the device cache after the steps' appends differs from the CPU's")
	qCPU := kernels.NewTensor(g.DType, B, hq, g.HeadDim)
	require.NoError(t, b.Download(qCPU, q))
	want := kernels.NewTensor(layout.F32, B, hq, g.HeadDim)
	require.NoError(t, c.BatchDecode(&kernels.DecodeParams{Q: qCPU, Cache: host, Table: e.table(),
		AttentionParams: kernels.AttentionParams{NumQOHeads: hq, WindowLeft: -1}, O: want}))
	assert.InDeltaSlice(t, want.F32(), hostO.F32(), 2e-3)
}

// TestStepAppendTraffic: an append step moves the new K/V rows (uploaded
// by the caller) and its index arrays, nothing else.
func TestStepAppendTraffic(t *testing.T) {
	for _, newBackend := range trafficBackends(t) {
		stepAppendTraffic(t, newBackend())
	}
}

func stepAppendTraffic(t *testing.T, b *cuda.Backend) {
	g := layout.Paged{Layout: layout.HND, Form: layout.Split, DType: layout.BF16, NumPages: 256, PageSize: 8, NumKVHeads: 4, HeadDim: 128}
	cd := b // counts its Driver
	e := newEngine(t, b, g, 4, 8, 2)
	e.lens, e.pages = make([]int, 8), make([][]int32, 8)
	var bi, pos []int32
	for r := range 8 {
		bi, pos = e.grow(r, 3+r, bi, pos)
	}
	tab := e.table()
	nnz := len(bi)
	k, err := b.AllocTensor(g.DType, nnz, g.NumKVHeads, g.HeadDim)
	require.NoError(t, err)
	v, err := b.AllocTensor(g.DType, nnz, g.NumKVHeads, g.HeadDim)
	require.NoError(t, err)
	t0 := cd.Traffic()
	require.NoError(t, b.Upload(k, e.randTensor(nnz, g.NumKVHeads, g.HeadDim)))
	require.NoError(t, b.Upload(v, e.randTensor(nnz, g.NumKVHeads, g.HeadDim)))
	require.NoError(t, e.step.Plan(&cuda.StepPlan{Geometry: g, Table: tab, BatchIndices: bi, Positions: pos}))
	require.NoError(t, e.step.Append(e.cache, k, v, 0, 0))
	all := cd.Traffic().Sub(t0)
	rows := int64(2 * nnz * g.NumKVHeads * g.HeadDim * 2)
	index := int64(4 * (len(tab.KVIndptr) + int(tab.KVIndptr[8]) + 2*nnz))
	assert.Equal(t, cuda.Traffic{HtoDBytes: rows + index, HtoDCopies: 3, Launches: 1}, all)
}

// TestStepLaunchesAreGraphStable: two decode steps of the same shape (batch,
// rows, work items) but different pages, lengths and queries launch the
// same kernels with bit-identical arguments, and nothing but launches
// happens between the plan's copy and the download, which is what a CUDA
// graph captured on the first step needs to replay the second.
func TestStepLaunchesAreGraphStable(t *testing.T) {
	g := layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F16, NumPages: 128, PageSize: 16, NumKVHeads: 2, HeadDim: 64}
	const B, hq = 4, 8
	cd := &cuda.CountingDriver{Driver: cpuemu.NewDriver(0), Record: true}
	b := cuda.NewWithDriver("emu", cd, cuda.Config{})
	e := newEngine(t, b, g, hq, B, 3)
	e.lens, e.pages = make([]int, B), make([][]int32, B)
	q, err := b.AllocTensor(g.DType, B, hq, g.HeadDim)
	require.NoError(t, err)
	o, err := b.AllocTensor(g.DType, B, hq, g.HeadDim)
	require.NoError(t, err)
	lse, err := b.AllocTensor(layout.F32, B*hq)
	require.NoError(t, err)
	kv, err := b.AllocTensor(g.DType, B, g.NumKVHeads, g.HeadDim)
	require.NoError(t, err)
	var records [][]cuda.LaunchRecord
	for step := 0; step < 3; step++ {
		var bi, pos []int32
		for r := range B {
			bi, pos = e.grow(r, 1+e.rng.IntN(2)*(1-min(step, 1))*30, bi, pos)
		}
		if step == 0 {
			// the first step appends ragged prompts; the next two are decode steps
			continue
		}
		require.NoError(t, b.Upload(q, e.randTensor(B, hq, g.HeadDim)))
		require.NoError(t, b.Upload(kv, e.randTensor(B, g.NumKVHeads, g.HeadDim)))
		cd.Launches()
		t0 := cd.Traffic()
		require.NoError(t, e.step.Plan(&cuda.StepPlan{Geometry: g, Table: e.table(), BatchIndices: bi, Positions: pos,
			Attention: kernels.Decode, Rows: B, AttentionParams: kernels.AttentionParams{NumQOHeads: hq, WindowLeft: -1}}))
		t1 := cd.Traffic()
		require.NoError(t, e.step.Append(e.cache, kv, kv, 0, 0))
		require.NoError(t, e.step.Attention(e.cache, q, o, lse))
		t2 := cd.Traffic()
		// One copy; and, since nothing was downloaded since the last step,
		// one wait before the staging buffer is reused.
		assert.Equal(t, cuda.Traffic{HtoDBytes: t1.Sub(t0).HtoDBytes, HtoDCopies: 1, Syncs: min(step-1, 1)}, t1.Sub(t0))
		assert.Equal(t, cuda.Traffic{Launches: 2}, t2.Sub(t1))
		records = append(records, cd.Launches())
	}
	require.Len(t, records, 2)
	assert.Equal(t, records[0], records[1], "same-shape steps must launch identical kernels and arguments")
}

// TestStepRejectsLikeCPU: every hostile index array (the audit's crafted
// tables and raw fuzz seeds) that the CPU backend rejects, the device step
// rejects in Plan with the same error, before any copy or launch; what the
// CPU accepts, the step accepts.
func TestStepRejectsLikeCPU(t *testing.T) {
	b, cd := countingEmu(cpuemu.Config{})
	s, err := b.NewStep(cuda.StepLimits{MaxBatch: 1 << 12, MaxPages: 1 << 12, MaxRows: 1 << 12, MaxQOHeads: 8, MaxHeadDim: 64})
	require.NoError(t, err)
	defer s.Free()
	g := kernelstest.RawGeometry{Layout: layout.NHD, Form: layout.Fused, DType: layout.F32, NumPages: 4, PageSize: 4,
		NumKVHeads: 2, Group: 2, HeadDim: 8, HeadDimCKV: 8, HeadDimKPE: 4}
	rejected := 0
	for i, ix := range kernelstest.HostileTables() {
		rejected += compareWithCPU(t, b, cd, s, g, ix, fmt.Sprintf("hostile table %d", i))
	}
	for i, seed := range kernelstest.RawSeeds() {
		rg, ix := kernelstest.DecodeRaw(seed)
		compareWithCPU(t, b, cd, s, rg, ix, fmt.Sprintf("raw seed %d", i))
	}
	assert.Greater(t, rejected, 20, "the hostile tables must exercise rejections")
}

// FuzzStepPlanMatchesCPU feeds raw index arrays (any lengths, any int32)
// into the device step's Plan and the CPU backend: same error or both
// accept, and a rejected plan never copies or launches.
func FuzzStepPlanMatchesCPU(f *testing.F) {
	for _, s := range kernelstest.RawSeeds() {
		f.Add(s)
	}
	b, cd := countingEmu(cpuemu.Config{})
	s, err := b.NewStep(cuda.StepLimits{MaxBatch: 1 << 12, MaxPages: 1 << 12, MaxRows: 1 << 12, MaxQOHeads: 8, MaxHeadDim: 64})
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, data []byte) {
		g, ix := kernelstest.DecodeRaw(data)
		compareWithCPU(t, b, cd, s, g, ix, "raw")
	})
}

// compareWithCPU runs decode, prefill, append, MLA decode and MLA append
// of ix on the CPU backend and plans them on the device step; it returns
// how many the CPU rejected.
func compareWithCPU(t testing.TB, b *cuda.Backend, cd *cuda.CountingDriver, s *cuda.Step, rg kernelstest.RawGeometry, ix kernelstest.RawIndices, what string) int {
	c := cpu.New(cpu.Config{Workers: 1})
	g := layout.Paged{Layout: rg.Layout, Form: rg.Form, DType: rg.DType, NumPages: rg.NumPages, PageSize: rg.PageSize,
		NumKVHeads: rg.NumKVHeads, HeadDim: rg.HeadDim}
	mg := layout.MLA{Form: rg.Form, DType: rg.DType, NumPages: rg.NumPages, PageSize: rg.PageSize, HeadDimCKV: rg.HeadDimCKV, HeadDimKPE: rg.HeadDimKPE}
	cache, err := kernels.NewPagedKVCache(g)
	if err != nil {
		return 0
	}
	mcache, err := kernels.NewMLACache(mg)
	if err != nil {
		return 0
	}
	hq := rg.NumKVHeads * rg.Group
	ap := kernels.AttentionParams{NumQOHeads: hq, WindowLeft: -1}
	table := kernels.PageTable{KVIndptr: ix.KVIndptr, KVPageIndices: ix.KVPageIndices, KVLastPageLen: ix.KVLastPageLen}
	B := max(len(ix.KVIndptr)-1, 0)
	nnzQO := 0
	if len(ix.QOIndptr) > 0 {
		nnzQO = int(min(max(ix.QOIndptr[len(ix.QOIndptr)-1], 0), 64))
	}
	nnz := len(ix.BatchIndices)
	mlaLast := ix.KVLastPageLen
	if ix.MLANoLastPageLen {
		mlaLast = nil
	}
	type op struct {
		name string
		cpu  func() error
		dev  func() error
	}
	ops := []op{
		{"decode", func() error {
			return c.BatchDecode(&kernels.DecodeParams{Q: kernels.NewTensor(g.DType, B, hq, g.HeadDim), Cache: cache, Table: table,
				AttentionParams: ap, O: kernels.NewTensor(g.DType, B, hq, g.HeadDim)})
		}, func() error {
			return s.Plan(&cuda.StepPlan{Geometry: g, Table: table, Attention: kernels.Decode, Rows: B, AttentionParams: ap})
		}},
		{"prefill", func() error {
			return c.BatchPrefill(&kernels.PrefillParams{Q: kernels.NewTensor(g.DType, nnzQO, hq, g.HeadDim), QOIndptr: ix.QOIndptr,
				Cache: cache, Table: table, Causal: true, AttentionParams: ap, O: kernels.NewTensor(g.DType, nnzQO, hq, g.HeadDim)})
		}, func() error {
			return s.Plan(&cuda.StepPlan{Geometry: g, Table: table, Attention: kernels.Prefill, Rows: nnzQO, QOIndptr: ix.QOIndptr,
				Causal: true, AttentionParams: ap})
		}},
		{"append", func() error {
			kv := kernels.NewTensor(g.DType, nnz, g.NumKVHeads, g.HeadDim)
			return c.AppendPagedKVCache(&kernels.AppendParams{AppendKey: kv, AppendValue: kv, BatchIndices: ix.BatchIndices,
				Positions: ix.Positions, Cache: cache, Table: table})
		}, func() error {
			bi := ix.BatchIndices
			if bi == nil {
				bi = []int32{} // an append plan with no rows (nil means no append)
			}
			return s.Plan(&cuda.StepPlan{Geometry: g, Table: table, BatchIndices: bi, Positions: ix.Positions})
		}},
		{"mla decode", func() error {
			return c.MLADecode(&kernels.MLADecodeParams{QNope: kernels.NewTensor(g.DType, B, rg.Group, mg.HeadDimCKV),
				QPE: kernels.NewTensor(g.DType, B, rg.Group, mg.HeadDimKPE), Cache: mcache, KVIndptr: ix.KVIndptr,
				KVPageIndices: ix.KVPageIndices, KVLen: ix.KVLen, NumHeads: rg.Group, SMScale: 0.5,
				O: kernels.NewTensor(g.DType, B, rg.Group, mg.HeadDimCKV)})
		}, func() error {
			return s.PlanMLA(&cuda.MLAStepPlan{Geometry: mg, KVIndptr: ix.KVIndptr, KVPageIndices: ix.KVPageIndices, Decode: true,
				KVLen: ix.KVLen, NumHeads: rg.Group, SMScale: 0.5})
		}},
		{"mla append", func() error {
			return c.AppendPagedMLAKVCache(&kernels.MLAAppendParams{AppendCKV: kernels.NewTensor(g.DType, nnz, mg.HeadDimCKV),
				AppendKPE: kernels.NewTensor(g.DType, nnz, mg.HeadDimKPE), BatchIndices: ix.BatchIndices, Positions: ix.Positions,
				Cache: mcache, KVIndptr: ix.KVIndptr, KVPageIndices: ix.KVPageIndices, KVLastPageLen: mlaLast})
		}, func() error {
			bi := ix.BatchIndices
			if bi == nil {
				bi = []int32{}
			}
			return s.PlanMLA(&cuda.MLAStepPlan{Geometry: mg, KVIndptr: ix.KVIndptr, KVPageIndices: ix.KVPageIndices,
				KVLastPageLen: mlaLast, BatchIndices: bi, Positions: ix.Positions})
		}},
	}
	// A step that appends and decodes validates its CSR once (the
	// append's check) and must still reject exactly what the two calls
	// reject, with the first one's error.
	ops = append(ops, op{"mla append + decode", func() error {
		if err := ops[4].cpu(); err != nil {
			return err
		}
		return ops[3].cpu()
	}, func() error {
		bi := ix.BatchIndices
		if bi == nil {
			bi = []int32{}
		}
		return s.PlanMLA(&cuda.MLAStepPlan{Geometry: mg, KVIndptr: ix.KVIndptr, KVPageIndices: ix.KVPageIndices,
			KVLastPageLen: mlaLast, BatchIndices: bi, Positions: ix.Positions, Decode: true, KVLen: ix.KVLen,
			NumHeads: rg.Group, SMScale: 0.5})
	}})
	rejected := 0
	for _, o := range ops {
		cpuErr := o.cpu()
		t0 := cd.Traffic()
		devErr := o.dev()
		moved := cd.Traffic().Sub(t0)
		if cpuErr == nil {
			require.NoError(t, devErr, "%s %s: CPU accepts, device plan rejects", what, o.name)
			continue
		}
		rejected++
		require.Error(t, devErr, "%s %s: CPU rejects (%v), device plan accepts", what, o.name, cpuErr)
		require.Equal(t, cpuErr.Error(), devErr.Error(), "%s %s", what, o.name)
		require.Equal(t, cuda.Traffic{}, moved, "%s %s: a rejected plan copied or launched", what, o.name)
	}
	return rejected
}

// nopDriver is a device that runs nothing: it isolates the launcher's host
// code (planning, packing, argument lists) for allocation counts.
type nopDriver struct{ next cuda.DevicePtr }

func (d *nopDriver) NumSMs() int { return 132 }
func (d *nopDriver) Alloc(n int) (cuda.DevicePtr, error) {
	d.next += cuda.DevicePtr((n + 511) &^ 255)
	return d.next, nil
}
func (d *nopDriver) Free(cuda.DevicePtr) error                                { return nil }
func (d *nopDriver) HtoD(cuda.DevicePtr, []byte) error                        { return nil }
func (d *nopDriver) HtoDAsync(cuda.DevicePtr, []byte) error                   { return nil }
func (d *nopDriver) DtoH([]byte, cuda.DevicePtr) error                        { return nil }
func (d *nopDriver) DtoD(_, _ cuda.DevicePtr, _ int) error                    { return nil }
func (d *nopDriver) Memset(cuda.DevicePtr, byte, int) error                   { return nil }
func (d *nopDriver) PinnedAlloc(n int) ([]byte, error)                        { return make([]byte, n), nil }
func (d *nopDriver) PinnedFree([]byte) error                                  { return nil }
func (d *nopDriver) Synchronize() error                                       { return nil }
func (d *nopDriver) Launch(string, cuda.Dim3, cuda.Dim3, int, []uint64) error { return nil }
func (d *nopDriver) BeginCapture() error                                      { return nil }
func (d *nopDriver) EndCapture() (cuda.GraphExec, error)                      { return 1, nil }
func (d *nopDriver) LaunchGraph(cuda.GraphExec) error                         { return nil }
func (d *nopDriver) DestroyGraph(cuda.GraphExec) error                        { return nil }

// TestStepAllocationFree pins the per-step hot path: once a Step has seen a
// step of a given shape, planning (validation, work items, packing, the
// upload), the append and the attention of a decode, prefill or cascade
// step of that shape allocate nothing.
func TestStepAllocationFree(t *testing.T) {
	b := cuda.NewWithDriver("nop", &nopDriver{}, cuda.Config{})
	g := layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F16, NumPages: 64, PageSize: 16, NumKVHeads: 2, HeadDim: 128}
	cache, err := b.NewKVCache(g)
	require.NoError(t, err)
	s, err := b.NewStep(cuda.StepLimits{MaxBatch: 8, MaxPages: 64, MaxRows: 64, MaxLevels: 2, MaxQOHeads: 8, MaxHeadDim: 128})
	require.NoError(t, err)
	table := kernels.PageTable{KVIndptr: []int32{0, 3, 5, 9}, KVPageIndices: []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}, KVLastPageLen: []int32{7, 16, 1}}
	bi, pos := []int32{0, 1, 2}, []int32{38, 31, 48}
	ap := kernels.AttentionParams{NumQOHeads: 8, WindowLeft: -1}
	dec := &cuda.StepPlan{Geometry: g, Table: table, BatchIndices: bi, Positions: pos, Attention: kernels.Decode, Rows: 3, AttentionParams: ap}
	pre := &cuda.StepPlan{Geometry: g, Table: table, Attention: kernels.Prefill, Rows: 6, QOIndptr: []int32{0, 1, 3, 6}, Causal: true, AttentionParams: ap}
	cas := &cuda.StepPlan{Geometry: g, Table: table, BatchIndices: bi, Positions: pos, Attention: kernels.Cascade, Rows: 3, Causal: true,
		AttentionParams: ap, Levels: []cuda.Level{
			{QOIndptr: []int32{0, 3}, KVIndptr: []int32{0, 2}, KVPageIndices: []int32{10, 11}, KVLastPageLen: []int32{16}},
			{QOIndptr: []int32{0, 1, 2, 3}, KVIndptr: table.KVIndptr, KVPageIndices: table.KVPageIndices, KVLastPageLen: table.KVLastPageLen}}}
	t3 := func(rows, heads int) cuda.DeviceTensor {
		x, err := b.AllocTensor(g.DType, rows, heads, 128)
		require.NoError(t, err)
		return x
	}
	kv := t3(3, 2)
	for _, c := range []struct {
		name string
		p    *cuda.StepPlan
	}{{"decode", dec}, {"prefill", pre}, {"cascade", cas}} {
		q, o := t3(c.p.Rows, 8), t3(c.p.Rows, 8)
		run := func() {
			require.NoError(t, s.Plan(c.p))
			if c.p.BatchIndices != nil {
				require.NoError(t, s.Append(cache, kv, kv, 0, 0))
			}
			require.NoError(t, s.Attention(cache, q, o, cuda.DeviceTensor{}))
		}
		run()
		assert.Zero(t, testing.AllocsPerRun(20, run), c.name)
	}
}
