// CUDA kernels beside their floors on one GPU: bf16 GEMM TFLOP/s through
// cuBLASLt at the Llama-3.1-8B linear shapes (8192 tokens: micro batch 4 at
// sequence 2048) for forward, dX and dW, against the measured bf16 peak
// (~810 TFLOP/s on H200); the LM head fused with cross-entropy against the
// same peak (f32 / bf16 logits at the 1B and 8B hidden sizes, on random
// data); RMSNorm+residual (fwd, bwd), SwiGLU (fwd, bwd), the trainer's
// [gate | up] SwiGLU and q|k|v split / merge, RoPE, the embedding, dtype
// conversion and multi-tensor AdamW in GB/s against the
// memory-bandwidth floor (~4.3 TB/s). At the two training shapes (1B: 16384
// tokens, 8B: 8192) the small kernels of a training step, each beside the
// kernel it replaced: the attention backward's delta, the q|k|v split and
// merge with the LoRA columns in the row, one layer's LoRA part sums, and
// the 4-term copies of all the model's LoRA factors. Attention has its own bench. Times are the best of several
// repetitions of a stream-synchronized batch of calls. Without a GPU it says
// so and exits 0.
// Usage: bench_cuda_ops [tokens, default 8192]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include "backends/cuda/attention.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/generation_ops.h"
#include "backends/cuda/lora_ops.h"
#include "cuda_timing.h"
#include "backends/cuda/train_fused.h"
#include <vector>

