//go:build cgo

package cpuemu

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/kernels/cuda"
	"github.com/pagedkv/pagedkv/kernels/kernelstest"
	"github.com/pagedkv/pagedkv/layout"
)

// launchedAttention returns the attention kernels (decode entries) among
// the launches d recorded since the last call.
func launchedAttention(d *cuda.CountingDriver) []string {
	var names []string
	for _, l := range d.Launches() {
		if strings.HasPrefix(l.Kernel, "batch_decode_paged_") {
			names = append(names, l.Kernel)
		}
	}
	return names
}

// The tensor-core decode against the reference model on every shape it
// serves (f16, bf16, e4m3, e5m2 caches; head_dim 64, 128, 256; GQA groups
// 2, 4, 8, and 17 at head_dim 64, which takes two blocks of 16 query
// heads), with NHD and
// HND, fused and split caches, page sizes 1, 16 and 5, f32/f16/bf16 q and
// o, windows, soft caps, and split-k on and off; and which kernel each
// shape launched: the tensor-core entry for those, the CUDA-core kernel
// for group 1, for f32 caches, for other head dims and for prefill.
func TestTCDecodeShapes(t *testing.T) {
	plain := &cuda.CountingDriver{Driver: NewDriver(0), Record: true}
	split := &cuda.CountingDriver{Driver: NewDriver(0), Record: true}
	drivers := []*cuda.CountingDriver{plain, split}
	backends := []*cuda.Backend{
		cuda.NewWithDriver("emu", plain, cuda.Config{}),
		cuda.NewWithDriver("emu", split, cuda.Config{MaxChunkTokens: 48}),
	}
	acts := []layout.DType{layout.F16, layout.BF16, layout.F32}
	shape := func(i int, dt layout.DType, D, group int) kernelstest.AttnShape {
		s := kernelstest.AttnShape{
			Geometry: layout.Paged{Layout: []layout.KVLayout{layout.NHD, layout.HND}[i%2],
				Form: []layout.TensorForm{layout.Fused, layout.Split}[i/2%2], DType: dt,
				PageSize: []int{1, 16, 5}[i%3], NumKVHeads: 1 + b2i(i%7 == 0), HeadDim: D},
			Group: group, Lens: []int{1, 0, 90}, QDType: acts[i%3], ODType: acts[i/3%3],
			WindowLeft: -1, Seed: uint64(i),
		}
		if i%4 == 1 {
			s.WindowLeft = 40
		}
		if i%5 == 2 {
			s.SoftCap = 30
		}
		return s
	}
	i := 0
	for _, dt := range []layout.DType{layout.F16, layout.BF16, layout.E4M3, layout.E5M2} {
		for _, D := range []int{64, 128, 256} {
			for _, group := range []int{1, 2, 4, 8, 17} {
				if group == 17 && D != 64 {
					continue // two blocks of 16 query heads: once per dtype
				}
				s := shape(i, dt, D, group)
				k := i % 2
				kernelstest.RunDecodeShape(t, backends[k], s)
				want := fmt.Sprintf("batch_decode_paged_tc_%s_d%d", suffix(dt), D)
				if group == 1 {
					want = fmt.Sprintf("batch_decode_paged_%s_v%d", suffix(dt), D/32)
				}
				require.Equal(t, []string{want}, launchedAttention(drivers[k]), "%v split=%v", s, k == 1)
				i++
			}
		}
	}
	// Shapes the tensor-core decode does not serve keep the CUDA-core kernel.
	for _, c := range []struct {
		dt     layout.DType
		D, vec int
	}{{layout.F32, 128, 4}, {layout.F16, 96, 4}, {layout.F16, 32, 1}, {layout.E4M3, 16, 1}} {
		s := shape(i, c.dt, c.D, 4)
		kernelstest.RunDecodeShape(t, backends[0], s)
		require.Equal(t, []string{fmt.Sprintf("batch_decode_paged_%s_v%d", suffix(c.dt), c.vec)}, launchedAttention(plain), "%v", s)
		i++
	}
	// Prefill stays on the CUDA-core kernel (one work item per query row).
	s := shape(i, layout.F16, 128, 4)
	kernelstest.RunPrefillShape(t, backends[0], s)
	for _, name := range launchedAttention(plain) {
		require.Equal(t, "batch_decode_paged_f16_v4", name, "prefill %v", s)
	}
}

