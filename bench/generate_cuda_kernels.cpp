// bench_generate_cuda's kernel table and chain diagnostic (generate_cuda.h;
// what they measure: generate_cuda.cpp's usage comment).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "backends/cuda/attention.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/decode_ops.h"
#include "backends/cuda/device.h"
#include "backends/cuda/gemv_bulk.h"
#include "backends/cuda/generation_ops.h"
#include "core/env.h"
#include "generate_cuda.h"
#include "models/cuda_causal_lm.h"

namespace lathe::bench_generate {
namespace {

using Clock = std::chrono::steady_clock;
using lathe::cuda::bf16_bits;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

namespace cu = lathe::cuda;

bool ok(const Status& st, const char* what) {
  if (!st.is_ok()) std::fprintf(stderr, "kernels: %s: %s\n", what, st.message().c_str());
  return st.is_ok();
}

// Seconds per call of body(i) (i = 0..calls−1), captured once as a graph of
// `calls` calls and replayed: the best of 5 replays after a warm-up one.
double time_graph(cu::CudaContext& ctx, int calls, const std::function<Status(int)>& body) {
  if (!ok(body(0), "warm-up") || !ok(ctx.synchronize(), "synchronize")) return 0.0;  // one-time setup outside capture
  auto graph = cu::CudaGraph::capture(ctx, [&]() -> Status {
    for (int i = 0; i < calls; ++i) LATHE_TRY(body(i));
    return Status::ok();
  });
  if (!ok(graph.status(), "capture")) return 0.0;
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    const Clock::time_point t0 = Clock::now();
    if (!ok(graph->launch(ctx), "launch") || !ok(ctx.synchronize(), "synchronize")) return 0.0;
    if (rep > 0) best = std::min(best, seconds_since(t0) / calls);
  }
  return best;
}

struct KernelRow {
  std::string name;
  double s = 0.0, bytes = 0.0;
  int per_step = 1;  // calls per decode step
};

// Device buffers for the kernel table: a pool of weights (copies of the
// largest matrix's size), x rows, the f32 stream, norm weights, and one
// sequence's caches per row.
struct KernelBuffers {
  cu::DeviceBuffer pool, scratch;
  size_t pool_bytes = 0;
  float *h = nullptr, *act = nullptr, *out = nullptr, *cos = nullptr, *sin = nullptr;
  bf16_bits *x = nullptr, *norm = nullptr, *q = nullptr, *attn = nullptr, *cache = nullptr;
  bf16_bits** cache_ptrs = nullptr;
  int32_t* pos = nullptr;
  void* workspace = nullptr;
  cu::GemvSplit split;
};

bool make_buffers(cu::CudaContext& ctx, const ModelConfig& c, int batch, int max_ctx, KernelBuffers& kb) {
  const int64_t hd = c.head_dim, kv_dim = int64_t(c.num_key_value_heads) * hd, q_dim = int64_t(c.num_attention_heads) * hd;
  const int64_t widest = std::max<int64_t>({c.hidden_size, c.intermediate_size, q_dim, c.vocab_size});
  kb.pool_bytes = std::max<size_t>(size_t(c.vocab_size) * c.hidden_size * 2, size_t(1) << 30);
  const size_t cache_bytes = size_t(batch) * 2 * max_ctx * kv_dim * 2;
  const size_t ws = cu::attention_decode_workspace_bytes(batch, c.num_attention_heads, static_cast<int>(hd));
  size_t off = 0;
  std::vector<size_t> offs;
  auto carve = [&](size_t bytes) {
    offs.push_back(off);
    off += (bytes + 255) / 256 * 256;
  };
  carve(size_t(batch) * widest * 4);                       // h
  carve(size_t(batch) * widest * 4);                       // act
  carve(size_t(batch) * widest * 4);                       // out
  carve(size_t(batch) * hd * 2);                           // cos
  carve(size_t(batch) * hd * 2);                           // sin
  carve(size_t(batch) * widest * 2);                       // x
  carve(size_t(widest) * 2);                               // norm
  carve(size_t(batch) * q_dim * 2);                        // q
  carve(size_t(batch) * q_dim * 2);                        // attn
  carve(cache_bytes);                                      // caches
  carve(size_t(batch) * 2 * sizeof(void*));                // cache pointers
  carve(size_t(batch) * 4);                                // positions
  carve(ws);                                               // attention workspace
  carve(size_t(cu::kGemvSplitCounts) * 4);                 // GEMV split counts
  carve(size_t(cu::kGemvSplitFloats) * 4);                 // GEMV split sums
  auto pool = cu::DeviceBuffer::alloc(ctx.device(), kb.pool_bytes);
  auto scratch = cu::DeviceBuffer::alloc(ctx.device(), off);
  if (!ok(pool.status(), "alloc") || !ok(scratch.status(), "alloc")) return false;
  kb.pool = std::move(*pool);
  kb.scratch = std::move(*scratch);
  char* base = static_cast<char*>(kb.scratch.data());
  int i = 0;
  kb.h = reinterpret_cast<float*>(base + offs[i++]);
  kb.act = reinterpret_cast<float*>(base + offs[i++]);
  kb.out = reinterpret_cast<float*>(base + offs[i++]);
  kb.cos = reinterpret_cast<float*>(base + offs[i++]);
  kb.sin = reinterpret_cast<float*>(base + offs[i++]);
  kb.x = reinterpret_cast<bf16_bits*>(base + offs[i++]);
  kb.norm = reinterpret_cast<bf16_bits*>(base + offs[i++]);
  kb.q = reinterpret_cast<bf16_bits*>(base + offs[i++]);
  kb.attn = reinterpret_cast<bf16_bits*>(base + offs[i++]);
  kb.cache = reinterpret_cast<bf16_bits*>(base + offs[i++]);
  kb.cache_ptrs = reinterpret_cast<bf16_bits**>(base + offs[i++]);
  kb.pos = reinterpret_cast<int32_t*>(base + offs[i++]);
  kb.workspace = base + offs[i++];
  kb.split = {.counts = reinterpret_cast<int*>(base + offs[i++]), .part = reinterpret_cast<float*>(base + offs[i++]),
              .count_capacity = cu::kGemvSplitCounts, .part_capacity = cu::kGemvSplitFloats};
  if (!ok(cu::fill_zero(ctx, base, off), "zero") ||
      !ok(cu::fill_random_bf16(ctx, static_cast<bf16_bits*>(kb.pool.data()), int64_t(kb.pool_bytes / 2), 7, 0.0f, 0.02f),
          "fill") ||
      !ok(cu::fill_random_bf16(ctx, kb.norm, widest, 0, 1.0f, 0.0f), "fill"))
    return false;
  std::vector<bf16_bits*> ptrs(size_t(2 * batch));
  for (int s = 0; s < 2 * batch; ++s) ptrs[size_t(s)] = kb.cache + int64_t(s) * max_ctx * kv_dim;
  std::vector<int32_t> pos(size_t(batch), max_ctx - 1);
  return ok(cu::copy_to_device(ctx, kb.cache_ptrs, ptrs.data(), ptrs.size() * sizeof(void*)), "upload") &&
         ok(cu::copy_to_device(ctx, kb.pos, pos.data(), pos.size() * sizeof(int32_t)), "upload");
}

// One GEMV as decode_layer() calls it, timed over copies of its weights
// (w_rows × g.k each) spread through the pool.
KernelRow time_gemv(cu::CudaContext& ctx, const KernelBuffers& kb, const std::string& name, int64_t w_rows,
                    cu::GemvArgs g, int per_step) {
  const size_t w_bytes = size_t(w_rows) * g.k * 2;
  const int copies = static_cast<int>(std::max<size_t>(1, std::min<size_t>(64, kb.pool_bytes / w_bytes)));
  const int calls = std::max(8, std::min(64, copies));
  const double t = time_graph(ctx, calls, [&](int i) {
    cu::GemvArgs gi = g;
    gi.w = static_cast<const bf16_bits*>(kb.pool.data()) + int64_t(i % copies) * int64_t(w_bytes / 2);
    return cu::gemv(ctx, gi);
  });
  std::string label = name + " " + std::to_string(w_rows) + "x" + std::to_string(g.k);
  if (g.shape == cu::kGemvBulkShape)
    label += " (smem ring " + std::to_string(g.ring_kib ? g.ring_kib : cu::kGemvBulkRingKib) + " KiB" +
             (g.blocks_per_sm > 1 ? ", " + std::to_string(g.blocks_per_sm) + "/SM)" : ")");
  else if (g.shape != 0)
    label += " (block shape " + std::to_string(g.shape) + ")";
  if (g.split.counts) label += " (split k)";
  if (g.persistent) label += " (persistent)";
  if (!g.overlap) label += " (ordinary launches)";
  return KernelRow{label, t, double(w_bytes), per_step};
}

// A grid of the kernel table: block shape (ring_kib for the shared-memory
// ring), split k, persistent.
struct Grid {
  uint8_t shape = 0;
  bool split = false, persistent = false;
  int ring_kib = 0, per_sm = 0;
};

// One layer's GEMVs and the LM head as decode_layer() calls them (weights
// unset), with `grid`; w_rows: each one's weight rows.
struct LayerGemvs {
  cu::GemvArgs qkv, o, gate_up, down, lm_head;
  int64_t qkv_rows, o_rows, gate_up_rows, down_rows, lm_rows;
};

LayerGemvs layer_gemvs(const KernelBuffers& kb, const ModelConfig& c, int batch, int max_ctx, bool overlap,
                       const Grid& grid) {
  using E = cu::GemvEpilogue;
  const int64_t hd = c.head_dim, hidden = c.hidden_size, ffn = c.intermediate_size;
  const int64_t q_dim = int64_t(c.num_attention_heads) * hd, kv_dim = int64_t(c.num_key_value_heads) * hd;
  const bool fused_norm = batch <= 4;  // as the decode step: larger batches take a norm kernel first
  auto plain = [&](cu::GemvArgs g) {
    if (grid.split) g.split = kb.split;
    g.rows = batch;
    g.overlap = overlap;
    g.shape = grid.shape;
    g.ring_kib = static_cast<uint16_t>(grid.ring_kib);
    g.blocks_per_sm = static_cast<uint8_t>(grid.per_sm);
    g.persistent = grid.persistent;
    return g;
  };
  // The normed input: f32 stream + norm weights in the kernel, or bf16 rows normed before.
  auto normed = [&](cu::GemvArgs g) {
    if (fused_norm) {
      g.x_f32 = kb.h;
      g.norm_w = kb.norm;
      g.eps = 1e-5f;
    } else {
      g.x = kb.x;
    }
    return plain(g);
  };
  LayerGemvs l;
  l.qkv = normed({.n = q_dim + 2 * kv_dim, .k = hidden, .epilogue = E::kRopeAppend});
  l.qkv.rope = {.q_out = kb.q, .k_caches = kb.cache_ptrs, .v_caches = kb.cache_ptrs + batch, .pos = kb.pos,
                .cos = kb.cos, .sin = kb.sin, .n_head = c.num_attention_heads, .n_head_kv = c.num_key_value_heads,
                .head_dim = static_cast<int>(hd), .max_ctx = max_ctx};
  l.o = plain({.x = kb.attn, .out = kb.h, .n = hidden, .k = q_dim, .epilogue = E::kAddF32});
  l.gate_up = normed({.out = kb.act, .n = ffn, .k = hidden, .epilogue = E::kSwigluF32});
  l.down = plain({.out = kb.h, .n = hidden, .k = ffn, .epilogue = E::kAddF32, .x_f32 = kb.act});
  l.lm_head = normed({.out = kb.out, .n = c.vocab_size, .k = hidden, .epilogue = E::kStoreF32});
  l.qkv_rows = q_dim + 2 * kv_dim, l.o_rows = hidden, l.gate_up_rows = 2 * ffn, l.down_rows = hidden;
  l.lm_rows = c.vocab_size;
  return l;
}

// The layer's GEMVs and the LM head one at a time with `grid`, marked with
// their calls per step where the step runs them so.
void gemv_rows(cu::CudaContext& ctx, const KernelBuffers& kb, const ModelConfig& c, int batch, int max_ctx,
               bool overlap, const Grid& grid, const StepGemvs& step, std::vector<KernelRow>& rows) {
  // Calls per step of this grid: decode_layer() runs the grids of cuda_decode_shapes() (or the ring).
  auto per_step = [&](lathe::CudaGemvGrid g, int calls) {
    const bool small = batch <= 4;
    if (!small) return grid.shape == g.shape && grid.split == g.split && !grid.persistent ? calls : 0;
    if (grid.split) return 0;
    if (small && (step.bulk || g.shape == cu::kGemvBulkShape)) {
      auto kib = [](int k) { return k > 0 ? k : cu::kGemvBulkRingKib; };
      auto per_sm = [](int p) { return p > 0 ? p : 1; };
      const int step_kib = kib(step.bulk && step.ring_kib > 0 ? step.ring_kib : g.ring_kib);
      const int step_per_sm = per_sm(step.bulk && step.per_sm > 0 ? step.per_sm : g.per_sm);
      return grid.shape == cu::kGemvBulkShape && kib(grid.ring_kib) == step_kib && per_sm(grid.per_sm) == step_per_sm
                 ? calls
                 : 0;
    }
    const bool same =
        grid.shape == (small ? g.shape : 0) && grid.persistent == (small && g.persistent && step.persistent);
    return same ? calls : 0;
  };
  const lathe::CudaDecodeShapes& sh =
      step.registers && batch <= 4 ? lathe::kCudaDecodeRegisterShapes : lathe::cuda_decode_shapes(batch);
  const int layers = c.num_hidden_layers;
  const LayerGemvs l = layer_gemvs(kb, c, batch, max_ctx, overlap, grid);
  rows.push_back(time_gemv(ctx, kb, "norm+qkv+rope", l.qkv_rows, l.qkv, per_step(sh.qkv, layers)));
  rows.push_back(time_gemv(ctx, kb, "o +residual", l.o_rows, l.o, per_step(sh.o, layers)));
  rows.push_back(time_gemv(ctx, kb, "norm+gate|up+swiglu", l.gate_up_rows, l.gate_up, per_step(sh.gate_up, layers)));
  rows.push_back(time_gemv(ctx, kb, "down +residual", l.down_rows, l.down, per_step(sh.down, layers)));
  rows.push_back(time_gemv(ctx, kb, "norm+lm_head", l.lm_rows, l.lm_head, per_step(sh.lm_head, 1)));
}

cu::AttentionDecodeBatchArgs attention_args(cu::CudaContext& ctx, const KernelBuffers& kb, const ModelConfig& c,
                                            int batch, int ctx_len, bool overlap) {
  return {.q = kb.q, .k_caches = reinterpret_cast<const void* const*>(kb.cache_ptrs),
          .v_caches = reinterpret_cast<const void* const*>(kb.cache_ptrs + batch), .pos = kb.pos, .out = kb.attn,
          .workspace = kb.workspace, .n_seqs = batch, .max_ctx = ctx_len, .n_head = c.num_attention_heads,
          .n_head_kv = c.num_key_value_heads, .head_dim = c.head_dim, .scale = 0.088f, .stream = ctx.stream(),
          .overlap = overlap};
}

// A layer's five kernels chained as the step runs them (q|k|v+RoPE,
// attention, o, gate|up, down), each layer on its own copy of the weights
// where the pool holds them: what the boundaries between kernels cost.
// With prefetch_units each ring GEMV pulls the next one's first units into
// L2 (down: the next copy's q|k|v), as CudaModelOptions::l2_prefetch_units
// (at LATHE_CUDA_DECODE_L2_PREFETCH_LAG, as the model);
// with max_carveout the ring GEMVs ask for the largest shared-memory carveout.
KernelRow time_layer(cu::CudaContext& ctx, const KernelBuffers& kb, const ModelConfig& c, int batch, int ctx_len,
                     bool overlap, const std::string& label, const std::function<Grid(int)>& grid_of,
                     int min_chunk = 0, cu::DecodeKernel attention = cu::DecodeKernel::kAuto, int prefetch_units = 0,
                     bool max_carveout = false) {
  const LayerGemvs l[5] = {layer_gemvs(kb, c, batch, ctx_len, overlap, grid_of(0)),
                           layer_gemvs(kb, c, batch, ctx_len, overlap, grid_of(1)),
                           layer_gemvs(kb, c, batch, ctx_len, overlap, grid_of(2)),
                           layer_gemvs(kb, c, batch, ctx_len, overlap, grid_of(3)), {}};
  const int64_t k = c.hidden_size;
  const int64_t elems = (l[0].qkv_rows + l[0].o_rows + l[0].gate_up_rows) * k + l[0].down_rows * c.intermediate_size;
  const int copies = static_cast<int>(std::max<int64_t>(1, int64_t(kb.pool_bytes / 2) / elems));
  const int calls = 16;
  // The prefetch goes out when the model's would (LATHE_CUDA_DECODE_L2_PREFETCH_LAG).
  const lathe::Result<int64_t> env_lag = lathe::env::cuda_decode_l2_prefetch_lag();
  const int lag = env_lag.is_ok() ? static_cast<int>(*env_lag) : 1;
  const auto* pool = static_cast<const bf16_bits*>(kb.pool.data());
  const double t = time_graph(ctx, calls, [&](int i) -> Status {
    const bf16_bits* w = pool + int64_t(i % copies) * elems;
    cu::GemvArgs qkv = l[0].qkv, o = l[1].o, gu = l[2].gate_up, down = l[3].down;
    qkv.w = w, o.w = w + l[0].qkv_rows * k, gu.w = o.w + l[0].o_rows * k, down.w = gu.w + l[0].gate_up_rows * k;
    cu::GemvArgs next_qkv = l[0].qkv;
    next_qkv.w = pool + int64_t((i + 1) % copies) * elems;
    const int dev = ctx.device();
    qkv.prefetch = cu::gemv_l2_prefetch(o, prefetch_units, dev, lag);
    o.prefetch = cu::gemv_l2_prefetch(gu, prefetch_units, dev, lag);
    gu.prefetch = cu::gemv_l2_prefetch(down, prefetch_units, dev, lag);
    down.prefetch = cu::gemv_l2_prefetch(next_qkv, prefetch_units, dev, lag);
    qkv.max_carveout = o.max_carveout = gu.max_carveout = down.max_carveout = max_carveout;
    LATHE_TRY(cu::gemv(ctx, qkv));
    cu::AttentionDecodeBatchArgs attn = attention_args(ctx, kb, c, batch, ctx_len, overlap);
    attn.kernel = attention;
    LATHE_TRY(cu::attention_decode_batch_chunked(attn, min_chunk));
    LATHE_TRY(cu::gemv(ctx, o));
    LATHE_TRY(cu::gemv(ctx, gu));
    return cu::gemv(ctx, down);
  });
  const std::string chunk = (attention == cu::DecodeKernel::kSplitK ? ", split-K attention" : "") +
                            (min_chunk ? ", attention chunks >= " + std::to_string(min_chunk) : std::string()) +
                            (prefetch_units ? ", L2 prefetch " + std::to_string(prefetch_units) + " units" : "") +
                            (max_carveout ? ", max carveout" : "");
  return KernelRow{"layer chained (" + label + chunk + ")", t, double(elems) * 2, 0};
}

// The decode step's kernels at this shape and batch, as decode_layer() calls them.

}  // namespace

