// The f32 LoRA branch of the GPU trainer, op by op, at the Llama-3.2-1B
// (16384 tokens: micro batch 8 at sequence 2048) and Llama-3.1-8B (8192
// tokens) shapes, rank 32 on all seven projections: for each fused group
// (q|k|v, o, gate|up, down) the calls CudaModelImpl::group_forward and
// group_backward make, each timed alone and set beside its memory floor
// (the bytes it must move over ~4.3 TB/s) and with its TFLOP/s: cuBLASLt
// GEMMs over the stacked 4-term copies into f32 parts, then lora_sum_parts
// (lora_ops.h); the factor gradients one GEMM with K = tokens per member.
// The totals add the ops up per step. The lines after them time the base
// GEMM with its LoRA product in both orders (which one reads the shared bf16
// output back; the backward's dx takes the LoRA-first order). Buffers are
// zeros: only time is measured.
// Usage: bench_cuda_lora [1b|8b|both, default both]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backends/cuda/cuda_ops.h"
#include "cuda_timing.h"
#include "backends/cuda/lora_ops.h"

namespace {

using namespace lathe;
using namespace lathe::cuda;

constexpr double kPeakGbps = 4300.0;
constexpr int64_t kRank = 32;

double time_calls(CudaContext& ctx, int calls, const std::function<Status()>& fn) {
  return bench::time_calls("bench_cuda_lora", ctx, calls, fn);
}

struct LoraShape {
  const char* name;
  int64_t tokens, hidden, inter, q_dim, kv_dim, layers;
};

struct Group {
  const char* name;
  int64_t in;
  std::vector<int64_t> outs;
};

// Seconds per layer of the trainer's LoRA calls.
struct Totals {
  double fwd = 0, bwd = 0;
};

// One op: time, its memory floor, the share of bandwidth reached, TFLOP/s.
void row(const char* group, const char* op, double s, double bytes, double flops) {
  const double gbps = bytes / s / 1e9;
  std::printf("%-8s %-34s %9.3f %9.3f %7.0f%% %8.0f\n", group, op, s * 1e3, bytes / kPeakGbps / 1e6,
              100.0 * gbps / kPeakGbps, flops / s / 1e12);
}

// Every LoRA op of one group, as the trainer calls it.
Status bench_group(CudaContext& ctx, DeviceArena& arena, int64_t T, const Group& g, Totals* tot) {
  arena.reset();
  const int64_t r = kRank, nl = int64_t(g.outs.size()), w = nl * 4 * r;
  int64_t out = 0, widest = g.in;
  for (int64_t o : g.outs) out += o, widest = std::max(widest, o);
  LATHE_ASSIGN_OR_RETURN(bf16_bits * x, arena.alloc_n<bf16_bits>(T * g.in, "x"));
  LATHE_ASSIGN_OR_RETURN(bf16_bits * y, arena.alloc_n<bf16_bits>(T * out, "y"));
  LATHE_ASSIGN_OR_RETURN(bf16_bits * a4, arena.alloc_n<bf16_bits>(w * g.in, "A4"));
  LATHE_ASSIGN_OR_RETURN(bf16_bits * b4, arena.alloc_n<bf16_bits>(out * 4 * r, "B4"));
  LATHE_ASSIGN_OR_RETURN(bf16_bits * u, arena.alloc_n<bf16_bits>(T * w, "u"));
  LATHE_ASSIGN_OR_RETURN(bf16_bits * du, arena.alloc_n<bf16_bits>(T * w, "du"));
  const int64_t n_part = std::max(T * w, widest * 2 * r);
  LATHE_ASSIGN_OR_RETURN(float* part, arena.alloc_n<float>(n_part, "partials"));
  LATHE_ASSIGN_OR_RETURN(float* grads, arena.alloc_n<float>((g.in * nl + out) * r, "grads"));
  LATHE_ASSIGN_OR_RETURN(bf16_bits * wt, arena.alloc_n<bf16_bits>(out * g.in, "W"));
  LATHE_TRY(fill_zero(ctx, arena.base(), arena.used()));
  const double tb = double(T) * 2;  // bytes per bf16 column over the tokens
  const double ft = double(T) * 2;  // flops per multiply-add column over the tokens
  double fwd = 0, bwd = 0;

  // Forward: u = x·A4ᵀ (f32 parts), summed and split; y += s·u·B4ᵀ per member.
  double s = time_calls(ctx, 10, [&] {
    return gemm(ctx, {.a = x, .b = a4, .c = part, .m = T, .n = w, .k = g.in, .trans_b = true, .c_dtype = DType::F32});
  });
  row(g.name, "fwd u   x.A4 GEMM (f32 parts)", s, tb * g.in + tb * w * 2, ft * g.in * w), fwd += s;
  s = time_calls(ctx, 10, [&] {
    return lora_sum_parts(ctx, {.src = part, .rows = T, .cols = r, .n_groups = nl, .n_parts = 3, .row_stride = w,
                                .group_stride = 4 * r, .part_stride = r, .split = u});
  });
  row(g.name, "fwd u   sum parts -> u4", s, tb * w * 1.5 + tb * w, 0), fwd += s;
  auto lora_y = [&](float beta) {  // y (+)= u4·B4ᵀ per member
    int64_t col = 0;
    for (int64_t k = 0; k < nl; ++k) {
      const int64_t o = g.outs[size_t(k)];
      LATHE_TRY(gemm(ctx, {.a = u + k * 4 * r, .b = b4 + col * 4 * r, .c = y + col, .m = T, .n = o, .k = 4 * r,
                           .trans_b = true, .beta = beta, .lda = w, .ldc = out}));
      col += o;
    }
    return Status::ok();
  };
  s = time_calls(ctx, 10, [&] { return lora_y(1.0f); });
  row(g.name, "fwd y += u4.B4 (per member)", s, tb * out * 2 + tb * w, ft * out * 4 * r), fwd += s;

  // Backward: dB, du (summed and split), dA, the LoRA term of dx.
  s = time_calls(ctx, 5, [&] {
    int64_t col = 0;
    for (int64_t k = 0; k < nl; ++k) {
      const int64_t o = g.outs[size_t(k)];
      LATHE_TRY(gemm(ctx, {.a = y + col, .b = u + k * 4 * r + 2 * r, .c = part, .m = o, .n = 2 * r, .k = T,
                           .trans_a = true, .c_dtype = DType::F32, .lda = out, .ldb = w}));
      LATHE_TRY(lora_sum_parts(ctx, {.src = part, .rows = o, .cols = r, .n_parts = 2, .row_stride = 2 * r,
                                     .part_stride = r, .sum = grads, .accumulate = true}));
      col += o;
    }
    return Status::ok();
  });
  row(g.name, "bwd dB  GEMM K=T + sum", s, tb * out + tb * 2 * r * nl, ft * out * 2 * r), bwd += s;
  s = time_calls(ctx, 10, [&] {
    int64_t c = 0;
    for (int64_t k = 0; k < nl; ++k) {
      const int64_t o = g.outs[size_t(k)];
      LATHE_TRY(gemm(ctx, {.a = y + c, .b = b4 + c * 4 * r, .c = part + k * 4 * r, .m = T, .n = 4 * r, .k = o,
                           .c_dtype = DType::F32, .lda = out, .ldc = w}));
      c += o;
    }
    return Status::ok();
  });
  row(g.name, "bwd du  dy.B4 GEMM per member", s, tb * out + tb * w * 2, ft * out * 4 * r), bwd += s;
  s = time_calls(ctx, 10, [&] {
    return lora_sum_parts(ctx, {.src = part, .rows = T, .cols = r, .n_groups = nl, .n_parts = 3, .row_stride = w,
                                .group_stride = 4 * r, .part_stride = r, .split = du});
  });
  row(g.name, "bwd du  sum parts -> du4", s, tb * w * 1.5 + tb * w, 0), bwd += s;
  s = time_calls(ctx, 5, [&] {
    for (int64_t k = 0; k < nl; ++k) {
      LATHE_TRY(gemm(ctx, {.a = du + k * 4 * r + 2 * r, .b = x, .c = part, .m = 2 * r, .n = g.in, .k = T,
                           .trans_a = true, .c_dtype = DType::F32, .lda = w}));
      LATHE_TRY(lora_sum_parts(ctx, {.src = part, .rows = r, .cols = g.in, .n_parts = 2, .row_stride = g.in,
                                     .part_stride = r * g.in, .sum = grads, .accumulate = true}));
    }
    return Status::ok();
  });
  row(g.name, "bwd dA  GEMM K=T + sum", s, tb * g.in + tb * 2 * r * nl, ft * g.in * nl * 2 * r), bwd += s;
  s = time_calls(ctx, 10, [&] { return gemm(ctx, {.a = du, .b = a4, .c = x, .m = T, .n = g.in, .k = w}); });
  row(g.name, "bwd dx = du4.A4 (base adds later)", s, tb * g.in + tb * w, ft * g.in * w), bwd += s;

  // The base product and the LoRA one into the same bf16 output, in either
  // order: base first, then the LoRA GEMM reads and rewrites the output; or
  // the LoRA GEMM only writes and the base GEMM reads it back in its
  // epilogue (beta 1). Both lines include the base GEMM.
  const double base_f = ft * out * g.in;
  s = time_calls(ctx, 5, [&] {
    LATHE_TRY(gemm(ctx, {.a = x, .b = wt, .c = y, .m = T, .n = out, .k = g.in, .trans_b = true}));
    return lora_y(1.0f);
  });
  row(g.name, "fwd base, then y += u4.B4", s, tb * (g.in + out * 3 + w), base_f + ft * out * 4 * r);
  s = time_calls(ctx, 5, [&] {
    LATHE_TRY(lora_y(0.0f));
    return gemm(ctx, {.a = x, .b = wt, .c = y, .m = T, .n = out, .k = g.in, .trans_b = true, .beta = 1.0f});
  });
  row(g.name, "fwd y = u4.B4, then base beta 1", s, tb * (g.in + out * 3 + w), base_f + ft * out * 4 * r);
  s = time_calls(ctx, 5, [&] {
    LATHE_TRY(gemm(ctx, {.a = y, .b = wt, .c = x, .m = T, .n = g.in, .k = out}));
    return gemm(ctx, {.a = du, .b = a4, .c = x, .m = T, .n = g.in, .k = w, .beta = 1.0f});
  });
  row(g.name, "bwd base dx, then dx += du4.A4", s, tb * (out + g.in * 3 + w), base_f + ft * g.in * w);
  s = time_calls(ctx, 5, [&] {
    LATHE_TRY(gemm(ctx, {.a = du, .b = a4, .c = x, .m = T, .n = g.in, .k = w}));
    return gemm(ctx, {.a = y, .b = wt, .c = x, .m = T, .n = g.in, .k = out, .beta = 1.0f});
  });
  row(g.name, "bwd dx = du4.A4, then base beta 1", s, tb * (out + g.in * 3 + w), base_f + ft * g.in * w);
  tot->fwd += fwd, tot->bwd += bwd;
  return Status::ok();
}

Status bench_shape(CudaContext& ctx, DeviceArena& arena, const LoraShape& sh) {
  const std::vector<Group> groups = {{"q|k|v", sh.hidden, {sh.q_dim, sh.kv_dim, sh.kv_dim}},
                                     {"o", sh.q_dim, {sh.hidden}},
                                     {"gate|up", sh.hidden, {sh.inter, sh.inter}},
                                     {"down", sh.inter, {sh.hidden}}};
  std::printf("\n%s: %lld tokens, LoRA r %lld on all seven projections, %lld layers\n", sh.name, (long long)sh.tokens,
              (long long)kRank, (long long)sh.layers);
  std::printf("%-8s %-34s %9s %9s %8s %8s\n", "group", "op", "ms", "floor ms", "% bw", "TFLOP/s");
  Totals tot;
  for (const Group& g : groups) LATHE_TRY(bench_group(ctx, arena, sh.tokens, g, &tot));
  const double L = double(sh.layers) * 1e3;
  std::printf("per step (x %lld layers): forward %.2f ms, backward %.2f ms, total %.2f ms\n", (long long)sh.layers,
              tot.fwd * L, tot.bwd * L, (tot.fwd + tot.bwd) * L);
  return Status::ok();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "both";
  if (lathe::cuda::device_count() == 0) {
    std::printf("bench_cuda_lora: no CUDA device visible (built with CUDA: %s)\n",
                lathe::cuda::built_with_cuda() ? "yes" : "no");
    return 0;
  }
  auto info = device_info(0);
  auto ctx = CudaContext::create(0);
  auto arena = DeviceArena::create(0, size_t(3) << 30);
  if (!info.is_ok() || !ctx.is_ok() || !arena.is_ok()) {
    std::fprintf(stderr, "bench_cuda_lora: could not set up the device\n");
    return 1;
  }
  std::printf("LoRA branch ops on %s; floor: bytes moved over %.0f GB/s\n", info->name.c_str(), kPeakGbps);
  const LoraShape shapes[] = {{"llama-3.2-1b", 16384, 2048, 8192, 2048, 512, 16},
                              {"llama-3.1-8b", 8192, 4096, 14336, 4096, 1024, 32}};
  for (const LoraShape& sh : shapes) {
    if (which != "both" && std::strstr(sh.name, which.c_str()) == nullptr) continue;
    Status st = bench_shape(*ctx, *arena, sh);
    if (!st.is_ok()) {
      std::fprintf(stderr, "bench_cuda_lora: %s\n", st.message().c_str());
      return 1;
    }
  }
  return 0;
}
