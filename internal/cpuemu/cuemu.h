// cuemu.h: a CUDA shim for running the kernels of kernels/cuda on the CPU.
//
// g++ (C++20) compiles the same .cu files against this header (through
// kernels/cuda/compat.cuh, which finds it on the include path emu.go sets)
// instead of the CUDA headers. What it provides:
//
//   - qualifiers (__global__, __device__, __shared__, __restrict__, ...);
//   - threadIdx/blockIdx/blockDim/gridDim, read from the running fiber;
//   - every CUDA thread of a block is a fiber with its own stack; the fibers
//     of one block run on one worker thread, switching only at
//     __syncthreads, __syncwarp and warp collectives, warp by warp: a warp
//     runs (its lanes in turn, released from each collective at once) until
//     all its lanes wait at __syncthreads, then the next warp runs, so a
//     block's run is deterministic and a missing barrier shows up as a
//     wrong answer;
//   - __syncthreads (block barrier) and __syncwarp/__shfl*_sync/__ballot_sync
//     (warp barriers); threads that have returned leave later barriers;
//   - a deadlock check: when no fiber of a block can run and no barrier can
//     release (threads split between different barriers), the launch fails
//     with a message instead of hanging; so does a warp collective with a
//     mask other than 0xffffffff or with fewer than 32 live lanes, since
//     partial-warp collectives are not emulated;
//   - __shared__ variables (per worker thread, so per block in flight) and
//     dynamic shared memory (cuemu::dyn_smem, poisoned with 0xFF bytes at
//     the start of every block so that reads of unwritten shared memory
//     produce NaNs rather than stale values);
//   - cp.async as the GPU may run it, not at once: cp_async_16 fills its
//     16 destination bytes with 0xFF at once, cp_async_wait<n> retires the
//     copies of every committed group but the n most recent, and a retired
//     copy lands at its thread's next __syncthreads (or __syncwarp). So a
//     read before the wait or before the barrier that follows it, or a
//     refill that no barrier separates from the readers of the old data,
//     sees NaNs (0xFF is a NaN in f32, f16, bf16, e4m3 and e5m2);
//   - blocks of odd linear index run their warps and lanes last to first,
//     so that a thread reading, without a barrier, data another thread
//     writes in the same barrier interval reads it before the writer ran in
//     half of the blocks, whichever thread is the writer;
//   - two testing switches: CUEMU_DROP_SYNC=file.cu:line turns the
//     __syncthreads, cp_async_wait or cp_async_commit called at that line
//     into a no-op (a mutation that the conformance checks must catch), and
//     CUEMU_MMA=tc makes the mma twin sum its products as a tensor core may
//     (see tc_dot16);
//   - __half (_Float16), __nv_bfloat16, their conversions, the math
//     intrinsics the kernels use, and a few atomics;
//   - CUDA's launch limits (1024 threads, block z <= 64, 48 KiB of dynamic
//     shared memory), so a launch that a GPU would refuse fails here too.
//
// Blocks run in parallel on worker threads (hardware_concurrency, or the
// CUEMU_WORKERS environment variable). The workers are private std::threads
// created with every signal blocked: fibers never run on a thread the Go
// runtime knows, which keeps Go's signal handling and cgo stack checks away
// from fiber stacks (go test -race is fine). One launch runs at a time.
//
// Fiber stacks are CUEMU_STACK_BYTES (64 KiB) above a PROT_NONE guard page,
// so an overflow is a SIGSEGV, not silent corruption. The stack switch is a
// small naked x86-64 function; other architectures (or -DCUEMU_UCONTEXT)
// use ucontext, about ten times slower.
#ifndef PAGEDKV_CUEMU_H
#define PAGEDKV_CUEMU_H

#if defined(__CUDACC__)
#error "cuemu.h is the CPU shim; nvcc builds against the CUDA headers (compat.cuh)"
#endif

#include <algorithm>
#include <atomic>
#include <climits>
#include <bit>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <source_location>
#include <string>
#include <thread>
#include <vector>

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__x86_64__) && !defined(CUEMU_UCONTEXT)
#define CUEMU_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif

#ifndef CUEMU_STACK_BYTES
#define CUEMU_STACK_BYTES (64 * 1024)
#endif

// ---- qualifiers -----------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// CUDA __shared__ variables are implicitly static; one worker runs one block
// at a time, so per-thread storage is per-block storage.
#define __shared__ static thread_local

