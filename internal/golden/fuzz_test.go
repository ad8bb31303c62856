package golden

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pagedkv/pagedkv/internal/safetensors"
	"github.com/pagedkv/pagedkv/kernels/cpu"
)

// tinyCases are small valid cases of the backend ops (the shipped ones are
// too large to be fuzz seeds); their expected outputs need not be right.
func tinyCases() map[string][]byte {
	f16 := func(name string, shape ...int) safetensors.Tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		data := make([]byte, 2*n)
		for i := 0; i < n; i++ {
			binary.LittleEndian.PutUint16(data[2*i:], 0x3800+uint16(i%7)) // 0.5 and up
		}
		return safetensors.Tensor{Name: name, DType: safetensors.F16, Shape: shape, Data: data}
	}
	zeros := func(name string, shape ...int) safetensors.Tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		return safetensors.F32Tensor(name, shape, make([]float32, n))
	}
	i32 := func(name string, v ...int32) safetensors.Tensor { return safetensors.I32Tensor(name, []int{len(v)}, v) }
	attn := map[string]string{"kv_layout": "HND", "page_size": "2", "num_qo_heads": "2", "num_kv_heads": "1", "head_dim": "4", "atol": "1e-3", "rtol": "1e-3"}
	with := func(m map[string]string, kv ...string) map[string]string {
		out := map[string]string{"format": Format}
		for k, v := range m {
			out[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	enc := func(meta map[string]string, ts ...safetensors.Tensor) []byte {
		b, err := safetensors.Encode(meta, ts)
		if err != nil {
			panic(err)
		}
		return b
	}
	table := []safetensors.Tensor{i32("in.kv_indptr", 0, 2, 2), i32("in.kv_indices", 3, 0), i32("in.kv_last_page_len", 1, 0)}
	return map[string][]byte{
		"decode": enc(with(attn, "op", "batch_decode", "window_left", "1", "logits_soft_cap", "5"),
			append([]safetensors.Tensor{f16("in.q", 2, 2, 4), f16("in.paged_kv_cache", 4, 2, 1, 2, 4), zeros("out.o", 2, 2, 4), zeros("out.lse", 2, 2)}, table...)...),
		"prefill": enc(with(attn, "op", "batch_prefill_paged", "causal", "1"),
			append([]safetensors.Tensor{f16("in.q", 3, 2, 4), i32("in.qo_indptr", 0, 3, 3), f16("in.paged_kv_cache", 4, 2, 1, 2, 4), zeros("out.o", 3, 2, 4), zeros("out.lse", 3, 2)}, table...)...),
		"append": enc(with(map[string]string{"op": "append_paged_kv_cache", "kv_layout": "NHD", "page_size": "2"}),
			append([]safetensors.Tensor{f16("in.append_key", 2, 1, 4), f16("in.append_value", 2, 1, 4), i32("in.batch_indices", 0, 0), i32("in.positions", 1, 2),
				f16("in.paged_kv_cache", 4, 2, 2, 1, 4), f16("out.paged_kv_cache", 4, 2, 2, 1, 4)}, table...)...),
		"cascade": enc(with(attn, "op", "cascade_attention", "num_levels", "2", "causal", "1"),
			f16("in.q", 2, 2, 4), f16("in.paged_kv_cache", 4, 2, 1, 2, 4), zeros("out.o", 2, 2, 4),
			i32("in.qo_indptr.0", 0, 2), i32("in.kv_indptr.0", 0, 1), i32("in.kv_indices.0", 2), i32("in.kv_last_page_len.0", 2),
			i32("in.qo_indptr.1", 0, 1, 2), i32("in.kv_indptr.1", 0, 1, 2), i32("in.kv_indices.1", 0, 1), i32("in.kv_last_page_len.1", 1, 2)),
		"mla": enc(with(map[string]string{"op": "mla_decode", "page_size": "2", "num_heads": "1", "sm_scale": "0.5", "atol": "1e-3", "rtol": "1e-3"}),
			f16("in.q_nope", 1, 1, 4), f16("in.q_pe", 1, 1, 2), f16("in.ckv_cache", 2, 2, 4), f16("in.kpe_cache", 2, 2, 2),
			i32("in.kv_indptr", 0, 2), i32("in.kv_indices", 1, 0), i32("in.kv_len", 3), zeros("out.o", 1, 1, 4), zeros("out.lse", 1, 1)),
	}
}

// FuzzRunCase mutates small valid cases (one metadata value, one 32-bit word
// of one tensor, or a dropped tensor) and runs them on the CPU backend. No
// case, however hostile, may make the runner or the code under test panic
// (runSafely would report that as "panicked"), and the report must hold
// together.
func FuzzRunCase(f *testing.F) {
	var seeds [][]byte
	paths, _ := filepath.Glob(filepath.Join(shippedDir, "*.safetensors"))
	for _, p := range paths {
		if b, err := os.ReadFile(p); err == nil && len(b) <= 8192 {
			seeds = append(seeds, b)
		}
	}
	for _, b := range tinyCases() {
		seeds = append(seeds, b)
	}
	for i := range seeds {
		f.Add(uint8(i), "", "", uint8(255), uint32(0), int32(0))
	}
	f.Add(uint8(0), "page_size", "0", uint8(0), uint32(4), int32(-1))
	f.Add(uint8(1), "nnz", "2000000000", uint8(1), uint32(0), int32(math.MaxInt32))
	f.Add(uint8(2), "max_seq", "1000000", uint8(0), uint32(8), int32(math.MinInt32))
	r := &Runner{Backend: cpu.New(cpu.Config{Workers: 1})}
	f.Fuzz(func(t *testing.T, pick uint8, key, val string, tensor uint8, pos uint32, word int32) {
		c, err := Parse("fuzz", seeds[int(pick)%len(seeds)])
		if err != nil {
			t.Fatal(err)
		}
		meta := map[string]string{}
		for k, v := range c.Meta {
			meta[k] = v
		}
		if key != "" {
			meta[key] = val
		}
		var ts []safetensors.Tensor
		for i, tn := range c.Tensors() {
			tn.Data = append([]byte(nil), tn.Data...)
			if i == int(tensor) {
				if word == math.MinInt32 {
					continue // drop it
				}
				if len(tn.Data) >= 4 {
					at := int(pos%uint32(len(tn.Data)/4)) * 4
					binary.LittleEndian.PutUint32(tn.Data[at:], uint32(word))
				}
			}
			ts = append(ts, tn)
		}
		buf, err := safetensors.Encode(meta, ts)
		if err != nil {
			return // e.g. a metadata key the writer refuses
		}
		m, err := Parse("fuzz", buf)
		if err != nil {
			return
		}
		res := r.Run(m)
		line := res.String()
		if res.Err != nil && strings.Contains(res.Err.Error(), "panicked") {
			t.Fatalf("%s", line)
		}
		if res.Passed() != strings.HasPrefix(line, "PASS ") {
			t.Fatalf("Passed() = %v but the line is %q", res.Passed(), line)
		}
		if res.Passed() && len(res.Outputs) == 0 {
			t.Fatal("passed without comparing anything")
		}
		_ = res.Details()
	})
}
