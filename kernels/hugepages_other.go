//go:build !linux

package kernels

// newHostBytes returns n zero bytes for a paged K/V buffer (see the Linux
// version for the huge-page advice other systems do without).
func newHostBytes(n int) []byte { return make([]byte, n) }
