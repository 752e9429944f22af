// CudaCausalLM: the forward pass of causal_lm.cpp on the GPU in bf16 with
// f32 accumulation, shaped for generation:
//   h = embed(tokens)
//   per layer: x = norm(h); q,k,v = x·Wqkvᵀ (+b); q/k norm; RoPE; cache ← k,v;
//              h += attn(q, cache)·Woᵀ; x = norm(h); h += (silu(x·Wgᵀ)·(x·Wuᵀ))·Wdᵀ
//   logits = norm(h)·Wheadᵀ (f32)
// The residual stream h is f32: every add into it and every norm of it is
// done in f32 (rounding h to bf16 after each add is the largest error of a
// bf16 forward), the projections that feed it write f32, and the logits are
// never rounded. A decode step on the ring GEMVs (below
// cublas_decode_rows) rounds only what is stored: the normed input of a
// projection, q/k until after RoPE, gate/up and the SwiGLU output stay f32
// into the next kernel, and q, k, v are rounded once for the attention and
// the cache (through cuBLASLt the SwiGLU output is rounded to bf16 for
// down, as the tensor-core GEMVs round it). (Prefill rounds gate and up
// as Hugging Face does: measured on the fixtures, SwiGLU from f32 gate/up
// there moved the error around rather than down.) q/k/v and gate/up
// weights are stacked into one matrix each.
//
// Two paths. Prefill (n tokens of one sequence) runs cuBLASLt GEMMs into
// buffers laid out [q | k | v] by part and the flash attention kernel. A
// decode step (one token for each of sequences 0..B−1) runs the skinny GEMM
// of decode_ops.h with the norm before it and its epilogue fused: per layer
// norm+qkv (+bias)+RoPE+KV append, attention (up to 4 sequences the
// cluster kernel, else split-K: attention.h), o (+residual), norm+gate|up (+SwiGLU), down
// (+residual): 5 kernels (6 with a q/k norm, which takes RoPE and the
// append into a kernel of its own); plus the inputs (embedding and RoPE
// tables, one kernel) and final norm+LM head: 5·n_layer + 2 kernels per
// step (82 for Llama-3.2-1B, 162 for Llama-3.1-8B; above 4 sequences the
// three norms are kernels of their own; from CudaModelOptions::
// cublas_decode_rows sequences on, 3 by default, the projections go through
// cuBLASLt with RoPE + append and SwiGLU kernels between them),
// captured once per B as a CUDA graph. On sm_90+ every kernel of a
// layer is a programmatic dependent launch (decode_ops.h): each starts
// while its predecessor drains, the GEMVs with their first weights in
// flight before they wait; up to 4 sequences each GEMV takes the block
// shape measured fastest for it (cuda_decode_shapes(B)), or with bulk_gemv the
// shared-memory ring. A ring GEMV pulls the first weights of the GEMV
// after it into L2 as its own copies drain (CudaModelOptions::
// l2_prefetch_units, by default at one sequence a unit per block once all
// but the block's last unit are consumed), so the DRAM keeps streaming
// while one kernel's blocks drain and the next one's start.
//
// Memory: two device arenas planned at load, weights and state (a KV cache
// per sequence, activations for max_forward_tokens or max_batch rows,
// logits). A decode step reads its tokens, positions and cache pointers
// from the state arena, so its graph is captured once (on the second step
// of that B, after an eager one) and replayed after.
#include "models/cuda_causal_lm.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "backends/cuda/attention.h"
#include "core/log.h"
#include "models/cuda_causal_lm_impl.h"

namespace lathe {

using cuda_lm::kFusedNormRows;
using cuda_lm::kMaxBatch;
using cuda_lm::LayerWeights;

// ---- Forward -------------------------------------------------------------------

// out = x·Wᵀ (+ b) for x [n, k] and W [Σ parts, k] stacked from parts. One
// GEMM when n = 1; otherwise one per part, part p landing at
// out + n·(rows before p). A bias is laid into out first and added by the
// GEMM (beta = 1) before its one rounding to bf16.
Status CudaCausalLmImpl::project(const bf16_bits* x, int64_t k, const bf16_bits* w, const bf16_bits* b,
                                 bf16_bits* out, int64_t n, std::initializer_list<int64_t> parts) {
  int64_t total = 0;
  for (int64_t p : parts) total += p;
  const float beta = b ? 1.0f : 0.0f;
  if (n == 1) {
    if (b) LATHE_TRY(cuda::broadcast_rows(ctx, out, b, 1, total));
    return cuda::gemm(ctx, {.a = x, .b = w, .c = out, .m = 1, .n = total, .k = k, .trans_b = true, .beta = beta});
  }
  int64_t row = 0;
  for (int64_t p : parts) {
    bf16_bits* dst = out + n * row;
    if (b) LATHE_TRY(cuda::broadcast_rows(ctx, dst, b + row, n, p));
    LATHE_TRY(cuda::gemm(ctx, {.a = x, .b = w + row * k, .c = dst, .m = n, .n = p, .k = k, .trans_b = true,
                               .beta = beta}));
    row += p;
  }
  return Status::ok();
}

Status CudaCausalLmImpl::prefill_attention(int l, int64_t n, int seq, int pos0, const bf16_bits* q) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int n_head = cfg.num_attention_heads, n_kv = cfg.num_key_value_heads, window = quirks.sliding_window;
  if (!flash) {
    return cuda::attention_simple(ctx, {.q = q, .k_cache = k_at(l, seq), .v_cache = v_at(l, seq), .out = buf.attn,
                                        .pos0 = buf.positions, .n_tokens = static_cast<int>(n), .n_head = n_head,
                                        .n_head_kv = n_kv, .head_dim = static_cast<int>(hd), .window = window,
                                        .scale = scale});
  }
  return cuda::attention_decode({.q = q, .k_cache = k_at(l, seq), .v_cache = v_at(l, seq), .out = buf.attn,
                                 .workspace = buf.attn_workspace, .n_tokens = static_cast<int>(n),
                                 .n_ctx = opts.max_seq, .n_head = n_head, .n_head_kv = n_kv,
                                 .head_dim = static_cast<int>(hd), .pos0 = pos0, .window = window, .scale = scale,
                                 .stream = ctx.stream()});
}

