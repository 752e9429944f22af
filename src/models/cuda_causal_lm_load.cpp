// CudaCausalLM's load (cuda_causal_lm_impl.h): the shapes from the
// header, the two device arenas planned by one layout walked twice (sizes,
// then buffers), and the weights uploaded in bf16 with q|k|v and gate|up
// stacked, or drawn at random for benchmarks.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backends/cuda/attention.h"
#include "core/env.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "models/cuda_causal_lm_impl.h"

namespace lathe {

using cuda_lm::Carver;
using cuda_lm::kFusedNormRows;
using cuda_lm::kMaxBatch;
using cuda_lm::LayerWeights;

namespace {

// tensor (f32, bf16 or f16, on the host) → bf16 at dst on the device.
Status upload_bf16(cuda::CudaContext& ctx, const Tensor& t, bf16_bits* dst) {
  Tensor b = t.dtype() == DType::BF16 ? t : t.to(DType::BF16);
  return cuda::copy_to_device(ctx, dst, b.raw(), static_cast<size_t>(b.numel()) * sizeof(bf16_bits));
}

}  // namespace

Status CudaCausalLmImpl::init(const ModelHeader& header, const CudaModelOptions& options) {
  cfg = header.cfg;
  quirks = header.quirks;
  inv_freq = header.inv_freq;
  opts = options;
  const int n_dev = cuda::device_count();
  if (!cuda::built_with_cuda()) return unsupported("cuda: this build of lathe has no CUDA backend");
  if (n_dev == 0) return unsupported("cuda: no CUDA device is visible");
  if (opts.device < 0 || opts.device >= n_dev)
    return invalid_argument("cuda: device ", opts.device, " does not exist (", n_dev, " visible)");
  if (opts.max_seq <= 0) return invalid_argument("cuda model: max_seq must be positive, got ", opts.max_seq);
  if (cfg.max_position_embeddings > 0 && opts.max_seq > cfg.max_position_embeddings)
    return invalid_argument("cuda model: max_seq ", opts.max_seq, " exceeds max_position_embeddings ",
                            cfg.max_position_embeddings);
  if (opts.max_logit_rows <= 0) return invalid_argument("cuda model: max_logit_rows must be positive");
  if (opts.max_batch < 1 || opts.max_batch > kMaxBatch)
    return invalid_argument("cuda model: max_batch ", opts.max_batch, " is outside [1, ", kMaxBatch, "]");
  hidden = cfg.hidden_size;
  hd = cfg.head_dim;
  half = hd / 2;
  q_dim = int64_t(cfg.num_attention_heads) * hd;
  kv_dim = int64_t(cfg.num_key_value_heads) * hd;
  qkv_dim = q_dim + 2 * kv_dim;
  ffn = cfg.intermediate_size;
  vocab = cfg.vocab_size;
  n_layer = cfg.num_hidden_layers;
  if (hd % 2 != 0 || hd > 256)
    return unsupported("cuda model: head_dim ", hd, " is not supported (even sizes up to 256 are)");
  if (cfg.num_attention_heads % cfg.num_key_value_heads != 0)
    return invalid_argument("cuda model: num_attention_heads ", cfg.num_attention_heads,
                            " is not a multiple of num_key_value_heads ", cfg.num_key_value_heads);
  flash = !opts.simple_attention && (hd == 64 || hd == 128);
  max_tokens = opts.max_forward_tokens > 0 ? std::min(opts.max_forward_tokens, opts.max_seq) : opts.max_seq;
  max_tokens = std::max(max_tokens, std::min(opts.max_logit_rows, opts.max_seq));
  decode_gemv = hidden % 8 == 0 && q_dim % 8 == 0 && ffn % 8 == 0;
  ptr_slots = (opts.max_batch + 1) / 2 * 2;
  seq_len.assign(static_cast<size_t>(opts.max_batch), 0);
  decoded_eagerly.assign(static_cast<size_t>(opts.max_batch) + 1, false);
  graphs.resize(static_cast<size_t>(opts.max_batch) + 1);
  host_step.resize(2 * static_cast<size_t>(std::max(max_tokens, opts.max_batch)));
  LATHE_ASSIGN_OR_RETURN(ctx, cuda::CudaContext::create(opts.device));
  overlap = opts.overlap_launches && cuda::supports_overlap(opts.device);
  LATHE_ASSIGN_OR_RETURN(const std::vector<int64_t> env_units, env::cuda_decode_l2_prefetch());
  env_l2_prefetch = {static_cast<int>(env_units[0]), static_cast<int>(env_units[1]), static_cast<int>(env_units[2]),
                     static_cast<int>(env_units[3]), static_cast<int>(env_units[4])};
  LATHE_ASSIGN_OR_RETURN(const int64_t env_lag, env::cuda_decode_l2_prefetch_lag());
  env_l2_prefetch_lag = static_cast<int>(env_lag);
  return allocate();
}

Status CudaCausalLmImpl::lay_out_weights(Carver& c) {
  auto take = [&](int64_t n, const char* what) { return c.take<bf16_bits>(n, what); };
  layers.assign(static_cast<size_t>(n_layer), LayerWeights{});
  LATHE_ASSIGN_OR_RETURN(embed, take(vocab * hidden, "embed_tokens"));
  for (LayerWeights& w : layers) {
    LATHE_ASSIGN_OR_RETURN(w.qkv_w, take(qkv_dim * hidden, "qkv_proj"));
    LATHE_ASSIGN_OR_RETURN(w.o_w, take(hidden * q_dim, "o_proj"));
    LATHE_ASSIGN_OR_RETURN(w.gu_w, take(2 * ffn * hidden, "gate_up_proj"));
    LATHE_ASSIGN_OR_RETURN(w.down_w, take(hidden * ffn, "down_proj"));
    LATHE_ASSIGN_OR_RETURN(w.attn_norm, take(hidden, "input_layernorm"));
    LATHE_ASSIGN_OR_RETURN(w.mlp_norm, take(hidden, "post_attention_layernorm"));
    if (quirks.qkv_bias) {
      LATHE_ASSIGN_OR_RETURN(w.qkv_b, take(qkv_dim, "qkv bias"));
    }
    if (quirks.o_bias) {
      LATHE_ASSIGN_OR_RETURN(w.o_b, take(hidden, "o_proj bias"));
    }
    if (quirks.mlp_bias) {
      LATHE_ASSIGN_OR_RETURN(w.gu_b, take(2 * ffn, "gate_up bias"));
      LATHE_ASSIGN_OR_RETURN(w.down_b, take(hidden, "down_proj bias"));
    }
    if (quirks.qk_norm) {
      LATHE_ASSIGN_OR_RETURN(w.q_norm, take(hd, "q_norm"));
      LATHE_ASSIGN_OR_RETURN(w.k_norm, take(hd, "k_norm"));
    }
  }
  LATHE_ASSIGN_OR_RETURN(final_norm, take(hidden, "norm"));
  if (quirks.tied_embeddings) {
    lm_head = embed;
  } else {
    LATHE_ASSIGN_OR_RETURN(lm_head, take(vocab * hidden, "lm_head"));
  }
  LATHE_ASSIGN_OR_RETURN(inv_freq_dev, c.take<float>(half, "inv_freq"));
  return Status::ok();
}

Status CudaCausalLmImpl::lay_out_state(Carver& c) {
  const int64_t t = std::max(max_tokens, opts.max_batch), nb = opts.max_batch;
  const int64_t kv_rows = nb * opts.max_seq * kv_dim;
  k_cache.assign(static_cast<size_t>(n_layer), nullptr);
  v_cache.assign(static_cast<size_t>(n_layer), nullptr);
  for (int l = 0; l < n_layer; ++l) {
    LATHE_ASSIGN_OR_RETURN(k_cache[l], c.take<bf16_bits>(kv_rows, "k cache"));
    LATHE_ASSIGN_OR_RETURN(v_cache[l], c.take<bf16_bits>(kv_rows, "v cache"));
  }
  LATHE_ASSIGN_OR_RETURN(buf.tokens, c.take<int32_t>(2 * t, "tokens and positions"));
  buf.positions = buf.tokens ? buf.tokens + t : nullptr;
  LATHE_ASSIGN_OR_RETURN(buf.cos, c.take<float>(t * half, "rope cos"));
  LATHE_ASSIGN_OR_RETURN(buf.sin, c.take<float>(t * half, "rope sin"));
  LATHE_ASSIGN_OR_RETURN(buf.h, c.take<float>(t * hidden, "residual"));
  LATHE_ASSIGN_OR_RETURN(buf.delta, c.take<float>(t * hidden, "delta"));
  LATHE_ASSIGN_OR_RETURN(buf.normed, c.take<bf16_bits>(t * hidden, "normed"));
  LATHE_ASSIGN_OR_RETURN(buf.qkv, c.take<bf16_bits>(t * qkv_dim, "qkv"));
  LATHE_ASSIGN_OR_RETURN(buf.q, c.take<bf16_bits>(nb * q_dim, "decode q"));
  LATHE_ASSIGN_OR_RETURN(buf.attn, c.take<bf16_bits>(t * q_dim, "attention out"));
  LATHE_ASSIGN_OR_RETURN(buf.gu, c.take<bf16_bits>(t * 2 * ffn, "gate_up"));
  LATHE_ASSIGN_OR_RETURN(buf.act, c.take<float>(nb * ffn, "decode swiglu out"));
  LATHE_ASSIGN_OR_RETURN(buf.qkv32, c.take<float>(nb * qkv_dim, "decode qkv f32"));
  const int64_t logit_rows = std::max<int64_t>(opts.max_logit_rows, nb);
  LATHE_ASSIGN_OR_RETURN(buf.logits, c.take<float>(logit_rows * vocab, "logits"));
  const size_t ws = cuda::attention_decode_workspace_bytes(opts.max_batch, cfg.num_attention_heads, static_cast<int>(hd));
  LATHE_ASSIGN_OR_RETURN(buf.attn_workspace, c.take<char>(static_cast<int64_t>(std::max<size_t>(ws, 16)), "attention workspace"));
  LATHE_ASSIGN_OR_RETURN(buf.next_token, c.take<int32_t>(nb, "next tokens"));
  seen_words = (vocab + 31) / 32;
  LATHE_ASSIGN_OR_RETURN(buf.seen, c.take<uint32_t>(nb * seen_words, "tokens seen"));
  LATHE_ASSIGN_OR_RETURN(buf.pick_slots, c.take<cuda::GemvPickSlot>(cuda::kGemvPickSlots, "pick slots"));
  LATHE_ASSIGN_OR_RETURN(buf.pick_count, c.take<unsigned>(1, "pick count"));
  LATHE_ASSIGN_OR_RETURN(buf.cache_ptrs, c.take<bf16_bits*>(2 * int64_t(ptr_slots) * n_layer, "cache pointers"));
  if (nb >= 2) {  // what a step through cuBLASLt needs (cublas_decode_rows; the bench switches it after load)
    LATHE_ASSIGN_OR_RETURN(buf.gu32, c.take<float>(nb * 2 * ffn, "decode gate_up f32"));
    LATHE_ASSIGN_OR_RETURN(buf.act16, c.take<bf16_bits>(nb * ffn, "decode swiglu out bf16"));
  }
  if (opts.max_batch > kFusedNormRows) {
    LATHE_ASSIGN_OR_RETURN(buf.split.counts, c.take<int>(cuda::kGemvSplitCounts, "decode split counts"));
    LATHE_ASSIGN_OR_RETURN(buf.split.part, c.take<float>(cuda::kGemvSplitFloats, "decode split sums"));
    buf.split.count_capacity = cuda::kGemvSplitCounts, buf.split.part_capacity = cuda::kGemvSplitFloats;
  }
  return Status::ok();
}

Status CudaCausalLmImpl::allocate() {
  Carver wplan(nullptr), splan(nullptr);
  LATHE_TRY(lay_out_weights(wplan));
  LATHE_TRY(lay_out_state(splan));
  LATHE_ASSIGN_OR_RETURN(weight_arena, cuda::DeviceArena::create(opts.device, wplan.planned_bytes()));
  LATHE_ASSIGN_OR_RETURN(state_arena, cuda::DeviceArena::create(opts.device, splan.planned_bytes()));
  Carver wc(&weight_arena), sc(&state_arena);
  LATHE_TRY(lay_out_weights(wc));
  LATHE_TRY(lay_out_state(sc));
  LATHE_TRY(cuda::fill_zero(ctx, state_arena.base(), state_arena.capacity()));
  std::vector<bf16_bits*> ptrs(2 * static_cast<size_t>(ptr_slots) * n_layer, nullptr);
  for (int l = 0; l < n_layer; ++l) {
    for (int s = 0; s < opts.max_batch; ++s) {
      ptrs[size_t(2 * ptr_slots) * l + s] = k_at(l, s);
      ptrs[size_t(2 * ptr_slots) * l + ptr_slots + s] = v_at(l, s);
    }
  }
  LATHE_TRY(cuda::copy_to_device(ctx, buf.cache_ptrs, ptrs.data(), ptrs.size() * sizeof(void*)));
  return cuda::copy_to_device(ctx, inv_freq_dev, inv_freq.data(), inv_freq.size() * sizeof(float));
}

Status CudaCausalLmImpl::upload_layer(WeightLoader& wl, int i) {
  const LayerWeights& w = layers[i];
  auto linear = [&](const char* leaf, int64_t out, int64_t in, bf16_bits* dst) -> Status {
    LATHE_ASSIGN_OR_RETURN(Tensor t, wl.linear_weight(names::layer(i, leaf), out, in));
    return upload_bf16(ctx, t, dst);
  };
  auto vec = [&](const std::string& name, int64_t n, bf16_bits* dst) -> Status {
    LATHE_ASSIGN_OR_RETURN(Tensor t, wl.get(name, {n}));
    return upload_bf16(ctx, t, dst);
  };
  LATHE_TRY(linear("self_attn.q_proj", q_dim, hidden, w.qkv_w));
  LATHE_TRY(linear("self_attn.k_proj", kv_dim, hidden, w.qkv_w + q_dim * hidden));
  LATHE_TRY(linear("self_attn.v_proj", kv_dim, hidden, w.qkv_w + (q_dim + kv_dim) * hidden));
  LATHE_TRY(linear("self_attn.o_proj", hidden, q_dim, w.o_w));
  LATHE_TRY(linear("mlp.gate_proj", ffn, hidden, w.gu_w));
  LATHE_TRY(linear("mlp.up_proj", ffn, hidden, w.gu_w + ffn * hidden));
  LATHE_TRY(linear("mlp.down_proj", hidden, ffn, w.down_w));
  LATHE_TRY(vec(names::layer(i, "input_layernorm.weight"), hidden, w.attn_norm));
  LATHE_TRY(vec(names::layer(i, "post_attention_layernorm.weight"), hidden, w.mlp_norm));
  if (w.qkv_b) {
    LATHE_TRY(vec(names::layer(i, "self_attn.q_proj.bias"), q_dim, w.qkv_b));
    LATHE_TRY(vec(names::layer(i, "self_attn.k_proj.bias"), kv_dim, w.qkv_b + q_dim));
    LATHE_TRY(vec(names::layer(i, "self_attn.v_proj.bias"), kv_dim, w.qkv_b + q_dim + kv_dim));
  }
  if (w.o_b) LATHE_TRY(vec(names::layer(i, "self_attn.o_proj.bias"), hidden, w.o_b));
  if (w.gu_b) {
    LATHE_TRY(vec(names::layer(i, "mlp.gate_proj.bias"), ffn, w.gu_b));
    LATHE_TRY(vec(names::layer(i, "mlp.up_proj.bias"), ffn, w.gu_b + ffn));
    LATHE_TRY(vec(names::layer(i, "mlp.down_proj.bias"), hidden, w.down_b));
  }
  if (w.q_norm) {
    LATHE_TRY(vec(names::layer(i, "self_attn.q_norm.weight"), hd, w.q_norm));
    LATHE_TRY(vec(names::layer(i, "self_attn.k_norm.weight"), hd, w.k_norm));
  }
  return Status::ok();
}

Status CudaCausalLmImpl::upload_weights(WeightLoader& wl, const std::string& dir) {
  LATHE_ASSIGN_OR_RETURN(Tensor e, wl.get(names::kEmbed, {vocab, hidden}));
  LATHE_TRY(upload_bf16(ctx, e, embed));
  for (int i = 0; i < n_layer; ++i) LATHE_TRY(upload_layer(wl, i));
  LATHE_ASSIGN_OR_RETURN(Tensor fn, wl.get(names::kFinalNorm, {hidden}));
  LATHE_TRY(upload_bf16(ctx, fn, final_norm));
  if (!quirks.tied_embeddings) {
    LATHE_ASSIGN_OR_RETURN(Tensor head, wl.get(names::kLmHead, {vocab, hidden}));
    LATHE_TRY(upload_bf16(ctx, head, lm_head));
  }
  n_params = wl.n_params();
  return ctx.synchronize().with_context(dir);
}

Status CudaCausalLmImpl::random_weights(uint64_t seed, float init_range) {
  uint64_t stream = seed * 1000003;
  auto normal = [&](bf16_bits* p, int64_t n) {
    n_params += n;
    return cuda::fill_random_bf16(ctx, p, n, ++stream, 0.0f, init_range);
  };
  auto ones = [&](bf16_bits* p, int64_t n) {
    n_params += n;
    return cuda::fill_random_bf16(ctx, p, n, 0, 1.0f, 0.0f);
  };
  auto zeros = [&](bf16_bits* p, int64_t n) {
    n_params += n;
    return cuda::fill_zero(ctx, p, static_cast<size_t>(n) * sizeof(bf16_bits));
  };
  LATHE_TRY(normal(embed, vocab * hidden));
  for (const LayerWeights& w : layers) {
    LATHE_TRY(normal(w.qkv_w, qkv_dim * hidden));
    LATHE_TRY(normal(w.o_w, hidden * q_dim));
    LATHE_TRY(normal(w.gu_w, 2 * ffn * hidden));
    LATHE_TRY(normal(w.down_w, hidden * ffn));
    LATHE_TRY(ones(w.attn_norm, hidden));
    LATHE_TRY(ones(w.mlp_norm, hidden));
    if (w.qkv_b) LATHE_TRY(zeros(w.qkv_b, qkv_dim));
    if (w.o_b) LATHE_TRY(zeros(w.o_b, hidden));
    if (w.gu_b) LATHE_TRY(zeros(w.gu_b, 2 * ffn));
    if (w.down_b) LATHE_TRY(zeros(w.down_b, hidden));
    if (w.q_norm) LATHE_TRY(ones(w.q_norm, hd));
    if (w.k_norm) LATHE_TRY(ones(w.k_norm, hd));
  }
  LATHE_TRY(ones(final_norm, hidden));
  if (lm_head != embed) LATHE_TRY(normal(lm_head, vocab * hidden));
  return ctx.synchronize();
}

}  // namespace lathe
