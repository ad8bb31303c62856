//go:build cgo

package cpuemu

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/kernels/kernelstest"
	"github.com/pagedkv/pagedkv/layout"
)

// The cp.async twin keeps a copy in flight until cp_async_wait retires its
// group and its thread reaches a barrier: wait_group n retires every
// committed group but the n most recent, an uncommitted copy stays in
// flight, and until it lands the destination reads as NaN. Threads run
// first to last in even blocks and last to first in odd ones: a thread
// reading another's plain store without a barrier reads NaN when the
// writer runs after it.
func TestShimCPAsyncLandsAtTheWait(t *testing.T) {
	d := NewDriver(0)
	const blocks = 2
	src := make([]float32, blocks*64*16)
	for i := range src {
		src[i] = float32(i)
	}
	in := newBuf(t, d, f32Bytes(src))
	out := newBuf(t, d, make([]byte, 4*blocks*64*26))
	require.NoError(t, d.Launch("cuemu_test_cp_async", dim(blocks, 1, 1), dim(64, 1, 1), 4*(64*16+64),
		[]uint64{uint64(in.ptr), uint64(out.ptr)}))
	got := bytesF32(out.bytes(t))
	nan := float32(math.NaN())
	for b := 0; b < blocks; b++ {
		for th := 0; th < 64; th++ {
			base := float32((64*b + th) * 16) // the first float of the thread's source rows: base + 4s
			r := []float32{base, base + 4, base + 8, base + 12}
			want := []float32{
				nan, nan, nan, nan, // no wait: nothing has landed
				r[0], nan, nan, nan, // wait<2>: group 0
				r[0], r[1], nan, nan, // wait<1>: groups 0 and 1
				r[0], r[1], r[2], nan, // wait<0>: every committed group, not the open one
				r[0], r[1], r[2], nan, // commit, wait<0>, no barrier yet
				r[0], r[1], r[2], r[3], // barrier
			}
			if ran := th < 32 != (b%2 == 0); ran { // thread 63-th ran before th
				want = append(want, float32(63-th))
			} else {
				want = append(want, nan)
			}
			want = append(want, float32(63-th))
			o := got[(64*b+th)*26:]
			require.Equal(t, bitsOfF32(want), bitsOfF32(o[:26]), "block %d thread %d", b, th)
		}
	}
}

// bitsOfF32 makes NaNs comparable: every NaN is one value.
func bitsOfF32(xs []float32) []uint32 {
	out := make([]uint32, len(xs))
	for i, x := range xs {
		out[i] = math.Float32bits(x)
		if x != x {
			out[i] = 0x7fc00000
		}
	}
	return out
}

// The testing switches reject what they cannot apply.
func TestShimSwitchesRejectBadValues(t *testing.T) {
	for _, site := range []string{"decode.cu", "decode.cu:0", ":12", "a/decode.cu:12", "decode.cu:12x"} {
		assert.ErrorContains(t, dropSync(site), "want file.cu:line", site)
	}
	assert.ErrorContains(t, setMMA("fast"), "mma mode fast: want exact or tc")
	require.NoError(t, dropSync(""))
	require.NoError(t, setMMA("exact"))
}

// mutantCases are the small attention cases a dropped sync of each kernel
// file must fail: the CUDA-core decode (several tiles, so both waits run),
// the tensor-core decode, the tiled prefill (each also with NVFP4 caches,
// whose tiles load through their own code), the split-k merge and the MLA
// tensor-core decode.
var mutantCases = map[string]func(t *testing.T){
	"decode.cu": func(t *testing.T) {
		kernelstest.RunDecodeShape(t, New(Config{}), mutantShape(1, 16))
		kernelstest.RunNVFP4Decode(t, New(Config{}), 4) // the NVFP4 tile loads
	},
	"decode_tc.cu": func(t *testing.T) {
		kernelstest.RunDecodeShape(t, New(Config{}), mutantShape(4, 16))
	},
	"prefill.cu": func(t *testing.T) {
		kernelstest.RunPrefillShape(t, New(Config{}), mutantShape(2, 16))
		kernelstest.RunNVFP4Prefill(t, New(Config{}), 4) // the NVFP4 tile loads
	},
	"merge.cu": func(t *testing.T) {
		kernelstest.TestMergeState(t, New(Config{}))
	},
	"mla_tc.cu": func(t *testing.T) {
		kernelstest.TestMLADecode(t, New(Config{}))
	},
}

