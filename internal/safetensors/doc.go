// Package safetensors reads and writes files in the safetensors format: an
// 8-byte little-endian header length n, n bytes of JSON naming every tensor
// (dtype, shape, data_offsets) plus an optional "__metadata__" string map,
// then the tensor bytes. It exists for the project's reference cases
// (docs/golden.md) and accepts the dtypes those use (F32, F16, BF16, I32, U8)
// and the other cache dtypes of the project (I8, F8_E4M3, F8_E5M2).
//
// The reader is written for files from anywhere: every malformed input
// gives an error wrapping [ErrMalformed] (or [ErrUnknownDType],
// [ErrHeaderTooLarge]) that names the offending tensor and value, never a
// panic. Parsing allocates only for the header's own contents (bounded by
// [MaxHeaderBytes] and by the file's size); tensor data is never copied or
// sized from a declared shape. [ReadFile] and [ReadBounded] refuse, before
// reading, anything but a regular file and files over a stated limit
// ([MaxFileBytes] for ReadFile), so a path such as /dev/zero costs nothing.
//
// # Invariants
//
// For a [File] returned by [Parse]:
//   - every tensor's Data is a subslice of the parsed buffer, and
//     len(Data) == product(Shape) * DType.Size();
//   - the tensors' byte ranges tile the data section exactly: sorted by
//     offset they start at 0, do not overlap, leave no gap and end at the end
//     of the file (as the reference Rust implementation requires);
//   - tensor names are unique, non-empty and not "__metadata__";
//   - rank <= [MaxRank], and every dimension is >= 0.
//
// [Encode] writes files that satisfy the same invariants, with tensors laid
// out in name order and the header padded with spaces to a multiple of 8
// bytes, so Parse(Encode(f)) reproduces f.
//
// # Concurrency
//
// The package has no state. A File is not modified after Parse returns, and
// may be read by several goroutines at once; its tensors alias the buffer
// given to Parse, which the caller must not modify while they are in use.
//
// It imports only the standard library.
package safetensors
