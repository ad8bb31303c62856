package cuda

import (
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/layout"
)

var entryRE = regexp.MustCompile(`(?s)\.visible \.entry (\w+)\((.*?)\)`)

// ptxEntries parses every PTX module into entry name -> parameter types.
func ptxEntries(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for file, ptx := range Modules {
		require.Contains(t, ptx, ".target sm_80", file)
		for _, m := range entryRE.FindAllStringSubmatch(ptx, -1) {
			var types []string
			for _, p := range strings.Split(m[2], ",") {
				if f := strings.Fields(p); len(f) >= 2 {
					types = append(types, f[1])
				}
			}
			out[m[1]] = types
		}
	}
	return out
}

// The launcher's table and the PTX agree on every entry point and its
// argument count, and every argument is 8 bytes: gorgonia.org/cu's Launch
// reads exactly 8 bytes per argument.
func TestKernelArityMatchesPTX(t *testing.T) {
	entries := ptxEntries(t)
	var names []string
	for name := range entries {
		names = append(names, name)
	}
	sort.Strings(names)
	var want []string
	for name := range KernelArity {
		want = append(want, name)
	}
	sort.Strings(want)
	require.Equal(t, want, names, "entry points in the PTX vs KernelArity")
	for _, name := range names {
		assert.Len(t, entries[name], KernelArity[name], name)
		for i, typ := range entries[name] {
			assert.Contains(t, []string{".u64", ".s64", ".f64", ".b64"}, typ, "%s parameter %d", name, i)
		}
	}
}

// The PTX is reproducible: it names no path of the machine that built it.
func TestPTXIsMachineIndependent(t *testing.T) {
	for file, ptx := range Modules {
		for _, bad := range []string{"/work", "/root", "/home", "/tmp", ".file"} {
			assert.NotContains(t, ptx, bad, file)
		}
		assert.NotContains(t, ptx, "cudaMalloc", file) // device code only, no runtime calls
	}
}

// The dtype codes of the Go launcher are those of pkv::Dtype in compat.cuh.
func TestDtypeCodesMatchCompat(t *testing.T) {
	src, err := fs.ReadFile(Sources, "compat.cuh")
	require.NoError(t, err)
	got := map[string]int64{}
	for _, m := range regexp.MustCompile(`\bk(F32|F16|BF16|E4M3|E5M2) = (\d+)`).FindAllStringSubmatch(string(src), -1) {
		v, _ := strconv.ParseInt(m[2], 10, 64)
		got[m[1]] = v
	}
	for name, dt := range map[string]layout.DType{"F32": layout.F32, "F16": layout.F16, "BF16": layout.BF16, "E4M3": layout.E4M3, "E5M2": layout.E5M2} {
		code, err := dtypeCode(dt)
		require.NoError(t, err)
		assert.Equal(t, code, got[name], name)
	}
	_, err = dtypeCode(layout.I8)
	assert.Error(t, err)
}

func TestCopyUnit(t *testing.T) {
	for _, c := range []struct {
		sizes []int64
		want  int
	}{
		{[]int64{256}, 16},             // f16 head_dim 128
		{[]int64{8}, 8},                // f16 head_dim 4
		{[]int64{12}, 4},               // f32 head_dim 3
		{[]int64{6}, 2},                // f16 head_dim 3
		{[]int64{5}, 1},                // fp8 head_dim 5
		{[]int64{1024, 128, 1024}, 16}, // MLA f16: ckv row, kpe row, fused kpe offset
		{[]int64{64, 8, 0}, 8},         // 0 divides everything
	} {
		assert.Equal(t, c.want, copyUnit(c.sizes...), "%v", c.sizes)
	}
}

// Every decode plan fits the device: block size, shared memory and tiling
// for every cache dtype, every head_dim up to 256 and GQA group sizes.
func TestPlanDecodeShapeFitsTheDevice(t *testing.T) {
	for _, dt := range []layout.DType{layout.F32, layout.F16, layout.BF16, layout.E4M3, layout.E5M2} {
		for D := 1; D <= 256; D++ {
			for _, group := range []int{1, 2, 3, 4, 5, 7, 8, 9, 16, 33, 64} {
				g := layout.Paged{DType: dt, HeadDim: D, PageSize: 16, NumKVHeads: 1}
				p, err := planDecodeShape(g, group)
				require.NoError(t, err)
				what := fmt.Sprintf("%v D=%d group=%d", dt, D, group)
				require.Equal(t, 32*p.vec >= D && (p.vec == 1 || 16*p.vec < D), true, "vec %d for %s", p.vec, what)
				require.LessOrEqual(t, 32*p.hpb*p.nz, 256, what)
				require.LessOrEqual(t, p.smem, 48<<10, what)
				require.GreaterOrEqual(t, p.tile, p.nz, what)
				require.Zero(t, p.tile%p.nz, what)
				require.Equal(t, (group+p.hpb-1)/p.hpb, p.gz, what)
				require.Zero(t, (D*dt.Size())%p.unit, what)
				// the scheduler's inputs: an occupancy the registers (64 per
				// thread), threads and shared memory allow, and a least
				// target of whole tiles
				require.GreaterOrEqual(t, p.resident, 1, what)
				require.LessOrEqual(t, p.resident*64*32*p.hpb*p.nz, 65536, what)
				require.LessOrEqual(t, p.resident*(p.smem+1024), 228<<10, what)
				require.Zero(t, p.minChunk%p.tile, what)
				require.GreaterOrEqual(t, p.minChunk, 2*p.tile, what)
			}
		}
	}
	_, err := planDecodeShape(layout.Paged{DType: layout.F16, HeadDim: 257}, 1)
	assert.Error(t, err)
}

