package fuzz

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv"
)

// hybridOps are the commands of FuzzHybridEngine. Arguments: add a = prompt
// family (shared prefixes), b = length; fork a = parent; release, preempt,
// resume a = request; evict a = pages; truncate a = request, b = tokens cut;
// step and spec a = which requests, b = tokens each, c = accept pattern
// (spec: drafts per request from b, c%8 == 7 aborts).
var hybridOps = OpSet{"add", "fork", "release", "preempt", "resume", "evict", "truncate", "step", "spec"}

const hybPageSize, hybPages = 4, 40

// hybridConfigs are the four hybrid configs of the root package's tests at
// fuzz scale (pages of 4): gpt-oss-like, Gemma-3-like, Llama-4-like, MLA.
func hybridConfigs() [][]pagedkv.LayerGroup {
	sl := func(w int) pagedkv.LayerGroup {
		return pagedkv.LayerGroup{Kind: pagedkv.SlidingAttention, WindowTokens: w, NumLayers: 1}
	}
	full := pagedkv.LayerGroup{Kind: pagedkv.FullAttention, NumLayers: 1}
	chunk := pagedkv.LayerGroup{Kind: pagedkv.ChunkedAttention, ChunkTokens: 8, NumLayers: 1}
	return [][]pagedkv.LayerGroup{
		{sl(6), full},
		{sl(9), sl(9), sl(9), sl(9), sl(9), full},
		{chunk, chunk, chunk, full},
		{{Kind: pagedkv.MLAAttention, NumLayers: 1}},
	}
}

// FuzzHybridEngine drives a HybridManager through its public API only:
// adds over shared prompts, forks, releases, preemption, resume, eviction,
// truncation, plain and speculative steps (random drafts and accept counts,
// some aborted), on the config the first byte picks. After every command:
// Audit (every group and the pool), every group's first held token equal
// to its layergroup keep rule, every token a group must still read holding
// its K/V (a fake value of token, position and group written through the
// group's plan), hits that are whole pages and leave the last prompt token
// to compute, plans whose window_left is the group's and whose chunked
// attention entries lie in the request's pages, and failed operations that
// leave Stats unchanged.
func FuzzHybridEngine(f *testing.F) {
	ops := hybridOps
	for c := range byte(4) {
		f.Add(c, ops.Prog("add", 0, 13, 0, "step", 255, 9, 0, "step", 255, 9, 0, "add", 0, 17, 0, "step", 255, 9, 0,
			"step", 255, 9, 0, "spec", 255, 9, 1, "fork", 0, 0, 0, "spec", 255, 9, 2, "spec", 255, 9, 5, "truncate", 1, 3, 0,
			"preempt", 0, 0, 0, "resume", 0, 0, 0, "step", 255, 9, 0, "evict", 30, 0, 0, "add", 1, 30, 0, "step", 255, 9, 0,
			"spec", 255, 9, 7, "spec", 255, 9, 3, "spec", 255, 9, 4, "release", 0, 0, 0, "add", 0, 25, 0, "step", 255, 9, 0))
	}
	f.Fuzz(func(t *testing.T, config byte, prog []byte) {
		cfgs := hybridConfigs()
		h, err := pagedkv.NewHybrid(pagedkv.HybridConfig{Config: pagedkv.Config{NumPages: hybPages, PageSize: hybPageSize, HashSeed: 9},
			Groups: cfgs[int(config)%len(cfgs)]})
		require.NoError(t, err)
		x := &hybridHarness{t: t, h: h, kv: make([]uint64, hybPages*hybPageSize)}
		cmds := Decode(nil, prog, len(ops))
		if len(cmds) > maxCmds {
			cmds = cmds[:maxCmds]
		}
		for i, c := range cmds {
			x.run(c, i)
			x.check(i)
		}
	})
}

type hybridHarness struct {
	t    *testing.T
	h    *pagedkv.HybridManager
	kv   []uint64
	ids  []pagedkv.RequestID
	next pagedkv.RequestID
}

func hybKV(tok int32, pos, g int) uint64 { return uint64(tok)<<32 ^ uint64(pos)<<8 ^ uint64(g+1) }

