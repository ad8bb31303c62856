package pagedkv

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"testing"
)

// BenchmarkDecodeStep measures the Manager's per-step overhead for a batch
// of running requests decoding one token each (Reserve + Commit: pages as
// they fill, the FlashInfer arrays, publishing filled pages to the prefix
// cache, and requests finishing and being replaced on a cached prompt),
// reported per running request, beside a naive manager written the
// obvious way (maps, fresh arrays each step, SHA-256 block hashes).
func BenchmarkDecodeStep(b *testing.B) {
	const ps, promptLen, maxLen = 16, 64, 1024
	for _, nreq := range []int{64, 256, 4096} {
		b.Run(fmt.Sprintf("ours/requests=%d", nreq), func(b *testing.B) {
			m := mustNew(b, Config{NumPages: nreq*maxLen/ps + 64, PageSize: ps, HashSeed: 1})
			ids := make([]RequestID, nreq)
			nt := make([]int32, nreq)
			sampled := make([]int32, nreq)
			next := RequestID(0)
			prompts := make([][]int32, nreq) // built up front: the timed loop measures the Manager alone
			for i := range prompts {
				prompts[i] = seqTokens(i*7919, promptLen)
			}
			admit := func(i int) {
				ids[i] = next
				next++
				if _, err := m.Add(ids[i], Request{Prompt: prompts[i], CapacityTokens: maxLen + 1}); err != nil {
					b.Fatal(err)
				}
			}
			for i := range ids {
				admit(i)
				// Compute the prompt once; later admissions reuse it.
				if m.Computed(ids[i]) < promptLen {
					if _, err := m.Reserve(ids[i:i+1], []int32{int32(promptLen - m.Computed(ids[i]))}); err != nil {
						b.Fatal(err)
					}
					if err := m.Commit(nil); err != nil {
						b.Fatal(err)
					}
				}
				if err := m.Extend(ids[i], 1); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				for i, id := range ids {
					if len(m.Tokens(id)) >= maxLen {
						if err := m.Release(id); err != nil {
							b.Fatal(err)
						}
						admit(i)
					}
					nt[i] = int32(len(m.Tokens(ids[i])) - m.Computed(ids[i]))
					sampled[i] = int32(i)
				}
				if _, err := m.Reserve(ids, nt); err != nil {
					b.Fatal(err)
				}
				if err := m.Commit(sampled); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(nreq), "ns/request")
		})

		b.Run(fmt.Sprintf("naive/requests=%d", nreq), func(b *testing.B) {
			n := newNaiveManager(2*nreq*maxLen/ps+64, ps) // no eviction: room for the cache
			for i := range nreq {
				n.add(RequestID(i), seqTokens(i*7919, promptLen))
			}
			next := RequestID(nreq)
			ids := make([]RequestID, nreq)
			for i := range ids {
				ids[i] = RequestID(i)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				for i, id := range ids {
					if len(n.reqs[id].tokens) >= maxLen {
						n.release(id)
						ids[i] = next
						next++
						n.add(ids[i], seqTokens(i*7919, promptLen))
					}
				}
				n.step(ids)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(nreq), "ns/request")
		})
	}
}

// naiveManager is the baseline: a page list per request in a map, a free
// list, a hash -> page map of full pages keyed by chained SHA-256 (trusted
// without verification), and every step's arrays built fresh.
type naiveManager struct {
	pageSize int
	free     []int32
	refs     []int32
	cached   map[[32]byte]int32
	reqs     map[RequestID]*naiveRequest
}

type naiveRequest struct {
	tokens []int32
	pages  []int32
	hashes [][32]byte // chained hash of each full page
}

func newNaiveManager(numPages, pageSize int) *naiveManager {
	n := &naiveManager{pageSize: pageSize, refs: make([]int32, numPages),
		cached: map[[32]byte]int32{}, reqs: map[RequestID]*naiveRequest{}}
	for p := numPages - 1; p >= 0; p-- {
		n.free = append(n.free, int32(p))
	}
	return n
}

func (n *naiveManager) pageHash(prev [32]byte, tokens []int32) [32]byte {
	buf := append([]byte(nil), prev[:]...)
	for _, t := range tokens {
		buf = binary.LittleEndian.AppendUint32(buf, uint32(t))
	}
	return sha256.Sum256(buf)
}

func (n *naiveManager) alloc() int32 {
	p := n.free[len(n.free)-1]
	n.free = n.free[:len(n.free)-1]
	n.refs[p] = 1
	return p
}

