// CudaCausalLM: the forward pass of causal_lm.cpp on the GPU in bf16 with
// f32 accumulation, shaped for generation:
//   h = embed(tokens)
//   per layer: x = norm(h); q,k,v = x·Wqkvᵀ (+b); q/k norm; RoPE; cache ← k,v;
//              h += attn(q, cache)·Woᵀ; x = norm(h); h += (silu(x·Wgᵀ)·(x·Wuᵀ))·Wdᵀ
//   logits = norm(h)·Wheadᵀ (f32)
// The residual stream h is f32: every add into it and every norm of it is
// done in f32 (rounding h to bf16 after each add is the largest error of a
// bf16 forward), the projections that feed it write f32, and the logits are
// never rounded. A decode step of up to 4 sequences rounds only what is
// stored: the normed input of a projection, q/k until after RoPE, gate/up
// and the SwiGLU output stay f32 into the next kernel, and q, k, v are
// rounded once for the attention and the cache. (Prefill rounds gate and up
// as Hugging Face does: measured on the fixtures, SwiGLU from f32 gate/up
// there moved the error around rather than down.) q/k/v and gate/up
// weights are stacked into one matrix each.
//
// Two paths. Prefill (n tokens of one sequence) runs cuBLASLt GEMMs into
// buffers laid out [q | k | v] by part and the flash attention kernel. A
// decode step (one token for each of sequences 0..B−1) runs the skinny GEMM
// of decode_ops.h with the norm before it and its epilogue fused: per layer
// norm+qkv (+bias)+RoPE+KV append, attention (split-K, the last block of
// each head merging), o (+residual), norm+gate|up (+SwiGLU), down
// (+residual): 5 kernels (6 with a q/k norm, which takes RoPE and the
// append into a kernel of its own); plus embedding, RoPE tables and final
// norm+LM head: 5·n_layer + 3 kernels per step (83 for Llama-3.2-1B, 163
// for Llama-3.1-8B; above 4 sequences the three norms are kernels of their
// own), captured once per B as a CUDA graph. On sm_90+ every kernel of a
// layer is a programmatic dependent launch (decode_ops.h): each starts
// while its predecessor drains, the GEMVs with their first weights in
// flight before they wait; up to 4 sequences each GEMV takes the block
// shape measured fastest for it (kCudaDecodeShapes), or with bulk_gemv the
// shared-memory ring.
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
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/decode_ops.h"
#include "backends/cuda/generation_ops.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "models/weight_loader.h"

