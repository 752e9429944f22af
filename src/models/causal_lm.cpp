// CausalLM for the Llama family: load (config → quirks → tensors by their
// Hugging Face names, every shape checked) and the forward pass
//   h = embed(tokens); for each block: h = block(h); logits = lm_head(norm(h))
// Weights stay as the file holds them (memory-mapped, bf16/f16 widened inside
// the kernels) unless LoadOptions asks for f32 copies. A LoRA adapter is
// merged into the weights it targets as they are fetched (those become f32
// copies), so the forward pass never knows there was one.
#include "models/causal_lm.h"

#include <algorithm>
#include <string>

#include "backends/cpu/cpu_ops.h"
#include "io/safetensors.h"
#include "models/family.h"
#include "models/weight_loader.h"
#include "nn/layers.h"
#include "ops/rope.h"

namespace lathe {

class CausalLmImpl {
 public:
  ModelConfig cfg;
  FamilyQuirks quirks;
  Embedding embed;
  std::vector<DecoderBlock> blocks;
  RmsNorm final_norm;
  Linear lm_head;
  std::vector<float> inv_freq;  // [head_dim / 2]
  int64_t n_params = 0;
};

namespace {

// The nn layers over the loader's tensors.
struct Loader {
  WeightLoader& wl;

  Result<Linear> linear(int layer, const char* leaf, int64_t out, int64_t in, bool bias) {
    std::string base = names::layer(layer, leaf);
    LATHE_ASSIGN_OR_RETURN(Tensor w, wl.linear_weight(base, out, in));
    Tensor b;
    if (bias) {
      LATHE_ASSIGN_OR_RETURN(b, wl.get(base + ".bias", {out}));
    }
    return Linear(std::move(w), std::move(b));
  }
  Result<RmsNorm> norm(const std::string& name, int64_t dim, float eps) {
    LATHE_ASSIGN_OR_RETURN(Tensor w, wl.get(name, {dim}));
    return RmsNorm(std::move(w), eps);
  }
};

Result<DecoderBlock> load_block(Loader& ld, const ModelConfig& c, const FamilyQuirks& fq, int i) {
  const int64_t hidden = c.hidden_size, hd = c.head_dim, ffn = c.intermediate_size;
  const int64_t q_dim = int64_t(c.num_attention_heads) * hd, kv_dim = int64_t(c.num_key_value_heads) * hd;
  LATHE_ASSIGN_OR_RETURN(Linear q, ld.linear(i, "self_attn.q_proj", q_dim, hidden, fq.qkv_bias));
  LATHE_ASSIGN_OR_RETURN(Linear k, ld.linear(i, "self_attn.k_proj", kv_dim, hidden, fq.qkv_bias));
  LATHE_ASSIGN_OR_RETURN(Linear v, ld.linear(i, "self_attn.v_proj", kv_dim, hidden, fq.qkv_bias));
  LATHE_ASSIGN_OR_RETURN(Linear o, ld.linear(i, "self_attn.o_proj", hidden, q_dim, fq.o_bias));
  std::optional<RmsNorm> q_norm, k_norm;
  if (fq.qk_norm) {
    LATHE_ASSIGN_OR_RETURN(q_norm, ld.norm(names::layer(i, "self_attn.q_norm.weight"), hd, c.rms_norm_eps));
    LATHE_ASSIGN_OR_RETURN(k_norm, ld.norm(names::layer(i, "self_attn.k_norm.weight"), hd, c.rms_norm_eps));
  }
  LATHE_ASSIGN_OR_RETURN(Linear gate, ld.linear(i, "mlp.gate_proj", ffn, hidden, fq.mlp_bias));
  LATHE_ASSIGN_OR_RETURN(Linear up, ld.linear(i, "mlp.up_proj", ffn, hidden, fq.mlp_bias));
  LATHE_ASSIGN_OR_RETURN(Linear down, ld.linear(i, "mlp.down_proj", hidden, ffn, fq.mlp_bias));
  LATHE_ASSIGN_OR_RETURN(RmsNorm attn_norm, ld.norm(names::layer(i, "input_layernorm.weight"), hidden, c.rms_norm_eps));
  LATHE_ASSIGN_OR_RETURN(RmsNorm mlp_norm,
                         ld.norm(names::layer(i, "post_attention_layernorm.weight"), hidden, c.rms_norm_eps));
  AttentionShape shape{.n_head = c.num_attention_heads, .n_head_kv = c.num_key_value_heads,
                       .head_dim = c.head_dim, .window = fq.sliding_window};
  Attention attn(shape, std::move(q), std::move(k), std::move(v), std::move(o), std::move(q_norm),
                 std::move(k_norm));
  return DecoderBlock(std::move(attn_norm), std::move(attn), std::move(mlp_norm), Mlp(std::move(gate), std::move(up),
                                                                                     std::move(down)));
}

Status load_weights(CausalLmImpl& m, const WeightStore& store, const LoadOptions& opts) {
  const ModelConfig& c = m.cfg;
  LATHE_ASSIGN_OR_RETURN(WeightLoader wl,
                         WeightLoader::open(store, opts.adapter_dir, c.num_hidden_layers, opts.keep_half_weights));
  Loader ld{wl};
  LATHE_ASSIGN_OR_RETURN(Tensor embed, wl.get(names::kEmbed, {c.vocab_size, c.hidden_size}));
  m.embed = Embedding(embed);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    LATHE_ASSIGN_OR_RETURN(DecoderBlock b, load_block(ld, c, m.quirks, i));
    m.blocks.push_back(std::move(b));
  }
  LATHE_ASSIGN_OR_RETURN(m.final_norm, ld.norm(names::kFinalNorm, c.hidden_size, c.rms_norm_eps));
  if (m.quirks.tied_embeddings) {
    m.lm_head = Linear(embed, Tensor());
  } else {
    LATHE_ASSIGN_OR_RETURN(Tensor head, wl.get(names::kLmHead, {c.vocab_size, c.hidden_size}));
    m.lm_head = Linear(std::move(head), Tensor());
  }
  m.n_params = wl.n_params();
  return Status::ok();
}

}  // namespace

