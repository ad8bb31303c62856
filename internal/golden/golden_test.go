package golden

import (
	"encoding/binary"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/safetensors"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
)

// shippedDir holds the project's copy of the reference cases.
const shippedDir = "../../testdata/golden"

func shippedCases(t *testing.T) []*Case {
	t.Helper()
	paths, err := Find(shippedDir)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(paths), 57, "the shipped cases are missing from %s", shippedDir)
	cases := make([]*Case, len(paths))
	for i, p := range paths {
		cases[i], err = Load(p)
		require.NoError(t, err)
	}
	return cases
}

// runAll runs every case on r and fails the test with the report lines of
// the failures.
func runAll(t *testing.T, r *Runner, cases []*Case) []*Result {
	t.Helper()
	var results []*Result
	var failures []string
	for _, c := range cases {
		res := r.Run(c)
		results = append(results, res)
		if !res.Passed() {
			failures = append(failures, res.String())
			failures = append(failures, res.Details()...)
		}
	}
	require.Empty(t, failures, "failed cases:\n%s", strings.Join(failures, "\n"))
	return results
}

func TestShippedCasesOnCPU(t *testing.T) {
	cases := shippedCases(t)
	results := runAll(t, &Runner{Backend: cpu.New(cpu.Config{})}, cases)
	// Every op of FORMAT.md is covered by a shipped case, and every case ran
	// on the backend it names.
	covered := map[string]bool{}
	for _, r := range results {
		covered[r.Op] = true
		if ops[r.Op].backend {
			assert.Equal(t, "cpu", r.Backend, r.Name)
			assert.False(t, r.Fallback, r.Name)
		} else {
			assert.Equal(t, "", r.Backend, r.Name)
		}
	}
	for _, op := range Ops() {
		assert.True(t, covered[op], "no shipped case for op %s", op)
	}
	assert.Len(t, Ops(), 17, "FORMAT.md defines 17 operations")
}

// Running a case leaves it untouched (the appends write into copies), so a
// second run gives the same result.
func TestRunDoesNotModifyTheCase(t *testing.T) {
	r := &Runner{Backend: cpu.New(cpu.Config{})}
	for _, c := range shippedCases(t) {
		before := map[string]string{}
		for _, tn := range c.Tensors() {
			before[tn.Name] = string(tn.Data)
		}
		first := r.Run(c).String()
		for _, tn := range c.Tensors() {
			require.Equal(t, before[tn.Name], string(tn.Data), "%s: running changed %s", c.Name, tn.Name)
		}
		require.Equal(t, first, r.Run(c).String(), c.Name)
	}
}

// mutate returns a copy of c with one element of one expected output moved
// outside its tolerance (flipped, for exact outputs), and where.
func mutate(t *testing.T, c *Case) (mutated *Case, output string, index []int) {
	t.Helper()
	spec := ops[c.Op]
	atol, rtol := 0.0, 0.0
	if spec.needsTolerance(c) {
		var err error
		atol, rtol, err = params{meta: c.Meta}.tolerance()
		require.NoError(t, err)
	}
	var tensors []safetensors.Tensor
	for _, tn := range c.Tensors() {
		tn.Data = append([]byte(nil), tn.Data...)
		tensors = append(tensors, tn)
	}
	// Mutate the last output in name order, at an element near its middle
	// whose expected value is finite.
	outs := append([]string(nil), spec.outputs...)
	sort.Strings(outs)
	output = outs[len(outs)-1]
	for i := range tensors {
		tn := &tensors[i]
		if tn.Name != "out."+output {
			continue
		}
		n := tn.NumElements()
		require.Positive(t, n, "%s: %s is empty", c.Name, tn.Name)
		k := n / 2
		for ; k < n && math.IsInf(value(*tn, k), 0); k++ {
		}
		require.Less(t, k, n, "%s: no finite element to mutate", c.Name)
		index = unravel(k, tn.Shape)
		switch {
		case tn.DType == safetensors.F32 && !spec.isExact(output):
			w := float64(math.Float32frombits(binary.LittleEndian.Uint32(tn.Data[4*k:])))
			bad := w + 3*(atol+rtol*math.Abs(w)) + 1e-3
			binary.LittleEndian.PutUint32(tn.Data[4*k:], math.Float32bits(float32(bad)))
		case tn.DType == safetensors.I32:
			v := binary.LittleEndian.Uint32(tn.Data[4*k:])
			binary.LittleEndian.PutUint32(tn.Data[4*k:], v+1)
		default: // U8 masks (0/1) and caches compared bit for bit
			tn.Data[k*tn.DType.Size()] ^= 1
		}
	}
	buf, err := safetensors.Encode(c.Meta, tensors)
	require.NoError(t, err)
	mutated, err = Parse(c.Name, buf)
	require.NoError(t, err)
	return mutated, output, index
}

