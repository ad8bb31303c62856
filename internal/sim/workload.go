package sim

import (
	"fmt"
	"math/rand/v2"
)

// WorkloadConfig shapes the built-in workload: requests that arrive a few
// per step, most of them behind one of a few shared system prompts, in two
// namespaces, some with parallel samples.
type WorkloadConfig struct {
	Requests int    // number of requests (before forks)
	Seed     uint64 // varies arrivals, lengths and prefixes
	// Prefixes is the number of shared system prompts; PrefixTokens the
	// range of their lengths.
	Prefixes     int
	PrefixTokens [2]int
	// SuffixTokens is the range of each request's own prompt tokens after
	// its prefix; OutputTokens the range of tokens it generates.
	SuffixTokens, OutputTokens [2]int
	// ArrivalsPerStep is the mean arrival rate.
	ArrivalsPerStep float64
	// NoPrefixPercent of requests share nothing; ForkPercent of requests
	// ask for 2..3 parallel samples.
	NoPrefixPercent, ForkPercent int
}

// DefaultWorkloadConfig is the workload `pagedkv simulate` runs without a
// trace: sized with [DefaultConfig] so that the pool runs short (idle cached
// pages are evicted and running requests preempted), most prompts hit the
// prefix cache, and shared prefixes are read through cascade levels, while
// the whole run stays within seconds on two cores.
func DefaultWorkloadConfig() WorkloadConfig {
	return WorkloadConfig{
		Requests:        96,
		Seed:            1,
		Prefixes:        3,
		PrefixTokens:    [2]int{64, 112},
		SuffixTokens:    [2]int{4, 40},
		OutputTokens:    [2]int{16, 96},
		ArrivalsPerStep: 0.75,
		NoPrefixPercent: 10,
		ForkPercent:     10,
	}
}

// Validate checks the ranges.
func (w *WorkloadConfig) Validate() error {
	rng := func(name string, r [2]int, lo int) error {
		if r[0] < lo || r[1] < r[0] || r[1] > MaxPromptTokens {
			return fmt.Errorf("%w: workload %s range [%d, %d], want %d <= min <= max <= %d", ErrBadConfig, name, r[0], r[1], lo, MaxPromptTokens)
		}
		return nil
	}
	switch {
	case w.Requests < 1 || w.Requests > DefaultTraceLimits().MaxRequests:
		return fmt.Errorf("%w: workload requests = %d, want 1..%d", ErrBadConfig, w.Requests, DefaultTraceLimits().MaxRequests)
	case w.Prefixes < 1 || w.Prefixes > DefaultTraceLimits().MaxRequests:
		return fmt.Errorf("%w: workload prefixes = %d, want 1..%d", ErrBadConfig, w.Prefixes, DefaultTraceLimits().MaxRequests)
	case !(w.ArrivalsPerStep > 0):
		return fmt.Errorf("%w: workload arrivals per step = %v, want > 0", ErrBadConfig, w.ArrivalsPerStep)
	case w.NoPrefixPercent < 0 || w.NoPrefixPercent > 100 || w.ForkPercent < 0 || w.ForkPercent > 100:
		return fmt.Errorf("%w: workload percentages %d, %d, want 0..100", ErrBadConfig, w.NoPrefixPercent, w.ForkPercent)
	}
	if err := rng("prefix tokens", w.PrefixTokens, 1); err != nil {
		return err
	}
	if err := rng("suffix tokens", w.SuffixTokens, 1); err != nil {
		return err
	}
	return rng("output tokens", w.OutputTokens, 1)
}

// Workload generates the requests of w, in arrival order.
func Workload(w WorkloadConfig) ([]Request, error) {
	if err := w.Validate(); err != nil {
		return nil, err
	}
	r := rand.New(rand.NewPCG(w.Seed, 0x5eed))
	between := func(x [2]int) int { return x[0] + r.IntN(x[1]-x[0]+1) }
	prefixLen := make([]int, w.Prefixes)
	for i := range prefixLen {
		prefixLen[i] = between(w.PrefixTokens)
	}
	namespaces := [...]string{"tenant-a", "tenant-b"}
	reqs := make([]Request, w.Requests)
	t := 0.0
	for i := range reqs {
		name := fmt.Sprintf("request %d", i)
		q := Request{Name: name, Arrival: int(t), Output: between(w.OutputTokens), Samples: 1}
		t += r.ExpFloat64() / w.ArrivalsPerStep
		if r.IntN(100) < w.ForkPercent {
			q.Samples = 2 + r.IntN(2)
		}
		suffix := between(w.SuffixTokens)
		if r.IntN(100) < w.NoPrefixPercent {
			q.Namespace = namespaces[r.IntN(len(namespaces))]
			q.Prompt = PromptTokens("", 0, name, suffix)
		} else {
			// Prefix p lives in namespace p%2: prefix 0 and 2 share
			// tenant-a. The last prefix is also used by tenant-b under
			// the same tokens, which must not share pages.
			p := r.IntN(w.Prefixes)
			q.Namespace = namespaces[p%2]
			if p == w.Prefixes-1 && r.IntN(2) == 0 {
				q.Namespace = namespaces[(p+1)%2]
			}
			q.PrefixID, q.PrefixLen = fmt.Sprintf("system-%d", p), prefixLen[p]
			q.Prompt = PromptTokens(q.PrefixID, q.PrefixLen, name, q.PrefixLen+suffix)
		}
		reqs[i] = q
	}
	return reqs, nil
}
