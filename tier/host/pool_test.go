package host

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/sysmem"
	"github.com/pagedkv/pagedkv/tier"
)

func dig(i int) tier.Digest { return tier.Next(nil, tier.NamespaceRoot("", "", ""), []int32{int32(i)}) }

func toks(i int) []int32 { return []int32{int32(i), int32(i + 1)} }

func TestPoolLifecycle(t *testing.T) {
	p, err := New(Config{NumPages: 2, PageSize: 2, PageBytes: 8})
	require.NoError(t, err)
	root := tier.NamespaceRoot("", "", "")
	a, err := p.Claim(dig(1), root, toks(1))
	require.NoError(t, err)
	_, err = p.Claim(dig(1), root, toks(1))
	require.ErrorIs(t, err, ErrPresent)
	_, ok := p.Lookup(dig(1), root, toks(1))
	require.False(t, ok, "a page being written is not served")
	require.NoError(t, p.Written(a))
	h, ok := p.Lookup(dig(1), root, toks(1))
	require.True(t, ok)
	require.Equal(t, a, h)
	// Same digest, different parent or tokens: never served.
	_, ok = p.Lookup(dig(1), dig(7), toks(1))
	require.False(t, ok)
	_, ok = p.Lookup(dig(1), root, toks(2))
	require.False(t, ok)

	b, err := p.Claim(dig(2), root, toks(2))
	require.NoError(t, err)
	_, err = p.Claim(dig(3), root, toks(3))
	require.NoError(t, err, "reclaims the ready page a")
	_, ok = p.Lookup(dig(1), root, toks(1))
	require.False(t, ok, "reclaimed")
	_, err = p.Claim(dig(4), root, toks(4))
	require.ErrorIs(t, err, ErrFull, "both pages are being written")
	require.NoError(t, p.Abandon(b))
	require.False(t, p.Has(dig(2)))
	require.ErrorIs(t, p.Written(b), ErrBadPage, "abandoned")
	require.ErrorIs(t, p.Acquire(5), ErrBadPage)
	require.NoError(t, p.CheckInvariants())
}

func TestReadersBlockReclaim(t *testing.T) {
	p, err := New(Config{NumPages: 1, PageSize: 2})
	require.NoError(t, err)
	root := tier.NamespaceRoot("", "", "")
	a, _ := p.Claim(dig(1), root, toks(1))
	require.NoError(t, p.Written(a))
	require.NoError(t, p.Acquire(a))
	_, err = p.Claim(dig(2), root, toks(2))
	require.ErrorIs(t, err, ErrFull)
	require.NoError(t, p.Release(a))
	require.ErrorIs(t, p.Release(a), ErrBadPage)
	_, err = p.Claim(dig(2), root, toks(2))
	require.NoError(t, err)
	require.NoError(t, p.CheckInvariants())
}

func TestNewRejects(t *testing.T) {
	for _, c := range []Config{
		{NumPages: 0, PageSize: 1},
		{NumPages: 1, PageSize: 0},
		{NumPages: 1, PageSize: 1, PageBytes: -1},
		{NumPages: 2, PageSize: 1, PageBytes: 4, Memory: make([]byte, 7)},
	} {
		_, err := New(c)
		require.ErrorIs(t, err, ErrBadConfig, "%+v", c)
	}
}