func mutantShape(group, pageSize int) kernelstest.AttnShape {
	return kernelstest.AttnShape{
		Geometry: layout.Paged{Layout: layout.NHD, Form: layout.Split, DType: layout.F16, PageSize: pageSize,
			NumKVHeads: 1, HeadDim: 64},
		Group: group, Lens: []int{130, 1, 70}, QDType: layout.F16, ODType: layout.F32, WindowLeft: -1, Seed: 7,
	}
}

// TestSyncMutantChild is the child process of TestEveryDroppedSyncFails:
// it runs the case PKV_SYNC_MUTANT names, under the CUEMU_DROP_SYNC its
// parent set.
func TestSyncMutantChild(t *testing.T) {
	name := os.Getenv("PKV_SYNC_MUTANT")
	if name == "" {
		t.Skip("the child process of TestEveryDroppedSyncFails")
	}
	mutantCases[name](t)
}

// Deleting any one __syncthreads, cp_async_wait or cp_async_commit call of
// the attention kernels (CUEMU_DROP_SYNC, in a child process) makes the
// conformance check of a small case of that kernel fail, but for the sites
// uncaught explains. The sites are every such call in the code (not the
// comments) of the files mutantCases covers, so a new one is examined too.
func TestEveryDroppedSyncFails(t *testing.T) {
	var sites []string
	for file := range mutantCases {
		src, err := os.ReadFile("../../kernels/cuda/" + file)
		require.NoError(t, err)
		for i, l := range strings.Split(string(src), "\n") {
			code, _, _ := strings.Cut(l, "//")
			for _, call := range []string{"__syncthreads()", "cp_async_wait<", "cp_async_commit()"} {
				if strings.Contains(code, call) {
					sites = append(sites, fmt.Sprintf("%s:%d %s", file, i+1, strings.TrimRight(call, "(<)")))
				}
			}
		}
	}
	slices.Sort(sites)
	require.Greater(t, len(sites), 20)
	for i, s := range sites {
		if raceEnabled && i%10 != 0 {
			continue // the race detector slows each child tenfold: a tenth of the sites
		}
		site, kind, _ := strings.Cut(s, " ")
		file, _, _ := strings.Cut(site, ":")
		cmd := exec.Command(os.Args[0], "-test.run", "^TestSyncMutantChild$", "-test.count=1", "-test.short")
		cmd.Env = append(os.Environ(), "CUEMU_DROP_SYNC="+site, "PKV_SYNC_MUTANT="+file)
		out, err := cmd.CombinedOutput()
		if err == nil {
			if why := uncaught(t, site); why != "" {
				t.Logf("%s %s dropped: passes (%s)", site, kind, why)
			} else {
				t.Errorf("%s %s dropped: the %s case still passes", site, kind, file)
			}
			continue
		}
		msg := string(out)
		assert.True(t, strings.Contains(msg, "values outside") || strings.Contains(msg, "cpuemu: launch failed"),
			"%s %s dropped: the child failed for another reason:\n%s", site, kind, msg)
		t.Logf("%s %s dropped: %s", site, kind, firstFailure(msg))
	}
}

