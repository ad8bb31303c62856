package golden

import (
	"fmt"
	"math"

	"github.com/pagedkv/pagedkv/internal/safetensors"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// NVFP4 ops: FlashInfer's nvfp4_quantize_append_paged_kv_cache and batch
// decode over the NVFP4 cache it writes. The cache is two 5-D tensors in
// FlashInfer's stacked form: paged_kv_cache U8 [pages, 2, N, H, D/2] (NHD;
// HND swaps N and H), packed e2m1 (element 2i in the low nibble of byte i),
// and kv_cache_sf F8_E4M3 [pages, 2, N, H, D/16], one block scale per 16
// elements. k_scale and v_scale are the global scales.

func init() {
	register("nvfp4_quantize_append_paged_kv_cache", &opSpec{
		inputs:  []string{"append_key", "append_value", "batch_indices", "positions", "kv_indices", "kv_indptr", "kv_last_page_len", "paged_kv_cache", "kv_cache_sf"},
		outputs: []string{"paged_kv_cache", "kv_cache_sf"},
		params:  []string{"kv_layout", "page_size", "k_scale", "v_scale"},
		exact:   []string{"paged_kv_cache", "kv_cache_sf"},
		backend: true,
		run:     runNVFP4Append,
	})
	register("batch_decode_nvfp4", &opSpec{
		inputs:  []string{"q", "paged_kv_cache", "kv_cache_sf", "kv_indptr", "kv_indices", "kv_last_page_len"},
		outputs: []string{"o", "lse"},
		params:  append(append([]string{}, attentionParams...), "k_scale", "v_scale"),
		backend: true,
		run:     runDecode,
	})
}

// nvfp4Cache copies in.paged_kv_cache and in.kv_cache_sf into a fused NVFP4
// host cache, checking their dtypes and shapes against each other,
// kv_layout and page_size.
func (x *exec) nvfp4Cache() (kernels.PagedKVCache, error) {
	t, sf := x.tensor("in.paged_kv_cache"), x.tensor("in.kv_cache_sf")
	if t.DType != safetensors.U8 || len(t.Shape) != 5 || t.Shape[1] != 2 {
		return kernels.PagedKVCache{}, badTensor(t, "want a 5-D U8 NVFP4 cache [pages, 2, ..., head_dim/2]")
	}
	g, err := x.fusedGeometry(t, layout.NVFP4, 2*t.Shape[4])
	if err != nil {
		return kernels.PagedKVCache{}, err
	}
	want := []int{t.Shape[0], 2, t.Shape[2], t.Shape[3], t.Shape[4] / 8}
	if sf.DType != safetensors.F8E4M3 || len(sf.Shape) != 5 || t.Shape[4]%8 != 0 || fmt.Sprint(sf.Shape) != fmt.Sprint(want) {
		return kernels.PagedKVCache{}, badTensor(sf, "want F8_E4M3 %v (the data cache's shape with head_dim/16 for head_dim/2 = %d)", want, t.Shape[4])
	}
	return kernels.PagedKVCache{Geometry: g, Data: append([]byte(nil), t.Data...), SF: append([]byte(nil), sf.Data...)}, nil
}

// globalScales reads k_scale and v_scale: positive finite, as FlashInfer
// requires (0 is not "1" here: FlashInfer refuses it).
func (x *exec) globalScales() (k, v float64, err error) {
	for _, s := range []struct {
		name string
		dst  *float64
	}{{"k_scale", &k}, {"v_scale", &v}} {
		raw, ok := x.p.meta[s.name]
		if !ok {
			return 0, 0, fmt.Errorf("%w: op %s needs parameter %s", ErrBadCase, x.c.Op, s.name)
		}
		if *s.dst, err = x.p.floatOr(s.name, 0); err != nil {
			return 0, 0, err
		}
		if !(*s.dst > 0) || math.IsInf(*s.dst, 0) {
			return 0, 0, x.p.bad(s.name, raw, "want a positive finite global scale")
		}
	}
	return k, v, nil
}

func runNVFP4Append(x *exec) (map[string]safetensors.Tensor, error) {
	cache, err := x.nvfp4Cache()
	if err != nil {
		return nil, err
	}
	p := kernels.AppendParams{Cache: cache}
	if p.KScale, p.VScale, err = x.globalScales(); err != nil {
		return nil, err
	}
	if err := x.runAppendRows(&p); err != nil {
		return nil, err
	}
	in, sf := x.tensor("in.paged_kv_cache"), x.tensor("in.kv_cache_sf")
	return map[string]safetensors.Tensor{
		"paged_kv_cache": {Name: "paged_kv_cache", DType: in.DType, Shape: in.Shape, Data: p.Cache.Data},
		"kv_cache_sf":    {Name: "kv_cache_sf", DType: sf.DType, Shape: sf.Shape, Data: p.Cache.SF},
	}, nil
}
