package pagedkv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/redistest"
	"github.com/pagedkv/pagedkv/tier"
	"github.com/pagedkv/pagedkv/tier/disk"
	"github.com/pagedkv/pagedkv/tier/redis"
)

// stTierHarness drives a HybridManager with state groups and tiers (a
// host tier, and a remote store below it when given) through random
// operations, with a fake engine that keeps the bytes of every device
// page and runs the plan's copies and the tier copies on them: a state
// page holds fold(j, tokens) of the tokens its state has read. Every
// step's state groups must read, in their slot, the state of exactly the
// request's computed tokens: a checkpoint restored from the host tier,
// disk or Redis with the wrong bytes (or none) fails there. Audit runs
// after every operation; a run ends by draining every tier copy and page.
type stTierHarness struct {
	t      require.TestingT
	rng    *rand.Rand
	h      *HybridManager
	ps     int
	st     []int
	fmt    tier.PageFormat
	dev    [][]byte // the engine's device pages (every layer's tensor: one page ID is one slot)
	reqs   map[RequestID]*stTierReq
	next   RequestID
	bases  [][]int32
	copies []TierCopy
	queued []TierCopy // issued, not yet completed
	// skipOnload: the engine drops the bytes of onload copies (a mutation
	// the state checks must catch).
	skipOnload bool

	restored, steps, admitted int
}

type stTierReq struct {
	tokens   []int32
	computed int
	running  bool
}

type stTierConfig struct {
	seed         uint64
	hostPages    int
	writeThrough bool
	remote       tier.RemoteStore
	skipOnload   bool
}

func newSTTierHarness(t require.TestingT, c stTierConfig) *stTierHarness {
	ps := 4
	f := tierFormat(ps)
	groups := []LayerGroup{stateGroup(), {Kind: FullAttention, NumLayers: 1}, stateGroup(), stateGroup()}
	h, err := NewHybrid(HybridConfig{Config: Config{NumPages: 40, PageSize: ps, HashSeed: 7,
		Tiers: TierConfig{HostPages: c.hostPages, Format: f, WriteThrough: c.writeThrough, Remote: c.remote}},
		Groups: groups})
	require.NoError(t, err)
	x := &stTierHarness{t: t, rng: rand.New(rand.NewPCG(c.seed, 5)), h: h, ps: ps, st: []int{0, 2, 3}, fmt: f,
		dev: make([][]byte, 40), reqs: map[RequestID]*stTierReq{}, skipOnload: c.skipOnload}
	for p := range x.dev {
		x.dev[p] = make([]byte, f.PageBytes())
	}
	for i := range 3 {
		b := make([]int32, 40)
		for j := range b {
			b[j] = int32(j + 100*i)
		}
		x.bases = append(x.bases, b)
	}
	return x
}

// stateBytes writes state group j's state after tokens into page b.
func stateBytes(b []byte, j int, tokens []int32) {
	binary.LittleEndian.PutUint64(b, fold(j, tokens))
}

func (x *stTierHarness) run(ops int) {
	for range ops {
		switch op := x.rng.IntN(20); {
		case op < 3 && len(x.reqs) < 6:
			x.add()
		case op < 12:
			x.step()
		case op < 14:
			x.release()
		case op < 14:
			x.preempt()
		case op < 15:
			x.resume()
		case op < 17:
			x.h.Evict(x.rng.IntN(12))
		default:
			x.tierCopies(x.rng.IntN(3) == 0)
		}
		require.NoError(x.t, x.h.Audit())
	}
	x.drain()
}

func (x *stTierHarness) add() {
	x.next++
	id := x.next
	base := x.bases[x.rng.IntN(len(x.bases))]
	n := 2 + x.rng.IntN(len(base)-2)
	prompt := slices.Clone(base[:n])
	if x.rng.IntN(3) == 0 {
		prompt[n-1] += int32(1000 + x.rng.IntN(50))
	}
	matched, err := x.h.Add(id, Request{Prompt: prompt})
	require.NoError(x.t, err)
	x.reqs[id] = &stTierReq{tokens: prompt, computed: matched, running: true}
	x.admitted++
}