func suffix(dt layout.DType) string {
	return map[layout.DType]string{layout.F32: "f32", layout.F16: "f16", layout.BF16: "bf16", layout.E4M3: "e4m3", layout.E5M2: "e5m2"}[dt]
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// wavefronts is how many shared-memory wavefronts one warp-wide access of
// width bytes per lane at offs takes: the lanes go in phases of 128 bytes
// (32 lanes of 4 bytes, 16 of 8, 8 of 16: an ldmatrix phase is 8 rows of
// 16 bytes), and a phase takes as many wavefronts as the most distinct
// 4-byte words any of the 32 banks holds among its accesses.
func wavefronts(width int, offs []uint32) int {
	lanes := 128 / width
	total := 0
	for p := 0; p < 32; p += lanes {
		words := map[uint32]bool{}
		for _, o := range offs[p : p+lanes] {
			for w := uint32(0); w < uint32(width/4); w++ {
				words[o/4+w] = true
			}
		}
		perBank := map[uint32]int{}
		most := 0
		for w := range words {
			perBank[w%32]++
			most = max(most, perBank[w%32])
		}
		total += most
	}
	return total
}

// The swizzled layout of the tensor-core decode is free of bank conflicts:
// every shared-memory access the kernel makes (the ldmatrix phases of Q, K
// and V, the fp8 K and V loads, the cp.async writes), as the kernel's own
// offset functions compute them, takes the minimum of one wavefront per
// 128 bytes. The same rows without the swizzle would not.
func TestTCDecodeSharedBanks(t *testing.T) {
	d := NewDriver(0)
	// The counter itself: 8 rows of 256 bytes at one chunk are 8-way
	// conflicted, 8 consecutive chunks are not.
	var rows, chunks []uint32
	for l := uint32(0); l < 32; l++ {
		rows = append(rows, 256*(l%8)+512*(l/8))
		chunks = append(chunks, 16*l)
	}
	require.Equal(t, 4*8, wavefronts(16, rows))
	require.Equal(t, 4, wavefronts(16, chunks))
	for _, kind := range []int{0, 1} {
		for _, D := range []int{64, 128, 256} {
			out := newBuf(t, d, make([]byte, 4<<16))
			require.NoError(t, d.Launch("cuemu_test_tc_offsets", dim(1, 1, 1), dim(1, 1, 1), 0,
				[]uint64{uint64(kind), uint64(D), uint64(out.ptr)}))
			words := bytesU32(out.bytes(t))
			n := 0
			for i := 0; words[i] != 0; i += 33 {
				width := int(words[i])
				offs := words[i+1 : i+33]
				require.Equal(t, 32*width/128, wavefronts(width, offs), "kind %d D=%d access %d (width %d) offsets %v", kind, D, n, width, offs)
				n++
			}
			require.Greater(t, n, D/16, "kind %d D=%d: accesses listed", kind, D)
		}
	}
}

func bytesU32(b []byte) []uint32 {
	out := make([]uint32, len(b)/4)
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return out
}

// A tensor-core decode entry refuses to run with a shape its launcher did
// not plan (block, head_dim, tile, copy unit): it traps before touching
// memory, and the launch fails.
func TestTCDecodeTrapsOnAForeignShape(t *testing.T) {
	d := NewDriver(0)
	args := func(headDim, tile, unit uint64) []uint64 {
		a := make([]uint64, cuda.KernelArity["batch_decode_paged_tc_f16_d128"])
		a[13], a[24], a[25] = headDim, tile, unit // head_dim, tile, copy_unit (decode_args.cuh)
		return a
	}
	const k = "batch_decode_paged_tc_f16_d128" // block (32, 2, 1), 32 keys a stage
	for _, c := range []struct {
		name  string
		block cuda.Dim3
		args  []uint64
	}{
		{"block (64, 1, 1)", dim(64, 1, 1), args(128, 32, 16)},
		{"block (32, 4, 1)", dim(32, 4, 1), args(128, 32, 16)},
		{"head_dim 64", dim(32, 2, 1), args(64, 32, 16)},
		{"tile 64", dim(32, 2, 1), args(128, 64, 16)},
		{"copy unit 8", dim(32, 2, 1), args(128, 32, 8)},
	} {
		err := d.Launch(k, dim(1, 1, 1), c.block, 48<<10, c.args)
		require.ErrorIs(t, err, ErrLaunch, c.name)
		require.ErrorContains(t, err, "__trap", c.name)
	}
}

// The tensor-core decode's shared-memory offsets, as the kernel's own
// offset functions compute them (cuemu_test_tc_offsets, which steps
// k-steps, n-tiles and copy chunks by swz_xor from the step-0 offset),
// equal the swizzle's slow formula (chunk c of row r at r*pitch + 16*(c ^
// (r % 8))) for every lane, record by record, and the copy's writes cover
// each 16-byte chunk of a K/V tile exactly once.
func TestTCDecodeSharedOffsets(t *testing.T) {
	d := NewDriver(0)
	for _, kind := range []int{0, 1} {
		for _, D := range []int{64, 128, 256} {
			fp8 := kind == 1
			rowBytes := uint32(D * (2 - kind))
			pitch := max(rowBytes, 128)
			keys := min(16384/(2*pitch), 64)
			chunks := rowBytes / 16
			w := uint32(min(D/8, 16))
			swz := func(r, c, pitch uint32) uint32 { return r*pitch + (c^(r&7))<<4 }
			// want lists the records in the order offsets() writes them.
			var want [][32]uint32
			rec := func(f func(l uint32) uint32) {
				var r [32]uint32
				for l := range uint32(32) {
					r[l] = f(l)
				}
				want = append(want, r)
			}
			for kk := range uint32(D / 16) {
				rec(func(l uint32) uint32 { return swz((l&7)+8*(l>>3&1), 2*kk+(l>>4), uint32(2*D)) })
			}
			for key0 := uint32(0); key0 < 32; key0 += 16 {
				for kk := range uint32(D / 16) {
					if fp8 {
						for half := range uint32(2) {
							rec(func(l uint32) uint32 { return swz(key0+8*half+(l>>2), kk, pitch) + 4*(l&3) })
						}
					} else {
						rec(func(l uint32) uint32 { return swz(key0+(l&7)+8*(l>>4), 2*kk+(l>>3&1), pitch) })
					}
				}
				if fp8 {
					for seg := range uint32(D) / 8 / w {
						for i := range uint32(4) {
							rec(func(l uint32) uint32 {
								x := 128*seg + w*(l>>2)
								return swz(key0+2*(l&3)+(i&1)+8*(i>>1), x>>4, pitch) + x&15
							})
						}
					}
				} else {
					for jj := range uint32(D / 16) {
						rec(func(l uint32) uint32 { return swz(key0+(l&7)+8*(l>>3&1), 2*jj+(l>>4), pitch) })
					}
				}
			}
			firstCopy := len(want)
			for wp := range keys / 16 {
				for k := range chunks / 2 {
					rec(func(l uint32) uint32 { tid := 32*wp + l; return swz(tid%keys, tid/keys+2*k, pitch) })
				}
			}
			out := newBuf(t, d, make([]byte, 4<<16))
			require.NoError(t, d.Launch("cuemu_test_tc_offsets", dim(1, 1, 1), dim(1, 1, 1), 0,
				[]uint64{uint64(kind), uint64(D), uint64(out.ptr)}))
			words := bytesU32(out.bytes(t))
			copied := map[uint32]int{}
			n := 0
			for i := 0; words[i] != 0; i += 33 {
				require.Less(t, n, len(want), "kind %d D=%d: more records than the model", kind, D)
				require.Equal(t, want[n][:], words[i+1:i+33], "kind %d D=%d record %d", kind, D, n)
				if n >= firstCopy {
					for _, o := range words[i+1 : i+33] {
						copied[o]++
					}
				}
				n++
			}
			require.Equal(t, len(want), n, "kind %d D=%d records", kind, D)
			// Every chunk of the tile's rows (kKeys rows, the row's chunks
			// at pitch spacing) is written once.
			require.Len(t, copied, int(keys*chunks), "kind %d D=%d: chunks copied", kind, D)
			for o, c := range copied {
				require.Equal(t, 1, c, "kind %d D=%d: chunk at %d copied %d times", kind, D, o, c)
				require.Zero(t, o%16, "kind %d D=%d: chunk at %d", kind, D, o)
				require.Less(t, o, keys*pitch, "kind %d D=%d: chunk at %d", kind, D, o)
			}
		}
	}
}