Status CudaCausalLmImpl::prefill_layer(int l, int64_t n, int seq, int pos0) {
  const LayerWeights& w = layers[l];
  const float eps = cfg.rms_norm_eps;
  const int n_head = cfg.num_attention_heads, n_kv = cfg.num_key_value_heads;
  // The previous layer's MLP output (and its bias) joins the residual stream in this norm.
  const bool pending = l > 0;
  LATHE_TRY(cuda::residual_norm(ctx, {.h = buf.h, .delta = pending ? buf.delta : nullptr,
                                      .bias = pending ? layers[l - 1].down_b : nullptr, .w = w.attn_norm,
                                      .y = buf.normed, .rows = n, .dim = hidden, .eps = eps}));
  LATHE_TRY(project(buf.normed, hidden, w.qkv_w, w.qkv_b, buf.qkv, n, {q_dim, kv_dim, kv_dim}));
  bf16_bits* q = buf.qkv;
  bf16_bits* k = buf.qkv + n * q_dim;
  bf16_bits* v = k + n * kv_dim;
  if (w.q_norm) {
    LATHE_TRY(cuda::rms_norm_residual_forward(
        ctx, {.x = q, .w = w.q_norm, .y = q, .rows = n * n_head, .dim = hd, .eps = eps}));
    LATHE_TRY(cuda::rms_norm_residual_forward(
        ctx, {.x = k, .w = w.k_norm, .y = k, .rows = n * n_kv, .dim = hd, .eps = eps}));
  }
  LATHE_TRY(cuda::rope_apply(ctx, {.x = q, .cos = buf.cos, .sin = buf.sin, .n_tokens = n, .n_head = n_head, .half = half}));
  LATHE_TRY(cuda::rope_apply(ctx, {.x = k, .cos = buf.cos, .sin = buf.sin, .n_tokens = n, .n_head = n_kv, .half = half}));
  LATHE_TRY(cuda::kv_append(ctx, {.k = k, .v = v, .k_cache = k_at(l, seq), .v_cache = v_at(l, seq),
                                  .pos0 = buf.positions, .n_tokens = n, .row_elems = kv_dim,
                                  .max_rows = opts.max_seq}));
  LATHE_TRY(prefill_attention(l, n, seq, pos0, q));
  LATHE_TRY(cuda::gemm(ctx, {.a = buf.attn, .b = w.o_w, .c = buf.delta, .m = n, .n = hidden, .k = q_dim,
                             .trans_b = true, .c_dtype = DType::F32}));
  LATHE_TRY(cuda::residual_norm(ctx, {.h = buf.h, .delta = buf.delta, .bias = w.o_b, .w = w.mlp_norm, .y = buf.normed,
                                      .rows = n, .dim = hidden, .eps = eps}));
  LATHE_TRY(project(buf.normed, hidden, w.gu_w, w.gu_b, buf.gu, n, {ffn, ffn}));
  LATHE_TRY(cuda::swiglu_forward(ctx, {.gate = buf.gu, .up = buf.gu + n * ffn, .out = buf.gu, .n = n * ffn}));
  return cuda::gemm(ctx, {.a = buf.gu, .b = w.down_w, .c = buf.delta, .m = n, .n = hidden, .k = ffn, .trans_b = true,
                          .c_dtype = DType::F32});
}

// One prefill pass over n tokens of sequence seq whose ids and positions are
// already on the device. logit_rows: 0 none, 1 the last token's, n all of them.
Status CudaCausalLmImpl::pass(int64_t n, int seq, int pos0, int64_t logit_rows) {
  uint32_t* seen = buf.seen + seq * seen_words;
  if (pos0 == 0) LATHE_TRY(cuda::fill_zero(ctx, seen, size_t(seen_words) * sizeof(uint32_t)));  // a new sequence
  LATHE_TRY(cuda::embedding_f32(ctx, {.tokens = buf.tokens, .table = embed, .out = buf.h, .n = n, .vocab = vocab,
                                      .dim = hidden, .seen = seen, .seen_stride = 0}));
  LATHE_TRY(cuda::rope_tables(ctx, {.inv_freq = inv_freq_dev, .positions = buf.positions, .cos = buf.cos,
                                    .sin = buf.sin, .n_tokens = n, .half = half}));
  for (int l = 0; l < n_layer; ++l) LATHE_TRY(prefill_layer(l, n, seq, pos0));
  if (logit_rows == 0) return Status::ok();
  const int64_t first = n - logit_rows;
  LATHE_TRY(cuda::residual_norm(ctx, {.h = buf.h + first * hidden, .delta = buf.delta + first * hidden,
                                      .bias = layers.back().down_b, .w = final_norm, .y = buf.normed + first * hidden,
                                      .rows = logit_rows, .dim = hidden, .eps = cfg.rms_norm_eps}));
  return cuda::gemm(ctx, {.a = buf.normed + first * hidden, .b = lm_head, .c = buf.logits, .m = logit_rows,
                          .n = vocab, .k = hidden, .trans_b = true, .c_dtype = DType::F32});
}

