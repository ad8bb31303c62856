package golden

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/pagedkv/pagedkv/internal/safetensors"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// opSpec describes one operation of FORMAT.md: the tensors and parameters a
// case of it holds, how its outputs are compared and how it runs.
type opSpec struct {
	// inputs and outputs are the tensor names without "in."/"out.".
	inputs, outputs []string
	// optional are inputs a case may hold or leave out (attention's
	// "sinks").
	optional []string
	// levelInputs are per-level inputs (cascade), named "<name>.<level>" for
	// levels 0..num_levels-1.
	levelInputs []string
	// params are the metadata keys the op reads (besides commonParams).
	params []string
	// exact lists float outputs that must match bit for bit (caches after an
	// append). Integer and byte outputs are always exact.
	exact []string
	// backend is true when the op runs on a kernels.Backend (and so may be
	// unsupported there); false for host-side functions.
	backend bool
	// run computes the outputs, keyed by name without "out.".
	run func(x *exec) (map[string]safetensors.Tensor, error)
}

// commonParams may appear in every case. atol and rtol are ignored by ops
// whose outputs are all exact.
var commonParams = []string{"format", "op", "case", "atol", "rtol"}

// ops is the table of every operation in FORMAT.md.
var ops = map[string]*opSpec{}

// register adds an op; the op files call it from init.
func register(name string, s *opSpec) {
	if _, dup := ops[name]; dup {
		panic("golden: op registered twice: " + name)
	}
	ops[name] = s
}

// Ops lists the operations this package runs, sorted.
func Ops() []string { return slices.Sorted(maps.Keys(ops)) }

// expectedTensors lists the in./out. names a case of op s must hold.
func (s *opSpec) expectedTensors(p params) (inputs, outputs []string, err error) {
	for _, n := range s.inputs {
		inputs = append(inputs, "in."+n)
	}
	if len(s.levelInputs) > 0 {
		levels, err := p.intReq("num_levels")
		if err != nil {
			return nil, nil, err
		}
		if levels < 1 || levels > 64 {
			return nil, nil, p.bad("num_levels", p.meta["num_levels"], "want 1..64")
		}
		for l := 0; l < levels; l++ {
			for _, n := range s.levelInputs {
				inputs = append(inputs, fmt.Sprintf("in.%s.%d", n, l))
			}
		}
	}
	for _, n := range s.outputs {
		outputs = append(outputs, "out."+n)
	}
	return inputs, outputs, nil
}

