package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/layout"
)

// refSchedule is the slow model of the split-KV scheduler: the rule of
// schedule.go read directly, in big rationals, with a row's chunks dealt
// greedily (each takes floor(remaining tiles / remaining chunks), which
// leaves the longer chunks last). It returns the work items, merge_indptr
// (nil: direct), the target E, whether the capacity raised it and whether
// a row is split, or an error when the items cannot fit.
func refSchedule(lo, hi []int, req []int32, lim schedLimits) (work, merge []int32, e *big.Rat, limited, split bool, err error) {
	rows := len(lo)
	total, nonempty := int64(0), 0
	for r := range rows {
		if lo[r] < 0 || hi[r] < lo[r] || hi[r] > math.MaxInt32 {
			return nil, nil, nil, false, false, fmt.Errorf("row %d has key range [%d, %d)", r, lo[r], hi[r])
		}
		total += int64(hi[r] - lo[r])
		if hi[r] > lo[r] {
			nonempty++
		}
	}
	unit := int64(lim.Tile)
	split = lim.Force >= 0
	if lim.Force > 0 {
		e, unit = big.NewRat(int64(lim.Force), 1), 1
	} else {
		num := new(big.Int).Mul(big.NewInt(total), big.NewInt(int64(lim.CTAsPerItem)))
		e = new(big.Rat).SetFrac(num, big.NewInt(int64(lim.Slots)))
		if e.Cmp(big.NewRat(int64(lim.MinChunk), 1)) < 0 {
			e = big.NewRat(int64(lim.MinChunk), 1)
		}
		if num.Cmp(new(big.Int).Lsh(big.NewInt(1), 62)) >= 0 {
			split = false
		}
	}
	// pieces(v) = 1 if v <= E, else ceil(ceil(v/unit)*unit / E)
	pieces := func(v int64) int64 {
		if v == 0 {
			return 0
		}
		if big.NewRat(v, 1).Cmp(e) <= 0 {
			return 1
		}
		t := (v + unit - 1) / unit
		q := new(big.Rat).Quo(big.NewRat(t*unit, 1), e)
		n := new(big.Int).Quo(q.Num(), q.Denom())
		if !q.IsInt() {
			n.Add(n, big.NewInt(1))
		}
		return n.Int64()
	}
	count := func() int {
		n := 0
		for r := range rows {
			n += int(pieces(int64(hi[r] - lo[r])))
		}
		return n
	}
	items := 0
	if split {
		items = count()
		if items > lim.Capacity && lim.Capacity > nonempty {
			free := int64(lim.Capacity - nonempty)
			e, limited = big.NewRat((total+int64(nonempty)*(unit-1)+free-1)/free, 1), true
			items = count()
		}
		limited = limited || items > lim.Capacity
		split = items > nonempty && items <= lim.Capacity
	}
	partial := split || lim.Merge
	switch {
	case !partial:
		items = rows
	case !split:
		items = nonempty
	}
	if items > lim.Capacity {
		return nil, nil, e, limited, split, fmt.Errorf("%d items exceed the capacity %d", items, lim.Capacity)
	}
	if !partial {
		for r := range rows {
			work = append(work, int32(r), req[r], int32(lo[r]), int32(hi[r]))
		}
		return work, nil, e, limited, split, nil
	}
	merge = []int32{0}
	for r := range rows {
		v := int64(hi[r] - lo[r])
		n := int64(0)
		if v > 0 {
			n = 1
			if split {
				n = pieces(v)
			}
		}
		left, st := (v+unit-1)/unit, int64(lo[r])
		for k := n; k > 0; k-- {
			take := left / k
			left -= take
			end := min(st+take*unit, int64(hi[r]))
			work = append(work, int32(r), req[r], int32(st), int32(end))
			st = end
		}
		merge = append(merge, int32(len(work)/4))
	}
	return work, merge, e, limited, split, nil
}

