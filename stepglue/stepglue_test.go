package stepglue_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/appendkv"
	"github.com/pagedkv/pagedkv/cascade"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cuda"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/stepglue"
)

var geom = layout.Paged{Layout: layout.NHD, DType: layout.F32, NumPages: 512, PageSize: 4, NumKVHeads: 2, HeadDim: 8}

const hq = 4

// aliases reports whether got is plan's own array (same start and length):
// the glue must not copy.
func aliases(got, want []int32) bool {
	return len(got) == len(want) && unsafe.SliceData(got) == unsafe.SliceData(want)
}

// wantKind is the attention a plan asks for, decided from the rows per
// request counted from BatchIndices (not from QOIndptr, as the glue does).
func wantKind(plan *pagedkv.Plan) kernels.AttentionKind {
	switch {
	case plan.Cascade != nil:
		return kernels.Cascade
	case plan.AttnQOIndptr != nil:
		return kernels.Chunked
	}
	per := make([]int, len(plan.Requests))
	for _, b := range plan.BatchIndices {
		per[b]++
	}
	for _, n := range per {
		if n != 1 {
			return kernels.Prefill
		}
	}
	return kernels.Decode
}

// testSinks are gpt-oss-like attention sinks, one per query head.
var testSinks = func() []float32 {
	s := make([]float32, hq)
	for h := range s {
		s[h] = 0.5 + float32(h)/4
	}
	return s
}()

// checkPlan builds plan's device step and host calls into reused scratch
// and checks them against what internal/sim built before the glue: the
// StepPlan literal, the host parameters, and that every array is the
// plan's own.
func checkPlan(t *testing.T, where string, plan *pagedkv.Plan, dev *cuda.StepPlan, host *stepglue.CPU, kinds map[kernels.AttentionKind]int) {
	t.Helper()
	// Sinks pass through to every kind's attention (a cascade's Run gives
	// them to its last level only, cascade.TestCascadeEqualsFlat).
	ap := kernels.AttentionParams{NumQOHeads: hq, SMScale: 0.5, Sinks: testSinks}
	k := wantKind(plan)
	kinds[k]++
	table := kernels.PageTable{KVIndptr: plan.KVIndptr, KVPageIndices: plan.KVPageIndices, KVLastPageLen: plan.KVLastPageLen}
	wap := ap
	wap.WindowLeft = plan.WindowLeft

	err := stepglue.Device(dev, plan, geom, ap)
	if k == kernels.Chunked {
		if !errors.Is(err, stepglue.ErrUnsupported) {
			t.Fatalf("%s: Device of a chunked plan: err %v, want ErrUnsupported", where, err)
		}
	} else {
		if err != nil {
			t.Fatalf("%s: Device: %v", where, err)
		}
		want := cuda.StepPlan{Geometry: geom, Table: table, BatchIndices: plan.BatchIndices, Positions: plan.Positions,
			Rows: len(plan.TokenIDs), QOIndptr: plan.QOIndptr, Causal: true, AttentionParams: wap}
		switch k {
		case kernels.Cascade:
			want.Attention, want.Levels = kernels.Cascade, plan.Cascade.Levels
			if &dev.Levels[0] != &plan.Cascade.Levels[0] {
				t.Fatalf("%s: device levels are a copy", where)
			}
		case kernels.Decode:
			want.Attention = kernels.Decode
		default:
			want.Attention = kernels.Prefill
		}
		if !reflect.DeepEqual(*dev, want) {
			t.Fatalf("%s: Device = %+v\nwant %+v", where, *dev, want)
		}
		if !aliases(dev.Table.KVPageIndices, plan.KVPageIndices) || !aliases(dev.QOIndptr, plan.QOIndptr) || !aliases(dev.Positions, plan.Positions) {
			t.Fatalf("%s: device arrays are not the plan's", where)
		}
	}

	if err := stepglue.CPUStep(host, plan, ap); err != nil {
		t.Fatalf("%s: CPUStep: %v", where, err)
	}
	want := stepglue.CPU{Kind: k, Table: table,
		Append: appendkv.Plan{AppendIndptr: plan.QOIndptr, SeqLens: plan.SeqLens, BatchIndices: plan.BatchIndices, Positions: plan.Positions}}
	switch k {
	case kernels.Cascade:
		cp := cascade.Params{Levels: plan.Cascade.Levels, Causal: true, AttentionParams: wap, LevelWindowLeft: plan.CascadeWindowLeft}
		cp.WindowLeft = -1
		want.Cascade = cp
	case kernels.Chunked:
		want.Prefill = kernels.PrefillParams{QOIndptr: plan.AttnQOIndptr, Causal: true, AttentionParams: wap,
			Table: kernels.PageTable{KVIndptr: plan.AttnKVIndptr, KVPageIndices: plan.AttnKVPageIndices, KVLastPageLen: plan.AttnKVLastPageLen}}
	case kernels.Decode:
		want.Decode = kernels.DecodeParams{Table: table, AttentionParams: wap}
	default:
		want.Prefill = kernels.PrefillParams{QOIndptr: plan.QOIndptr, Table: table, Causal: true, AttentionParams: wap}
	}
	if !reflect.DeepEqual(*host, want) {
		t.Fatalf("%s: CPUStep = %+v\nwant %+v", where, *host, want)
	}
	if !aliases(host.Table.KVIndptr, plan.KVIndptr) {
		t.Fatalf("%s: host table is not the plan's", where)
	}
}

