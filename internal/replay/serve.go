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

// preemptionsPerRequest is MaxPreemptionsPerRequest (tests lower it).
var preemptionsPerRequest int64 = MaxPreemptionsPerRequest

// engine is one replica under the service model (see [Service]): its
// queue, its running batch and its clock.
type engine struct {
	r                *runner
	svc              *Service
	waiting, running []*served
	now              float64 // ms
	sampled          []int32
	done             []int
	// preempted counts the preemptions, at most maxPreempted
	// (MaxPreemptionsPerRequest × the trace's requests).
	preempted, maxPreempted int64
	// finished is called as each request finishes.
	finished func()
}

func newEngine(r *runner, svc *Service, finished func()) *engine {
	return &engine{r: r, svc: svc, sampled: make([]int32, 0, min(svc.MaxBatch, len(r.t.Requests))), finished: finished,
		maxPreempted: preemptionsPerRequest * int64(max(len(r.t.Requests), 1))}
}

// load is the router's measure: requests running or waiting.
func (e *engine) load() int    { return len(e.running) + len(e.waiting) }
func (e *engine) arrive(i int) { e.waiting = append(e.waiting, &served{idx: i}) }

// advance runs steps until the clock reaches at or nothing is left to run;
// an idle engine's clock jumps to at.
func (e *engine) advance(at float64) error {
	for e.load() > 0 && e.now < at {
		if err := e.step(); err != nil {
			return err
		}
	}
	e.now = max(e.now, at)
	return nil
}

// step runs one step: admissions, the schedule (preempting the newest
// running request while the pool is short), the clock, the commit and the
// releases.
func (e *engine) step() error {
	r, svc, reqs := e.r, e.svc, e.r.t.Requests
	for len(e.running) < svc.MaxBatch && len(e.waiting) > 0 {
		s := e.waiting[0]
		e.waiting = e.waiting[1:]
		if err := r.start(s); err != nil {
			return err
		}
		e.running = append(e.running, s)
	}
	var prefill, decode int
	for {
		prefill, decode = r.schedule(e.running, svc.StepTokens)
		_, err := r.m.ReserveStep(r.ids, r.counts, nil)
		if err == nil {
			break
		}
		if !errors.Is(err, pagedkv.ErrOutOfPages) || len(e.running) == 1 {
			return fmt.Errorf("replay: a step of %d requests at %.0f ms (pool %d pages): %w", len(r.ids), e.now, r.cfg.CapacityPages, err)
		}
		last := e.running[len(e.running)-1]
		if e.preempted++; e.preempted > e.maxPreempted {
			return fmt.Errorf("%w: more than %d preemptions (MaxPreemptionsPerRequest %d × %d requests) at %.0f ms: the pool of %d pages holds too few of the running requests at once; give it more capacity",
				ErrBadConfig, e.maxPreempted, preemptionsPerRequest, len(reqs), e.now, r.cfg.CapacityPages)
		}
		if err := r.m.Preempt(pagedkv.RequestID(last.idx)); err != nil {
			return fmt.Errorf("replay: preempting request %d: %w", last.idx, err)
		}
		last.resumed = true
		e.running = e.running[:len(e.running)-1]
		e.waiting = slices.Insert(e.waiting, 0, last)
	}
	r.notePeak()
	e.now += 1000 * (float64(prefill)/svc.PrefillTokensPerSec + float64(decode)/svc.DecodeTokensPerSec)
	r.res.DecodeTokens += int64(decode)
	// A request whose step reached the end of its tokens samples one; a
	// request with all its outputs is released.
	e.sampled, e.done = e.sampled[:0], e.done[:0]
	for b, id := range r.ids {
		s := e.running[r.slot[b]]
		t := pagedkv.NoToken
		if r.m.Computed(id)+int(r.counts[b]) == len(r.m.Tokens(id)) {
			q := &reqs[s.idx]
			if s.sampled < q.OutputTokens {
				t = outputToken(s.idx, s.sampled)
			}
			s.sampled++
			if s.sampled >= q.OutputTokens {
				e.done = append(e.done, r.slot[b])
			}
		}
		e.sampled = append(e.sampled, t)
	}
	if err := r.m.Commit(e.sampled); err != nil {
		return fmt.Errorf("replay: commit at %.0f ms: %w", e.now, err)
	}
	if err := r.completeCopies(); err != nil {
		return err
	}
	if err := r.flush(); err != nil {
		return err
	}
	slices.Sort(e.done)
	for i := len(e.done) - 1; i >= 0; i-- { // from the back: earlier slots stay valid
		s := e.running[e.done[i]]
		if err := r.release(s.idx); err != nil {
			return err
		}
		e.running = slices.Delete(e.running, e.done[i], e.done[i]+1)
		r.res.SimulatedMs = e.now
		e.finished()
	}
	return nil
}

// serve runs the whole trace through one engine.
func (r *runner) serve() error {
	reqs := r.t.Requests
	finished := 0
	e := newEngine(r, r.cfg.Service, func() {
		finished++
		if r.cfg.Progress != nil {
			r.cfg.Progress(finished)
		}
	})
	for i := range reqs {
		if err := e.advance(float64(reqs[i].ArrivalMs)); err != nil {
			return err
		}
		e.arrive(i)
	}
	return e.advance(inf)
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
	return r.completeCopies()
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
		n := r.chunk(id, min(left, budget))
		r.ids, r.counts, r.slot = append(r.ids, id), append(r.counts, int32(n)), append(r.slot, i)
		prefill += n
		budget -= n
	}
	return prefill, decode
}