// checkSchedule checks s, just planned from (lo, hi, req, lim), against
// the reference and the scheduler's promises: every visible key of a row
// in exactly one of its items, in order; chunks of whole units but a row's
// last; no empty item in a split launch; rows no longer than E unsplit;
// no chunk longer than E rounded up to the unit; a split row's chunks but
// its last at least half of E in whole units; the capacity; at least one
// full wave when E is the balanced share; O(rows + items) iterations.
func checkSchedule(t testing.TB, s *kvSchedule, lo, hi []int, req []int32, lim schedLimits, err error) {
	t.Helper()
	what := fmt.Sprintf("lim %+v, %d rows", lim, len(lo))
	work, merge, e, limited, split, refErr := refSchedule(lo, hi, req, lim)
	if refErr != nil {
		require.Error(t, err, "%s: the reference refuses (%v)", what, refErr)
		return
	}
	require.NoError(t, err, what)
	require.Equal(t, append([]int32{}, work...), append([]int32{}, s.work...), "%s: work items", what)
	require.Equal(t, merge, s.merge, "%s: merge_indptr", what)
	require.Equal(t, limited, s.limited, "%s: capacity-limited", what)
	require.LessOrEqual(t, s.items(), lim.Capacity, what)
	require.LessOrEqual(t, s.iters, 4*len(lo)+s.items()+1, "%s: iterations", what)

	unit := lim.Tile
	if lim.Force > 0 {
		unit = 1
	}
	// the longest chunk: E rounded up to the unit; a split row's chunks but
	// its last: at least half of E rounded down to the unit
	longest, least := 0, 0
	if e != nil {
		q := new(big.Rat).Quo(e, big.NewRat(int64(unit), 1))
		n := new(big.Int).Quo(q.Num(), q.Denom())
		least = int(new(big.Int).Rsh(n, 1).Int64()) * unit // floor(floor(E/unit)/2) = floor(E/(2 unit))
		if !q.IsInt() {
			n.Add(n, big.NewInt(1))
		}
		if n.IsInt64() && n.Int64() < math.MaxInt32 {
			longest = int(n.Int64()) * unit
		} else {
			longest = math.MaxInt
		}
	}
	total := 0
	for r := range lo {
		total += hi[r] - lo[r]
	}
	maxKeys := 0
	for r := range lo {
		first, last := r, r+1
		if merge != nil {
			first, last = int(merge[r]), int(merge[r+1])
		}
		v := hi[r] - lo[r]
		if merge != nil && v == 0 {
			require.Equal(t, first, last, "%s: row %d without keys has items", what, r)
		}
		var seen []int
		if v <= 512 { // the rest: contiguous items from lo to hi, checked below
			seen = make([]int, v)
		}
		next := lo[r]
		for i := first; i < last; i++ { // plain tests: testify per item is slow for a fuzz target
			qr, rq, b, en := int(work[4*i]), work[4*i+1], int(work[4*i+2]), int(work[4*i+3])
			switch {
			case qr != r || rq != req[r]:
				t.Fatalf("%s: item %d is (%d, %d, ...), want row %d of request %d", what, i, qr, rq, r, req[r])
			case b != next:
				t.Fatalf("%s: item %d of row %d starts at %d, the last ended at %d", what, i, r, b, next)
			case en < b || merge != nil && en == b:
				t.Fatalf("%s: item %d has keys [%d, %d) (split launch: %v)", what, i, b, en, merge != nil)
			case i < last-1 && (en-b)%unit != 0:
				t.Fatalf("%s: item %d of row %d: %d keys, not whole tiles of %d", what, i, r, en-b, unit)
			}
			for k := b; k < en && seen != nil; k++ {
				seen[k-lo[r]]++
			}
			maxKeys = max(maxKeys, en-b)
			next = en
		}
		require.Equal(t, hi[r], next, "%s: row %d not covered", what, r)
		for k, n := range seen {
			if n != 1 {
				t.Fatalf("%s: key %d of row %d in %d items", what, lo[r]+k, r, n)
			}
		}
		if !split {
			continue
		}
		n := last - first
		if big.NewRat(int64(v), 1).Cmp(e) <= 0 {
			require.LessOrEqual(t, n, 1, "%s: row %d of %d keys <= E = %v split", what, r, v, e)
		}
		for i := first; i < last; i++ {
			keys := int(work[4*i+3] - work[4*i+2])
			if keys > longest {
				t.Fatalf("%s: item %d has %d keys, more than E = %v rounded up to %d", what, i, keys, e, unit)
			}
			if n >= 2 && i < last-1 && keys < least {
				t.Fatalf("%s: item %d of split row %d has %d keys, less than half of E = %v in units of %d", what, i, r, keys, e, unit)
			}
		}
	}
	require.Equal(t, maxKeys, s.maxKeys, what)
	// E is the balanced share of one wave (not raised to the minimum or by
	// the capacity, and the capacity held one item per row)
	balanced := lim.Force == 0 && !limited && int64(lim.CTAsPerItem)*int64(total) >= int64(lim.MinChunk)*int64(lim.Slots)
	if balanced {
		require.GreaterOrEqual(t, s.ctas(lim), lim.Slots, "%s: less than one full wave", what)
		// the largest CTA: at most ceil(total CTA-keys / slots) rounded up to the tile
		ideal := (int64(lim.CTAsPerItem)*int64(total) + int64(lim.Slots) - 1) / int64(lim.Slots)
		require.LessOrEqual(t, int64(s.maxKeys), (ideal+int64(lim.Tile)-1)/int64(lim.Tile)*int64(lim.Tile), "%s: balance", what)
	}
}

