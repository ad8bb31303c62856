package safetensors

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// goldenDir holds the project's shipped reference cases.
const goldenDir = "../../testdata/golden"

// file assembles a safetensors file from a raw header and data section.
func file(header string, data []byte) []byte {
	b := make([]byte, 8, 8+len(header)+len(data))
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	b = append(b, header...)
	return append(b, data...)
}

func TestParseShippedCases(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join(goldenDir, "*.safetensors"))
	require.NoError(t, err)
	require.NotEmpty(t, paths, "no cases under %s", goldenDir)
	for _, p := range paths {
		f, err := ReadFile(p)
		require.NoError(t, err, p)
		assert.Equal(t, "pagedkv-golden/1", f.Metadata["format"], p)
		assert.NotEmpty(t, f.Metadata["op"], p)
		for _, tn := range f.Tensors {
			assert.Equal(t, tn.NumElements()*tn.DType.Size(), len(tn.Data), "%s: %s", p, tn.Name)
		}
	}
}

// A small worked file: the header from the format's merge_state case,
// written by hand, decodes to the values it declares.
func TestParseWorkedExample(t *testing.T) {
	data := []byte{
		1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, // in.x I32 [3] = 1, 2, 3
		0, 0, 0x80, 0x3f, // out.y F32 [] = 1.0
		7, 9, // out.z U8 [2]
	}
	header := `{"__metadata__":{"op":"demo","format":"pagedkv-golden/1"},` +
		`"out.y":{"dtype":"F32","shape":[],"data_offsets":[12,16]},` +
		`"in.x":{"dtype":"I32","shape":[3],"data_offsets":[0,12]},` +
		`"out.z":{"dtype":"U8","shape":[2],"data_offsets":[16,18]}}    `
	f, err := Parse(file(header, data))
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"op": "demo", "format": "pagedkv-golden/1"}, f.Metadata)
	require.Len(t, f.Tensors, 3)
	assert.Equal(t, []string{"in.x", "out.y", "out.z"}, []string{f.Tensors[0].Name, f.Tensors[1].Name, f.Tensors[2].Name})
	x, ok := f.Tensor("in.x")
	require.True(t, ok)
	xs, err := x.Int32s()
	require.NoError(t, err)
	assert.Equal(t, []int32{1, 2, 3}, xs)
	y, _ := f.Tensor("out.y")
	ys, err := y.Float32s()
	require.NoError(t, err)
	assert.Equal(t, []float32{1}, ys)
	assert.Equal(t, []int{}, y.Shape)
	z, _ := f.Tensor("out.z")
	assert.Equal(t, []byte{7, 9}, z.Data)
	_, ok = f.Tensor("missing")
	assert.False(t, ok)
	_, err = z.Int32s()
	assert.ErrorContains(t, err, `tensor "out.z": dtype is U8, want I32`)
}

