//go:build cgo

package cuda_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/cpuemu"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cuda"
	"github.com/pagedkv/pagedkv/kernels/kernelstest"
	"github.com/pagedkv/pagedkv/layout"
)

// graphRig runs the same random steps two ways on one device: eagerly on a
// plain Step (exact shapes, no padding) and through a CUDA graph captured
// once on a fixed Step, each side with its own caches and buffers of equal
// contents.
type graphRig struct {
	t      testing.TB
	b      *cuda.Backend
	mem    engineMemory
	rng    *rand.Rand
	g      layout.Paged
	lim    cuda.StepLimits
	hq     int
	kind   kernels.AttentionKind
	eager  *cuda.Step
	fixed  *cuda.Step
	graph  *cuda.Graph
	layers int
	// per side (0 eager, 1 graph): caches per layer and the step's buffers
	// with MaxRows rows (the eager side launches on prefix views of them)
	caches [2][]*cuda.DeviceKVCache
	q, o   [2]cuda.DeviceTensor
	lse    [2]cuda.DeviceTensor
	k, v   [2]cuda.DeviceTensor
	extra  int // a request's keys: its query rows plus 0..extra-1
}

// rigShape is a rig's cache and key counts.
type rigShape struct {
	pageSize, numPages, maxPages, extraKeys int
}

// smallRig: 64 pages of 4 tokens, requests of at most 14 keys.
var smallRig = rigShape{pageSize: 4, numPages: 64, maxPages: 40, extraKeys: 12}

const graphPrefixPages = 3 // the shared prefix of a cascade step

// engineMemory allocates device memory the way an engine would, outside
// the backend's tensor API, and frees it.
type engineMemory struct {
	alloc func(bytes int) (cuda.DevicePtr, error)
	free  func(cuda.DevicePtr) error
}

// newGraphRig is the rig on the emulator: its engine memory is the
// emulator driver's own allocations, made beside the backend.
func newGraphRig(t testing.TB, kind kernels.AttentionKind, layers int, seed uint64) *graphRig {
	return newEmuGraphRig(t, cpuemu.Config{MaxChunkTokens: -1}, smallRig, kind, layers, seed)
}

// newEmuGraphRig is a rig on an emulator of configuration cfg.
func newEmuGraphRig(t testing.TB, cfg cpuemu.Config, sh rigShape, kind kernels.AttentionKind, layers int, seed uint64) *graphRig {
	b, cd := countingEmu(cfg)
	return newGraphRigOn(t, b, engineMemory{cd.Driver.Alloc, cd.Driver.Free}, sh, kind, layers, seed)
}

// graphDevices are the rigs the graph tests run on: the emulator, and the
// GPU under -tags cuda when one is present (engine memory from
// AllocTensor there, wrapped again from its raw pointer).
func graphDevices(t *testing.T) map[string]func(t testing.TB, kind kernels.AttentionKind, layers int, seed uint64) *graphRig {
	devs := map[string]func(testing.TB, kernels.AttentionKind, int, uint64) *graphRig{"emu": newGraphRig}
	if g := gpuDevice(t); g != nil {
		mem := engineMemory{
			alloc: func(n int) (cuda.DevicePtr, error) {
				x, err := g.AllocTensor(layout.I8, n)
				return x.Ptr, err
			},
			free: func(p cuda.DevicePtr) error {
				return g.FreeTensor(cuda.DeviceTensor{DType: layout.I8, Shape: []int{1}, Ptr: p})
			},
		}
		devs["cuda"] = func(t testing.TB, kind kernels.AttentionKind, layers int, seed uint64) *graphRig {
			return newGraphRigOn(t, g, mem, smallRig, kind, layers, seed)
		}
	}
	return devs
}

func newGraphRigOn(t testing.TB, b *cuda.Backend, mem engineMemory, sh rigShape, kind kernels.AttentionKind, layers int, seed uint64) *graphRig {
	return newGraphRigDim(t, b, mem, sh, kind, layers, seed, 32)
}

