// Package cpuemu runs the CUDA kernels of kernels/cuda on the CPU: cgo
// compiles the very same .cu files with g++ against the CUDA shim cuemu.h
// of this directory (CUDA threads as fibers, barriers and warp shuffles as
// fiber switches, a deadlock check), and [New] wraps the result in the
// launcher of kernels/cuda as a [kernels.Backend] named "emu"; [NewDevice]
// returns the same backend with its device-resident API (caches, tensors
// and steps in emulated device memory, which is C memory of this process),
// so conformance suites, reference cases and `pagedkv simulate --backend
// emu` run the device-resident path an engine would run on a GPU.
//
// It exists so that every default `go test` runs the GPU kernels and the host
// code that launches them (argument packing, grid shapes, split-k plans,
// shared-memory sizes) without a GPU. Launches fail, instead of misbehaving,
// where the GPU would refuse them: more than 1024 threads or 48 KiB of
// dynamic shared memory, an argument count that differs from the entry
// point's. Speed is secondary: a block's threads take turns on one OS
// thread.
//
// Only tests and the CLI's verify command import it (it needs g++ at build
// time, which library users should not).
//
// # Invariants
//
//   - Device memory is C memory (256-byte aligned, filled with 0xFF when
//     allocated, like fresh device memory); kernels never see Go memory.
//   - Dynamic shared memory is filled with 0xFF before every block, so a
//     read of a slot no thread wrote yields NaN, not a stale value.
//   - A cp.async copy writes 0xFF at once and lands only when its thread
//     reaches a barrier after the cp_async_wait that retires its group, so
//     a missing wait, commit or barrier reads NaN (docs/kernels.md, "The
//     CPU emulator"); CUEMU_DROP_SYNC and CUEMU_MMA are testing switches
//     that change nothing unless set.
//   - A block whose threads cannot all reach the same barrier fails the
//     launch with an error naming the block; it never hangs.
//   - Stream capture (the Driver's BeginCapture .. EndCapture) records the
//     asynchronous copies, device copies, memsets and launches instead of
//     running them, and LaunchGraph runs the recording in order; a recorded
//     host-to-device copy reads its host slice when replayed, as a CUDA
//     graph's copy node reads pinned memory. Calls that wait for the stream
//     (HtoD, DtoH, Synchronize) fail during a capture, as on CUDA.
//
// # Concurrency
//
// The backend may be called from several goroutines; launches are
// serialised (one launch uses every worker thread).
package cpuemu