// driver runs random steps (adds with shared prompts, forks, prefill
// chunks, decodes, releases) on a Manager or HybridManager.
type driver struct {
	rng     *rand.Rand
	add     func(id pagedkv.RequestID, prompt []int32) (int, error)
	release func(id pagedkv.RequestID) error
	reserve func(ids []pagedkv.RequestID, n []int32) ([]*pagedkv.Plan, error)
	left    map[pagedkv.RequestID]int32 // known tokens not yet computed
	next    pagedkv.RequestID
}

func (d *driver) step(t *testing.T) (plans []*pagedkv.Plan, sampled []int32) {
	t.Helper()
	if len(d.left) < 8 && d.rng.IntN(3) == 0 {
		n := 4 + d.rng.IntN(60)
		prompt := make([]int32, n)
		shared := d.rng.IntN(2) == 0
		for i := range prompt {
			if shared && i < 40 {
				prompt[i] = int32(7 + i) // one common prefix
			} else {
				prompt[i] = int32(1000 + d.rng.IntN(5000))
			}
		}
		d.next++
		matched, err := d.add(d.next, prompt)
		if err != nil {
			t.Fatal(err)
		}
		d.left[d.next] = int32(n - matched)
	}
	if len(d.left) > 0 && d.rng.IntN(12) == 0 {
		for id := range d.left {
			if err := d.release(id); err != nil {
				t.Fatal(err)
			}
			delete(d.left, id)
			break
		}
	}
	var ids []pagedkv.RequestID
	var n []int32
	for id, left := range d.left {
		switch {
		case d.rng.IntN(8) == 0:
			ids, n = append(ids, id), append(n, 0) // in the batch, no rows
		case left > 1 && d.rng.IntN(2) == 0:
			ids, n = append(ids, id), append(n, 1+int32(d.rng.IntN(int(left)))) // a prefill chunk
		default:
			ids, n = append(ids, id), append(n, 1)
		}
	}
	for {
		plans, err := d.reserve(ids, n)
		if err == nil {
			sampled = make([]int32, len(ids))
			for i, id := range ids {
				if n[i] == 0 {
					sampled[i] = pagedkv.NoToken
				} else if d.left[id] -= n[i]; d.left[id] == 0 {
					sampled[i], d.left[id] = int32(d.rng.IntN(100)), 1
				} else {
					sampled[i] = pagedkv.NoToken
				}
			}
			return plans, sampled
		}
		if !errors.Is(err, pagedkv.ErrOutOfPages) || len(ids) == 0 {
			t.Fatalf("reserve %v %v: %v", ids, n, err)
		}
		ids, n = ids[:len(ids)/2], n[:len(ids)/2]
	}
}

func TestRandomizedManagerSteps(t *testing.T) {
	for seed := range uint64(3) {
		m, err := pagedkv.New(pagedkv.Config{NumPages: geom.NumPages, PageSize: geom.PageSize, HashSeed: 1, CascadeMinSavedPages: 1})
		if err != nil {
			t.Fatal(err)
		}
		d := &driver{rng: rand.New(rand.NewPCG(seed, 1)), left: map[pagedkv.RequestID]int32{},
			add: func(id pagedkv.RequestID, p []int32) (int, error) {
				return m.Add(id, pagedkv.Request{Prompt: p})
			},
			release: m.Release,
			reserve: func(ids []pagedkv.RequestID, n []int32) ([]*pagedkv.Plan, error) {
				p, err := m.Reserve(ids, n)
				return []*pagedkv.Plan{p}, err
			}}
		run(t, d, func(s []int32) error { return m.Commit(s) }, map[kernels.AttentionKind]bool{kernels.Decode: true, kernels.Prefill: true, kernels.Cascade: true})
	}
}