// newGraphRigDim is newGraphRigOn with head dim D (32: the per-row
// kernels; 64: prefill and cascade on the tiled tensor-core kernel).
func newGraphRigDim(t testing.TB, b *cuda.Backend, mem engineMemory, sh rigShape, kind kernels.AttentionKind, layers int, seed uint64, D int) *graphRig {
	r := &graphRig{t: t, b: b, mem: mem, rng: rand.New(rand.NewPCG(seed, 26)), kind: kind, layers: layers, hq: 4, extra: sh.extraKeys,
		g: layout.Paged{Layout: layout.HND, Form: layout.Split, DType: layout.F16, NumPages: sh.numPages, PageSize: sh.pageSize, NumKVHeads: 2, HeadDim: D}}
	r.lim = cuda.StepLimits{MaxBatch: 6, MaxPages: sh.maxPages, MaxRows: 12, MaxLevels: 2, MaxQOHeads: r.hq, MaxHeadDim: D, Fixed: true}
	host, err := kernels.NewPagedKVCache(r.g)
	require.NoError(t, err)
	r.fixed, err = b.NewStep(r.lim)
	require.NoError(t, err)
	t.Cleanup(r.fixed.Free)
	plain := r.lim
	plain.Fixed = false
	r.eager, err = b.NewStep(plain)
	require.NoError(t, err)
	t.Cleanup(r.eager.Free)
	fillRandom(r.rng, host.K)
	fillRandom(r.rng, host.V)
	for side := range 2 {
		for range layers {
			c, err := b.NewKVCache(r.g)
			require.NoError(t, err)
			t.Cleanup(func() { c.Free(b) })
			require.NoError(t, b.UploadKVCache(c, &host))
			r.caches[side] = append(r.caches[side], c)
		}
		r.q[side] = r.alloc(layout.F16, r.lim.MaxRows, r.hq, D)
		r.o[side] = r.alloc(layout.F16, r.lim.MaxRows, r.hq, D)
		r.lse[side] = r.alloc(layout.F32, r.lim.MaxRows*r.hq)
		r.k[side] = r.alloc(layout.F16, r.lim.MaxRows, 2, D)
		r.v[side] = r.alloc(layout.F16, r.lim.MaxRows, 2, D)
	}
	return r
}

func fillRandom(rng *rand.Rand, b []byte) {
	for i := 0; i+1 < len(b); i += 2 { // f16 in [-2, 2): no NaN or Inf
		b[i], b[i+1] = byte(rng.Uint32()), byte(rng.IntN(0x40))|byte(rng.IntN(2))<<7
	}
}

// alloc is device memory the test allocates outside the backend's tensor
// API (an engine's own buffer) wrapped without a copy.
func (r *graphRig) alloc(dt layout.DType, shape ...int) cuda.DeviceTensor {
	n := int64(dt.Size())
	for _, d := range shape {
		n *= int64(d)
	}
	p, err := r.mem.alloc(int(n))
	require.NoError(r.t, err)
	r.t.Cleanup(func() { _ = r.mem.free(p) })
	x, err := cuda.WrapDeviceTensor(uintptr(p), n, dt, shape...)
	require.NoError(r.t, err)
	return x
}

// randomPlan draws a step: 1..MaxBatch requests (decode: one query row
// each; cascade: 1..2 rows each, over a shared prefix level and a
// per-request causal level), each appending its query rows at the end of
// its pages.
func (r *graphRig) randomPlan() *cuda.StepPlan {
	B := 1 + r.rng.IntN(r.lim.MaxBatch)
	pool := r.rng.Perm(r.g.NumPages)
	prefix := pool[:graphPrefixPages]
	pool = pool[graphPrefixPages:]
	t := kernels.PageTable{KVIndptr: []int32{0}}
	qo := []int32{0}
	var bi, pos []int32
	for req := range B {
		ql := 1
		if r.kind != kernels.Decode {
			ql += r.rng.IntN(2)
		}
		kl := ql + r.rng.IntN(r.extra)
		np := (kl + r.g.PageSize - 1) / r.g.PageSize
		for range np {
			t.KVPageIndices = append(t.KVPageIndices, int32(pool[0]))
			pool = pool[1:]
		}
		t.KVIndptr = append(t.KVIndptr, int32(len(t.KVPageIndices)))
		t.KVLastPageLen = append(t.KVLastPageLen, int32((kl-1)%r.g.PageSize+1))
		qo = append(qo, qo[len(qo)-1]+int32(ql))
		for i := kl - ql; i < kl; i++ {
			bi, pos = append(bi, int32(req)), append(pos, int32(i))
		}
	}
	rows := int(qo[B])
	p := &cuda.StepPlan{Geometry: r.g, Table: t, BatchIndices: bi, Positions: pos, Attention: r.kind, Rows: rows,
		AttentionParams: kernels.AttentionParams{NumQOHeads: r.hq, WindowLeft: -1}}
	if r.kind == kernels.Prefill {
		p.QOIndptr, p.Causal = qo, true
	}
	if r.kind == kernels.Cascade {
		shared := make([]int32, len(prefix))
		for i, pg := range prefix {
			shared[i] = int32(pg)
		}
		p.Causal = true
		p.Levels = []cuda.Level{
			{QOIndptr: []int32{0, int32(rows)}, KVIndptr: []int32{0, int32(len(shared))}, KVPageIndices: shared, KVLastPageLen: []int32{int32(r.g.PageSize)}},
			{QOIndptr: qo, KVIndptr: t.KVIndptr, KVPageIndices: t.KVPageIndices, KVLastPageLen: t.KVLastPageLen},
		}
	}
	return p
}

