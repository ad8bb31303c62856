// Package churn drives a pagedkv.Manager with random requests that share
// prefixes in a few namespaces, so that pages are published, matched,
// evicted in subtrees and re-published: the load the KV-event tests of
// events and kvindex put on a Manager. Tests only.
//
// # Invariants
//
//   - The workload is a function of Rng alone: the same seed gives the
//     same calls, so a failing test replays exactly.
//   - At most 6 requests run at once and none grows past 40 tokens, so a
//     pool of a few dozen pages always holds one request: a Reserve the
//     pool cannot hold releases the latest request, and Step never fails
//     for want of pages.
//   - Every call the Manager refuses, other than ErrOutOfPages from
//     Reserve, fails the test (T.Fatal): the driver never hides an error.
package churn

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	pagedkv "github.com/pagedkv/pagedkv"
)

// Driver admits, steps and releases requests on M at random. Prompts are a
// prefix of one of Roots followed by random tokens below 50, each in one of
// Namespaces; requests stop sampling at 40 tokens.
type Driver struct {
	T          testing.TB
	Rng        *rand.Rand
	M          *pagedkv.Manager
	Roots      [][]int32
	Namespaces []pagedkv.Namespace

	next    pagedkv.RequestID
	running []pagedkv.RequestID
}

// Roots are four random prompts (tokens below 50) of 3 pages plus 0 to 3
// tokens, for Driver.Roots.
func Roots(rng *rand.Rand, pageSize int) [][]int32 {
	var roots [][]int32
	for i := range 4 {
		p := make([]int32, 3*pageSize+i)
		for j := range p {
			p[j] = int32(rng.IntN(50))
		}
		roots = append(roots, p)
	}
	return roots
}

// Step admits, steps and releases at random; it returns after one Commit
// (or a Reserve the pool could not hold, after releasing the latest
// request).
func (d *Driver) Step() {
	t, rng, m := d.T, d.Rng, d.M
	for len(d.running) < 6 && rng.IntN(3) > 0 {
		prompt := slices.Clone(d.Roots[rng.IntN(len(d.Roots))])
		prompt = prompt[:rng.IntN(len(prompt))+1]
		for range rng.IntN(12) {
			prompt = append(prompt, int32(rng.IntN(50)))
		}
		d.next++
		if _, err := m.Add(d.next, pagedkv.Request{Namespace: d.Namespaces[rng.IntN(len(d.Namespaces))], Prompt: prompt}); err != nil {
			t.Fatal(err)
		}
		d.running = append(d.running, d.next)
	}
	if rng.IntN(10) == 0 {
		m.Evict(rng.IntN(8))
	}
	var ids []pagedkv.RequestID
	var nt []int32
	for _, id := range d.running {
		if left := len(m.Tokens(id)) - m.Computed(id); left > 0 {
			ids = append(ids, id)
			nt = append(nt, int32(min(left, 1+rng.IntN(9))))
		}
	}
	if _, err := m.Reserve(ids, nt); errors.Is(err, pagedkv.ErrOutOfPages) {
		if err := m.Release(d.running[len(d.running)-1]); err != nil {
			t.Fatal(err)
		}
		d.running = d.running[:len(d.running)-1]
		return
	} else if err != nil {
		t.Fatal(err)
	}
	sampled := make([]int32, len(ids))
	for b, id := range ids {
		sampled[b] = pagedkv.NoToken
		if m.Computed(id)+int(nt[b]) == len(m.Tokens(id)) && len(m.Tokens(id)) < 40 {
			sampled[b] = int32(rng.IntN(50))
		}
	}
	if err := m.Commit(sampled); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(d.running); i++ {
		if id := d.running[i]; m.Computed(id) == len(m.Tokens(id)) && rng.IntN(4) == 0 {
			if err := m.Release(id); err != nil {
				t.Fatal(err)
			}
			d.running = slices.Delete(d.running, i, i+1)
			i--
		}
	}
}
