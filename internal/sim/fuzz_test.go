package sim

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	pagedkv "github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/internal/invariants"
	"github.com/pagedkv/pagedkv/layout"
)

// randomBytes is n bytes of rng's output, one byte of each Uint32, as
// fuzz input for the seeded random runs.
func randomBytes(rng *rand.Rand, n int) []byte {
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	return data
}

// byteReader hands out bytes of fuzz input, zeros once it runs out.
type byteReader []byte

func (r *byteReader) next() int {
	if len(*r) == 0 {
		return 0
	}
	b := (*r)[0]
	*r = (*r)[1:]
	return int(b)
}

// decodeRun turns bytes into a tiny model, a Manager configuration and a
// workload over three shared prefixes in two namespaces. The pool always
// holds the longest request alone, so the run must finish.
func decodeRun(data []byte) (Config, []Request) {
	r := byteReader(data)
	pageSize := []int{1, 2, 4, 8}[r.next()%4]
	cfg := Config{
		Model:                Model{Layers: 1 + r.next()%2, NumQOHeads: 2, NumKVHeads: 1, HeadDim: 8, DType: layout.F32, Seed: uint64(r.next())},
		KVLayout:             layout.KVLayout(r.next() % 2),
		PageSize:             pageSize,
		CascadeMinSavedPages: 1 + r.next()%4,
		MaxRunning:           1 + r.next()%6,
		VerifyEvery:          1,
		VerifySamples:        4,
		Seed:                 uint64(r.next()),
	}
	if r.next()%2 == 1 {
		cfg.Model.DType = layout.F16
	}
	cfg.MaxStepTokens = cfg.MaxRunning + r.next()%48
	if w := r.next() % 4; w > 0 {
		cfg.WindowTokens = 4 * w * (1 + r.next()%3)
	}
	n := 1 + r.next()%8
	prefixLen := [3]int{1 + r.next()%24, 1 + r.next()%24, 1 + r.next()%24}
	longest := 0
	reqs := make([]Request, n)
	for i := range reqs {
		name := fmt.Sprintf("request %d", i)
		q := Request{Name: name, Arrival: r.next() % 6, Output: 1 + r.next()%10, Samples: 1 + r.next()%3}
		own := r.next() % 20
		switch p := r.next() % 4; p {
		case 3:
			q.Prompt = PromptTokens("", 0, name, 1+own)
		default:
			q.Namespace = []string{"a", "b"}[r.next()%2]
			q.PrefixID, q.PrefixLen = fmt.Sprintf("p%d", p), prefixLen[p]
			q.Prompt = PromptTokens(q.PrefixID, q.PrefixLen, name, q.PrefixLen+own)
		}
		longest = max(longest, len(q.Prompt)+q.Output)
		reqs[i] = q
	}
	// Room for the longest request (and a step's chunk, with a window)
	// plus whatever the input adds.
	cfg.NumPages = (longest+cfg.MaxStepTokens)/pageSize + 2 + r.next()%32
	return cfg, reqs
}

// checkRun runs decoded input: it must finish with every check passed.
func checkRun(t *testing.T, cfg Config, reqs []Request) Summary {
	s, err := New(cfg, reqs)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	sum, err := s.Run()
	if err != nil {
		var b strings.Builder
		sum.Format(&b, &cfg)
		t.Fatalf("config %+v\nworkload %+v\n%v\n%s", cfg, reqs, err, b.String())
	}
	if sum.Stats.Requests != 0 || sum.Stats.UsedPages != 0 {
		t.Fatalf("after the run %d requests and %d used pages remain", sum.Stats.Requests, sum.Stats.UsedPages)
	}
	return sum
}

// FuzzSimulate runs tiny simulations built from the input: any disagreement
// between the Manager's plans, the paged cache and the dense model fails.
func FuzzSimulate(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{2, 0, 1, 0, 1, 3, 2, 0, 10, 1, 7, 20, 8, 12, 0, 3, 1, 0, 5, 0, 2, 5, 1, 1, 1})
	f.Add([]byte{1, 1, 9, 1, 2, 5, 0, 30, 3, 2, 5, 16, 16, 16, 0, 9, 2, 3, 1, 1, 0, 9, 2, 3, 1, 1, 0, 9, 2, 3, 1, 1, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, reqs := decodeRun(data)
		checkRun(t, cfg, reqs)
	})
}