// add admits a request with its prompt already computed, reusing cached
// full pages.
func (n *naiveManager) add(id RequestID, prompt []int32) {
	r := &naiveRequest{tokens: append([]int32(nil), prompt...)}
	var prev [32]byte
	for d := 0; (d+1)*n.pageSize <= len(prompt); d++ {
		h := n.pageHash(prev, prompt[d*n.pageSize:(d+1)*n.pageSize])
		p, ok := n.cached[h]
		if !ok {
			p = n.alloc()
			n.cached[h] = p
			n.refs[p]++
		}
		n.refs[p]++
		r.pages = append(r.pages, p)
		r.hashes = append(r.hashes, h)
		prev = h
	}
	if len(prompt)%n.pageSize != 0 {
		r.pages = append(r.pages, n.alloc())
	}
	n.reqs[id] = r
}

func (n *naiveManager) release(id RequestID) {
	for _, p := range n.reqs[id].pages {
		if n.refs[p]--; n.refs[p] == 0 {
			n.free = append(n.free, p)
		}
	}
	delete(n.reqs, id)
}

// step appends one token to every request and builds the step's arrays.
func (n *naiveManager) step(ids []RequestID) (kvIndptr, kvPageIndices, lastPageLen, batchIndices, positions []int32) {
	kvIndptr = []int32{0}
	for b, id := range ids {
		r := n.reqs[id]
		pos := len(r.tokens)
		if pos%n.pageSize == 0 {
			r.pages = append(r.pages, n.alloc())
		}
		r.tokens = append(r.tokens, int32(b))
		if len(r.tokens)%n.pageSize == 0 { // a page filled: publish it
			var prev [32]byte
			if len(r.hashes) > 0 {
				prev = r.hashes[len(r.hashes)-1]
			}
			h := n.pageHash(prev, r.tokens[len(r.tokens)-n.pageSize:])
			r.hashes = append(r.hashes, h)
			if _, ok := n.cached[h]; !ok {
				p := r.pages[len(r.pages)-1]
				n.cached[h] = p
				n.refs[p]++
			}
		}
		kvPageIndices = append(kvPageIndices, r.pages...)
		kvIndptr = append(kvIndptr, int32(len(kvPageIndices)))
		lastPageLen = append(lastPageLen, int32((len(r.tokens)-1)%n.pageSize+1))
		batchIndices = append(batchIndices, int32(b))
		positions = append(positions, int32(pos))
	}
	return
}

// specBench is a batch of requests decoding with k drafts per step; each
// step accepts (b+step)%(k+1) drafts of request b and samples a bonus
// token, so rollback runs every step. Requests that reach maxLen are
// replaced on a cached prompt.
type specBench struct {
	m        *Manager
	ids      []RequestID
	nt       []int32
	drafts   [][]int32
	accepted []int32
	sampled  []int32
	next     RequestID
	step     int
}

func newSpecBench(tb testing.TB, nreq, k int) *specBench {
	const ps, promptLen, maxLen = 16, 64, 1024
	s := &specBench{m: mustNew(tb, Config{NumPages: nreq*(maxLen+ps)/ps + 64, PageSize: ps, HashSeed: 1, BlockTablesStride: (maxLen+k+ps-1)/ps + 1}),
		ids: make([]RequestID, nreq), nt: make([]int32, nreq), drafts: make([][]int32, nreq),
		accepted: make([]int32, nreq), sampled: make([]int32, nreq)}
	for i := range s.ids {
		s.admit(tb, i)
		s.drafts[i] = make([]int32, k)
	}
	return s
}

func (s *specBench) admit(tb testing.TB, i int) {
	const promptLen, maxLen = 64, 1024
	s.ids[i] = s.next
	s.next++
	if _, err := s.m.Add(s.ids[i], Request{Prompt: seqTokens(i*7919, promptLen), CapacityTokens: maxLen + 64}); err != nil {
		tb.Fatal(err)
	}
	if c := s.m.Computed(s.ids[i]); c < promptLen {
		if _, err := s.m.Reserve(s.ids[i:i+1], []int32{int32(promptLen - c)}); err != nil {
			tb.Fatal(err)
		}
		if err := s.m.Commit(nil); err != nil {
			tb.Fatal(err)
		}
	}
	if err := s.m.Extend(s.ids[i], 1); err != nil {
		tb.Fatal(err)
	}
}

// run does one speculative step (k == 0: a plain Reserve/Commit).
func (s *specBench) run(tb testing.TB) {
	const maxLen = 1024
	s.step++
	for i, id := range s.ids {
		if len(s.m.Tokens(id)) >= maxLen {
			if err := s.m.Release(id); err != nil {
				tb.Fatal(err)
			}
			s.admit(tb, i)
			id = s.ids[i]
		}
		s.nt[i] = int32(len(s.m.Tokens(id)) - s.m.Computed(id))
		for j := range s.drafts[i] {
			s.drafts[i][j] = int32(i + j + s.step)
		}
		s.accepted[i] = int32((i + s.step) % (len(s.drafts[i]) + 1))
		s.sampled[i] = int32(i)
	}
	if len(s.drafts[0]) == 0 {
		if _, err := s.m.Reserve(s.ids, s.nt); err != nil {
			tb.Fatal(err)
		}
		if err := s.m.Commit(s.sampled); err != nil {
			tb.Fatal(err)
		}
		return
	}
	if _, err := s.m.ReserveSpec(s.ids, s.nt, s.drafts); err != nil {
		tb.Fatal(err)
	}
	if err := s.m.CommitSpec(s.accepted, s.sampled); err != nil {
		tb.Fatal(err)
	}
}