// inputs uploads the same random q and new K/V rows to both sides.
func (r *graphRig) inputs() {
	for _, x := range []struct {
		dt    layout.DType
		shape []int
		dst   [2]cuda.DeviceTensor
	}{{layout.F16, r.q[0].Shape, r.q}, {layout.F16, r.k[0].Shape, r.k}, {layout.F16, r.v[0].Shape, r.v}} {
		h := kernels.NewTensor(x.dt, x.shape...)
		fillRandom(r.rng, h.Data)
		for side := range 2 {
			require.NoError(r.t, r.b.Upload(x.dst[side], h))
		}
	}
}

// prefix views the first rows rows of x (no copy).
func prefix(x cuda.DeviceTensor, rows int) cuda.DeviceTensor {
	return cuda.DeviceTensor{DType: x.DType, Shape: append([]int{rows}, x.Shape[1:]...), Ptr: x.Ptr}
}

// layers queues every layer's append and attention of the current plan on
// side's step.
func (r *graphRig) layersOn(side int, s *cuda.Step, rows, nnz int) error {
	q, o, lse, k, v := r.q[side], r.o[side], r.lse[side], r.k[side], r.v[side]
	if side == 0 {
		q, o, lse, k, v = prefix(q, rows), prefix(o, rows), prefix(lse, rows*r.hq), prefix(k, nnz), prefix(v, nnz)
	}
	for _, c := range r.caches[side] {
		if err := s.Append(c, k, v, 0, 0); err != nil {
			return err
		}
		if err := s.Attention(c, q, o, lse); err != nil {
			return err
		}
	}
	return nil
}

func (r *graphRig) capture(p *cuda.StepPlan) {
	require.NoError(r.t, r.fixed.BeginCapture(p))
	require.NoError(r.t, r.layersOn(1, r.fixed, p.Rows, len(p.BatchIndices)))
	g, err := r.fixed.EndCapture()
	require.NoError(r.t, err)
	r.t.Cleanup(func() { require.NoError(r.t, g.Destroy()) })
	r.graph = g
}

