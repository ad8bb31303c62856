//go:build !linux

package disk

import (
	"os"
)

// preallocate sizes f (sparse where the filesystem allows).
func preallocate(f *os.File, size int64) error { return f.Truncate(size) }

// dropCache does nothing off Linux.
func dropCache(*os.File) {}

// lockFile does nothing off Linux: one process per directory is the
// caller's duty there.
func lockFile(*os.File) error { return nil }

// vecIO is one vectored read or write at a file offset; off Linux each
// buffer is its own ReadAt or WriteAt.
type vecIO struct {
	bufs [][]byte
}

// init makes room for n buffers.
func (v *vecIO) init(n int) { v.bufs = make([][]byte, 0, n) }

func (v *vecIO) reset() { v.bufs = v.bufs[:0] }

func (v *vecIO) add(b []byte) {
	if len(b) > 0 {
		v.bufs = append(v.bufs, b)
	}
}

func (v *vecIO) readAt(f *os.File, off int64) error { return v.each(f.ReadAt, off) }

func (v *vecIO) writeAt(f *os.File, off int64) error { return v.each(f.WriteAt, off) }

// each moves the buffers in order from off on, one call each.
func (v *vecIO) each(move func([]byte, int64) (int, error), off int64) error {
	for _, b := range v.bufs {
		if _, err := move(b, off); err != nil {
			return err
		}
		off += int64(len(b))
	}
	return nil
}