// ---- vector and index types -----------------------------------------------

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
struct __align__(16) uint4 {
  unsigned x, y, z, w;
};
struct __align__(8) uint2 {
  unsigned x, y;
};
struct __align__(16) float4 {
  float x, y, z, w;
};
struct __align__(8) float2 {
  float x, y;
};

namespace cuemu {

constexpr unsigned kWarpSize = 32;
constexpr unsigned kMaxThreads = 1024;
constexpr size_t kMaxDynSmem = 48 * 1024;

enum class Wait : uint8_t { kRunnable, kBlockBarrier, kWarpBarrier, kDone };

// AsyncCopy is one cp.async in flight: 16 bytes from src to dst, issued
// while group was the calling thread's open (uncommitted) group.
struct AsyncCopy {
  unsigned char* dst;
  const unsigned char* src;
  unsigned group;
};

struct Fiber {
  void* sp = nullptr;  // saved stack pointer while switched out
#if !defined(CUEMU_ASM_SWITCH)
  ucontext_t uc;
#endif
  uint3 tid{};
  unsigned linear = 0, warp = 0, lane = 0;
  Wait wait = Wait::kRunnable;
  unsigned collectives = 0;  // warp collectives done; parity picks the exchange buffer
  std::vector<AsyncCopy> copies;  // cp.async not landed, in issue order
  size_t copies_retired = 0;      // copies[:copies_retired] were waited for: they land at the next barrier
  unsigned committed = 0;  // cp.async groups committed: the open group's number
};

// Block is the state of the block a worker is running.
struct Block {
  uint3 idx{};
  dim3 dim, grid;
  unsigned nthreads = 0, nwarps = 0;
  Fiber* fibers = nullptr;
  Fiber* cur = nullptr;
  void* sched_sp = nullptr;
#if !defined(CUEMU_ASM_SWITCH)
  ucontext_t sched_uc;
#endif
  unsigned char* smem = nullptr;
  unsigned block_waiting = 0, live = 0;
  unsigned warp_waiting[kMaxThreads / kWarpSize] = {};
  unsigned warp_live[kMaxThreads / kWarpSize] = {};
  uint64_t xchg[2][kMaxThreads] = {};  // warp exchange slots [parity][thread]
  bool failed = false;
  std::string err;
  const std::function<void()>* body = nullptr;
};

inline thread_local Block* tl_block = nullptr;

// ---- testing switches -----------------------------------------------------------
//
// Set between launches (by the C entry points of emu.cc or, once, from the
// environment); launches only read them.

enum class MMA : int { kExact = 0, kTC = 1 };

struct Switches {
  std::atomic<unsigned> drop_line{0};  // 0: no sync is dropped
  char drop_file[128] = {};            // base name of the dropped sync's file
  std::atomic<int> mma{int(MMA::kExact)};
  std::string env_err;  // a bad CUEMU_* variable; every launch fails with it
};

inline Switches& switches() {
  static Switches* s = new Switches();  // never destroyed: workers may outlive static destructors
  return *s;
}

inline const char* base_name(const char* path) {
  const char* b = std::strrchr(path, '/');
  return b ? b + 1 : path;
}

// set_drop_sync makes the sync called at site ("file.cu:line", the file's
// base name) a no-op; "" drops nothing. It returns "" or what is wrong.
inline std::string set_drop_sync(const std::string& site) {
  Switches& s = switches();
  if (site.empty()) {
    s.drop_line.store(0);
    return "";
  }
  const size_t colon = site.rfind(':');
  char* end = nullptr;
  const unsigned long line = colon == std::string::npos ? 0 : std::strtoul(site.c_str() + colon + 1, &end, 10);
  if (colon == 0 || colon == std::string::npos || colon >= sizeof s.drop_file || line == 0 || line > 1000000 ||
      *end != 0 || site.find('/') != std::string::npos)
    return "sync site " + site + ": want file.cu:line (the file's base name and a line number)";
  std::memcpy(s.drop_file, site.data(), colon);
  s.drop_file[colon] = 0;
  s.drop_line.store(unsigned(line));
  return "";
}

// set_mma selects how the mma twin sums: "exact" (in order, in f32) or
// "tc" (tc_dot16). It returns "" or what is wrong.
inline std::string set_mma(const std::string& mode) {
  if (mode == "exact" || mode.empty()) {
    switches().mma.store(int(MMA::kExact));
  } else if (mode == "tc") {
    switches().mma.store(int(MMA::kTC));
  } else {
    return "mma mode " + mode + ": want exact or tc";
  }
  return "";
}

// env_switches applies CUEMU_DROP_SYNC and CUEMU_MMA once; it returns the
// error every launch then reports, or "".
inline const std::string& env_switches() {
  static std::once_flag once;
  std::call_once(once, [] {
    Switches& s = switches();
    if (const char* e = std::getenv("CUEMU_DROP_SYNC"); e && *e) {
      if (std::string m = set_drop_sync(e); !m.empty()) s.env_err = "CUEMU_DROP_SYNC: " + m;
    }
    if (const char* e = std::getenv("CUEMU_MMA"); e && *e) {
      if (std::string m = set_mma(e); !m.empty()) s.env_err = "CUEMU_MMA: " + m;
    }
  });
  return switches().env_err;
}

// keep_sync reports whether the sync called at loc runs: false only for
// the site CUEMU_DROP_SYNC (or set_drop_sync) names.
inline bool keep_sync(const std::source_location& loc) {
  Switches& s = switches();
  const unsigned line = s.drop_line.load(std::memory_order_relaxed);
  return line == 0 || loc.line() != line || std::strcmp(base_name(loc.file_name()), s.drop_file) != 0;
}

// ---- stack switching --------------------------------------------------------

#if defined(CUEMU_ASM_SWITCH)
// swap_stack saves the callee-saved registers, MXCSR and the x87 control
// word on the current stack, stores the stack pointer in *save and resumes
// the context whose stack pointer is next.
__attribute__((naked, noinline)) static void swap_stack(void** /*save*/, void* /*next*/) {
  asm volatile(
      "pushq %rbp\n\t"
      "pushq %rbx\n\t"
      "pushq %r12\n\t"
      "pushq %r13\n\t"
      "pushq %r14\n\t"
      "pushq %r15\n\t"
      "subq $8, %rsp\n\t"
      "stmxcsr (%rsp)\n\t"
      "fnstcw 4(%rsp)\n\t"
      "movq %rsp, (%rdi)\n\t"
      "movq %rsi, %rsp\n\t"
      "ldmxcsr (%rsp)\n\t"
      "fldcw 4(%rsp)\n\t"
      "addq $8, %rsp\n\t"
      "popq %r15\n\t"
      "popq %r14\n\t"
      "popq %r13\n\t"
      "popq %r12\n\t"
      "popq %rbx\n\t"
      "popq %rbp\n\t"
      "ret\n\t");
}

// fiber_start is where a new fiber's first swap_stack returns to: it calls
// r13(r12) with an aligned stack. The entry never returns.
__attribute__((naked, noinline)) static void fiber_start() {
  asm volatile(
      "movq %r12, %rdi\n\t"
      "callq *%r13\n\t"
      "ud2\n\t");
}
#endif

inline void fiber_main(void* arg);

#if !defined(CUEMU_ASM_SWITCH)
inline void fiber_main_uc(unsigned lo, unsigned hi) {
  fiber_main(reinterpret_cast<void*>((uintptr_t(hi) << 32) | uintptr_t(lo)));
}
#endif

// init_fiber prepares f to start in fiber_main on the stack [lo, hi).
inline void init_fiber(Fiber* f, unsigned char* lo, unsigned char* hi) {
#if defined(CUEMU_ASM_SWITCH)
  uintptr_t top = (reinterpret_cast<uintptr_t>(hi) - 64) & ~uintptr_t(15);
  auto* w = reinterpret_cast<uint64_t*>(top - 64);  // 16-byte aligned
  uint32_t mxcsr = __builtin_ia32_stmxcsr();
  uint16_t fcw;
  asm volatile("fnstcw %0" : "=m"(fcw));
  w[0] = uint64_t(mxcsr) | (uint64_t(fcw) << 32);
  w[1] = 0;                                           // r15
  w[2] = 0;                                           // r14
  w[3] = reinterpret_cast<uint64_t>(&fiber_main);     // r13: entry
  w[4] = reinterpret_cast<uint64_t>(f);               // r12: argument
  w[5] = 0;                                           // rbx
  w[6] = 0;                                           // rbp
  w[7] = reinterpret_cast<uint64_t>(&fiber_start);    // return address
  f->sp = w;
  (void)lo;
#else
  getcontext(&f->uc);
  f->uc.uc_stack.ss_sp = lo;
  f->uc.uc_stack.ss_size = size_t(hi - lo);
  f->uc.uc_link = nullptr;
  uintptr_t a = reinterpret_cast<uintptr_t>(f);
  makecontext(&f->uc, reinterpret_cast<void (*)()>(&fiber_main_uc), 2, unsigned(a), unsigned(a >> 32));
#endif
}

inline void switch_to_fiber(Block* b, Fiber* f) {
  b->cur = f;
  asm volatile("" ::: "memory");
#if defined(CUEMU_ASM_SWITCH)
  swap_stack(&b->sched_sp, f->sp);
#else
  swapcontext(&b->sched_uc, &f->uc);
#endif
  asm volatile("" ::: "memory");
}

inline void switch_to_scheduler(Block* b, Fiber* f) {
  asm volatile("" ::: "memory");
#if defined(CUEMU_ASM_SWITCH)
  swap_stack(&f->sp, b->sched_sp);
#else
  swapcontext(&f->uc, &b->sched_uc);
#endif
  asm volatile("" ::: "memory");
}

// ---- barriers ---------------------------------------------------------------

// fail ends the launch with msg; the calling fiber is never resumed.
[[noreturn]] inline void fail(const std::string& msg) {
  Block* b = tl_block;
  Fiber* f = b->cur;
  if (!b->failed) {
    b->failed = true;
    char where[96];
    std::snprintf(where, sizeof where, " (block %u,%u,%u thread %u,%u,%u)", b->idx.x, b->idx.y, b->idx.z, f->tid.x,
                  f->tid.y, f->tid.z);
    b->err = msg + where;
  }
  f->wait = Wait::kDone;
  switch_to_scheduler(b, f);
  __builtin_unreachable();
}

inline void land_copies(Fiber* f);

inline void block_barrier() {
  Block* b = tl_block;
  Fiber* f = b->cur;
  land_copies(f);
  f->wait = Wait::kBlockBarrier;
  b->block_waiting++;
  switch_to_scheduler(b, f);
}

// warp_barrier waits for the calling thread's warp; land (__syncwarp, not
// the shuffles and votes) also lands its retired cp.async copies.
inline void warp_barrier(unsigned mask, bool land) {
  Block* b = tl_block;
  Fiber* f = b->cur;
  if (mask != 0xffffffffu) {
    char m[96];
    std::snprintf(m, sizeof m, "warp collective with mask 0x%08x: only full-warp masks are emulated", mask);
    fail(m);
  }
  if (land) land_copies(f);
  f->wait = Wait::kWarpBarrier;
  b->warp_waiting[f->warp]++;
  switch_to_scheduler(b, f);
}

inline void fiber_main(void* arg) {
  auto* f = static_cast<Fiber*>(arg);
  Block* b = tl_block;
  (*b->body)();
  f->wait = Wait::kDone;
  switch_to_scheduler(b, f);
  __builtin_unreachable();
}

// run_block runs every thread of block b to completion on this worker. It
// returns false (with b->err set) on a deadlock or a failed fiber.
inline bool run_block(Block* b) {
  const unsigned n = b->nthreads;
  b->live = n;
  b->block_waiting = 0;
  for (unsigned w = 0; w < b->nwarps; w++) {
    b->warp_waiting[w] = 0;
    b->warp_live[w] = 0;
  }
  for (unsigned i = 0; i < n; i++) b->warp_live[i / kWarpSize]++;
  const bool reverse = ((uint64_t(b->idx.z) * b->grid.y + b->idx.y) * b->grid.x + b->idx.x) % 2 == 1;
  for (;;) {
    bool progress = false;
    // Warp by warp: a warp runs until every live lane waits at
    // __syncthreads (its warp collectives release at once), so between two
    // block barriers one warp runs all its code before the next starts.
    for (unsigned k = 0; k < b->nwarps; k++) {
      const unsigned w = reverse ? b->nwarps - 1 - k : k;
      for (;;) {
        for (unsigned l = 0; l < kWarpSize; l++) {
          const unsigned i = w * kWarpSize + (reverse ? kWarpSize - 1 - l : l);
          if (i >= n) continue;
          Fiber* f = &b->fibers[i];
          if (f->wait != Wait::kRunnable) continue;
          switch_to_fiber(b, f);
          if (b->failed) return false;
          progress = true;
          if (f->wait == Wait::kDone) {
            b->live--;
            b->warp_live[w]--;
          }
        }
        if (b->warp_waiting[w] == 0 || b->warp_waiting[w] != b->warp_live[w]) break;
        if (b->warp_live[w] != kWarpSize) {
          char m[128];
          std::snprintf(m, sizeof m,
                        "warp %u: collective reached by %u live lanes of 32 (partial warps are not emulated)", w,
                        b->warp_live[w]);
          b->cur = &b->fibers[w * kWarpSize];
          b->failed = true;
          b->err = m;
          return false;
        }
        for (unsigned l = 0; l < kWarpSize; l++) b->fibers[w * kWarpSize + l].wait = Wait::kRunnable;
        b->warp_waiting[w] = 0;
      }
    }
    if (b->live == 0) return true;
    if (b->block_waiting == b->live) {
      for (unsigned i = 0; i < n; i++)
        if (b->fibers[i].wait == Wait::kBlockBarrier) b->fibers[i].wait = Wait::kRunnable;
      b->block_waiting = 0;
      continue;
    }
    if (!progress) {
      unsigned warp_waiting = 0;
      for (unsigned w = 0; w < b->nwarps; w++) warp_waiting += b->warp_waiting[w];
      char m[192];
      std::snprintf(m, sizeof m,
                    "deadlock in block %u,%u,%u: %u live threads, %u at __syncthreads, %u at warp barriers "
                    "(threads wait at different barriers)",
                    b->idx.x, b->idx.y, b->idx.z, b->live, b->block_waiting, warp_waiting);
      b->failed = true;
      b->err = m;
      return false;
    }
  }
}

// ---- worker pool and launch ---------------------------------------------------

// Stacks is one worker's pool of fiber stacks, grown to the largest block.
struct Stacks {
  unsigned char* base = nullptr;
  size_t count = 0, stride = 0;
  bool ensure(unsigned n) {
    if (n <= count) return true;
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    const size_t s = (CUEMU_STACK_BYTES + page - 1) / page * page + page;  // + guard page
    if (base) munmap(base, count * stride);
    void* p = mmap(nullptr, n * s, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      base = nullptr;
      count = 0;
      return false;
    }
    base = static_cast<unsigned char*>(p);
    count = n;
    stride = s;
    for (unsigned i = 0; i < n; i++) mprotect(base + i * s, page, PROT_NONE);
    return true;
  }
  unsigned char* lo(unsigned i) const { return base + i * stride + size_t(sysconf(_SC_PAGESIZE)); }
  unsigned char* hi(unsigned i) const {
    // Stagger the tops so that hot stack frames do not alias in the L1 cache.
    return base + (i + 1) * stride - (i % 16) * 256;
  }
};

struct LaunchState {
  dim3 grid, block;
  size_t smem = 0;
  const std::function<void()>* body = nullptr;
  std::atomic<uint64_t> next{0};
  uint64_t total = 0;
  std::atomic<bool> failed{false};
  std::mutex err_mu;
  std::string err;
};

class Pool {
 public:
  static Pool& get() {
    static Pool* p = new Pool();  // never destroyed: workers live as long as the process
    return *p;
  }

