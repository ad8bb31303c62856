//go:build !linux

package kernels

// newTensorBytes returns n zero bytes for a paged K/V buffer (see the Linux
// version for the huge-page advice other systems do without).
func newTensorBytes(n int) []byte { return make([]byte, n) }
