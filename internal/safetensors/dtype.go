package safetensors

import "fmt"

// DType is the element type of a tensor, spelled as in the safetensors
// header. The zero value is invalid.
type DType uint8

// The dtypes this package accepts.
const (
	InvalidDType DType = iota
	F32
	F16
	BF16 // raw bfloat16 bits, little-endian
	I32
	U8
	I8
	F8E4M3 // "F8_E4M3"
	F8E5M2 // "F8_E5M2"
)

var dtypeInfo = [...]struct {
	name string
	size int
}{
	InvalidDType: {"invalid", 0},
	F32:          {"F32", 4},
	F16:          {"F16", 2},
	BF16:         {"BF16", 2},
	I32:          {"I32", 4},
	U8:           {"U8", 1},
	I8:           {"I8", 1},
	F8E4M3:       {"F8_E4M3", 1},
	F8E5M2:       {"F8_E5M2", 1},
}

// Size is the size of one element in bytes (0 for an invalid dtype).
func (d DType) Size() int {
	if int(d) >= len(dtypeInfo) {
		return 0
	}
	return dtypeInfo[d].size
}

// Valid reports whether d is one of the dtypes above.
func (d DType) Valid() bool { return d != InvalidDType && int(d) < len(dtypeInfo) }

// String is the header spelling ("F32", "BF16", "F8_E4M3", ...).
func (d DType) String() string {
	if !d.Valid() {
		return fmt.Sprintf("DType(%d)", uint8(d))
	}
	return dtypeInfo[d].name
}

// ParseDType maps a header spelling to a DType. Spellings are case-sensitive,
// as in the format; an unknown one gives an error wrapping [ErrUnknownDType].
func ParseDType(s string) (DType, error) {
	for d := F32; int(d) < len(dtypeInfo); d++ {
		if dtypeInfo[d].name == s {
			return d, nil
		}
	}
	return InvalidDType, &Error{Err: ErrUnknownDType, Msg: fmt.Sprintf("unknown dtype %q (want one of F32, F16, BF16, I32, U8, I8, F8_E4M3, F8_E5M2)", s)}
}
