package main

/*
#define PAGEDKV_NO_PROTOTYPES
#include "pagedkv.h"
*/
import "C"

import (
	"time"

	"github.com/pagedkv/pagedkv"
)

// Bounds of pagedkv_bench_decode_steps.
const (
	maxBenchRequests = 1 << 16
	maxBenchTokens   = 1 << 20 // prompt + warm + steps
)

// pagedkv_bench_decode_steps is the Go side of python/bench_step.py: it
// runs the decode workload that script runs through the binding, on a
// Manager of its own, directly in Go, and stores the nanoseconds the
// measured steps took. requests requests with distinct prompts of prompt
// tokens are prefilled in one step, warm steps are run, then steps decode
// steps (Reserve of one token per request, then Commit of one sampled token
// each) are timed. Not in pagedkv.h: a benchmark hook, like
// pagedkv_debug_panic.
//
//export pagedkv_bench_decode_steps
func pagedkv_bench_decode_steps(requests, prompt, warm, steps, pageSize C.int64_t, ns *C.int64_t) (code C.int32_t) {
	defer recoverTo(&code)
	// Each bound is checked alone before any sum, so no value wraps past
	// them (INT64_MAX warm and steps once summed to a small number).
	if requests < 1 || prompt < 1 || warm < 0 || steps < 1 || pageSize < 1 || ns == nil ||
		requests > maxBenchRequests || prompt > maxBenchTokens || warm > maxBenchTokens || steps > maxBenchTokens ||
		prompt+warm+steps > maxBenchTokens {
		return badArg("bench_decode_steps: requests %d, prompt %d, warm %d, steps %d, page_size %d, ns %p: want requests 1..%d, prompt+warm+steps <= %d",
			int64(requests), int64(prompt), int64(warm), int64(steps), int64(pageSize), ns, maxBenchRequests, maxBenchTokens)
	}
	r, ps, total := int(requests), int(pageSize), int(prompt+warm+steps)+1
	// ceil(total/ps)+1 pages per request, written so that a huge page
	// size cannot overflow.
	m, err := pagedkv.New(pagedkv.Config{NumPages: r * ((total-1)/ps + 2), PageSize: ps, HashSeed: 1})
	if err != nil {
		return failErr(err)
	}
	ids := make([]pagedkv.RequestID, r)
	ntok := make([]int32, r)
	ones := make([]int32, r)
	sampled := make([]int32, r)
	p := make([]int32, prompt)
	for i := range ids {
		ids[i] = pagedkv.RequestID(i + 1)
		for j := range p {
			p[j] = int32(i*int(prompt) + j)
		}
		if _, err := m.Add(ids[i], pagedkv.Request{Prompt: p, CapacityTokens: total}); err != nil {
			return failErr(err)
		}
		ntok[i], ones[i], sampled[i] = int32(prompt), 1, 7
	}
	step := func(nt []int32) error {
		if _, err := m.Reserve(ids, nt); err != nil {
			return err
		}
		return m.Commit(sampled)
	}
	if err := step(ntok); err != nil {
		return failErr(err)
	}
	for range warm {
		if err := step(ones); err != nil {
			return failErr(err)
		}
	}
	start := time.Now()
	for range steps {
		if err := step(ones); err != nil {
			return failErr(err)
		}
	}
	*ns = C.int64_t(time.Since(start).Nanoseconds())
	return C.PAGEDKV_OK
}

// goBenchDecodeSteps calls pagedkv_bench_decode_steps as C would (for the
// Go tests: test files cannot use cgo's C types).
func goBenchDecodeSteps(requests, prompt, warm, steps, pageSize int64) (ns int64, code int32) {
	var out C.int64_t
	code = int32(pagedkv_bench_decode_steps(C.int64_t(requests), C.int64_t(prompt), C.int64_t(warm), C.int64_t(steps), C.int64_t(pageSize), &out))
	return int64(out), code
}