func TestRandomizedHybridGroupSteps(t *testing.T) {
	groups := []pagedkv.LayerGroup{
		{Kind: pagedkv.FullAttention, NumLayers: 1},
		{Kind: pagedkv.SlidingAttention, WindowTokens: 10, NumLayers: 1},
		{Kind: pagedkv.ChunkedAttention, ChunkTokens: 8, NumLayers: 1},
	}
	for seed := range uint64(3) {
		h, err := pagedkv.NewHybrid(pagedkv.HybridConfig{Config: pagedkv.Config{NumPages: geom.NumPages, PageSize: geom.PageSize, HashSeed: 1, CascadeMinSavedPages: 1}, Groups: groups})
		if err != nil {
			t.Fatal(err)
		}
		d := &driver{rng: rand.New(rand.NewPCG(seed, 2)), left: map[pagedkv.RequestID]int32{},
			add: func(id pagedkv.RequestID, p []int32) (int, error) {
				return h.Add(id, pagedkv.Request{Prompt: p})
			},
			release: h.Release,
			reserve: func(ids []pagedkv.RequestID, n []int32) ([]*pagedkv.Plan, error) {
				p, err := h.Reserve(ids, n)
				if err != nil {
					return nil, err
				}
				return p.Groups, nil
			}}
		run(t, d, func(s []int32) error { return h.Commit(s) }, map[kernels.AttentionKind]bool{kernels.Decode: true, kernels.Prefill: true, kernels.Chunked: true, kernels.Cascade: true})
	}
}

// run drives 400 steps, checks every group plan, and requires every kind
// of want to have been seen.
func run(t *testing.T, d *driver, commit func([]int32) error, want map[kernels.AttentionKind]bool) {
	t.Helper()
	var dev cuda.StepPlan
	var host stepglue.CPU
	kinds := map[kernels.AttentionKind]int{}
	var allocChecked map[kernels.AttentionKind]bool = map[kernels.AttentionKind]bool{}
	for s := range 400 {
		plans, sampled := d.step(t)
		for g, plan := range plans {
			where := fmt.Sprintf("step %d group %d", s, g)
			checkPlan(t, where, plan, &dev, &host, kinds)
			if k := wantKind(plan); !allocChecked[k] || s%50 == 0 {
				allocChecked[k] = true
				if a := allocs(plan, &dev, &host); a != 0 {
					t.Fatalf("%s: a %v step allocates %v times, want 0", where, k, a)
				}
			}
		}
		if err := commit(sampled); err != nil {
			t.Fatalf("step %d commit: %v", s, err)
		}
	}
	for k := range want {
		if kinds[k] == 0 || !allocChecked[k] {
			t.Errorf("no %v plan in 400 steps (seen %v)", k, kinds)
		}
	}
}

// TestAllocationFree: building a step of each kind into reused scratch
// allocates nothing (checked on random Manager and hybrid plans in run).
func allocs(plan *pagedkv.Plan, dev *cuda.StepPlan, host *stepglue.CPU) float64 {
	ap := kernels.AttentionParams{NumQOHeads: hq}
	chunked := plan.AttnQOIndptr != nil // the device refuses it, with an error
	return testing.AllocsPerRun(3, func() {
		if !chunked {
			_ = stepglue.Device(dev, plan, geom, ap)
		}
		_ = stepglue.CPUStep(host, plan, ap)
	})
}

