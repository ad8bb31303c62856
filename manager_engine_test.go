package pagedkv

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/cascade"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/layout"
)

// This file runs real attention (the pure-Go backend) through Manager
// plans: a small engine appends K/V for each step's rows and attends, so
// the tests can compare a cascade plan with the flat plan of the same step,
// and a sliding-window Manager (pages released) with a full one.

const (
	engHeads = 2 // KV heads = query heads
	engDim   = 8
)

type cpuEngine struct {
	be    *cpu.Backend
	cache kernels.PagedKVCache
}

func newCPUEngine(t testing.TB, numPages, pageSize int) *cpuEngine {
	c, err := kernels.NewPagedKVCache(layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F32,
		NumPages: numPages, PageSize: pageSize, NumKVHeads: engHeads, HeadDim: engDim})
	require.NoError(t, err)
	return &cpuEngine{be: cpu.New(cpu.Config{Workers: 1}), cache: c}
}

// kvOf is the K (kv=0) or V (kv=1) vector of a token at a position: any
// deterministic function works, as long as equal (token, position) give
// equal vectors.
func kvOf(kv int, tok int32, pos int32, head int) []float32 {
	out := make([]float32, engDim)
	for d := range out {
		out[d] = float32(math.Sin(float64(int(tok)*31+int(pos)*7+head*3+d*11+kv*101) * 0.37))
	}
	return out
}

func queryOf(row int) []float32 {
	out := make([]float32, engHeads*engDim)
	for i := range out {
		out[i] = float32(math.Cos(float64(row*13+i) * 0.71))
	}
	return out
}

func (e *cpuEngine) table(p *Plan) kernels.PageTable {
	return kernels.PageTable{KVIndptr: p.KVIndptr, KVPageIndices: p.KVPageIndices, KVLastPageLen: p.KVLastPageLen}
}

// apply performs the plan's copies, then appends every row's K/V.
func (e *cpuEngine) apply(t testing.TB, p *Plan) {
	g := e.cache.Geometry
	for _, c := range p.Copies {
		for ent := range int(c.Entries) {
			for _, off := range []func(page, entry, head, feat int) int64{g.KOffset, g.VOffset} {
				src, dst := off(int(c.Src), ent, 0, 0)*4, off(int(c.Dst), ent, 0, 0)*4
				copy(e.cache.Data[dst:dst+engHeads*engDim*4], e.cache.Data[src:])
			}
		}
	}
	nnz := len(p.Positions)
	k, v := make([]float32, 0, nnz*engHeads*engDim), make([]float32, 0, nnz*engHeads*engDim)
	for r := range nnz {
		for h := range engHeads {
			k = append(k, kvOf(0, p.TokenIDs[r], p.TokenPositions[r], h)...)
			v = append(v, kvOf(1, p.TokenIDs[r], p.TokenPositions[r], h)...)
		}
	}
	require.NoError(t, e.be.AppendPagedKVCache(&kernels.AppendParams{
		AppendKey:    kernels.TensorFromF32(layout.F32, k, nnz, engHeads, engDim),
		AppendValue:  kernels.TensorFromF32(layout.F32, v, nnz, engHeads, engDim),
		BatchIndices: p.BatchIndices, Positions: p.Positions, Cache: e.cache, Table: e.table(p),
	}))
}

// prefill is causal attention of every row over its request's pages.
func (e *cpuEngine) prefill(t testing.TB, p *Plan) []float32 { return e.prefillOn(t, p, e.table(p)) }

// prefillOn is prefill over the page table tab (p's, or the same pages in
// another form).
func (e *cpuEngine) prefillOn(t testing.TB, p *Plan, tab kernels.PageTable) []float32 {
	nnz := len(p.Positions)
	q := make([]float32, 0, nnz*engHeads*engDim)
	for r := range nnz {
		q = append(q, queryOf(r)...)
	}
	o := kernels.NewTensor(layout.F32, nnz, engHeads, engDim)
	require.NoError(t, e.be.BatchPrefill(&kernels.PrefillParams{
		Q: kernels.TensorFromF32(layout.F32, q, nnz, engHeads, engDim), QOIndptr: p.QOIndptr, Cache: e.cache,
		Table: tab, Causal: true, O: o,
		AttentionParams: kernels.AttentionParams{NumQOHeads: engHeads, WindowLeft: p.WindowLeft},
	}))
	return o.F32()
}

// cascade is the same attention through p.Cascade, returned in plan row
// order.
func (e *cpuEngine) cascade(t testing.TB, p *Plan) []float32 { return e.windowedCascade(t, p, nil) }

// decode is attention of each request's single (last) row over its pages.
func (e *cpuEngine) decode(t testing.TB, p *Plan) []float32 { return e.decodeOn(t, p, e.table(p)) }

