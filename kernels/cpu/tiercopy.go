package cpu

import (
	"fmt"

	"github.com/pagedkv/pagedkv/kernels"
)

// Tier copies: one page of one layer's paged cache to or from host memory,
// K plane then V plane (the byte format of tier.PageFormat, one layer). A
// page's K (and V) elements are contiguous in both NHD and HND, so each
// copy is two memmoves.

// CopyPageToHost copies every K and V element of page of c into dst, K
// plane first; dst must hold exactly 2 planes (2*N*H*D elements).
func CopyPageToHost(dst []byte, c *kernels.PagedKVCache, page int) error {
	k, v, err := pagePlanes(c, page, len(dst))
	if err != nil {
		return err
	}
	n := copy(dst, k)
	copy(dst[n:], v)
	return nil
}

// CopyPageFromHost copies src (a page from [CopyPageToHost]) into page of c.
func CopyPageFromHost(c *kernels.PagedKVCache, page int, src []byte) error {
	k, v, err := pagePlanes(c, page, len(src))
	if err != nil {
		return err
	}
	n := copy(k, src)
	copy(v, src[n:])
	return nil
}

// pagePlanes returns page's K and V planes in c, checking the page and the
// host buffer's length.
func pagePlanes(c *kernels.PagedKVCache, page, hostBytes int) (k, v []byte, err error) {
	if err := c.Validate(); err != nil {
		return nil, nil, err
	}
	g := c.Geometry
	if page < 0 || page >= g.NumPages {
		return nil, nil, fmt.Errorf("%w: page %d outside the pool [0, %d)", kernels.ErrIndexOutOfRange, page, g.NumPages)
	}
	es := int64(g.DType.Size())
	plane := g.PlaneElements() * es
	if int64(hostBytes) != 2*plane {
		return nil, nil, fmt.Errorf("%w: host page of %d bytes, want 2 planes of %d", kernels.ErrInvalidTensor, hostBytes, plane)
	}
	ko, vo := g.KOffset(page, 0, 0, 0)*es, g.VOffset(page, 0, 0, 0)*es
	return c.KBuf()[ko : ko+plane], c.VBuf()[vo : vo+plane], nil
}