// Every shipped case, with one expected element moved, fails and the report
// points at that element: the comparison of every op can fail.
func TestMutatedCasesFailAtTheMutatedElement(t *testing.T) {
	r := &Runner{Backend: cpu.New(cpu.Config{})}
	for _, c := range shippedCases(t) {
		m, output, index := mutate(t, c)
		res := r.Run(m)
		require.False(t, res.Passed(), "%s: mutated case passed: %s", c.Name, res)
		require.NoError(t, res.Err, c.Name)
		w := res.Worst()
		require.NotNil(t, w, c.Name)
		assert.Equal(t, output, w.Name, c.Name)
		assert.Equal(t, index, w.Worst.Index, "%s: %s", c.Name, res)
		assert.Equal(t, 1, w.Failed, "%s: %s", c.Name, res)
		assert.Contains(t, res.String(), "FAIL "+c.Name)
		assert.Contains(t, res.String(), "worst at "+output+indexString(index)+": got ")
	}
}

// caseBytes builds a case file from metadata and tensors.
func caseBytes(t *testing.T, meta map[string]string, tensors ...safetensors.Tensor) []byte {
	t.Helper()
	if _, ok := meta["format"]; !ok {
		meta["format"] = Format
	}
	b, err := safetensors.Encode(meta, tensors)
	require.NoError(t, err)
	return b
}

func seqLensCase(t *testing.T, meta map[string]string, extra ...safetensors.Tensor) []byte {
	tensors := append([]safetensors.Tensor{
		safetensors.I32Tensor("in.kv_indptr", []int{3}, []int32{0, 2, 2}),
		safetensors.I32Tensor("in.kv_last_page_len", []int{2}, []int32{3, 0}),
		safetensors.I32Tensor("out.seq_lens", []int{2}, []int32{19, 0}),
	}, extra...)
	return caseBytes(t, meta, tensors...)
}