// randomRows draws rows of mixed lengths 1..32768 (some empty, some with
// a window start), each of request b for its row b or a prefill-like
// grouping.
func randomRows(rng *rand.Rand, rows int) (lo, hi []int, req []int32) {
	lo, hi, req = make([]int, rows), make([]int, rows), make([]int32, rows)
	for r := range rows {
		var v int
		switch rng.IntN(5) {
		case 0:
			v = 0
		case 1:
			v = 1 + rng.IntN(64)
		case 2:
			v = 1 + rng.IntN(32768)
		default:
			v = []int{512, 4096, 32768, 1000, 3}[rng.IntN(5)]
		}
		if rng.IntN(4) == 0 {
			lo[r] = rng.IntN(100000)
		}
		hi[r] = lo[r] + v
		req[r] = int32(r / (1 + rng.IntN(3)))
	}
	return lo, hi, req
}

func randomLimits(rng *rand.Rand, rows int) schedLimits {
	tile := []int{1, 8, 16, 32, 64}[rng.IntN(5)]
	lim := schedLimits{CTAsPerItem: 1 + rng.IntN(32), Slots: (1 + rng.IntN(132)) * (1 + rng.IntN(8)), Tile: tile,
		MinChunk: tile * (1 + rng.IntN(20)), Capacity: rows + rng.IntN(2000), Merge: rng.IntN(3) == 0}
	switch rng.IntN(8) {
	case 0:
		lim.Force = -1
	case 1:
		lim.Force = 1 + rng.IntN(5000)
	case 2:
		lim.Capacity = rng.IntN(rows + 2) // tight, or too small for one item per row
	}
	return lim
}

