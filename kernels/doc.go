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
// index can never turn into an out-of-bounds write. The page table is
// checked by [PageTable.Validate], which is ragged.ValidatePageTable (the
// module's one page-table validator); the other index halves of those
// methods (ValidateAppendRows, ValidateQOIndptr, PageTable.ValidateBatch,
// AttentionParams.ValidateScalars and their kin, which the methods call)
// serve backends whose tensors live in device memory: kernels/cuda's
// device-resident steps check their index arrays with them before
// uploading, the page table once per step, with the same errors.
//
// # Conventions
//
// Tensors are dense, row-major and little-endian ([Tensor]). Index arrays are
// int32, as in FlashInfer. LSE outputs are base 2: lse = log2(sum_j exp(s_j)).
// A query row that sees no key yields output 0 and LSE -inf.
//
// # Invariants
//
//   - A call that returns an error has written nothing: every backend runs
//     this package's validation (shapes, dtypes, scales, and the page
//     table through [ragged.ValidatePageTable], so [ErrInvalidPageTable] is
//     the one page-table sentinel) before it touches an output.
//   - A call that succeeds writes only what its index arrays name: an
//     append changes only the slots of the rows it appends, and no
//     operation reads or writes outside its tensors, whatever int32 values
//     the arrays hold (kernels/kernelstest's CheckRawIndices puts canaries
//     around every buffer, and each backend's raw-array fuzz target runs it).
//   - Every backend computes the same results within the conformance
//     suite's tolerances (kernels/kernelstest, against the float64 models of
//     internal/reference); append copies bytes exactly, so caches agree byte
//     for byte.
//   - The device-side index checks (ValidateAppendRows and their kin) are
//     the index halves of the Validate methods, so a device backend refuses
//     exactly what the CPU backend refuses, with the same error.
//
// # Concurrency
//
// A Backend may be used by several goroutines at once as long as their output
// buffers do not overlap; calls do not retain their arguments.
package kernels