Status CudaCausalLmImpl::decode_attention(int l, int b) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int n_head = cfg.num_attention_heads, n_kv = cfg.num_key_value_heads, window = quirks.sliding_window;
  if (flash) {
    // Positions are uploaded before the step and older cache rows written by earlier steps, so the kernel may
    // read them before it waits for the q|k|v projection (attention.h).
    return cuda::attention_decode_batch_chunked(
        {.q = buf.q, .k_caches = reinterpret_cast<const void* const*>(k_ptrs(l)),
         .v_caches = reinterpret_cast<const void* const*>(v_ptrs(l)), .pos = buf.positions, .out = buf.attn,
         .workspace = buf.attn_workspace, .n_seqs = b, .max_ctx = opts.max_seq, .n_head = n_head, .n_head_kv = n_kv,
         .head_dim = static_cast<int>(hd), .window = window, .scale = scale, .stream = ctx.stream(),
         .overlap = overlap,
         .kernel = opts.split_k_attention ? cuda::DecodeKernel::kSplitK : cuda::DecodeKernel::kAuto,
         .cluster_heads = opts.attention_cluster_heads},
        b <= kFusedNormRows ? opts.attention_min_chunk : 0);
  }
  for (int s = 0; s < b; ++s) {
    LATHE_TRY(cuda::attention_simple(ctx, {.q = buf.q + s * q_dim, .k_cache = k_at(l, s), .v_cache = v_at(l, s),
                                           .out = buf.attn + s * q_dim, .pos0 = buf.positions + s, .n_tokens = 1,
                                           .n_head = n_head, .n_head_kv = n_kv, .head_dim = static_cast<int>(hd),
                                           .window = window, .scale = scale}));
  }
  return Status::ok();
}

// g over RMSNorm(h)'s first g.rows rows with norm weights norm_w. Up to
// kFusedNormRows rows the norm is computed inside the GEMV (every block
// rereads h, which stays in its SM's L1); more rows would not fit there,
// so they take the norm kernel first.
// g with `grid` (of decode_grids(g.rows)).
cuda::GemvArgs CudaCausalLmImpl::with_grid(cuda::GemvArgs g, CudaGemvGrid grid) const {
  const bool small = g.rows <= kFusedNormRows;
  g.shape = small && opts.bulk_gemv ? cuda::kGemvBulkShape : grid.shape;
  if (!small && grid.split) g.split = buf.split;
  g.ring_kib = opts.bulk_ring_kib > 0 ? static_cast<uint16_t>(std::min(opts.bulk_ring_kib, 224)) : grid.ring_kib;
  g.blocks_per_sm = static_cast<uint8_t>(std::clamp(opts.bulk_per_sm > 0 ? opts.bulk_per_sm : grid.per_sm, 0, 8));
  g.persistent = small && grid.persistent && opts.persistent_gemv;
  g.max_carveout = opts.ring_max_carveout;
  g.ring_fill_at_once = opts.ring_fill_at_once;
  const int in_flight = opts.ring_in_flight >= 0 ? opts.ring_in_flight : g.rows == 1 ? 2 : 0;
  g.ring_in_flight = static_cast<uint8_t>(std::clamp(in_flight, 0, 7));
  g.overlap = overlap;
  return g;
}

const CudaDecodeShapes& CudaCausalLmImpl::decode_grids(int b) const {
  return opts.register_gemv && b <= kFusedNormRows ? kCudaDecodeRegisterShapes : cuda_decode_shapes(b);
}

cuda::GemvArgs CudaCausalLmImpl::qkv_gemv(int l, int b) const {
  const LayerWeights& w = layers[l];
  if (w.q_norm)  // the q/k norm, RoPE and the append in a kernel of their own
    return with_grid({.w = w.qkv_w, .bias = w.qkv_b, .out = buf.qkv32, .rows = b, .n = qkv_dim, .k = hidden,
                      .epilogue = cuda::GemvEpilogue::kStoreF32},
                     decode_grids(b).qkv);
  // RoPE and the cache append in the projection's epilogue.
  cuda::GemvArgs g{.w = w.qkv_w, .bias = w.qkv_b, .rows = b, .n = qkv_dim, .k = hidden,
                   .epilogue = cuda::GemvEpilogue::kRopeAppend};
  g.rope = {.q_out = buf.q, .k_caches = k_ptrs(l), .v_caches = v_ptrs(l), .pos = buf.positions, .cos = buf.cos,
            .sin = buf.sin, .n_head = cfg.num_attention_heads, .n_head_kv = cfg.num_key_value_heads,
            .head_dim = static_cast<int>(hd), .max_ctx = opts.max_seq};
  return with_grid(g, decode_grids(b).qkv);
}

cuda::GemvArgs CudaCausalLmImpl::lm_head_gemv(int b) const {
  return with_grid({.w = lm_head, .out = buf.logits, .rows = b, .n = vocab, .k = hidden,
                    .epilogue = cuda::GemvEpilogue::kStoreF32},
                   decode_grids(b).lm_head);
}

cuda::GemvArgs CudaCausalLmImpl::prefetching(cuda::GemvArgs g, const cuda::GemvArgs& next,
                                             int CudaL2PrefetchUnits::*source) const {
  const int each = opts.l2_prefetch_each.*source;
  const int env_units = env_l2_prefetch.*source;
  // The default: a unit at one sequence (measured there), none at 2-4 (not measured).
  const int fallback = env_units >= 0 ? env_units : g.rows == 1 ? 1 : 0;
  const int units = each >= 0 ? each : opts.l2_prefetch_units >= 0 ? opts.l2_prefetch_units : fallback;
  if (units > 0 && g.shape == cuda::kGemvBulkShape)
    g.prefetch = cuda::gemv_l2_prefetch(next, units, opts.device, env_l2_prefetch_lag);
  return g;
}

Status CudaCausalLmImpl::norm_gemv(const bf16_bits* norm_w, cuda::GemvArgs g) {
  g.overlap = overlap;
  if (g.rows <= kFusedNormRows) {
    g.x_f32 = buf.h;
    g.norm_w = norm_w;
    g.eps = cfg.rms_norm_eps;
  } else {
    LATHE_TRY(cuda::residual_norm(ctx, {.h = buf.h, .w = norm_w, .y = buf.normed, .rows = g.rows, .dim = hidden,
                                        .eps = cfg.rms_norm_eps, .overlap = overlap}));
    g.x = buf.normed;
  }
  return cuda::gemv(ctx, g);
}