func TestBadPlan(t *testing.T) {
	m, err := pagedkv.New(pagedkv.Config{NumPages: 64, PageSize: 4, HashSeed: 1})
	if err != nil {
		t.Fatal(err)
	}
	for id := range pagedkv.RequestID(2) {
		if _, err := m.Add(id, pagedkv.Request{Prompt: []int32{1, 2, 3, 4, 5, int32(id)}}); err != nil {
			t.Fatal(err)
		}
	}
	good, err := m.Reserve([]pagedkv.RequestID{0, 1}, []int32{6, 6})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		bad  func(p *pagedkv.Plan)
		want string
	}{
		{"short qo_indptr", func(p *pagedkv.Plan) { p.QOIndptr = p.QOIndptr[:2] }, "len(QOIndptr) = 2, want len(Requests)+1 = 3"},
		{"short kv_indptr", func(p *pagedkv.Plan) { p.KVIndptr = p.KVIndptr[:1] }, "len(KVIndptr) = 1, want len(Requests)+1 = 3"},
		{"long last_page_len", func(p *pagedkv.Plan) { p.KVLastPageLen = append(p.KVLastPageLen[:2:2], 1) }, "len(KVLastPageLen) = 3, want len(Requests) = 2"},
		{"short seq_lens", func(p *pagedkv.Plan) { p.SeqLens = nil }, "len(SeqLens) = 0, want len(Requests) = 2"},
		{"short positions", func(p *pagedkv.Plan) { p.Positions = p.Positions[:11] }, "len(Positions) = 11, want QOIndptr[2] = 12"},
		{"short batch_indices", func(p *pagedkv.Plan) { p.BatchIndices = p.BatchIndices[:3] }, "len(BatchIndices) = 3, want QOIndptr[2] = 12"},
		{"short token ids", func(p *pagedkv.Plan) { p.TokenIDs = p.TokenIDs[:0] }, "len(TokenIDs) = 0, want QOIndptr[2] = 12"},
		{"short kv_indices", func(p *pagedkv.Plan) { p.KVPageIndices = p.KVPageIndices[:3] }, "KVIndptr[2] = 4, but len(KVPageIndices) = 3"},
		{"attn arrays disagree", func(p *pagedkv.Plan) {
			p.AttnQOIndptr, p.AttnKVIndptr, p.AttnKVLastPageLen = []int32{0, 12}, []int32{0}, []int32{4}
		}, "len(AttnKVIndptr) = 1, want len(AttnQOIndptr) = 2"},
		{"attn rows", func(p *pagedkv.Plan) {
			p.AttnQOIndptr, p.AttnKVIndptr, p.AttnKVLastPageLen, p.AttnKVPageIndices = []int32{0, 11}, []int32{0, 1}, []int32{4}, []int32{0}
		}, "AttnQOIndptr[1] = 11, want the plan's rows QOIndptr[2] = 12"},
		{"cascade windows", func(p *pagedkv.Plan) {
			p.Cascade = &cascade.Layout{Levels: []cascade.Level{{QOIndptr: []int32{0, 12}, KVIndptr: []int32{0, 0}, KVLastPageLen: []int32{0}}}}
			p.CascadeWindowLeft = []int{-1, 3}
		}, "len(CascadeWindowLeft) = 2, want len(Cascade.Levels) = 1"},
		{"cascade rows", func(p *pagedkv.Plan) {
			p.Cascade = &cascade.Layout{Levels: []cascade.Level{{QOIndptr: []int32{0, 5}, KVIndptr: []int32{0, 0}, KVLastPageLen: []int32{0}}}}
		}, "Cascade.Levels[0].QOIndptr = [0 5] does not end at the plan's rows QOIndptr[2] = 12"},
	}
	var dev cuda.StepPlan
	var host stepglue.CPU
	for _, c := range cases {
		p := *good
		c.bad(&p)
		for name, err := range map[string]error{
			"Device":  stepglue.Device(&dev, &p, geom, kernels.AttentionParams{NumQOHeads: hq}),
			"CPUStep": stepglue.CPUStep(&host, &p, kernels.AttentionParams{NumQOHeads: hq}),
		} {
			if !errors.Is(err, stepglue.ErrBadPlan) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: %s: err %v, want ErrBadPlan naming %q", c.name, name, err, c.want)
			}
		}
	}
	if err := stepglue.CPUStep(&host, good, kernels.AttentionParams{NumQOHeads: hq}); err != nil {
		t.Fatalf("the unmodified plan: %v", err)
	}
	if err := stepglue.CPUStep(&host, nil, kernels.AttentionParams{}); !errors.Is(err, stepglue.ErrBadPlan) {
		t.Errorf("nil plan: err %v, want ErrBadPlan", err)
	}
	var zero stepglue.CPU
	if err := zero.Attention(nil, kernels.PagedKVCache{}, kernels.Tensor{}, kernels.Tensor{}); !errors.Is(err, stepglue.ErrBadPlan) || !strings.Contains(err.Error(), "Kind = none") {
		t.Errorf("unbuilt CPU: err %v, want ErrBadPlan naming kind none", err)
	}
}
