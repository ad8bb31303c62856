//go:build !linux

package disk

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// storeDir is the store's directory, opened once as an os.Root: LOCK and
// the segment files are opened within it, so no link can lead outside.
type storeDir struct {
	path string
	root *os.Root
}

func openStoreDir(path string) (*storeDir, error) {
	r, err := os.OpenRoot(path)
	if err != nil {
		return nil, err
	}
	return &storeDir{path: path, root: r}, nil
}

func (d *storeDir) close() error { return d.root.Close() }

// openFile opens the directory's entry name read-write, creating it if
// missing; anything but a regular file (a link, checked before the open,
// or what the open found) is refused by ErrNotRegularFile.
func (d *storeDir) openFile(name string) (*os.File, error) {
	path := filepath.Join(d.path, name)
	if fi, err := d.root.Lstat(name); err == nil && !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is %s", ErrNotRegularFile, path, fileModeKind(fi.Mode()))
	}
	f, err := d.root.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%w: %s is %s", ErrNotRegularFile, path, fileModeKind(fi.Mode()))
	}
	return f, nil
}

func (d *storeDir) exists(name string) bool {
	_, err := d.root.Lstat(name)
	return err == nil
}

func fileModeKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "not a regular file"
}

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
