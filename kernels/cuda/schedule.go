package cuda

import (
	"fmt"
	"math"
	"math/bits"
)

// The split-KV scheduler: FlashInfer's plan() for this package's kernels.
// It cuts each query row's visible keys into chunks so that a step's grid
// fills the GPU, and writes the work items (q_row, request, kv_begin,
// kv_end) and the merge CSR the kernels read. It is a pure function of its
// inputs (integer arithmetic only, so the same on every machine), costs
// O(rows + items) and allocates nothing once its buffers have grown.
//
// The rule (docs/kernels.md, "Split-KV scheduler"): every item launches
// CTAsPerItem CTAs that each walk the item's keys, so a step with T visible
// keys in total costs CTAsPerItem*T CTA-keys, and one full wave of the GPU's
// Slots CTAs is balanced when each CTA walks
//
//	E = CTAsPerItem*T / Slots keys,
//
// but never fewer than MinChunk (below that the partial states and their
// merge cost more than the split gains; see minChunkKeys). A row of v keys
// (t = ceil(v/Tile) tiles) longer than E is cut into
// n = ceil(t*Tile / E) chunks of floor(t/n) or ceil(t/n) whole tiles (the
// longer ones last), so no chunk is longer than E rounded up to the tile,
// and sum(n) >= T/E: at least one full wave whenever E is not raised to
// MinChunk. A row of at most E keys is not split. When the items would
// exceed Capacity, E grows to about T / (Capacity - rows with keys), which
// fits.

// schedLimits are the launch facts a schedule is made for.
type schedLimits struct {
	// CTAsPerItem is how many CTAs one work item launches (the decode
	// kernel: num_kv_heads * grid.z).
	CTAsPerItem int
	// Slots is how many CTAs the GPU holds at once: SMs times the kernel's
	// resident CTAs per SM (its occupancy).
	Slots int
	// Tile is the kernel's tile in keys: every chunk but a row's last is a
	// whole number of tiles.
	Tile int
	// MinChunk is the least per-CTA target E, a multiple of Tile
	// (minChunkKeys); a split row's chunks are then at least
	// floor(MinChunk/(2*Tile)) tiles, all but its last.
	MinChunk int
	// Capacity is the most work items the plan may have.
	Capacity int
	// Force > 0 cuts every row longer than Force keys into chunks of at
	// most Force keys (any length, not tiles: Config.MaxChunkTokens);
	// Force < 0 never splits.
	Force int
	// Merge asks for the merge CSR even when no row is split (a fixed
	// launch shape, what a captured graph needs): then every item writes a
	// partial state and a row without keys has no item.
	Merge bool
}

// kvSchedule is a schedule and the buffers it reuses.
type kvSchedule struct {
	// work holds the items, 4 int32 each: (q_row, request, kv_begin,
	// kv_end), rows in order and each row's chunks in key order.
	work []int32
	// merge is merge_indptr [rows+1] (row r's items are
	// merge[r]..merge[r+1]-1), or nil when every row has exactly one item
	// that writes its output directly.
	merge []int32
	mbuf  []int32 // merge's storage, kept while merge is nil
	n     []int32 // chunks per row (count), reused by the emitting pass
	// figures of the last plan
	num, den uint64 // the per-CTA target E = num/den keys
	limited  bool   // the capacity raised E or kept the rows whole
	maxKeys  int    // the longest item
	iters    int    // loop iterations of the last plan (the O(rows + items) bound)
}

func (s *kvSchedule) items() int { return len(s.work) / 4 }

// ctas is the number of CTAs the items launch.
func (s *kvSchedule) ctas(lim schedLimits) int { return s.items() * lim.CTAsPerItem }

// minChunkKeys is the least per-CTA target of a kernel whose CTA reads
// kvBytesPerKey bytes of K and V per key and, when its item is one chunk of
// several, writes a partial state that the merge reads back:
// partialBytes = 2 * heads * (head_dim + 1) * 4. A chunk of at least 16 *
// partialBytes / kvBytesPerKey keys keeps that traffic within 1/16 of the
// chunk's K/V bytes; the target is twice that, rounded up to the tile,
// because a split row's chunks are at least half the target.
func minChunkKeys(kvBytesPerKey, partialBytes, tile int) int {
	k := (16*partialBytes + kvBytesPerKey - 1) / max(kvBytesPerKey, 1)
	return 2 * max((k+tile-1)/tile, 1) * tile
}

// check returns an error naming the first limit out of range.
func (lim schedLimits) check() error {
	for _, v := range []struct {
		name string
		n    int
		lo   int
	}{{"ctas_per_item", lim.CTAsPerItem, 1}, {"slots", lim.Slots, 1}, {"tile", lim.Tile, 1}, {"min_chunk", lim.MinChunk, 1},
		{"capacity", lim.Capacity, 0}} {
		if v.n < v.lo || v.n > math.MaxInt32 {
			return fmt.Errorf("split-kv schedule: %s = %d outside [%d, 2^31)", v.name, v.n, v.lo)
		}
	}
	if lim.MinChunk%lim.Tile != 0 {
		return fmt.Errorf("split-kv schedule: min_chunk = %d is not a multiple of tile = %d", lim.MinChunk, lim.Tile)
	}
	if lim.Force > math.MaxInt32 {
		return fmt.Errorf("split-kv schedule: force = %d outside (-inf, 2^31)", lim.Force)
	}
	return nil
}