void bench_kernels(const Shape& s, int batch, int mean_ctx, bool overlap, const StepGemvs& step, double step_s) {
  const ModelConfig& c = s.cfg;
  auto ctx = cu::CudaContext::create(0);
  KernelBuffers kb;
  if (!ok(ctx.status(), "context") || !make_buffers(*ctx, c, batch, mean_ctx, kb)) return;
  std::vector<KernelRow> rows;
  for (uint8_t shape = 0; shape < 4; ++shape) gemv_rows(*ctx, kb, c, batch, mean_ctx, overlap, {shape}, step, rows);
  // Above 4 rows (the tensor cores): the block shapes of 16, 32 and 64 weight rows with k split.
  if (batch > 4)
    for (uint8_t shape = 0; shape < 3; ++shape)
      gemv_rows(*ctx, kb, c, batch, mean_ctx, overlap, {.shape = shape, .split = true}, step, rows);
  // The shared-memory ring (up to 4 rows) at a few sizes (split k and persistent grids: measured slower, gemv.cu).
  if (batch <= 4)
    for (auto [kib, per_sm] : {std::pair{64, 0}, {96, 0}, {160, 0}, {64, 2}, {96, 2}})
      gemv_rows(*ctx, kb, c, batch, mean_ctx, overlap, {.shape = cu::kGemvBulkShape, .ring_kib = kib, .per_sm = per_sm},
                step, rows);
  // What the programmatic dependent launch gives the ring (its blocks fill their rings before the previous call ends).
  if (batch <= 4 && overlap) {
    gemv_rows(*ctx, kb, c, batch, mean_ctx, false, {.shape = cu::kGemvBulkShape, .ring_kib = 96}, step, rows);
    for (size_t i = rows.size() - 5; i < rows.size(); ++i) rows[i].per_step = 0;  // the step overlaps its launches
  }
  // The attention: the split-K kernel at a few chunk sizes, the cluster kernel at 4, 2 and 1 query heads per block.
  const int64_t kv_dim = int64_t(c.num_key_value_heads) * c.head_dim;
  const bool cluster = cu::attention_decode_cluster_fits(attention_args(*ctx, kb, c, batch, mean_ctx, overlap));
  auto attention_row = [&](const std::string& name, int chunk, cu::DecodeKernel kernel, int heads, bool in_step) {
    cu::AttentionDecodeBatchArgs a = attention_args(*ctx, kb, c, batch, mean_ctx, overlap);
    a.kernel = kernel, a.cluster_heads = heads;
    const double t = time_graph(*ctx, 64, [&](int) { return cu::attention_decode_batch_chunked(a, chunk); });
    rows.push_back({"attention, ctx " + std::to_string(mean_ctx) + " (" + name + ")", t,
                    double(batch) * 2.0 * mean_ctx * kv_dim * 2, in_step ? c.num_hidden_layers : 0});
  };
  const bool step_split_k = !cluster || step.split_k_attention;
  for (int chunk : {0, 64, 128})
    attention_row(chunk ? "split-K, chunks >= " + std::to_string(chunk) + " keys" : "split-K", chunk,
                  cu::DecodeKernel::kSplitK, 0, step_split_k && chunk == step.attention_min_chunk);
  const int default_heads = c.head_dim == 64 ? 1 : 2;  // attention_decode.cu's cluster_heads()
  if (cluster)
    for (int heads : {4, 2, 1})
      if ((c.num_attention_heads / c.num_key_value_heads) % heads == 0)
        attention_row("cluster, " + std::to_string(heads) + " q heads per block", 0, cu::DecodeKernel::kCluster, heads,
                      heads == default_heads && !step_split_k);
  // Whole layers: the kCudaDecodeShapes and kCudaDecodeRegisterShapes grids, then every GEMV on the ring.
  const bool small = batch <= 4;
  // Above 4 rows: cuda_decode_shapes() and every GEMV at 16 rows a block (the grids before kCudaDecodeShapesMany).
  static constexpr lathe::CudaDecodeShapes kMany16{{0, false}, {0, false}, {0, false}, {0, false}, {0, false}};
  for (const auto* table : {&lathe::cuda_decode_shapes(batch), small ? &lathe::kCudaDecodeRegisterShapes : &kMany16}) {
    const lathe::CudaDecodeShapes& sh = *table;
    const char* name = table == &lathe::kCudaDecodeRegisterShapes ? "kCudaDecodeRegisterShapes"
                       : table == &kMany16                        ? "16 rows a block, k not split"
                                                                  : "cuda_decode_shapes";
    auto grid_of = [&](int i) {
      const lathe::CudaGemvGrid g[4] = {sh.qkv, sh.o, sh.gate_up, sh.down};
      return Grid{.shape = g[i].shape, .split = !small && g[i].split,
                  .persistent = small && g[i].persistent && step.persistent, .ring_kib = g[i].ring_kib,
                  .per_sm = g[i].per_sm};
    };
    rows.push_back(time_layer(*ctx, kb, c, batch, mean_ctx, overlap, name, grid_of));
    if (table != &lathe::cuda_decode_shapes(batch)) continue;
    if (cluster)
      rows.push_back(time_layer(*ctx, kb, c, batch, mean_ctx, overlap, name, grid_of, 0, cu::DecodeKernel::kSplitK));
    // Each ring GEMV pulling the next one's first units (1, a ring's 3, all) into L2; the largest carveout.
    if (small && overlap) {
      for (int units : {1, 3, 64})
        rows.push_back(time_layer(*ctx, kb, c, batch, mean_ctx, overlap, name, grid_of, 0, cu::DecodeKernel::kAuto,
                                  units));
      rows.push_back(time_layer(*ctx, kb, c, batch, mean_ctx, overlap, name, grid_of, 0, cu::DecodeKernel::kAuto, 0,
                                true));
    }
  }
  struct RingCase {
    int kib, per_sm, chunk;
  };
  if (small)
    for (RingCase r : {RingCase{96, 1, 0}, {160, 1, 0}, {64, 2, 0}})
      rows.push_back(time_layer(*ctx, kb, c, batch, mean_ctx, overlap,
                                "smem ring " + std::to_string(r.kib) + " KiB, " + std::to_string(r.per_sm) + "/SM",
                                [&](int) {
                                  return Grid{.shape = cu::kGemvBulkShape, .ring_kib = r.kib, .per_sm = r.per_sm};
                                },
                                r.chunk));
  // The 64 KiB ring at two blocks per SM leaves room for a third block, the next kernel's, with the largest
  // carveout: its ring fills while this one's blocks stream (with and without the L2 prefetch).
  if (small && overlap)
    for (int units : {0, 3})
      rows.push_back(time_layer(
          *ctx, kb, c, batch, mean_ctx, overlap, "smem ring 64 KiB, 2/SM",
          [&](int) { return Grid{.shape = cu::kGemvBulkShape, .ring_kib = 64, .per_sm = 2}; }, 0,
          cu::DecodeKernel::kAuto, units, true));
  std::printf("\n%s decode kernels, batch %d, one at a time (graph of back-to-back calls, weights not in L2; "
              "x0: a block shape the step does not run there; layer rows: GB/s of the layer's GEMV weights)\n",
              s.name, batch);
  std::printf("| kernel | us | GB/s | of 4.3 TB/s | per step |\n|---|---|---|---|---|\n");
  double sum = 0.0;
  for (const KernelRow& r : rows) {
    const double gbps = r.s > 0 ? r.bytes / r.s / 1e9 : 0.0;
    std::printf("| %s | %.1f | %.0f | %.0f%% | x%d |\n", r.name.c_str(), r.s * 1e6, gbps, 100.0 * gbps / 4300.0,
                r.per_step);
    sum += r.s * r.per_step;
  }
  std::printf("these kernels add up to %.3f ms per step; the graph's step took %.3f ms (the rest: the inputs kernel, "
              "the pick, gaps)\n",
              sum * 1e3, step_s * 1e3);
  std::fflush(stdout);
}

