// CUDA kernels beside their floors on one GPU: bf16 GEMM TFLOP/s through
// cuBLASLt at the Llama-3.1-8B linear shapes (8192 tokens: micro batch 4 at
// sequence 2048) for forward, dX and dW, against the measured bf16 peak
// (~810 TFLOP/s on H200); RMSNorm+residual and SwiGLU forward in GB/s against
// the memory-bandwidth floor (~4.3 TB/s). Times are the best of several
// repetitions of a stream-synchronized batch of calls. Without a GPU it says
// so and exits 0.
// Usage: bench_cuda_ops [tokens, default 8192]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include "backends/cuda/cuda_ops.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace lathe;
using namespace lathe::cuda;

constexpr double kPeakTflops = 810.0;
constexpr double kPeakGbps = 4300.0;

// Seconds per call: best of 5 batches of `calls`, after one warm-up batch.
double time_calls(CudaContext& ctx, int calls, const std::function<Status()>& fn) {
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i) {
      Status st = fn();
      if (!st.is_ok()) {
        std::fprintf(stderr, "bench_cuda_ops: %s\n", st.message().c_str());
        std::exit(1);
      }
    }
    if (!ctx.synchronize().is_ok()) std::exit(1);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count() / calls;
    if (rep > 0 && s < best) best = s;
  }
  return best;
}

struct Linear {
  const char* name;
  int64_t out, in;
};

void bench_gemms(CudaContext& ctx, DeviceArena& arena, int64_t tokens) {
  const Linear layers[] = {{"q/o_proj", 4096, 4096}, {"k/v_proj", 1024, 4096}, {"gate/up", 14336, 4096},
                           {"down", 4096, 14336}, {"lm_head", 128256, 4096}};
  std::printf("%-10s %-14s %-8s %10s %10s %8s\n", "layer", "out x in", "pass", "ms/call", "TFLOP/s", "% peak");
  for (const Linear& l : layers) {
    arena.reset();
    auto x = arena.alloc_n<bf16_bits>(tokens * l.in, "x");
    auto w = arena.alloc_n<bf16_bits>(l.out * l.in, "w");
    auto y = arena.alloc_n<bf16_bits>(tokens * l.out, "y");
    auto dw = arena.alloc_n<float>(l.out * l.in, "dw");
    if (!x.is_ok() || !w.is_ok() || !y.is_ok() || !dw.is_ok()) {
      std::printf("%-10s skipped: arena too small\n", l.name);
      continue;
    }
    const GemmArgs passes[] = {
        {.a = *x, .b = *w, .c = *y, .m = tokens, .n = l.out, .k = l.in, .trans_b = true},
        {.a = *y, .b = *w, .c = *x, .m = tokens, .n = l.in, .k = l.out},
        {.a = *y, .b = *x, .c = *dw, .m = l.out, .n = l.in, .k = tokens, .trans_a = true, .c_dtype = DType::F32,
         .beta = 1.0f}};
    const char* names[] = {"fwd", "dX", "dW+=f32"};
    for (int p = 0; p < 3; ++p) {
      const double s = time_calls(ctx, 10, [&] { return gemm(ctx, passes[p]); });
      const double tflops = 2.0 * double(tokens) * double(l.out) * double(l.in) / s / 1e12;
      std::printf("%-10s %6lld x %-6lld %-8s %10.3f %10.1f %7.0f%%\n", l.name, (long long)l.out, (long long)l.in,
                  names[p], s * 1e3, tflops, 100.0 * tflops / kPeakTflops);
    }
  }
}

void bench_pointwise(CudaContext& ctx, DeviceArena& arena, int64_t tokens) {
  arena.reset();
  const int64_t dim = 4096, ffn = 14336;
  auto a = arena.alloc_n<bf16_bits>(tokens * ffn, "a");
  auto b = arena.alloc_n<bf16_bits>(tokens * ffn, "b");
  auto c = arena.alloc_n<bf16_bits>(tokens * ffn, "c");
  auto w = arena.alloc_n<bf16_bits>(dim, "w");
  auto rstd = arena.alloc_n<float>(tokens, "rstd");
  if (!a.is_ok() || !b.is_ok() || !c.is_ok() || !w.is_ok() || !rstd.is_ok()) return;
  std::printf("\n%-24s %10s %10s %8s\n", "kernel", "ms/call", "GB/s", "% floor");
  // RMSNorm + residual: reads x, r, writes h, y (bf16): 8 bytes per element.
  RmsNormResidualArgs rn{.x = *a, .residual = *b, .h_out = *b, .w = *w, .y = *c, .rstd = *rstd, .rows = tokens,
                         .dim = dim};
  double s = time_calls(ctx, 20, [&] { return rms_norm_residual_forward(ctx, rn); });
  double gbps = 8.0 * double(tokens * dim) / s / 1e9;
  std::printf("%-24s %10.3f %10.1f %7.0f%%\n", "rms_norm+residual fwd", s * 1e3, gbps, 100.0 * gbps / kPeakGbps);
  // SwiGLU: reads gate, up, writes out (bf16): 6 bytes per element.
  SwigluCudaArgs sw{.gate = *a, .up = *b, .out = *c, .n = tokens * ffn};
  s = time_calls(ctx, 20, [&] { return swiglu_forward(ctx, sw); });
  gbps = 6.0 * double(tokens * ffn) / s / 1e9;
  std::printf("%-24s %10.3f %10.1f %7.0f%%\n", "swiglu fwd", s * 1e3, gbps, 100.0 * gbps / kPeakGbps);
  // SwiGLU backward: reads gate, up, d_out, writes d_gate, d_up: 10 bytes.
  SwigluBackwardCudaArgs sb{.gate = *a, .up = *b, .d_out = *c, .d_gate = *a, .d_up = *b, .n = tokens * ffn};
  s = time_calls(ctx, 20, [&] { return swiglu_backward(ctx, sb); });
  gbps = 10.0 * double(tokens * ffn) / s / 1e9;
  std::printf("%-24s %10.3f %10.1f %7.0f%%\n", "swiglu bwd", s * 1e3, gbps, 100.0 * gbps / kPeakGbps);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t tokens = argc > 1 ? std::atoll(argv[1]) : 8192;
  if (lathe::cuda::device_count() == 0) {
    std::printf("bench_cuda_ops: no CUDA device visible (built with CUDA: %s)\n",
                lathe::cuda::built_with_cuda() ? "yes" : "no");
    return 0;
  }
  auto info = device_info(0);
  auto ctx = CudaContext::create(0);
  if (!info.is_ok() || !ctx.is_ok()) {
    std::fprintf(stderr, "bench_cuda_ops: %s\n", (ctx.is_ok() ? info.status() : ctx.status()).message().c_str());
    return 1;
  }
  std::printf("CUDA ops on %s, %lld tokens; floors: %.0f TFLOP/s bf16, %.0f GB/s\n", info->name.c_str(),
              (long long)tokens, kPeakTflops, kPeakGbps);
  // Largest need: the LM head pass (x, w, y bf16 and dw f32) at these tokens.
  const size_t bytes = size_t(tokens) * 4096 * 2 + size_t(128256) * 4096 * 6 + size_t(tokens) * 128256 * 2 + (16u << 20);
  auto arena = DeviceArena::create(0, bytes);
  if (!arena.is_ok()) {
    std::fprintf(stderr, "bench_cuda_ops: %s\n", arena.status().message().c_str());
    return 1;
  }
  bench_gemms(*ctx, *arena, tokens);
  bench_pointwise(*ctx, *arena, tokens);
  return 0;
}