// TestScheduleRandom runs the scheduler against the reference on random
// batches of 1..512 rows of mixed lengths, reusing one schedule (so a plan
// never depends on the last), and replans each to check determinism.
func TestScheduleRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(27, 2))
	var s kvSchedule
	n := 1000
	if testing.Short() {
		n = 300
	}
	seen := map[string]int{}
	for i := range n {
		rows := 1 + rng.IntN([]int{1, 8, 64, 512}[i%4])
		lo, hi, req := randomRows(rng, rows)
		lim := randomLimits(rng, rows)
		err := s.plan(lo, hi, req, lim)
		checkSchedule(t, &s, lo, hi, req, lim, err)
		switch {
		case err != nil:
			seen["refused"]++
		case s.limited:
			seen["capacity-limited"]++
		case s.items() > rows:
			seen["split"]++
		case s.merge != nil:
			seen["merged, not split"]++
		default:
			seen["direct"]++
		}
		if lim.Force > 0 && s.items() > rows {
			seen["forced split"]++
		}
		if err == nil {
			work, merge := append([]int32{}, s.work...), s.merge != nil
			require.NoError(t, s.plan(lo, hi, req, lim))
			checkSchedule(t, &s, lo, hi, req, lim, nil)
			require.Equal(t, work, append([]int32{}, s.work...), "replanned")
			require.Equal(t, merge, s.merge != nil, "replanned")
		}
	}
	t.Logf("%v", seen)
	for _, k := range []string{"refused", "capacity-limited", "split", "merged, not split", "direct", "forced split"} {
		require.NotZero(t, seen[k], "no %s plan drawn", k)
	}
}

// The scheduler refuses bad input by name and then changes no item.
func TestScheduleRejects(t *testing.T) {
	ok := schedLimits{CTAsPerItem: 8, Slots: 528, Tile: 32, MinChunk: 320, Capacity: 100}
	var s kvSchedule
	require.NoError(t, s.plan([]int{0}, []int{5000}, []int32{0}, ok))
	before := append([]int32(nil), s.work...)
	for _, c := range []struct {
		lo, hi []int
		req    []int32
		lim    func(*schedLimits)
		msg    string
	}{
		{[]int{0}, []int{10}, []int32{0}, func(l *schedLimits) { l.Tile = 0 }, "tile = 0 outside [1, 2^31)"},
		{[]int{0}, []int{10}, []int32{0}, func(l *schedLimits) { l.Slots = -3 }, "slots = -3"},
		{[]int{0}, []int{10}, []int32{0}, func(l *schedLimits) { l.CTAsPerItem = 0 }, "ctas_per_item = 0"},
		{[]int{0}, []int{10}, []int32{0}, func(l *schedLimits) { l.MinChunk = 33 }, "min_chunk = 33 is not a multiple of tile = 32"},
		{[]int{0}, []int{10}, []int32{0}, func(l *schedLimits) { l.Capacity = -1 }, "capacity = -1"},
		{[]int{0}, []int{10}, []int32{0}, func(l *schedLimits) { l.Force = math.MaxInt32 + 1 }, "force = 2147483648"},
		{[]int{0, 7}, []int{10, 3}, []int32{0, 1}, nil, "row 1 has key range [7, 3)"},
		{[]int{-1}, []int{10}, []int32{0}, nil, "row 0 has key range [-1, 10)"},
		{[]int{0}, []int{math.MaxInt32 + 1}, []int32{0}, nil, "[0, 2147483648)"},
		{[]int{0, 0}, []int{1, 2}, []int32{0}, nil, "2 row starts, 2 row ends and 1 requests"},
		{[]int{0, 0, 0}, []int{1, 2, 3}, []int32{0, 1, 2}, func(l *schedLimits) { l.Capacity = 2 }, "3 work items for 3 rows (3 with keys) exceed the capacity 2"},
	} {
		lim := ok
		if c.lim != nil {
			c.lim(&lim)
		}
		err := s.plan(c.lo, c.hi, c.req, lim)
		require.ErrorContains(t, err, c.msg)
		require.Equal(t, before, s.work, "%s: the items changed", c.msg)
	}
}

// The schedule of a step allocates nothing once its buffers have grown.
func TestScheduleAllocationFree(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	lo, hi, req := randomRows(rng, 512)
	lim := schedLimits{CTAsPerItem: 8, Slots: 528, Tile: 32, MinChunk: 320, Capacity: 4096}
	var s kvSchedule
	require.NoError(t, s.plan(lo, hi, req, lim))
	assert.Zero(t, testing.AllocsPerRun(20, func() { require.NoError(t, s.plan(lo, hi, req, lim)) }))
	lim.Merge = true
	require.NoError(t, s.plan(lo, hi, req, lim))
	assert.Zero(t, testing.AllocsPerRun(20, func() { require.NoError(t, s.plan(lo, hi, req, lim)) }))
}

