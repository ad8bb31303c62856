//go:build !linux

package disk

import (
	"os"
)

// preallocate sizes f (sparse where the filesystem allows).
func preallocate(f *os.File, size int64) error { return f.Truncate(size) }

// lockFile does nothing off Linux: one process per directory is the
// caller's duty there.
func lockFile(*os.File) error { return nil }

// preadv reads from f at off into bufs in order, one ReadAt each.
func preadv(f *os.File, bufs [][]byte, off int64) error {
	for _, b := range bufs {
		if _, err := f.ReadAt(b, off); err != nil {
			return err
		}
		off += int64(len(b))
	}
	return nil
}
