package safetensors

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Limits of the reader. Both are far above anything the reference cases
// need; they exist so that a hostile file cannot make the reader allocate or
// loop in proportion to a number it merely declares.
const (
	// MaxHeaderBytes bounds the JSON header (the Rust implementation uses the
	// same 100 MB bound).
	MaxHeaderBytes = 100 << 20
	// MaxFileBytes bounds a file [ReadFile] reads (1 GiB: the largest
	// shipped case is under 2 MiB).
	MaxFileBytes = 1 << 30
	// MaxRank bounds the number of dimensions of a tensor.
	MaxRank = 16
	// MetadataKey is the reserved header entry holding the string metadata.
	MetadataKey = "__metadata__"
)

// Sentinel errors; every error of this package wraps exactly one of them and
// is an [*Error].
var (
	// ErrMalformed: the bytes do not follow the safetensors format (or break
	// one of the invariants in the package doc).
	ErrMalformed = errors.New("malformed safetensors file")
	// ErrUnknownDType: a tensor has a dtype this package does not accept.
	ErrUnknownDType = errors.New("unknown dtype")
	// ErrHeaderTooLarge: the header is longer than MaxHeaderBytes.
	ErrHeaderTooLarge = errors.New("header too large")
	// ErrNotRegular: [ReadBounded] was given a device, FIFO, socket or
	// directory (after symlinks), which it refuses to read.
	ErrNotRegular = errors.New("not a regular file")
	// ErrFileTooLarge: the file is larger than the limit [ReadBounded]
	// was given.
	ErrFileTooLarge = errors.New("file too large")
)

// Error is the error type of this package. Tensor is the tensor it concerns
// ("" when none).
type Error struct {
	Tensor string
	Err    error // one of the sentinels above
	Msg    string
}

func (e *Error) Error() string {
	if e.Tensor != "" {
		return fmt.Sprintf("safetensors: tensor %q: %s", e.Tensor, e.Msg)
	}
	return "safetensors: " + e.Msg
}

// Unwrap returns the sentinel.
func (e *Error) Unwrap() error { return e.Err }

func malformed(tensor, format string, args ...any) error {
	return &Error{Tensor: tensor, Err: ErrMalformed, Msg: fmt.Sprintf(format, args...)}
}

// Tensor is one named tensor. Data holds product(Shape)*DType.Size() bytes,
// row-major and little-endian.
type Tensor struct {
	Name  string
	DType DType
	Shape []int
	Data  []byte
}

// NumElements is the product of the shape (1 for a scalar).
func (t Tensor) NumElements() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// File is a parsed safetensors file.
type File struct {
	// Metadata is the "__metadata__" map (empty, not nil, when absent).
	Metadata map[string]string
	// Tensors are sorted by name.
	Tensors []Tensor
}

// Tensor returns the tensor called name.
func (f *File) Tensor(name string) (Tensor, bool) {
	i := sort.Search(len(f.Tensors), func(i int) bool { return f.Tensors[i].Name >= name })
	if i < len(f.Tensors) && f.Tensors[i].Name == name {
		return f.Tensors[i], true
	}
	return Tensor{}, false
}

// ReadFile reads and parses the file at path (see [ReadBounded] for the
// files it refuses). The whole file is read into memory once; the tensors
// alias that buffer.
func ReadFile(path string) (*File, error) {
	buf, err := ReadBounded(path, MaxFileBytes)
	if err != nil {
		return nil, err
	}
	f, err := Parse(buf)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// ReadBounded returns the bytes of the file at path, refusing, before it
// reads a byte, anything but a regular file (after symlinks: a device such
// as /dev/zero, a FIFO, a directory) and a file of more than maxBytes. A
// file that grows past its stated size while being read is refused too,
// so no more than maxBytes+1 bytes are ever held. Errors name the path
// and wrap [ErrNotRegular] or [ErrFileTooLarge].
func ReadBounded(path string, maxBytes int64) ([]byte, error) {
	// Stat before Open: opening a FIFO blocks until a writer comes.
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if err := checkRegular(path, st, maxBytes); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// The file may have been replaced between Stat and Open.
	if st, err = f.Stat(); err != nil {
		return nil, err
	}
	if err := checkRegular(path, st, maxBytes); err != nil {
		return nil, err
	}
	buf := make([]byte, st.Size()+1) // the extra byte shows a file that grew
	n, err := io.ReadFull(f, buf)
	switch {
	case err == nil:
		return nil, fmt.Errorf("%s: %w: it grew past its size of %d bytes while being read", path, ErrFileTooLarge, st.Size())
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return buf[:n], nil
	}
	return nil, fmt.Errorf("%s: %w", path, err)
}

func checkRegular(path string, st os.FileInfo, maxBytes int64) error {
	switch {
	case !st.Mode().IsRegular():
		return fmt.Errorf("%s: %w (%s): refusing to read it", path, ErrNotRegular, fileKind(st.Mode()))
	case st.Size() > maxBytes:
		return fmt.Errorf("%s: %w: %d bytes exceeds the limit of %d bytes", path, ErrFileTooLarge, st.Size(), maxBytes)
	}
	return nil
}

// fileKind names the kind of a file that is not regular.
func fileKind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeCharDevice != 0:
		return "a character device"
	case m&os.ModeDevice != 0:
		return "a block device"
	case m&os.ModeNamedPipe != 0:
		return "a FIFO"
	case m&os.ModeSocket != 0:
		return "a socket"
	}
	return "mode " + m.Type().String()
}