// step runs p eagerly and by replay and compares o, lse and every cache.
func (r *graphRig) step(i int, p *cuda.StepPlan) {
	r.inputs()
	require.NoError(r.t, r.eager.Plan(p))
	require.NoError(r.t, r.layersOn(0, r.eager, p.Rows, len(p.BatchIndices)))
	before := r.b.Traffic()
	require.NoError(r.t, r.graph.Replay(p))
	moved := r.b.Traffic().Sub(before)
	require.Equal(r.t, cuda.Traffic{GraphLaunches: 1}, moved, "step %d: a replay is one graph launch", i)
	what := fmt.Sprintf("step %d (batch %d, rows %d)", i, p.Table.BatchSize(), p.Rows)
	oBytes := p.Rows * r.hq * r.g.HeadDim * 2
	var out [2][]byte
	var lse [2][]float32
	for side := range 2 {
		h := kernels.NewTensor(layout.F16, r.lim.MaxRows, r.hq, r.g.HeadDim)
		require.NoError(r.t, r.b.Download(h, r.o[side]))
		out[side] = h.Data[:oBytes]
		lse[side] = make([]float32, r.lim.MaxRows*r.hq)
		require.NoError(r.t, r.b.DownloadF32(lse[side], r.lse[side]))
		lse[side] = lse[side][:p.Rows*r.hq]
	}
	require.True(r.t, bytes.Equal(out[0], out[1]), "%s: o differs between eager and replay", what)
	require.Equal(r.t, lse[0], lse[1], "%s: lse", what)
	for l := range r.layers {
		var c [2]*kernels.PagedKVCache
		for side := range 2 {
			h, err := kernels.NewPagedKVCache(r.g)
			require.NoError(r.t, err)
			c[side] = &h
			require.NoError(r.t, r.b.DownloadKVCache(c[side], r.caches[side][l]))
		}
		require.True(r.t, bytes.Equal(c[0].K, c[1].K) && bytes.Equal(c[0].V, c[1].V), "%s: layer %d cache differs", what, l)
	}
}

// TestGraphReplayEqualsEager captures one step (plan upload, then append
// and attention for 2 layers) on the emulator and replays it for 100
// random steps whose batch, rows, pages and lengths change within the
// captured limits: o, lse and the caches equal the eager run's exactly.
func TestGraphReplayEqualsEager(t *testing.T) {
	for name, rig := range graphDevices(t) {
		for _, kind := range []kernels.AttentionKind{kernels.Decode, kernels.Prefill, kernels.Cascade} {
			t.Run(name+"/"+map[kernels.AttentionKind]string{kernels.Decode: "decode", kernels.Prefill: "prefill", kernels.Cascade: "prefill-cascade"}[kind], func(t *testing.T) {
				r := rig(t, kind, 2, uint64(kind))
				p := r.randomPlan()
				r.capture(p)
				r.step(0, p)
				batches := map[int]bool{}
				for i := 1; i < 100; i++ {
					p := r.randomPlan()
					batches[p.Table.BatchSize()] = true
					r.step(i, p)
				}
				require.Greater(t, len(batches), 3, "the batch size must change")
			})
		}
	}
}

// TestGraphReplaySplitKV: a step captured once on a fixed step that runs
// split-KV (a fixed grid of MaxWorkItems items, padded with empty items,
// and a merge over MaxRows rows) replays correctly for batches whose split
// differs from the captured one's and from each other's: chunks forced to
// 3 keys over short requests, and the scheduler's own split (4 SMs: a
// fixed grid of 2*12 + 4*4 items) over requests of up to 400 keys. Each replay equals the eager run on a plain
// step, which schedules the same chunks.
func TestGraphReplaySplitKV(t *testing.T) {
	bigRig := rigShape{pageSize: 16, numPages: 256, maxPages: 200, extraKeys: 400}
	for _, c := range []struct {
		name string
		cfg  cpuemu.Config
		sh   rigShape
	}{{"forced3", cpuemu.Config{MaxChunkTokens: 3}, smallRig}, {"auto", cpuemu.Config{NumSMs: 4}, bigRig}} {
		for _, kind := range []kernels.AttentionKind{kernels.Decode, kernels.Prefill, kernels.Cascade} {
			t.Run(c.name+"/"+map[kernels.AttentionKind]string{kernels.Decode: "decode", kernels.Prefill: "prefill", kernels.Cascade: "prefill-cascade"}[kind], func(t *testing.T) {
				r := newEmuGraphRig(t, c.cfg, c.sh, kind, 1, 100+uint64(kind))
				p := r.randomPlan()
				r.capture(p)
				items, merged := r.fixed.ScheduledItems()
				require.True(t, merged, "a fixed split step always merges")
				splits := map[int]bool{items: true}
				split := 0
				for i := range 20 {
					p := r.randomPlan()
					r.step(i, p)
					n, _ := r.eager.ScheduledItems()
					m, _ := r.fixed.ScheduledItems()
					require.Equal(t, n, m, "step %d: the fixed step scheduled other chunks than the plain one", i)
					splits[n] = true
					if n > p.Rows {
						split++
					}
				}
				require.Greater(t, len(splits), 3, "the split must change from step to step")
				require.Greater(t, split, 5, "many steps must split")
			})
		}
	}
}