// issueShape is a decode shape of issue 27 on an H100 (132 SMs), planned as
// a Step plans it (planDecodeShape's tile, occupancy and least target).
type issueShape struct {
	name      string
	B, L      int
	H, Hq, D  int
	ctas      int // launched
	waves     string
	maxKeys   int
	meanKeys  string
	splitRows bool
}

func (c issueShape) limits(t testing.TB) schedLimits {
	g := layout.Paged{DType: layout.F16, HeadDim: c.D, NumKVHeads: c.H}
	p, err := planDecodeShape(g, c.Hq/c.H)
	require.NoError(t, err)
	return schedLimits{CTAsPerItem: c.H * p.gz, Slots: 132 * p.resident, Tile: p.tile, MinChunk: p.minChunk,
		Capacity: 2*c.B + 4*132}
}

// scheduleFigures plans c and returns its CTAs, waves, and the longest and
// mean keys per CTA.
func scheduleFigures(t testing.TB, c issueShape) (ctas int, waves float64, maxKeys int, mean float64, merged bool) {
	lim := c.limits(t)
	lo, hi, req := make([]int, c.B), make([]int, c.B), make([]int32, c.B)
	for r := range c.B {
		hi[r], req[r] = c.L, int32(r)
	}
	var s kvSchedule
	require.NoError(t, s.plan(lo, hi, req, lim))
	checkSchedule(t, &s, lo, hi, req, lim, nil)
	ctas = s.ctas(lim)
	return ctas, float64(ctas) / float64(lim.Slots), s.maxKeys, float64(c.B*c.L) / float64(s.items()), s.merge != nil
}

// The three decode shapes of issue 27 (f16, group 4: 256-thread CTAs, four
// per SM, 528 slots): the figures docs/kernels.md prints.
func TestScheduleIssueShapes(t *testing.T) {
	for _, c := range []issueShape{
		{name: "B64 L4096", B: 64, L: 4096, H: 8, Hq: 32, D: 128, ctas: 1024, waves: "1.94", maxKeys: 2048, meanKeys: "2048.0", splitRows: true},
		{name: "B8 L512", B: 8, L: 512, H: 8, Hq: 32, D: 128, ctas: 128, waves: "0.24", maxKeys: 256, meanKeys: "256.0", splitRows: true},
		{name: "B1 L32768", B: 1, L: 32768, H: 8, Hq: 32, D: 128, ctas: 528, waves: "1.00", maxKeys: 512, meanKeys: "496.5", splitRows: true},
		{name: "B8 L4096", B: 8, L: 4096, H: 8, Hq: 32, D: 128, ctas: 576, waves: "1.09", maxKeys: 480, meanKeys: "455.1", splitRows: true},
		{name: "B512 L4096", B: 512, L: 4096, H: 8, Hq: 32, D: 128, ctas: 4096, waves: "7.76", maxKeys: 4096, meanKeys: "4096.0"},
	} {
		ctas, waves, maxKeys, mean, merged := scheduleFigures(t, c)
		lim := c.limits(t)
		t.Logf("%-10s slots %d tile %d min target %d: CTAs %d, waves %.2f, keys per CTA max %d mean %.1f, split %v",
			c.name, lim.Slots, lim.Tile, lim.MinChunk, ctas, waves, maxKeys, mean, merged)
		assert.Equal(t, c.ctas, ctas, c.name)
		assert.Equal(t, c.waves, fmt.Sprintf("%.2f", waves), c.name)
		assert.Equal(t, c.maxKeys, maxKeys, c.name)
		assert.Equal(t, c.meanKeys, fmt.Sprintf("%.1f", mean), c.name)
		assert.Equal(t, c.splitRows, merged, c.name)
	}
}

