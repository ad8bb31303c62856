package cpu

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// A page copied to host and back into another page is bit-exact, for every
// cache dtype, layout and tensor form, and touches no other page.
func TestTierCopyRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	for _, dt := range []layout.DType{layout.F32, layout.F16, layout.BF16, layout.E4M3, layout.E5M2} {
		for _, kl := range []layout.KVLayout{layout.NHD, layout.HND} {
			for _, form := range []layout.TensorForm{layout.Fused, layout.Split} {
				g := layout.Paged{Layout: kl, Form: form, DType: dt, NumPages: 3, PageSize: 5, NumKVHeads: 2, HeadDim: 4}
				c, err := kernels.NewPagedKVCache(g)
				require.NoError(t, err)
				for _, b := range [][]byte{c.Data, c.K, c.V} {
					for i := range b {
						b[i] = byte(rng.Uint32())
					}
				}
				es := dt.Size()
				host := make([]byte, 2*int(g.PlaneElements())*es)
				require.NoError(t, CopyPageToHost(host, &c, 0))
				// The host page is K plane then V plane, element for element.
				for e := range g.PageSize {
					for h := range g.NumKVHeads {
						for f := range g.HeadDim {
							i := int(g.KOffset(0, e, h, f)-g.KOffset(0, 0, 0, 0)) * es
							require.Equal(t, c.KBuf()[int(g.KOffset(0, e, h, f))*es], host[i])
							require.Equal(t, c.VBuf()[int(g.VOffset(0, e, h, f))*es], host[int(g.PlaneElements())*es+i])
						}
					}
				}
				page1 := append([]byte(nil), c.KBuf()[int(g.KOffset(1, 0, 0, 0))*es:int(g.KOffset(2, 0, 0, 0))*es]...)
				require.NoError(t, CopyPageFromHost(&c, 2, host))
				back := make([]byte, len(host))
				require.NoError(t, CopyPageToHost(back, &c, 2))
				require.Equal(t, host, back, "%v %v %v", dt, kl, form)
				require.Equal(t, page1, c.KBuf()[int(g.KOffset(1, 0, 0, 0))*es:int(g.KOffset(2, 0, 0, 0))*es], "page 1 untouched")
				require.ErrorIs(t, CopyPageToHost(host, &c, 3), kernels.ErrIndexOutOfRange)
				require.ErrorIs(t, CopyPageFromHost(&c, 0, host[1:]), kernels.ErrInvalidTensor)
			}
		}
	}
}

// BenchmarkTierCopy: one layer's page (16 tokens, 8 K/V heads, head dim
// 128, f16: 64 KiB of K and V) to host and back, against memmove of the
// same bytes (the physical limit of a CPU copy).
func BenchmarkTierCopy(b *testing.B) {
	for _, kl := range []layout.KVLayout{layout.NHD, layout.HND} {
		g := layout.Paged{Layout: kl, Form: layout.Fused, DType: layout.F16, NumPages: 64, PageSize: 16, NumKVHeads: 8, HeadDim: 128}
		c, err := kernels.NewPagedKVCache(g)
		require.NoError(b, err)
		host := make([]byte, 2*g.PlaneElements()*2)
		b.Run("to-host/"+kl.String(), func(b *testing.B) {
			b.SetBytes(int64(len(host)))
			b.ReportAllocs()
			for i := range b.N {
				if err := CopyPageToHost(host, &c, i%64); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("from-host/"+kl.String(), func(b *testing.B) {
			b.SetBytes(int64(len(host)))
			b.ReportAllocs()
			for i := range b.N {
				if err := CopyPageFromHost(&c, i%64, host); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	src := make([]byte, 64*2*16*8*128*2)
	dst := make([]byte, 2*16*8*128*2)
	b.Run("memmove", func(b *testing.B) {
		b.SetBytes(int64(len(dst)))
		for i := range b.N {
			off := (i % 64) * len(dst)
			copy(dst, src[off:off+len(dst)])
		}
	})
}
