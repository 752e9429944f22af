// Linear on the CPU against the memory-bandwidth floor. Decode (n = 1..4
// tokens) streams every weight once, so its floor is the time to read the
// weights: the table shows GB/s of weights read and that as a share of a plain
// vectorized read of the same bytes (the baseline, measured in this run).
// Prefill (n = 128) is a GEMM and is reported in GFLOP/s.
// Usage: bench_linear [threads] [MiB of weights per shape, default 256: keep it
// well above the last-level cache]
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "core/parallel.h"
#include "core/tensor.h"

namespace {

using Clock = std::chrono::steady_clock;
using lathe::DType;
using lathe::Tensor;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Baseline: read `bytes` with AVX2 loads on all threads.
__attribute__((target("avx2"))) double read_gbps(const std::vector<Tensor>& ws) {
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = Clock::now();
    double bytes = 0;
    float sink = 0;
    for (const Tensor& w : ws) {
      const float* p = static_cast<const float*>(w.raw());
      int64_t n = w.nbytes() / 4;
      bytes += double(w.nbytes());
#pragma omp parallel reduction(+ : sink)
      {
        // Four independent sums, so the adds never limit the read rate.
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i += 32) {
          a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
          a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
          a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
          a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
        }
        float tmp[8];
        _mm256_storeu_ps(tmp, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        sink += tmp[0];
      }
    }
    double gbps = bytes / seconds_since(t0) / 1e9;
    if (sink == 12345.0f) std::printf(" ");
    best = std::max(best, gbps);
  }
  return best;
}

// Times one linear over a rotating set of weights (together far larger than L3).
double time_linear(const std::vector<Tensor>& ws, int64_t n, int reps) {
  const int64_t out = ws[0].size(0), in = ws[0].size(1);
  Tensor x = Tensor::zeros(DType::F32, {n, in});
  Tensor y = Tensor::zeros(DType::F32, {n, out});
  Tensor work = Tensor::empty(DType::F32, {std::max<int64_t>(1, lathe::linear_workspace_floats(n, in, ws[0].dtype(), lathe::num_threads()))});
  double best = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    auto t0 = Clock::now();
    for (const Tensor& w : ws) {
      lathe::Status s = lathe::cpu::linear_forward({.x = x, .w = w, .y = y, .workspace = work});
      if (!s.is_ok()) std::abort();
    }
    best = std::min(best, seconds_since(t0) / double(ws.size()));
  }
  return best;
}

std::vector<Tensor> make_weights(DType dt, int64_t out, int64_t in, int64_t total_bytes) {
  std::vector<Tensor> ws;
  int64_t one = lathe::dtype_bytes(dt, out * in);
  for (int64_t b = 0; b < std::max<int64_t>(total_bytes, one); b += one) {
    Tensor w = Tensor::empty(dt, {out, in});
    std::vector<char> noise(size_t(w.nbytes()));
    for (size_t i = 0; i < noise.size(); i += 2) noise[i] = char(i * 7), noise[i + 1] = 0x3c;  // small finite values
    std::memcpy(w.raw(), noise.data(), noise.size());
    ws.push_back(w);
  }
  return ws;
}

}  // namespace

int main(int argc, char** argv) {
  lathe::init_threads();
  if (argc > 1) lathe::set_num_threads(std::atoi(argv[1]));
  const int threads = lathe::num_threads();
  std::printf("linear on the CPU, %d threads, vector kernels: %s\n", threads, lathe::cpu::has_avx2() ? "avx2" : "no");
  const int64_t total = (argc > 2 ? std::atoll(argv[2]) : 256) << 20;
  std::printf("%-8s %-14s %4s %10s %10s %10s\n", "weights", "out x in", "n", "ms/call", "GB/s", "% floor");
  struct Shape { int64_t out, in; };
  for (DType dt : {DType::BF16, DType::F32}) {
    for (Shape sh : {Shape{2048, 2048}, Shape{8192, 2048}, Shape{2048, 8192}}) {
      std::vector<Tensor> ws = make_weights(dt, sh.out, sh.in, total);
      double floor = read_gbps(ws);
      for (int64_t n : {1, 4}) {
        double t = time_linear(ws, n, 5);
        double gbps = double(ws[0].nbytes()) / t / 1e9;
        std::printf("%-8s %6lld x %-6lld %4lld %10.3f %10.1f %9.0f%%\n", std::string(lathe::dtype_name(dt)).c_str(),
                    (long long)sh.out, (long long)sh.in, (long long)n, t * 1e3, gbps, 100 * gbps / floor);
      }
      std::printf("%-8s %6lld x %-6lld %4s %10s %10.1f %10s  (baseline: plain read)\n",
                  std::string(lathe::dtype_name(dt)).c_str(), (long long)sh.out, (long long)sh.in, "-", "-", floor,
                  "100%");
      std::vector<Tensor> one(ws.begin(), ws.begin() + 1);
      double t = time_linear(one, 128, 3);
      std::printf("%-8s %6lld x %-6lld %4d %10.3f %10.1f GFLOP/s (prefill GEMM)\n",
                  std::string(lathe::dtype_name(dt)).c_str(), (long long)sh.out, (long long)sh.in, 128, t * 1e3,
                  2.0 * 128 * double(sh.out * sh.in) / t / 1e9);
    }
  }
  return 0;
}
