package golden

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/pagedkv/pagedkv/internal/safetensors"
	"github.com/pagedkv/pagedkv/layout"
)

// OutputResult is the comparison of one expected output with what was
// computed.
type OutputResult struct {
	Name  string // tensor name without "out."
	Exact bool   // compared element for element, bit for bit
	// Atol and Rtol are the tolerance of a non-exact comparison.
	Atol, Rtol float64
	// Mismatch, when not "", says why the output could not be compared
	// element by element (a shape or dtype that disagrees); it fails.
	Mismatch string
	// Elements is the number of elements compared; Failed how many of them
	// are out of tolerance (or differ, for exact outputs).
	Elements, Failed int
	// MaxAbs is the largest |got - want| and MaxRel the largest
	// |got - want| / |want| over the elements with want != 0 (both over
	// finite expected values; +Inf when a finite value came out non-finite).
	MaxAbs, MaxRel float64
	// Worst is the element furthest outside the tolerance (the first
	// differing one for exact outputs); when everything passed, the one
	// closest to the limit. Nil when there are no elements.
	Worst *Element
}

// Element locates one element of an output and gives both values.
type Element struct {
	Index     []int // multi-dimensional index
	Got, Want float64
	// GotText and WantText print the values ("0.51", "-inf", "7", or
	// "0.5 (0x3800)" for a cache element compared bit for bit).
	GotText, WantText string
	// Ratio is |got - want| / (atol + rtol*|want|): > 1 fails. It is +Inf
	// for a non-finite mismatch and for any difference under a zero
	// tolerance or an exact comparison.
	Ratio float64
}

// Passed reports whether the output matched.
func (o *OutputResult) Passed() bool { return o.Mismatch == "" && o.Failed == 0 }

// Describe prints the worst element: "o[3,1,17]: got 0.51 want 0.52".
func (o *OutputResult) Describe() string {
	if o.Worst == nil {
		return o.Name + ": no elements"
	}
	return fmt.Sprintf("%s%s: got %s want %s", o.Name, indexString(o.Worst.Index), o.Worst.GotText, o.Worst.WantText)
}