// decodeOn is decode over the page table tab.
func (e *cpuEngine) decodeOn(t testing.TB, p *Plan, tab kernels.PageTable) []float32 {
	b := len(p.Requests)
	q := make([]float32, 0, b*engHeads*engDim)
	for i := range b {
		q = append(q, queryOf(i)...)
	}
	o := kernels.NewTensor(layout.F32, b, engHeads, engDim)
	require.NoError(t, e.be.BatchDecode(&kernels.DecodeParams{
		Q: kernels.TensorFromF32(layout.F32, q, b, engHeads, engDim), Cache: e.cache, Table: tab,
		AttentionParams: kernels.AttentionParams{NumQOHeads: engHeads, WindowLeft: p.WindowLeft}, O: o,
	}))
	return o.F32()
}

func requireClose(t testing.TB, want, got []float32, tol float64, msg string) {
	t.Helper()
	require.Len(t, got, len(want), msg)
	for i := range want {
		// !(d <= tol), not d > tol: a NaN or infinite value must fail.
		if d := math.Abs(float64(want[i]) - float64(got[i])); !(d <= tol) {
			t.Fatalf("%s: element %d is %v, want %v within %g (first of the differences)", msg, i, got[i], want[i], tol)
		}
	}
}

// prefillAll computes every known token of the requests in chunks of at
// most chunk tokens and commits without sampling.
func prefillAll(t testing.TB, m *Manager, e *cpuEngine, chunk int, ids ...RequestID) {
	for {
		var run []RequestID
		var nt []int32
		for _, id := range ids {
			if left := len(m.Tokens(id)) - m.Computed(id); left > 0 {
				run = append(run, id)
				nt = append(nt, int32(min(left, chunk)))
			}
		}
		if len(run) == 0 {
			return
		}
		p, err := m.Reserve(run, nt)
		require.NoError(t, err)
		e.apply(t, p)
		require.NoError(t, m.Commit(nil))
	}
}

func concat(parts ...[]int32) []int32 {
	var out []int32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func seqTokens(from, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(from + i)
	}
	return out
}

// TestCascadePlanSharedSystemPrompt: four requests reuse a cached 32-token
// system prompt (8 pages) and prefill 5 tokens each. Saving (4-1)*8 = 24
// page reads beats the default threshold of 16, so the plan has two levels,
// and cascade attention equals flat attention.
func TestCascadePlanSharedSystemPrompt(t *testing.T) {
	const ps = 4
	m, err := New(Config{NumPages: 64, PageSize: ps, HashSeed: 1})
	require.NoError(t, err)
	e := newCPUEngine(t, 64, ps)
	sys := seqTokens(1000, 32)
	_, err = m.Add(100, Request{Prompt: concat(sys, []int32{7})})
	require.NoError(t, err)
	prefillAll(t, m, e, 16, 100)
	require.NoError(t, m.Release(100))
	sysPages := make([]int32, 0, 8)

	ids := []RequestID{1, 2, 3, 4}
	for i, id := range ids {
		matched, err := m.Add(id, Request{Prompt: concat(sys, seqTokens(i*10, 5))})
		require.NoError(t, err)
		require.Equal(t, 32, matched)
		if i == 0 {
			pages, _ := m.Pages(id)
			for _, p := range pages {
				sysPages = append(sysPages, int32(p))
			}
		}
	}
	p, err := m.Reserve(ids, []int32{5, 5, 5, 5})
	require.NoError(t, err)
	require.NotNil(t, p.Cascade)
	checkCascadeCoversPlan(t, p, ps)
	lay := p.Cascade
	require.Len(t, lay.Levels, 2)
	require.Equal(t, cascade.Level{
		QOIndptr: []int32{0, 20}, KVIndptr: []int32{0, 8}, KVPageIndices: sysPages, KVLastPageLen: []int32{4},
	}, lay.Levels[0])
	require.Equal(t, []int32{0, 5, 10, 15, 20}, lay.Levels[1].QOIndptr)
	require.Equal(t, []int32{0, 2, 4, 6, 8}, lay.Levels[1].KVIndptr)
	require.Equal(t, []int32{1, 1, 1, 1}, lay.Levels[1].KVLastPageLen)

	e.apply(t, p)
	requireClose(t, e.prefill(t, p), e.cascade(t, p), 1e-5, "cascade vs flat")
	require.NoError(t, m.Commit([]int32{1, 2, 3, 4}))
	require.NoError(t, m.Audit())

	// Decode steps keep the shared level; cascade still equals flat.
	for step := range 3 {
		p, err := m.Reserve(ids, []int32{1, 1, 1, 1})
		require.NoError(t, err)
		require.NotNil(t, p.Cascade, "step %d", step)
		checkCascadeCoversPlan(t, p, ps)
		e.apply(t, p)
		requireClose(t, e.prefill(t, p), e.cascade(t, p), 1e-5, "decode cascade vs flat")
		require.NoError(t, m.Commit([]int32{9, 9, 9, 9}))
	}
}

