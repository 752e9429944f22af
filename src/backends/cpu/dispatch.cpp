// Runtime ISA dispatch for the CPU backend: AVX2 + FMA + F16C kernels when the
// machine has them, portable ones otherwise (or when a test forces them).
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

void set_portable_only(bool on) { g_portable_only.store(on, std::memory_order_relaxed); }

}  // namespace lathe::cpu