  // run executes one launch; it returns "" on success, else the error.
  std::string run(LaunchState* L) {
    std::lock_guard<std::mutex> one(launch_mu_);
    {
      std::unique_lock<std::mutex> lk(mu_);
      cur_ = L;
      pending_ = unsigned(workers_.size());
      epoch_++;
    }
    cv_.notify_all();
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return pending_ == 0; });
    cur_ = nullptr;
    return L->failed.load() ? L->err : std::string();
  }

 private:
  Pool() {
    unsigned n = std::thread::hardware_concurrency();
    if (const char* e = std::getenv("CUEMU_WORKERS")) n = unsigned(std::atoi(e));
    if (n == 0) n = 1;
    // Workers inherit this mask: every signal blocked, so no signal handler
    // ever runs on a fiber stack.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (unsigned i = 0; i < n; i++) workers_.emplace_back([this] { loop(); });
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    for (auto& t : workers_) t.detach();
  }

  void loop() {
    Stacks stacks;
    std::vector<Fiber> fibers;
    std::vector<unsigned char> smem_buf;
    auto* blk = new Block();  // large (exchange slots): on the heap
    uint64_t seen = 0;
    for (;;) {
      LaunchState* L;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return epoch_ != seen; });
        seen = epoch_;
        L = cur_;
      }
      work(L, blk, stacks, fibers, smem_buf);
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (--pending_ == 0) done_cv_.notify_all();
      }
    }
  }

  static void work(LaunchState* L, Block* blk, Stacks& stacks, std::vector<Fiber>& fibers,
                   std::vector<unsigned char>& smem_buf) {
    const unsigned n = L->block.x * L->block.y * L->block.z;
    if (!stacks.ensure(n)) {
      record(L, "cannot map fiber stacks");
      return;
    }
    fibers.resize(n);
    smem_buf.resize(L->smem + 128);
    unsigned char* smem =
        reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_buf.data()) + 127) & ~uintptr_t(127));
    blk->dim = L->block;
    blk->grid = L->grid;
    blk->nthreads = n;
    blk->nwarps = (n + kWarpSize - 1) / kWarpSize;
    blk->fibers = fibers.data();
    blk->smem = smem;
    blk->body = L->body;
    tl_block = blk;
    for (;;) {
      if (L->failed.load(std::memory_order_relaxed)) break;
      const uint64_t i = L->next.fetch_add(1);
      if (i >= L->total) break;
      blk->idx.x = unsigned(i % L->grid.x);
      blk->idx.y = unsigned(i / L->grid.x % L->grid.y);
      blk->idx.z = unsigned(i / (uint64_t(L->grid.x) * L->grid.y));
      blk->failed = false;
      blk->err.clear();
      std::memset(smem, 0xFF, L->smem);
      for (unsigned t = 0; t < n; t++) {
        Fiber* f = &fibers[t];
        f->linear = t;
        f->tid.x = t % L->block.x;
        f->tid.y = t / L->block.x % L->block.y;
        f->tid.z = t / (L->block.x * L->block.y);
        f->warp = t / kWarpSize;
        f->lane = t % kWarpSize;
        f->wait = Wait::kRunnable;
        f->collectives = 0;
        f->copies.clear();  // copies a thread never waited for die with its block
        f->copies_retired = 0;
        f->committed = 0;
        init_fiber(f, stacks.lo(t), stacks.hi(t));
      }
      if (!run_block(blk)) {
        record(L, blk->err);
        break;
      }
    }
    tl_block = nullptr;
  }

  static void record(LaunchState* L, const std::string& msg) {
    std::lock_guard<std::mutex> lk(L->err_mu);
    if (!L->failed.load()) {
      L->err = msg;
      L->failed.store(true);
    }
  }

  std::mutex launch_mu_, mu_;
  std::condition_variable cv_, done_cv_;
  uint64_t epoch_ = 0;
  unsigned pending_ = 0;
  LaunchState* cur_ = nullptr;
  std::vector<std::thread> workers_;
};