namespace lathe {

using cuda::bf16_bits;

namespace {

constexpr int kMaxBatch = 256;      // sequences one model holds at most
constexpr int64_t kFusedNormRows = 4;  // decode rows whose pre-norm runs inside the GEMV

struct LayerWeights {
  bf16_bits* qkv_w = nullptr;      // [q_dim + 2·kv_dim, hidden]: q_proj, k_proj, v_proj rows
  bf16_bits* qkv_b = nullptr;      // [q_dim + 2·kv_dim] or null
  bf16_bits* o_w = nullptr;        // [hidden, q_dim]
  bf16_bits* o_b = nullptr;        // [hidden] or null
  bf16_bits* q_norm = nullptr;     // [head_dim] or null
  bf16_bits* k_norm = nullptr;     // [head_dim] or null
  bf16_bits* gu_w = nullptr;       // [2·ffn, hidden]: gate_proj, up_proj rows
  bf16_bits* gu_b = nullptr;       // [2·ffn] or null
  bf16_bits* down_w = nullptr;     // [hidden, ffn]
  bf16_bits* down_b = nullptr;     // [hidden] or null
  bf16_bits* attn_norm = nullptr;  // [hidden]
  bf16_bits* mlp_norm = nullptr;   // [hidden]
};

// Activations and per-step inputs, each sized for R = max(max_forward_tokens,
// max_batch) rows unless said otherwise.
struct StateBuffers {
  int32_t* tokens = nullptr;     // [R]
  int32_t* positions = nullptr;  // [R] right after tokens (one upload); prefill: the pass's; decode: sequence s's
  float* cos = nullptr;          // [R, head_dim / 2]
  float* sin = nullptr;          // [R, head_dim / 2]
  float* h = nullptr;            // [R, hidden] the residual stream (f32)
  float* delta = nullptr;        // [R, hidden] prefill's attention or MLP output (f32)
  bf16_bits* normed = nullptr;   // [R, hidden]
  bf16_bits* qkv = nullptr;      // [R, q_dim + 2·kv_dim] prefill: [q | k | v] by part; decode: by row
  bf16_bits* q = nullptr;        // [max_batch, q_dim] decode: q after RoPE
  bf16_bits* attn = nullptr;     // [R, q_dim]
  bf16_bits* gu = nullptr;       // [R, 2·ffn] prefill: [gate | up] by part, then silu(gate)·up
  float* act = nullptr;          // [max_batch, ffn] decode: silu(gate)·up, f32
  float* qkv32 = nullptr;        // [max_batch, q_dim + 2·kv_dim] decode: the projection by row, f32
  float* logits = nullptr;       // [max(max_logit_rows, max_batch), vocab]
  void* attn_workspace = nullptr;
  int32_t* next_token = nullptr;  // [max_batch] greedy picks
  // Per layer 2·S slots (S = max_batch rounded up to even): sequence s's k
  // cache at slot s, its v cache at S + s (the pointer arrays of
  // attention_decode_batch and rope_append, each 16-byte aligned).
  bf16_bits** cache_ptrs = nullptr;
};

// One layout walked twice: without an arena it sizes the plan, with one it
// hands out the buffers in the same order.
class Carver {
 public:
  explicit Carver(cuda::DeviceArena* arena) : arena_(arena) {}
  template <class T>
  Result<T*> take(int64_t n, const char* what) {
    if (!arena_) {
      plan_.add(static_cast<size_t>(n) * sizeof(T));
      return static_cast<T*>(nullptr);
    }
    return arena_->alloc_n<T>(n, what);
  }
  size_t planned_bytes() const { return plan_.total_bytes(); }

 private:
  cuda::DeviceArena* arena_;
  cuda::ArenaPlan plan_;
};

// tensor (f32, bf16 or f16, on the host) → bf16 at dst on the device.
Status upload_bf16(cuda::CudaContext& ctx, const Tensor& t, bf16_bits* dst) {
  Tensor b = t.dtype() == DType::BF16 ? t : t.to(DType::BF16);
  return cuda::copy_to_device(ctx, dst, b.raw(), static_cast<size_t>(b.numel()) * sizeof(bf16_bits));
}

}  // namespace

class CudaCausalLmImpl {
 public:
  ModelConfig cfg;
  FamilyQuirks quirks;
  std::vector<float> inv_freq;
  CudaModelOptions opts;
  int64_t hidden = 0, hd = 0, half = 0, q_dim = 0, kv_dim = 0, qkv_dim = 0, ffn = 0, vocab = 0;
  int n_layer = 0, max_tokens = 0;  // max_tokens: one pass's most tokens
  bool flash = true;                // head_dim 64/128 and no simple_attention
  int64_t n_params = 0;

  cuda::CudaContext ctx;
  cuda::DeviceArena weight_arena, state_arena;
  std::vector<LayerWeights> layers;
  bf16_bits* embed = nullptr;       // [vocab, hidden]
  bf16_bits* final_norm = nullptr;  // [hidden]
  bf16_bits* lm_head = nullptr;     // [vocab, hidden] (embed when tied)
  float* inv_freq_dev = nullptr;    // [half]
  std::vector<bf16_bits*> k_cache, v_cache;  // per layer [max_batch, max_seq, n_head_kv, head_dim]
  StateBuffers buf;
  int ptr_slots = 2;       // S above
  bool decode_gemv = true;  // the decode step's shapes suit gemv(); otherwise decode runs the prefill path
  bool overlap = false;     // decode kernels as programmatic dependent launches