// checkShapeOfCase reports tensors and parameters the case holds that op s
// does not define, and tensors it lacks.
func (s *opSpec) checkCase(c *Case) error {
	p := params{meta: c.Meta}
	inputs, outputs, err := s.expectedTensors(p)
	if err != nil {
		return err
	}
	want := map[string]bool{}
	for _, n := range append(inputs, outputs...) {
		want[n] = true
		if _, ok := c.Tensor(n); !ok {
			return fmt.Errorf("%w: op %s needs tensor %s, which the case lacks", ErrBadCase, c.Op, n)
		}
	}
	for _, n := range s.optional {
		want["in."+n] = true
	}
	for _, t := range c.Tensors() {
		if !want[t.Name] {
			return fmt.Errorf("%w: op %s has no tensor %s (it takes %s)", ErrBadCase, c.Op, t.Name, strings.Join(append(inputs, outputs...), ", "))
		}
	}
	allowed := map[string]bool{}
	for _, k := range append(append([]string{}, commonParams...), s.params...) {
		allowed[k] = true
	}
	var unknown []string
	for k := range c.Meta {
		if !allowed[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return fmt.Errorf("%w: op %s has no parameter %s (it takes %s)", ErrBadCase, c.Op, strings.Join(unknown, ", "), strings.Join(s.params, ", "))
	}
	return nil
}

// exec is one run of one case on one backend.
type exec struct {
	c *Case
	p params
	b kernels.Backend // nil for host-side ops
}

func (x *exec) tensor(name string) safetensors.Tensor {
	t, ok := x.c.Tensor(name)
	if !ok { // checkCase ran first
		panic("golden: missing tensor " + name)
	}
	return t
}

func badTensor(t safetensors.Tensor, format string, args ...any) error {
	return fmt.Errorf("%w: %s (%v %v): %s", ErrBadCase, t.Name, t.DType, t.Shape, fmt.Sprintf(format, args...))
}

// indices decodes an I32 tensor of rank 1 (FlashInfer's index arrays).
func (x *exec) indices(name string) ([]int32, error) {
	t := x.tensor(name)
	if t.DType != safetensors.I32 || len(t.Shape) != 1 {
		return nil, badTensor(t, "want a 1-D I32 array")
	}
	return t.Int32s()
}

// bits returns the bytes of a U8 tensor of rank 1.
func (x *exec) bits(name string) ([]byte, error) {
	t := x.tensor(name)
	if t.DType != safetensors.U8 || len(t.Shape) != 1 {
		return nil, badTensor(t, "want a 1-D U8 array")
	}
	return append([]byte(nil), t.Data...), nil
}

// lse decodes an F32 tensor of the given shape into a new slice.
func (x *exec) lse(name string, shape ...int) ([]float32, error) {
	t := x.tensor(name)
	if t.DType != safetensors.F32 || !slices.Equal(t.Shape, shape) {
		return nil, badTensor(t, "want F32 %v", shape)
	}
	return t.Float32s()
}

// host returns a copy of a float tensor as a kernels.Tensor of the given
// rank, so that an operation may write into it without touching the case.
func (x *exec) host(name string, rank int) (kernels.Tensor, error) {
	t := x.tensor(name)
	dt, ok := layoutDType(t.DType)
	if !ok || !dt.IsFloat() || len(t.Shape) != rank {
		return kernels.Tensor{}, badTensor(t, "want a %d-D floating-point tensor", rank)
	}
	return kernels.Tensor{DType: dt, Shape: append([]int(nil), t.Shape...), Data: append([]byte(nil), t.Data...)}, nil
}

// wantDim checks that a parameter agrees with a tensor dimension.
func (x *exec) wantDim(param string, got int, t safetensors.Tensor, dim int) error {
	if got != t.Shape[dim] {
		return fmt.Errorf("%w: parameter %s = %d but %s has shape %v (dim %d)", ErrBadCase, param, got, t.Name, t.Shape, dim)
	}
	return nil
}

// dtypePairs pairs each file dtype with the project's; layoutDType and
// fileDType both read it, so the two directions cannot drift apart.
var dtypePairs = []struct {
	file    safetensors.DType
	project layout.DType
}{
	{safetensors.F32, layout.F32},
	{safetensors.F16, layout.F16},
	{safetensors.BF16, layout.BF16},
	{safetensors.I32, layout.I32},
	{safetensors.U8, layout.U8},
	{safetensors.I8, layout.I8},
	{safetensors.F8E4M3, layout.E4M3},
	{safetensors.F8E5M2, layout.E5M2},
}

// layoutDType maps a file dtype to the project's.
func layoutDType(d safetensors.DType) (layout.DType, bool) {
	for _, p := range dtypePairs {
		if p.file == d {
			return p.project, true
		}
	}
	return layout.InvalidDType, false
}

// fileDType maps a project dtype back to the file's.
func fileDType(d layout.DType) safetensors.DType {
	for _, p := range dtypePairs {
		if p.project == d {
			return p.file
		}
	}
	return safetensors.InvalidDType
}

// outTensor wraps a kernels output as a file tensor.
func outTensor(name string, t kernels.Tensor) safetensors.Tensor {
	return safetensors.Tensor{Name: name, DType: fileDType(t.DType), Shape: t.Shape, Data: t.Data}
}

// stateOutputs are the outputs of an op that returns an attention state:
// the values v [rows, heads, dim] under vName and their base-2 LSE
// [rows, heads] under sName.
func stateOutputs(vName string, v kernels.Tensor, sName string, s []float32) map[string]safetensors.Tensor {
	return map[string]safetensors.Tensor{
		vName: outTensor(vName, v),
		sName: safetensors.F32Tensor(sName, v.Shape[:2], s),
	}
}