// firstFailure is the first line of a failed child's output that says
// what failed.
func firstFailure(out string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "values outside") || strings.Contains(l, "launch failed") {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// uncaught says why dropping the sync at site ("file.cu:line") may leave
// the cases passing, or "" when it must not: the drain of an empty
// pipeline (a cp_async_wait<0> with no cp_async_16 after it in its file,
// and a __syncthreads right after one, which the loop's last barrier
// already covers), the empty-group commit of a two-stage prologue, and two
// syncs the cases do not reach the hazard of.
func uncaught(t *testing.T, site string) string {
	file, line, _ := strings.Cut(site, ":")
	src, err := os.ReadFile("../../kernels/cuda/" + file)
	require.NoError(t, err)
	lines := strings.Split(string(src), "\n")
	n, err := strconv.Atoi(line)
	require.NoError(t, err)
	require.LessOrEqual(t, n, len(lines))
	code := strings.TrimSpace(lines[n-1])
	drain := func(i int) bool {
		return strings.HasPrefix(strings.TrimSpace(lines[i]), "cp_async_wait<0>();") &&
			!strings.Contains(strings.Join(lines[i+1:], "\n"), "cp_async_16(")
	}
	switch {
	case drain(n - 1):
		return "the drain after the pipeline: only empty groups remain"
	case strings.HasPrefix(code, "__syncthreads();") && n >= 2 && drain(n-2):
		return "the barrier after the drain: the loop's last barrier already separates its reads from what follows"
	case code == "cp_async_commit();" && strings.Contains(string(src), "constexpr int kStages = 2;") &&
		strings.Contains(strings.Join(lines[max(0, n-10):n], "\n"), "s < kStages - 1; s++"):
		return "the prologue's empty group: with two stages it is committed only for a range with no tile"
	case strings.Contains(code, "may alias them"):
		return "the suites never merge in place, the hazard this barrier guards"
	case strings.Contains(code, "the previous pass is done with shared memory"):
		return "the case takes one pass"
	}
	return ""
}

// CUEMU_MMA=tc truncates where the in-order f32 sum rounds: with
// D[0][0] = 1*1 + (3*2^-12)*(2^-12) = 1 + 1.5 ulp(1), the exact mode rounds
// the tie to even (1 + 2 ulp) and the tensor-core model truncates the
// aligned addend (1 + 1 ulp).
func TestShimMMATensorCoreSums(t *testing.T) {
	var a [16][16]float32
	var b [16][8]float32
	var c [16][8]float32
	a[0][0], b[0][0] = 1, 1
	a[0][1], b[1][0] = 3.0/4096, 1.0/4096
	ulp := math.Nextafter32(1, 2) - 1
	assert.Equal(t, 1+2*ulp, runMMA(t, a, b, c, false)[0][0])
	require.NoError(t, setMMA("tc"))
	defer func() { require.NoError(t, setMMA("exact")) }()
	assert.Equal(t, 1+ulp, runMMA(t, a, b, c, false)[0][0])
	assert.Equal(t, 1+ulp, runMMA(t, a, b, c, true)[0][0]) // 3*2^-12 and 2^-12 are bf16 values too
}

// The tolerances of the conformance suites hold when the tensor-core
// kernels' mma sums as a tensor core may (CUEMU_MMA=tc): the decode (its
// random cases include groups the tensor-core decode serves), the tiled
// prefill and the MLA decode. Under the race detector, two shapes.
func TestConformanceWithTensorCoreSums(t *testing.T) {
	require.NoError(t, setMMA("tc"))
	defer func() { require.NoError(t, setMMA("exact")) }()
	if raceEnabled {
		kernelstest.RunDecodeShape(t, New(Config{}), mutantShape(4, 16))
		kernelstest.RunPrefillShape(t, New(Config{}), mutantShape(2, 16))
		return
	}
	t.Run("decode", func(t *testing.T) { kernelstest.TestDecode(t, New(Config{})) })
	t.Run("prefill", func(t *testing.T) { kernelstest.TestPrefill(t, New(Config{})) })
	t.Run("mla", func(t *testing.T) { kernelstest.TestMLADecode(t, New(Config{})) })
}