func TestParseMalformed(t *testing.T) {
	four := []byte{0, 0, 0, 0}
	ent := func(name, dtype, shape, offs string) string {
		return `"` + name + `":{"dtype":"` + dtype + `","shape":` + shape + `,"data_offsets":` + offs + `}`
	}
	hugeLen := make([]byte, 8)
	binary.LittleEndian.PutUint64(hugeLen, MaxHeaderBytes+1)
	beyond := make([]byte, 16)
	binary.LittleEndian.PutUint64(beyond, 9)
	tests := map[string]struct {
		file []byte
		is   error
		want string // substring of the message
	}{
		"empty":                 {nil, ErrMalformed, "file is 0 bytes"},
		"seven bytes":           {make([]byte, 7), ErrMalformed, "shorter than the 8-byte header length"},
		"header over the limit": {hugeLen, ErrHeaderTooLarge, "header length 104857601 exceeds the limit"},
		"header past the end":   {beyond, ErrMalformed, "header length 9 exceeds the 8 bytes"},
		"not json":              {file(`{"a":`, nil), ErrMalformed, `tensor "a": header JSON at byte 5: want '{', found the end of the header`},
		"unterminated string":   {file(`{"a`, nil), ErrMalformed, "header JSON at byte 3: unterminated string"},
		"invalid utf-8":         {file("{\"\xff\":1}", nil), ErrMalformed, "not valid UTF-8"},
		"leading zero":          {file(`{"w":{"dtype":"U8","shape":[04],"data_offsets":[0,4]}}`, four), ErrMalformed, `element "04" has a leading zero`},
		"duplicate field":       {file(`{"w":{"dtype":"U8","dtype":"U8","shape":[4],"data_offsets":[0,4]}}`, four), ErrMalformed, `field "dtype" appears twice`},
		"trailing comma":        {file(`{"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},}`, four), ErrMalformed, "want a string"},
		"entry not an object":   {file(`{"w":[1]}`, nil), ErrMalformed, `tensor "w": header JSON at byte 5: want '{'`},
		"control char":          {file("{\"a\tb\":{}}", nil), ErrMalformed, "control character 0x09"},
		"not an object":         {file(`[1,2]`, nil), ErrMalformed, "not a JSON object"},
		"trailing garbage":      {file(`{} x`, nil), ErrMalformed, "trailing data after the header's JSON object"},
		"second object":         {file(`{}{}`, nil), ErrMalformed, "trailing data"},
		"duplicate tensor": {file(`{`+ent("a", "U8", "[2]", "[0,2]")+`,`+ent("a", "U8", "[2]", "[2,4]")+`}`, four),
			ErrMalformed, `tensor "a": appears twice`},
		"unknown dtype":     {file(`{`+ent("w", "F64", "[1]", "[0,4]")+`}`, four), ErrUnknownDType, `tensor "w": unknown dtype "F64"`},
		"lowercase dtype":   {file(`{`+ent("w", "f32", "[1]", "[0,4]")+`}`, four), ErrUnknownDType, `unknown dtype "f32"`},
		"missing dtype":     {file(`{"w":{"shape":[1],"data_offsets":[0,4]}}`, four), ErrMalformed, `tensor "w": no dtype`},
		"missing shape":     {file(`{"w":{"dtype":"U8","data_offsets":[0,4]}}`, four), ErrMalformed, `tensor "w": no shape`},
		"missing offsets":   {file(`{"w":{"dtype":"U8","shape":[4]}}`, four), ErrMalformed, `tensor "w": no data_offsets`},
		"unknown field":     {file(`{"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4],"strides":[1]}}`, four), ErrMalformed, `unknown field "strides"`},
		"dtype not string":  {file(`{"w":{"dtype":4,"shape":[4],"data_offsets":[0,4]}}`, four), ErrMalformed, `tensor "w": header JSON at byte 14: dtype is not a string`},
		"negative dim":      {file(`{`+ent("w", "U8", "[-4]", "[0,4]")+`}`, four), ErrMalformed, `"-4" is not a non-negative integer`},
		"float dim":         {file(`{`+ent("w", "U8", "[4.0]", "[0,4]")+`}`, four), ErrMalformed, `"4.0" is not a non-negative integer`},
		"exponent dim":      {file(`{`+ent("w", "U8", "[4e0]", "[0,4]")+`}`, four), ErrMalformed, `"4e0" is not a non-negative integer`},
		"null shape":        {file(`{`+ent("w", "U8", "null", "[0,4]")+`}`, four), ErrMalformed, `shape is not an array of non-negative integers (found "null`},
		"dim overflows u64": {file(`{`+ent("w", "U8", "[18446744073709551616]", "[0,4]")+`}`, four), ErrMalformed, "overflows 64 bits"},
		"rank 17": {file(`{`+ent("w", "U8", "[1"+strings.Repeat(",1", 16)+"]", "[0,1]")+`}`, []byte{0}),
			ErrMalformed, "shape has more than 16 values"},
		"rank 1000": {file(`{`+ent("w", "U8", "[1"+strings.Repeat(",1", 999)+"]", "[0,1]")+`}`, []byte{0}),
			ErrMalformed, "shape has more than 16 values"},
		"three offsets":    {file(`{`+ent("w", "U8", "[4]", "[0,2,4]")+`}`, four), ErrMalformed, "data_offsets has more than 2 values"},
		"reversed offsets": {file(`{`+ent("w", "U8", "[0]", "[4,0]")+`}`, four), ErrMalformed, "data_offsets [4, 0] out of range"},
		"offset past end":  {file(`{`+ent("w", "U8", "[8]", "[0,8]")+`}`, four), ErrMalformed, "data section is 4 bytes"},
		"shape/size":       {file(`{`+ent("w", "F32", "[2]", "[0,4]")+`}`, four), ErrMalformed, "shape [2] of F32 needs 8 bytes but data_offsets [0, 4] hold 4"},
		"shape overflows": {file(`{`+ent("w", "F32", "[4294967296,4294967296]", "[0,4]")+`}`, four),
			ErrMalformed, "needs more than 2^64 bytes"},
		"zero dim with bytes": {file(`{`+ent("w", "U8", "[0,4]", "[0,4]")+`}`, four), ErrMalformed, "needs 0 bytes"},
		"overlap": {file(`{`+ent("a", "U8", "[3]", "[0,3]")+`,`+ent("b", "U8", "[2]", "[2,4]")+`}`, four),
			ErrMalformed, `tensor "b": data_offsets [2, 4] overlap tensor "a", which ends at 3`},
		"gap": {file(`{`+ent("a", "U8", "[1]", "[0,1]")+`,`+ent("b", "U8", "[2]", "[2,4]")+`}`, four),
			ErrMalformed, `leave a gap of 1 bytes after tensor "a"`},
		"leading gap":       {file(`{`+ent("b", "U8", "[2]", "[2,4]")+`}`, four), ErrMalformed, "leave bytes [0, 2) of the data section unused"},
		"uncovered tail":    {file(`{`+ent("a", "U8", "[2]", "[0,2]")+`}`, four), ErrMalformed, "cover 2 bytes but the data section holds 4"},
		"data, no tensors":  {file(`{}`, four), ErrMalformed, "cover 0 bytes but the data section holds 4"},
		"metadata numbers":  {file(`{"__metadata__":{"op":1}}`, nil), ErrMalformed, `__metadata__: the value of "op" is not a string`},
		"metadata dup":      {file(`{"__metadata__":{},"__metadata__":{}}`, nil), ErrMalformed, "__metadata__ appears twice"},
		"metadata key dup":  {file(`{"__metadata__":{"a":"1","a":"2"}}`, nil), ErrMalformed, `__metadata__: key "a" appears twice`},
		"empty tensor name": {file(`{`+ent("", "U8", "[4]", "[0,4]")+`}`, four), ErrMalformed, "empty name"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f, err := Parse(tc.file)
			require.Error(t, err, "parsed as %+v", f)
			assert.Nil(t, f)
			assert.ErrorIs(t, err, tc.is)
			var se *Error
			assert.True(t, errors.As(err, &se), "error %T is not *Error", err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestParseAcceptsEdgeCases(t *testing.T) {
	tests := map[string][]byte{
		"no tensors, no data":       file(`{}`, nil),
		"metadata only":             file(`{"__metadata__":{"a":"b"}}`, nil),
		"null metadata":             file(`{"__metadata__":null}`, nil),
		"whitespace padding":        file("{}       ", nil),
		"empty tensor":              file(`{"e":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]}}`, nil),
		"empty tensor between":      file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"e":{"dtype":"BF16","shape":[0],"data_offsets":[1,1]},"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, []byte{1, 2}),
		"huge dim times zero":       file(`{"e":{"dtype":"F32","shape":[9223372036854775807,0],"data_offsets":[0,0]}}`, nil),
		"spaces inside arrays":      file(`{"a":{"dtype":"U8","shape":[ 2 ],"data_offsets":[ 0 , 2 ]}}`, []byte{1, 2}),
		"fp8 and i8 dtypes":         file(`{"a":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"F8_E5M2","shape":[1],"data_offsets":[1,2]},"c":{"dtype":"I8","shape":[1],"data_offsets":[2,3]}}`, []byte{1, 2, 3}),
		"unaligned I32 after a U8":  file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"I32","shape":[1],"data_offsets":[1,5]}}`, []byte{9, 1, 0, 0, 0}),
		"tensor named like a field": file(`{"dtype":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, []byte{1}),
	}
	for name, b := range tests {
		t.Run(name, func(t *testing.T) {
			f, err := Parse(b)
			require.NoError(t, err)
			checkParsed(t, b, f)
		})
	}
}

// checkParsed asserts the invariants of the package doc on a parsed file.
func checkParsed(t *testing.T, buf []byte, f *File) {
	t.Helper()
	require.NotNil(t, f.Metadata)
	for i, tn := range f.Tensors {
		require.NotEmpty(t, tn.Name)
		require.NotEqual(t, MetadataKey, tn.Name)
		if i > 0 {
			require.Less(t, f.Tensors[i-1].Name, tn.Name, "tensors not sorted by unique name")
		}
		require.True(t, tn.DType.Valid())
		require.LessOrEqual(t, len(tn.Shape), MaxRank)
		for _, d := range tn.Shape {
			require.GreaterOrEqual(t, d, 0)
		}
		need, ok := byteSize(tn.Shape, tn.DType.Size())
		require.True(t, ok)
		require.Equal(t, need, uint64(len(tn.Data)), "tensor %q", tn.Name)
		if len(tn.Data) > 0 {
			require.True(t, aliases(buf, tn.Data), "tensor %q data is not a subslice of the file", tn.Name)
		}
	}
}

// aliases reports whether sub lies inside buf's memory.
func aliases(buf, sub []byte) bool {
	b0 := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	s0 := uintptr(unsafe.Pointer(unsafe.SliceData(sub)))
	return s0 >= b0 && s0+uintptr(len(sub)) <= b0+uintptr(len(buf))
}

func TestEncodeRoundTrip(t *testing.T) {
	meta := map[string]string{"format": "pagedkv-golden/1", "op": "merge_state", "atol": "1e-05"}
	in := []Tensor{
		F32Tensor("out.v", []int{2, 1, 2}, []float32{0.25, -1, 3.5, 0}),
		I32Tensor("in.kv_indptr", []int{3}, []int32{0, 2, -7}),
		U8Tensor("in.x", []int{5}, []byte{1, 0, 1, 1, 0}),
		{Name: "in.q", DType: BF16, Shape: []int{1, 2}, Data: []byte{0x80, 0x3f, 0x00, 0xc0}},
		{Name: "empty", DType: F16, Shape: []int{0, 4}, Data: nil},
		{Name: "scalar", DType: F32, Shape: nil, Data: []byte{0, 0, 0, 0x40}},
	}
	b, err := Encode(meta, in)
	require.NoError(t, err)
	n := binary.LittleEndian.Uint64(b)
	assert.Zero(t, n%8, "header length %d is not padded to 8", n)
	f, err := Parse(b)
	require.NoError(t, err)
	checkParsed(t, b, f)
	assert.Equal(t, meta, f.Metadata)
	require.Len(t, f.Tensors, len(in))
	for _, want := range in {
		got, ok := f.Tensor(want.Name)
		require.True(t, ok, want.Name)
		assert.Equal(t, want.DType, got.DType, want.Name)
		assert.Equal(t, len(want.Shape), len(got.Shape), want.Name)
		for i := range want.Shape {
			assert.Equal(t, want.Shape[i], got.Shape[i], want.Name)
		}
		assert.Equal(t, string(want.Data), string(got.Data), want.Name)
	}
	v, _ := f.Tensor("out.v")
	vs, err := v.Float32s()
	require.NoError(t, err)
	assert.Equal(t, []float32{0.25, -1, 3.5, 0}, vs)
	idx, _ := f.Tensor("in.kv_indptr")
	is, err := idx.Int32s()
	require.NoError(t, err)
	assert.Equal(t, []int32{0, 2, -7}, is)

	// Encoding is deterministic: the order of the input does not matter.
	rev := append([]Tensor(nil), in...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	b2, err := Encode(meta, rev)
	require.NoError(t, err)
	assert.Equal(t, b, b2)

	path := filepath.Join(t.TempDir(), "x.safetensors")
	require.NoError(t, WriteFile(path, meta, in))
	onDisk, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, b, onDisk)
}

// Every shipped case survives Parse -> Encode -> Parse unchanged.
func TestReencodeShippedCases(t *testing.T) {
	paths, _ := filepath.Glob(filepath.Join(goldenDir, "*.safetensors"))
	for _, p := range paths {
		f, err := ReadFile(p)
		require.NoError(t, err)
		b, err := Encode(f.Metadata, f.Tensors)
		require.NoError(t, err, p)
		g, err := Parse(b)
		require.NoError(t, err, p)
		assert.Equal(t, f.Metadata, g.Metadata, p)
		require.Equal(t, len(f.Tensors), len(g.Tensors), p)
		for i := range f.Tensors {
			assert.Equal(t, f.Tensors[i].Name, g.Tensors[i].Name)
			assert.Equal(t, f.Tensors[i].Shape, g.Tensors[i].Shape)
			assert.True(t, string(f.Tensors[i].Data) == string(g.Tensors[i].Data), "%s: %s data differs", p, f.Tensors[i].Name)
		}
	}
}

func TestEncodeRejects(t *testing.T) {
	tests := map[string]struct {
		tensors []Tensor
		want    string
	}{
		"short data":    {[]Tensor{{Name: "a", DType: F32, Shape: []int{2}, Data: make([]byte, 7)}}, `tensor "a": shape [2] of F32 needs 8 bytes but Data holds 7`},
		"negative dim":  {[]Tensor{{Name: "a", DType: U8, Shape: []int{-1}}}, "negative dimension"},
		"duplicate":     {[]Tensor{U8Tensor("a", []int{1}, []byte{1}), U8Tensor("a", []int{1}, []byte{1})}, `tensor "a": appears twice`},
		"reserved name": {[]Tensor{U8Tensor(MetadataKey, []int{1}, []byte{1})}, "reserved or empty"},
		"bad dtype":     {[]Tensor{{Name: "a", DType: InvalidDType}}, "invalid dtype"},
		"rank":          {[]Tensor{{Name: "a", DType: U8, Shape: make([]int, MaxRank+1)}}, "rank 17"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Encode(nil, tc.tensors)
			require.ErrorIs(t, err, ErrMalformed)
			assert.Contains(t, err.Error(), tc.want)
			path := filepath.Join(t.TempDir(), "x")
			require.Error(t, WriteFile(path, nil, tc.tensors))
			_, statErr := os.Stat(path)
			assert.True(t, os.IsNotExist(statErr), "WriteFile left a file behind after an error")
		})
	}
}

// hostileInputs declare far more than they hold (huge header lengths, huge
// shapes) or are merely large (thousands of tensors). The reader must refuse
// the former, and allocate no more than a fixed multiple of the input for any.
func hostileInputs() map[string][]byte {
	var many strings.Builder
	many.WriteString("{")
	for i := range 5000 {
		if i > 0 {
			many.WriteString(",")
		}
		many.WriteString(`"t` + strings.Repeat("x", 4) + itoa(i) + `":{"dtype":"F32","shape":[1073741824,1073741824],"data_offsets":[0,4]}`)
	}
	many.WriteString("}")
	var empties strings.Builder
	empties.WriteString("{")
	for i := range 20000 {
		if i > 0 {
			empties.WriteString(",")
		}
		empties.WriteString(`"e` + itoa(i) + `":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}`)
	}
	empties.WriteString("}")
	lenOnly := make([]byte, 8)
	binary.LittleEndian.PutUint64(lenOnly, MaxHeaderBytes)
	return map[string][]byte{
		"header length = limit, no header": lenOnly,
		"5000 tensors of 2^62 elements":    file(many.String(), []byte{0, 0, 0, 0}),
		"one tensor of 2^62 elements":      file(`{"w":{"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,4]}}`, []byte{0, 0, 0, 0}),
		"long shape":                       file(`{"w":{"dtype":"U8","shape":[`+strings.Repeat("1,", 100000)+`1],"data_offsets":[0,1]}}`, []byte{0}),
		"20000 empty tensors (valid)":      file(empties.String(), nil),
		"deep nesting":                     file(`{"w":`+strings.Repeat("[", 100000)+strings.Repeat("]", 100000)+`}`, nil),
	}
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}

// maxAllocPerInputByte bounds the bytes Parse allocates per input byte.
const maxAllocPerInputByte = 12

func TestParseHostileInputsAllocateLittle(t *testing.T) {
	for name, b := range hostileInputs() {
		t.Run(name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			f, err := Parse(b)
			runtime.ReadMemStats(&after)
			if strings.Contains(name, "(valid)") {
				require.NoError(t, err)
				checkParsed(t, b, f)
			} else {
				require.Error(t, err, "parsed as %v", f)
			}
			allocated := after.TotalAlloc - before.TotalAlloc
			t.Logf("%d-byte input: %d bytes allocated (%.1fx)", len(b), allocated, float64(allocated)/float64(len(b)))
			// Parsing allocates per header byte (encoding/json's buffer and
			// tokens, one Tensor per entry), never per declared element.
			limit := maxAllocPerInputByte*uint64(len(b)) + 64<<10
			assert.LessOrEqual(t, allocated, limit, "Parse of a %d-byte input allocated %d bytes: %v", len(b), allocated, err)
		})
	}
}