bool CudaCausalLmImpl::decode_gemms(int l, int b) const {
  if (opts.cublas_decode_rows <= 0 || b < std::max(2, opts.cublas_decode_rows)) return false;
  if (l < 0) return true;  // the LM head
  const LayerWeights& w = layers[l];
  return !w.qkv_b && !w.o_b && !w.gu_b && !w.down_b;
}

// decode_layer through cuBLASLt (CudaModelOptions::cublas_decode_rows).
Status CudaCausalLmImpl::decode_layer_gemms(int l, int b) {
  const LayerWeights& w = layers[l];
  const float eps = cfg.rms_norm_eps;
  auto norm = [&](const bf16_bits* norm_w) {
    return cuda::residual_norm(ctx, {.h = buf.h, .w = norm_w, .y = buf.normed, .rows = b, .dim = hidden, .eps = eps,
                                     .overlap = overlap});
  };
  LATHE_TRY(norm(w.attn_norm));
  LATHE_TRY(cuda::gemm(ctx, {.a = buf.normed, .b = w.qkv_w, .c = buf.qkv32, .m = b, .n = qkv_dim, .k = hidden,
                             .trans_b = true, .c_dtype = DType::F32}));
  LATHE_TRY(cuda::rope_append(ctx, {.qkv = buf.qkv32, .q_out = buf.q, .k_caches = k_ptrs(l), .v_caches = v_ptrs(l),
                                    .pos = buf.positions, .cos = buf.cos, .sin = buf.sin, .q_norm = w.q_norm,
                                    .k_norm = w.k_norm, .n_seqs = b, .n_head = cfg.num_attention_heads,
                                    .n_head_kv = cfg.num_key_value_heads, .head_dim = static_cast<int>(hd),
                                    .max_ctx = opts.max_seq, .eps = eps, .overlap = overlap}));
  LATHE_TRY(decode_attention(l, b));
  LATHE_TRY(cuda::gemm(ctx, {.a = buf.attn, .b = w.o_w, .c = buf.h, .m = b, .n = hidden, .k = q_dim, .trans_b = true,
                             .c_dtype = DType::F32, .beta = 1.0f}));
  LATHE_TRY(norm(w.mlp_norm));
  LATHE_TRY(cuda::gemm(ctx, {.a = buf.normed, .b = w.gu_w, .c = buf.gu32, .m = b, .n = 2 * ffn, .k = hidden,
                             .trans_b = true, .c_dtype = DType::F32}));
  LATHE_TRY(cuda::swiglu_rows(ctx, {.gu = buf.gu32, .out = buf.act16, .rows = b, .n = ffn, .overlap = overlap}));
  return cuda::gemm(ctx, {.a = buf.act16, .b = w.down_w, .c = buf.h, .m = b, .n = hidden, .k = ffn, .trans_b = true,
                          .c_dtype = DType::F32, .beta = 1.0f});
}

Status CudaCausalLmImpl::decode_layer(int l, int b) {
  using cuda::GemvEpilogue;
  if (decode_gemms(l, b)) return decode_layer_gemms(l, b);
  const LayerWeights& w = layers[l];
  const CudaDecodeShapes& grids = decode_grids(b);
  const cuda::GemvArgs o = with_grid({.x = buf.attn, .w = w.o_w, .bias = w.o_b, .out = buf.h, .rows = b, .n = hidden,
                                      .k = q_dim, .epilogue = GemvEpilogue::kAddF32},
                                     grids.o);
  const cuda::GemvArgs gu = with_grid({.w = w.gu_w, .bias = w.gu_b, .out = buf.act, .rows = b, .n = ffn, .k = hidden,
                                       .epilogue = GemvEpilogue::kSwigluF32},
                                      grids.gate_up);
  const cuda::GemvArgs down = with_grid({.w = w.down_w, .bias = w.down_b, .out = buf.h, .rows = b, .n = hidden,
                                         .k = ffn, .epilogue = GemvEpilogue::kAddF32, .x_f32 = buf.act},
                                        grids.down);
  const cuda::GemvArgs after = l + 1 < n_layer ? qkv_gemv(l + 1, b) : lm_head_gemv(b);
  LATHE_TRY(norm_gemv(w.attn_norm, prefetching(qkv_gemv(l, b), o, &CudaL2PrefetchUnits::qkv)));
  if (w.q_norm)
    LATHE_TRY(cuda::rope_append(ctx, {.qkv = buf.qkv32, .q_out = buf.q, .k_caches = k_ptrs(l), .v_caches = v_ptrs(l),
                                      .pos = buf.positions, .cos = buf.cos, .sin = buf.sin, .q_norm = w.q_norm,
                                      .k_norm = w.k_norm, .n_seqs = b, .n_head = cfg.num_attention_heads,
                                      .n_head_kv = cfg.num_key_value_heads, .head_dim = static_cast<int>(hd),
                                      .max_ctx = opts.max_seq, .eps = cfg.rms_norm_eps, .overlap = overlap}));
  LATHE_TRY(decode_attention(l, b));
  LATHE_TRY(cuda::gemv(ctx, prefetching(o, gu, &CudaL2PrefetchUnits::o)));
  LATHE_TRY(norm_gemv(w.mlp_norm, prefetching(gu, down, &CudaL2PrefetchUnits::gate_up)));
  return cuda::gemv(ctx, prefetching(down, after, &CudaL2PrefetchUnits::down));
}

