package replay

import (
	"fmt"
	"math/rand/v2"

	"github.com/pagedkv/pagedkv"
)

// Hints configures the continuation-hint oracle of a replay: at each
// request's release, each of its blocks is hinted "reuse" when the
// trace's own future references it again within the horizon, "no reuse"
// when not; with probability 1 − Accuracy (seeded) the request's hints
// are all inverted: the engine mistakes whether this chain continues. So
// the figures say what an engine whose knowledge of its sessions is that
// accurate gains. (The Manager makes hints monotone along the chain: a
// page before one hinted "reuse" is reused too.)
type Hints struct {
	// Accuracy is the share of hints left true, in [0, 1]; 0 disables
	// the oracle (no hints at all).
	Accuracy float64
	// Horizon is the look-ahead in block references of the trace's own
	// stream (one admission per request, in arrival order): a block is
	// reused within it when its next reference comes at most Horizon
	// references after the request's last. 0 means no horizon: reused
	// at all, the dead-block oracle.
	Horizon int64
	// Seed seeds the flips.
	Seed uint64
}

// DefaultHintAccuracies are the accuracies docs/replay.md reports.
var DefaultHintAccuracies = []float64{1, 0.9, 0.7}

func (h *Hints) validate() error {
	if !(h.Accuracy >= 0 && h.Accuracy <= 1) {
		return fmt.Errorf("%w: hint accuracy %g, want 0..1", ErrBadConfig, h.Accuracy)
	}
	if h.Horizon < 0 {
		return fmt.Errorf("%w: hint horizon %d, want >= 0", ErrBadConfig, h.Horizon)
	}
	return nil
}

// hinter is a replay's oracle: next[i][j] is the stream position of the
// next reference of request i's block j (-1 for none), end[i] the
// position after request i's last block.
type hinter struct {
	next    [][]int64
	end     []int64
	horizon int64
	acc     float64
	rng     *rand.Rand
	buf     []pagedkv.Hint
	m       interface {
		HintContinuation(pagedkv.RequestID, []pagedkv.Hint) error
	}
}

// newHinter computes the trace's next references (one pass backwards).
func newHinter(t *Trace, h Hints, m pagedkv.KVManager) (*hinter, error) {
	hm, ok := m.(interface {
		HintContinuation(pagedkv.RequestID, []pagedkv.Hint) error
	})
	if !ok {
		return nil, fmt.Errorf("%w: continuation hints need a dense Manager (no --model)", ErrBadConfig)
	}
	o := &hinter{next: make([][]int64, len(t.Requests)), end: make([]int64, len(t.Requests)),
		horizon: h.Horizon, acc: h.Accuracy, rng: rand.New(rand.NewPCG(h.Seed, 0x68696e7473)), m: hm}
	if o.horizon == 0 {
		o.horizon = 1<<63 - 1
	}
	var pos int64
	for i := range t.Requests {
		pos += int64(len(t.Requests[i].Blocks))
		o.end[i] = pos
	}
	seen := make(map[int32]int64)
	flat := make([]int64, pos)
	for i := len(t.Requests) - 1; i >= 0; i-- {
		b := t.Requests[i].Blocks
		p0 := o.end[i] - int64(len(b))
		o.next[i] = flat[p0:o.end[i]]
		for j := len(b) - 1; j >= 0; j-- {
			if n, ok := seen[b[j]]; ok {
				o.next[i][j] = n
			} else {
				o.next[i][j] = -1
			}
			seen[b[j]] = p0 + int64(j)
		}
	}
	return o, nil
}

// hint sets request i's hints before its release.
func (o *hinter) hint(i int) error {
	o.buf = o.buf[:0]
	flip := o.acc < 1 && o.rng.Float64() >= o.acc
	for _, n := range o.next[i] {
		live := n >= 0 && n-o.end[i] < o.horizon
		if flip {
			live = !live
		}
		h := pagedkv.HintNoReuse
		if live {
			h = pagedkv.HintReuse
		}
		o.buf = append(o.buf, h)
	}
	if err := o.m.HintContinuation(pagedkv.RequestID(i), o.buf); err != nil {
		return fmt.Errorf("replay: hinting request %d: %w", i, err)
	}
	return nil
}
