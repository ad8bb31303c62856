//go:build cgo

package cpuemu

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cuda"
	"github.com/pagedkv/pagedkv/kernels/kernelstest"
	"github.com/pagedkv/pagedkv/layout"
)

// deviceBuf is a test buffer in emulated device memory.
type deviceBuf struct {
	d   *Driver
	ptr cuda.DevicePtr
	n   int
}

func newBuf(t *testing.T, d *Driver, host []byte) deviceBuf {
	t.Helper()
	p, err := d.Alloc(len(host))
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Free(p) })
	require.NoError(t, d.HtoD(p, host))
	return deviceBuf{d, p, len(host)}
}

func (b deviceBuf) bytes(t *testing.T) []byte {
	out := make([]byte, b.n)
	require.NoError(t, b.d.DtoH(out, b.ptr))
	return out
}

func f32Bytes(xs []float32) []byte {
	out := make([]byte, 4*len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
	}
	return out
}

func bytesF32(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func bytesI64(b []byte) []int64 {
	out := make([]int64, len(b)/8)
	for i := range out {
		out[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return out
}

// The warp collectives follow CUDA's definitions, including width < 32
// segments for down and up shuffles.
func TestShimWarpCollectives(t *testing.T) {
	d := NewDriver(0)
	out := newBuf(t, d, make([]byte, 6*32*8))
	require.NoError(t, d.Launch("cuemu_test_shuffles", dim(1, 1, 1), dim(32, 1, 1), 0, []uint64{uint64(out.ptr)}))
	got := bytesI64(out.bytes(t))
	want := make([]int64, 6*32)
	var ballot int64
	for l := 0; l < 32; l += 3 {
		ballot |= 1 << l
	}
	for l := 0; l < 32; l++ {
		v := func(src int) int64 { return int64(100 + src) }
		want[l] = v(31 - l)
		want[32+l] = v(l ^ 5)
		if l%16+3 < 16 { // down within 16-lane segments
			want[64+l] = v(l + 3)
		} else {
			want[64+l] = v(l)
		}
		if l%8 >= 2 { // up within 8-lane segments
			want[96+l] = v(l - 2)
		} else {
			want[96+l] = v(l)
		}
		want[128+l] = ballot
		want[160+l] = 1 + 2
	}
	for row, name := range []string{"shfl", "shfl_xor", "shfl_down w16", "shfl_up w8", "ballot", "all+2*any"} {
		assert.Equal(t, want[32*row:32*row+32], got[32*row:32*row+32], name)
	}
}

// Shared memory, static and dynamic, is per block even though blocks run
// on several workers at once, and barriers order the block's threads.
func TestShimSharedMemoryAndBarriers(t *testing.T) {
	d := NewDriver(0)
	const blocks, n = 64, 96
	in := make([]float32, blocks*n)
	for i := range in {
		in[i] = float32(i % 1000)
	}
	src := newBuf(t, d, f32Bytes(in))
	dst := newBuf(t, d, make([]byte, 4*len(in)))
	require.NoError(t, d.Launch("cuemu_test_reverse", dim(blocks, 1, 1), dim(n, 1, 1), 4*n,
		[]uint64{uint64(src.ptr), uint64(dst.ptr), n}))
	got := bytesF32(dst.bytes(t))
	for b := 0; b < blocks; b++ {
		var total float32
		for i := 0; i < n; i++ {
			total += in[b*n+i]
		}
		for i := 0; i < n; i++ {
			require.Equal(t, in[b*n+n-1-i]+total, got[b*n+i], "block %d thread %d", b, i)
		}
	}
}

// Without the barrier a thread reads shared memory nobody has written yet:
// the shim's 0xFF fill makes that a NaN instead of a plausible stale value.
func TestShimMissingBarrierIsVisible(t *testing.T) {
	d := NewDriver(0)
	const n = 64
	in := make([]float32, n)
	for i := range in {
		in[i] = float32(i)
	}
	src := newBuf(t, d, f32Bytes(in))
	dst := newBuf(t, d, make([]byte, 4*n))
	require.NoError(t, d.Launch("cuemu_test_reverse_unsynced", dim(1, 1, 1), dim(n, 1, 1), 4*n,
		[]uint64{uint64(src.ptr), uint64(dst.ptr), n}))
	got := bytesF32(dst.bytes(t))
	nan := 0
	for _, x := range got {
		if x != x {
			nan++
		}
	}
	assert.Greater(t, nan, n/4, "reads before the writers ran should see the NaN fill: %v", got)
}

// Misuse fails the launch with a message instead of hanging or running on.
func TestShimMisuseFailsTheLaunch(t *testing.T) {
	d := NewDriver(0)
	out := newBuf(t, d, make([]byte, 64*8))
	for mode, want := range []string{
		0: "deadlock in block 0,0,0: 64 live threads, 32 at __syncthreads, 32 at warp barriers",
		1: "warp collective with mask 0x0000ffff",
		2: "collective reached by 16 live lanes of 32",
		3: "__trap() called (block 0,0,0 thread 5,0,0)",
	} {
		err := d.Launch("cuemu_test_misuse", dim(1, 1, 1), dim(64, 1, 1), 0, []uint64{uint64(mode), uint64(out.ptr)})
		require.ErrorIs(t, err, ErrLaunch, "mode %d", mode)
		assert.Contains(t, err.Error(), want, "mode %d", mode)
	}
	// The pool is still usable after failed launches.
	TestShimWarpCollectives(t)
}

// Launches a GPU would refuse are refused.
func TestShimRejectsWhatAGPURejects(t *testing.T) {
	d := NewDriver(0)
	out := newBuf(t, d, make([]byte, 8))
	args := []uint64{uint64(out.ptr)}
	for _, c := range []struct {
		grid, block cuda.Dim3
		smem        int
		args        []uint64
		want        string
	}{
		{dim(1, 1, 1), dim(1025, 1, 1), 0, args, "invalid launch configuration"},
		{dim(1, 1, 1), dim(32, 1, 65), 0, args, "invalid launch configuration"},
		{dim(0, 1, 1), dim(32, 1, 1), 0, args, "invalid launch configuration"},
		{dim(1, 1, 1), dim(32, 1, 1), 48<<10 + 1, args, "exceeds the 49152-byte default limit"},
		{dim(1, 1, 1), dim(32, 1, 1), 0, append(args, 0), "takes 1 arguments, got 2"},
	} {
		err := d.Launch("cuemu_test_shuffles", c.grid, c.block, c.smem, c.args)
		require.ErrorIs(t, err, ErrLaunch)
		assert.Contains(t, err.Error(), c.want)
	}
	err := d.Launch("no_such_kernel", dim(1, 1, 1), dim(32, 1, 1), 0, nil)
	assert.ErrorContains(t, err, "no kernel no_such_kernel")
}

// Every entry point the launcher knows is compiled into the emulator with
// the same argument count.
func TestEveryKernelIsCompiled(t *testing.T) {
	for name, n := range cuda.KernelArity {
		assert.Equal(t, n, Arity(name), name)
	}
}

func TestAllocIsPoisonedAndAligned(t *testing.T) {
	d := NewDriver(0)
	p, err := d.Alloc(100)
	require.NoError(t, err)
	defer d.Free(p)
	assert.Zero(t, uint64(p)%256)
	got := make([]byte, 100)
	require.NoError(t, d.DtoH(got, p))
	assert.Equal(t, strings.Repeat("\xff", 100), string(got))
	_, err = d.Alloc(0)
	assert.Error(t, err)
	var x uint64
	assert.Equal(t, uintptr(8), unsafe.Sizeof(x))
}

// The conformance suites of kernels/kernelstest, run on the emulator.
func TestConformanceAppend(t *testing.T) { kernelstest.TestAppend(t, New(Config{})) }

func TestConformanceMLAAppend(t *testing.T) { kernelstest.TestMLAAppend(t, New(Config{})) }

// The shipped FlashInfer reference cases run on the emulator in
// internal/golden (TestShippedCasesOnEmu), which also checks that append,
// MLA append and decode never fall back to the CPU.

// The emulator validates with the shared validators: a bad page id is
// rejected before anything runs, with the sentinel of package kernels.
func TestEmuValidates(t *testing.T) {
	b := New(Config{})
	assert.Equal(t, "emu", b.Name())
	for name, err := range map[string]error{
		"prefill":      b.BatchPrefill(&kernels.PrefillParams{}),
		"decode":       b.BatchDecode(&kernels.DecodeParams{}),
		"mla decode":   b.MLADecode(&kernels.MLADecodeParams{}),
		"merge_state":  b.MergeState(&kernels.MergeStateParams{}),
		"merge_states": b.MergeStates(&kernels.MergeStatesParams{}),
	} {
		assert.Error(t, err, name)
		assert.NotErrorIs(t, err, kernels.ErrUnsupported, name)
	}
}

func dim(x, y, z int) cuda.Dim3 { return cuda.Dim3{X: x, Y: y, Z: z} }

func TestConformanceDecode(t *testing.T) { kernelstest.TestDecode(t, New(Config{})) }

// The decode suite again with split-k forced into 7-key chunks, so that the
// merge kernel sees every configuration of the suite too.
func TestConformanceDecodeSplitK(t *testing.T) {
	kernelstest.TestDecode(t, New(Config{MaxChunkTokens: 7}))
}

// Prefill runs the decode kernel with one work item per query row; the
// suite runs with the launcher's plan and with split-k forced.
func TestConformancePrefill(t *testing.T) { kernelstest.TestPrefill(t, New(Config{})) }

func TestConformancePrefillSplitK(t *testing.T) {
	kernelstest.TestPrefill(t, New(Config{MaxChunkTokens: 5}))
}

// The NVFP4 suite: the quantising append (bytes equal to the reference
// model's), the dequantising decode (CUDA-core; the tensor-core decode
// takes no NVFP4 cache) and prefill (tiled at head_dim 64 and 128, per-row
// decode at 16 and 32), with the launcher's plan and with split-k forced.
func TestConformanceNVFP4(t *testing.T) { kernelstest.TestNVFP4(t, New(Config{})) }

func TestConformanceNVFP4SplitK(t *testing.T) {
	kernelstest.TestNVFP4(t, New(Config{MaxChunkTokens: 5}))
}

func TestConformanceMLADecode(t *testing.T) { kernelstest.TestMLADecode(t, New(Config{})) }

// The MLA suite again with split-KV forced into 24-key chunks (not a
// multiple of the tensor-core kernel's 16-key tile), so that the 512+64
// cases of 16-bit and fp8 caches run mla_decode_tc_* over partial states
// merged by merge_partial_states.
func TestConformanceMLADecodeSplitKV(t *testing.T) {
	kernelstest.TestMLADecode(t, New(Config{MaxChunkTokens: 24}))
}

func TestConformanceMergeState(t *testing.T) { kernelstest.TestMergeState(t, New(Config{})) }

func TestConformanceMergeStates(t *testing.T) { kernelstest.TestMergeStates(t, New(Config{})) }

// The packed fp8 converts (cvt.rn.f16x2.e4m3x2 and .e5m2x2, sm_89) widen
// the low byte into the low f16 half and the high byte into the high half,
// exactly: every one of the 65536 pairs of each format gives, in each
// half, the f16 encoding of layout's scalar conversion of its byte (any
// NaN for a NaN code, with the code's sign).
func TestShimFP8PairConverts(t *testing.T) {
	d := NewDriver(0)
	out := newBuf(t, d, make([]byte, 2*65536*4))
	require.NoError(t, d.Launch("cuemu_test_fp8_pairs", dim(256, 1, 1), dim(256, 1, 1), 0, []uint64{uint64(out.ptr)}))
	got := out.bytes(t)
	for fi, f := range []struct {
		name   string
		scalar func(uint8) float32
	}{{"e4m3", layout.E4M3ToF32}, {"e5m2", layout.E5M2ToF32}} {
		bad := 0
		for c := range 65536 {
			h2 := binary.LittleEndian.Uint32(got[4*(fi*65536+c):])
			for half, code := range [2]uint8{uint8(c), uint8(c >> 8)} {
				h := uint16(h2 >> (16 * half))
				gotV, want := layout.F16ToF32(h), f.scalar(code)
				same := math.Float32bits(gotV) == math.Float32bits(want) ||
					(gotV != gotV && want != want && h>>15 == uint16(code>>7))
				if !same && bad < 5 {
					t.Errorf("%s pair %#04x half %d (code %#02x): f16 %#04x = %v, scalar %v", f.name, c, half, code, h, gotV, want)
				}
				if !same {
					bad++
				}
			}
		}
		assert.Zero(t, bad, "%s: wrong halves", f.name)
	}
}

// mmaFragments lays out A (16x16, a[row][k]), B (16x8, b[k][col]) and C
// (16x8) as the per-lane registers of mma.m16n8k16 (.row.col, f16 inputs,
// f32 accumulators), written out from the PTX ISA's fragment figures: with
// g = lane/4 and t = lane%4, register r of A holds row g+8*(r%2), columns
// 2t+8*(r/2) (low half) and the next one; register r of B holds rows
// 2t+8r (low half) and 2t+8r+1 of column g; C element i is row g+8*(i/2),
// column 2t+i%2.
// With bf16 the inputs are encoded as bf16 instead of f16.
func mmaFragments(a [16][16]float32, b [16][8]float32, c [16][8]float32, bf16 bool) (af []byte, bf []byte, cf []byte) {
	af, bf, cf = make([]byte, 32*4*4), make([]byte, 32*2*4), make([]byte, 32*4*4)
	narrow := layout.F32ToF16
	if bf16 {
		narrow = layout.F32ToBF16
	}
	pair := func(lo, hi float32) uint32 {
		return uint32(narrow(lo)) | uint32(narrow(hi))<<16
	}
	for lane := range 32 {
		g, t := lane/4, lane%4
		for r := range 4 {
			row, col := g+8*(r%2), 2*t+8*(r/2)
			binary.LittleEndian.PutUint32(af[4*(4*lane+r):], pair(a[row][col], a[row][col+1]))
			binary.LittleEndian.PutUint32(cf[4*(4*lane+r):], math.Float32bits(c[g+8*(r/2)][2*t+r%2]))
		}
		for r := range 2 {
			k := 2*t + 8*r
			binary.LittleEndian.PutUint32(bf[4*(2*lane+r):], pair(b[k][g], b[k+1][g]))
		}
	}
	return af, bf, cf
}

// runMMA runs the shim's mma.m16n8k16 (f16 inputs, or bf16) on one warp
// and returns each lane's four d registers.
func runMMA(t *testing.T, a [16][16]float32, b [16][8]float32, c [16][8]float32, bf16 bool) [32][4]float32 {
	d := NewDriver(0)
	af, bf, cf := mmaFragments(a, b, c, bf16)
	ab, bb, cb := newBuf(t, d, af), newBuf(t, d, bf), newBuf(t, d, cf)
	out := newBuf(t, d, make([]byte, 32*4*4))
	require.NoError(t, d.Launch("cuemu_test_mma", dim(1, 1, 1), dim(32, 1, 1), 0,
		[]uint64{uint64(ab.ptr), uint64(bb.ptr), uint64(cb.ptr), uint64(out.ptr), boolArg(bf16)}))
	raw := out.bytes(t)
	var got [32][4]float32
	for lane := range 32 {
		for i := range 4 {
			got[lane][i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*(4*lane+i):]))
		}
	}
	return got
}

// The mma.m16n8k16 twin, on a hand-computed example: A is the identity,
// B[k][n] = 8k + n and C is 0.5 everywhere, so D[r][n] = 8r + n + 0.5, and
// lane l's d registers are D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]
// (g = l/4, t = l%4). The lanes below are worked out by hand from the
// PTX ISA's figure for the accumulator fragment.
func TestShimMMAFragmentLayout(t *testing.T) {
	var a [16][16]float32
	var b, c [16][8]float32
	for i := range 16 {
		a[i][i] = 1
		for n := range 8 {
			b[i][n] = float32(8*i + n)
			c[i][n] = 0.5
		}
	}
	for _, bf16 := range []bool{false, true} {
		got := runMMA(t, a, b, c, bf16)
		for _, want := range []struct {
			lane int
			d    [4]float32
		}{
			{0, [4]float32{0.5, 1.5, 64.5, 65.5}},      // g=0 t=0: D[0][0], D[0][1], D[8][0], D[8][1]
			{1, [4]float32{2.5, 3.5, 66.5, 67.5}},      // g=0 t=1: D[0][2..3], D[8][2..3]
			{5, [4]float32{10.5, 11.5, 74.5, 75.5}},    // g=1 t=1: D[1][2..3], D[9][2..3]
			{14, [4]float32{28.5, 29.5, 92.5, 93.5}},   // g=3 t=2: D[3][4..5], D[11][4..5]
			{31, [4]float32{62.5, 63.5, 126.5, 127.5}}, // g=7 t=3: D[7][6..7], D[15][6..7]
		} {
			assert.Equal(t, want.d, got[want.lane], "bf16=%v lane %d", bf16, want.lane)
		}
	}
}

// The twin computes D = A*B + C for any inputs (small integers, so the f32
// sums are exact whatever the order), checked at every lane's fragment
// positions against a plain matrix product.
func TestShimMMAMatchesMatrixProduct(t *testing.T) {
	rng := rand.New(rand.NewPCG(27, 1))
	for range 4 {
		var a [16][16]float32
		var b, c [16][8]float32
		for i := range 16 {
			for k := range 16 {
				a[i][k] = float32(rng.IntN(17) - 8)
			}
			for n := range 8 {
				b[i][n] = float32(rng.IntN(17) - 8)
				c[i][n] = float32(rng.IntN(201) - 100)
			}
		}
		got := runMMA(t, a, b, c, false)
		gotBF16 := runMMA(t, a, b, c, true)
		for lane := range 32 {
			g, tt := lane/4, lane%4
			for i := range 4 {
				row, col := g+8*(i/2), 2*tt+i%2
				want := c[row][col]
				for k := range 16 {
					want += a[row][k] * b[k][col]
				}
				require.Equal(t, want, got[lane][i], "lane %d d[%d] = D[%d][%d]", lane, i, row, col)
				require.Equal(t, want, gotBF16[lane][i], "bf16: lane %d d[%d] = D[%d][%d]", lane, i, row, col)
			}
		}
	}
}

func boolArg(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// runLdmatrix stages 32 shared rows of 8 16-bit elements, row s holding
// 8s, 8s+1, ..., 8s+7, lets lane l pass the address of row rows[l] to
// ldmatrix_x4 (or its .trans form) and returns each lane's four registers.
func runLdmatrix(t *testing.T, rows [32]int32, trans bool) [32][4]uint32 {
	d := NewDriver(0)
	src := make([]byte, 32*8*2)
	for e := range 32 * 8 {
		binary.LittleEndian.PutUint16(src[2*e:], uint16(e))
	}
	rb := make([]byte, 32*4)
	for l, r := range rows {
		binary.LittleEndian.PutUint32(rb[4*l:], uint32(r))
	}
	sb, rowb := newBuf(t, d, src), newBuf(t, d, rb)
	out := newBuf(t, d, make([]byte, 32*4*4))
	require.NoError(t, d.Launch("cuemu_test_ldmatrix", dim(1, 1, 1), dim(32, 1, 1), 0,
		[]uint64{uint64(sb.ptr), uint64(rowb.ptr), uint64(out.ptr), boolArg(trans)}))
	raw := out.bytes(t)
	var got [32][4]uint32
	for lane := range 32 {
		for i := range 4 {
			got[lane][i] = binary.LittleEndian.Uint32(raw[4*(4*lane+i):])
		}
	}
	return got
}

// The ldmatrix twins on a hand-computed example: lane l passes row l, so
// matrix i is rows 8i..8i+7 and element (r, c) of matrix i holds
// 64i + 8r + c. Without .trans lane l gets row l/4 of each matrix,
// columns 2(l%4) and 2(l%4)+1; with .trans it gets column l/4, rows
// 2(l%4) and 2(l%4)+1 (PTX ISA, ldmatrix's fragment figures).
func TestShimLdmatrixFragmentLayout(t *testing.T) {
	var identity [32]int32
	for l := range identity {
		identity[l] = int32(l)
	}
	pair := func(lo, hi uint32) uint32 { return lo | hi<<16 }
	plain, trans := runLdmatrix(t, identity, false), runLdmatrix(t, identity, true)
	for _, want := range []struct {
		lane         int
		plain, trans [4]uint32
	}{
		// lane 0 (g=0, t=0): row 0 cols 0,1 / col 0 rows 0,1 of each matrix.
		{0, [4]uint32{pair(0, 1), pair(64, 65), pair(128, 129), pair(192, 193)},
			[4]uint32{pair(0, 8), pair(64, 72), pair(128, 136), pair(192, 200)}},
		// lane 5 (g=1, t=1): row 1 cols 2,3 / col 1 rows 2,3.
		{5, [4]uint32{pair(10, 11), pair(74, 75), pair(138, 139), pair(202, 203)},
			[4]uint32{pair(17, 25), pair(81, 89), pair(145, 153), pair(209, 217)}},
		// lane 31 (g=7, t=3): row 7 cols 6,7 / col 7 rows 6,7.
		{31, [4]uint32{pair(62, 63), pair(126, 127), pair(190, 191), pair(254, 255)},
			[4]uint32{pair(55, 63), pair(119, 127), pair(183, 191), pair(247, 255)}},
	} {
		assert.Equal(t, want.plain, plain[want.lane], "lane %d", want.lane)
		assert.Equal(t, want.trans, trans[want.lane], ".trans lane %d", want.lane)
	}
}

// The twins read each row from the address its lane passed, not from a
// row index: a shuffled assignment of rows to lanes, checked at every
// lane against the rule.
func TestShimLdmatrixFollowsAddresses(t *testing.T) {
	var rows [32]int32
	for l := range rows {
		rows[l] = int32((l*13 + 7) % 32)
	}
	plain, trans := runLdmatrix(t, rows, false), runLdmatrix(t, rows, true)
	at := func(row int32, c int) uint32 { return uint32(8*row) + uint32(c) }
	for lane := range 32 {
		g, tt := lane/4, lane%4
		for i := range 4 {
			require.Equal(t, at(rows[8*i+g], 2*tt)|at(rows[8*i+g], 2*tt+1)<<16, plain[lane][i], "lane %d r[%d]", lane, i)
			require.Equal(t, at(rows[8*i+2*tt], g)|at(rows[8*i+2*tt+1], g)<<16, trans[lane][i], ".trans lane %d r[%d]", lane, i)
		}
	}
}