// ReadBounded reads a regular file up to the limit and refuses, before
// opening it, devices, FIFOs, directories and symlinks to them, and files
// over the limit, naming the path and the limit.
func TestReadBounded(t *testing.T) {
	dir := t.TempDir()
	small := filepath.Join(dir, "small")
	require.NoError(t, os.WriteFile(small, []byte("0123456789"), 0o644))
	b, err := ReadBounded(small, 10)
	require.NoError(t, err)
	require.Equal(t, "0123456789", string(b))
	_, err = ReadBounded(small, 9)
	require.ErrorIs(t, err, ErrFileTooLarge)
	require.EqualError(t, err, small+": file too large: 10 bytes exceeds the limit of 9 bytes")

	link := filepath.Join(dir, "zero.safetensors")
	require.NoError(t, os.Symlink("/dev/zero", link))
	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600)) // opening it would block
	for path, kind := range map[string]string{"/dev/zero": "a character device", link: "a character device", fifo: "a FIFO", dir: "a directory"} {
		_, err := ReadBounded(path, 1<<20)
		require.ErrorIs(t, err, ErrNotRegular, path)
		require.EqualError(t, err, path+": not a regular file ("+kind+"): refusing to read it")
	}
	_, err = ReadFile(link)
	require.ErrorIs(t, err, ErrNotRegular, "ReadFile bounds its reads too")
	_, err = ReadBounded(filepath.Join(dir, "missing"), 1)
	require.ErrorIs(t, err, os.ErrNotExist)
}

// A text file is named as not a safetensors file, not by the header
// length its first 8 bytes spell (issue 29).
func TestParseNamesTextFiles(t *testing.T) {
	_, err := Parse([]byte("# pagedkv\n\nA Go library"))
	require.ErrorIs(t, err, ErrMalformed)
	require.EqualError(t, err, `safetensors: not a safetensors file: byte 8 is 'v', where a header begins with '{' after the 8-byte length prefix`)
}
