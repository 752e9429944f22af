// CudaCausalLM's persistent decode step (CudaModelOptions::persistent_decode):
// the embedding and the RoPE tables as before, then one kernel
// (decode_persistent.h) for every layer and the LM head. Its stage list is
// the GemvArgs the ordinary step gives gemv() (decode_layer), built once
// and uploaded before the first persistent step (decode() prepares it
// before a graph may capture the step); the step's rows travel as a kernel
// argument, so one list serves every batch size.
#include <cmath>

#include "models/cuda_causal_lm_impl.h"

namespace lathe {

using cuda_lm::kFusedNormRows;

bool CudaCausalLmImpl::persistent_step(int b) const {
  return opts.persistent_decode && b <= kFusedNormRows && flash && !layers.empty() && !layers[0].q_norm &&
         cuda::decode_persistent_supported(opts.device, static_cast<int>(hd));
}

bool CudaCausalLM::runs_persistent_decode(int batch) const {
  return batch >= 1 && batch <= impl_->opts.max_batch && impl_->decode_gemv && impl_->persistent_step(batch);
}

Status CudaCausalLmImpl::prepare_persistent(int b) {
  using cuda::GemvEpilogue;
  if (persist_host.empty()) {
    const float eps = cfg.rms_norm_eps;
    std::vector<cuda::GemvArgs> list;
    for (int l = 0; l < n_layer; ++l) {
      const cuda_lm::LayerWeights& w = layers[l];
      cuda::GemvArgs qkv{.w = w.qkv_w, .bias = w.qkv_b, .rows = b, .n = qkv_dim, .k = hidden,
                         .epilogue = GemvEpilogue::kRopeAppend, .x_f32 = buf.h, .norm_w = w.attn_norm, .eps = eps};
      qkv.rope = {.q_out = buf.q, .k_caches = k_ptrs(l), .v_caches = v_ptrs(l), .pos = buf.positions,
                  .cos = buf.cos, .sin = buf.sin, .n_head = cfg.num_attention_heads,
                  .n_head_kv = cfg.num_key_value_heads, .head_dim = static_cast<int>(hd), .max_ctx = opts.max_seq};
      list.push_back(qkv);
      list.push_back({.x = buf.attn, .w = w.o_w, .bias = w.o_b, .out = buf.h, .rows = b, .n = hidden, .k = q_dim,
                      .epilogue = GemvEpilogue::kAddF32});
      list.push_back({.w = w.gu_w, .bias = w.gu_b, .out = buf.act, .rows = b, .n = ffn, .k = hidden,
                      .epilogue = GemvEpilogue::kSwigluF32, .x_f32 = buf.h, .norm_w = w.mlp_norm, .eps = eps});
      list.push_back({.w = w.down_w, .bias = w.down_b, .out = buf.h, .rows = b, .n = hidden, .k = ffn,
                      .epilogue = GemvEpilogue::kAddF32, .x_f32 = buf.act});
    }
    list.push_back({.w = lm_head, .out = buf.logits, .rows = b, .n = vocab, .k = hidden,
                    .epilogue = GemvEpilogue::kStoreF32, .x_f32 = buf.h, .norm_w = final_norm, .eps = eps});
    LATHE_TRY(cuda::copy_to_device(ctx, buf.persist_gemvs, list.data(), list.size() * sizeof(cuda::GemvArgs)));
    persist_host = std::move(list);  // kept: the copy reads it asynchronously, and the checks below
  }
  return cuda::decode_persistent_prepare(opts.device, static_cast<int>(hd), b, opts.bulk_ring_kib);
}

Status CudaCausalLmImpl::decode_step_persistent(int b) {
  LATHE_TRY(cuda::embedding_f32(ctx, {.tokens = buf.tokens, .table = embed, .out = buf.h, .n = b, .vocab = vocab,
                                      .dim = hidden}));
  LATHE_TRY(cuda::rope_tables(ctx, {.inv_freq = inv_freq_dev, .positions = buf.positions, .cos = buf.cos,
                                    .sin = buf.sin, .n_tokens = b, .half = half}));
  return cuda::decode_persistent(ctx,
                                 {.gemvs = buf.persist_gemvs, .n_layer = n_layer, .rows = b, .attn_out = buf.attn,
                                  .workspace = static_cast<float*>(buf.attn_workspace),
                                  .barrier = buf.persist_barrier, .window = quirks.sliding_window,
                                  .scale = 1.0f / std::sqrt(static_cast<float>(hd)), .ring_kib = opts.bulk_ring_kib,
                                  .min_keys = opts.attention_min_chunk, .l2_ahead = opts.decode_l2_ahead,
                                  .overlap = overlap},
                                 persist_host.data());
}

}  // namespace lathe