// One decode step for sequences 0..b−1 whose ids and positions are on the device.
Status CudaCausalLmImpl::decode_step(int b, const cuda::GemvPick* pick) {
  LATHE_TRY(cuda::decode_inputs(
      ctx, {.embedding = {.tokens = buf.tokens, .table = embed, .out = buf.h, .n = b, .vocab = vocab, .dim = hidden,
                          .seen = buf.seen, .seen_stride = seen_words},
            .rope = {.inv_freq = inv_freq_dev, .positions = buf.positions, .cos = buf.cos, .sin = buf.sin,
                     .n_tokens = b, .half = half},
            .overlap = overlap}));
  for (int l = 0; l < n_layer; ++l) LATHE_TRY(decode_layer(l, b));
  if (decode_gemms(-1, b)) {  // no pick fuses into cuBLASLt's LM head (fused_pick says so)
    if (pick) return error(StatusCode::kInternal, "cuda decode: a pick fused into the LM head through cuBLASLt");
    LATHE_TRY(cuda::residual_norm(ctx, {.h = buf.h, .w = final_norm, .y = buf.normed, .rows = b, .dim = hidden,
                                        .eps = cfg.rms_norm_eps, .overlap = overlap}));
    return cuda::gemm(ctx, {.a = buf.normed, .b = lm_head, .c = buf.logits, .m = b, .n = vocab, .k = hidden,
                            .trans_b = true, .c_dtype = DType::F32});
  }
  // The LM head pulls layer 0's q|k|v into L2 for the next step.
  cuda::GemvArgs head = prefetching(lm_head_gemv(b), qkv_gemv(0, b), &CudaL2PrefetchUnits::lm_head);
  if (pick) head.pick = *pick;
  return norm_gemv(final_norm, head);
}

Status CudaCausalLmImpl::check_tokens(int seq, std::span<const int32_t> tokens) const {
  if (tokens.empty()) return invalid_argument("cuda forward: no tokens");
  if (seq < 0 || seq >= opts.max_batch)
    return invalid_argument("cuda forward: sequence ", seq, " is outside [0, ", opts.max_batch, ") (max_batch)");
  if (seq_len[seq] + int64_t(tokens.size()) > opts.max_seq)
    return invalid_argument("cuda forward: ", tokens.size(), " tokens at position ", seq_len[seq],
                            " overflow the KV cache of ", opts.max_seq, " tokens (max_seq)");
  for (int32_t id : tokens)
    if (id < 0 || id >= vocab)
      return invalid_argument("cuda forward: token id ", id, " is outside the vocabulary [0, ", vocab, ")");
  return Status::ok();
}

// tokens and position(i) for each into buf.tokens / buf.positions in one copy.
Status CudaCausalLmImpl::upload_step(std::span<const int32_t> tokens, const std::function<int32_t(int64_t)>& position) {
  const size_t r = host_step.size() / 2, n = tokens.size();
  std::copy(tokens.begin(), tokens.end(), host_step.begin());
  for (size_t i = 0; i < n; ++i) host_step[r + i] = position(static_cast<int64_t>(i));
  return cuda::copy_to_device(ctx, buf.tokens, host_step.data(), (r + n) * sizeof(int32_t));
}

// Uploads the ids and each sequence's position, then runs the step: eagerly
// the first time for this B, as a captured graph after (with graphs on).
Status CudaCausalLmImpl::decode(std::span<const int32_t> tokens) {
  end_chain();
  const int b = static_cast<int>(tokens.size());
  for (int s = 0; s < b; ++s) {
    LATHE_TRY(check_tokens(s, tokens.subspan(s, 1)).with_context("decode step, sequence " + std::to_string(s)));
  }
  LATHE_TRY(upload_step(tokens, [&](int64_t i) { return seq_len[i]; }));
  LATHE_TRY(clear_seen_of_empty(b));
  Status st = enqueue_step(b);
  if (!st.is_ok() && overlap) {
    // A driver that refuses programmatic dependent launches (or their capture):
    // the step is idempotent (it rewrites h and the same cache rows), so run it
    // again with ordinary launches and keep them.
    LATHE_LOG(kWarn, "cuda decode: overlapped launches failed (", st.message(), "); using ordinary launches");
    overlap = false;
    drop_graphs();
    st = enqueue_step(b);
  }
  LATHE_TRY(st);
  for (int s = 0; s < b; ++s) ++seq_len[s];
  return Status::ok();
}

Status CudaCausalLmImpl::enqueue_step(int b) {
  if (opts.use_graphs && decoded_eagerly[b]) {
    if (graphs[b].empty()) {
      LATHE_ASSIGN_OR_RETURN(graphs[b], cuda::CudaGraph::capture(ctx, [&] { return decode_step(b); }));
    }
    return graphs[b].launch(ctx);
  }
  LATHE_TRY(decode_step(b));
  decoded_eagerly[b] = true;
  return Status::ok();
}

Status CudaCausalLmImpl::clear_seen_of_empty(int b) {
  for (int s = 0; s < b; ++s)
    if (seq_len[s] == 0) LATHE_TRY(cuda::fill_zero(ctx, buf.seen + s * seen_words, size_t(seen_words) * 4));
  return Status::ok();
}

cuda::GreedyFeed CudaCausalLmImpl::pick_feed(bool fed) const {
  if (!fed) return {};
  return {.tokens = buf.tokens, .positions = buf.positions,
          .host_ring = static_cast<int32_t*>(chain.ring.device_data()), .ring_slots = CudaCausalLM::kDecodeDepth};
}

cuda::GemvPick CudaCausalLmImpl::fused_pick(int b, bool fed, const CudaSampling& sa) const {
  if (sa.temperature > 0.0f || decode_gemms(-1, b) || !cuda::gemv_fuses_pick(lm_head_gemv(b), opts.device)) return {};
  return {.next = buf.next_token, .feed = pick_feed(fed),
          .penalty = {.seen = buf.seen, .stride = seen_words, .penalty = sa.repetition_penalty},
          .slots = buf.pick_slots, .count = buf.pick_count};
}

Status CudaCausalLmImpl::enqueue_pick(int b, bool fed, const CudaSampling& sa, int64_t salt) {
  const cuda::SeenPenalty pen{.seen = buf.seen, .stride = seen_words, .penalty = sa.repetition_penalty};
  const cuda::GreedyFeed feed = pick_feed(fed);
  if (sa.temperature > 0.0f) {
    return cuda::sample_pick(ctx, {.logits = buf.logits, .next = buf.next_token, .rows = b, .vocab = vocab,
                                   .inv_temperature = 1.0f / sa.temperature, .top_k = sa.top_k, .top_p = sa.top_p,
                                   .min_p = sa.min_p, .seed = sa.seed, .salt = salt, .feed = feed,
                                   .overlap = overlap, .penalty = pen});
  }
  return cuda::greedy_pick(ctx, {.logits = buf.logits, .next = buf.next_token, .rows = b, .vocab = vocab, .feed = feed,
                                 .overlap = overlap, .penalty = pen});
}

