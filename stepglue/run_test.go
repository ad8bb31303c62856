package stepglue_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/stepglue"
)

// TestCPUCascadeEqualsFlat runs a shared-prefix step through the CPU
// calls twice on the CPU backend: as the Manager's cascade (queries in
// cascade row order) and as the same plan without its cascade (flat
// decode). Both must give the same attention.
func TestCPUCascadeEqualsFlat(t *testing.T) {
	g := layout.Paged{Layout: layout.NHD, DType: layout.F32, NumPages: 64, PageSize: 4, NumKVHeads: 2, HeadDim: 8}
	const heads = 4
	m, err := pagedkv.New(pagedkv.Config{NumPages: g.NumPages, PageSize: g.PageSize, HashSeed: 1, CascadeMinSavedPages: 1})
	if err != nil {
		t.Fatal(err)
	}
	cache, err := kernels.NewPagedKVCache(g)
	if err != nil {
		t.Fatal(err)
	}
	be := cpu.New(cpu.Config{Workers: 1})
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(rows, h int) kernels.Tensor {
		x := make([]float32, rows*h*g.HeadDim)
		for i := range x {
			x[i] = rng.Float32()*2 - 1
		}
		return kernels.TensorFromF32(layout.F32, x, rows, h, g.HeadDim)
	}
	ap := kernels.AttentionParams{NumQOHeads: heads}
	var host stepglue.CPU
	step := func(ids []pagedkv.RequestID, n []int32) *pagedkv.Plan {
		plan, err := m.Reserve(ids, n)
		if err != nil {
			t.Fatal(err)
		}
		if err := stepglue.CPUStep(&host, plan, ap); err != nil {
			t.Fatal(err)
		}
		rows := len(plan.TokenIDs)
		if err := host.AppendKV(be, cache, random(rows, g.NumKVHeads), random(rows, g.NumKVHeads)); err != nil {
			t.Fatal(err)
		}
		return plan
	}
	prompt := func(id int32) []int32 {
		p := make([]int32, 40)
		for i := range p {
			p[i] = int32(i)
		}
		p[39] = 100 + id
		return p
	}
	if _, err := m.Add(1, pagedkv.Request{Prompt: prompt(1)}); err != nil {
		t.Fatal(err)
	}
	step([]pagedkv.RequestID{1}, []int32{40})
	if err := m.Commit([]int32{7}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []pagedkv.RequestID{2, 3} {
		matched, err := m.Add(id, pagedkv.Request{Prompt: prompt(int32(id))})
		if err != nil || matched != 36 {
			t.Fatalf("request %d matched %d tokens (%v), want 36", id, matched, err)
		}
	}
	plan := step([]pagedkv.RequestID{1, 2, 3}, []int32{1, 4, 4})
	if host.Kind != kernels.Cascade {
		t.Fatalf("a step of three requests over a 36-token shared prefix is %v, want cascade", host.Kind)
	}
	rows := len(plan.TokenIDs)
	q := random(rows, heads)

	// The cascade: q and o in cascade row order.
	order := plan.Cascade.QueryRows()
	rowElems := heads * g.HeadDim
	qf, qcf := q.F32(), make([]float32, rows*rowElems)
	for r, src := range order {
		copy(qcf[r*rowElems:(r+1)*rowElems], qf[int(src)*rowElems:])
	}
	qc := kernels.TensorFromF32(layout.F32, qcf, rows, heads, g.HeadDim)
	oc := kernels.NewTensor(layout.F32, rows, heads, g.HeadDim)
	if err := host.Attention(be, cache, qc, oc); err != nil {
		t.Fatal(err)
	}

	// The same plan without its cascade.
	flat := *plan
	flat.Cascade, flat.CascadeWindowLeft = nil, nil
	var fh stepglue.CPU
	if err := stepglue.CPUStep(&fh, &flat, ap); err != nil {
		t.Fatal(err)
	}
	if fh.Kind != kernels.Prefill {
		t.Fatalf("the flat plan is %v, want prefill", fh.Kind)
	}
	o := kernels.NewTensor(layout.F32, rows, heads, g.HeadDim)
	if err := fh.Attention(be, cache, q, o); err != nil {
		t.Fatal(err)
	}
	of, ocf := o.F32(), oc.F32()
	for r, dst := range order {
		for i := range rowElems {
			got, want := ocf[r*rowElems+i], of[int(dst)*rowElems+i]
			if math.Abs(float64(got-want)) > 1e-5 {
				t.Fatalf("row %d element %d: cascade %v, flat %v", dst, i, got, want)
			}
		}
	}
	// A layer's calls (the append through appendkv's runner) allocate
	// nothing.
	k, v := random(rows, g.NumKVHeads), random(rows, g.NumKVHeads)
	var layerErr error
	if n := testing.AllocsPerRun(3, func() {
		if err := fh.AppendKV(be, cache, k, v); err != nil {
			layerErr = err
		}
		if err := fh.Attention(be, cache, q, o); err != nil {
			layerErr = err
		}
	}); n != 0 || layerErr != nil {
		t.Errorf("AppendKV and Attention: %v allocations per layer (err %v), want 0", n, layerErr)
	}
	if err := m.Commit([]int32{8, 9, 10}); err != nil {
		t.Fatal(err)
	}
}
