//go:build !linux

package disk

import "os"

// preallocate sizes f (sparse where the filesystem allows).
func preallocate(f *os.File, size int64) error { return f.Truncate(size) }

// lockFile does nothing off Linux: one process per directory is the
// caller's duty there.
func lockFile(*os.File) error { return nil }