// As enqueue_step(), with the pick feeding the next step in the same graph.
Status CudaCausalLmImpl::enqueue_chain_step() {
  const int b = chain.b;
  // A greedy pick runs in the LM head's last block where it can (the pick
  // kernel and its launch saved).
  auto step_and_pick = [&]() -> Status {
    const cuda::GemvPick pick = fused_pick(b, /*fed=*/true, chain.sampling);
    LATHE_TRY(decode_step(b, pick.next ? &pick : nullptr));
    return pick.next ? Status::ok() : enqueue_pick(b, /*fed=*/true, chain.sampling);
  };
  auto step = [&]() -> Status {
    if (opts.use_graphs && decoded_eagerly[b]) {
      if (chain.graphs[b].empty()) {
        LATHE_ASSIGN_OR_RETURN(chain.graphs[b], cuda::CudaGraph::capture(ctx, step_and_pick));
      }
      return chain.graphs[b].launch(ctx);
    }
    LATHE_TRY(step_and_pick());
    decoded_eagerly[b] = true;
    return Status::ok();
  };
  Status st = step();
  if (!st.is_ok() && overlap && chain.issued == chain.taken) {
    // As decode(): nothing queued is lost, and the step's input changes only at its pick.
    LATHE_LOG(kWarn, "cuda decode: overlapped launches failed (", st.message(), "); using ordinary launches");
    overlap = false;
    drop_graphs();
    st = step();
  }
  LATHE_TRY(st);
  LATHE_TRY(chain.done[size_t(chain.issued % CudaCausalLM::kDecodeDepth)].record(ctx));
  ++chain.issued;
  return Status::ok();
}

void CudaCausalLmImpl::drop_graphs() {
  for (cuda::CudaGraph& g : graphs) g = cuda::CudaGraph();
  for (cuda::CudaGraph& g : chain.graphs) g = cuda::CudaGraph();
}

void CudaCausalLmImpl::end_chain() {
  if (!chain.active) return;
  chain.active = false;
  if (chain.issued > chain.taken) (void)ctx.synchronize();  // a failed step reports on the next call's own sync
}

// Appends tokens to sequence seq: one token of sequence 0 wanting its logits
// is a decode step; anything else prefill passes of max_tokens at most, the
// last yielding logit_rows rows of logits (1, or all of its tokens).
Status CudaCausalLmImpl::run(int seq, std::span<const int32_t> tokens, int64_t logit_rows) {
  end_chain();
  LATHE_TRY(check_tokens(seq, tokens));
  if (seq == 0 && tokens.size() == 1 && logit_rows == 1 && decode_gemv) return decode(tokens);
  for (size_t start = 0; start < tokens.size(); start += static_cast<size_t>(max_tokens)) {
    const auto chunk = tokens.subspan(start, std::min(tokens.size() - start, static_cast<size_t>(max_tokens)));
    const int64_t n = static_cast<int64_t>(chunk.size());
    const bool last = start + chunk.size() == tokens.size();
    const int pos0 = seq_len[seq];
    LATHE_TRY(upload_step(chunk, [&](int64_t i) { return pos0 + static_cast<int32_t>(i); }));
    LATHE_TRY(pass(n, seq, pos0, last ? logit_rows : 0));
    seq_len[seq] += static_cast<int>(n);
  }
  return Status::ok();
}

// ---- CudaCausalLM ----------------------------------------------------------------

CudaCausalLM::CudaCausalLM(std::unique_ptr<CudaCausalLmImpl> impl) : impl_(std::move(impl)) {}
CudaCausalLM::~CudaCausalLM() = default;

Result<std::unique_ptr<CudaCausalLM>> CudaCausalLM::load(const std::string& dir, const CudaModelOptions& opts) {
  LATHE_ASSIGN_OR_RETURN(ModelHeader header, load_model_header(dir));
  auto impl = std::make_unique<CudaCausalLmImpl>();
  LATHE_TRY(impl->init(header, opts).with_context("load " + dir));
  LATHE_ASSIGN_OR_RETURN(WeightStore store, WeightStore::open_dir(dir));
  LATHE_ASSIGN_OR_RETURN(WeightLoader wl,
                         WeightLoader::open(store, opts.adapter_dir, header.cfg.num_hidden_layers, true));
  LATHE_TRY(impl->upload_weights(wl, dir));
  return std::unique_ptr<CudaCausalLM>(new CudaCausalLM(std::move(impl)));
}

Result<std::unique_ptr<CudaCausalLM>> CudaCausalLM::random(const ModelHeader& header, const CudaModelOptions& opts,
                                                           uint64_t seed, float init_range) {
  if (!opts.adapter_dir.empty()) return invalid_argument("cuda model: a random model takes no adapter");
  auto impl = std::make_unique<CudaCausalLmImpl>();
  LATHE_TRY(impl->init(header, opts));
  LATHE_TRY(impl->random_weights(seed, init_range));
  return std::unique_ptr<CudaCausalLM>(new CudaCausalLM(std::move(impl)));
}