func TestInvalidCasesFailWithAReason(t *testing.T) {
	mergeTensors := []safetensors.Tensor{
		safetensors.F32Tensor("in.v_a", []int{1, 1, 2}, []float32{1, 0}),
		safetensors.F32Tensor("in.s_a", []int{1, 1}, []float32{1}),
		safetensors.F32Tensor("in.v_b", []int{1, 1, 2}, []float32{0, 1}),
		safetensors.F32Tensor("in.s_b", []int{1, 1}, []float32{2}),
		safetensors.F32Tensor("out.v", []int{1, 1, 2}, []float32{1. / 3, 2. / 3}),
		safetensors.F32Tensor("out.s", []int{1, 1}, []float32{float32(math.Log2(6))}),
	}
	tests := map[string]struct {
		buf  []byte
		want string
	}{
		"the valid case itself": {seqLensCase(t, map[string]string{"op": "get_seq_lens", "page_size": "16"}), "PASS x max_abs=0 max_rel=0"},
		"unknown op":            {caseBytes(t, map[string]string{"op": "rope"}), `FAIL x: golden: unknown op "rope"`},
		"unexpected tensor": {seqLensCase(t, map[string]string{"op": "get_seq_lens", "page_size": "16"}, safetensors.I32Tensor("in.custom_mask", []int{1}, []int32{1})),
			"op get_seq_lens has no tensor in.custom_mask"},
		"unknown parameter": {seqLensCase(t, map[string]string{"op": "get_seq_lens", "page_size": "16", "pos_encoding_mode": "ROPE_LLAMA"}),
			"op get_seq_lens has no parameter pos_encoding_mode"},
		"missing parameter": {seqLensCase(t, map[string]string{"op": "get_seq_lens"}), "missing parameter page_size"},
		"bad integer":       {seqLensCase(t, map[string]string{"op": "get_seq_lens", "page_size": "16.5"}), `parameter page_size = "16.5": want a decimal int32`},
		"missing tensor": {caseBytes(t, map[string]string{"op": "get_seq_lens", "page_size": "16"}, safetensors.I32Tensor("in.kv_indptr", []int{1}, []int32{0})),
			"op get_seq_lens needs tensor in.kv_last_page_len, which the case lacks"},
		"index array of the wrong dtype": {caseBytes(t, map[string]string{"op": "get_seq_lens", "page_size": "16"},
			safetensors.F32Tensor("in.kv_indptr", []int{1}, []float32{0}), safetensors.I32Tensor("in.kv_last_page_len", []int{0}, nil), safetensors.I32Tensor("out.seq_lens", []int{0}, nil)),
			"in.kv_indptr (F32 [1]): want a 1-D I32 array"},
		"op error names the value": {caseBytes(t, map[string]string{"op": "get_seq_lens", "page_size": "16"},
			safetensors.I32Tensor("in.kv_indptr", []int{2}, []int32{0, 1}), safetensors.I32Tensor("in.kv_last_page_len", []int{1}, []int32{17}), safetensors.I32Tensor("out.seq_lens", []int{1}, []int32{17})),
			"kv_last_page_len[0] = 17"},
		"wrong output shape": {caseBytes(t, map[string]string{"op": "get_seq_lens", "page_size": "16"},
			safetensors.I32Tensor("in.kv_indptr", []int{2}, []int32{0, 1}), safetensors.I32Tensor("in.kv_last_page_len", []int{1}, []int32{7}), safetensors.I32Tensor("out.seq_lens", []int{1, 1}, []int32{7})),
			"FAIL x max_abs=0 max_rel=0 seq_lens has shape [1], want [1 1]"},
		"missing tolerance": {caseBytes(t, map[string]string{"op": "merge_state"}, mergeTensors...), "missing parameter atol"},
		"negative tolerance": {caseBytes(t, map[string]string{"op": "merge_state", "atol": "-1", "rtol": "0"}, mergeTensors...),
			`parameter atol = "-1": want a finite number >= 0`},
		"merge passes":      {caseBytes(t, map[string]string{"op": "merge_state", "atol": "1e-6", "rtol": "1e-6"}, mergeTensors...), "PASS x max_abs="},
		"no format":         {func() []byte { b, _ := safetensors.Encode(map[string]string{"op": "packbits"}, nil); return b }(), `no "format" in __metadata__`},
		"other format":      {caseBytes(t, map[string]string{"op": "packbits", "format": "pagedkv-golden/2"}), `format "pagedkv-golden/2", want "pagedkv-golden/1"`},
		"not a safetensors": {[]byte("not a case"), "safetensors: not a safetensors file: byte 8 is 's'"},
		"bad causal":        {caseBytes(t, map[string]string{"op": "get_seq_lens", "page_size": "16"}), "needs tensor"},
		"too many levels": {caseBytes(t, map[string]string{"op": "cascade_attention", "num_levels": "1000"}),
			`parameter num_levels = "1000": want 1..64`},
		// The kernels read sm_scale 0 as 1/sqrt(head_dim); FlashInfer would
		// use 0. A case saying "0" passed against default-scale outputs.
		"explicit sm_scale 0": {decodeCaseWith(t, "sm_scale", "0"), `parameter sm_scale = "0": want > 0`},
		"plain swa mask":      {caseBytes(t, map[string]string{"op": "swa_mask", "max_seq": "2", "window_size": "2", "compressed": "0", "head_dim": "64"}, safetensors.U8Tensor("out.allowed", []int{2, 2}, []uint8{1, 0, 1, 1})), "PASS x"},
		// head_dim only matters to the compressed mask, but garbage in it
		// passed before.
		"swa head_dim not a number": {caseBytes(t, map[string]string{"op": "swa_mask", "max_seq": "2", "window_size": "2", "compressed": "0", "head_dim": "NaN"}, safetensors.U8Tensor("out.allowed", []int{2, 2}, []uint8{1, 0, 1, 1})),
			`parameter head_dim = "NaN": want a decimal int32`},
		"swa head_dim negative": {caseBytes(t, map[string]string{"op": "swa_mask", "max_seq": "2", "window_size": "2", "compressed": "0", "head_dim": "-1"}, safetensors.U8Tensor("out.allowed", []int{2, 2}, []uint8{1, 0, 1, 1})),
			`parameter head_dim = "-1": want > 0`},
	}
	r := &Runner{Backend: cpu.New(cpu.Config{})}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var res *Result
			c, err := Parse("x", tc.buf)
			if err != nil {
				res = &Result{Name: "x", Err: err}
			} else {
				res = r.Run(c)
			}
			assert.Contains(t, res.String(), tc.want)
			assert.Equal(t, strings.HasPrefix(tc.want, "PASS"), res.Passed(), res.String())
		})
	}
}

