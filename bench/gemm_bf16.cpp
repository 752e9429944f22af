// The bf16 GEMM of training's frozen base (gemm_bf16) on each path this
// machine runs — AMX tiles, AVX512-BF16, widened to f32 — beside OpenBLAS
// sgemm on the same shapes, in GFLOP/s. The shapes are the 58M Llama's
// (hidden 512, FFN 1376, vocab 32000) for a 4 x 256-token micro batch:
// forward y = x·Wᵀ and input gradient dx = dy·W of the projections, and the
// LM head's chunk of 256 or 1024 rows; each bf16 path also with the weight
// packed ahead. Then LoRA's f32 products, OpenBLAS against sgemm_skinny.
// Best of a few calls after a warm-up.
// Usage: bench_gemm_bf16 [threads] [reps, default 5]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/gemm_amx.h"
#include "backends/cpu/gemm_bf16.h"
#include "backends/cpu/gemm_skinny.h"
#include "core/dtype.h"
#include "core/parallel.h"

namespace {

using namespace lathe;
using Clock = std::chrono::steady_clock;

struct GemmShape {
  const char* name;
  bool trans_b;
  int64_t m, n, k;
};

const GemmShape kShapes[] = {
    {"q/k/v/o fwd", true, 1024, 512, 512},    {"gate/up fwd", true, 1024, 1376, 512},
    {"down fwd", true, 1024, 512, 1376},      {"q/k/v/o dx", false, 1024, 512, 512},
    {"gate/up dx", false, 1024, 512, 1376},   {"down dx", false, 1024, 1376, 512},
    {"lm head fwd", true, 256, 32000, 512},   {"lm head dx", false, 256, 512, 32000},
    {"lm head fwd", true, 1024, 32000, 512},  {"lm head dx", false, 1024, 512, 32000},
};

// LoRA's f32 products at rank 16 (q/k/v grouped: 48) on 1024 tokens.
struct SkinnyShape {
  const char* name;
  bool ta, tb;
  int64_t m, n, k;
};
const SkinnyShape kSkinny[] = {
    {"x·Aᵀ qkv", false, true, 1024, 48, 512},  {"x·Aᵀ down", false, true, 1024, 16, 1376},
    {"u·Bᵀ", false, true, 1024, 512, 16},      {"u·Bᵀ gate", false, true, 1024, 1376, 16},
    {"dy·B", false, false, 1024, 16, 512},     {"dy·B gate", false, false, 1024, 16, 1376},
    {"dyᵀ·u (dB)", true, false, 512, 16, 1024}, {"duᵀ·x (dA qkv)", true, false, 48, 512, 1024},
    {"du·A (dx qkv)", false, false, 1024, 512, 48},
};

template <typename F>
double best_seconds(int reps, F&& f) {
  f();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2, reps = argc > 2 ? std::atoi(argv[2]) : 5;
  set_num_threads(threads);
  std::vector<std::pair<const char*, cpu::Bf16GemmPath>> paths;
  if (cpu::amx_bf16_available()) paths.push_back({"amx", cpu::Bf16GemmPath::kAmx});
  if (cpu::has_avx512_bf16()) paths.push_back({"avx512bf16", cpu::Bf16GemmPath::kAvx512Bf16});
  paths.push_back({"bf16->f32", cpu::Bf16GemmPath::kF32});
  if (cpu::amx_bf16_available()) {
    std::printf("AMX micro-kernel, 1 thread: L1 data %.0f GFLOP/s; A from L2: %.0f, with prefetch %.0f\n",
                cpu::amx_tile_peak_gflops(200000), cpu::amx_stream_gflops(false, 50000),
                cpu::amx_stream_gflops(true, 50000));
  }
  std::printf("%d threads, GFLOP/s (best of %d); \"packed\": the weight packed ahead (PackedBf16Weight)\n"
              "| shape | m x n x k |", threads, reps);
  for (const auto& p : paths)
    std::printf(" %s |%s", p.first,
                p.second == cpu::Bf16GemmPath::kF32   ? ""
                : p.second == cpu::Bf16GemmPath::kAmx ? " packed | packed, rows split |"
                                                      : " packed |");
  std::printf(" sgemm f32 |\n|---|---|");
  for (const auto& p : paths)
    std::printf(p.second == cpu::Bf16GemmPath::kF32 ? "---:|" : p.second == cpu::Bf16GemmPath::kAmx ? "---:|---:|---:|" : "---:|---:|");
  std::printf("---:|");
  std::printf("\n");
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (const GemmShape& s : kShapes) {
    std::vector<float> a(size_t(s.m * s.k)), c(size_t(s.m * s.n)), w32(size_t(s.n * s.k));
    std::vector<uint16_t> w16(size_t(s.n * s.k));
    for (float& x : a) x = d(rng);
    for (size_t i = 0; i < w16.size(); ++i) w32[i] = bf16_to_f32(w16[i] = f32_to_bf16(d(rng)));
    const int64_t ldb = s.trans_b ? s.k : s.n;
    const double flop = 2.0 * double(s.m) * double(s.n) * double(s.k);
    std::printf("| %s | %ld x %ld x %ld |", s.name, long(s.m), long(s.n), long(s.k));
    for (const auto& p : paths) {
      cpu::force_bf16_gemm_path(p.second);
      const double t = best_seconds(reps, [&] {
        cpu::gemm_bf16(s.trans_b, s.m, s.n, s.k, 1.0f, a.data(), s.k, w16.data(), ldb, false, c.data(), s.n);
      });
      std::printf(" %.0f |", flop / t * 1e-9);
      if (p.second == cpu::Bf16GemmPath::kF32) continue;
      // w [out, in]: [n, k] for a forward, [k, n] for an input gradient.
      const cpu::PackedBf16Weight pw(w16.data(), s.trans_b ? s.n : s.k, s.trans_b ? s.k : s.n);
      cpu::set_amx_rows_split(false);
      const double tp = best_seconds(reps, [&] {
        if (s.trans_b)
          pw.forward(s.m, 1.0f, a.data(), s.k, false, c.data(), s.n);
        else
          pw.backward(s.m, 1.0f, a.data(), s.k, false, c.data(), s.n);
      });
      cpu::set_amx_rows_split(true);
      std::printf(" %.0f |", flop / tp * 1e-9);
      if (p.second != cpu::Bf16GemmPath::kAmx) continue;
      const double tr = best_seconds(reps, [&] {
        if (s.trans_b)
          pw.forward(s.m, 1.0f, a.data(), s.k, false, c.data(), s.n);
        else
          pw.backward(s.m, 1.0f, a.data(), s.k, false, c.data(), s.n);
      });
      std::printf(" %.0f |", flop / tr * 1e-9);
    }
    const double t = best_seconds(reps, [&] {
      cpu::sgemm(false, s.trans_b, s.m, s.n, s.k, 1.0f, a.data(), s.k, w32.data(), ldb, 0.0f, c.data(), s.n);
    });
    std::printf(" %.0f |\n", flop / t * 1e-9);
  }
  cpu::force_bf16_gemm_path(std::nullopt);
  std::printf("\nLoRA's f32 products, GFLOP/s: OpenBLAS sgemm (split by gemm.h) | sgemm_skinny\n");
  for (const SkinnyShape& s : kSkinny) {
    const int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    std::vector<float> a(size_t(s.m * s.k)), b(size_t(s.k * s.n)), c(size_t(s.m * s.n), 0.0f);
    for (float& x : a) x = d(rng);
    for (float& x : b) x = d(rng);
    const double flop = 2.0 * double(s.m) * double(s.n) * double(s.k);
    const double t0 = best_seconds(reps, [&] {
      cpu::sgemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, 1.0f, c.data(), s.n);
    });
    const double t1 = best_seconds(reps, [&] {
      cpu::sgemm_skinny(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, 1.0f, c.data(), s.n);
    });
    std::printf("| %s | %ld x %ld x %ld | %.0f | %.0f |\n", s.name, long(s.m), long(s.n), long(s.k),
                flop / t0 * 1e-9, flop / t1 * 1e-9);
  }
  return 0;
}