// TestGraphReplayTiledPrefill is TestGraphReplayEqualsEager for prefill
// and cascade on the tiled tensor-core kernel (head_dim 64): a fixed
// step's work items (one per tile, padded to max_rows) and launch
// arguments depend on the limits only, so 12 replays equal the eager run.
func TestGraphReplayTiledPrefill(t *testing.T) {
	for _, kind := range []kernels.AttentionKind{kernels.Prefill, kernels.Cascade} {
		t.Run(fmt.Sprint(kind), func(t *testing.T) {
			b, cd := countingEmu(cpuemu.Config{MaxChunkTokens: -1})
			r := newGraphRigDim(t, b, engineMemory{cd.Driver.Alloc, cd.Driver.Free}, smallRig, kind, 1, 7, 64)
			p := r.randomPlan()
			r.capture(p)
			r.step(0, p)
			for i := 1; i < 11; i++ {
				r.step(i, r.randomPlan())
			}
			cd.Record = true
			r.step(11, r.randomPlan())
			var tiled bool
			for _, l := range cd.Launches() {
				tiled = tiled || l.Kernel == "batch_prefill_paged_f16_d64"
			}
			require.True(t, tiled, "the eager step launched no tiled prefill")
		})
	}
}

// TestGraphRefusesBeyondCapture: a replay beyond the captured limits or
// shape is refused before anything is launched, and the graph still
// replays correctly afterwards.
func TestGraphRefusesBeyondCapture(t *testing.T) {
	r := newGraphRig(t, kernels.Decode, 1, 7)
	p := r.randomPlan()
	r.capture(p)
	big := r.randomPlan()
	for len(big.Table.KVIndptr)-1 < r.lim.MaxBatch {
		big = r.randomPlan()
	}
	// one request more than MaxBatch
	big.Table.KVIndptr = append(big.Table.KVIndptr, big.Table.KVIndptr[len(big.Table.KVIndptr)-1])
	big.Table.KVLastPageLen = append(big.Table.KVLastPageLen, 0)
	big.Rows++
	heads := *p
	heads.NumQOHeads = 2
	window := *p
	window.WindowLeft = 3
	noAppend := *p
	noAppend.BatchIndices, noAppend.Positions = nil, nil
	for _, c := range []struct {
		name string
		p    *cuda.StepPlan
		err  error
		msg  string
	}{
		{"batch", big, cuda.ErrStepLimit, "batch = 7 exceeds the step's limit 6"},
		{"heads", &heads, cuda.ErrGraphShape, "num_qo_heads is 2, the graph was captured with 4"},
		{"window", &window, cuda.ErrGraphShape, "the attention parameters"},
		{"no append", &noAppend, cuda.ErrGraphShape, "appending rows is false"},
	} {
		before := r.b.Traffic()
		err := r.graph.Replay(c.p)
		require.ErrorIs(t, err, c.err, c.name)
		require.ErrorContains(t, err, c.msg, c.name)
		require.Equal(t, cuda.Traffic{}, r.b.Traffic().Sub(before), "%s: a refused replay moved or launched something", c.name)
	}
	r.step(1, r.randomPlan())
}

