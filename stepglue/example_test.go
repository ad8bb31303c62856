package stepglue_test

import (
	"fmt"

	"github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/kernels/cuda"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/stepglue"
)

// One request prefills its prompt, then decodes. Each step's plan becomes
// the host calls (run here on the CPU backend, one layer) and the device
// step a cuda.Step would upload, both in scratch reused across steps.
func Example() {
	g := layout.Paged{Layout: layout.NHD, DType: layout.F32, NumPages: 16, PageSize: 4, NumKVHeads: 1, HeadDim: 4}
	m, err := pagedkv.New(pagedkv.Config{NumPages: g.NumPages, PageSize: g.PageSize, HashSeed: 1})
	if err != nil {
		panic(err)
	}
	cache, err := kernels.NewPagedKVCache(g)
	if err != nil {
		panic(err)
	}
	backend := cpu.New(cpu.Config{Workers: 1})
	if _, err := m.Add(1, pagedkv.Request{Prompt: []int32{1, 2, 3, 4, 5, 6}}); err != nil {
		panic(err)
	}
	var host stepglue.CPU // the engine's scratch, reused every step
	var dev cuda.StepPlan
	ap := kernels.AttentionParams{NumQOHeads: 2}
	for _, n := range []int32{6, 1} {
		plan, err := m.Reserve([]pagedkv.RequestID{1}, []int32{n})
		if err != nil {
			panic(err)
		}
		if err := stepglue.CPUStep(&host, plan, ap); err != nil {
			panic(err)
		}
		if err := stepglue.Device(&dev, plan, g, ap); err != nil {
			panic(err)
		}
		rows := len(plan.TokenIDs)
		k, v := kernels.NewTensor(g.DType, rows, 1, 4), kernels.NewTensor(g.DType, rows, 1, 4)
		q, o := kernels.NewTensor(g.DType, rows, 2, 4), kernels.NewTensor(g.DType, rows, 2, 4)
		if err := host.AppendKV(backend, cache, k, v); err != nil {
			panic(err)
		}
		if err := host.Attention(backend, cache, q, o); err != nil {
			panic(err)
		}
		fmt.Println(host.Kind, "kv_indptr", host.Table.KVIndptr, "device rows", dev.Rows)
		if err := m.Commit([]int32{9}); err != nil {
			panic(err)
		}
	}
	// Output:
	// prefill kv_indptr [0 2] device rows 6
	// decode kv_indptr [0 2] device rows 1
}