// FuzzScheduleKV feeds raw bytes as a schedule's limits and rows (up to 64
// rows, any ranges up to 2^31-1 or raw int32 pairs that may be invalid, a
// capacity of at most 4096 items, so memory stays bounded): the scheduler
// refuses exactly what the reference refuses, and otherwise equals it and
// keeps every promise of checkSchedule.
func FuzzScheduleKV(f *testing.F) {
	f.Add([]byte{1, 0x10, 0x02, 7, 5, 9, 0, 0x10, 0, 0, 0, 0, 0, 0, 0x80, 0, 0, 0})
	f.Add([]byte{3, 0xff, 0xff, 63, 6, 15, 0xff, 0x0f, 1, 1, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4, 5, 6, 7, 8})
	f.Add([]byte{2, 0, 0, 0, 0, 0, 2, 0, 2, 2, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0x80})
	f.Fuzz(fuzzScheduleBody)
}

var fuzzSched kvSchedule

func fuzzScheduleBody(t *testing.T, data []byte) {
	s := &fuzzSched
	{
		if len(data) < 10 {
			return
		}
		u16 := func(i int) int { return int(binary.LittleEndian.Uint16(data[i:])) }
		lim := schedLimits{Slots: 1 + u16(1), CTAsPerItem: 1 + int(data[3]%64), Tile: 1 << (data[4] % 7)}
		lim.MinChunk = lim.Tile * (1 + int(data[5]%32))
		lim.Capacity = u16(6) % 4097
		switch data[8] % 4 {
		case 0:
			lim.Force = -1
		case 1:
			lim.Force = 1 + int(data[5])*int(data[4])
		}
		lim.Merge = data[9]&1 != 0
		raw := data[9]&2 != 0
		rows := int(data[0]) % 65
		rest := data[10:]
		lo, hi, req := make([]int, rows), make([]int, rows), make([]int32, rows)
		for r := range rows {
			var a, b uint32
			if len(rest) >= 8 {
				a, b = binary.LittleEndian.Uint32(rest), binary.LittleEndian.Uint32(rest[4:])
				rest = rest[8:]
			}
			if raw {
				lo[r], hi[r] = int(int32(a)), int(int32(b))
			} else {
				if a>>31 == 0 {
					a %= 100000
				}
				if b>>31 == 0 {
					b %= 40000
				}
				lo[r] = int(a & math.MaxInt32)
				hi[r] = min(lo[r]+int(b&math.MaxInt32), math.MaxInt32)
			}
			req[r] = int32(r)
		}
		err := s.plan(lo, hi, req, lim)
		if err != nil {
			require.True(t, strings.HasPrefix(err.Error(), "split-kv schedule: "), err.Error())
		}
		checkSchedule(t, s, lo, hi, req, lim, err)
	}
}

// BenchmarkSchedule times one step's plan on the host: B = 1..512 rows of
// mixed lengths (1..32768 keys), the issue shapes' kernel (8 CTAs per item,
// 528 slots, tile 32, least target 320), next to the same rows planned
// with split-KV off (one item per row, what every plan costs at least) in
// the same run. Goal: O(rows + items), no allocation.
func BenchmarkSchedule(b *testing.B) {
	for _, B := range []int{1, 8, 64, 512} {
		rng := rand.New(rand.NewPCG(uint64(B), 1))
		lo, hi, req := make([]int, B), make([]int, B), make([]int32, B)
		for r := range B {
			hi[r], req[r] = 1+rng.IntN(32768), int32(r)
		}
		for _, force := range []int{0, -1} {
			lim := schedLimits{CTAsPerItem: 8, Slots: 528, Tile: 32, MinChunk: 320, Capacity: 2*B + 4*132, Force: force}
			name := fmt.Sprintf("B%d/split", B)
			if force < 0 {
				name = fmt.Sprintf("B%d/nosplit", B)
			}
			b.Run(name, func(b *testing.B) {
				var s kvSchedule
				require.NoError(b, s.plan(lo, hi, req, lim))
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					if err := s.plan(lo, hi, req, lim); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(s.items()), "items")
				b.ReportMetric(float64(s.ctas(lim))/float64(lim.Slots), "waves")
			})
		}
	}
}