const ModelConfig& CudaCausalLM::config() const { return impl_->cfg; }
int64_t CudaCausalLM::n_params() const { return impl_->n_params; }
size_t CudaCausalLM::device_bytes() const {
  return impl_->weight_arena.capacity() + impl_->state_arena.capacity();
}
int CudaCausalLM::n_tokens(int seq) const {
  return seq >= 0 && seq < impl_->opts.max_batch ? impl_->seq_len[seq] : 0;
}
int CudaCausalLM::max_seq() const { return impl_->opts.max_seq; }
int CudaCausalLM::max_batch() const { return impl_->opts.max_batch; }
void CudaCausalLM::clear() {
  impl_->end_chain();
  std::fill(impl_->seq_len.begin(), impl_->seq_len.end(), 0);
}
void CudaCausalLM::clear(int seq) {
  impl_->end_chain();
  if (seq >= 0 && seq < impl_->opts.max_batch) impl_->seq_len[seq] = 0;
}
void CudaCausalLM::set_use_graphs(bool on) {
  impl_->end_chain();
  impl_->opts.use_graphs = on;
  if (!on) impl_->drop_graphs();
}
void CudaCausalLM::set_persistent_gemv(bool on) {
  impl_->end_chain();
  impl_->opts.persistent_gemv = on;
  impl_->drop_graphs();
}
void CudaCausalLM::set_decode_gemvs(const CudaModelOptions& d) {
  CudaModelOptions& o = impl_->opts;
  o.register_gemv = d.register_gemv, o.bulk_gemv = d.bulk_gemv, o.bulk_ring_kib = d.bulk_ring_kib;
  o.bulk_per_sm = d.bulk_per_sm, o.attention_min_chunk = d.attention_min_chunk;
  o.split_k_attention = d.split_k_attention, o.attention_cluster_heads = d.attention_cluster_heads;
  o.l2_prefetch_units = d.l2_prefetch_units, o.l2_prefetch_each = d.l2_prefetch_each;
  o.ring_max_carveout = d.ring_max_carveout, o.ring_fill_at_once = d.ring_fill_at_once;
  o.ring_in_flight = d.ring_in_flight, o.cublas_decode_rows = d.cublas_decode_rows;
  set_persistent_gemv(impl_->opts.persistent_gemv);  // drops the graphs
}

Status CudaCausalLM::forward(std::span<const int32_t> tokens, std::span<float> logits, bool all_logits) {
  return forward_seq(0, tokens, logits, all_logits);
}

Status CudaCausalLM::forward_seq(int seq, std::span<const int32_t> tokens, std::span<float> logits, bool all_logits) {
  CudaCausalLmImpl& m = *impl_;
  const int64_t rows = all_logits ? static_cast<int64_t>(tokens.size()) : 1;
  if (all_logits && (rows > m.opts.max_logit_rows || rows > m.max_tokens))
    return invalid_argument("cuda forward: all_logits over ", rows, " tokens, but the model was planned for ",
                            std::min<int64_t>(m.opts.max_logit_rows, m.max_tokens), " rows (max_logit_rows)");
  if (static_cast<int64_t>(logits.size()) != rows * m.vocab)
    return invalid_argument("cuda forward: logits hold ", logits.size(), " floats, expected ", rows, " x ", m.vocab);
  LATHE_TRY(m.run(seq, tokens, rows));
  return cuda::copy_to_host(m.ctx, logits.data(), m.buf.logits, logits.size() * sizeof(float));
}

Result<int32_t> CudaCausalLM::forward_greedy(std::span<const int32_t> tokens) { return forward_pick(tokens, {}); }

bool CudaCausalLM::samples_on_device() const {
  return impl_->decode_gemv && impl_->vocab <= 262144 && cuda::supports_overlap(impl_->opts.device);
}

Result<int32_t> CudaCausalLM::forward_pick(std::span<const int32_t> tokens, const CudaSampling& sampling) {
  CudaCausalLmImpl& m = *impl_;
  if ((sampling.temperature > 0.0f || sampling.repetition_penalty != 1.0f) && !samples_on_device())
    return unsupported("cuda forward_pick: drawing tokens or a repetition penalty on the device needs sm_90+ and the "
                       "decode step's shapes");
  LATHE_TRY(m.run(0, tokens, 1));
  LATHE_TRY(m.enqueue_pick(1, /*fed=*/false, sampling, m.seq_len[0] - 1));
  int32_t id = 0;
  LATHE_TRY(cuda::copy_to_host(m.ctx, &id, m.buf.next_token, sizeof(id)));
  return id;
}

// Checks a decode_batch request. Shapes gemv() does not take run one
// one-token prefill pass per sequence instead, `take(s)` collecting row 0 of
// the logits after sequence s's.
static Status check_batch(const CudaCausalLmImpl& m, std::span<const int32_t> tokens) {
  if (tokens.empty()) return invalid_argument("cuda decode_batch: no tokens");
  if (static_cast<int64_t>(tokens.size()) > m.opts.max_batch)
    return invalid_argument("cuda decode_batch: ", tokens.size(), " tokens, but the model holds ", m.opts.max_batch,
                            " sequences (max_batch)");
  for (size_t s = 0; s < tokens.size(); ++s)
    LATHE_TRY(m.check_tokens(static_cast<int>(s), tokens.subspan(s, 1)).with_context("decode_batch"));
  return Status::ok();
}
static Status decode_each(CudaCausalLmImpl& m, std::span<const int32_t> tokens, const std::function<Status(int)>& take) {
  for (size_t s = 0; s < tokens.size(); ++s) {
    LATHE_TRY(m.run(static_cast<int>(s), tokens.subspan(s, 1), 1));
    LATHE_TRY(take(static_cast<int>(s)));
  }
  return Status::ok();
}

Status CudaCausalLM::decode_batch(std::span<const int32_t> tokens, std::span<float> logits) {
  CudaCausalLmImpl& m = *impl_;
  if (static_cast<int64_t>(logits.size()) != static_cast<int64_t>(tokens.size()) * m.vocab)
    return invalid_argument("cuda decode_batch: logits hold ", logits.size(), " floats, expected ", tokens.size(),
                            " x ", m.vocab);
  LATHE_TRY(check_batch(m, tokens));
  const size_t row_bytes = static_cast<size_t>(m.vocab) * sizeof(float);
  if (!m.decode_gemv) {
    return decode_each(m, tokens, [&](int s) {
      return cuda::copy_to_host(m.ctx, logits.data() + int64_t(s) * m.vocab, m.buf.logits, row_bytes);
    });
  }
  LATHE_TRY(m.decode(tokens));
  return cuda::copy_to_host(m.ctx, logits.data(), m.buf.logits, tokens.size() * row_bytes);
}

