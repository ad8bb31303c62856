package disk

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// storeDir is the store's directory, opened once: LOCK and the segment
// files are opened relative to it (openat), so a file the store opens is
// always an entry of this directory, whatever its path names later.
type storeDir struct {
	path string
	fd   int
}

// openStoreDir opens the directory at path (following links in path
// itself: the caller names the directory).
func openStoreDir(path string) (*storeDir, error) {
	var fd int
	err := ignoringEINTR(func() (err error) {
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return &storeDir{path: path, fd: fd}, nil
}

func (d *storeDir) close() error { return unix.Close(d.fd) }

// openFile opens the directory's entry name read-write, creating it as a
// regular file if it is missing. It never follows a symbolic link
// (O_NOFOLLOW: a link is refused, dangling or not, and nothing is created
// where it points) and refuses anything but a regular file (checked on
// the opened file), by ErrNotRegularFile naming the path and what it is.
// O_NONBLOCK keeps a named pipe from blocking the open; it is cleared
// before the file is used.
func (d *storeDir) openFile(name string) (*os.File, error) {
	path := filepath.Join(d.path, name)
	var fd int
	err := ignoringEINTR(func() (err error) {
		fd, err = unix.Openat(d.fd, name, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o644)
		return err
	})
	if err != nil {
		if kind := d.kind(name); kind != "" && kind != "a regular file" {
			return nil, fmt.Errorf("%w: %s is %s", ErrNotRegularFile, path, kind)
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: %s is %s", ErrNotRegularFile, path, modeKind(st.Mode))
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "fcntl", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// exists reports whether the directory has an entry name of any kind (a
// link is not followed).
func (d *storeDir) exists(name string) bool {
	var st unix.Stat_t
	return unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
}

// kind names what the entry name is ("" if it cannot be read), a link
// with its target.
func (d *storeDir) kind(name string) string {
	var st unix.Stat_t
	if unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
		return ""
	}
	k := modeKind(st.Mode)
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		buf := make([]byte, 4096)
		if n, err := unix.Readlinkat(d.fd, name, buf); err == nil {
			k += fmt.Sprintf(" (to %q)", buf[:n])
		}
	}
	return k
}

// modeKind names a file type of a stat mode.
func modeKind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "a regular file"
	case unix.S_IFLNK:
		return "a symbolic link"
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFIFO:
		return "a named pipe"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	}
	return fmt.Sprintf("a file of type %#o", mode&unix.S_IFMT)
}

func ignoringEINTR(f func() error) error {
	for {
		if err := f(); err != unix.EINTR {
			return err
		}
	}
}

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

// lockFile takes an exclusive advisory lock on f; the kernel drops it when
// the process dies (kill -9 included). A lock held elsewhere is refused
// once it has stayed held for lockGrace: a child this process starts (an
// exec.Command on any goroutine) holds a copy of every descriptor between
// its fork and its exec, the lock of a store just closed included, so a
// lock that frees that soon was only held by such a copy.
func lockFile(f *os.File) error {
	deadline := time.Now().Add(lockGrace)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(time.Millisecond)
	}
}

// lockGrace is how long lockFile waits for a held lock.
const lockGrace = 200 * time.Millisecond

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