// launch runs body as a kernel over grid x block with smem bytes of dynamic
// shared memory. It returns "" or the reason the launch failed (invalid
// configuration, deadlock, failed thread).
inline std::string launch(dim3 grid, dim3 block, size_t smem, const std::function<void()>& body) {
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  char m[160];
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0 ||
      threads > kMaxThreads || block.z > 64 || grid.y > 65535 || grid.z > 65535) {
    std::snprintf(m, sizeof m, "invalid launch configuration: grid (%u,%u,%u) block (%u,%u,%u)", grid.x, grid.y,
                  grid.z, block.x, block.y, block.z);
    return m;
  }
  if (smem > kMaxDynSmem) {
    std::snprintf(m, sizeof m, "dynamic shared memory %zu bytes exceeds the %zu-byte default limit", smem,
                  kMaxDynSmem);
    return m;
  }
  if (const std::string& e = env_switches(); !e.empty()) return e;
  LaunchState L;
  L.grid = grid;
  L.block = block;
  L.smem = smem;
  L.body = &body;
  L.total = uint64_t(grid.x) * grid.y * grid.z;
  return Pool::get().run(&L);
}

inline unsigned char* dyn_smem() { return tl_block->smem; }

inline unsigned lane_id() { return tl_block->cur->lane; }

