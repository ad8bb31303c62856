package ragged

import (
	"fmt"
	"strings"
)

// MaxDenseCells bounds a materialised mask: Rows*Cols must not exceed it
// (1 GiB of bools). Larger masks are an error wrapping [ErrTooLarge]; use the
// packed form instead.
const MaxDenseCells = 1 << 30

// Dense is a materialised boolean attention mask, row-major: Allowed[r*Cols+c]
// is true when query row r may attend key column c (xFormers' 0 entry,
// FlashInfer's 1 bit). It is a plain value: len(Allowed) == Rows*Cols is the
// only invariant, and methods panic if a caller breaks it.
type Dense struct {
	Rows, Cols int    // query rows, key columns
	Allowed    []bool // [Rows*Cols], row-major
}

// NewDense returns an all-masked rows×cols matrix.
func NewDense(rows, cols int) (Dense, error) {
	if rows < 0 || cols < 0 {
		return Dense{}, fmt.Errorf("%w: dense shape %d×%d", ErrNegativeLength, rows, cols)
	}
	if n, ok := mulFits(rows, cols, 1); !ok || n > MaxDenseCells {
		return Dense{}, fmt.Errorf("%w: dense shape %d×%d exceeds MaxDenseCells = %d", ErrTooLarge, rows, cols, MaxDenseCells)
	}
	return Dense{Rows: rows, Cols: cols, Allowed: make([]bool, rows*cols)}, nil
}

func (d Dense) check() {
	if d.Rows < 0 || d.Cols < 0 || len(d.Allowed) != d.Rows*d.Cols {
		panic(fmt.Sprintf("ragged: Dense %d×%d has %d cells", d.Rows, d.Cols, len(d.Allowed)))
	}
}

// At reports whether row r may attend column c. It panics when (r, c) is
// outside the matrix.
func (d Dense) At(r, c int) bool {
	d.check()
	if r < 0 || r >= d.Rows || c < 0 || c >= d.Cols {
		panic(fmt.Sprintf("ragged: Dense.At(%d, %d) outside %d×%d", r, c, d.Rows, d.Cols))
	}
	return d.Allowed[r*d.Cols+c]
}

// ParseDense reads a mask drawn as a grid: rows are separated by newlines or
// '/', a cell is 'x' or '1' (allowed) or '.' or '0' (masked), and spaces and
// tabs are ignored, so "x . / x x" is the 2×2 causal mask. Blank rows are
// skipped, so a grid may start and end with a newline. Every row must have
// the same number of cells.
func ParseDense(grid string) (Dense, error) {
	var cells []bool
	rows, cols := 0, -1
	for _, line := range strings.FieldsFunc(grid, func(r rune) bool { return r == '\n' || r == '/' }) {
		n := 0
		for _, ch := range line {
			switch ch {
			case ' ', '\t', '\r':
				continue
			case 'x', '1':
				cells = append(cells, true)
			case '.', '0':
				cells = append(cells, false)
			default:
				return Dense{}, fmt.Errorf("ragged: ParseDense: row %d has %q, want 'x', '1', '.' or '0'", rows, ch)
			}
			n++
		}
		if n == 0 {
			continue
		}
		if cols >= 0 && n != cols {
			return Dense{}, fmt.Errorf("%w: ParseDense: row %d has %d cells, row 0 has %d", ErrLengthMismatch, rows, n, cols)
		}
		cols = n
		rows++
	}
	if rows == 0 {
		return Dense{Allowed: []bool{}}, nil
	}
	return Dense{Rows: rows, Cols: cols, Allowed: cells}, nil
}

// String draws the mask in the grid syntax of [ParseDense]: one line per row,
// 'x' for allowed and '.' for masked.
func (d Dense) String() string {
	d.check()
	var sb strings.Builder
	sb.Grow(d.Rows * (d.Cols + 1))
	for r := 0; r < d.Rows; r++ {
		for _, ok := range d.Allowed[r*d.Cols : (r+1)*d.Cols] {
			if ok {
				sb.WriteByte('x')
			} else {
				sb.WriteByte('.')
			}
		}
		sb.WriteByte('\n')
	}
	return sb.String()
}

// Equal reports whether two masks have the same shape and cells.
func (d Dense) Equal(o Dense) bool {
	d.check()
	o.check()
	if d.Rows != o.Rows || d.Cols != o.Cols {
		return false
	}
	for i, v := range d.Allowed {
		if o.Allowed[i] != v {
			return false
		}
	}
	return true
}

// U8 returns the cells as 0/1 bytes, row-major (the golden cases' `allowed`
// tensor, and FlashInfer's boolean custom_mask for a single request).
func (d Dense) U8() []uint8 {
	d.check()
	out := make([]uint8, len(d.Allowed))
	for i, v := range d.Allowed {
		if v {
			out[i] = 1
		}
	}
	return out
}

// DenseFromU8 builds a rows×cols mask from row-major bytes, nonzero = allowed.
func DenseFromU8(rows, cols int, v []uint8) (Dense, error) {
	d, err := NewDense(rows, cols)
	if err != nil {
		return Dense{}, err
	}
	if len(v) != rows*cols {
		return Dense{}, fmt.Errorf("%w: %d bytes for a %d×%d mask", ErrLengthMismatch, len(v), rows, cols)
	}
	for i, b := range v {
		d.Allowed[i] = b != 0
	}
	return d, nil
}

// Diff returns "" when want and got are equal, and otherwise a picture of
// both with the differing cells marked, for test failures:
//
//	want   got    diff
//	x..    xx.    .!.
func Diff(want, got Dense) string {
	want.check()
	got.check()
	if want.Rows != got.Rows || want.Cols != got.Cols {
		return fmt.Sprintf("shape: want %d×%d, got %d×%d\nwant:\n%sgot:\n%s", want.Rows, want.Cols, got.Rows, got.Cols, want, got)
	}
	if want.Equal(got) {
		return ""
	}
	w := max(want.Cols, 4)
	var sb strings.Builder
	fmt.Fprintf(&sb, "%-*s  %-*s  %s\n", w, "want", w, "got", "diff")
	wl := strings.Split(want.String(), "\n")
	gl := strings.Split(got.String(), "\n")
	bad := 0
	for r := 0; r < want.Rows; r++ {
		mark := make([]byte, want.Cols)
		for c := range mark {
			mark[c] = '.'
			if want.Allowed[r*want.Cols+c] != got.Allowed[r*want.Cols+c] {
				mark[c] = '!'
				bad++
			}
		}
		fmt.Fprintf(&sb, "%-*s  %-*s  %s\n", w, wl[r], w, gl[r], mark)
	}
	fmt.Fprintf(&sb, "%d cells differ\n", bad)
	return sb.String()
}