func (x *hybridHarness) pick(a byte, running bool) (pagedkv.RequestID, bool) {
	var c []pagedkv.RequestID
	for _, id := range x.ids {
		if !running || x.h.Running(id) {
			c = append(c, id)
		}
	}
	if len(c) == 0 {
		return 0, false
	}
	return c[int(a)%len(c)], true
}

// unchanged runs op, and if it fails requires Stats to be as before.
func (x *hybridHarness) unchanged(what string, op func() error) error {
	before := x.h.Stats()
	err := op()
	if err != nil {
		require.Equal(x.t, before, x.h.Stats(), "%s failed (%v) and changed the HybridManager", what, err)
	}
	return err
}

func (x *hybridHarness) run(c Cmd, i int) {
	t, h := x.t, x.h
	r := newChooser(c, i)
	switch hybridOps[c.Op] {
	case "add":
		id := x.next
		x.next++
		n := 1 + int(c.B)%40
		prompt := make([]int32, n)
		for k := range prompt {
			prompt[k] = int32(int(c.A%4)*1000 + k)
			if k >= 20 {
				prompt[k] += int32(c.C)
			}
		}
		matched, err := h.Add(id, pagedkv.Request{Prompt: prompt})
		require.NoError(t, err)
		require.Zero(t, matched%hybPageSize, "add %d: hit of %d tokens", id, matched)
		require.LessOrEqual(t, matched, max(0, n-1), "add %d: hit of %d tokens of %d", id, matched, n)
		x.ids = append(x.ids, id)
	case "fork":
		if p, ok := x.pick(c.A, true); ok {
			id := x.next
			x.next++
			require.NoError(t, h.Fork(p, id))
			x.ids = append(x.ids, id)
		}
	case "release":
		if id, ok := x.pick(c.A, false); ok {
			require.NoError(t, h.Release(id))
			x.ids = slices.DeleteFunc(x.ids, func(y pagedkv.RequestID) bool { return y == id })
		}
	case "preempt":
		if id, ok := x.pick(c.A, true); ok {
			require.NoError(t, h.Preempt(id))
		}
	case "resume":
		if id, ok := x.pick(c.A, false); ok && !h.Running(id) {
			matched, err := h.Resume(id)
			require.NoError(t, err)
			require.Zero(t, matched%hybPageSize)
		}
	case "evict":
		h.Evict(int(c.A) % (hybPages + 1))
	case "truncate":
		if id, ok := x.pick(c.A, false); ok {
			n := len(h.Tokens(id)) - int(c.B)%8
			if err := x.unchanged("truncate", func() error { return h.Truncate(id, n) }); err != nil {
				require.ErrorIs(t, err, pagedkv.ErrBadArgument)
			}
		}
	case "step", "spec":
		x.step(c, &r, hybridOps[c.Op] == "spec")
	}
}

func (x *hybridHarness) step(c Cmd, r *chooser, spec bool) {
	t, h := x.t, x.h
	var ids []pagedkv.RequestID
	var nt []int32
	var drafts [][]int32
	for k, id := range x.ids {
		if !h.Running(id) || c.A>>(k%8)&1 == 0 || len(ids) == 4 {
			continue
		}
		left := len(h.Tokens(id)) - h.Computed(id)
		n := min(left, 1+r.intn(int(c.B)%10+1))
		var d []int32
		if spec && n == left {
			for range r.intn(int(c.B)%5 + 1) {
				d = append(d, int32(r.intn(90)))
			}
		}
		if n+len(d) == 0 {
			continue
		}
		ids, nt, drafts = append(ids, id), append(nt, int32(n)), append(drafts, d)
	}
	if len(ids) == 0 {
		return
	}
	var p *pagedkv.HybridPlan
	err := x.unchanged("reserve", func() (err error) { p, err = h.ReserveSpec(ids, nt, drafts); return err })
	if err != nil {
		require.ErrorIs(t, err, pagedkv.ErrOutOfPages)
		require.NoError(t, h.Preempt(ids[r.intn(len(ids))]))
		return
	}
	x.engine(p)
	require.NoError(t, h.Audit(), "during the step")
	if spec && c.C%8 == 7 {
		require.NoError(t, h.Abort())
		return
	}
	accepted, sampled := make([]int32, len(ids)), make([]int32, len(ids))
	for b, id := range ids {
		accepted[b] = int32(r.intn(len(drafts[b]) + 1))
		sampled[b] = pagedkv.NoToken
		if h.Computed(id)+int(nt[b])+len(drafts[b]) == len(h.Tokens(id)) {
			sampled[b] = int32(r.intn(90))
		}
	}
	require.NoError(t, h.CommitSpec(accepted, sampled))
}