func TestCompare(t *testing.T) {
	inf := float32(math.Inf(1))
	nan := float32(math.NaN())
	f32 := func(v ...float32) safetensors.Tensor { return safetensors.F32Tensor("out.o", []int{2, len(v) / 2}, v) }
	tests := map[string]struct {
		want, got  safetensors.Tensor
		exact      bool
		atol, rtol float64
		failed     int
		worst      string // Describe() of the worst element
		maxAbs     float64
	}{
		"equal":              {f32(1, 2, 3, 4), f32(1, 2, 3, 4), false, 0, 0, 0, "o[0,0]: got 1 want 1", 0},
		"inside atol":        {f32(1, 2, 3, 4), f32(1, 2.5, 3, 4), false, 0.5, 0, 0, "o[0,1]: got 2.5 want 2", 0.5},
		"just outside atol":  {f32(1, 2, 3, 4), f32(1, 2, 3, 4.75), false, 0.5, 0, 1, "o[1,1]: got 4.75 want 4", 0.75},
		"rtol scales":        {f32(100, 1, 0, 0), f32(101, 1.5, 0, 0), false, 0, 0.1, 1, "o[0,1]: got 1.5 want 1", 1},
		"worst beats first":  {f32(0, 0, 0, 0), f32(2, 0, 0, 5), false, 1, 0, 2, "o[1,1]: got 5 want 0", 5},
		"want -inf, got it":  {f32(-inf, 1, 1, 1), f32(-inf, 1, 1, 1), false, 1e-3, 0, 0, "o[0,0]: got -inf want -inf", 0},
		"want -inf, got 0":   {f32(-inf, 1, 1, 1), f32(0, 1, 1, 1), false, 1e-3, 0, 1, "o[0,0]: got 0 want -inf", 0},
		"nan where finite":   {f32(1, 1, 1, 1), f32(1, nan, 1, 1), false, 1, 1, 1, "o[0,1]: got nan want 1", math.Inf(1)},
		"want nan, got nan":  {f32(nan, 1, 1, 1), f32(nan, 1, 1, 1), false, 0, 0, 0, "o[0,0]: got nan want nan", 0},
		"zero tolerance":     {f32(1, 1, 1, 1), f32(1, 1, 1, 1.0000001), false, 0, 0, 1, "o[1,1]: got 1.0000001 want 1", 1.1920928955078125e-07},
		"exact copy differs": {f32(1, 2, 3, 4), f32(1, 2, 3.0000002, 4), true, 1, 1, 1, "o[1,0]: got 3.0000002 (0x40400001) want 3 (0x40400000)", 2.384185791015625e-07},
		"exact: -0 vs +0":    {f32(0, 1, 1, 1), f32(float32(math.Copysign(0, -1)), 1, 1, 1), true, 0, 0, 1, "o[0,0]: got -0 (0x80000000) want 0 (0x00000000)", 0},
		"ints are exact": {safetensors.I32Tensor("out.positions", []int{3}, []int32{4, 5, 6}), safetensors.I32Tensor("out.positions", []int{3}, []int32{4, 5, 7}),
			false, 10, 10, 1, "positions[2]: got 7 want 6", 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := Compare(tc.want, tc.got, tc.exact, tc.atol, tc.rtol)
			assert.Empty(t, r.Mismatch)
			assert.Equal(t, tc.failed, r.Failed)
			assert.Equal(t, tc.failed == 0, r.Passed())
			assert.Equal(t, tc.worst, r.Describe())
			assert.Equal(t, tc.maxAbs, r.MaxAbs)
			assert.Equal(t, tc.want.NumElements(), r.Elements)
		})
	}
	r := Compare(f32(1, 2, 3, 4), safetensors.F32Tensor("out.o", []int{4}, []float32{1, 2, 3, 4}), false, 1, 1)
	assert.False(t, r.Passed())
	assert.Equal(t, "o has shape [4], want [2 2]", r.Mismatch)
	r = Compare(safetensors.U8Tensor("out.y", []int{1}, []byte{1}), safetensors.Tensor{Name: "y", DType: safetensors.I32, Shape: []int{1}, Data: make([]byte, 4)}, false, 0, 0)
	assert.Equal(t, "y is I32, want U8 (compared bit for bit)", r.Mismatch)
}