// exchange publishes v for the calling lane, waits for the whole warp and
// returns what lane src published.
inline uint64_t exchange(unsigned mask, uint64_t v, unsigned src) {
  Block* b = tl_block;
  Fiber* f = b->cur;
  const unsigned p = f->collectives++ & 1;
  b->xchg[p][f->linear] = v;
  warp_barrier(mask, false);
  return b->xchg[p][f->warp * kWarpSize + src];
}

// ballot_bits publishes pred and returns every lane's bit.
inline unsigned ballot_bits(unsigned mask, bool pred) {
  Block* b = tl_block;
  Fiber* f = b->cur;
  const unsigned p = f->collectives++ & 1;
  b->xchg[p][f->linear] = pred ? 1 : 0;
  warp_barrier(mask, false);
  unsigned bits = 0;
  for (unsigned l = 0; l < kWarpSize; l++)
    if (b->xchg[p][f->warp * kWarpSize + l]) bits |= 1u << l;
  return bits;
}

template <typename T>
inline uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8, "warp shuffles of values wider than 8 bytes are not emulated");
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(T));
  return u;
}

template <typename T>
inline T from_bits(uint64_t u) {
  T v;
  std::memcpy(&v, &u, sizeof(T));
  return v;
}

// ---- cp.async -------------------------------------------------------------------