// TestCascadePlanThreeLevels: two branches under one system prompt. With a
// low threshold each branch's 2 pages (saving (2-1)*2) are a level of
// their own: level 0 the system prompt, level 1 one group per branch,
// level 2 each request's own pages. An unrelated request rides along with
// empty groups on the shared levels.
func TestCascadePlanThreeLevels(t *testing.T) {
	const ps = 4
	m, err := New(Config{NumPages: 96, PageSize: ps, HashSeed: 1, CascadeMinSavedPages: 2})
	require.NoError(t, err)
	e := newCPUEngine(t, 96, ps)
	sys := seqTokens(1000, 16)
	branch := [][]int32{seqTokens(2000, 8), seqTokens(3000, 8)}
	for i, br := range branch {
		_, err = m.Add(RequestID(100+i), Request{Prompt: concat(sys, br, []int32{5})})
		require.NoError(t, err)
		prefillAll(t, m, e, 8, RequestID(100+i))
		require.NoError(t, m.Release(RequestID(100+i)))
	}
	ids := []RequestID{1, 2, 3, 4, 5}
	for i, id := range ids[:4] {
		matched, err := m.Add(id, Request{Prompt: concat(sys, branch[i/2], seqTokens(i*10, 3))})
		require.NoError(t, err)
		require.Equal(t, 24, matched)
	}
	_, err = m.Add(5, Request{Prompt: seqTokens(5000, 6)})
	require.NoError(t, err)

	p, err := m.Reserve(ids, []int32{3, 3, 3, 3, 6})
	require.NoError(t, err)
	require.NotNil(t, p.Cascade)
	checkCascadeCoversPlan(t, p, ps)
	lay := p.Cascade
	// The root above the shared system prompt and request 5's unrelated
	// prompt holds no page, so it is no level: system prompt (and request
	// 5's empty group), branches, own pages.
	require.Len(t, lay.Levels, 3, "system prompt, branches, own pages")
	require.Equal(t, []int32{0, 4, 4}, lay.Levels[0].KVIndptr, "level 0: the 4 system-prompt pages, then request 5's empty group")
	e.apply(t, p)
	requireClose(t, e.prefill(t, p), e.cascade(t, p), 1e-5, "cascade vs flat")
	require.NoError(t, m.Commit(nil))
}

func TestCascadePlanFlatWhenNothingIsShared(t *testing.T) {
	m, err := New(Config{NumPages: 32, PageSize: 4, HashSeed: 1})
	require.NoError(t, err)
	for i := range 3 {
		_, err := m.Add(RequestID(i), Request{Prompt: seqTokens(i*100, 9)})
		require.NoError(t, err)
	}
	p, err := m.Reserve([]RequestID{0, 1, 2}, []int32{9, 9, 9})
	require.NoError(t, err)
	require.Nil(t, p.Cascade)
	require.NoError(t, m.Commit(nil))

	// Sharing too small to pay: forks share 2 pages, (2-1)*2 < 16.
	require.NoError(t, m.Fork(0, 10))
	require.NoError(t, m.Extend(0, 1))
	require.NoError(t, m.Extend(10, 2))
	p, err = m.Reserve([]RequestID{0, 10}, []int32{1, 1})
	require.NoError(t, err)
	require.Nil(t, p.Cascade)
	require.NoError(t, m.Commit(nil))
}

// TestSlidingWindowDecodeEqualsFullDecode runs one conversation through a
// Manager with a window of W tokens (pages released as they leave it) and
// one without, and compares decode with window_left = W-1 at every step.
func TestSlidingWindowDecodeEqualsFullDecode(t *testing.T) {
	const ps = 4
	for _, w := range []int{1, 4, 6, 8, 13} {
		win, err := New(Config{NumPages: 64, PageSize: ps, WindowTokens: w, HashSeed: 1})
		require.NoError(t, err)
		full, err := New(Config{NumPages: 64, PageSize: ps, HashSeed: 1})
		require.NoError(t, err)
		ew, ef := newCPUEngine(t, 64, ps), newCPUEngine(t, 64, ps)
		prompt := seqTokens(100, 23)
		for _, m := range []*Manager{win, full} {
			_, err := m.Add(1, Request{Prompt: prompt})
			require.NoError(t, err)
		}
		prefillAll(t, win, ew, 5, 1)
		prefillAll(t, full, ef, 5, 1)
		for step := range 20 {
			tok := int32(500 + step)
			for _, m := range []*Manager{win, full} {
				require.NoError(t, m.Extend(1, tok))
			}
			pw, err := win.Reserve([]RequestID{1}, []int32{1})
			require.NoError(t, err)
			require.Equal(t, w-1, pw.WindowLeft)
			ew.apply(t, pw)
			got := ew.decode(t, pw)
			pf, err := full.Reserve([]RequestID{1}, []int32{1})
			require.NoError(t, err)
			ef.apply(t, pf)
			pf.WindowLeft = w - 1 // the same window over the whole sequence
			want := ef.decode(t, pf)
			requireClose(t, want, got, 1e-6, "window decode vs full decode")
			require.NoError(t, win.Commit(nil))
			require.NoError(t, full.Commit(nil))
			pages, start := win.Pages(1)
			n := win.Computed(1)
			require.Less(t, n-start-w, ps, "W=%d step %d: a page entirely outside the window is still held", w, step)
			require.Len(t, pages, (n-start+ps-1)/ps)
			require.NoError(t, win.Audit())
		}
		require.Positive(t, win.Stats().WindowReleasedPages)
	}
}