Status CudaCausalLM::decode_batch_greedy(std::span<const int32_t> tokens, std::span<int32_t> next) {
  CudaCausalLmImpl& m = *impl_;
  if (next.size() != tokens.size())
    return invalid_argument("cuda decode_batch: next holds ", next.size(), " ids, expected ", tokens.size());
  LATHE_TRY(check_batch(m, tokens));
  if (!m.decode_gemv) {
    LATHE_TRY(decode_each(m, tokens, [&](int s) {
      return cuda::greedy_pick(m.ctx,
                               {.logits = m.buf.logits, .next = m.buf.next_token + s, .rows = 1, .vocab = m.vocab});
    }));
  } else {
    LATHE_TRY(m.decode(tokens));
    LATHE_TRY(m.enqueue_pick(static_cast<int>(tokens.size()), /*fed=*/false, {}));
  }
  return cuda::copy_to_host(m.ctx, next.data(), m.buf.next_token, next.size() * sizeof(int32_t));
}

Status CudaCausalLM::start_decode(std::span<const int32_t> tokens, int max_steps, const CudaSampling& sampling) {
  CudaCausalLmImpl& m = *impl_;
  m.end_chain();
  LATHE_TRY(check_batch(m, tokens));
  if (max_steps < 1) return invalid_argument("cuda start_decode: max_steps must be at least 1, got ", max_steps);
  if (!(sampling.temperature >= 0.0f) || sampling.top_k < 0 || !(sampling.top_p > 0.0f && sampling.top_p <= 1.0f) ||
      !(sampling.min_p >= 0.0f && sampling.min_p <= 1.0f) || !(sampling.repetition_penalty > 0.0f) ||
      !std::isfinite(sampling.repetition_penalty))
    return invalid_argument("cuda start_decode: temperature must be >= 0, top_k >= 0, top_p in (0, 1], min_p in "
                            "[0, 1] and repetition_penalty > 0");
  if ((sampling.temperature > 0.0f || sampling.repetition_penalty != 1.0f) && !samples_on_device())
    return unsupported("cuda start_decode: drawing tokens or a repetition penalty on the device needs sm_90+ and the "
                       "decode step's shapes");
  const int b = static_cast<int>(tokens.size());
  for (int s = 0; s < b; ++s)
    if (int64_t(m.seq_len[s]) + max_steps > m.opts.max_seq)
      return invalid_argument("cuda start_decode: ", max_steps, " steps at position ", m.seq_len[s], " of sequence ",
                              s, " overflow the KV cache of ", m.opts.max_seq, " tokens (max_seq)");
  DecodeChain& c = m.chain;
  c.b = b, c.issued = c.taken = 0, c.limit = max_steps;
  c.sampling = sampling;
  if (!(c.captured == sampling)) {  // the picks' options are part of the captured graphs
    for (cuda::CudaGraph& g : c.graphs) g = cuda::CudaGraph();
    c.captured = sampling;
  }
  c.pending.assign(tokens.begin(), tokens.end());
  c.len0.assign(m.seq_len.begin(), m.seq_len.begin() + b);
  if (m.decode_gemv) {
    if (c.ring.size_bytes() == 0) {
      LATHE_ASSIGN_OR_RETURN(c.ring, cuda::PinnedBuffer::alloc(m.opts.device, size_t(m.opts.max_batch) *
                                                                                   kDecodeDepth * sizeof(int32_t)));
      c.graphs.resize(m.graphs.size());
      c.done.clear();
      for (int i = 0; i < kDecodeDepth; ++i) {
        LATHE_ASSIGN_OR_RETURN(cuda::CudaEvent e, cuda::CudaEvent::create());
        c.done.push_back(std::move(e));
      }
    }
    LATHE_TRY(m.upload_step(tokens, [&](int64_t i) { return m.seq_len[i]; }));
    LATHE_TRY(m.clear_seen_of_empty(b));
  }
  c.active = true;
  return Status::ok();
}

Status CudaCausalLM::next_tokens(std::span<int32_t> picks) {
  CudaCausalLmImpl& m = *impl_;
  DecodeChain& c = m.chain;
  if (!c.active) return invalid_argument("cuda next_tokens: no decoding started (start_decode)");
  if (static_cast<int>(picks.size()) != c.b)
    return invalid_argument("cuda next_tokens: picks hold ", picks.size(), " ids, expected ", c.b);
  if (c.taken == c.limit)
    return invalid_argument("cuda next_tokens: all ", c.limit, " steps of this start_decode were taken");
  if (!m.decode_gemv) {  // host-fed: one ordinary greedy step
    c.active = false;
    LATHE_TRY(decode_batch_greedy(c.pending, picks));
    c.pending.assign(picks.begin(), picks.end());
    ++c.taken;
    c.active = true;
    return Status::ok();
  }
  auto fail = [&](Status st) {
    m.end_chain();
    return st;
  };
  while (c.issued < c.limit && c.issued - c.taken < kDecodeDepth) {
    if (Status st = m.enqueue_chain_step(); !st.is_ok()) return fail(st);
  }
  if (Status st = c.done[size_t(c.taken % kDecodeDepth)].synchronize(); !st.is_ok()) return fail(st);
  const auto* ring = static_cast<const int32_t*>(c.ring.data());
  for (int s = 0; s < c.b; ++s) {
    picks[s] = ring[s * kDecodeDepth + (c.len0[s] + c.taken) % kDecodeDepth];
    ++m.seq_len[s];
  }
  ++c.taken;
  return Status::ok();
}

void CudaCausalLM::stop_decode() { impl_->end_chain(); }

}  // namespace lathe
