package pagedkv

import (
	"errors"
	"fmt"
	"math/big"
	"strings"
	"testing"

	"github.com/pagedkv/pagedkv/layergroup"
)

// stateConfigBad is the slow reference of a state group configuration's
// validity: the values it finds bad, each as an error message must name it
// (nil: the configuration is good). Sizes are computed exactly (big.Int).
func stateConfigBad(s layergroup.StateShape, layers, attnLayers, every, pageSize int) []string {
	var bad []string
	dims := []int{s.ConvShape[0], s.ConvShape[1], s.SSMShape[0], s.SSMShape[1], s.SSMShape[2]}
	for _, d := range dims {
		if d < 1 || d > layergroup.MaxStateBytes {
			bad = append(bad, fmt.Sprint(d))
		}
	}
	for _, dt := range []layergroup.StateDType{s.ConvDType, s.SSMDType} {
		if dt < layergroup.StateF32 || dt > layergroup.StateBF16 {
			bad = append(bad, dt.String())
		}
	}
	if len(bad) == 0 {
		size := func(d layergroup.StateDType, dims ...int) *big.Int {
			b := big.NewInt(int64(d.Size()))
			for _, x := range dims {
				b.Mul(b, big.NewInt(int64(x)))
			}
			return b
		}
		conv, ssm := size(s.ConvDType, dims[:2]...), size(s.SSMDType, dims[2:]...)
		limit := big.NewInt(layergroup.MaxStateBytes)
		if conv.Cmp(limit) > 0 {
			bad = append(bad, fmt.Sprint(dims[0]))
		}
		if ssm.Cmp(limit) > 0 {
			bad = append(bad, fmt.Sprint(dims[2]))
		}
		if len(bad) == 0 && (s.PageBytes < 1 || s.PageBytes > 2*layergroup.MaxStateBytes ||
			new(big.Int).Add(conv, ssm).Cmp(big.NewInt(int64(s.PageBytes))) > 0) {
			bad = append(bad, fmt.Sprint(s.PageBytes))
		}
	} else if s.PageBytes < 1 {
		bad = append(bad, fmt.Sprint(s.PageBytes))
	}
	if layers < 1 || layers != attnLayers {
		bad = append(bad, fmt.Sprint(layers))
	}
	if every < 0 || every > MaxRequestTokens || every%pageSize != 0 {
		bad = append(bad, fmt.Sprint(every))
	}
	return bad
}

// FuzzStateGroupConfig decodes a hybrid configuration of 1-3 state groups
// beside a full group from the input (every field of the state shape, the
// dtypes, the layer count and the checkpoint interval, unbounded):
// NewHybrid either refuses it with ErrBadConfig naming a value the
// reference (stateConfigBad) finds bad, or the reference finds none and
// the manager works: requests prefill to their checkpoints, are restored
// on them, decode, and Audit holds after every call.
func FuzzStateGroupConfig(f *testing.F) {
	// Qwen3-Next-like (GDN: conv 8192x3 bf16, state 32x128x128 f32).
	f.Add(int32(8192), int32(3), int32(32), int32(128), int32(128), uint8(3), uint8(1), int64(4<<20), int32(12), int32(16), uint8(3))
	f.Add(int32(8), int32(3), int32(2), int32(4), int32(8), uint8(3), uint8(1), int64(4096), int32(1), int32(0), uint8(1))
	f.Add(int32(0), int32(3), int32(2), int32(4), int32(8), uint8(3), uint8(1), int64(4096), int32(1), int32(0), uint8(1))
	f.Add(int32(8), int32(3), int32(2), int32(4), int32(8), uint8(9), uint8(1), int64(4096), int32(1), int32(0), uint8(1))
	f.Add(int32(8), int32(3), int32(2), int32(4), int32(8), uint8(3), uint8(1), int64(100), int32(1), int32(0), uint8(1))
	f.Add(int32(1<<30), int32(1<<30), int32(1<<30), int32(1<<30), int32(1<<30), uint8(1), uint8(1), int64(1<<31), int32(1), int32(5), uint8(2))
	f.Add(int32(8), int32(3), int32(2), int32(4), int32(8), uint8(3), uint8(1), int64(4096), int32(2), int32(-4), uint8(1))
	f.Fuzz(func(t *testing.T, c0, c1, s0, s1, s2 int32, convDT, ssmDT uint8, pageBytes int64, layers, every int32, nState uint8) {
		const ps = 4
		shape := layergroup.StateShape{ConvShape: [2]int{int(c0), int(c1)}, ConvDType: layergroup.StateDType(convDT),
			SSMShape: [3]int{int(s0), int(s1), int(s2)}, SSMDType: layergroup.StateDType(ssmDT), PageBytes: int(pageBytes)}
		st := LayerGroup{Kind: StateLayers, NumLayers: int(layers), State: shape}
		attnLayers := 1
		if layers >= 1 && layers <= 64 {
			attnLayers = int(layers)
		}
		groups := []LayerGroup{{Kind: FullAttention, NumLayers: attnLayers}}
		for range 1 + int(nState)%3 {
			groups = append(groups, st)
		}
		h, err := NewHybrid(HybridConfig{Config: Config{NumPages: 48, PageSize: ps, HashSeed: 3}, Groups: groups, StateCheckpointEvery: int(every)})
		bad := stateConfigBad(shape, int(layers), attnLayers, int(every), ps)
		if err != nil {
			if !errors.Is(err, ErrBadConfig) {
				t.Fatalf("NewHybrid: %v, want ErrBadConfig", err)
			}
			if len(bad) == 0 {
				t.Fatalf("NewHybrid refused a configuration the reference finds good: %v", err)
			}
			for _, v := range bad {
				if strings.Contains(err.Error(), v) {
					return
				}
			}
			t.Fatalf("NewHybrid: %q names none of the bad values %q", err, bad)
		}
		if len(bad) > 0 {
			t.Fatalf("NewHybrid accepted a configuration with bad values %q", bad)
		}
		// It works: two requests on one prompt, the second restored on the
		// first's checkpoint.
		prompt := seqTokens(5, 18)
		for id := range RequestID(2) {
			if _, err := h.Add(id, Request{Prompt: prompt}); err != nil {
				t.Fatal(err)
			}
			for h.Computed(id) < len(prompt) {
				n := len(prompt) - h.Computed(id)
				if b := h.NextStateCheckpoint(id); b > 0 {
					n = b - h.Computed(id)
				}
				p, err := h.Reserve([]RequestID{id}, []int32{int32(n)})
				if err != nil {
					t.Fatal(err)
				}
				if len(p.Groups) != len(groups) || len(p.Groups[1].StateIndices) != 1 {
					t.Fatalf("plan of %d groups, state indices %v", len(p.Groups), p.Groups[1].StateIndices)
				}
				if err := h.Commit(nil); err != nil {
					t.Fatal(err)
				}
				if err := h.Audit(); err != nil {
					t.Fatal(err)
				}
			}
		}
		if hit := h.Stats().PromptHitTokens; hit != 16 {
			t.Fatalf("the second request hit %d tokens, want 16 (the checkpoint at its last whole page before the last token)", hit)
		}
	})
}