void bench_chain(const Shape& s) {
  const ModelConfig& c = s.cfg;
  auto ctx = cu::CudaContext::create(0);
  KernelBuffers kb;
  if (!ok(ctx.status(), "context") || !make_buffers(*ctx, c, 1, 64, kb)) return;
  const int64_t h = c.hidden_size, q_dim = int64_t(c.num_attention_heads) * c.head_dim,
                kv = int64_t(c.num_key_value_heads) * c.head_dim, ffn = c.intermediate_size;
  const int64_t rows[4] = {q_dim + 2 * kv, h, 2 * ffn, h}, ks[4] = {h, q_dim, h, ffn};
  int64_t layer_elems = 0;
  for (int i = 0; i < 4; ++i) layer_elems += rows[i] * ks[i];
  const int layers = static_cast<int>(std::min<int64_t>(cu::kGemvChainMax / 4, int64_t(kb.pool_bytes / 2) / layer_elems));
  cu::GemvChain chain;
  const auto* pool = static_cast<const bf16_bits*>(kb.pool.data());
  for (int l = 0; l < layers; ++l) {
    const bf16_bits* w = pool + int64_t(l) * layer_elems;
    for (int i = 0; i < 4; ++i) {
      chain.w[chain.count] = w, chain.n[chain.count] = static_cast<int32_t>(rows[i]);
      chain.k[chain.count] = static_cast<int32_t>(ks[i]);
      ++chain.count;
      w += rows[i] * ks[i];
    }
  }
  chain.x = kb.x, chain.out = kb.out;
  const double bytes = double(layers) * double(layer_elems) * 2;
  auto report = [&](const char* what, double t) {
    std::printf("| %s | %d layers | %.1f us per layer | %.0f GB/s | %.0f%% of 4.3 TB/s |\n", what, layers,
                t * 1e6 / layers, bytes / t / 1e9, 100.0 * bytes / t / 4.3e12);
  };
  const auto st = static_cast<cudaStream_t>(ctx->stream());
  auto counter = cu::DeviceBuffer::alloc(ctx->device(), 256);
  if (!ok(counter.status(), "alloc")) return;
  for (auto [per_sm, kib] : {std::pair{2, 96}, std::pair{1, 224}})
    for (int in_flight : {0, 1, 2, 3, 5})
      for (int mode : {0, 2}) {  // plain; a grid barrier between GEMVs
        chain.ring_kib = kib;
        chain.in_flight = in_flight;
        chain.barrier = mode == 2 ? static_cast<unsigned*>(counter->data()) : nullptr;
        const double t = time_graph(*ctx, 4, [&](int) -> Status {
          if (chain.barrier) LATHE_TRY(cu::fill_zero(*ctx, chain.barrier, 4));
          const cudaError_t err = cu::launch_gemv_chain(chain, per_sm, st, ctx->device());
          return err == cudaSuccess ? Status::ok() : lathe::unsupported("chain: ", cudaGetErrorString(err));
        });
        const std::string what = "one persistent kernel, " + std::to_string(per_sm) + "/SM, " + std::to_string(kib) +
                                 " KiB, in flight " + std::to_string(in_flight) +
                                 (mode == 2 ? ", a grid barrier before each GEMV's products" : "");
        report(what.c_str(), t);
        std::fflush(stdout);
      }
  struct PerGemv {
    int per_sm, kib;
    bool max_carveout;
  };
  for (const PerGemv v : {PerGemv{2, 96, false}, PerGemv{2, 96, true}, PerGemv{1, 96, true}, PerGemv{1, 104, true},
                          PerGemv{1, 112, true}, PerGemv{1, 104, false}}) {
    const double t = time_graph(*ctx, 4, [&](int) -> Status {
      for (int i = 0; i < chain.count; ++i) {
        cu::GemvArgs g{.x = kb.x, .w = chain.w[i], .out = kb.out, .rows = 1, .n = chain.n[i], .k = chain.k[i],
                       .epilogue = cu::GemvEpilogue::kStoreF32, .overlap = true, .shape = cu::kGemvBulkShape,
                       .ring_kib = static_cast<uint16_t>(v.kib), .blocks_per_sm = static_cast<uint8_t>(v.per_sm),
                       .max_carveout = v.max_carveout};
        LATHE_TRY(cu::gemv(*ctx, g));
      }
      return Status::ok();
    });
    const std::string what = "a ring kernel per GEMV (overlapped launches), " + std::to_string(v.per_sm) + "/SM, " +
                             std::to_string(v.kib) + " KiB" + (v.max_carveout ? ", max carveout" : "");
    report(what.c_str(), t);
  }
}

}  // namespace lathe::bench_generate