namespace {

using namespace lathe;
using namespace lathe::cuda;

constexpr double kPeakTflops = 810.0;
constexpr double kPeakGbps = 4300.0;

double time_calls(CudaContext& ctx, int calls, const std::function<Status()>& fn) {
  return bench::time_calls("bench_cuda_ops", ctx, calls, fn);
}

void report_bytes(const char* name, double s, double bytes) {
  const double gbps = bytes / s / 1e9;
  std::printf("%-24s %10.3f %10.1f %7.0f%%\n", name, s * 1e3, gbps, 100.0 * gbps / kPeakGbps);
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
  report_bytes("rms_norm+residual fwd", s, 8.0 * double(tokens * dim));
  // SwiGLU: reads gate, up, writes out (bf16): 6 bytes per element.
  SwigluCudaArgs sw{.gate = *a, .up = *b, .out = *c, .n = tokens * ffn};
  s = time_calls(ctx, 20, [&] { return swiglu_forward(ctx, sw); });
  report_bytes("swiglu fwd", s, 6.0 * double(tokens * ffn));
  // SwiGLU backward: reads gate, up, d_out, writes d_gate, d_up: 10 bytes.
  SwigluBackwardCudaArgs sb{.gate = *a, .up = *b, .d_out = *c, .d_gate = *a, .d_up = *b, .n = tokens * ffn};
  s = time_calls(ctx, 20, [&] { return swiglu_backward(ctx, sb); });
  report_bytes("swiglu bwd", s, 10.0 * double(tokens * ffn));
  // RMSNorm backward into the fp32 residual gradient: reads h, dy (bf16) and
  // dh (f32), writes dh: 12 bytes per element.
  float* dh = reinterpret_cast<float*>(*c);
  RmsNormResidualBackwardArgs rb{.h = *a, .w = *w, .rstd = *rstd, .dy = *b, .dh = dh, .rows = tokens, .dim = dim,
                                 .accumulate = true};
  s = time_calls(ctx, 20, [&] { return rms_norm_residual_backward(ctx, rb); });
  report_bytes("rms_norm bwd (+= dh f32)", s, 12.0 * double(tokens * dim));
  // The trainer's: also writes dh's bf16 copy: 14 bytes per element.
  rb.dh_bf = *a + tokens * dim;
  s = time_calls(ctx, 20, [&] { return rms_norm_residual_backward(ctx, rb); });
  report_bytes("rms_norm bwd +dh_bf", s, 14.0 * double(tokens * dim));
  // fp32 -> bf16 (the residual gradient before a GEMM reads it): 6 bytes.
  s = time_calls(ctx, 20, [&] { return f32_to_bf16(ctx, dh, *a, tokens * dim); });
  report_bytes("f32_to_bf16", s, 6.0 * double(tokens * dim));
}

// The trainer's fused-projection kernels at the 8B shapes: SwiGLU on
// [gate | up] rows (fwd: reads 2F, writes F; bwd: reads 3F, writes 2F) and
// the q|k|v split with RoPE / merge (reads and writes the 6144-wide row,
// reads the two f32 tables once per token).
void bench_train_fused(CudaContext& ctx, DeviceArena& arena, int64_t tokens) {
  arena.reset();
  const int64_t ffn = 14336, heads = 32, kv = 8, hd = 128, row = (heads + 2 * kv) * hd;
  auto gu = arena.alloc_n<bf16_bits>(tokens * 2 * ffn, "gu");
  auto act = arena.alloc_n<bf16_bits>(tokens * ffn, "act");
  auto cs = arena.alloc_n<float>(tokens * hd / 2, "cos");
  auto sn = arena.alloc_n<float>(tokens * hd / 2, "sin");
  if (!gu.is_ok() || !act.is_ok() || !cs.is_ok() || !sn.is_ok()) return;
  if (!fill_zero(ctx, *cs, size_t(tokens * hd / 2) * 4).is_ok() ||
      !fill_zero(ctx, *sn, size_t(tokens * hd / 2) * 4).is_ok())
    std::exit(1);
  SwigluRowsArgs sf{.gu = *gu, .out = *act, .n_tokens = tokens, .inter = ffn};
  double s = time_calls(ctx, 20, [&] { return swiglu_rows_forward(ctx, sf); });
  report_bytes("swiglu rows fwd", s, 6.0 * double(tokens * ffn));
  SwigluRowsBackwardArgs sb{.gu = *gu, .d_out = *act, .d_gu = *gu, .n_tokens = tokens, .inter = ffn};
  s = time_calls(ctx, 20, [&] { return swiglu_rows_backward(ctx, sb); });
  report_bytes("swiglu rows bwd", s, 10.0 * double(tokens * ffn));
  bf16_bits* qkv = *gu;
  bf16_bits* q = *act;
  QkvSplitArgs qa{.qkv = qkv, .q = q, .k = q + tokens * heads * hd, .v = q + tokens * (heads + kv) * hd, .cos = *cs,
                  .sin = *sn, .n_tokens = tokens, .n_head = heads, .n_head_kv = kv, .head_dim = hd};
  const double bytes = 4.0 * double(tokens * row) + 4.0 * double(tokens * hd);
  s = time_calls(ctx, 20, [&] { return qkv_split(ctx, qa); });
  report_bytes("qkv split + rope", s, bytes);
  s = time_calls(ctx, 20, [&] { return qkv_merge(ctx, qa); });
  report_bytes("qkv merge + rope⁻¹", s, bytes);
}

// A training shape: tokens per micro batch, the model's sizes, LoRA rank 32
// on all seven projections.
struct TrainShape {
  const char* name;
  int64_t tokens, hidden, inter, heads, kv, hd, n_layer;
};
constexpr int64_t kRank = 32;
const TrainShape kTrainShapes[] = {{"1B", 16384, 2048, 8192, 32, 8, 64, 16},
                                   {"8B", 8192, 4096, 14336, 32, 8, 128, 32}};

// The attention backward's delta (reads dO and O, writes 4 bytes a row)
// and the q|k|v split / merge with the row's 3·4r LoRA columns beside it:
// the kernels now and the ones they replaced.
void bench_step_rows(CudaContext& ctx, DeviceArena& arena, const TrainShape& sh) {
  arena.reset();
  const int64_t T = sh.tokens, qd = sh.heads * sh.hd, kvd = sh.kv * sh.hd, row = qd + 2 * kvd;
  const int64_t ld_qkv = row + 3 * 4 * kRank, ld_attn = qd + 4 * kRank;
  auto qkv = arena.alloc_n<bf16_bits>(T * ld_qkv, "qkv");
  auto dense = arena.alloc_n<bf16_bits>(T * row, "q|k|v");
  auto out = arena.alloc_n<bf16_bits>(T * ld_attn, "attention out");
  auto ws = arena.alloc_n<float>(T * sh.heads, "delta");
  auto cs = arena.alloc_n<float>(T * sh.hd / 2, "cos");
  auto sn = arena.alloc_n<float>(T * sh.hd / 2, "sin");
  if (!qkv.is_ok() || !dense.is_ok() || !out.is_ok() || !ws.is_ok() || !cs.is_ok() || !sn.is_ok()) return;
  if (!fill_random_bf16(ctx, *qkv, T * ld_qkv, 1, 0.0f, 1.0f).is_ok() ||
      !fill_random_bf16(ctx, *dense, T * row, 2, 0.0f, 1.0f).is_ok() ||
      !fill_random_bf16(ctx, *out, T * ld_attn, 3, 0.0f, 1.0f).is_ok() ||
      !fill_zero(ctx, *cs, size_t(T * sh.hd / 2) * 4).is_ok() || !fill_zero(ctx, *sn, size_t(T * sh.hd / 2) * 4).is_ok())
    std::exit(1);
  char name[64];
  for (bool simple : {false, true}) {
    AttentionVarlenBwdArgs a{.out = *out, .d_out = *dense, .workspace = *ws, .n_tokens = int(T), .n_head = int(sh.heads),
                             .head_dim = int(sh.hd), .stream = ctx.stream(), .simple = simple, .ld_out = ld_attn};
    const double s = time_calls(ctx, 20, [&] { return attention_varlen_backward_delta(a); });
    std::snprintf(name, sizeof(name), "%s attn delta%s", sh.name, simple ? " (per row)" : "");
    report_bytes(name, s, 4.0 * double(T * qd) + 4.0 * double(T * sh.heads));
  }
  for (bool earlier : {false, true}) {
    QkvSplitArgs qa{.qkv = *qkv, .q = *dense, .k = *dense + T * qd, .v = *dense + T * (qd + kvd), .cos = *cs,
                    .sin = *sn, .n_tokens = T, .n_head = sh.heads, .n_head_kv = sh.kv, .head_dim = sh.hd,
                    .ld_qkv = ld_qkv, .thread_per_8_pairs = earlier};
    const double bytes = 4.0 * double(T * row) + 4.0 * double(T * sh.hd);
    double s = time_calls(ctx, 20, [&] { return qkv_split(ctx, qa); });
    std::snprintf(name, sizeof(name), "%s qkv split%s", sh.name, earlier ? " (8 pairs)" : "");
    report_bytes(name, s, bytes);
    s = time_calls(ctx, 20, [&] { return qkv_merge(ctx, qa); });
    std::snprintf(name, sizeof(name), "%s qkv merge%s", sh.name, earlier ? " (8 pairs)" : "");
    report_bytes(name, s, bytes);
  }
}

// One layer's LoRA part sums as the trainer makes them (cuda_model_pass.cpp,
// no dropout): per group the forward's u, du, then dB and dA of every
// member; each inner list one lora_sum_parts_many call (12 a layer), timed
// beside one launch per member on the one-thread-per-value kernel (24, as
// before). Bytes: the parts read, the gradient read and written, the split
// written (4 bf16 a value). Host launch time counts here; in the step the
// host runs ahead of the device.
std::vector<std::vector<LoraPartsArgs>> layer_sums(const TrainShape& sh, float* part, float* grad, bf16_bits* split,
                                                   double* bytes) {
  const int64_t T = sh.tokens, r = kRank, qd = sh.heads * sh.hd, kvd = sh.kv * sh.hd;
  struct G {
    int64_t in;
    std::vector<int64_t> outs;
  };
  const G groups[] = {{sh.hidden, {qd, kvd, kvd}}, {qd, {sh.hidden}}, {sh.hidden, {sh.inter, sh.inter}},
                      {sh.inter, {sh.hidden}}};
  std::vector<std::vector<LoraPartsArgs>> calls;
  *bytes = 0;
  auto add = [&](std::vector<LoraPartsArgs> jobs) {
    for (const LoraPartsArgs& a : jobs) {
      const double values = double(a.rows * a.n_groups * a.cols);
      *bytes += values * (4.0 * double(a.n_parts) + (a.sum ? 8.0 : 0.0) + (a.split ? 8.0 : 0.0));
    }
    calls.push_back(std::move(jobs));
  };
  for (const G& g : groups) {
    const int64_t nl = int64_t(g.outs.size()), lw = 4 * r * nl, left = nl > 1 ? 1 : 0, ldx = g.in + lw;
    LoraPartsArgs u{.src = part, .rows = T, .cols = r, .n_parts = 3, .row_stride = lw, .group_stride = 4 * r,
                    .part_stride = r, .scale = 1.0f, .split = split, .split_ld = ldx};
    LoraPartsArgs rest = u;
    rest.src = part + left * 4 * r, rest.n_groups = nl - left, rest.split = split + left * 4 * r + g.in;
    add(left ? std::vector<LoraPartsArgs>{u, rest} : std::vector<LoraPartsArgs>{rest});
    std::vector<LoraPartsArgs> db, da;
    int64_t off = 0, goff = 0;
    for (int64_t out : g.outs) {
      db.push_back({.src = part + off, .rows = out, .cols = r, .n_parts = 2, .row_stride = 2 * r, .part_stride = r,
                    .sum = grad + goff, .accumulate = true});
      off += (out * 2 * r + 63) / 64 * 64, goff += out * r;
    }
    add({{.src = part, .rows = T, .cols = r, .n_groups = nl, .n_parts = 3, .row_stride = lw, .group_stride = 4 * r,
          .part_stride = r, .scale = 1.0f, .split = split, .split_ld = ldx}});
    for (size_t k = 0; k < g.outs.size(); ++k) {
      da.push_back({.src = part + off, .rows = r, .cols = g.in, .n_parts = 2, .row_stride = g.in,
                    .part_stride = r * g.in, .sum = grad + goff, .accumulate = true});
      off += (2 * r * g.in + 63) / 64 * 64, goff += r * g.in;
    }
    db.insert(db.end(), da.begin(), da.end());
    add(db);
  }
  return calls;
}

void bench_lora_sums(CudaContext& ctx, DeviceArena& arena, const TrainShape& sh) {
  arena.reset();
  const int64_t T = sh.tokens, widest = std::max(sh.hidden, sh.inter) + 3 * 4 * kRank;
  auto part = arena.alloc_n<float>(std::max(T * 12 * kRank, 6 * kRank * widest), "parts");
  auto grad = arena.alloc_n<float>(8 * kRank * widest, "grads");
  auto split = arena.alloc_n<bf16_bits>(T * widest, "x_ext");
  if (!part.is_ok() || !grad.is_ok() || !split.is_ok()) return;
  double bytes = 0;
  const auto calls = layer_sums(sh, *part, *grad, *split, &bytes);
  size_t n_jobs = 0;
  for (const auto& c : calls) n_jobs += c.size();
  char name[64];
  const double batched = time_calls(ctx, 20, [&]() -> Status {
    for (const auto& c : calls) LATHE_TRY(lora_sum_parts_many(ctx, c.data(), int(c.size())));
    return Status::ok();
  });
  std::snprintf(name, sizeof(name), "%s LoRA sums x%zu", sh.name, calls.size());
  report_bytes(name, batched, bytes);
  const double each = time_calls(ctx, 20, [&]() -> Status {
    for (const auto& c : calls)
      for (const LoraPartsArgs& a : c) LATHE_TRY(lora_sum_parts_many(ctx, &a, 1, /*one_per_value=*/true));
    return Status::ok();
  });
  std::snprintf(name, sizeof(name), "%s LoRA sums x%zu (old)", sh.name, n_jobs);
  report_bytes(name, each, bytes);
}

// The 4-term bf16 copies of every LoRA factor of the model (A [r, in] as
// planes, B [out, r] by row), rewritten after each optimizer step in one
// launch: reads 4 bytes, writes 8 per parameter.
void bench_lora_split(CudaContext& ctx, DeviceArena& arena, const TrainShape& sh) {
  arena.reset();
  const int64_t r = kRank, qd = sh.heads * sh.hd, kvd = sh.kv * sh.hd;
  const int64_t outs[] = {qd, kvd, kvd, sh.hidden, sh.inter, sh.inter, sh.hidden};
  const int64_t ins[] = {sh.hidden, sh.hidden, sh.hidden, qd, sh.hidden, sh.hidden, sh.inter};
  std::vector<LoraSplitFactor> table;
  int64_t src = 0, dst = 0, most = 0;
  for (int64_t l = 0; l < sh.n_layer; ++l)
    for (int j = 0; j < 7; ++j) {
      table.push_back({.src = src, .dst = dst, .rows = r, .cols = ins[j], .by_row = 0});
      table.push_back({.src = src + r * ins[j], .dst = dst + 4 * r * ins[j], .rows = outs[j], .cols = r, .by_row = 1});
      src += r * (ins[j] + outs[j]), dst += 4 * r * (ins[j] + outs[j]);
      most = std::max({most, r * ins[j], r * outs[j]});
    }
  auto masters = arena.alloc_n<float>(src, "masters");
  auto copies = arena.alloc_n<bf16_bits>(dst, "copies");
  auto dtable = arena.alloc_n<LoraSplitFactor>(int64_t(table.size()), "factor table");
  if (!masters.is_ok() || !copies.is_ok() || !dtable.is_ok()) return;
  if (!fill_zero(ctx, *masters, size_t(src) * 4).is_ok() ||
      !copy_to_device(ctx, *dtable, table.data(), table.size() * sizeof(LoraSplitFactor)).is_ok())
    std::exit(1);
  const LoraSplitWeightsArgs a{.factors = *dtable, .n_factors = int(table.size()), .max_numel = most,
                               .src = *masters, .dst = *copies};
  const double s = time_calls(ctx, 20, [&] { return lora_split_weights(ctx, a); });
  char name[64];
  std::snprintf(name, sizeof(name), "%s LoRA split copies", sh.name);
  report_bytes(name, s, 12.0 * double(src));
}

// RoPE on q (32 heads) and the embedding lookup at the 8B shapes.
void bench_rope_embedding(CudaContext& ctx, DeviceArena& arena, int64_t tokens) {
  arena.reset();
  const int64_t heads = 32, half = 64, dim = 4096, vocab = 128256;
  auto q = arena.alloc_n<bf16_bits>(tokens * heads * half * 2, "q");
  auto cs = arena.alloc_n<float>(tokens * half, "cos");
  auto sn = arena.alloc_n<float>(tokens * half, "sin");
  auto table = arena.alloc_n<bf16_bits>(vocab * dim, "table");
  auto ids = arena.alloc_n<int32_t>(tokens, "ids");
  if (!q.is_ok() || !cs.is_ok() || !sn.is_ok() || !table.is_ok() || !ids.is_ok()) return;
  if (!fill_zero(ctx, *ids, size_t(tokens) * 4).is_ok() || !fill_zero(ctx, *cs, size_t(tokens * half) * 4).is_ok() ||
      !fill_zero(ctx, *sn, size_t(tokens * half) * 4).is_ok())
    std::exit(1);
  RopeCudaArgs ra{.x = *q, .cos = *cs, .sin = *sn, .n_tokens = tokens, .n_head = heads, .half = half};
  double s = time_calls(ctx, 20, [&] { return rope_apply(ctx, ra); });
  // Reads and writes q (bf16), reads the two f32 tables once per token.
  report_bytes("rope q (32 heads)", s, 4.0 * double(tokens * heads * half * 2) + 8.0 * double(tokens * half));
  EmbeddingCudaArgs ea{.tokens = *ids, .table = *table, .out = *q, .n = tokens, .vocab = vocab, .dim = dim};
  s = time_calls(ctx, 20, [&] { return embedding_forward(ctx, ea); });
  report_bytes("embedding fwd", s, 4.0 * double(tokens * dim));
}

// LM head + cross-entropy (loss and d_hidden, the frozen head's case) at the
// 1B and 8B hidden sizes on random inputs (all-zero ones run the tensor
// cores cooler and faster than a training step does): f32 and bf16 logits,
// bf16 also with none or 200 KiB of each row kept in shared memory and at
// 1024 / 4096 rows a chunk. The floor is the two GEMMs' FLOPs,
// 4·tokens·vocab·dim.
void bench_cross_entropy(CudaContext& ctx, DeviceArena& arena, int64_t tokens) {
  struct Variant {
    const char* name;
    CeLogits logits;
    int64_t chunk_rows;
    const char* kept_kib;  // LATHE_CUDA_CE_KEPT_KIB for the bf16 row kernel; "": the default
  };
  const Variant variants[] = {{"f32", CeLogits::kF32, 0, ""},          {"bf16", CeLogits::kBf16, 0, ""},
                              {"bf16 kept 0", CeLogits::kBf16, 0, "0"}, {"bf16 kept 200K", CeLogits::kBf16, 0, "200"},
                              {"bf16 1024", CeLogits::kBf16, 1024, ""}, {"bf16 4096", CeLogits::kBf16, 4096, ""}};
  const int64_t vocab = 128256;
  for (const int64_t dim : {int64_t{2048}, int64_t{4096}}) {
    arena.reset();
    auto hidden = arena.alloc_n<bf16_bits>(tokens * dim, "hidden");
    auto w = arena.alloc_n<bf16_bits>(vocab * dim, "w");
    auto dh = arena.alloc_n<bf16_bits>(tokens * dim, "d_hidden");
    auto targets = arena.alloc_n<int32_t>(tokens, "targets");
    size_t ws_bytes = 0;
    for (const Variant& v : variants)
      ws_bytes = std::max(ws_bytes, cross_entropy_workspace_bytes(vocab, v.chunk_rows, v.logits));
    auto ws = arena.alloc(ws_bytes, "workspace");
    if (!hidden.is_ok() || !w.is_ok() || !dh.is_ok() || !targets.is_ok() || !ws.is_ok()) {
      std::printf("%-24s skipped: arena too small\n", "CE");
      return;
    }
    if (!fill_zero(ctx, *targets, size_t(tokens) * 4).is_ok() ||
        !fill_random_bf16(ctx, *hidden, tokens * dim, 1, 0.0f, 1.0f).is_ok() ||
        !fill_random_bf16(ctx, *w, vocab * dim, 2, 0.0f, 0.02f).is_ok())
      std::exit(1);
    for (const Variant& v : variants) {
      CrossEntropyCudaArgs ca{.hidden = *hidden, .w = *w, .targets = *targets, .d_hidden = *dh, .workspace = *ws,
                              .n = tokens, .vocab = vocab, .dim = dim, .chunk_rows = v.chunk_rows, .logits = v.logits};
      setenv("LATHE_CUDA_CE_KEPT_KIB", v.kept_kib, 1);
      const double s = time_calls(ctx, 3, [&] { return cross_entropy(ctx, ca).status(); });
      unsetenv("LATHE_CUDA_CE_KEPT_KIB");
      const double tflops = 4.0 * double(tokens) * double(vocab) * double(dim) / s / 1e12;
      char name[64];
      std::snprintf(name, sizeof(name), "CE d%lld %s", (long long)dim, v.name);
      std::printf("%-24s %10.3f %10.1f %7.0f%%   (TFLOP/s, of the GEMM peak; workspace %.0f MiB)\n", name, s * 1e3,
                  tflops, 100.0 * tflops / kPeakTflops,
                  double(cross_entropy_workspace_bytes(vocab, v.chunk_rows, v.logits)) / (1 << 20));
    }
  }
}

// The fused head's GEMMs alone, one chunk at a time: the logits GEMM
// [rows, vocab] = hidden·wᵀ writing f32 or bf16, and the dX GEMM
// [rows, dim] = g·w (k = vocab), whose small output needs enough rows to
// cover the SMs. What the CE lines take beyond these is the row kernel.
void bench_cross_entropy_gemms(CudaContext& ctx, DeviceArena& arena) {
  const int64_t vocab = 128256;
  std::printf("\n%-24s %10s %10s %8s\n", "CE chunk GEMM", "ms/call", "TFLOP/s", "% peak");
  for (const int64_t dim : {int64_t{2048}, int64_t{4096}}) {
    for (const int64_t rows : {int64_t{1024}, int64_t{2048}, int64_t{4096}}) {
      arena.reset();
      auto h = arena.alloc_n<bf16_bits>(rows * dim, "hidden");
      auto w = arena.alloc_n<bf16_bits>(vocab * dim, "w");
      auto logits = arena.alloc_n<float>(rows * vocab, "logits");
      if (!h.is_ok() || !w.is_ok() || !logits.is_ok()) return;
      if (!fill_random_bf16(ctx, *h, rows * dim, 1, 0.0f, 1.0f).is_ok() ||
          !fill_random_bf16(ctx, *w, vocab * dim, 2, 0.0f, 0.02f).is_ok())
        std::exit(1);
      const GemmArgs passes[] = {
          {.a = *h, .b = *w, .c = *logits, .m = rows, .n = vocab, .k = dim, .trans_b = true, .c_dtype = DType::F32},
          {.a = *h, .b = *w, .c = *logits, .m = rows, .n = vocab, .k = dim, .trans_b = true, .c_dtype = DType::BF16},
          {.a = reinterpret_cast<bf16_bits*>(*logits), .b = *w, .c = *h, .m = rows, .n = dim, .k = vocab}};
      const char* names[] = {"logits f32", "logits bf16", "dX"};
      for (int p = 0; p < 3; ++p) {
        // dX reads a gradient-like bf16 [rows, vocab], not the f32 logits' bits.
        if (p == 2 && !fill_random_bf16(ctx, reinterpret_cast<bf16_bits*>(*logits), rows * vocab, 3, 0.0f, 1e-5f).is_ok())
          std::exit(1);
        const double s = time_calls(ctx, 10, [&] { return gemm(ctx, passes[p]); });
        const double tflops = 2.0 * double(rows) * double(vocab) * double(dim) / s / 1e12;
        char name[64];
        std::snprintf(name, sizeof(name), "d%lld %lld rows %s", (long long)dim, (long long)rows, names[p]);
        std::printf("%-24s %10.3f %10.1f %7.0f%%\n", name, s * 1e3, tflops, 100.0 * tflops / kPeakTflops);
      }
    }
  }
}

// Multi-tensor AdamW over the LoRA parameters of the 8B shape (r 32, all
// seven projections, 32 layers: 83.9M): reads p, g, m, v (f32), writes p, m,
// v and the bf16 copy: 30 bytes per parameter.
void bench_adamw(CudaContext& ctx, DeviceArena& arena) {
  arena.reset();
  const int64_t n = 83'886'080;
  auto p = arena.alloc_n<float>(n, "p");
  auto g = arena.alloc_n<float>(n, "g");
  auto wb = arena.alloc_n<bf16_bits>(n, "working");
  if (!p.is_ok() || !g.is_ok() || !wb.is_ok()) return;
  if (!fill_zero(ctx, *p, size_t(n) * 4).is_ok() || !fill_zero(ctx, *g, size_t(n) * 4).is_ok()) std::exit(1);
  auto opt = CudaAdamW::create(ctx, {}, {{.name = "lora", .param = *p, .grad = *g, .working = *wb, .n = n}});
  if (!opt.is_ok()) {
    std::fprintf(stderr, "bench_cuda_ops: %s\n", opt.status().message().c_str());
    std::exit(1);
  }
  const double s = time_calls(ctx, 10, [&] { return opt->step(ctx, 1e-4); });
  report_bytes("adamw (83.9M params)", s, 30.0 * double(n));
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
  bench_train_fused(*ctx, *arena, tokens);
  bench_rope_embedding(*ctx, *arena, tokens);
  for (const TrainShape& sh : kTrainShapes) {
    bench_step_rows(*ctx, *arena, sh);
    bench_lora_sums(*ctx, *arena, sh);
    bench_lora_split(*ctx, *arena, sh);
  }
  bench_cross_entropy(*ctx, *arena, tokens);
  bench_cross_entropy_gemms(*ctx, *arena);
  bench_adamw(*ctx, *arena);
  return 0;
}