// cp_async_16 issues a 16-byte cp.async of the calling thread: the
// destination reads as 0xFF bytes (NaN in every float format) until the
// copy's group is retired by cp_async_wait; the source is read then.
inline void cp_async_16(void* dst, const void* src) {
  Fiber* f = tl_block->cur;
  if ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) % 16 != 0) {
    char m[128];
    std::snprintf(m, sizeof m, "cp.async of 16 bytes from %p to %p: both addresses must be 16-byte aligned", src, dst);
    fail(m);
  }
  std::memset(dst, 0xFF, 16);
  f->copies.push_back({static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), f->committed});
}

// cp_async_commit closes the calling thread's open group.
inline void cp_async_commit(const std::source_location& loc) {
  if (keep_sync(loc)) tl_block->cur->committed++;
}

// cp_async_wait retires every copy of the calling thread's committed
// groups but the n most recent (cp.async.wait_group n); copies not yet
// committed stay in flight. A retired copy lands at the thread's next
// __syncthreads or __syncwarp (land_copies): PTX makes it visible to the
// waiting thread at once and to the others after a barrier, and the shim
// cannot tell one reader from another, so it takes the stricter rule for
// all (a thread that reads its own copy before a barrier reads NaN here).
// Landing at the wait would let a warp that waits, reaches a warp
// collective and stalls there land its tile before another warp, released
// from the same collective, reads it: a missing __syncthreads would pass.
inline void cp_async_wait(unsigned n, const std::source_location& loc) {
  if (!keep_sync(loc)) return;
  Fiber* f = tl_block->cur;
  size_t i = f->copies_retired;
  while (i < f->copies.size() && f->copies[i].group + n < f->committed) i++;
  f->copies_retired = i;
}

