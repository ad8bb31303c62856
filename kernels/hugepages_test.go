package kernels

import "testing"

// TestNewTensorBytes: buffers below, at and above the huge-page threshold are
// zero, of the asked length, and writable end to end.
func TestNewTensorBytes(t *testing.T) {
	for _, n := range []int{0, 1, 2*hugePage - 1, 2 * hugePage, 3*hugePage + 12345} {
		b := newTensorBytes(n)
		if len(b) != n {
			t.Fatalf("newTensorBytes(%d) has length %d", n, len(b))
		}
		for i, x := range b {
			if x != 0 {
				t.Fatalf("newTensorBytes(%d)[%d] = %d, want 0", n, i, x)
			}
		}
		for i := range b {
			b[i] = byte(i)
		}
	}
}
