// Package kernels defines the operations pagedkv runs on paged KV storage
// (append, MLA append, batch decode, batch prefill, MLA decode, merge of
// attention states) as one [Backend] interface, with FlashInfer's parameter
// names, and the host tensors those operations read and write.
//
// Backends:
//   - kernels/cpu: pure Go, parallel over goroutines; the default.
//   - internal/cpuemu: the CUDA sources of kernels/cuda compiled for the CPU
//     against a CUDA shim (tests only).
//   - kernels/cuda (build tag cuda): the same CUDA sources as PTX, launched
//     through gorgonia.org/cu on a GPU.
//
// Every backend validates its parameters with the Validate methods of this
// package before it touches memory, so a failed call writes nothing and a bad
// index can never turn into an out-of-bounds write. The index halves of
// those methods (ValidateDecodeTable, ValidateAppendRows and their kin,
// which the methods call) serve backends whose tensors live in device
// memory: kernels/cuda's device-resident steps check their index arrays
// with them before uploading, with the same errors.
//
// # Conventions
//
// Tensors are dense, row-major and little-endian ([Tensor]). Index arrays are
// int32, as in FlashInfer. LSE outputs are base 2: lse = log2(sum_j exp(s_j)).
// A query row that sees no key yields output 0 and LSE -inf.
//
// # Concurrency
//
// A Backend may be used by several goroutines at once as long as their output
// buffers do not overlap; calls do not retain their arguments.
package kernels