// TestRandomRuns is FuzzSimulate's randomized twin for ordinary test runs;
// it also asserts that the runs as a whole exercised what they should.
func TestRandomRuns(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	runs := 300
	if testing.Short() || invariants.Enabled { // -race
		runs = 60
	}
	var preempted, evicted, copied, cascades, windowed, hits int64
	for range runs {
		data := randomBytes(rng, 96)
		cfg, reqs := decodeRun(data)
		sum := checkRun(t, cfg, reqs)
		st := sum.Stats
		preempted += st.Preemptions
		evicted += st.EvictedPages
		copied += st.CopiedPages
		cascades += int64(sum.CascadeSteps())
		windowed += st.WindowReleasedPages
		hits += st.PromptHitTokens
	}
	for name, n := range map[string]int64{"preemptions": preempted, "evictions": evicted, "copies": copied,
		"cascade steps": cascades, "window releases": windowed, "prefix hits": hits} {
		if n == 0 {
			t.Errorf("%d random runs had no %s", runs, name)
		}
	}
}

// decodeHybridRun is decodeRun's model, Manager settings and workload on a
// hybrid model whose groups come from the leading bytes: 2 to 4 groups, each
// full, sliding (window 1-24) or chunked (1-4 pages), the model's layers in
// each, 0-3 draft tokens per decode step, and in half the runs a host tier
// of 4-24 pages (the HybridManager's tier copies, run by the engine). The
// pool holds the longest request alone in every group.
func decodeHybridRun(data []byte) (Config, []Request) {
	r := byteReader(data)
	kinds := make([][2]int, 2+r.next()%3)
	for g := range kinds {
		kinds[g] = [2]int{r.next() % 3, r.next()}
	}
	spec, host := r.next()%4, r.next()%12
	cfg, reqs := decodeRun(r)
	if host >= 6 {
		cfg.HostPages = 4 * (host - 5)
	}
	for _, k := range kinds {
		s := pagedkv.LayerGroup{Kind: pagedkv.FullAttention, NumLayers: cfg.Model.Layers}
		switch k[0] {
		case 1:
			s.Kind, s.WindowTokens = pagedkv.SlidingAttention, 1+k[1]%24
		case 2:
			s.Kind, s.ChunkTokens = pagedkv.ChunkedAttention, cfg.PageSize*(1+k[1]%4)
		}
		cfg.Groups = append(cfg.Groups, s)
	}
	cfg.Model.Layers *= len(kinds)
	cfg.WindowTokens, cfg.SpecTokens = 0, spec
	cfg.NumPages *= len(kinds)
	return cfg, reqs
}

// FuzzSimulateHybrid runs tiny hybrid simulations built from the input:
// any disagreement between a group's plan, its pages and dense attention
// under its window or chunk fails, as does a page count that does not add
// up over the groups.
func FuzzSimulateHybrid(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 1, 5, 2, 1, 3, 2, 0, 1, 0, 1, 3, 2, 0, 10, 1, 7, 20, 8, 12, 0, 3, 1, 0, 5, 0, 2, 5, 1, 1, 1})
	f.Add([]byte{2, 2, 0, 1, 3, 0, 0, 2, 3, 1, 1, 9, 1, 2, 5, 0, 30, 3, 2, 5, 16, 16, 16, 0, 9, 2, 3, 1, 1, 0, 9, 2, 3, 1, 1, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, reqs := decodeHybridRun(data)
		checkRun(t, cfg, reqs)
	})
}

// TestRandomHybridRuns is FuzzSimulateHybrid's randomized twin: every run
// verifies, and the runs as a whole release pages out of windows and
// chunks, evict, preempt, hit the cache, accept drafts, copy forks'
// partial pages, run the full groups' cascades, and offload pages to a
// host tier. (These short workloads seldom come back for an evicted
// prefix: no run onloads; TestSimulateModelTiers in cmd/pagedkv and the
// cabi hybrid tier traces do.)
func TestRandomHybridRuns(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(16, 17))
	runs := 60
	if testing.Short() || invariants.Enabled { // -race
		runs = 40
	}
	var preempted, evicted, released, hits, accepted, copied, cascades, offloaded int64
	for range runs {
		data := randomBytes(rng, 128)
		cfg, reqs := decodeHybridRun(data)
		sum := checkRun(t, cfg, reqs)
		st := sum.Stats
		preempted += st.Preemptions
		evicted += st.EvictedPages
		released += st.WindowReleasedPages
		hits += st.PromptHitTokens
		accepted += st.AcceptedDraftTokens
		copied += st.CopiedPages
		cascades += int64(sum.CascadeSteps())
		offloaded += st.Tiers.OffloadedPages
	}
	for name, n := range map[string]int64{"preemptions": preempted, "evictions": evicted, "window or chunk releases": released,
		"prefix hits": hits, "accepted drafts": accepted, "copies": copied, "cascade plans": cascades,
		"offloads to the host tier": offloaded} {
		if n == 0 {
			t.Errorf("%d random runs had no %s", runs, name)
		}
	}
}
