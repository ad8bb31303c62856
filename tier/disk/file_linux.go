package disk

import (
	"errors"
	"os"
	"syscall"
)

// preallocate reserves size bytes for f on disk (fallocate), so slot writes
// never fail for lack of space; filesystems without fallocate get a sparse
// file of that size instead.
func preallocate(f *os.File, size int64) error {
	err := syscall.Fallocate(int(f.Fd()), 0, 0, size)
	if errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOSYS) {
		return f.Truncate(size)
	}
	return err
}

// lockFile takes an exclusive advisory lock on f without waiting; the
// kernel drops it when the process dies (kill -9 included).
func lockFile(f *os.File) error {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
}
