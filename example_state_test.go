package pagedkv_test

import (
	"fmt"

	"github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/layergroup"
)

// A Qwen3-Next-like model: three Gated DeltaNet (state) groups to one full
// attention group. The engine ends prefill chunks at NextStateCheckpoint,
// so the prompt's state is checkpointed; a second request with the same
// prompt resumes from that checkpoint: its first step copies the
// checkpoint's slot into its own (Copies) before the kernels read
// StateIndices. See docs/state-groups.md.
func ExampleHybridManager_stateGroups() {
	gdn := pagedkv.LayerGroup{Kind: pagedkv.StateLayers, NumLayers: 1, State: layergroup.StateShape{
		ConvShape: [2]int{64, 3}, ConvDType: layergroup.StateBF16,
		SSMShape: [3]int{2, 16, 16}, SSMDType: layergroup.StateF32, PageBytes: 4096}}
	m, err := pagedkv.NewHybrid(pagedkv.HybridConfig{
		Config: pagedkv.Config{NumPages: 64, PageSize: 16, HashSeed: 1},
		Groups: []pagedkv.LayerGroup{gdn, gdn, gdn, {Kind: pagedkv.FullAttention, NumLayers: 1}},
	})
	if err != nil {
		panic(err)
	}
	prompt := make([]int32, 40)
	for i := range prompt {
		prompt[i] = int32(100 + i)
	}
	for id := range pagedkv.RequestID(2) {
		hit, err := m.Add(id, pagedkv.Request{Prompt: prompt})
		if err != nil {
			panic(err)
		}
		fmt.Printf("request %d: hit %d tokens\n", id, hit)
		for m.Computed(id) < len(prompt) {
			c := m.Computed(id)
			n := len(prompt) - c
			if b := m.NextStateCheckpoint(id); b > 0 {
				n = b - c // end the chunk at the checkpoint
			}
			p, err := m.Reserve([]pagedkv.RequestID{id}, []int32{int32(n)})
			if err != nil {
				panic(err)
			}
			fmt.Printf("  step of %d tokens from %d: state slot %d, %d state copies first\n",
				n, c, p.Groups[0].StateIndices[0], len(p.Groups[0].Copies))
			if err := m.Commit(nil); err != nil {
				panic(err)
			}
		}
	}
	fmt.Println("checkpoints:", m.Stats().Groups[0].CachedPages)
	// Output:
	// request 0: hit 0 tokens
	//   step of 32 tokens from 0: state slot 2, 0 state copies first
	//   step of 8 tokens from 32: state slot 6, 1 state copies first
	// request 1: hit 32 tokens
	//   step of 8 tokens from 32: state slot 10, 1 state copies first
	// checkpoints: 1
}
