// Runtime ISA dispatch for the CPU backend: AVX2 + FMA + F16C kernels when the
// machine has them, portable ones otherwise (or when a test forces them);
// on top, the AVX512-BF16 GEMM where the machine has that.
#include <atomic>

#include "backends/cpu/cpu_ops.h"

namespace lathe::cpu {
namespace {
std::atomic<bool> g_portable_only{false};
}

bool has_avx2() {
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                                __builtin_cpu_supports("f16c");
  return supported && !g_portable_only.load(std::memory_order_relaxed);
}

bool has_avx512_bf16() {
  static const bool supported = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  return supported && has_avx2();  // has_avx2() is false while the portable kernels are forced
}

bool has_avx512() {
  static const bool supported = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  return supported && has_avx2();
}

void set_portable_only(bool on) { g_portable_only.store(on, std::memory_order_relaxed); }

}  // namespace lathe::cpu
