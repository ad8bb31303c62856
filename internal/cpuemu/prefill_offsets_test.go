//go:build cgo

package cpuemu

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// The tiled prefill's page lookup divides a key position by page_size
// with a multiply and a shift (PageDiv, the kernel's own code through
// the emulator-only entry cuemu_test_page_div). Against Go's division for
// edge and random page sizes up to and past 2^31, and edge and random
// positions below 2^31 (the kernel's positions are int32): the
// multiples of page_size and their neighbours, and 2^31 - 1.
func TestPrefillPageDiv(t *testing.T) {
	d := NewDriver(0)
	rng := rand.New(rand.NewPCG(27, 4))
	sizes := []int64{1, 2, 3, 5, 7, 15, 16, 17, 31, 32, 33, 100, 255, 256, 257, 4095, 1<<16 - 1, 1 << 16,
		1<<16 + 1, 1<<30 + 3, 1<<31 - 1, 1 << 31, 1<<31 + 1, 1<<32 + 5, 1 << 40}
	for range 40 {
		sizes = append(sizes, 1+rng.Int64N(int64(1)<<(1+rng.IntN(31))))
	}
	const top = int64(1)<<31 - 1
	for _, ps := range sizes {
		var ts []uint32
		add := func(x int64) {
			if x >= 0 && x <= top {
				ts = append(ts, uint32(x))
			}
		}
		for _, x := range []int64{0, 1, ps - 1, ps, ps + 1, 2*ps - 1, 2 * ps, top, top / ps * ps, top/ps*ps - 1} {
			add(x)
		}
		for range 500 {
			k := rng.Int64N(top/ps + 1)
			add(k*ps - 1)
			add(k * ps)
			add(k*ps + 1)
			add(rng.Int64N(top + 1))
		}
		in := make([]byte, 4*len(ts))
		for i, x := range ts {
			binary.LittleEndian.PutUint32(in[4*i:], x)
		}
		tb := newBuf(t, d, in)
		qb := newBuf(t, d, make([]byte, len(in)))
		require.NoError(t, d.Launch("cuemu_test_page_div", dim(1, 1, 1), dim(1, 1, 1), 0,
			[]uint64{uint64(ps), uint64(tb.ptr), uint64(len(ts)), uint64(qb.ptr)}))
		for i, q := range bytesU32(qb.bytes(t)) {
			require.Equal(t, uint32(int64(ts[i])/ps), q, "page_size %d, t %d", ps, ts[i])
		}
	}
}

// The tiled prefill's shared-memory offsets, as the kernel's own offset
// functions compute them (cuemu_test_prefill_offsets): every ldmatrix of
// Q, K and V addresses the rows and 16-byte chunks of its fragment under
// the swizzle (chunk c of row r at chunk c ^ (r % 8)), as the slow
// formula below computes them; every one of them and every cp.async
// write phase takes one wavefront per 128 bytes; and the copy's writes
// cover each 16-byte chunk of the K/V tile exactly once.
func TestPrefillSharedOffsets(t *testing.T) {
	d := NewDriver(0)
	swz := func(rowBytes, r, col uint32) uint32 {
		mask := min(rowBytes/16, 8) - 1
		return r*rowBytes + ((((col >> 4) ^ (r & mask)) << 4) | (col & 15))
	}
	for _, kind := range []int{0, 1} {
		for _, D := range []int{64, 128, 256} {
			esize := 2 - kind
			kvRow, qRow := uint32(D*esize), uint32(2*D)
			keys := 32
			if D == 256 {
				keys = 16
			}
			out := newBuf(t, d, make([]byte, 4<<16))
			require.NoError(t, d.Launch("cuemu_test_prefill_offsets", dim(1, 1, 1), dim(1, 1, 1), 0,
				[]uint64{uint64(kind), uint64(D), uint64(out.ptr)}))
			words := bytesU32(out.bytes(t))
			n := map[uint32]int{}
			copied := map[uint32]int{}
			for i := 0; words[i] != 0xffffffff; i += 35 {
				what, a, b, offs := words[i], words[i+1], words[i+2], words[i+3:i+35]
				n[what]++
				require.Equal(t, 4, wavefronts(16, offs), "kind %d D=%d what %d (%d, %d) offsets %v", kind, D, what, a, b, offs)
				for l, o := range offs {
					lu := uint32(l)
					var want uint32
					switch what {
					case 0:
						want = swz(qRow, (lu&7)+8*((lu>>3)&1), 16*(2*a+(lu>>4)))
					case 1:
						want = swz(kvRow, 16*b+(lu&7)+8*(lu>>4), 16*(2*a+((lu>>3)&1)))
					case 2:
						want = swz(kvRow, 16*b+(lu&7)+8*((lu>>3)&1), 16*(2*a+(lu>>4)))
					case 3:
						copied[o]++
						continue
					default:
						t.Fatalf("kind %d D=%d: record kind %d", kind, D, what)
					}
					require.Equal(t, want, o, "kind %d D=%d what %d (%d, %d) lane %d", kind, D, what, a, b, l)
				}
			}
			if kind == 0 {
				require.Equal(t, D/16, n[0], "kind %d D=%d Q records", kind, D)
				require.Equal(t, D/16*keys/16, n[1], "kind %d D=%d K records", kind, D)
				require.Equal(t, D/16*keys/16, n[2], "kind %d D=%d V records", kind, D)
			}
			require.Len(t, copied, keys*int(kvRow)/16, "kind %d D=%d: chunks copied", kind, D)
			for o, c := range copied {
				require.Equal(t, 1, c, "kind %d D=%d: chunk at %d copied %d times", kind, D, o, c)
				require.Zero(t, o%16, "kind %d D=%d: chunk at %d", kind, D, o)
				require.Less(t, o, uint32(keys)*kvRow, "kind %d D=%d: chunk at %d", kind, D, o)
			}
		}
	}
}