// pick returns a random request (running when running is set), or 0.
func (x *stTierHarness) pick(running bool) RequestID {
	var ids []RequestID
	for id, r := range x.reqs {
		if r.running == running {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return 0
	}
	slices.Sort(ids)
	return ids[x.rng.IntN(len(ids))]
}

func (x *stTierHarness) step() {
	var ids []RequestID
	var nt []int32
	for range 1 + x.rng.IntN(3) {
		id := x.pick(true)
		if id == 0 || slices.Contains(ids, id) || x.h.Loading(id) {
			continue
		}
		r := x.reqs[id]
		n := 1 + x.rng.IntN(len(r.tokens)-r.computed)
		if b := x.h.NextStateCheckpoint(id); b > 0 && x.rng.IntN(4) > 0 {
			n = min(n, b-r.computed)
		}
		ids, nt = append(ids, id), append(nt, int32(n))
	}
	if len(ids) == 0 {
		return
	}
	p, err := x.h.Reserve(ids, nt)
	if errors.Is(err, ErrOutOfPages) {
		return
	}
	require.NoError(x.t, err)
	// The copies run in order before the step (src to dst).
	for _, c := range p.Copies {
		copy(x.dev[c.Dst], x.dev[c.Src])
	}
	sampled := make([]int32, len(ids))
	for b, id := range ids {
		r := x.reqs[id]
		end := r.computed + int(nt[b])
		for j, g := range x.st {
			slot := p.Groups[g].StateIndices[b]
			if r.computed > 0 {
				got := binary.LittleEndian.Uint64(x.dev[slot])
				require.Equal(x.t, fold(j, r.tokens[:r.computed]), got,
					"request %d, state group %d, slot %d: the state read is not that of its %d computed tokens", id, g, slot, r.computed)
			}
			stateBytes(x.dev[slot], j, r.tokens[:end])
		}
		r.computed = end
		sampled[b] = NoToken
		if end == len(r.tokens) { // the step reached its known tokens' end: it samples one
			sampled[b] = int32(x.rng.IntN(90))
			r.tokens = append(r.tokens, sampled[b])
		}
	}
	x.steps++
	require.NoError(x.t, x.h.Commit(sampled))
}

func (x *stTierHarness) release() {
	if id := x.pick(x.rng.IntN(2) == 0); id != 0 {
		require.NoError(x.t, x.h.Release(id))
		delete(x.reqs, id)
	}
}

func (x *stTierHarness) preempt() {
	if id := x.pick(true); id != 0 {
		require.NoError(x.t, x.h.Preempt(id))
		x.reqs[id].running = false
	}
}

func (x *stTierHarness) resume() {
	if id := x.pick(false); id != 0 {
		matched, err := x.h.Resume(id)
		require.NoError(x.t, err)
		r := x.reqs[id]
		r.running, r.computed = true, matched
		x.admitted++
	}
}

// tierCopies takes the planned copies and completes a random part of
// those issued (all of them when all), running each one's bytes as it
// completes.
func (x *stTierHarness) tierCopies(all bool) {
	x.queued = append(x.queued, x.h.TierCopies(x.copies[:0])...)
	var done []uint64
	keep := x.queued[:0]
	for _, c := range x.queued {
		if !all && x.rng.IntN(2) == 0 {
			keep = append(keep, c)
			continue
		}
		hp := x.h.HostPage(c.Host)
		if c.Dir == tier.ToHost {
			copy(hp, x.dev[c.Device])
		} else if !x.skipOnload {
			copy(x.dev[c.Device], hp)
		}
		done = append(done, c.ID)
	}
	x.queued = keep
	require.NoError(x.t, x.h.CompleteTierCopies(done...))
}

// drain releases every request, completes every copy and evicts every
// page: nothing may be left on the device.
func (x *stTierHarness) drain() {
	for id := range x.reqs {
		require.NoError(x.t, x.h.Release(id))
	}
	clear(x.reqs)
	for range 4 {
		x.tierCopies(true)
		x.h.Evict(len(x.dev))
	}
	x.tierCopies(true)
	require.NoError(x.t, x.h.Audit())
	st := x.h.Stats()
	require.Zero(x.t, st.Tiers.InFlight)
	for g, gs := range st.Groups {
		require.Zero(x.t, gs.CachedPages, "group %d", g)
	}
}

// stateTierStats is the state groups' tier counters.
func (x *stTierHarness) stateTierStats() GroupStats { return x.h.Stats().Groups[x.st[0]] }

// TestStateTiersMatchModel: state checkpoints go down to the host tier
// (evicted with offload, or written through) and come back into fresh
// slots with their bytes, so every restored request resumes from the
// state of exactly its computed tokens; with a disk store or a real
// redis-server below, replicas one after another are served the
// checkpoints the ones before stored. Skipping the onload copies' bytes
// must fail the state check.
func TestStateTiersMatchModel(t *testing.T) {
	t.Parallel()
	ops := 3000
	if testing.Short() || raceEnabled {
		ops = 600
	}
	t.Run("host", func(t *testing.T) {
		t.Parallel()
		var onloaded, offloaded, hits int64
		for run := range 6 {
			x := newSTTierHarness(t, stTierConfig{seed: uint64(run), hostPages: 16 + 16*(run%3), writeThrough: run%2 == 1})
			x.run(ops)
			gs := x.stateTierStats()
			onloaded, offloaded, hits = onloaded+gs.OnloadedPages, offloaded+gs.OffloadedPages, hits+gs.HostHitTokens
		}
		require.Positive(t, offloaded, "no checkpoint went to the host tier")
		require.Positive(t, onloaded, "no checkpoint came back from the host tier")
		require.Positive(t, hits, "no hit was served by a checkpoint from the host tier")
		t.Logf("state groups: %d checkpoint pages offloaded, %d onloaded, %d host hit tokens (per group)", offloaded, onloaded, hits)
	})
	replicated := func(t *testing.T, open func() tier.RemoteStore, flush func(tier.RemoteStore)) {
		var remoteHits int64
		for run := range 4 {
			s := open()
			x := newSTTierHarness(t, stTierConfig{seed: 50 + uint64(run), hostPages: 16, remote: s})
			x.run(ops / 4)
			flush(s)
			require.Zero(t, s.Stats().Rejected, "%+v", s.Stats())
			remoteHits += x.stateTierStats().RemoteHitTokens
		}
		require.Positive(t, remoteHits, "no checkpoint was served from the store")
		t.Logf("state groups: %d hit tokens from the store (per group)", remoteHits)
	}
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		replicated(t, func() tier.RemoteStore { return newRedisStore(t, srv) },
			func(s tier.RemoteStore) { flushStore(t, s.(*redis.Store)) })
	})
	t.Run("disk", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		replicated(t, func() tier.RemoteStore { return openDiskStore(t, dir, 512) },
			func(s tier.RemoteStore) { closeDiskStore(t, s.(*disk.Store)) })
	})
}

