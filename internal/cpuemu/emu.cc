// emu.cc: the kernels of kernels/cuda compiled for the CPU against the shim
// (cuemu.h of this directory, pulled in by kernels/cuda/compat.cuh), and the
// C entry points emu.go calls. One translation unit: g++ time is the cost of this package.
#include "../../kernels/cuda/append.cu"
#include "../../kernels/cuda/decode.cu"
#include "../../kernels/cuda/prefill.cu"
#include "../../kernels/cuda/decode_tc.cu"
#include "../../kernels/cuda/merge.cu"
#include "../../kernels/cuda/mla_decode.cu"
#include "../../kernels/cuda/mla_tc.cu"
#include "selftest.inc"

#include <cstdlib>
#include <type_traits>
#include <utility>

#include "emu.h"

namespace {

// arg_as turns one 8-byte launch argument into the kernel's parameter type.
// Only 8-byte pointers, integers and doubles compile: the same rule the GPU
// launch (gorgonia.org/cu copies 8 bytes per argument) imposes.
template <typename T>
T arg_as(uint64_t a) {
  if constexpr (std::is_pointer_v<T>) {
    return reinterpret_cast<T>(static_cast<uintptr_t>(a));
  } else if constexpr (std::is_same_v<T, double>) {
    return std::bit_cast<double>(a);
  } else {
    static_assert(std::is_integral_v<T> && sizeof(T) == 8,
                  "kernel parameters must be 8 bytes: pointers, int64_t or double");
    return static_cast<T>(a);
  }
}

template <typename... A, size_t... I>
void invoke(void (*k)(A...), const uint64_t* a, std::index_sequence<I...>) {
  k(arg_as<A>(a[I])...);
}

struct Entry {
  const char* name;
  int arity;
  std::function<void(const uint64_t*)> call;
};

template <typename... A>
Entry entry(const char* name, void (*k)(A...)) {
  return {name, int(sizeof...(A)), [k](const uint64_t* a) { invoke(k, a, std::index_sequence_for<A...>{}); }};
}

#define PKV_ENTRY(name) entry(#name, &name)
#define PKV_DECODE_ENTRIES(sfx)                                                                              \
  PKV_ENTRY(batch_decode_paged_##sfx##_v1), PKV_ENTRY(batch_decode_paged_##sfx##_v2),                        \
      PKV_ENTRY(batch_decode_paged_##sfx##_v4), PKV_ENTRY(batch_decode_paged_##sfx##_v8)

#define PKV_PREFILL_ENTRIES(sfx)                                                                              \
  PKV_ENTRY(batch_prefill_paged_##sfx##_d64), PKV_ENTRY(batch_prefill_paged_##sfx##_d128),                      \
      PKV_ENTRY(batch_prefill_paged_##sfx##_d256)
#define PKV_TC_DECODE_ENTRIES(sfx)                                                                  \
  PKV_ENTRY(batch_decode_paged_tc_##sfx##_d64), PKV_ENTRY(batch_decode_paged_tc_##sfx##_d128), \
      PKV_ENTRY(batch_decode_paged_tc_##sfx##_d256)

#define PKV_MLA_ENTRIES(sfx)                                                                       \
  PKV_ENTRY(mla_decode_##sfx##_c1), PKV_ENTRY(mla_decode_##sfx##_c2), PKV_ENTRY(mla_decode_##sfx##_c4), \
      PKV_ENTRY(mla_decode_##sfx##_c8), PKV_ENTRY(mla_decode_##sfx##_c16)

#define PKV_MLA_TC_ENTRIES(sfx) PKV_ENTRY(mla_decode_tc_##sfx), PKV_ENTRY(mla_decode_tc_##sfx##_hilo)

const std::vector<Entry>& entries() {
  static const std::vector<Entry> e = {
      PKV_ENTRY(append_paged_kv_cache_u16),
      PKV_ENTRY(append_paged_kv_cache_u8),
      PKV_ENTRY(append_paged_kv_cache_u4),
      PKV_ENTRY(append_paged_kv_cache_u2),
      PKV_ENTRY(append_paged_kv_cache_u1),
      PKV_ENTRY(append_paged_mla_kv_cache_u16),
      PKV_ENTRY(append_paged_mla_kv_cache_u8),
      PKV_ENTRY(append_paged_mla_kv_cache_u4),
      PKV_ENTRY(append_paged_mla_kv_cache_u2),
      PKV_ENTRY(append_paged_mla_kv_cache_u1),
      PKV_ENTRY(append_paged_kv_cache_quant),
      PKV_ENTRY(append_paged_kv_cache_nvfp4),
      PKV_DECODE_ENTRIES(f32),
      PKV_DECODE_ENTRIES(f16),
      PKV_DECODE_ENTRIES(bf16),
      PKV_DECODE_ENTRIES(e4m3),
      PKV_DECODE_ENTRIES(e5m2),
      PKV_ENTRY(batch_decode_paged_nvfp4_v2),
      PKV_ENTRY(batch_decode_paged_nvfp4_v4),
      PKV_ENTRY(batch_decode_paged_nvfp4_v8),
      PKV_PREFILL_ENTRIES(f16),
      PKV_PREFILL_ENTRIES(bf16),
      PKV_PREFILL_ENTRIES(e4m3),
      PKV_PREFILL_ENTRIES(e5m2),
      PKV_PREFILL_ENTRIES(nvfp4),
      PKV_TC_DECODE_ENTRIES(f16),
      PKV_TC_DECODE_ENTRIES(bf16),
      PKV_TC_DECODE_ENTRIES(e4m3),
      PKV_TC_DECODE_ENTRIES(e5m2),
      PKV_ENTRY(merge_partial_states),
      PKV_ENTRY(merge_state),
      PKV_ENTRY(merge_states),
      PKV_MLA_ENTRIES(f32),
      PKV_MLA_ENTRIES(f16),
      PKV_MLA_ENTRIES(bf16),
      PKV_MLA_ENTRIES(e4m3),
      PKV_MLA_ENTRIES(e5m2),
      PKV_MLA_TC_ENTRIES(f16),
      PKV_MLA_TC_ENTRIES(bf16),
      PKV_MLA_TC_ENTRIES(e4m3),
      PKV_MLA_TC_ENTRIES(e5m2),
      PKV_ENTRY(cuemu_test_shuffles),
      PKV_ENTRY(cuemu_test_reverse),
      PKV_ENTRY(cuemu_test_reverse_unsynced),
      PKV_ENTRY(cuemu_test_misuse),
      PKV_ENTRY(cuemu_test_fp8_pairs),
      PKV_ENTRY(cuemu_test_mma),
      PKV_ENTRY(cuemu_test_ldmatrix),
      PKV_ENTRY(cuemu_test_tc_offsets),
      PKV_ENTRY(cuemu_test_page_div),
      PKV_ENTRY(cuemu_test_prefill_offsets),
      PKV_ENTRY(cuemu_test_cp_async),
  };
  return e;
}

const Entry* find(const char* name) {
  for (const Entry& e : entries())
    if (std::strcmp(e.name, name) == 0) return &e;
  return nullptr;
}

}  // namespace

extern "C" int cuemu_arity(const char* name) {
  const Entry* e = find(name);
  return e ? e->arity : -1;
}

extern "C" int cuemu_launch(const char* name, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                            unsigned bz, size_t smem, const uint64_t* args, int nargs, char* err, size_t errlen) {
  std::string msg;
  const Entry* e = find(name);
  if (e == nullptr) {
    msg = std::string("no kernel ") + name;
  } else if (e->arity != nargs) {
    msg = std::string("kernel ") + name + " takes " + std::to_string(e->arity) + " arguments, got " +
          std::to_string(nargs);
  } else {
    std::function<void()> body = [e, args] { e->call(args); };
    msg = ::cuemu::launch(dim3{gx, gy, gz}, dim3{bx, by, bz}, smem, body);
  }
  if (msg.empty()) return 0;
  std::snprintf(err, errlen, "%s", msg.c_str());
  return -1;
}

extern "C" uint64_t cuemu_alloc(size_t n) {
  void* p = std::aligned_alloc(256, (n + 255) / 256 * 256);
  if (p == nullptr) return 0;
  std::memset(p, 0xFF, n);  // like fresh device memory, never zero by luck
  return reinterpret_cast<uintptr_t>(p);
}

extern "C" void cuemu_free(uint64_t p) { std::free(reinterpret_cast<void*>(static_cast<uintptr_t>(p))); }

extern "C" void cuemu_htod(uint64_t dst, const void* src, size_t n) {
  std::memcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(dst)), src, n);
}

extern "C" void cuemu_dtoh(void* dst, uint64_t src, size_t n) {
  std::memcpy(dst, reinterpret_cast<const void*>(static_cast<uintptr_t>(src)), n);
}

extern "C" void cuemu_memset(uint64_t dst, int value, size_t n) {
  std::memset(reinterpret_cast<void*>(static_cast<uintptr_t>(dst)), value, n);
}

extern "C" void cuemu_dtod(uint64_t dst, uint64_t src, size_t n) {
  std::memmove(reinterpret_cast<void*>(static_cast<uintptr_t>(dst)), reinterpret_cast<const void*>(static_cast<uintptr_t>(src)), n);
}

namespace {
int report(const std::string& msg, char* err, size_t errlen) {
  if (msg.empty()) return 0;
  std::snprintf(err, errlen, "%s", msg.c_str());
  return -1;
}
}  // namespace

extern "C" int cuemu_drop_sync(const char* site, char* err, size_t errlen) {
  ::cuemu::env_switches();  // the environment applies first, so this call wins
  return report(::cuemu::set_drop_sync(site), err, errlen);
}

extern "C" int cuemu_set_mma(const char* mode, char* err, size_t errlen) {
  ::cuemu::env_switches();
  return report(::cuemu::set_mma(mode), err, errlen);
}
