// CausalLM for the Llama family: load (config → quirks → tensors by their
// Hugging Face names, every shape checked) and the forward pass
//   h = embed(tokens); for each block: h = block(h); logits = lm_head(norm(h))
// Weights stay as the file holds them (memory-mapped, bf16/f16 widened inside
// the kernels) unless LoadOptions asks for f32 copies. A LoRA adapter is
// merged into the weights it targets as they are fetched (those become f32
// copies), so the forward pass never knows there was one.
#include "models/causal_lm.h"

#include <algorithm>
#include <set>
#include <string>

#include "backends/cpu/cpu_ops.h"
#include "core/parallel.h"
#include "io/peft_adapter.h"
#include "io/safetensors.h"
#include "models/family.h"
#include "nn/layers.h"
#include "nn/lora.h"
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

// W [out, in] f32 += scale · B [out, r] · A [r, in] (A, B in any float dtype).
void merge_lora(Tensor& w, const LoraPair& p, float scale) {
  const Tensor a = p.a.to_f32(), b = p.b.to_f32();
  lora_merge(w.data<float>(), a.data<float>(), b.data<float>(), w.size(0), w.size(1), a.size(0), scale);
}

// Fetches tensors by name with their expected shapes; counts parameters;
// merges the adapter's factors into the linear weights it targets.
struct Loader {
  const WeightStore& store;
  const LoadOptions& opts;
  const PeftAdapter* adapter = nullptr;
  std::set<const void*> seen = {};
  int64_t n_params = 0;

  Status apply_adapter(const std::string& module, Tensor* w) {
    if (adapter == nullptr) return Status::ok();
    auto it = adapter->modules.find(module);
    if (it == adapter->modules.end()) {
      if (adapter->config.targets(module))
        return not_found(adapter->weights_path, ": no tensor 'base_model.model.", module,
                         ".lora_A.weight', though target_modules of ", adapter->config_path, " names the module");
      return Status::ok();
    }
    const LoraPair& p = it->second;
    const int64_t out = w->size(0), in = w->size(1), r = adapter->config.r;
    const std::string key = "base_model.model." + module;
    if (!(p.a.shape() == Shape{r, in}))
      return invalid_argument(adapter->weights_path, ": tensor '", key, ".lora_A.weight' has shape ", p.a.shape().str(),
                              ", expected ", Shape{r, in}.str(), " (the base weight is ", w->shape().str(), ")");
    if (!(p.b.shape() == Shape{out, r}))
      return invalid_argument(adapter->weights_path, ": tensor '", key, ".lora_B.weight' has shape ", p.b.shape().str(),
                              ", expected ", Shape{out, r}.str(), " (the base weight is ", w->shape().str(), ")");
    *w = w->to_f32();  // a private copy: the file mapping is read-only
    merge_lora(*w, p, adapter->config.scale());
    return Status::ok();
  }

  Result<Tensor> get(const std::string& name, const Shape& shape) {
    LATHE_ASSIGN_OR_RETURN(Tensor t, store.get(name, shape));
    if (t.dtype() != DType::F32 && t.dtype() != DType::BF16 && t.dtype() != DType::F16)
      return invalid_argument(store.file_of(name), ": tensor '", name, "' has dtype ", dtype_name(t.dtype()),
                              ", expected F32, BF16 or F16");
    if (seen.insert(t.raw()).second) n_params += t.numel();
    if (!opts.keep_half_weights && t.dtype() != DType::F32) t = t.to_f32();
    return t;
  }
  Result<Linear> linear(int layer, const char* leaf, int64_t out, int64_t in, bool bias) {
    std::string base = names::layer(layer, leaf);
    LATHE_ASSIGN_OR_RETURN(Tensor w, get(base + ".weight", {out, in}));
    LATHE_TRY(apply_adapter(base, &w));
    Tensor b;
    if (bias) {
      LATHE_ASSIGN_OR_RETURN(b, get(base + ".bias", {out}));
    }
    return Linear(std::move(w), std::move(b));
  }
  Result<RmsNorm> norm(const std::string& name, int64_t dim, float eps) {
    LATHE_ASSIGN_OR_RETURN(Tensor w, get(name, {dim}));
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

// Every module of the adapter must be a projection of the model: one that is
// not names a layer or projection the model lacks (checked before any merge).
Status check_adapter_modules(const PeftAdapter& ad, const std::string& model_dir, int n_layer) {
  static constexpr const char* kLeaves[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                            "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                            "mlp.down_proj"};
  std::set<std::string> known;
  for (int i = 0; i < n_layer; ++i)
    for (const char* leaf : kLeaves) known.insert(names::layer(i, leaf));
  for (const auto& [module, pair] : ad.modules)
    if (!known.count(module))
      return not_found(ad.weights_path, ": tensor 'base_model.model.", module, ".lora_A.weight' adapts '", module,
                       "', which is not a linear layer of the model in ", model_dir, " (it has layers 0..",
                       n_layer - 1, " with self_attn.{q,k,v,o}_proj and mlp.{gate,up,down}_proj)");
  return Status::ok();
}

Status load_weights(CausalLmImpl& m, const WeightStore& store, const LoadOptions& opts) {
  const ModelConfig& c = m.cfg;
  Loader ld{store, opts};
  PeftAdapter adapter;
  if (!opts.adapter_dir.empty()) {
    LATHE_ASSIGN_OR_RETURN(adapter, load_peft_adapter(opts.adapter_dir));
    LATHE_TRY(check_adapter_modules(adapter, store.dir(), c.num_hidden_layers));
    ld.adapter = &adapter;
  }
  LATHE_ASSIGN_OR_RETURN(Tensor embed, ld.get(names::kEmbed, {c.vocab_size, c.hidden_size}));
  m.embed = Embedding(embed);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    LATHE_ASSIGN_OR_RETURN(DecoderBlock b, load_block(ld, c, m.quirks, i));
    m.blocks.push_back(std::move(b));
  }
  LATHE_ASSIGN_OR_RETURN(m.final_norm, ld.norm(names::kFinalNorm, c.hidden_size, c.rms_norm_eps));
  if (m.quirks.tied_embeddings) {
    m.lm_head = Linear(embed, Tensor());
  } else {
    LATHE_ASSIGN_OR_RETURN(Tensor head, ld.get(names::kLmHead, {c.vocab_size, c.hidden_size}));
    m.lm_head = Linear(std::move(head), Tensor());
  }
  m.n_params = ld.n_params;
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