// engine performs the copies and writes every group's rows through its
// plan, and checks each plan's window and chunked attention entries.
func (x *hybridHarness) engine(p *pagedkv.HybridPlan) {
	t, ps := x.t, hybPageSize
	for _, c := range p.Copies {
		copy(x.kv[int(c.Dst)*ps:int(c.Dst)*ps+int(c.Entries)], x.kv[int(c.Src)*ps:])
	}
	for g, gp := range p.Groups {
		spec := x.h.Group(g)
		require.Equal(t, p.Requests, gp.Requests)
		require.Equal(t, spec.WindowLeft(), gp.WindowLeft, "group %d window_left", g)
		for i := range gp.Positions {
			b, pos := gp.BatchIndices[i], gp.Positions[i]
			page := gp.KVPageIndices[gp.KVIndptr[b]+pos/int32(ps)]
			x.kv[int(page)*ps+int(pos)%ps] = hybKV(gp.TokenIDs[i], int(gp.TokenPositions[i]), g)
		}
		if spec.Kind != pagedkv.ChunkedAttention {
			require.Nil(t, gp.AttnQOIndptr, "group %d (%v) has chunk entries", g, spec.Kind)
			continue
		}
		require.Equal(t, gp.QOIndptr[len(gp.QOIndptr)-1], gp.AttnQOIndptr[len(gp.AttnQOIndptr)-1])
		for e, b := range gp.AttnRequests {
			pages := gp.KVPageIndices[gp.KVIndptr[b]:gp.KVIndptr[b+1]]
			seg := gp.AttnKVPageIndices[gp.AttnKVIndptr[e]:gp.AttnKVIndptr[e+1]]
			first := slices.Index(pages, seg[0])
			require.GreaterOrEqual(t, first, 0, "entry %d: page %d not in the request's pages", e, seg[0])
			require.Equal(t, pages[first:first+len(seg)], seg)
			_, start := x.h.Pages(g, p.Requests[b])
			keyFrom := start + first*ps
			kvLen := (len(seg)-1)*ps + int(gp.AttnKVLastPageLen[e])
			rows := int(gp.AttnQOIndptr[e+1] - gp.AttnQOIndptr[e])
			for j := range rows {
				q := int(gp.TokenPositions[int(gp.AttnQOIndptr[e])+j])
				require.Equal(t, keyFrom+kvLen-rows+j, q, "entry %d row %d: causal alignment", e, j)
				require.Equal(t, q/spec.ChunkTokens*spec.ChunkTokens, keyFrom, "entry %d: keys from %d for a row at %d", e, keyFrom, q)
			}
		}
	}
}

func (x *hybridHarness) check(i int) {
	t, h, ps := x.t, x.h, hybPageSize
	require.NoError(t, h.Audit(), "after command %d", i)
	for _, id := range x.ids {
		if !h.Running(id) {
			continue
		}
		tokens, n := h.Tokens(id), h.Computed(id)
		for g := range h.NumGroups() {
			pages, start := h.Pages(g, id)
			if want := h.Group(g).KeepFrom(n, ps); start != want {
				require.Failf(t, "start", "command %d: request %d group %d starts at %d, want %d", i, id, g, start, want)
			}
			for tk := start; tk < n; tk++ {
				if got, want := x.kv[int(pages[(tk-start)/ps])*ps+(tk-start)%ps], hybKV(tokens[tk], tk, g); got != want {
					require.Failf(t, "wrong K/V", "command %d: request %d group %d token %d reads %#x, want %#x", i, id, g, tk, got, want)
				}
			}
		}
	}
}
