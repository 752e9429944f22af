// Generation on one GPU at Llama-3.2-1B and Llama-3.1-8B shapes with random
// bf16 weights made on the device: prefill tokens/s over a prompt, and
// decode tokens/s of B sequences at once (every sequence gets the same
// prompt, then one token each per step, greedy on the device) with and
// without CUDA graphs, each beside its floor: decode against the
// memory-bandwidth floor (every weight read once per step plus each
// sequence's KV cache, at the measured ~4.3 TB/s of the H200; tokens/s
// counts all B sequences), prefill against the bf16 GEMM peak
// (~810 TFLOP/s through cuBLASLt). A decode step is 5·n_layer + 2 kernels
// (cuda_causal_lm.cpp) plus the greedy pick. Decode runs as `lathe
// generate` does (start_decode / next_tokens: each step's picks feed the
// next step on the device, steps queued ahead of the host); the row also
// shows the host-fed loop (a decode_batch_greedy() call per step, the ids
// up and down each step). The baseline, transformers generate on the same
// machine, is bench/generate_hf.py (same --batch).
//
//   bench_generate_cuda [--shape 1b|8b|all] [--prompt 512] [--decode 256] [--batch 1] [--overlap 1] [--kernels 1]
//                       [--persistent 1] [--registers 0] [--bulk 0] [--ring-kib 0] [--ring-per-sm 0]
//                       [--attn-chunk 0] [--split-k-attention 0] [--ab 1] [--ab-filter TEXT] [--chain 0]
//
// --chain 1 runs only a diagnostic: layers of the shape's four decode GEMVs
// (one x row, f32 out) streamed by one persistent ring kernel
// (launch_gemv_chain), plain and with a grid barrier before each GEMV's
// products (as a persistent decode step needs), at 2 blocks per SM
// and 96 KiB and at 1 with 224 KiB, each with the producers' units in
// flight unbounded and at 1, 2, 3 and 5 (GemvChain::in_flight), beside the same GEMVs as one
// ring kernel each (2 per SM, and 1 per SM with rings small enough for the
// next kernel's block to be resident beside): what kernel boundaries and
// barriers cost the stream. --ab-filter runs only the A/B cases whose name
// holds TEXT.
// --overlap 0 launches the decode kernels the ordinary way rather than as
// programmatic dependent launches (to measure what the overlap gains).
// --persistent 0 turns off the persistent GEMV grids cuda_decode_shapes()
// picks (CudaModelOptions::persistent_gemv). --registers 1 runs the decode
// GEMVs on kCudaDecodeRegisterShapes (the grids before the shared-memory
// ring); --bulk 1 every one on the ring with --ring-kib KiB and
// --ring-per-sm blocks per SM (0: cuda_decode_shapes()' values);
// --attn-chunk N the split-K decode attention with chunks of at least N
// keys; --split-k-attention 1 the step on it (not the cluster kernel). Up
// to 4 sequences (unless --ab 0) each shape's row is followed by the A/B line: the same
// model's decode with the split-K attention instead of the cluster
// kernel, the cluster kernel at 4, 2 and 1 query heads per block, every
// GEMV on the ring of 96 and of 64 KiB (two blocks per SM), and on
// kCudaDecodeRegisterShapes; without and with the L2 prefetch of each
// GEMV's successor (CudaModelOptions::l2_prefetch_units: 1, 3, all units;
// 3 but not from q|k|v), the ring GEMVs at the largest shared-memory
// carveout, the ring filled at once (GemvArgs::ring_fill_at_once), its
// producers at 0 (the whole ring), 1 and 3 units in flight (GemvArgs::ring_in_flight), and the
// 64 KiB ring with the largest carveout (without and with the prefetch).
// LATHE_CUDA_DECODE_L2_PREFETCH sets the prefetch of the main row and of
// the A/B cases that do not name one.
// After each shape's row, unless --kernels 0, a table of the decode step's
// kernels one at a time at that shape and batch: each skinny GEMM (with
// the epilogue and fused norm the decode step gives it) and the attention
// at the mean context (split-K and cluster kernels), timed as a CUDA graph of back-to-back calls (each
// call on its own copy of the weights, so nothing is served from L2), in
// GB/s of weights (K/V for attention) beside the ~4.3 TB/s floor; whole
// layers chained as the step runs them (q|k|v, attention, o, gate|up,
// down: what the boundaries cost) with cuda_decode_shapes() (also with the
// L2 prefetch and the largest carveout) and on the ring;
// and the step the per-step kernels add up to, beside the one measured.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
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
#include "models/cuda_causal_lm.h"
#include "models/family.h"