// unsupportedBackend is the CPU backend without prefill and merge_state, as
// a GPU backend may be.
type unsupportedBackend struct{ kernels.Backend }

func (unsupportedBackend) Name() string { return "partial" }
func (unsupportedBackend) BatchPrefill(*kernels.PrefillParams) error {
	return kernels.ErrUnsupported
}
func (unsupportedBackend) MergeState(*kernels.MergeStateParams) error {
	return kernels.ErrUnsupported
}

// panickingBackend panics in decode, like a backend with an indexing bug.
type panickingBackend struct{ kernels.Backend }

func (panickingBackend) Name() string                            { return "buggy" }
func (panickingBackend) BatchDecode(*kernels.DecodeParams) error { panic("index out of range [7]") }

func TestUnsupportedOpsFailOrFallBack(t *testing.T) {
	partial := unsupportedBackend{cpu.New(cpu.Config{})}
	byName := map[string]*Case{}
	for _, c := range shippedCases(t) {
		byName[c.Name] = c
	}
	prefill, decode, cascadeCase, seqLens := byName["batch_prefill_paged_0_00"], byName["batch_decode_0_00"], byName["cascade_attention_0_00"], byName["get_seq_lens_0_00"]

	alone := &Runner{Backend: partial}
	res := alone.Run(prefill)
	assert.False(t, res.Passed())
	assert.ErrorIs(t, res.Err, kernels.ErrUnsupported)
	assert.Equal(t, "FAIL batch_prefill_paged_0_00: unsupported on partial: "+kernels.ErrUnsupported.Error(), res.String())
	res = alone.Run(cascadeCase)
	assert.ErrorIs(t, res.Err, kernels.ErrUnsupported, "cascade needs prefill")
	res = alone.Run(decode)
	assert.True(t, res.Passed(), res.String())
	assert.Equal(t, "partial", res.Backend)

	withFallback := &Runner{Backend: partial, Fallback: cpu.New(cpu.Config{})}
	for _, c := range []*Case{prefill, cascadeCase} {
		res = withFallback.Run(c)
		assert.True(t, res.Passed(), res.String())
		assert.True(t, res.Fallback)
		assert.Equal(t, "cpu", res.Backend)
		assert.True(t, strings.HasPrefix(res.String(), "PASS "+c.Name+" (cpu fallback) max_abs="), res.String())
	}
	res = withFallback.Run(decode)
	assert.False(t, res.Fallback, "decode is supported: no fallback")
	res = withFallback.Run(seqLens)
	assert.True(t, res.Passed())
	assert.Equal(t, "", res.Backend, "host-side op")

	buggy := &Runner{Backend: panickingBackend{cpu.New(cpu.Config{})}, Fallback: cpu.New(cpu.Config{})}
	res = buggy.Run(decode)
	assert.False(t, res.Passed())
	assert.Contains(t, res.String(), "FAIL batch_decode_0_00: golden: op batch_decode panicked: index out of range [7]")
}