  std::vector<int> seq_len;             // [max_batch] tokens in each sequence's cache
  std::vector<bool> decoded_eagerly;    // [max_batch + 1] by B: an eager step of B ran
  std::vector<cuda::CudaGraph> graphs;  // [max_batch + 1] by B
  std::vector<int32_t> host_step;       // staging [2·R]: tokens at 0, positions at R (buf.tokens' layout)

  Status init(const ModelHeader& header, const CudaModelOptions& options);
  Status allocate();
  Status lay_out_weights(Carver& c);
  Status lay_out_state(Carver& c);
  Status upload_weights(WeightLoader& wl, const std::string& dir);
  Status upload_layer(WeightLoader& wl, int i);
  Status random_weights(uint64_t seed, float init_range);

  bf16_bits* k_at(int l, int seq) const { return k_cache[l] + int64_t(seq) * opts.max_seq * kv_dim; }
  bf16_bits* v_at(int l, int seq) const { return v_cache[l] + int64_t(seq) * opts.max_seq * kv_dim; }
  bf16_bits* const* k_ptrs(int l) const { return buf.cache_ptrs + int64_t(l) * 2 * ptr_slots; }
  bf16_bits* const* v_ptrs(int l) const { return k_ptrs(l) + ptr_slots; }

  // Prefill: n tokens of one sequence.
  Status project(const bf16_bits* x, int64_t k, const bf16_bits* w, const bf16_bits* b, bf16_bits* out, int64_t n,
                 std::initializer_list<int64_t> parts);
  Status prefill_attention(int l, int64_t n, int seq, int pos0, const bf16_bits* q);
  Status prefill_layer(int l, int64_t n, int seq, int pos0);
  Status pass(int64_t n, int seq, int pos0, int64_t logit_rows);
  Status run(int seq, std::span<const int32_t> tokens, int64_t logit_rows);
  Status check_tokens(int seq, std::span<const int32_t> tokens) const;
  Status upload_step(std::span<const int32_t> tokens, const std::function<int32_t(int64_t)>& position);
  // Decode: one token for each of sequences 0..b−1.
  Status norm_gemv(const bf16_bits* norm_w, cuda::GemvArgs g);
  cuda::GemvArgs with_grid(cuda::GemvArgs g, CudaGemvGrid grid) const;
  Status decode_attention(int l, int b);
  Status decode_layer(int l, int b);
  Status decode_step(int b);
  Status decode(std::span<const int32_t> tokens);
  Status enqueue_step(int b);  // eagerly, or as this b's graph (captured on its second step)
};

// ---- Load --------------------------------------------------------------------

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
  LATHE_ASSIGN_OR_RETURN(buf.cache_ptrs, c.take<bf16_bits*>(2 * int64_t(ptr_slots) * n_layer, "cache pointers"));
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
  LATHE_TRY(cuda::embedding_f32(ctx, {.tokens = buf.tokens, .table = embed, .out = buf.h, .n = n, .vocab = vocab,
                                      .dim = hidden}));
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
    return cuda::attention_decode_batch_chunked(
        {.q = buf.q, .k_caches = reinterpret_cast<const void* const*>(k_ptrs(l)),
         .v_caches = reinterpret_cast<const void* const*>(v_ptrs(l)), .pos = buf.positions, .out = buf.attn,
         .workspace = buf.attn_workspace, .n_seqs = b, .max_ctx = opts.max_seq, .n_head = n_head, .n_head_kv = n_kv,
         .head_dim = static_cast<int>(hd), .window = window, .scale = scale, .stream = ctx.stream(),
         .overlap = overlap},
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
// g with the grid of kCudaDecodeShapes up to kFusedNormRows rows (shape 0 above).
cuda::GemvArgs CudaCausalLmImpl::with_grid(cuda::GemvArgs g, CudaGemvGrid grid) const {
  const bool small = g.rows <= kFusedNormRows;
  g.shape = small ? (opts.bulk_gemv ? cuda::kGemvBulkShape : grid.shape) : 0;
  g.ring_kib = opts.bulk_ring_kib > 0 ? static_cast<uint16_t>(std::min(opts.bulk_ring_kib, 224)) : grid.ring_kib;
  g.blocks_per_sm = static_cast<uint8_t>(std::clamp(opts.bulk_per_sm > 0 ? opts.bulk_per_sm : grid.per_sm, 0, 8));
  g.persistent = small && grid.persistent && opts.persistent_gemv;
  g.overlap = overlap;
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

Status CudaCausalLmImpl::decode_layer(int l, int b) {
  using cuda::GemvEpilogue;
  const LayerWeights& w = layers[l];
  const float eps = cfg.rms_norm_eps;
  const CudaDecodeShapes& grids = opts.register_gemv ? kCudaDecodeRegisterShapes : kCudaDecodeShapes;
  if (!w.q_norm) {
    // RoPE and the cache append in the projection's epilogue.
    cuda::GemvArgs g{.w = w.qkv_w, .bias = w.qkv_b, .rows = b, .n = qkv_dim, .k = hidden,
                     .epilogue = GemvEpilogue::kRopeAppend};
    g.rope = {.q_out = buf.q, .k_caches = k_ptrs(l), .v_caches = v_ptrs(l), .pos = buf.positions, .cos = buf.cos,
              .sin = buf.sin, .n_head = cfg.num_attention_heads, .n_head_kv = cfg.num_key_value_heads,
              .head_dim = static_cast<int>(hd), .max_ctx = opts.max_seq};
    LATHE_TRY(norm_gemv(w.attn_norm, with_grid(g, grids.qkv)));
  } else {
    LATHE_TRY(norm_gemv(w.attn_norm, with_grid({.w = w.qkv_w, .bias = w.qkv_b, .out = buf.qkv32, .rows = b,
                                                 .n = qkv_dim, .k = hidden, .epilogue = GemvEpilogue::kStoreF32},
                                                grids.qkv)));
    LATHE_TRY(cuda::rope_append(ctx, {.qkv = buf.qkv32, .q_out = buf.q, .k_caches = k_ptrs(l), .v_caches = v_ptrs(l),
                                      .pos = buf.positions, .cos = buf.cos, .sin = buf.sin, .q_norm = w.q_norm,
                                      .k_norm = w.k_norm, .n_seqs = b, .n_head = cfg.num_attention_heads,
                                      .n_head_kv = cfg.num_key_value_heads, .head_dim = static_cast<int>(hd),
                                      .max_ctx = opts.max_seq, .eps = eps, .overlap = overlap}));
  }
  LATHE_TRY(decode_attention(l, b));
  LATHE_TRY(cuda::gemv(ctx, with_grid({.x = buf.attn, .w = w.o_w, .bias = w.o_b, .out = buf.h, .rows = b,
                                        .n = hidden, .k = q_dim, .epilogue = GemvEpilogue::kAddF32},
                                       grids.o)));
  LATHE_TRY(norm_gemv(w.mlp_norm, with_grid({.w = w.gu_w, .bias = w.gu_b, .out = buf.act, .rows = b, .n = ffn,
                                              .k = hidden, .epilogue = GemvEpilogue::kSwigluF32},
                                             grids.gate_up)));
  return cuda::gemv(ctx, with_grid({.w = w.down_w, .bias = w.down_b, .out = buf.h, .rows = b, .n = hidden, .k = ffn,
                                    .epilogue = GemvEpilogue::kAddF32, .x_f32 = buf.act},
                                   grids.down));
}

// One decode step for sequences 0..b−1 whose ids and positions are on the device.
Status CudaCausalLmImpl::decode_step(int b) {
  LATHE_TRY(cuda::embedding_f32(ctx, {.tokens = buf.tokens, .table = embed, .out = buf.h, .n = b, .vocab = vocab,
                                      .dim = hidden}));
  LATHE_TRY(cuda::rope_tables(ctx, {.inv_freq = inv_freq_dev, .positions = buf.positions, .cos = buf.cos,
                                    .sin = buf.sin, .n_tokens = b, .half = half}));
  for (int l = 0; l < n_layer; ++l) LATHE_TRY(decode_layer(l, b));
  const CudaDecodeShapes& grids = opts.register_gemv ? kCudaDecodeRegisterShapes : kCudaDecodeShapes;
  return norm_gemv(final_norm, with_grid({.w = lm_head, .out = buf.logits, .rows = b, .n = vocab, .k = hidden,
                                          .epilogue = cuda::GemvEpilogue::kStoreF32},
                                         grids.lm_head));
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
  const int b = static_cast<int>(tokens.size());
  for (int s = 0; s < b; ++s) {
    LATHE_TRY(check_tokens(s, tokens.subspan(s, 1)).with_context("decode step, sequence " + std::to_string(s)));
  }
  LATHE_TRY(upload_step(tokens, [&](int64_t i) { return seq_len[i]; }));
  Status st = enqueue_step(b);
  if (!st.is_ok() && overlap) {
    // A driver that refuses programmatic dependent launches (or their capture):
    // the step is idempotent (it rewrites h and the same cache rows), so run it
    // again with ordinary launches and keep them.
    LATHE_LOG(kWarn, "cuda decode: overlapped launches failed (", st.message(), "); using ordinary launches");
    overlap = false;
    for (cuda::CudaGraph& g : graphs) g = cuda::CudaGraph();
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

// Appends tokens to sequence seq: one token of sequence 0 wanting its logits
// is a decode step; anything else prefill passes of max_tokens at most, the
// last yielding logit_rows rows of logits (1, or all of its tokens).
Status CudaCausalLmImpl::run(int seq, std::span<const int32_t> tokens, int64_t logit_rows) {
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
void CudaCausalLM::clear() { std::fill(impl_->seq_len.begin(), impl_->seq_len.end(), 0); }
void CudaCausalLM::clear(int seq) {
  if (seq >= 0 && seq < impl_->opts.max_batch) impl_->seq_len[seq] = 0;
}
void CudaCausalLM::set_use_graphs(bool on) {
  impl_->opts.use_graphs = on;
  if (!on)
    for (cuda::CudaGraph& g : impl_->graphs) g = cuda::CudaGraph();
}
void CudaCausalLM::set_persistent_gemv(bool on) {
  impl_->opts.persistent_gemv = on;
  for (cuda::CudaGraph& g : impl_->graphs) g = cuda::CudaGraph();
}
void CudaCausalLM::set_decode_gemvs(const CudaModelOptions& d) {
  CudaModelOptions& o = impl_->opts;
  o.register_gemv = d.register_gemv, o.bulk_gemv = d.bulk_gemv, o.bulk_ring_kib = d.bulk_ring_kib;
  o.bulk_per_sm = d.bulk_per_sm, o.attention_min_chunk = d.attention_min_chunk;
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

Result<int32_t> CudaCausalLM::forward_greedy(std::span<const int32_t> tokens) {
  CudaCausalLmImpl& m = *impl_;
  LATHE_TRY(m.run(0, tokens, 1));
  LATHE_TRY(cuda::argmax_rows(m.ctx, m.buf.logits, 1, m.vocab, m.buf.next_token));
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
      return cuda::argmax_rows(m.ctx, m.buf.logits, 1, m.vocab, m.buf.next_token + s);
    }));
  } else {
    LATHE_TRY(m.decode(tokens));
    LATHE_TRY(cuda::argmax_rows(m.ctx, m.buf.logits, static_cast<int64_t>(tokens.size()), m.vocab, m.buf.next_token));
  }
  return cuda::copy_to_host(m.ctx, next.data(), m.buf.next_token, next.size() * sizeof(int32_t));
}

}  // namespace lathe