namespace {

using lathe::CudaCausalLM;
using lathe::ModelConfig;
using Clock = std::chrono::steady_clock;

constexpr double kBandwidth = 4.3e12;  // bytes/s, device-to-device copy measured on the H200
constexpr double kGemmPeak = 810e12;   // bf16 FLOP/s through cuBLASLt on the H200

struct Shape {
  const char* name;
  ModelConfig cfg;
};

ModelConfig llama3(int hidden, int layers, int heads, int kv_heads, int ffn, bool tied) {
  ModelConfig c;
  c.model_type = "llama";
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 128256;
  c.hidden_size = hidden;
  c.intermediate_size = ffn;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.max_position_embeddings = 131072;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 500000.0f;
  c.rope_scaling.type = "llama3";
  c.rope_scaling.factor = 32.0f;
  c.rope_scaling.low_freq_factor = 1.0f;
  c.rope_scaling.high_freq_factor = 4.0f;
  c.rope_scaling.original_max_position_embeddings = 8192;
  c.tie_word_embeddings = tied;
  return c;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<int32_t> prompt_ids(int n, int vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((int64_t(i) * 7919 + 13) % vocab);
  return ids;
}

// Bytes read per decode step of `batch` sequences: the weights once (the
// embedding contributes a row per sequence, neglected; a tied head is the
// embedding read once) plus each sequence's KV cache at mean context ctx.
double decode_bytes(const ModelConfig& c, int64_t n_params, double ctx, int batch) {
  const double embed = double(c.vocab_size) * c.hidden_size;
  const double weights = 2.0 * (n_params - (c.tie_word_embeddings ? 0.0 : embed));
  const double kv = 2.0 * 2.0 * c.num_hidden_layers * ctx * c.num_key_value_heads * c.head_dim;
  return weights + batch * kv;
}

// Best of reps: prefill seconds for the prompt; decode seconds for n tokens after it.
struct Timing {
  double prefill_s = 1e30, decode_s = 1e30;
};

// fed: decode through start_decode() / next_tokens() (each step's picks feed
// the next on the device, steps queued ahead of the host: what `lathe
// generate` runs); otherwise a decode_batch_greedy() call per step (the ids
// come to the host and go back up each step).
Timing time_model(CudaCausalLM& m, const std::vector<int32_t>& prompt, int n_decode, int batch, bool graphs,
                  int reps, bool fed = true) {
  Timing t;
  m.set_use_graphs(graphs);
  std::vector<int32_t> cur(static_cast<size_t>(batch)), next(static_cast<size_t>(batch));
  for (int r = 0; r < reps; ++r) {
    m.clear();
    for (int s = 0; s < batch; ++s) {
      Clock::time_point t0 = Clock::now();
      std::vector<float> logits(static_cast<size_t>(m.config().vocab_size));
      lathe::Status st = m.forward_seq(s, prompt, logits);  // waits for the device (the logits come back)
      if (!st.is_ok()) {
        std::fprintf(stderr, "prefill: %s\n", st.message().c_str());
        return t;
      }
      if (s == 0) t.prefill_s = std::min(t.prefill_s, seconds_since(t0));
      cur[s] = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }
    Clock::time_point t1 = Clock::now();
    lathe::Status st = fed ? m.start_decode(cur, n_decode) : lathe::Status::ok();
    for (int i = 0; i < n_decode && st.is_ok(); ++i) {
      st = fed ? m.next_tokens(next) : m.decode_batch_greedy(cur, next);
      cur.swap(next);
    }
    if (!st.is_ok()) {
      std::fprintf(stderr, "decode: %s\n", st.message().c_str());
      return t;
    }
    t.decode_s = std::min(t.decode_s, seconds_since(t1));
    m.stop_decode();
  }
  return t;
}

// ---- The decode step's kernels one at a time ------------------------------------

using lathe::Status;
using lathe::cuda::bf16_bits;
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

// How the decode step runs its GEMVs: cuda_decode_shapes() (persistent as
// CudaModelOptions::persistent_gemv) or every one on the shared-memory ring.
struct StepGemvs {
  bool persistent = true, registers = false, bulk = false;
  int ring_kib = 0, per_sm = 0, attention_min_chunk = 0;
  bool split_k_attention = false;
};

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

double run_shape(const Shape& s, int n_prompt, int n_decode, int batch, bool overlap, const StepGemvs& step, bool ab,
                 const std::string& ab_filter) {
  auto header = lathe::model_header_from_config(s.cfg, s.name);
  if (!header.is_ok()) {
    std::fprintf(stderr, "%s: %s\n", s.name, header.status().message().c_str());
    return 0.0;
  }
  lathe::CudaModelOptions opts{.max_seq = n_prompt + n_decode + 1, .max_forward_tokens = n_prompt, .max_batch = batch,
                               .overlap_launches = overlap, .persistent_gemv = step.persistent,
                               .register_gemv = step.registers, .bulk_gemv = step.bulk,
                               .bulk_ring_kib = step.ring_kib, .bulk_per_sm = step.per_sm,
                               .attention_min_chunk = step.attention_min_chunk,
                               .split_k_attention = step.split_k_attention};
  auto model = CudaCausalLM::random(*header, opts, /*seed=*/1);
  if (!model.is_ok()) {
    std::fprintf(stderr, "%s: %s\n", s.name, model.status().message().c_str());
    return 0.0;
  }
  CudaCausalLM& m = **model;
  const std::vector<int32_t> prompt = prompt_ids(n_prompt, s.cfg.vocab_size);
  const Timing eager = time_model(m, prompt, n_decode, batch, /*graphs=*/false, 2);
  const Timing graph = time_model(m, prompt, n_decode, batch, /*graphs=*/true, 3);
  const Timing host_fed = time_model(m, prompt, n_decode, batch, /*graphs=*/true, 3, /*fed=*/false);
  const double params = double(m.n_params());
  const double prefill_flops = 2.0 * params * n_prompt;
  const double bytes = decode_bytes(s.cfg, m.n_params(), n_prompt + n_decode / 2.0, batch);
  const double floor_tps = batch * kBandwidth / bytes;
  const double tps_graph = double(batch) * n_decode / graph.decode_s;
  const double tps_eager = double(batch) * n_decode / eager.decode_s;
  const double tps_host = double(batch) * n_decode / host_fed.decode_s;
  std::printf("| %s | %.2fB | %d | %d | %.0f | %.0f%% | %.1f | %.1f | %.1f | %.0f | %.0f%% |\n", s.name,
              params / 1e9, batch, n_prompt, n_prompt / graph.prefill_s,
              100.0 * prefill_flops / graph.prefill_s / kGemmPeak, tps_eager, tps_host, tps_graph, floor_tps,
              100.0 * tps_graph / floor_tps);
  // The A/B of the decode GEMVs (up to 4 sequences): the same model with the grids before the ring, and the ring
  // in other sizes.
  if (batch <= 4 && ab) {
    std::printf("  %s decode tok/s (graph)", s.name);
    struct Case {
      const char* name;
      lathe::CudaModelOptions o;
    };
    const Case cases[] = {
        {"split-K attention (the step before the cluster kernel)", {.split_k_attention = true}},
        {"cluster attention, 4 q heads per block", {.attention_cluster_heads = 4}},
        {"cluster attention, 2 q heads per block", {.attention_cluster_heads = 2}},
        {"cluster attention, 1 q head per block", {.attention_cluster_heads = 1}},
        {"ring 96 KiB 2/SM", {.bulk_gemv = true, .bulk_ring_kib = 96, .bulk_per_sm = 2}},
        {"ring 64 KiB 2/SM", {.bulk_gemv = true, .bulk_ring_kib = 64, .bulk_per_sm = 2}},
        {"kCudaDecodeRegisterShapes", {.register_gemv = true}},
        {"no L2 prefetch", {.l2_prefetch_units = 0}},
        {"L2 prefetch 1 unit", {.l2_prefetch_units = 1}},
        {"L2 prefetch 3 units", {.l2_prefetch_units = 3}},
        {"L2 prefetch all", {.l2_prefetch_units = 64}},
        {"L2 prefetch 3 units, not from q|k|v", {.l2_prefetch_units = 3, .l2_prefetch_each = {.qkv = 0}}},
        {"L2 prefetch q|k|v 0, o 1, gate|up 3, down all, LM head all",
         {.l2_prefetch_each = {.qkv = 0, .o = 1, .gate_up = 3, .down = 64, .lm_head = 64}}},
        {"max carveout", {.ring_max_carveout = true}},
        {"ring filled at once (not the first unit alone first)", {.ring_fill_at_once = true}},
        {"ring GEMVs, the first unit alone, then the whole ring in flight (before)", {.ring_in_flight = 0}},
        {"ring GEMVs, 1 unit in flight", {.ring_in_flight = 1}},
        {"ring GEMVs, 3 units in flight", {.ring_in_flight = 3}},
        {"ring 64 KiB 2/SM, max carveout",
         {.bulk_gemv = true, .bulk_ring_kib = 64, .bulk_per_sm = 2, .ring_max_carveout = true}},
        {"ring 64 KiB 2/SM, max carveout, L2 prefetch 3",
         {.bulk_gemv = true, .bulk_ring_kib = 64, .bulk_per_sm = 2, .l2_prefetch_units = 3,
          .ring_max_carveout = true}},
        {"ring 96 KiB 1/SM, max carveout (the next kernel's block beside)",
         {.bulk_gemv = true, .bulk_ring_kib = 96, .bulk_per_sm = 1, .ring_max_carveout = true}},
        {"ring 104 KiB 1/SM, max carveout (the next kernel's block beside)",
         {.bulk_gemv = true, .bulk_ring_kib = 104, .bulk_per_sm = 1, .ring_max_carveout = true}},
        {"ring 104 KiB 1/SM, max carveout, no L2 prefetch",
         {.bulk_gemv = true, .bulk_ring_kib = 104, .bulk_per_sm = 1, .l2_prefetch_units = 0,
          .ring_max_carveout = true}},
        {"ring 112 KiB 1/SM, max carveout (two rings and the attention fill an SM)",
         {.bulk_gemv = true, .bulk_ring_kib = 112, .bulk_per_sm = 1, .ring_max_carveout = true}},
    };
    for (const Case& c : cases) {
      if (!ab_filter.empty() && std::string(c.name).find(ab_filter) == std::string::npos) continue;
      m.set_decode_gemvs(c.o);
      const double tps = double(batch) * n_decode / time_model(m, prompt, n_decode, batch, true, 2).decode_s;
      std::printf(" %s: %.1f (%.0f%%);", c.name, tps, 100.0 * tps / floor_tps);
    }
    std::printf("\n");
    m.set_decode_gemvs(opts);
  }
  if (batch > 1 && ab) {
    // The projections through cuBLASLt against the GEMVs (the ring up to 4 sequences, the tensor cores above).
    lathe::CudaModelOptions gemvs = opts, gemms = opts;
    gemvs.cublas_decode_rows = 0;
    gemms.cublas_decode_rows = 2;
    for (int round = 0; round < 2; ++round) {
      for (const lathe::CudaModelOptions* o : {&gemvs, &gemms}) {
        m.set_decode_gemvs(*o);
        const double tps = double(batch) * n_decode / time_model(m, prompt, n_decode, batch, true, 2).decode_s;
        std::printf("  %s decode tok/s (graph), %s: %.1f (%.0f%%)\n", s.name,
                    o->cublas_decode_rows ? "cuBLASLt projections" : "GEMVs", tps, 100.0 * tps / floor_tps);
      }
    }
    m.set_decode_gemvs(opts);
  }
  std::fflush(stdout);
  return graph.decode_s / n_decode;
}

// --chain: a diagnostic. Layers of the shape's four decode GEMVs (q|k|v,
// o, gate|up, down; one x row, f32 out, copies of the weights through the
// pool) streamed (a) by one persistent ring kernel (launch_gemv_chain) and
// (b) as separate ring kernels with overlapped launches: what a kernel
// boundary costs the stream with nothing else in the step.
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

}  // namespace

int main(int argc, char** argv) {
  std::string which = "all", ab_filter;
  int n_prompt = 512, n_decode = 256, batch = 1, overlap = 1, kernels = 1, persistent = 1, bulk = 0, ring_kib = 0,
      attn_chunk = 0, ring_per_sm = 0, registers = 0, split_k_attention = 0, ab = 1, chain = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--shape")) which = argv[i + 1];
    else if (!std::strcmp(argv[i], "--prompt")) n_prompt = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--decode")) n_decode = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batch")) batch = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--overlap")) overlap = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--kernels")) kernels = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--persistent")) persistent = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--bulk")) bulk = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--ring-kib")) ring_kib = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--ring-per-sm")) ring_per_sm = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--registers")) registers = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--attn-chunk")) attn_chunk = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--split-k-attention")) split_k_attention = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--ab")) ab = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--ab-filter")) ab_filter = argv[i + 1];
    else if (!std::strcmp(argv[i], "--chain")) chain = std::atoi(argv[i + 1]);
  }
  if (lathe::cuda::device_count() == 0) {
    std::fprintf(stderr, "bench_generate_cuda: no CUDA device visible\n");
    return 1;
  }
  if (n_prompt < 2 || n_decode < 1 || batch < 1 || batch > 256) {
    std::fprintf(stderr, "bench_generate_cuda: --prompt must be >= 2, --decode >= 1 and --batch in [1, 256]\n");
    return 1;
  }
  const Shape shapes[] = {
      {"Llama-3.2-1B", llama3(2048, 16, 32, 8, 8192, /*tied=*/true)},
      {"Llama-3.1-8B", llama3(4096, 32, 32, 8, 14336, /*tied=*/false)},
  };
  if (chain) {
    for (const Shape& s : shapes)
      if (which == "all" || (which == "1b") == (std::strstr(s.name, "1B") != nullptr)) bench_chain(s);
    return 0;
  }
  std::printf("generation, batch %d, bf16, random weights; decode greedy on the device, 5 kernels per layer + 2 "
              "per step (overlapped launches: %s); tok/s counts all sequences\n", batch, overlap ? "on" : "off");
  std::printf("| shape | params | batch | prompt | prefill tok/s | of GEMM peak | decode tok/s eager | decode tok/s "
              "graph, host-fed | decode tok/s graph | bandwidth floor tok/s | of floor |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|\n");
  const StepGemvs step{
      .persistent = persistent != 0, .registers = registers != 0, .bulk = bulk != 0, .ring_kib = ring_kib,
      .per_sm = ring_per_sm, .attention_min_chunk = attn_chunk, .split_k_attention = split_k_attention != 0};
  std::vector<std::pair<const Shape*, double>> ran;  // shape, seconds per decode step
  for (const Shape& s : shapes) {
    const bool is_1b = std::strstr(s.name, "1B") != nullptr;
    if (which != "all" && !(which == "1b" && is_1b) && !(which == "8b" && !is_1b)) continue;
    ran.push_back({&s, run_shape(s, n_prompt, n_decode, batch, overlap != 0, step, ab != 0, ab_filter)});
  }
  if (kernels)
    for (const auto& [s, step_s] : ran) bench_kernels(*s, batch, n_prompt + n_decode / 2, overlap != 0, step, step_s);
  return 0;
}