// The tuned shapes of docs/kernels.md.
func TestPlanDecodeShapeTable(t *testing.T) {
	for _, c := range []struct {
		dt                            layout.DType
		D, group                      int
		vec, hpb, nz, gz, tile, pitch int
	}{
		{layout.F16, 128, 1, 4, 1, 8, 1, 32, 256},
		{layout.F16, 128, 4, 4, 4, 2, 1, 32, 256},
		{layout.F16, 128, 8, 4, 8, 1, 1, 32, 256},
		{layout.BF16, 64, 8, 2, 8, 1, 1, 32, 128},
		{layout.F16, 256, 2, 8, 2, 4, 1, 16, 512},
		{layout.F32, 256, 16, 8, 8, 1, 2, 8, 1024},
		{layout.E4M3, 128, 4, 4, 4, 2, 1, 32, 128},
	} {
		p, err := planDecodeShape(layout.Paged{DType: c.dt, HeadDim: c.D}, c.group)
		require.NoError(t, err)
		got := [6]int{p.vec, p.hpb, p.nz, p.gz, p.tile, p.pitch}
		assert.Equal(t, [6]int{c.vec, c.hpb, c.nz, c.gz, c.tile, c.pitch}, got, "%v D=%d group=%d: vec hpb nz gz tile pitch", c.dt, c.D, c.group)
	}
}

// Which decode kernel a shape gets, and the tensor-core shapes of
// docs/kernels.md: block (32, warps, 1), keys per stage, shared memory
// within the 48 KiB a launch gets without cuFuncSetAttribute.
func TestPlanDecodeTC(t *testing.T) {
	for _, c := range []struct {
		dt                    layout.DType
		D, group              int
		warps, gz, tile, smem int
	}{
		{layout.F16, 64, 4, 4, 1, 64, 2*2*64*128 + 2*16*128},
		{layout.BF16, 128, 8, 2, 1, 32, 2*2*32*256 + 2*16*256},
		{layout.F16, 256, 2, 1, 1, 16, 2*2*16*512 + 2*16*512},
		{layout.E4M3, 64, 4, 4, 1, 64, 2*2*64*128 + 2*16*128},
		{layout.E4M3, 128, 4, 4, 1, 64, 2*2*64*128 + 2*16*256},
		{layout.E5M2, 256, 17, 2, 2, 32, 2*2*32*256 + 2*16*512},
		{layout.F16, 128, 32, 2, 2, 32, 2*2*32*256 + 2*16*256},
	} {
		p, ok := planDecodeTC(layout.Paged{DType: c.dt, HeadDim: c.D}, c.group)
		require.True(t, ok, "%v D=%d group=%d", c.dt, c.D, c.group)
		assert.Equal(t, fmt.Sprintf("batch_decode_paged_tc_%s_d%d", kvSuffix[c.dt], c.D), p.kernel)
		got := [5]int{p.hpb, p.nz, p.gz, p.tile, p.smem}
		assert.Equal(t, [5]int{c.warps, 1, c.gz, c.tile, c.smem}, got, "%v D=%d group=%d: warps nz gz tile smem", c.dt, c.D, c.group)
		assert.LessOrEqual(t, p.smem, 48<<10)
		assert.Equal(t, 16*p.hpb, p.tile)
		assert.Contains(t, KernelArity, p.kernel)
	}
	// The CUDA-core kernel keeps group 1, f32 caches and other head dims.
	for _, c := range []struct {
		dt       layout.DType
		D, group int
	}{{layout.F16, 128, 1}, {layout.F32, 128, 4}, {layout.F16, 96, 4}, {layout.BF16, 32, 8}, {layout.E4M3, 512, 4}} {
		_, ok := planDecodeTC(layout.Paged{DType: c.dt, HeadDim: c.D}, c.group)
		assert.False(t, ok, "%v D=%d group=%d", c.dt, c.D, c.group)
	}
}