// TestStateTiersSkippedOnloadFails is the mutation: an engine that drops
// the onload copies' bytes restores checkpoints from the host tier with
// the wrong state, which the harness's state check must report.
func TestStateTiersSkippedOnloadFails(t *testing.T) {
	t.Parallel()
	for run := range 6 {
		rec := &failRecorder{}
		func() {
			defer func() {
				if v := recover(); v != nil && v != errFailNow {
					panic(v)
				}
			}()
			newSTTierHarness(rec, stTierConfig{seed: uint64(run), hostPages: 16, skipOnload: true}).run(3000)
		}()
		if rec.failed {
			require.Contains(t, rec.msg, "the state read is not that of its", "run %d failed otherwise", run)
			return
		}
	}
	t.Fatal("an engine that skips the onload copies' bytes passed every run")
}

// failRecorder is a require.TestingT that records the first failure and
// stops the run (FailNow panics with errFailNow).
type failRecorder struct {
	failed bool
	msg    string
}

var errFailNow = errors.New("FailNow")

func (f *failRecorder) Errorf(format string, args ...any) {
	if !f.failed {
		f.failed, f.msg = true, fmt.Sprintf(format, args...)
	}
}

func (f *failRecorder) FailNow() { panic(errFailNow) }

// tierFormatLayers is tierFormat with another layer count.
func tierFormatLayers(ps, layers int) tier.PageFormat {
	f := tierFormat(ps)
	f.Layers = layers
	return f
}

// FuzzStateTiers drives TestStateTiersMatchModel's workload from raw
// bytes: the first byte picks the host pool and write-through, the rest
// are the operations' random draws (byteSource). Every step's state reads
// are checked against the fake engine's bytes, Audit runs after every
// operation, and the run drains to no copy and no cached page. Inputs are
// cut at 1024 bytes.
func FuzzStateTiers(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	f.Add(make([]byte, 96))
	f.Add([]byte("\x85 state tiers: add, step to a checkpoint, evict with offload, onload, release"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		data = data[:min(len(data), 1024)]
		h := data[0]
		x := newSTTierHarness(t, stTierConfig{hostPages: 4 + 4*int(h%8), writeThrough: h&0x80 != 0})
		x.rng = rand.New(&byteSource{data: data[1:]})
		x.run(len(data) / 3)
	})
}