// land_copies lands the calling thread's retired copies (at a barrier).
inline void land_copies(Fiber* f) {
  if (f->copies_retired == 0) return;
  for (size_t i = 0; i < f->copies_retired; i++) std::memcpy(f->copies[i].dst, f->copies[i].src, 16);
  f->copies.erase(f->copies.begin(), f->copies.begin() + ptrdiff_t(f->copies_retired));
  f->copies_retired = 0;
}

// ---- tensor-core summation ------------------------------------------------------

// tc_block adds the n (<= 8) products a[k]*b[k] to acc the way a tensor
// core's multi-operand adder may (the model of Fasi et al. 2021 and Khattak
// & Mikaitis 2025, at its least precise): the products are exact, every
// addend (acc included) is truncated toward zero to 24 significant bits
// of the largest one's exponent, the truncated addends are summed exactly,
// and the sum is rounded toward zero to f32. Infinities and NaNs take the
// IEEE path.
inline float tc_block(float acc, const float* a, const float* b, int n) {
  double t[9];
  t[0] = acc;
  for (int k = 0; k < n; k++) t[k + 1] = double(a[k]) * double(b[k]);  // exact: 11- or 8-bit significands
  int emax = INT32_MIN;
  double ieee = 0;
  for (int k = 0; k <= n; k++) {
    ieee += t[k];
    if (!std::isfinite(t[k])) return float(ieee);
    if (t[k] != 0) emax = std::max(emax, std::ilogb(t[k]));
  }
  if (emax == INT32_MIN) return float(ieee);  // all zero (keeps -0 + -0 = -0)
  const double ulp = std::ldexp(1.0, emax - 23);
  double sum = 0;  // multiples of ulp below 2^28 ulp: exact in a double
  for (int k = 0; k <= n; k++) sum += std::trunc(t[k] / ulp) * ulp;
  float r = float(sum);
  if (std::fabs(double(r)) > std::fabs(sum)) r = std::nextafter(r, 0.0f);
  return r;
}

// tc_dot16 is c + sum a[k]*b[k] over 16 products in two blocks of 8.
inline float tc_dot16(float c, const float* a, const float* b) {
  return tc_block(tc_block(c, a, b, 8), a + 8, b + 8, 8);
}

inline bool mma_tc() { return switches().mma.load(std::memory_order_relaxed) == int(MMA::kTC); }

}  // namespace cuemu

#define threadIdx (::cuemu::tl_block->cur->tid)
#define blockIdx (::cuemu::tl_block->idx)
#define blockDim (::cuemu::tl_block->dim)
#define gridDim (::cuemu::tl_block->grid)
#define warpSize 32