void KvCache::truncate(int n) { n_tokens_ = std::clamp(n, 0, n_tokens_); }

CausalLM::CausalLM(std::unique_ptr<CausalLmImpl> impl) : impl_(std::move(impl)) {}
CausalLM::~CausalLM() = default;

const ModelConfig& CausalLM::config() const { return impl_->cfg; }
int64_t CausalLM::n_params() const { return impl_->n_params; }
const std::vector<float>& CausalLM::rope_inv_freq() const { return impl_->inv_freq; }

Result<std::unique_ptr<CausalLM>> CausalLM::load(const std::string& dir, const LoadOptions& opts) {
  if (!opts.device.is_cpu())
    return unsupported("load ", dir, ": device ", opts.device.str(), " is not supported by CausalLM yet");
  auto impl = std::make_unique<CausalLmImpl>();
  LATHE_ASSIGN_OR_RETURN(ModelHeader header, load_model_header(dir));
  impl->cfg = std::move(header.cfg);
  impl->quirks = header.quirks;
  impl->inv_freq = std::move(header.inv_freq);
  LATHE_ASSIGN_OR_RETURN(WeightStore store, WeightStore::open_dir(dir));
  LATHE_TRY(load_weights(*impl, store, opts));
  return std::unique_ptr<CausalLM>(new CausalLM(std::move(impl)));
}

KvCache CausalLM::new_cache(int max_tokens) const {
  const ModelConfig& c = impl_->cfg;
  KvCache cache;
  cache.max_tokens_ = std::max(0, max_tokens);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    cache.k_.push_back(Tensor::empty(DType::F32, {cache.max_tokens_, c.num_key_value_heads, c.head_dim}));
    cache.v_.push_back(Tensor::empty(DType::F32, {cache.max_tokens_, c.num_key_value_heads, c.head_dim}));
  }
  return cache;
}

Status CausalLM::forward(std::span<const int32_t> tokens, KvCache& cache, TensorView logits, bool all_logits) const {
  const CausalLmImpl& m = *impl_;
  const int64_t n = int64_t(tokens.size()), pos0 = cache.n_tokens_;
  if (n == 0) return invalid_argument("forward: no tokens");
  if (cache.k_.size() != m.blocks.size()) return invalid_argument("forward: the KV cache was not made by this model");
  if (pos0 + n > cache.max_tokens_)
    return invalid_argument("forward: ", n, " tokens at position ", pos0, " overflow the KV cache of ",
                            cache.max_tokens_, " tokens");
  const Shape want{all_logits ? n : 1, m.cfg.vocab_size};
  if (logits.dtype != DType::F32 || !(logits.shape == want))
    return invalid_argument("forward: logits are ", dtype_name(logits.dtype), " ", logits.shape.str(),
                            ", expected f32 ", want.str());

  Arena& arena = cache.scratch_;
  arena.reset();
  TensorView ids{const_cast<int32_t*>(tokens.data()), DType::I32, {n}, Device::cpu()};
  TensorView h = arena.alloc(DType::F32, {n, m.cfg.hidden_size});
  LATHE_TRY(m.embed.forward(ids, h).with_context("forward"));

  const int64_t half = m.cfg.head_dim / 2;
  TensorView positions = arena.alloc(DType::I32, {n});
  for (int64_t i = 0; i < n; ++i) positions.ptr<int32_t>()[i] = int32_t(pos0 + i);
  AttentionStep step{.pos0 = int(pos0), .cos = arena.alloc(DType::F32, {n, half}),
                     .sin = arena.alloc(DType::F32, {n, half})};
  TensorView inv{const_cast<float*>(m.inv_freq.data()), DType::F32, {half}, Device::cpu()};
  LATHE_TRY(cpu::rope_tables({.inv_freq = inv, .positions = positions, .cos = step.cos, .sin = step.sin}));

  for (size_t l = 0; l < m.blocks.size(); ++l) {
    step.k_cache = cache.k_[l];
    step.v_cache = cache.v_[l];
    LATHE_TRY(m.blocks[l].forward(h, step, arena));
  }
  TensorView last = all_logits ? h : h.slice_rows(n - 1, n);
  LATHE_TRY(m.final_norm.forward(last, last));
  LATHE_TRY(m.lm_head.forward(last, logits, arena));
  cache.n_tokens_ = int(pos0 + n);
  return Status::ok();
}

}  // namespace lathe
