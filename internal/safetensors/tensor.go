package safetensors

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Typed views and constructors. Tensor data may start at any byte offset of
// a file (safetensors does not align), so these decode byte by byte instead
// of reinterpreting memory.

// Int32s decodes an I32 tensor into a new slice.
func (t Tensor) Int32s() ([]int32, error) {
	if t.DType != I32 {
		return nil, &Error{Tensor: t.Name, Err: ErrUnknownDType, Msg: fmt.Sprintf("dtype is %v, want I32", t.DType)}
	}
	out := make([]int32, len(t.Data)/4)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(t.Data[4*i:]))
	}
	return out, nil
}

// Float32s decodes an F32 tensor into a new slice.
func (t Tensor) Float32s() ([]float32, error) {
	if t.DType != F32 {
		return nil, &Error{Tensor: t.Name, Err: ErrUnknownDType, Msg: fmt.Sprintf("dtype is %v, want F32", t.DType)}
	}
	out := make([]float32, len(t.Data)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
	}
	return out, nil
}

// I32Tensor returns an I32 tensor holding v. It panics when product(shape)
// != len(v).
func I32Tensor(name string, shape []int, v []int32) Tensor {
	checkLen(name, shape, len(v))
	data := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(data[4*i:], uint32(x))
	}
	return Tensor{Name: name, DType: I32, Shape: append([]int{}, shape...), Data: data}
}

// F32Tensor returns an F32 tensor holding v. It panics when product(shape)
// != len(v).
func F32Tensor(name string, shape []int, v []float32) Tensor {
	checkLen(name, shape, len(v))
	data := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(x))
	}
	return Tensor{Name: name, DType: F32, Shape: append([]int{}, shape...), Data: data}
}

// U8Tensor returns a U8 tensor holding a copy of v. It panics when
// product(shape) != len(v).
func U8Tensor(name string, shape []int, v []uint8) Tensor {
	checkLen(name, shape, len(v))
	return Tensor{Name: name, DType: U8, Shape: append([]int{}, shape...), Data: append([]byte{}, v...)}
}

func checkLen(name string, shape []int, n int) {
	p := 1
	for _, d := range shape {
		p *= d
	}
	if p != n {
		panic(fmt.Sprintf("safetensors: tensor %q: shape %v holds %d elements, got %d values", name, shape, p, n))
	}
}
