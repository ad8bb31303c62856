package pagedkv_test

import (
	"fmt"

	"github.com/pagedkv/pagedkv"
)

// Two requests share a 32-token prompt prefix. The second one is served the
// first one's full pages from the prefix cache, and each step hands the
// engine the FlashInfer arrays it needs. README.md shows the same code.
func Example() {
	m, err := pagedkv.New(pagedkv.Config{NumPages: 64, PageSize: 16, HashSeed: 1})
	if err != nil {
		panic(err)
	}
	prompt := make([]int32, 40)
	for i := range prompt {
		prompt[i] = int32(100 + i)
	}

	// Request 1: prefill its whole prompt in one step.
	if _, err := m.Add(1, pagedkv.Request{Prompt: prompt}); err != nil {
		panic(err)
	}
	plan, err := m.Reserve([]pagedkv.RequestID{1}, []int32{40})
	if err != nil {
		panic(err)
	}
	// The engine now copies plan.Copies, appends K/V at plan.BatchIndices /
	// plan.Positions, and runs attention over plan.KVIndptr,
	// plan.KVPageIndices and plan.KVLastPageLen.
	fmt.Println("kv_indptr", plan.KVIndptr, "kv_last_page_len", plan.KVLastPageLen)
	if err := m.Commit([]int32{7}); err != nil { // request 1 sampled token 7
		panic(err)
	}

	// Request 2 has the same prompt: its two full pages come from the cache.
	matched, err := m.Add(2, pagedkv.Request{Prompt: prompt})
	if err != nil {
		panic(err)
	}
	fmt.Println("request 2 matched", matched, "tokens")

	// One step: request 1 decodes one token, request 2 prefills the rest.
	plan, err = m.Reserve([]pagedkv.RequestID{1, 2}, []int32{1, 40 - int32(matched)})
	if err != nil {
		panic(err)
	}
	fmt.Println("qo_indptr", plan.QOIndptr, "seq_lens", plan.SeqLens)
	if err := m.Commit([]int32{8, 9}); err != nil {
		panic(err)
	}
	if err := m.Audit(); err != nil {
		panic(err)
	}
	// Output:
	// kv_indptr [0 3] kv_last_page_len [8]
	// request 2 matched 32 tokens
	// qo_indptr [0 1 9] seq_lens [41 40]
}