// A random sequence of operations against a map model: the pool serves
// exactly the ready digests the model holds, and its invariants hold after
// every call.
func TestPoolRandomAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	p, err := New(Config{NumPages: 6, PageSize: 2})
	require.NoError(t, err)
	root := tier.NamespaceRoot("", "", "")
	type st struct {
		h       PageID
		ready   bool
		readers int
	}
	model := map[int]*st{}
	for range 5000 {
		i := rng.IntN(12)
		s := model[i]
		switch rng.IntN(5) {
		case 0:
			h, err := p.Claim(dig(i), root, toks(i))
			if s != nil {
				require.ErrorIs(t, err, ErrPresent)
				break
			}
			if err != nil {
				require.ErrorIs(t, err, ErrFull)
				for _, x := range model {
					require.True(t, !x.ready || x.readers > 0, "full with a reclaimable page")
				}
				break
			}
			for j, x := range model { // a reclaimed page left the model
				if x.h == h {
					require.True(t, x.ready && x.readers == 0)
					delete(model, j)
				}
			}
			model[i] = &st{h: h}
		case 1:
			if s != nil && !s.ready {
				if rng.IntN(4) == 0 {
					require.NoError(t, p.Abandon(s.h))
					delete(model, i)
				} else {
					require.NoError(t, p.Written(s.h))
					s.ready = true
				}
			}
		case 2:
			h, ok := p.Lookup(dig(i), root, toks(i))
			require.Equal(t, s != nil && s.ready, ok)
			if ok {
				require.Equal(t, s.h, h)
			}
		case 3:
			if s != nil && s.ready {
				require.NoError(t, p.Acquire(s.h))
				s.readers++
			}
		case 4:
			if s != nil && s.ready && s.readers > 0 {
				require.NoError(t, p.Release(s.h))
				s.readers--
			}
		}
		require.NoError(t, p.CheckInvariants())
	}
}

// A pool that can never fit is refused by name before anything is
// allocated: its size is compared with MemoryLimit, or with the machine's
// physical memory when that is 0.
func TestNewRefusesMoreThanTheMemoryLimit(t *testing.T) {
	cfg := Config{NumPages: 1 << 20, PageSize: 16, PageBytes: 1 << 20}
	need := AllocBytes(cfg)
	if need < int64(cfg.NumPages)*int64(cfg.PageBytes) {
		t.Fatalf("AllocBytes = %d, less than the pages' bytes", need)
	}
	cfg.MemoryLimit = need - 1
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := New(cfg)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrBadConfig) || !errors.Is(err, sysmem.ErrTooLarge) ||
		!strings.Contains(err.Error(), "NumPages = 1048576") || !strings.Contains(err.Error(), fmt.Sprintf("needs %d bytes", need)) {
		t.Fatalf("New over the limit = %v", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("a refused New allocated %d bytes", grew)
	}
	cfg.MemoryLimit = need
	cfg.NumPages, cfg.PageBytes = 4, 64
	if _, err := New(cfg); err != nil {
		t.Fatalf("New within the limit: %v", err)
	}
	// The pages' bytes count only when the pool allocates them.
	mem := make([]byte, 4*64)
	small := Config{NumPages: 4, PageSize: 16, PageBytes: 64, Memory: mem}
	small.MemoryLimit = AllocBytes(small)
	if AllocBytes(small) >= AllocBytes(Config{NumPages: 4, PageSize: 16, PageBytes: 64}) {
		t.Fatalf("AllocBytes counts caller memory")
	}
	if _, err := New(small); err != nil {
		t.Fatalf("New with caller memory at its limit: %v", err)
	}
	if _, err := New(Config{NumPages: 4, PageSize: 16, MemoryLimit: -1}); !errors.Is(err, ErrBadConfig) ||
		!strings.Contains(err.Error(), "MemoryLimit = -1") {
		t.Fatalf("New with MemoryLimit -1 = %v", err)
	}
	// The default limit is the machine: the largest pool the other checks
	// allow (2^30 pages of the largest page) is refused on any machine.
	huge := Config{NumPages: 1 << 30, PageSize: 4, PageBytes: tier.MaxPageBytes}
	if _, ok := sysmem.Physical(); ok {
		if _, err := New(huge); !errors.Is(err, sysmem.ErrTooLarge) || !strings.Contains(err.Error(), "physical memory") {
			t.Fatalf("New of %d bytes on this machine = %v", AllocBytes(huge), err)
		}
	}
}