// Parse parses a whole safetensors file held in buf. The returned tensors
// alias buf. See the package doc for what is checked.
func Parse(buf []byte) (*File, error) {
	if len(buf) < 8 {
		return nil, malformed("", "file is %d bytes, shorter than the 8-byte header length", len(buf))
	}
	n := binary.LittleEndian.Uint64(buf[:8])
	if n > MaxHeaderBytes && len(buf) > 8 && buf[8] != '{' {
		// A header is a JSON object, so byte 8 is '{' (the Rust
		// implementation requires it too): a text file is named as what
		// it is, not as the huge header length its first 8 bytes read as.
		return nil, malformed("", "not a safetensors file: byte 8 is %q, where a header begins with '{' after the 8-byte length prefix", buf[8])
	}
	if n > MaxHeaderBytes {
		return nil, &Error{Err: ErrHeaderTooLarge, Msg: fmt.Sprintf("header length %d exceeds the limit of %d bytes", n, MaxHeaderBytes)}
	}
	if n > uint64(len(buf)-8) {
		return nil, malformed("", "header length %d exceeds the %d bytes that follow the length prefix", n, len(buf)-8)
	}
	header, data := buf[8:8+n], buf[8+n:]
	entries, meta, err := parseHeader(header)
	if err != nil {
		return nil, err
	}
	f := &File{Metadata: meta, Tensors: make([]Tensor, 0, len(entries))}
	for i := range entries {
		t, err := entries[i].tensor(data)
		if err != nil {
			return nil, err
		}
		f.Tensors = append(f.Tensors, t)
	}
	slices.SortFunc(f.Tensors, func(a, b Tensor) int { return strings.Compare(a.Name, b.Name) })
	for i := 1; i < len(f.Tensors); i++ {
		if f.Tensors[i].Name == f.Tensors[i-1].Name {
			return nil, malformed(f.Tensors[i].Name, "appears twice in the header")
		}
	}
	if err := checkTiling(entries, len(data)); err != nil {
		return nil, err
	}
	return f, nil
}

// tensor validates e against the data section and returns the tensor it
// declares.
func (e *entry) tensor(data []byte) (Tensor, error) {
	if e.begin > e.end || e.end > uint64(len(data)) {
		return Tensor{}, malformed(e.name, "data_offsets [%d, %d] out of range: the data section is %d bytes", e.begin, e.end, len(data))
	}
	length := e.end - e.begin
	if need, ok := byteSize(e.shape, e.dtype.Size()); !ok || need != length {
		return Tensor{}, malformed(e.name, "shape %v of %v needs %s bytes but data_offsets [%d, %d] hold %d",
			e.shape, e.dtype, byteCount(e.shape, e.dtype.Size()), e.begin, e.end, length)
	}
	return Tensor{Name: e.name, DType: e.dtype, Shape: e.shape, Data: data[e.begin:e.end:e.end]}, nil
}

// byteSize is size*product(shape); ok is false when that overflows uint64.
func byteSize(shape []int, size int) (n uint64, ok bool) {
	for _, d := range shape {
		if d == 0 {
			return 0, true
		}
	}
	n = uint64(size)
	for _, d := range shape {
		if n > math.MaxUint64/uint64(d) {
			return 0, false
		}
		n *= uint64(d)
	}
	return n, true
}

// byteCount prints byteSize, or "more than 2^64".
func byteCount(shape []int, size int) string {
	if n, ok := byteSize(shape, size); ok {
		return strconv.FormatUint(n, 10)
	}
	return "more than 2^64"
}

// checkTiling checks that the byte ranges cover [0, dataLen) exactly, with
// no overlap and no gap.
func checkTiling(entries []entry, dataLen int) error {
	order := make([]int, len(entries))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		ea, eb := &entries[a], &entries[b]
		if c := cmp.Compare(ea.begin, eb.begin); c != 0 {
			return c
		}
		return cmp.Compare(ea.end, eb.end)
	})
	var pos uint64
	prev := ""
	for _, i := range order {
		e := &entries[i]
		switch {
		case e.begin < pos:
			return malformed(e.name, "data_offsets [%d, %d] overlap tensor %q, which ends at %d", e.begin, e.end, prev, pos)
		case e.begin > pos && prev == "":
			return malformed(e.name, "data_offsets [%d, %d] leave bytes [0, %d) of the data section unused", e.begin, e.end, e.begin)
		case e.begin > pos:
			return malformed(e.name, "data_offsets [%d, %d] leave a gap of %d bytes after tensor %q", e.begin, e.end, e.begin-pos, prev)
		}
		pos, prev = e.end, e.name
	}
	if pos != uint64(dataLen) {
		return malformed("", "the tensors cover %d bytes but the data section holds %d", pos, dataLen)
	}
	return nil
}