func TestFind(t *testing.T) {
	paths, err := Find(shippedDir, filepath.Join(shippedDir, "packbits_0_00.safetensors"))
	require.NoError(t, err)
	assert.True(t, sort.StringsAreSorted(paths))
	assert.Len(t, paths, 57, "the file named twice is listed once")
	_, err = Find(filepath.Join(shippedDir, "no-such-dir"))
	assert.Error(t, err)
	_, err = Find(t.TempDir())
	assert.ErrorContains(t, err, "no *.safetensors case under")
}

func TestRunFileReportsUnreadableFiles(t *testing.T) {
	r := &Runner{Backend: cpu.New(cpu.Config{})}
	res := r.RunFile(filepath.Join(t.TempDir(), "gone.safetensors"))
	assert.False(t, res.Passed())
	assert.Equal(t, "gone", res.Name)
	assert.Contains(t, res.String(), "FAIL gone: stat ")
}

// decodeCaseWith is the first shipped batch_decode case with one parameter
// replaced.
func decodeCaseWith(t *testing.T, key, value string) []byte {
	t.Helper()
	c := shippedCase(t, "batch_decode_0_00")
	meta := maps.Clone(c.Meta)
	meta[key] = value
	out, err := safetensors.Encode(meta, c.Tensors())
	require.NoError(t, err)
	return out
}

// paddedCaseWith is the shipped trtllm_batch_decode case with one
// parameter set (value "" deletes it) and one I32 input replaced (name ""
// keeps them all).
func paddedCaseWith(t *testing.T, key, value, name string, ints []int32) []byte {
	t.Helper()
	c := shippedCase(t, "seed_padded_trtllm_decode")
	meta := maps.Clone(c.Meta)
	if value == "" {
		delete(meta, key)
	} else {
		meta[key] = value
	}
	tensors := c.Tensors()
	for i, tn := range tensors {
		if tn.Name == name {
			tensors[i] = safetensors.I32Tensor(name, tn.Shape, ints)
		}
	}
	out, err := safetensors.Encode(meta, tensors)
	require.NoError(t, err)
	return out
}

// The padded-table decode refuses what FlashInfer's contract forbids,
// naming the value, and a wrong row order fails the comparison.
func TestPaddedDecodeCaseRefusals(t *testing.T) {
	c := shippedCase(t, "seed_padded_trtllm_decode")
	var bt, lens []int32
	var err error
	for _, tn := range c.Tensors() {
		switch tn.Name {
		case "in.block_tables":
			bt, err = tn.Int32s()
		case "in.seq_lens":
			lens, err = tn.Int32s()
		}
		require.NoError(t, err)
	}
	pad := slices.Clone(bt)
	pad[len(pad)-1] = 1 << 20
	long := slices.Clone(lens)
	long[0] = 21
	swapped := slices.Clone(bt)
	swapped[0], swapped[5] = swapped[5], swapped[0] // rows 0 and 1 trade their first page
	r := &Runner{Backend: cpu.New(cpu.Config{})}
	for name, tc := range map[string]struct {
		buf  []byte
		want string
	}{
		"as shipped":       {paddedCaseWith(t, "", "", "", nil), "PASS x"},
		"no kv_layout":     {paddedCaseWith(t, "kv_layout", "", "", nil), "parameter kv_layout = \"\": required for trtllm_batch_decode"},
		"padding off pool": {paddedCaseWith(t, "", "", "in.block_tables", pad), "= 1048576 is not a page of the"},
		"past max_seq_len": {paddedCaseWith(t, "", "", "in.seq_lens", long), "seq_lens[0] = 21, want 1..max_seq_len = 20"},
		"rows swapped":     {paddedCaseWith(t, "", "", "in.block_tables", swapped), "FAIL x max_abs="},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := Parse("x", tc.buf)
			require.NoError(t, err)
			res := r.Run(c)
			assert.Contains(t, res.String(), tc.want)
			assert.Equal(t, strings.HasPrefix(tc.want, "PASS"), res.Passed(), res.String())
		})
	}
}

// shippedCase parses testdata/golden/name.safetensors.
func shippedCase(t *testing.T, name string) *Case {
	t.Helper()
	f := filepath.Join(shippedDir, name+".safetensors")
	buf, err := os.ReadFile(f)
	require.NoError(t, err)
	c, err := Parse(f, buf)
	require.NoError(t, err)
	return c
}