// ---- synchronisation and warp collectives -----------------------------------

inline void __syncthreads(std::source_location loc = std::source_location::current()) {
  if (::cuemu::keep_sync(loc)) ::cuemu::block_barrier();
}
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::cuemu::warp_barrier(mask, true); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
[[noreturn]] inline void __trap() { ::cuemu::fail("__trap() called"); }

template <typename T>
inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  const unsigned lane = ::cuemu::lane_id();
  const unsigned base = lane & ~unsigned(width - 1);
  const unsigned src = base + (unsigned(src_lane) & unsigned(width - 1));
  return ::cuemu::from_bits<T>(::cuemu::exchange(mask, ::cuemu::to_bits(v), src));
}

template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  const unsigned lane = ::cuemu::lane_id();
  const unsigned base = lane & ~unsigned(width - 1);
  unsigned src = lane ^ unsigned(lane_mask);
  if ((src & ~unsigned(width - 1)) > base || src >= 32) src = lane;  // later groups read their own value
  return ::cuemu::from_bits<T>(::cuemu::exchange(mask, ::cuemu::to_bits(v), src));
}

template <typename T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const unsigned lane = ::cuemu::lane_id();
  const unsigned src = (lane & unsigned(width - 1)) + delta >= unsigned(width) ? lane : lane + delta;
  return ::cuemu::from_bits<T>(::cuemu::exchange(mask, ::cuemu::to_bits(v), src));
}

template <typename T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const unsigned lane = ::cuemu::lane_id();
  const unsigned src = (lane & unsigned(width - 1)) < delta ? lane : lane - delta;
  return ::cuemu::from_bits<T>(::cuemu::exchange(mask, ::cuemu::to_bits(v), src));
}

inline unsigned __ballot_sync(unsigned mask, int pred) { return ::cuemu::ballot_bits(mask, pred != 0); }
inline int __any_sync(unsigned mask, int pred) { return ::cuemu::ballot_bits(mask, pred != 0) != 0; }
inline int __all_sync(unsigned mask, int pred) { return ::cuemu::ballot_bits(mask, pred != 0) == 0xffffffffu; }

// ---- atomics (blocks run in parallel on several workers) ---------------------

template <typename T>
inline T atomicAdd(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_add(v);
}
inline unsigned atomicCAS(unsigned* p, unsigned cmp, unsigned v) {
  std::atomic_ref<unsigned>(*p).compare_exchange_strong(cmp, v);
  return cmp;
}
inline int atomicMax(int* p, int v) {
  std::atomic_ref<int> a(*p);
  int old = a.load();
  while (old < v && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}

// ---- math and bit intrinsics --------------------------------------------------

inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline unsigned __float_as_uint(float f) { return std::bit_cast<unsigned>(f); }
inline float __uint_as_float(unsigned u) { return std::bit_cast<float>(u); }
inline int __float_as_int(float f) { return std::bit_cast<int>(f); }
inline float __int_as_float(int i) { return std::bit_cast<float>(i); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
inline int __ffs(unsigned x) { return __builtin_ffs(int(x)); }
// exp2f, log2f, tanhf, fmaxf, fminf: the C library's, from <math.h>.

// ---- half and bfloat16 ----------------------------------------------------------

typedef _Float16 __half;
typedef __half half;

inline float __half2float(__half h) { return float(h); }
inline __half __float2half(float f) { return __half(f); }  // round to nearest even
inline __half __float2half_rn(float f) { return __half(f); }
inline unsigned short __half_as_ushort(__half h) { return std::bit_cast<unsigned short>(h); }
inline __half __ushort_as_half(unsigned short u) { return std::bit_cast<__half>(u); }
inline __half __hadd(__half a, __half b) { return __half(float(a) + float(b)); }
inline __half __hmul(__half a, __half b) { return __half(float(a) * float(b)); }
inline __half __hfma(__half a, __half b, __half c) { return __half(std::fma(float(a), float(b), float(c))); }

struct __nv_bfloat16 {
  unsigned short x;
};
typedef __nv_bfloat16 nv_bfloat16;

inline float __bfloat162float(__nv_bfloat16 b) { return std::bit_cast<float>(unsigned(b.x) << 16); }
// Round to nearest even; NaN becomes 0x7FFF as in cuda_bf16.h.
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  const unsigned u = std::bit_cast<unsigned>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {0x7fff};
  return {static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return {u}; }

#endif  // PAGEDKV_CUEMU_H
