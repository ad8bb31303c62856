package cuda

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/layout"
)

// TestNVFP4Plans: an NVFP4 decode always plans the CUDA-core kernel (the
// tensor-core decode takes no NVFP4 cache, whatever the group: planDecodeTC
// declines and the planner keeps planDecodeShape's choice), with at least 2
// features per lane (whole code bytes); a prefill plans the tiled kernel at
// head_dim 64, 128 and 256 and the per-row decode kernel otherwise; the
// shared-memory rows hold the code bytes and the scales.
func TestNVFP4Plans(t *testing.T) {
	for _, d := range []int{16, 32, 48, 64, 128, 256} {
		for _, group := range []int{1, 2, 8, 16} {
			g := layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.NVFP4, PageSize: 16, NumPages: 4, NumKVHeads: 2, HeadDim: d}
			_, tc := planDecodeTC(g, group)
			assert.False(t, tc, "d%d group %d: the tensor-core decode took an nvfp4 cache", d, group)
			sh, err := planDecodeShape(g, group)
			require.NoError(t, err)
			vec := max(2, (d+31)/32)
			for vec&(vec-1) != 0 {
				vec++
			}
			assert.Equal(t, fmt.Sprintf("batch_decode_paged_nvfp4_v%d", vec), sh.kernel, "d%d", d)
			assert.Equal(t, (d/2+d/16+15)/16*16, sh.pitch, "d%d: a tile row is the codes, then the scales", d)
			k, err := PrefillKernel(g, group*g.NumKVHeads)
			require.NoError(t, err)
			if d == 64 || d == 128 || d == 256 {
				assert.Equal(t, fmt.Sprintf("batch_prefill_paged_nvfp4_d%d", d), k)
			} else {
				assert.Equal(t, sh.kernel, k)
			}
			assert.Contains(t, KernelArity, k)
		}
	}
	// The cache bytes the bound counts: d/2 code bytes and d/16 scale bytes
	// per head row.
	g := layout.Paged{Layout: layout.HND, Form: layout.Split, DType: layout.NVFP4, PageSize: 16, NumPages: 4, NumKVHeads: 2, HeadDim: 128}
	assert.Equal(t, int64(2*3*2*(64+8)), AppendCacheBytes(g, 3))
}
