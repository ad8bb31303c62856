package pagedkv

import (
	"github.com/stretchr/testify/require"
)

// runSpecStep is runStep for a speculative step: each scheduled request
// with its known tokens all in the step gets 0..4 drafts (some requests
// with none), the engine writes every row (drafts included), and the
// commit accepts a random prefix of each request's drafts plus a bonus
// token. The model's CommitSpec is, by definition, the plain step of the
// accepted tokens, so verify afterwards checks the rollback against it.
func (h *mgrHarness) runSpecStep(a, b, c, d byte) {
	var ids []RequestID
	var nt []int32
	var drafts [][]int32
	seed := int(c) * 31
	for k := range h.ids {
		id := h.ids[(int(a)+k)%len(h.ids)]
		left := len(h.m.Tokens(id)) - h.m.Computed(id)
		if !h.m.Running(id) || len(ids) > int(b)%4 {
			continue
		}
		// Known tokens first (a chunk, or all of them), then drafts when the
		// chunk reaches the end. Requests with nothing left re-verify from
		// drafts alone (ntokens 0).
		n := min(left, 1+(seed+k)%3)
		var dr []int32
		if n == left {
			for j := range (seed + 2*k) % 5 {
				dr = append(dr, sampleOf(id, len(h.m.Tokens(id))+j+seed%3))
			}
		}
		if n == 0 && len(dr) == 0 {
			continue
		}
		ids = append(ids, id)
		nt = append(nt, int32(n))
		drafts = append(drafts, dr)
	}
	if len(ids) == 0 {
		return
	}
	before := h.m.Stats()
	plan, err := h.m.ReserveSpec(ids, nt, drafts)
	mcopies, merr := h.ref.ReserveSpec(u64s(ids), nt, drafts)
	h.same("reserve spec", err, merr)
	if err != nil {
		require.Equal(h.t, before, h.m.Stats(), "a failed ReserveSpec changed the Manager")
		victim := ids[int(d)%len(ids)]
		h.same("preempt", h.m.Preempt(victim), h.ref.Preempt(uint64(victim)))
		return
	}
	require.Len(h.t, plan.Copies, mcopies, "copy-on-write copies")
	total := make([]int32, len(nt))
	for i := range nt {
		total[i] = nt[i] + int32(len(drafts[i]))
		require.Equal(h.t, int32(len(drafts[i])), plan.Drafts[i], "plan drafts of request %d", ids[i])
	}
	h.checkPlan(plan, ids, total)
	h.engine(plan)
	require.NoError(h.t, h.m.Audit(), "during the speculative step")
	if d%8 == 7 {
		h.same("abort", h.m.Abort(), h.ref.Abort())
		return
	}
	accepted := make([]int32, len(ids))
	sampled := make([]int32, len(ids))
	for i, id := range ids {
		if k := len(drafts[i]); k > 0 {
			accepted[i] = int32((int(d) + 3*i + int(a)) % (k + 1))
		}
		sampled[i] = NoToken
		if n := len(h.m.Tokens(id)); h.m.Computed(id)+int(total[i]) == n {
			sampled[i] = sampleOf(id, n+int(d))
		}
	}
	h.same("commit spec", h.m.CommitSpec(accepted, sampled), h.ref.CommitSpec(accepted, sampled))
}

// truncate cuts a random request to a random length (some of them inside
// pages it shares, or refused under a window).
func (h *mgrHarness) truncate(a, c byte) {
	id, ok := h.pick(a, func(RequestID) bool { return true })
	if !ok {
		return
	}
	n := len(h.m.Tokens(id)) - int(c)%9
	if c%5 == 0 {
		n = -1
	}
	h.same("truncate", h.m.Truncate(id, n), h.ref.Truncate(uint64(id), n))
}
