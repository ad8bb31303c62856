package disk

import (
	"errors"
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
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

// preadv reads from f at off into bufs in order, with as few preadv calls
// as it takes (a short read continues where it stopped).
func preadv(f *os.File, bufs [][]byte, off int64) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	for len(bufs) > 0 {
		var n int
		var rerr error
		if err := sc.Read(func(fd uintptr) bool {
			n, rerr = unix.Preadv(int(fd), bufs, off)
			return true
		}); err != nil {
			return err
		}
		if rerr != nil {
			return rerr
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
		}
		off += int64(n)
		for n > 0 && len(bufs) > 0 {
			if n < len(bufs[0]) {
				bufs[0] = bufs[0][n:]
				n = 0
				break
			}
			n -= len(bufs[0])
			bufs = bufs[1:]
		}
	}
	return nil
}