// TestPoolRetentionMatchesModel runs random claims, writes, reads,
// retention and time against a slow model of the eviction rule: a reclaim
// takes, of the reclaimable pages, the one of the lowest level, least
// recently queued there; a level with a duration lapses to 0 at its
// deadline (deadline order, ties by page), joining level 0's tail; a use
// (Acquire) restarts the count.
func TestPoolRetentionMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	root := tier.NamespaceRoot("", "", "")
	reclaims, lapses := 0, 0
	for run := range 40 {
		const levels = 4
		p, err := New(Config{NumPages: 2 + run%6, PageSize: 2, Levels: levels})
		require.NoError(t, err)
		type st struct {
			h        PageID
			ready    bool
			readers  int
			level    uint8
			dur      time.Duration
			deadline time.Duration // with dur > 0
			stamp    int           // when it joined its level's queue
		}
		model := map[int]*st{}
		var now time.Duration
		clock := 0
		queue := func(s *st) { clock++; s.stamp = clock }
		for range 600 {
			i := rng.IntN(12)
			s := model[i]
			switch rng.IntN(8) {
			case 0, 1:
				// The victim the model expects, if the claim reclaims.
				var want *st
				free, _, _, _ := p.Usage()
				if free == 0 {
					for _, x := range model {
						if x.ready && x.readers == 0 && (want == nil || x.level < want.level || x.level == want.level && x.stamp < want.stamp) {
							want = x
						}
					}
				}
				h, err := p.Claim(dig(i), root, toks(i))
				if s != nil {
					require.ErrorIs(t, err, ErrPresent)
					break
				}
				if err != nil {
					require.ErrorIs(t, err, ErrFull)
					require.Nil(t, want, "full with a reclaimable page")
					break
				}
				if want != nil {
					require.Equal(t, want.h, h, "the victim")
					reclaims++
				}
				for j, x := range model {
					if x.h == h {
						delete(model, j)
					}
				}
				model[i] = &st{h: h}
			case 2:
				if s != nil && !s.ready {
					if rng.IntN(5) == 0 {
						require.NoError(t, p.Abandon(s.h))
						delete(model, i)
					} else {
						require.NoError(t, p.Written(s.h))
						s.ready = true
						queue(s)
					}
				}
			case 3:
				if s != nil && s.ready {
					require.NoError(t, p.Acquire(s.h))
					s.readers++
					if s.dur > 0 {
						s.deadline = now + s.dur
					}
				}
			case 4:
				if s != nil && s.ready && s.readers > 0 {
					require.NoError(t, p.Release(s.h))
					s.readers--
					if s.readers == 0 {
						queue(s)
					}
				}
			case 5:
				if s == nil {
					break
				}
				r := tier.Retention{Priority: uint8(rng.IntN(levels)), Hint: uint8(rng.IntN(3))}
				if rng.IntN(2) == 0 {
					r.Duration = time.Duration(1 + rng.IntN(20))
					r.Left = time.Duration(1 + rng.IntN(int(r.Duration)))
				}
				require.NoError(t, p.SetRetention(s.h, r))
				old := s.level
				s.level, s.dur = r.Priority, r.Duration
				if r.Priority == 0 {
					s.dur = 0
				}
				s.deadline = now + r.Left
				if s.level != old && s.ready && s.readers == 0 {
					queue(s)
				}
				got := p.Retention(s.h)
				require.Equal(t, s.level, got.Priority)
				require.Equal(t, r.Hint, got.Hint)
				if s.dur > 0 {
					require.Equal(t, r.Left, got.Left)
				}
			case 6:
				now += time.Duration(rng.IntN(6))
				// Lapse in deadline order, ties by page.
				var due []*st
				for _, x := range model {
					if x.dur > 0 && x.deadline <= now {
						due = append(due, x)
					}
				}
				slices.SortFunc(due, func(a, b *st) int {
					if a.deadline != b.deadline {
						return int(a.deadline - b.deadline)
					}
					return int(a.h - b.h)
				})
				for _, x := range due {
					x.dur = 0
					if x.level != 0 {
						x.level = 0
						if x.ready && x.readers == 0 {
							queue(x)
						}
					}
				}
				require.Equal(t, len(due), p.Advance(now))
				lapses += len(due)
			case 7:
				// Bad retention changes nothing.
				if s != nil {
					err := p.SetRetention(s.h, tier.Retention{Priority: levels})
					require.ErrorIs(t, err, ErrBadPage)
					require.ErrorContains(t, err, "retention priority 4, want 0..3")
					require.Equal(t, s.level, p.Retention(s.h).Priority)
				}
			}
			require.NoError(t, p.CheckInvariants())
		}
	}
	if reclaims < 100 || lapses < 100 {
		t.Fatalf("the runs reclaimed %d pages and lapsed %d: too few to test the rule", reclaims, lapses)
	}
}
