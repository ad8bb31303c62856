package golden

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/pagedkv/pagedkv/internal/safetensors"
	"github.com/pagedkv/pagedkv/kernels"
)

// Runner runs cases on a backend.
type Runner struct {
	// Backend runs the operations of FORMAT.md that kernels.Backend
	// implements. It must not be nil.
	Backend kernels.Backend
	// Fallback, when not nil, reruns a case whose operation Backend reports
	// as kernels.ErrUnsupported. The Result then names the fallback.
	Fallback kernels.Backend
}

// Result is the outcome of one case.
type Result struct {
	Name string // the case's name (file base name)
	Path string
	Op   string
	// Backend is the name of the backend whose outputs were compared; ""
	// for host-side operations (page-table helpers, bit packing, masks).
	Backend string
	// Fallback is true when Backend is the Runner's Fallback, because the
	// primary backend does not support the operation.
	Fallback bool
	// Err is set when the case failed before any comparison: unreadable
	// file, invalid case, unknown op, backend error (including an
	// unsupported op without a fallback).
	Err error
	// Outputs holds one comparison per expected output, in name order.
	Outputs []OutputResult
}

// Passed reports whether every expected output matched.
func (r *Result) Passed() bool {
	if r.Err != nil || len(r.Outputs) == 0 {
		return false
	}
	for i := range r.Outputs {
		if !r.Outputs[i].Passed() {
			return false
		}
	}
	return true
}

// MaxAbs is the largest absolute error over all outputs.
func (r *Result) MaxAbs() float64 {
	m := 0.0
	for _, o := range r.Outputs {
		m = math.Max(m, o.MaxAbs)
	}
	return m
}

// MaxRel is the largest relative error over all outputs.
func (r *Result) MaxRel() float64 {
	m := 0.0
	for _, o := range r.Outputs {
		m = math.Max(m, o.MaxRel)
	}
	return m
}

// Worst returns the output that failed worst (nil when all passed): one that
// could not be compared, else the one whose worst element is furthest
// outside its tolerance.
func (r *Result) Worst() *OutputResult {
	var w *OutputResult
	for i := range r.Outputs {
		o := &r.Outputs[i]
		switch {
		case o.Passed():
		case o.Mismatch != "":
			return o
		case w == nil || o.Worst.Ratio > w.Worst.Ratio:
			w = o
		}
	}
	return w
}

// String is the one-line report of the case, e.g.
//
//	PASS batch_decode_0_00 max_abs=1.2e-07 max_rel=3.1e-06
//	FAIL batch_decode_0_00 max_abs=0.01 max_rel=0.02 worst at o[3,1,17]: got 0.51 want 0.52 (3 of 12288 outside atol=0.002 rtol=0.002)
//	PASS batch_prefill_paged_0_00 (cpu fallback) max_abs=...
//	FAIL batch_prefill_paged_0_00: unsupported on emu: ...
func (r *Result) String() string {
	var b strings.Builder
	if r.Passed() {
		b.WriteString("PASS ")
	} else {
		b.WriteString("FAIL ")
	}
	b.WriteString(r.Name)
	if r.Fallback {
		fmt.Fprintf(&b, " (%s fallback)", r.Backend)
	}
	if r.Err != nil {
		fmt.Fprintf(&b, ": %v", r.Err)
		return b.String()
	}
	fmt.Fprintf(&b, " max_abs=%.2g max_rel=%.2g", r.MaxAbs(), r.MaxRel())
	if w := r.Worst(); w != nil {
		if w.Mismatch != "" {
			fmt.Fprintf(&b, " %s", w.Mismatch)
		} else if w.Exact {
			fmt.Fprintf(&b, " worst at %s (%d of %d elements differ)", w.Describe(), w.Failed, w.Elements)
		} else {
			fmt.Fprintf(&b, " worst at %s (%d of %d outside atol=%g rtol=%g)", w.Describe(), w.Failed, w.Elements, w.Atol, w.Rtol)
		}
	} else if len(r.Outputs) == 0 {
		b.WriteString(" no outputs compared")
	}
	return b.String()
}

