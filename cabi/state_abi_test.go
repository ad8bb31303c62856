package main

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/layergroup"
)

// FuzzStateGroupsABI decodes raw bytes into pagedkv_hybrid_create's groups
// (every kind, with the state, indexer and target fields appended to
// pagedkv_layer_group: valid for the kind, or with one field small or far
// out of range; either group_size) and state_checkpoint_every. The call
// must fail, writing no handle and naming the value, exactly when Go's
// NewHybrid refuses the same model (PAGEDKV_ERR_BAD_CONFIG), or the C
// layer does first (a kind or dtype out of range, a state_checkpoint_every
// out of range: PAGEDKV_ERR_BAD_ARGUMENT naming the field). A manager it
// makes runs steps cut at next_state_checkpoint: each state group's
// state_indices has a distinct slot per request, every other group none,
// and pagedkv_audit passes.
func FuzzStateGroupsABI(f *testing.F) {
	f.Add([]byte{4, 2, 0, 4, 1, 0, 0, 0})          // state, full, state
	f.Add([]byte{5, 2, 0, 4, 1, 3, 0, 5, 0, 6, 0}) // state, full, mla, indexer, shared_kv
	f.Add([]byte{3, 1, 0, 4, 1, 9, 9, 0})          // a state group with a bad dtype
	f.Add([]byte{2, 1, 1, 0, 0, 0, 0})             // the earlier group_size
	f.Fuzz(func(t *testing.T, data []byte) {
		runtime.LockOSThread() // goLastError reads this thread's message
		defer runtime.UnlockOSThread()
		next := (*fuzzReader)(&data).next
		pick := func(small int) int64 {
			switch v := next(); {
			case v == 255:
				return -1
			case v == 254:
				return 1 << 40
			case v == 253:
				return math.MaxInt64
			default:
				return int64(v % small)
			}
		}
		n := 1 + next()%6
		words := layerGroupWordsGo
		if next()%8 == 7 {
			words = layerGroupWordsV1
		}
		every := int64(0)
		if next()%2 == 1 {
			every = pick(20)
		}
		w := make([]int64, n*words)
		full := make([]int64, n*layerGroupWordsGo) // what the C layer reads: the appended fields 0 for V1
		for i := range n {
			g := full[i*layerGroupWordsGo : (i+1)*layerGroupWordsGo]
			g[0], g[3] = int64(next()%8), 1 // kind (7: out of range), num_layers
			switch g[0] {
			case 1:
				g[1] = 8 // window
			case 2:
				g[2] = 8 // chunk
			case 4: // state: conv (8, 3) bf16, ssm (2, 4, 8) f32, a 4 KiB page
				copy(g[7:], []int64{8, 3, 3, 2, 4, 8, 1, 4096})
			case 5:
				g[4], g[5], g[6] = int64(next()%n), 128, 64 // an indexer on some group
			case 6:
				g[3], g[4] = 2, int64(next()%n) // shared-KV layers on some group
			}
			if next()%3 == 0 { // one field anywhere, small or out of range
				g[next()%layerGroupWordsGo] = pick(16)
			}
			if words == layerGroupWordsV1 {
				clear(g[layerGroupWordsV1:])
			}
			copy(w[i*words:], g[:words])
		}
		cfg := abiConfig{NumPages: int64(8 + next()%56), PageSize: 4, HashSeed: 9}
		h, code := goHybridCreateWords(cfg, every, w, n, words)
		msg := goLastError()

		// The expected outcome: the C layer's own refusals first, then Go's.
		var want int32 = codeOK
		var needle string
		var specs []pagedkv.LayerGroup
		if every < 0 || every > math.MaxInt32 {
			want, needle = codeBadArgument, fmt.Sprintf("state_checkpoint_every = %d", every)
		}
		for i := 0; i < n && want == codeOK; i++ {
			g := full[i*layerGroupWordsGo : (i+1)*layerGroupWordsGo]
			switch {
			case g[0] < 0 || g[0] > 6:
				want, needle = codeBadArgument, fmt.Sprintf("groups[%d].kind = %d", i, g[0])
			case g[9] < 0 || g[9] > 3:
				want, needle = codeBadArgument, fmt.Sprintf("groups[%d].conv_dtype = %d", i, g[9])
			case g[13] < 0 || g[13] > 3:
				want, needle = codeBadArgument, fmt.Sprintf("groups[%d].ssm_dtype = %d", i, g[13])
			}
			specs = append(specs, pagedkv.LayerGroup{Kind: layergroup.Kind(g[0]), WindowTokens: int(g[1]), ChunkTokens: int(g[2]),
				NumLayers: int(g[3]), Target: int(g[4]), IndexerHeadDim: int(g[5]), IndexerQuantBlock: int(g[6]),
				State: layergroup.StateShape{ConvShape: [2]int{int(g[7]), int(g[8])}, ConvDType: layergroup.StateDType(g[9]),
					SSMShape: [3]int{int(g[10]), int(g[11]), int(g[12])}, SSMDType: layergroup.StateDType(g[13]), PageBytes: int(g[14])}})
		}
		if want == codeOK {
			_, err := pagedkv.NewHybrid(pagedkv.HybridConfig{Config: pagedkv.Config{NumPages: int(cfg.NumPages), PageSize: 4, HashSeed: 9},
				Groups: specs, StateCheckpointEvery: int(every)})
			if err != nil {
				if !errors.Is(err, pagedkv.ErrBadConfig) {
					t.Fatalf("Go refused the model with %v", err)
				}
				want, needle = codeBadConfig, err.Error()
			}
		}
		if code != want || (want != codeOK && (h != 0 || !strings.Contains(msg, strings.TrimPrefix(needle, "pagedkv: ")))) {
			t.Fatalf("groups %v (group_size %d words), every %d: code %d (%q), handle %d; want code %d naming %q",
				full, words, every, code, msg, h, want, needle)
		}
		if code != codeOK {
			return
		}
		defer goDestroy(h)
		runStateSteps(t, h, specs, next)
	})
}