// BenchmarkSpecStep measures a speculative step with k = 4 drafts per
// request (ReserveSpec of 5 rows, CommitSpec with rollback of the rejected
// ones), per request, beside a plain decode step (k = 0, one row) in the
// same run: the difference is the cost of the drafts' rows and rollback.
func BenchmarkSpecStep(b *testing.B) {
	const nreq = 256
	for _, k := range []int{0, 4} {
		b.Run(fmt.Sprintf("k=%d/requests=%d", k, nreq), func(b *testing.B) {
			s := newSpecBench(b, nreq, k)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				s.run(b)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(nreq), "ns/request")
		})
	}
}

// BenchmarkHybridDecodeStep measures a decode step's Manager overhead per
// request for a hybrid model of two groups (gpt-oss-like: sliding window
// 128 and full) beside one group (full) on the same workload in the same
// run, both through HybridManager, and the plain Manager (manager: today's
// single-group API) on the same workload; the goal is two groups <= 2x one
// group. state=3:full=1 is a Qwen3-Next-like model (three state groups to
// one full group, docs/state-groups.md); its goal is <= 2x groups=1.
func BenchmarkHybridDecodeStep(b *testing.B) {
	const ps, promptLen, maxLen, nreq = 16, 64, 1024, 256
	full := LayerGroup{Kind: FullAttention, NumLayers: 1}
	sliding := LayerGroup{Kind: SlidingAttention, WindowTokens: 128, NumLayers: 1}
	for _, c := range []struct {
		name   string
		groups []LayerGroup
	}{{"manager", nil}, {"groups=1", []LayerGroup{full}}, {"groups=2", []LayerGroup{sliding, full}},
		// Qwen3-Next-like: three Gated DeltaNet groups to one full group.
		{"state=3:full=1", []LayerGroup{stateGroup(), stateGroup(), stateGroup(), full}}} {
		b.Run(c.name, func(b *testing.B) {
			cfg := Config{NumPages: max(1, len(c.groups))*nreq*(maxLen+ps)/ps + 64, PageSize: ps, HashSeed: 1}
			// One set of calls for both kinds of manager: the plain
			// Manager's, or the HybridManager's.
			var (
				add     func(RequestID, Request) (int, error)
				reserve func([]RequestID, []int32) error
				commit  func([]int32) error
				extend  func(RequestID, ...int32) error
				release func(RequestID) error
				tokens  func(RequestID) []int32
				comp    func(RequestID) int
			)
			if c.groups == nil {
				m := mustNew(b, cfg)
				add, commit, extend, release, tokens, comp = m.Add, m.Commit, m.Extend, m.Release, m.Tokens, m.Computed
				reserve = func(ids []RequestID, nt []int32) error { _, err := m.Reserve(ids, nt); return err }
			} else {
				h, err := NewHybrid(HybridConfig{Config: cfg, Groups: c.groups})
				if err != nil {
					b.Fatal(err)
				}
				add, commit, extend, release, tokens, comp = h.Add, h.Commit, h.Extend, h.Release, h.Tokens, h.Computed
				reserve = func(ids []RequestID, nt []int32) error { _, err := h.Reserve(ids, nt); return err }
			}
			ids, nt, sampled := make([]RequestID, nreq), make([]int32, nreq), make([]int32, nreq)
			next := RequestID(0)
			admit := func(i int) {
				ids[i] = next
				next++
				if _, err := add(ids[i], Request{Prompt: seqTokens(i*7919, promptLen), CapacityTokens: maxLen + 1}); err != nil {
					b.Fatal(err)
				}
				if c := comp(ids[i]); c < promptLen {
					if err := reserve(ids[i:i+1], []int32{int32(promptLen - c)}); err != nil {
						b.Fatal(err)
					}
					if err := commit(nil); err != nil {
						b.Fatal(err)
					}
				}
				if err := extend(ids[i], 1); err != nil {
					b.Fatal(err)
				}
			}
			for i := range ids {
				admit(i)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				for i, id := range ids {
					if len(tokens(id)) >= maxLen {
						if err := release(id); err != nil {
							b.Fatal(err)
						}
						admit(i)
					}
					nt[i] = int32(len(tokens(ids[i])) - comp(ids[i]))
					sampled[i] = int32(i)
				}
				if err := reserve(ids, nt); err != nil {
					b.Fatal(err)
				}
				if err := commit(sampled); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(nreq), "ns/request")
		})
	}
}
