package safetensors

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzReader feeds arbitrary bytes to Parse. It must never panic; an error
// must be an *Error wrapping one of the sentinels; a file it accepts must
// satisfy every invariant of the package doc and survive Encode -> Parse
// unchanged. (Allocation is bounded separately, by
// TestParseHostileInputsAllocateLittle, since measuring it per input would
// stop the world on every run.)
func FuzzReader(f *testing.F) {
	paths, _ := filepath.Glob(filepath.Join(goldenDir, "*.safetensors"))
	for _, p := range paths {
		if b, err := os.ReadFile(p); err == nil && len(b) <= 4096 {
			f.Add(b)
		}
	}
	for _, b := range hostileInputs() {
		if len(b) <= 4096 {
			f.Add(b)
		}
	}
	f.Add(file(`{"__metadata__":{"op":"x"},"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"BF16","shape":[1,1],"data_offsets":[2,4]}}`, []byte{1, 2, 3, 4}))
	f.Add(file(`{"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}`, []byte{0, 0, 0x80, 0x3f}))
	f.Add(file(`{"a\u00e9\ud83d\ude00":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}`, []byte{1, 0, 0, 0}))
	f.Add(file(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}`, []byte{1, 2, 3}))
	f.Fuzz(func(t *testing.T, b []byte) {
		pf, err := Parse(b)
		if err != nil {
			var se *Error
			require.True(t, errors.As(err, &se), "error %T %v is not *Error", err, err)
			require.True(t, errors.Is(err, ErrMalformed) || errors.Is(err, ErrUnknownDType) || errors.Is(err, ErrHeaderTooLarge), "error %v wraps no sentinel", err)
			require.Nil(t, pf)
			return
		}
		checkParsed(t, b, pf)
		n := binary.LittleEndian.Uint64(b)
		total := 0
		for _, tn := range pf.Tensors {
			total += len(tn.Data)
		}
		require.Equal(t, len(b)-8-int(n), total, "tensors do not tile the data section")

		enc, err := Encode(pf.Metadata, pf.Tensors)
		require.NoError(t, err)
		again, err := Parse(enc)
		require.NoError(t, err)
		require.Equal(t, pf.Metadata, again.Metadata)
		require.Equal(t, len(pf.Tensors), len(again.Tensors))
		for i := range pf.Tensors {
			a, g := pf.Tensors[i], again.Tensors[i]
			require.Equal(t, a.Name, g.Name)
			require.Equal(t, a.DType, g.DType)
			require.Equal(t, a.Shape, g.Shape)
			require.Equal(t, string(a.Data), string(g.Data))
		}
	})
}