// TestCaptureRules: capture needs a fixed step; while a step captures, the
// backend's other steps and its stream-waiting calls are refused; a failed
// operation while capturing fails EndCapture; a call on a Step while
// another runs is refused.
func TestCaptureRules(t *testing.T) {
	r := newGraphRig(t, kernels.Decode, 1, 9)
	p := r.randomPlan()
	err := r.eager.BeginCapture(p)
	require.ErrorIs(t, err, cuda.ErrStepLimit)
	require.ErrorContains(t, err, "not Fixed")

	require.NoError(t, r.fixed.BeginCapture(p))
	err = r.eager.Plan(p)
	require.ErrorIs(t, err, cuda.ErrConcurrentUse)
	require.ErrorContains(t, err, "another step's graph")
	err = r.b.Synchronize()
	require.ErrorIs(t, err, cuda.ErrConcurrentUse)
	require.ErrorContains(t, err, "Synchronize")
	// tensors of the plan's rows, not the fixed step's MaxRows: refused,
	// and EndCapture reports it
	err = r.fixed.Attention(r.caches[1][0], prefix(r.q[1], p.Rows), r.o[1], r.lse[1])
	require.ErrorContains(t, err, "max_rows") // decode rows <= 6 < MaxRows
	_, err = r.fixed.EndCapture()
	require.ErrorContains(t, err, "an operation failed while capturing")
	require.NoError(t, r.b.Synchronize(), "the capture is over")
	require.NoError(t, r.eager.Plan(p))

	// Concurrent calls on one Step: the second is refused while the first
	// is inside the driver.
	gate := &gatedDriver{Driver: cpuemu.NewDriver(0), entered: make(chan struct{}), release: make(chan struct{})}
	b := cuda.NewWithDriver("emu", gate, cuda.Config{})
	s, err := b.NewStep(cuda.StepLimits{MaxBatch: 6, MaxPages: 40, MaxRows: 12})
	require.NoError(t, err)
	defer s.Free()
	noAttn := &cuda.StepPlan{Geometry: r.g, Table: p.Table, BatchIndices: p.BatchIndices, Positions: p.Positions}
	gate.armed.Store(true)
	var wg sync.WaitGroup
	wg.Add(1)
	var first error
	go func() { defer wg.Done(); first = s.Plan(noAttn) }()
	<-gate.entered
	err = s.Plan(noAttn)
	close(gate.release)
	wg.Wait()
	require.NoError(t, first)
	require.ErrorIs(t, err, cuda.ErrConcurrentUse)
	require.ErrorContains(t, err, "step plan")
}

// gatedDriver holds its first asynchronous copy until released.
type gatedDriver struct {
	cuda.Driver
	armed            atomic.Bool
	entered, release chan struct{}
}

func (d *gatedDriver) HtoDAsync(dst cuda.DevicePtr, src []byte) error {
	if d.armed.CompareAndSwap(true, false) {
		close(d.entered)
		<-d.release
	}
	return d.Driver.HtoDAsync(dst, src)
}

// TestExternalBufferRefusals: engine memory of the wrong size, alignment or
// dtype is refused when wrapped or before any launch.
func TestExternalBufferRefusals(t *testing.T) {
	r := newGraphRig(t, kernels.Decode, 1, 11)
	q := r.q[0] // [12, 4, 32] f16, 3072 bytes
	for _, c := range []struct {
		name  string
		ptr   uintptr
		bytes int64
		dt    layout.DType
		shape []int
		msg   string
	}{
		{"too small", uintptr(q.Ptr), 3071, layout.F16, q.Shape, "3071 bytes at"},
		{"null", 0, 3072, layout.F16, q.Shape, "null device pointer"},
		{"misaligned", uintptr(q.Ptr) + 2, 3070, layout.F16, []int{1}, "not 16-byte aligned"},
		{"bad dtype", uintptr(q.Ptr), 3072, layout.DType(99), q.Shape, "dtype"},
		{"negative dim", uintptr(q.Ptr), 3072, layout.F16, []int{-1, 4}, "shape"},
	} {
		_, err := cuda.WrapDeviceTensor(c.ptr, c.bytes, c.dt, c.shape...)
		require.ErrorIs(t, err, kernels.ErrInvalidTensor, c.name)
		require.ErrorContains(t, err, c.msg, c.name)
	}
	p := r.randomPlan()
	require.NoError(t, r.eager.Plan(p))
	rows, nnz := p.Rows, len(p.BatchIndices)
	asDType := func(x cuda.DeviceTensor, dt layout.DType) cuda.DeviceTensor {
		x.DType = dt
		return x
	}
	before := r.b.Traffic()
	c := r.caches[0][0]
	err := r.eager.Attention(c, asDType(prefix(q, rows), layout.E4M3), prefix(r.o[0], rows), prefix(r.lse[0], rows*r.hq))
	require.ErrorContains(t, err, "q is e4m3, want f32, f16 or bf16")
	err = r.eager.Attention(c, prefix(q, rows+1), prefix(r.o[0], rows), prefix(r.lse[0], rows*r.hq))
	require.ErrorContains(t, err, "q has shape")
	err = r.eager.Attention(c, prefix(q, rows), prefix(r.o[0], rows), asDType(prefix(r.lse[0], rows*r.hq), layout.F16))
	require.ErrorContains(t, err, "lse is f16, want f32")
	err = r.eager.Append(c, asDType(prefix(r.k[0], nnz), layout.BF16), prefix(r.v[0], nnz), 0, 0)
	require.ErrorIs(t, err, kernels.ErrInvalidTensor)
	err = r.eager.Append(c, prefix(r.k[0], nnz+1), prefix(r.v[0], nnz+1), 0, 0)
	require.ErrorContains(t, err, "append_key has shape")
	require.Equal(t, cuda.Traffic{}, r.b.Traffic().Sub(before), "a refused operation launched or copied")
}

