//go:build cgo

package cascade

import (
	"fmt"
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

// Cascade attention with 2, 3 and 4 levels on the device path (the CUDA
// kernels on the emulated device) equals flat attention, as on the CPU:
// once as Run over the device backend (every level's prefill and every
// merge_state a device launch), once as one device step that plans every
// level in a single upload and merges the levels on the device.
func TestCascadeEqualsFlatOnDevice(t *testing.T) {
	flat := cpu.New(cpu.Config{Workers: 2})
	for _, split := range []int{0, 3} {
		dev := cpuemu.NewDevice(cpuemu.Config{MaxChunkTokens: split})
		t.Run("Run", func(t *testing.T) {
			checkCascadeEqualsFlat(t, 8, flat, func(p *Params) error { return Run(dev, p) })
		})
		t.Run("Step", func(t *testing.T) {
			checkCascadeEqualsFlat(t, 8, flat, func(p *Params) error {
				if err := p.Validate(); err != nil {
					return err
				}
				return dev.CascadeLevels(p.Levels, p.Q, &p.Cache, p.Causal, p.AttentionParams, p.O, p.LSE)
			})
		})
	}
}

// TestCascadeStepRejectsLikeCPU: a cascade whose level holds a hostile
// index array (the audit's crafted tables and the raw fuzz seeds, as the
// last level after a valid shared level, and as the only level) is
// rejected by the device step's Plan with the error cascade.Run returns on
// the CPU backend, before anything is copied or launched; the host-API
// CascadeLevels launches nothing either. What the CPU accepts, the step
// accepts.
func TestCascadeStepRejectsLikeCPU(t *testing.T) {
	c := cpu.New(cpu.Config{Workers: 1})
	dev := cpuemu.NewDevice(cpuemu.Config{})
	s, err := dev.NewStep(cuda.StepLimits{MaxBatch: 1 << 12, MaxPages: 1 << 12, MaxRows: 1 << 12, MaxLevels: 2, MaxQOHeads: 8, MaxHeadDim: 64})
	require.NoError(t, err)
	defer s.Free()
	type input struct {
		g  kernelstest.RawGeometry
		ix kernelstest.RawIndices
	}
	g0 := kernelstest.RawGeometry{Layout: layout.NHD, Form: layout.Fused, DType: layout.F32, NumPages: 4, PageSize: 4,
		NumKVHeads: 2, Group: 2, HeadDim: 8, HeadDimCKV: 8, HeadDimKPE: 4}
	var inputs []input
	for _, ix := range kernelstest.HostileTables() {
		inputs = append(inputs, input{g0, ix})
	}
	for _, seed := range kernelstest.RawSeeds() {
		g, ix := kernelstest.DecodeRaw(seed)
		inputs = append(inputs, input{g, ix})
	}
	rejected := 0
	for i, in := range inputs {
		g := layout.Paged{Layout: in.g.Layout, Form: in.g.Form, DType: in.g.DType, NumPages: in.g.NumPages, PageSize: in.g.PageSize,
			NumKVHeads: in.g.NumKVHeads, HeadDim: in.g.HeadDim}
		cache, err := kernels.NewPagedKVCache(g)
		if err != nil || g.NumPages == 0 {
			continue
		}
		nnz := 0
		if n := len(in.ix.QOIndptr); n > 0 {
			nnz = int(min(max(in.ix.QOIndptr[n-1], 0), 64))
		}
		hq := g.NumKVHeads * in.g.Group
		hostile := Level{QOIndptr: in.ix.QOIndptr, KVIndptr: in.ix.KVIndptr, KVPageIndices: in.ix.KVPageIndices, KVLastPageLen: in.ix.KVLastPageLen}
		shared := Level{QOIndptr: []int32{0, int32(nnz)}, KVIndptr: []int32{0, 1}, KVPageIndices: []int32{0}, KVLastPageLen: []int32{1}}
		for _, levels := range [][]Level{{shared, hostile}, {hostile}} {
			what := fmt.Sprintf("input %d, %d levels", i, len(levels))
			p := &Params{Levels: levels, Q: kernels.NewTensor(g.DType, nnz, hq, g.HeadDim), Cache: cache, Causal: true,
				AttentionParams: kernels.AttentionParams{NumQOHeads: hq, WindowLeft: -1},
				O:               kernels.NewTensor(g.DType, nnz, hq, g.HeadDim), LSE: make([]float32, nnz*hq)}
			cpuErr := Run(c, p)
			t0 := dev.Traffic()
			devErr := s.Plan(&cuda.StepPlan{Geometry: g, Attention: kernels.Cascade, Rows: nnz, Levels: levels, Causal: true,
				AttentionParams: p.AttentionParams, Table: kernels.PageTable{KVIndptr: []int32{0}}})
			moved := dev.Traffic().Sub(t0)
			if cpuErr == nil {
				require.NoError(t, devErr, "%s: CPU accepts, device plan rejects", what)
				continue
			}
			rejected++
			require.Error(t, devErr, "%s: CPU rejects (%v), device plan accepts", what, cpuErr)
			require.Equal(t, cpuErr.Error(), devErr.Error(), what)
			require.Equal(t, cuda.Traffic{}, moved, "%s: a rejected plan copied or launched", what)
			t1 := dev.Traffic()
			hostErr := dev.CascadeLevels(levels, p.Q, &p.Cache, p.Causal, p.AttentionParams, p.O, p.LSE)
			require.Equal(t, cpuErr.Error(), hostErr.Error(), what+" (host API)")
			host := dev.Traffic().Sub(t1)
			require.Zero(t, host.Launches+host.HtoDCopies+host.DtoHCopies, "%s: host API moved or launched: %+v", what, host)
		}
	}
	assert.Greater(t, rejected, 20, "the hostile tables must exercise rejections")
}
