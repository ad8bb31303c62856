package host

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

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