// FuzzGraphReplay feeds raw index arrays (any lengths, any int32) as a
// decode step to a captured graph: a replay is refused exactly as the plain
// step's Plan refuses the same arrays (or for its shape) and then copies
// and launches nothing; an accepted replay equals the eager run.
func FuzzGraphReplay(f *testing.F) {
	for _, s := range kernelstest.RawSeeds() {
		f.Add(s)
	}
	r := newGraphRig(f, kernels.Decode, 1, 13)
	r.capture(r.randomPlan())
	f.Fuzz(func(t *testing.T, data []byte) {
		_, ix := kernelstest.DecodeRaw(data)
		r.t = t
		p := &cuda.StepPlan{Geometry: r.g, BatchIndices: ix.BatchIndices, Positions: ix.Positions, Attention: kernels.Decode,
			Rows: max(len(ix.KVIndptr)-1, 0), AttentionParams: kernels.AttentionParams{NumQOHeads: r.hq, WindowLeft: -1},
			Table: kernels.PageTable{KVIndptr: ix.KVIndptr, KVPageIndices: ix.KVPageIndices, KVLastPageLen: ix.KVLastPageLen}}
		planErr := r.eager.Plan(p)
		before := r.b.Traffic()
		err := r.graph.Replay(p)
		if err != nil {
			require.Equal(t, cuda.Traffic{}, r.b.Traffic().Sub(before), "a refused replay copied or launched: %v", err)
			if !errors.Is(err, cuda.ErrGraphShape) {
				require.Error(t, planErr, "replay refuses (%v), Plan accepts", err)
				require.Equal(t, planErr.Error(), err.Error())
			}
			return
		}
		require.NoError(t, planErr, "replay accepts, Plan refuses")
		r.step(0, p)
	})
}

// FuzzWrapDeviceTensor: WrapDeviceTensor accepts exactly the pointers,
// sizes, dtypes and shapes a big-integer reference accepts (non-null,
// 16-byte aligned, valid dtype, dims >= 0, at most layout.MaxElements
// elements after every dimension, bytes enough), and an accepted tensor
// has the shape asked for and needs at most bytes.
func FuzzWrapDeviceTensor(f *testing.F) {
	f.Add(uint64(1<<20), int64(4096), uint8(layout.F16), []byte{0, 0, 0, 8, 0, 0, 0, 4, 0, 0, 0, 64})
	f.Add(uint64(1<<20), int64(0), uint8(layout.F32), []byte{0, 0, 0, 4, 0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, ptr uint64, size int64, dt uint8, raw []byte) {
		var shape []int
		for i := 0; i+4 <= len(raw) && len(shape) < 6; i += 4 {
			shape = append(shape, int(int32(uint32(raw[i])<<24|uint32(raw[i+1])<<16|uint32(raw[i+2])<<8|uint32(raw[i+3])))*(1+int(raw[i]>>7)*(1<<30)))
		}
		x, err := cuda.WrapDeviceTensor(uintptr(ptr), size, layout.DType(dt), shape...)
		want := ptr != 0 && ptr%16 == 0 && layout.DType(dt).Valid()
		n := big.NewInt(1)
		for _, d := range shape {
			if d < 0 {
				want = false
				break
			}
			n.Mul(n, big.NewInt(int64(d)))
			if n.Cmp(big.NewInt(layout.MaxElements)) > 0 {
				want = false
				break
			}
		}
		if want {
			n.Mul(n, big.NewInt(int64(layout.DType(dt).Size())))
			want = n.Cmp(big.NewInt(size)) <= 0
		}
		if !want {
			require.ErrorIs(t, err, kernels.ErrInvalidTensor, "ptr %#x bytes %d dtype %d shape %v", ptr, size, dt, shape)
			return
		}
		require.NoError(t, err, "ptr %#x bytes %d dtype %d shape %v", ptr, size, dt, shape)
		require.Equal(t, shape, x.Shape)
		require.Equal(t, n.Int64(), x.Bytes())
	})
}

