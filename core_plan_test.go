package pagedkv

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWindowedManagerPlansAsOneSlidingGroup drives a dense Manager with
// WindowTokens and a HybridManager of one sliding group of the same window
// through the same random workload (prompts sharing a system prefix, forks,
// prefill chunks and decode steps, preemptions, releases) and checks that
// both facades, one code path under their core, make the same Plan for
// every step. The one difference is the documented option of the group
// (docs/manager.md, "Cascade with windows"): a dense Manager's windowed
// group plans flat, a HybridManager's cascades. So a third Manager, whose
// group is given the hybrid's option, must make the hybrid's Plan exactly,
// cascade included, and the plain dense one the same Plan without the
// cascade.
func TestWindowedManagerPlansAsOneSlidingGroup(t *testing.T) {
	const ps, window = 4, 24
	cascades := 0
	for seed := range uint64(12) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			cfg := Config{NumPages: 96, PageSize: ps, HashSeed: 7, CascadeMinSavedPages: 2}
			dcfg := cfg
			dcfg.WindowTokens = window
			flat, err := New(dcfg)
			require.NoError(t, err)
			dense, err := New(dcfg)
			require.NoError(t, err)
			dense.core.groups[0].cascadeWindows = true
			h, err := NewHybrid(HybridConfig{Config: cfg, Groups: []LayerGroup{{Kind: SlidingAttention, WindowTokens: window, NumLayers: 1}}})
			require.NoError(t, err)
			require.Equal(t, flat.Group(0), h.Group(0))
			ms := []KVManager{flat, dense, h}
			// each runs op on every manager and requires the same outcome.
			each := func(what string, op func(m KVManager) (int, error)) error {
				n0, err0 := op(ms[0])
				for i, m := range ms[1:] {
					n, err := op(m)
					require.Equal(t, n0, n, "%s: manager %d", what, i+1)
					require.Equal(t, err0 == nil, err == nil, "%s: manager %d: %v, manager 0: %v", what, i+1, err, err0)
				}
				return err0
			}
			rng := rand.New(rand.NewPCG(seed, 36))
			system := make([]int32, 2*ps+rng.IntN(3*ps))
			for i := range system {
				system[i] = int32(rng.IntN(50))
			}
			var live []RequestID
			next := RequestID(1)
			for step := range 120 {
				// Admit a request or two on the shared prefix.
				for range rng.IntN(3) {
					prompt := append(slices.Clone(system), int32(100+rng.IntN(50)))
					for range rng.IntN(3 * ps) {
						prompt = append(prompt, int32(rng.IntN(50)))
					}
					id := next
					next++
					if each("add", func(m KVManager) (int, error) { return m.Add(id, Request{Prompt: prompt}) }) == nil {
						live = append(live, id)
					}
				}
				if len(live) > 0 && rng.IntN(6) == 0 {
					id, child := live[rng.IntN(len(live))], next
					next++
					if each("fork", func(m KVManager) (int, error) { return 0, m.Fork(id, child) }) == nil {
						live = append(live, child)
					}
				}
				if len(live) > 0 && rng.IntN(10) == 0 {
					id := live[rng.IntN(len(live))]
					if each("preempt", func(m KVManager) (int, error) { return 0, m.Preempt(id) }) == nil {
						each("resume", func(m KVManager) (int, error) { return m.Resume(id) })
					}
				}
				// A step over the running requests: prefill chunks and decodes.
				var ids []RequestID
				var ntokens []int32
				for _, id := range live {
					todo := len(flat.Tokens(id)) - flat.Computed(id)
					if !flat.Running(id) || todo == 0 {
						continue
					}
					ids = append(ids, id)
					ntokens = append(ntokens, int32(min(todo, 1+rng.IntN(2*ps))))
				}
				if len(ids) == 0 {
					continue
				}
				plans := make([]*Plan, len(ms))
				err := each("reserve", func(m KVManager) (int, error) {
					p, err := m.ReserveStep(ids, ntokens, nil)
					if err == nil {
						plans[slices.Index(ms, m)] = p.Groups[0]
					}
					return 0, err
				})
				if errors.Is(err, ErrOutOfPages) {
					id := live[0]
					live = live[1:]
					each("release", func(m KVManager) (int, error) { return 0, m.Release(id) })
					continue
				}
				require.NoError(t, err, "step %d", step)
				require.Nil(t, plans[0].Cascade, "step %d: a dense Manager's windowed group plans flat", step)
				require.Equal(t, *plans[2], *plans[1], "step %d: the dense Manager with the hybrid's option and the one-group HybridManager", step)
				if plans[2].Cascade != nil {
					cascades++
				}
				unCascaded := *plans[2]
				unCascaded.Cascade, unCascaded.CascadeWindowLeft = nil, nil
				require.Equal(t, unCascaded, *plans[0], "step %d: the dense Manager and the one-group HybridManager", step)
				sampled := make([]int32, len(ids))
				for b, id := range ids {
					sampled[b] = NoToken
					if flat.Computed(id)+int(ntokens[b]) == len(flat.Tokens(id)) {
						sampled[b] = int32(rng.IntN(50))
					}
				}
				require.NoError(t, each("commit", func(m KVManager) (int, error) { return 0, m.Commit(sampled) }))
				for _, m := range ms {
					require.NoError(t, m.Audit())
				}
				// Finish requests past a length.
				for i := 0; i < len(live); i++ {
					if id := live[i]; len(flat.Tokens(id)) > len(system)+6*ps {
						require.NoError(t, each("release", func(m KVManager) (int, error) { return 0, m.Release(id) }))
						live = slices.Delete(live, i, i+1)
						i--
					}
				}
				require.Equal(t, flat.PoolStats(), h.PoolStats(), "step %d", step)
			}
			require.Positive(t, flat.PoolStats().WindowReleasedPages, "no page left the window")
		})
	}
	t.Logf("%d steps made cascade plans", cascades)
	require.Positive(t, cascades, "no step made a cascade plan: the workload does not test the option")
}
