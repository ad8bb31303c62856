package golden

import (
	"fmt"

	"github.com/pagedkv/pagedkv/cascade"
	"github.com/pagedkv/pagedkv/internal/safetensors"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// cascade_attention runs cascade.Run (FlashInfer's
// MultiLevelCascadeAttentionWrapper) on the backend: a batch prefill per
// level and merge_state between them, so a backend without prefill reports
// the whole case as unsupported.

func init() {
	register("cascade_attention", &opSpec{
		inputs:      []string{"q", "paged_kv_cache"},
		optional:    []string{"sinks"},
		levelInputs: []string{"qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len"},
		outputs:     []string{"o"},
		params:      []string{"num_levels", "kv_layout", "page_size", "num_qo_heads", "num_kv_heads", "head_dim", "sm_scale", "causal"},
		backend:     true,
		run:         runCascade,
	})
}

func runCascade(x *exec) (map[string]safetensors.Tensor, error) {
	q, cache, a, err := x.attention()
	if err != nil {
		return nil, err
	}
	causal, err := x.p.boolOr("causal", false)
	if err != nil {
		return nil, err
	}
	levels, err := x.p.intReq("num_levels") // range-checked by checkCase
	if err != nil {
		return nil, err
	}
	p := cascade.Params{Q: q, Cache: cache, Causal: causal, AttentionParams: a,
		O: kernels.NewTensor(layout.F32, q.Shape...)}
	for l := 0; l < levels; l++ {
		suffix := fmt.Sprintf(".%d", l)
		qoIndptr, err := x.indices("in.qo_indptr" + suffix)
		if err != nil {
			return nil, err
		}
		t, err := x.pageTable(suffix)
		if err != nil {
			return nil, err
		}
		p.Levels = append(p.Levels, cascade.Level{QOIndptr: qoIndptr, KVIndptr: t.KVIndptr, KVPageIndices: t.KVPageIndices, KVLastPageLen: t.KVLastPageLen})
	}
	if err := cascade.Run(x.b, &p); err != nil {
		return nil, err
	}
	return map[string]safetensors.Tensor{"o": outTensor("o", p.O)}, nil
}