func indexString(idx []int) string {
	parts := make([]string, len(idx))
	for i, v := range idx {
		parts[i] = strconv.Itoa(v)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// unravel turns a flat row-major index into a multi-dimensional one.
func unravel(flat int, shape []int) []int {
	idx := make([]int, len(shape))
	for d := len(shape) - 1; d >= 0; d-- {
		if shape[d] > 0 {
			idx[d] = flat % shape[d]
			flat /= shape[d]
		}
	}
	return idx
}

// Compare checks got against want. Exact outputs (and every integer or byte
// output) must match element for element in their bits; the others must
// satisfy |got - want| <= atol + rtol*|want| elementwise, where an expected
// NaN needs a NaN and an expected infinity the same infinity (an empty
// attention row's LSE is -inf).
func Compare(want, got safetensors.Tensor, exact bool, atol, rtol float64) OutputResult {
	name := strings.TrimPrefix(want.Name, "out.")
	exact = exact || !isFloat(want.DType)
	r := OutputResult{Name: name, Exact: exact, Atol: atol, Rtol: rtol}
	if exact {
		r.Atol, r.Rtol = 0, 0
	}
	switch {
	case !slices.Equal(got.Shape, want.Shape):
		r.Mismatch = fmt.Sprintf("%s has shape %v, want %v", name, got.Shape, want.Shape)
		return r
	case exact && got.DType != want.DType:
		r.Mismatch = fmt.Sprintf("%s is %v, want %v (compared bit for bit)", name, got.DType, want.DType)
		return r
	case !exact && !isFloat(got.DType):
		r.Mismatch = fmt.Sprintf("%s is %v, want a floating-point dtype", name, got.DType)
		return r
	case len(got.Data) != len(want.Data) && exact:
		r.Mismatch = fmt.Sprintf("%s holds %d bytes, want %d", name, len(got.Data), len(want.Data))
		return r
	}
	n := want.NumElements()
	r.Elements = n
	var worst struct {
		i     int
		ratio float64
		ok    bool
	}
	worst.i, worst.ratio = -1, -1
	size := want.DType.Size()
	for i := 0; i < n; i++ {
		w, g := value(want, i), value(got, i)
		var ratio float64
		var ok bool
		if exact {
			ok = bytes.Equal(got.Data[i*size:(i+1)*size], want.Data[i*size:(i+1)*size])
			if !ok {
				ratio = math.Inf(1)
			}
		} else {
			ratio, ok = within(g, w, atol, rtol)
		}
		if !math.IsNaN(w) && !math.IsInf(w, 0) {
			diff := math.Abs(g - w)
			if math.IsNaN(diff) {
				diff = math.Inf(1)
			}
			r.MaxAbs = math.Max(r.MaxAbs, diff)
			if w != 0 {
				r.MaxRel = math.Max(r.MaxRel, diff/math.Abs(w))
			}
		}
		if !ok {
			r.Failed++
		}
		// The worst element: failing beats passing; then the larger ratio;
		// ties keep the first.
		if worst.i < 0 || (!ok && worst.ok) || (ok == worst.ok && ratio > worst.ratio) {
			worst.i, worst.ratio, worst.ok = i, ratio, ok
		}
	}
	if worst.i >= 0 {
		i := worst.i
		r.Worst = &Element{
			Index: unravel(i, want.Shape), Got: value(got, i), Want: value(want, i),
			GotText: text(got, i, exact), WantText: text(want, i, exact), Ratio: worst.ratio,
		}
	}
	return r
}

// within applies the tolerance to one element and returns how far it is
// toward the limit (ratio > 1 fails).
func within(g, w, atol, rtol float64) (ratio float64, ok bool) {
	switch {
	case math.IsNaN(w):
		if math.IsNaN(g) {
			return 0, true
		}
		return math.Inf(1), false
	case math.IsInf(w, 0):
		if g == w {
			return 0, true
		}
		return math.Inf(1), false
	case math.IsNaN(g) || math.IsInf(g, 0):
		return math.Inf(1), false
	}
	diff := math.Abs(g - w)
	tol := atol + rtol*math.Abs(w)
	switch {
	case diff == 0:
		return 0, true
	case tol == 0:
		return math.Inf(1), false
	}
	return diff / tol, diff <= tol
}

func isFloat(d safetensors.DType) bool {
	switch d {
	case safetensors.F32, safetensors.F16, safetensors.BF16, safetensors.F8E4M3, safetensors.F8E5M2:
		return true
	}
	return false
}

// value returns element i as a float64 (exact for every dtype here).
func value(t safetensors.Tensor, i int) float64 {
	switch t.DType {
	case safetensors.I32:
		return float64(int32(binary.LittleEndian.Uint32(t.Data[4*i:])))
	case safetensors.U8:
		return float64(t.Data[i])
	case safetensors.I8:
		return float64(int8(t.Data[i]))
	}
	dt, ok := layoutDType(t.DType)
	if !ok {
		return math.NaN()
	}
	return float64(layout.LoadF32(dt, t.Data, i))
}

// text prints element i; exact float elements also show their bits, since
// two NaNs (or +0 and -0) print alike but differ.
func text(t safetensors.Tensor, i int, exact bool) string {
	v := value(t, i)
	if !isFloat(t.DType) {
		return strconv.FormatInt(int64(v), 10)
	}
	s := formatFloat(v)
	if exact {
		size := t.DType.Size()
		var bits uint64
		for k := size - 1; k >= 0; k-- {
			bits = bits<<8 | uint64(t.Data[i*size+k])
		}
		s += fmt.Sprintf(" (0x%0*x)", 2*size, bits)
	}
	return s
}

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+inf"
	case math.IsInf(v, -1):
		return "-inf"
	case math.IsNaN(v):
		return "nan"
	}
	// Every value here is a float32 or narrower: its shortest float32 form
	// tells apart any two values that differ.
	return strconv.FormatFloat(v, 'g', -1, 32)
}