// runStateSteps adds two requests to hybrid manager h (of groups specs)
// and runs a few steps, each request's chunk cut at its next state
// checkpoint, checking every group's state_indices and the audit.
func runStateSteps(t *testing.T, h uint64, specs []pagedkv.LayerGroup, next func() int) {
	t.Helper()
	prompt := make([]int32, 8+next()%24)
	for i := range prompt {
		prompt[i] = int32(i % 7)
	}
	computed := map[uint64]int{}
	for id := uint64(1); id <= 2; id++ {
		if _, code := goAdd(h, id, abiRequest{Prompt: prompt, PromptLen: int64(len(prompt))}); code != codeOK {
			t.Fatalf("add %d: %d %s", id, code, goLastError())
		}
	}
	p := newCHybridPlan(len(specs))
	defer p.free()
	for range 6 {
		var ids []uint64
		var nt []int32
		for id := uint64(1); id <= 2; id++ {
			left := len(prompt) - computed[id]
			if left == 0 {
				continue
			}
			c, code := goNextStateCheckpoint(h, id)
			if code != codeOK {
				t.Fatalf("next_state_checkpoint: %s", goLastError())
			}
			k := min(left, 5)
			if c > 0 {
				k = min(k, int(c)-computed[id])
			}
			ids, nt = append(ids, id), append(nt, int32(k))
		}
		if len(ids) == 0 {
			break
		}
		if code := goHybridReserveC(h, ids, nt, int64(len(ids)), p); code != codeOK {
			if code == codeOutOfPages {
				break
			}
			t.Fatalf("reserve: %d %s", code, goLastError())
		}
		seen := map[int32]bool{}
		for g, s := range specs {
			idx, code := goStateIndices(h, int64(g))
			if code != codeOK {
				t.Fatal(goLastError())
			}
			want := 0
			if s.Kind == pagedkv.StateLayers {
				want = len(ids)
			}
			if len(idx) != want {
				t.Fatalf("group %d (%v): %d state indices for %d requests", g, s.Kind, len(idx), len(ids))
			}
			for _, x := range idx {
				if seen[x] {
					t.Fatalf("state slot %d given twice in one step", x)
				}
				seen[x] = true
			}
		}
		sampled := make([]int32, len(ids))
		for i := range sampled {
			sampled[i] = -1
		}
		if code := goCommit(h, sampled, int64(len(sampled))); code != codeOK {
			t.Fatalf("commit: %s", goLastError())
		}
		for i, id := range ids {
			computed[id] += int(nt[i])
		}
		if code := goAudit(h); code != codeOK {
			t.Fatalf("audit: %s", goLastError())
		}
	}
}