// Details prints one line per output (for verbose reports).
func (r *Result) Details() []string {
	var lines []string
	for i := range r.Outputs {
		o := &r.Outputs[i]
		status := "ok"
		if !o.Passed() {
			status = "FAIL"
		}
		mode := fmt.Sprintf("atol=%g rtol=%g", o.Atol, o.Rtol)
		if o.Exact {
			mode = "exact"
		}
		line := fmt.Sprintf("  %-4s %s (%s): %d elements, %d failed, max_abs=%.3g max_rel=%.3g", status, o.Name, mode, o.Elements, o.Failed, o.MaxAbs, o.MaxRel)
		if o.Mismatch != "" {
			line += ", " + o.Mismatch
		} else if o.Worst != nil && o.Failed > 0 {
			line += ", worst at " + o.Describe()
		} else if o.Worst != nil {
			line += ", nearest the limit at " + o.Describe()
		}
		lines = append(lines, line)
	}
	return lines
}

// RunFile loads and runs the case at path. A file that cannot be read or is
// not a valid case gives a failed Result (Err set).
func (r *Runner) RunFile(path string) *Result {
	c, err := Load(path)
	if err != nil {
		name := strings.TrimSuffix(baseName(path), Ext)
		return &Result{Name: name, Path: path, Err: err}
	}
	return r.Run(c)
}

func baseName(path string) string {
	if i := strings.LastIndexAny(path, `/\`); i >= 0 {
		return path[i+1:]
	}
	return path
}

// Run runs c and compares its outputs. It never panics on a bad case.
func (r *Runner) Run(c *Case) *Result {
	res := &Result{Name: c.Name, Path: c.Path, Op: c.Op}
	spec, ok := ops[c.Op]
	if !ok {
		res.Err = fmt.Errorf("%w %q (known: %s)", ErrUnknownOp, c.Op, strings.Join(Ops(), ", "))
		return res
	}
	if err := spec.checkCase(c); err != nil {
		res.Err = err
		return res
	}
	p := params{meta: c.Meta}
	atol, rtol := 0.0, 0.0
	if spec.needsTolerance(c) {
		var err error
		if atol, rtol, err = p.tolerance(); err != nil {
			res.Err = err
			return res
		}
	}
	var got map[string]safetensors.Tensor
	var err error
	if spec.backend {
		if r.Backend == nil {
			res.Err = errors.New("golden: Runner has no Backend")
			return res
		}
		res.Backend = r.Backend.Name()
		got, err = runSafely(spec, &exec{c: c, p: p, b: r.Backend})
		if errors.Is(err, kernels.ErrUnsupported) {
			if r.Fallback == nil {
				res.Err = fmt.Errorf("unsupported on %s: %w", r.Backend.Name(), err)
				return res
			}
			res.Backend, res.Fallback = r.Fallback.Name(), true
			got, err = runSafely(spec, &exec{c: c, p: p, b: r.Fallback})
		}
	} else {
		got, err = runSafely(spec, &exec{c: c, p: p})
	}
	if err != nil {
		res.Err = err
		return res
	}
	for _, name := range spec.outputs {
		want, _ := c.Tensor("out." + name)
		g, ok := got[name]
		if !ok {
			res.Outputs = append(res.Outputs, OutputResult{Name: name, Mismatch: name + " was not computed"})
			continue
		}
		res.Outputs = append(res.Outputs, Compare(want, g, spec.isExact(name), atol, rtol))
	}
	return res
}

// runSafely runs an op, turning a panic (a bug in the code under test) into
// a failed case instead of ending the whole verification.
func runSafely(spec *opSpec, x *exec) (out map[string]safetensors.Tensor, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("golden: op %s panicked: %v", x.c.Op, p)
		}
	}()
	return spec.run(x)
}

func (s *opSpec) isExact(name string) bool {
	for _, e := range s.exact {
		if e == name {
			return true
		}
	}
	return false
}

// needsTolerance reports whether some expected output of c is compared
// within atol/rtol.
func (s *opSpec) needsTolerance(c *Case) bool {
	for _, name := range s.outputs {
		if t, ok := c.Tensor("out." + name); ok && isFloat(t.DType) && !s.isExact(name) {
			return true
		}
	}
	return false
}
