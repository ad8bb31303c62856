package kernelstest

import (
	"fmt"
	"testing"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// AttnShape is one chosen attention configuration, for sweeps that must
// cover given shapes (a kernel's dtypes, head dims and GQA groups) rather
// than random draws: the cache geometry (NumPages is set from Lens), the
// GQA group, the request lengths, the q and o dtypes, the window and the
// soft cap. Values are uniform in [-1, 1] (fp8 caches store x/scale with
// the scales the random suites use), and every slot that holds no token is
// NaN, as in the random suites.
type AttnShape struct {
	Geometry       layout.Paged
	Group          int
	Lens           []int
	QDType, ODType layout.DType
	WindowLeft     int
	SoftCap        float64
	Seed           uint64
}

func (s AttnShape) String() string {
	return fmt.Sprintf("%v/%v N=%d D=%d H=%d group=%d window=%d cap=%g", s.Geometry.Layout, s.Geometry.DType,
		s.Geometry.PageSize, s.Geometry.HeadDim, s.Geometry.NumKVHeads, s.Group, s.WindowLeft, s.SoftCap)
}

func (s AttnShape) config(t *testing.T) *attnConfig {
	rng := seededRNG(t, s.Seed)
	a := &attnConfig{hq: s.Geometry.NumKVHeads * s.Group, qdt: s.QDType, odt: s.ODType, withLSE: true}
	a.ap = kernels.AttentionParams{NumQOHeads: a.hq, WindowLeft: s.WindowLeft, LogitsSoftCap: s.SoftCap}
	kScale, vScale := 1.0, 1.0
	if s.Geometry.DType == layout.E4M3 || s.Geometry.DType == layout.E5M2 {
		kScale, vScale = 1.0/64, 1.0/32
		a.ap.KScale, a.ap.VScale = kScale, vScale
	}
	a.c = pagedFromTokens(rng, s.Geometry, s.Lens, 1, func(b, t, kv, h, d int) float64 {
		x := 2*rng.Float64() - 1
		if kv == 0 {
			return x / kScale
		}
		return x / vScale
	})
	return a
}

// RunDecodeShape runs b.BatchDecode on shape s and compares o and lse with
// the reference model.
func RunDecodeShape(t *testing.T, b kernels.Backend, s AttnShape) {
	t.Helper()
	a := s.config(t)
	runDecodeCase(t, b, seededRNG(t, s.Seed+1), a, s.String())
}

// RunPrefillShape runs b.BatchPrefill (causal) on shape s and compares o
// and lse with the reference model.
func RunPrefillShape(t *testing.T, b kernels.Backend, s AttnShape) {
	t.Helper()
	a := s.config(t)
	runPrefillCase(t, b, seededRNG(t, s.Seed+1), a, true, s.String())
}
