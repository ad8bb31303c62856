package disk

import (
	"errors"
	"io"
	"os"
	"syscall"
	"unsafe"

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

// dropCache asks the kernel to drop f's clean pages from the page cache
// (posix_fadvise DONTNEED); it is only a hint, so its error is ignored.
func dropCache(f *os.File) {
	_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

// lockFile takes an exclusive advisory lock on f without waiting; the
// kernel drops it when the process dies (kill -9 included).
func lockFile(f *os.File) error {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
}

// vecIO is one vectored read or write at a file offset: the buffers in
// order, kept as the kernel's iovecs so that a call allocates nothing.
// Each goroutine doing I/O (Fetch, the writer) has its own.
type vecIO struct {
	iovs []unix.Iovec
}

// init makes room for n buffers.
func (v *vecIO) init(n int) { v.iovs = make([]unix.Iovec, 0, n) }

func (v *vecIO) reset() { v.iovs = v.iovs[:0] }

func (v *vecIO) add(b []byte) {
	if len(b) == 0 {
		return
	}
	iov := unix.Iovec{Base: &b[0]}
	iov.SetLen(len(b))
	v.iovs = append(v.iovs, iov)
}

// longBits splits an offset into the two words preadv and pwritev take.
const longBits = 32 << (^uintptr(0) >> 63)

// do runs preadv (write false) or pwritev of the vector at off on fd until
// every byte is moved, continuing after short transfers and EINTR.
func (v *vecIO) do(fd int, off int64, write bool) error {
	trap := uintptr(unix.SYS_PREADV)
	if write {
		trap = unix.SYS_PWRITEV
	}
	iovs := v.iovs
	for len(iovs) > 0 {
		n := min(len(iovs), maxIovecs)
		r, _, errno := unix.Syscall6(trap, uintptr(fd), uintptr(unsafe.Pointer(&iovs[0])), uintptr(n),
			uintptr(off), uintptr(uint64(off)>>(longBits-1)>>1), 0)
		switch {
		case errno == unix.EINTR:
			continue
		case errno != 0:
			return errno
		case r == 0:
			return io.ErrUnexpectedEOF
		}
		off += int64(r)
		for left := uint64(r); left > 0; {
			if l := iovs[0].Len; left < l {
				iovs[0].Base = (*byte)(unsafe.Add(unsafe.Pointer(iovs[0].Base), left))
				iovs[0].Len = l - left
				break
			}
			left -= iovs[0].Len
			iovs = iovs[1:]
		}
	}
	return nil
}

// readAt reads the vector from f at off (preadv).
func (v *vecIO) readAt(f *os.File, off int64) error {
	return v.do(int(f.Fd()), off, false)
}

// writeAt writes the vector to f at off (pwritev).
func (v *vecIO) writeAt(f *os.File, off int64) error {
	return v.do(int(f.Fd()), off, true)
}
