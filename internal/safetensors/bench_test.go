package safetensors

import (
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkParse parses a shipped case (header and tensor table; the data
// is not copied), against the baseline of copying the file's bytes once.
func BenchmarkParse(b *testing.B) {
	buf, err := os.ReadFile(filepath.Join(goldenDir, "cascade_attention_0_01.safetensors"))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("parse", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(buf)))
		for b.Loop() {
			if _, err := Parse(buf); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("baseline=copy", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(buf)))
		dst := make([]byte, len(buf))
		for b.Loop() {
			copy(dst, buf)
		}
	})
}

// BenchmarkEncode writes the same case back.
func BenchmarkEncode(b *testing.B) {
	f, err := ReadFile(filepath.Join(goldenDir, "cascade_attention_0_01.safetensors"))
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for _, t := range f.Tensors {
		n += int64(len(t.Data))
	}
	b.ReportAllocs()
	b.SetBytes(n)
	for b.Loop() {
		if _, err := Encode(f.Metadata, f.Tensors); err != nil {
			b.Fatal(err)
		}
	}
}
