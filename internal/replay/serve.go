package replay

import (
	"errors"
	"fmt"
	"slices"

	"github.com/pagedkv/pagedkv"
)

// served is one request's progress under the service model.
type served struct {
	idx     int
	sampled int  // output tokens sampled so far
	resumed bool // preempted: resume instead of add
}

// serve runs the service model (see [Service]).
func (r *runner) serve() error {
	svc := r.cfg.Service
	reqs := r.t.Requests
	var waiting, running []*served
	next, finished := 0, 0
	now := 0.0 // ms
	if len(reqs) > 0 {
		now = float64(reqs[0].ArrivalMs)
	}
	sampled := make([]int32, 0, svc.MaxBatch)
	for finished < len(reqs) {
		for next < len(reqs) && float64(reqs[next].ArrivalMs) <= now {
			waiting = append(waiting, &served{idx: next})
			next++
		}
		if len(running) == 0 && len(waiting) == 0 {
			now = float64(reqs[next].ArrivalMs)
			continue
		}
		for len(running) < svc.MaxBatch && len(waiting) > 0 {
			s := waiting[0]
			waiting = waiting[1:]
			if err := r.start(s); err != nil {
				return err
			}
			running = append(running, s)
		}
		// Schedule: decodes first, then prefill chunks, within the budget.
		var prefill, decode int
		for {
			prefill, decode = r.schedule(running, svc.StepTokens)
			_, err := r.m.Reserve(r.ids, r.counts)
			if err == nil {
				break
			}
			if !errors.Is(err, pagedkv.ErrOutOfPages) || len(running) == 1 {
				return fmt.Errorf("replay: a step of %d requests at %.0f ms (pool %d pages): %w", len(r.ids), now, r.cfg.CapacityPages, err)
			}
			last := running[len(running)-1]
			if err := r.m.Preempt(pagedkv.RequestID(last.idx)); err != nil {
				return fmt.Errorf("replay: preempting request %d: %w", last.idx, err)
			}
			last.resumed = true
			running = running[:len(running)-1]
			waiting = slices.Insert(waiting, 0, last)
		}
		r.notePeak()
		now += 1000 * (float64(prefill)/svc.PrefillTokensPerSec + float64(decode)/svc.DecodeTokensPerSec)
		r.res.DecodeTokens += int64(decode)
		// Commit: a request whose step reached the end of its tokens
		// samples one; a request with all its outputs is released.
		sampled = sampled[:0]
		var done []int
		for b, id := range r.ids {
			s := running[r.slot[b]]
			t := pagedkv.NoToken
			if r.m.Computed(id)+int(r.counts[b]) == len(r.m.Tokens(id)) {
				q := &reqs[s.idx]
				if s.sampled < q.OutputTokens {
					t = outputToken(s.idx, s.sampled)
				}
				s.sampled++
				if s.sampled >= q.OutputTokens {
					done = append(done, r.slot[b])
				}
			}
			sampled = append(sampled, t)
		}
		if err := r.m.Commit(sampled); err != nil {
			return fmt.Errorf("replay: commit at %.0f ms: %w", now, err)
		}
		for i := len(done) - 1; i >= 0; i-- { // slots ascend: remove from the back
			s := running[done[i]]
			if err := r.m.Release(pagedkv.RequestID(s.idx)); err != nil {
				return fmt.Errorf("replay: releasing request %d: %w", s.idx, err)
			}
			running = slices.Delete(running, done[i], done[i]+1)
			finished++
			if r.cfg.Progress != nil {
				r.cfg.Progress(finished)
			}
		}
	}
	r.res.SimulatedMs = now
	return nil
}

// start admits or resumes s.
func (r *runner) start(s *served) error {
	if !s.resumed {
		return r.admit(s.idx)
	}
	if _, err := r.m.Resume(pagedkv.RequestID(s.idx)); err != nil {
		return fmt.Errorf("replay: resuming request %d: %w", s.idx, err)
	}
	r.res.Stream.Admissions = append(r.res.Stream.Admissions, r.t.Requests[s.idx].Blocks)
	return nil
}

// schedule fills r.ids, r.counts and r.slot (each batch entry's index in
// running) with the step's tokens: one per decoding request, then prefill
// chunks in running order while the budget lasts. It returns the prefill
// and decode tokens.
func (r *runner) schedule(running []*served, budget int) (prefill, decode int) {
	r.ids, r.counts, r.slot = r.ids[:0], r.counts[:0], r.slot[:0]
	for i, s := range running {
		id := pagedkv.RequestID(s.idx)
		if left := len(r.m.Tokens(id)) - r.m.Computed(id); left == 1 && s.sampled > 0 && budget > 0 {
			r.ids, r.counts, r.slot = append(r.ids, id), append(r.counts, 1), append(r.slot, i)
			decode++
			budget--
		}
	}
	for i, s := range running {
		id := pagedkv.RequestID(s.idx)
		left := len(r.m.Tokens(id)) - r.m.Computed(id)
		if (left == 1 && s.sampled > 0) || budget == 0 {
			continue
		}
		n := min(left, budget)
		r.ids, r.counts, r.slot = append(r.ids, id), append(r.counts, int32(n)), append(r.slot, i)
		prefill += n
		budget -= n
	}
	return prefill, decode
}
