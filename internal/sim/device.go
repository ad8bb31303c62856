package sim

import (
	"errors"
	"fmt"
	"time"

	pagedkv "github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cuda"
	"github.com/pagedkv/pagedkv/layout"
)

// deviceEngine is the engine's device-resident path, taken when the
// backend is a *cuda.Backend (emu, cuda): every layer's cache is allocated
// once in device memory and never crosses to the host; each simulator step
// plans one cuda.Step (its index arrays in one copy) and runs it on every
// layer; copy-on-write copies stay on the device. The simulator's model
// lives on the host, so each layer uploads its K/V/Q rows and downloads
// o (a real engine's would stay on the device); verification mirrors the
// pages it reads into the host caches. Traffic is counted in those three
// classes.
type deviceEngine struct {
	b          *cuda.Backend
	caches     []*cuda.DeviceKVCache
	step       *cuda.Step
	lim        cuda.StepLimits
	k, v, q, o cuda.DeviceTensor
	rows       int // rows the tensors hold

	traffic DeviceTraffic
}

// DeviceTraffic is what crossed the host/device boundary in a run on a
// device backend, by purpose.
type DeviceTraffic struct {
	// Index is the steps' index arrays (one copy per step).
	Index int64
	// Activations is the K/V/Q rows uploaded and o downloaded per layer.
	Activations int64
	// Cache is any other transfer during the steps: the cache itself
	// would show here, and must stay 0.
	Cache int64
	// Verify is the pages verification downloaded (not part of a step).
	Verify int64
	// Tier is the pages offloaded to and onloaded from the host tier.
	Tier int64
	// Copies is the copy-on-write bytes copied within the device.
	Copies int64
	// PlanTime is the host time of the steps' plans (validation, packing
	// and the one upload of each step's index arrays).
	PlanTime time.Duration
	// LaunchTime is the host time of every layer's Append and Attention
	// calls. A GPU returns from them once the kernels are queued; the
	// emulator runs the kernels inside them, so there it includes the
	// kernels.
	LaunchTime time.Duration
}

func newDeviceEngine(b *cuda.Backend, g layout.Paged, layers int, m Model) (*deviceEngine, error) {
	d := &deviceEngine{b: b}
	for range layers {
		c, err := b.NewKVCache(g)
		if err != nil {
			d.free()
			return nil, fmt.Errorf("%w: device cache: %w", ErrBadConfig, err)
		}
		d.caches = append(d.caches, c)
	}
	d.lim = cuda.StepLimits{MaxBatch: 64, MaxPages: max(g.NumPages, 64), MaxRows: 256, MaxLevels: 4,
		MaxQOHeads: m.NumQOHeads, MaxHeadDim: m.HeadDim}
	return d, nil
}

func (d *deviceEngine) free() {
	for _, c := range d.caches {
		c.Free(d.b)
	}
	if d.step != nil {
		d.step.Free()
	}
	for _, t := range []cuda.DeviceTensor{d.k, d.v, d.q, d.o} {
		_ = d.b.FreeTensor(t)
	}
}

// plan plans the step, growing the step's limits (a new Step, so new
// buffer addresses) when the plan does not fit.
func (d *deviceEngine) plan(p *cuda.StepPlan) error {
	for {
		if d.step == nil {
			s, err := d.b.NewStep(d.lim)
			if err != nil {
				return err
			}
			d.step = s
		}
		err := d.step.Plan(p)
		if !errors.Is(err, cuda.ErrStepLimit) {
			return err
		}
		d.step.Free()
		d.step = nil
		l := &d.lim
		l.MaxBatch, l.MaxPages, l.MaxRows = 2*l.MaxBatch, 2*l.MaxPages, 2*l.MaxRows
		l.MaxWorkItems = 0
	}
}

// tensors makes the device rows hold nnz rows.
func (d *deviceEngine) tensors(m *Model, nnz int) error {
	if nnz <= d.rows && d.q.Ptr != 0 {
		return nil
	}
	n := max(nnz, 2*d.rows)
	for _, t := range []cuda.DeviceTensor{d.k, d.v, d.q, d.o} {
		_ = d.b.FreeTensor(t)
	}
	var err error
	alloc := func(heads int) cuda.DeviceTensor {
		if err != nil {
			return cuda.DeviceTensor{}
		}
		var t cuda.DeviceTensor
		t, err = d.b.AllocTensor(m.DType, n, heads, m.HeadDim)
		return t
	}
	d.k, d.v, d.q, d.o = alloc(m.NumKVHeads), alloc(m.NumKVHeads), alloc(m.NumQOHeads), alloc(m.NumQOHeads)
	d.rows = n
	return err
}

// rowsView is t limited to its first n rows.
func rowsView(t cuda.DeviceTensor, n int) cuda.DeviceTensor {
	return cuda.DeviceTensor{DType: t.DType, Shape: []int{n, t.Shape[1], t.Shape[2]}, Ptr: t.Ptr}
}

// copyPages performs the plan's copy-on-write copies in every layer's
// device cache.
func (d *deviceEngine) copyPages(copies []pagedkv.CopyOp) error {
	for _, c := range copies {
		for _, cache := range d.caches {
			if err := d.b.CopyPage(cache, int(c.Src), int(c.Dst), int(c.Entries)); err != nil {
				return err
			}
		}
	}
	return nil
}

// mirror downloads the pages of request b of table from layer l's device
// cache into the host cache verification reads.
func (d *deviceEngine) mirror(dst *kernels.PagedKVCache, l int, t *kernels.PageTable, b int) error {
	before := d.b.Traffic()
	err := d.b.DownloadPages(dst, d.caches[l], t.KVPageIndices[t.KVIndptr[b]:t.KVIndptr[b+1]])
	d.traffic.Verify += d.b.Traffic().Sub(before).TransferBytes()
	return err
}

// tierTransfer runs one page transfer of a tier copy and counts its bytes.
func (d *deviceEngine) tierTransfer(f func() error) error {
	before := d.b.Traffic()
	err := f()
	d.traffic.Tier += d.b.Traffic().Sub(before).TransferBytes()
	return err
}
