// AdamW step on the CPU against the memory-bandwidth floor. One step reads
// p, g, m, v and writes p, m, v: 28 bytes per fp32 parameter. The baseline,
// measured in the same run, is a loop with exactly that traffic and trivial
// arithmetic (p += g, m += g, v += g) over the same buffers and threads; the
// table shows GB/s and the share of that floor AdamW reaches, for one big
// tensor and for the same elements split into many small (LoRA-sized) ones.
// Usage: bench_adamw [threads] [million parameters, default 16]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/parallel.h"
#include "train/adamw.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

constexpr double kBytesPerParam = 28.0;

double floor_gbps(std::vector<float>& p, std::vector<float>& g, std::vector<float>& m, std::vector<float>& v) {
  const int64_t n = static_cast<int64_t>(p.size());
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = Clock::now();
    lathe::parallel_for(n, 1 << 15, [&](int64_t b, int64_t e) {
      float* __restrict pp = p.data();
      float* __restrict mm = m.data();
      float* __restrict vv = v.data();
      const float* __restrict gg = g.data();
#pragma omp simd
      for (int64_t i = b; i < e; ++i) {
        pp[i] += gg[i];
        mm[i] += gg[i];
        vv[i] += gg[i];
      }
    });
    best = std::max(best, kBytesPerParam * n / seconds_since(t0) / 1e9);
  }
  return best;
}

double adamw_gbps(std::vector<float>& p, std::vector<float>& g, int64_t tensor_elems) {
  const int64_t n = static_cast<int64_t>(p.size());
  std::vector<lathe::AdamWParam> params;
  for (int64_t off = 0, i = 0; off < n; off += tensor_elems, ++i) {
    params.push_back({.name = "w" + std::to_string(i), .param = p.data() + off, .grad = g.data() + off,
                      .n = std::min(tensor_elems, n - off)});
  }
  auto opt = lathe::AdamW::create({.weight_decay = 0.01}, std::move(params));
  if (!opt.is_ok()) {
    std::fprintf(stderr, "%s\n", opt.status().message().c_str());
    std::exit(1);
  }
  opt->step(1e-4);  // first touch of the state arena
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = Clock::now();
    opt->step(1e-4);
    best = std::max(best, kBytesPerParam * n / seconds_since(t0) / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  lathe::init_threads();
  if (argc > 1) lathe::set_num_threads(std::atoi(argv[1]));
  const int64_t n = (argc > 2 ? std::atoll(argv[2]) : 16) * 1000000;
  std::vector<float> p(n, 0.5f), g(n, 1e-3f), m(n, 0.0f), v(n, 0.0f);
  const double floor = floor_gbps(p, g, m, v);
  std::printf("AdamW step, %lld M fp32 params, %d threads; floor (same traffic, trivial math): %.1f GB/s\n",
              static_cast<long long>(n / 1000000), lathe::num_threads(), floor);
  std::printf("%-28s %10s %10s %10s\n", "layout", "GB/s", "% floor", "Mparam/s");
  for (int64_t elems : {n, int64_t{2048} * 16, int64_t{4096}}) {
    const double gbps = adamw_gbps(p, g, elems);
    char layout[64];
    std::snprintf(layout, sizeof layout, "%lld tensors of %lld", static_cast<long long>((n + elems - 1) / elems),
                  static_cast<long long>(elems));
    std::printf("%-28s %10.1f %9.0f%% %10.0f\n", layout, gbps, 100.0 * gbps / floor, gbps / kBytesPerParam * 1e3);
  }
  return 0;
}