// TestReplayAllocationFree: planning a fixed step and replaying its graph
// allocate nothing once the step has seen a plan of that shape.
func TestReplayAllocationFree(t *testing.T) {
	b := cuda.NewWithDriver("nop", &nopDriver{}, cuda.Config{})
	g := layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F16, NumPages: 64, PageSize: 16, NumKVHeads: 2, HeadDim: 128}
	cache, err := b.NewKVCache(g)
	require.NoError(t, err)
	const maxRows = 8
	s, err := b.NewStep(cuda.StepLimits{MaxBatch: 8, MaxPages: 64, MaxRows: maxRows, MaxLevels: 2, MaxQOHeads: 8, MaxHeadDim: 128, Fixed: true})
	require.NoError(t, err)
	table := kernels.PageTable{KVIndptr: []int32{0, 3, 5, 9}, KVPageIndices: []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}, KVLastPageLen: []int32{7, 16, 1}}
	p := &cuda.StepPlan{Geometry: g, Table: table, BatchIndices: []int32{0, 1, 2}, Positions: []int32{38, 31, 48}, Attention: kernels.Decode,
		Rows: 3, AttentionParams: kernels.AttentionParams{NumQOHeads: 8, WindowLeft: -1}}
	t3 := func(heads int) cuda.DeviceTensor {
		x, err := b.AllocTensor(g.DType, maxRows, heads, 128)
		require.NoError(t, err)
		return x
	}
	kv, q, o := t3(2), t3(8), t3(8)
	require.NoError(t, s.BeginCapture(p))
	require.NoError(t, s.Append(cache, kv, kv, 0, 0))
	require.NoError(t, s.Attention(cache, q, o, cuda.DeviceTensor{}))
	graph, err := s.EndCapture()
	require.NoError(t, err)
	require.NoError(t, graph.Replay(p))
	assert.Zero(t, testing.AllocsPerRun(20, func() { require.NoError(t, graph.Replay(p)) }), "replay")
	assert.Zero(t, testing.AllocsPerRun(20, func() { require.NoError(t, s.Plan(p)) }), "fixed plan")
}

// TestGraphReplaySinks: attention sinks are uploaded with each plan, so a
// graph captured with sinks replays steps whose sink values change, on a
// fixed step without split-KV (one item per row; with sinks every row's
// state is still merged, over a grid padded to max_rows) and on one with
// it. Each replay equals the eager run, whose sinks the conformance suites
// check against the float64 model.
func TestGraphReplaySinks(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  cpuemu.Config
	}{{"one-item-per-row", cpuemu.Config{MaxChunkTokens: -1}}, {"split", cpuemu.Config{MaxChunkTokens: 3}}} {
		for _, kind := range []kernels.AttentionKind{kernels.Decode, kernels.Prefill, kernels.Cascade} {
			t.Run(c.name+"/"+map[kernels.AttentionKind]string{kernels.Decode: "decode", kernels.Prefill: "prefill", kernels.Cascade: "prefill-cascade"}[kind], func(t *testing.T) {
				r := newEmuGraphRig(t, c.cfg, smallRig, kind, 1, 300+uint64(kind))
				withSinks := func() *cuda.StepPlan {
					p := r.randomPlan()
					p.Sinks = kernelstest.RandomSinks(r.rng, r.hq)
					return p
				}
				p := withSinks()
				r.capture(p)
				_, merged := r.fixed.ScheduledItems()
				require.True(t, merged, "a step with sinks always merges")
				for i := range 8 {
					r.step(i, withSinks())
				}
				noSinks := r.randomPlan()
				require.ErrorIs(t, r.graph.Replay(noSinks), cuda.ErrGraphShape, "a graph captured with sinks refuses a plan without")
			})
		}
	}
}