// plan schedules rows r = 0..len(lo)-1: query row r of request req[r]
// attends keys [lo[r], hi[r]). On an error nothing of s changes but its
// figures.
func (s *kvSchedule) plan(lo, hi []int, req []int32, lim schedLimits) error {
	s.iters, s.limited, s.maxKeys = 0, false, 0
	if err := lim.check(); err != nil {
		return err
	}
	if len(hi) != len(lo) || len(req) != len(lo) {
		return fmt.Errorf("split-kv schedule: %d row starts, %d row ends and %d requests (want equal)", len(lo), len(hi), len(req))
	}
	rows := len(lo)
	var total uint64 // < 2^31 rows of < 2^31 keys: fits
	nonempty := 0
	for r := range rows {
		s.iters++
		if lo[r] < 0 || hi[r] < lo[r] || hi[r] > math.MaxInt32 {
			return fmt.Errorf("split-kv schedule: row %d has key range [%d, %d) (want 0 <= lo <= hi <= 2^31-1)", r, lo[r], hi[r])
		}
		if hi[r] > lo[r] {
			total += uint64(hi[r] - lo[r])
			nonempty++
		}
	}

	split := lim.Force >= 0
	unit := uint64(lim.Tile)
	switch {
	case lim.Force > 0:
		s.num, s.den, unit = uint64(lim.Force), 1, 1
	default:
		// E = max(CTAsPerItem*total/Slots, MinChunk), in 128 bits.
		hi, lo := bits.Mul64(total, uint64(lim.CTAsPerItem))
		mhi, mlo := bits.Mul64(uint64(lim.MinChunk), uint64(lim.Slots))
		if hi > 0 || lo >= (1<<62) {
			// Over 2^62 CTA-keys: no row of < 2^31 keys is longer than E.
			split = false
		} else if hi < mhi || (hi == mhi && lo < mlo) {
			s.num, s.den = uint64(lim.MinChunk), 1
		} else {
			s.num, s.den = lo, uint64(lim.Slots)
		}
	}
	items := 0
	if split {
		items = s.count(lo, hi, unit)
		if items > lim.Capacity && lim.Capacity > nonempty {
			// E' = ceil((total + nonempty*(unit-1)) / (Capacity-nonempty)): a row of t units has
			// at most ceil(t*unit/E') < (v+unit-1)/E' + 1 items, so sum < Capacity.
			free := uint64(lim.Capacity - nonempty)
			s.num, s.den, s.limited = (total+uint64(nonempty)*(unit-1)+free-1)/free, 1, true
			items = s.count(lo, hi, unit)
		}
		s.limited = s.limited || items > lim.Capacity // the capacity holds one item per row with keys only
		split = items > nonempty && items <= lim.Capacity
	}
	partial := split || lim.Merge
	if !partial {
		items = rows
	} else if !split {
		items = nonempty
	}
	if items > lim.Capacity {
		return fmt.Errorf("split-kv schedule: %d work items for %d rows (%d with keys) exceed the capacity %d", items, rows, nonempty, lim.Capacity)
	}

	s.work = s.work[:0]
	if !partial {
		s.merge = nil
		for r := range rows {
			s.iters++
			s.work = append(s.work, int32(r), req[r], int32(lo[r]), int32(hi[r]))
			s.maxKeys = max(s.maxKeys, hi[r]-lo[r])
		}
		return nil
	}
	s.mbuf = append(s.mbuf[:0], 0)
	for r := range rows {
		s.iters++
		v := uint64(hi[r] - lo[r])
		n := min(v, 1)
		if split {
			n = uint64(s.n[r])
		}
		t := uint64(ceilDiv32(uint32(v), uint32(unit)))
		base, extra := t/max(n, 1), t%max(n, 1)
		st := lo[r]
		for i := range n {
			s.iters++
			tiles := base
			if i >= n-extra {
				tiles++ // the longer chunks last: the last chunk's partial tile is then in a longer chunk
			}
			e := min(st+int(tiles*unit), hi[r])
			s.work = append(s.work, int32(r), req[r], int32(st), int32(e))
			s.maxKeys = max(s.maxKeys, e-st)
			st = e
		}
		s.mbuf = append(s.mbuf, int32(len(s.work)/4))
	}
	s.merge = s.mbuf
	return nil
}

// pieces is how many chunks a row of v > 0 keys gets: 1 when v <= E, else
// ceil(t*unit / E) for its t = ceil(v/unit) units, so that no chunk of
// whole units is longer than E rounded up to a unit.
func (s *kvSchedule) pieces(v, unit uint64) uint64 {
	// v*den <= num  <=>  v <= E; v, unit < 2^31+1 and den <= 2^31, so no product reaches 2^64.
	if v*s.den <= s.num {
		return 1
	}
	t := uint64(ceilDiv32(uint32(v), uint32(unit)))
	return (t*unit*s.den + s.num - 1) / s.num
}

// ceilDiv32 is ceil(a/b) for a < 2^31, 0 < b < 2^31 (a 32-bit division:
// several times cheaper than a 64-bit one on x86-64).
func ceilDiv32(a, b uint32) uint32 { return (a + b - 1) / b }

// count is the number of items of the split rows; s.n[r] is row r's.
func (s *kvSchedule) count(lo, hi []int, unit uint64) int {
	if cap(s.n) < len(lo) {
		s.n = make([]int32, len(lo))
	}
	s.n = s.n[:len(lo)]
	n := 0
	for r := range lo {
		s.iters++
		k := uint64(0)
		if hi[r] > lo[r] {
			k = s.pieces(uint64(hi[r]-lo[r]), unit)
		}
		s.n[r] = int32(k) // <= t < 2^31
		n += int(k)
	}
	return n
}
