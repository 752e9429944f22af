// TrainableModel: loading (config → quirks → every tensor by its Hugging Face
// name, shape-checked, placed in the frozen base or the flat parameter
// buffer), LoRA set-up (fresh or from a PEFT adapter directory) and saving
// (PEFT adapter, or transformers weights for full SFT). The passes live in
// trainable_pass.cpp.
#include "train/trainable_model.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "io/peft_adapter.h"
#include "io/safetensors.h"
#include "ops/rope.h"
#include "train/export.h"
#include "train/trainable_impl.h"

namespace lathe {

namespace {

constexpr int64_t kAlignFloats = 16;
const auto& kProjPath = names::kProjPaths;
static_assert(std::size(names::kProjPaths) == kNumProj);

// A base tensor to place: its name and shape, and where its weight and
// gradient pointers go.
struct Slot {
  std::string name;
  Shape shape;
  float** w;
  float** dw;
  const uint16_t** w16 = nullptr;  // the matrices: where a bf16 copy goes under bf16_base
};

std::vector<Slot> base_slots(TrainableModelImpl& m) {
  const ModelConfig& c = m.cfg;
  const int64_t H = c.hidden_size, hd = c.head_dim, F = c.intermediate_size;
  const int64_t q_dim = int64_t(c.num_attention_heads) * hd, kv_dim = int64_t(c.num_key_value_heads) * hd;
  const int64_t out[kNumProj] = {q_dim, kv_dim, kv_dim, H, F, F, H};
  const int64_t in[kNumProj] = {H, H, H, q_dim, H, H, F};
  const bool bias[kNumProj] = {m.quirks.qkv_bias, m.quirks.qkv_bias, m.quirks.qkv_bias, m.quirks.o_bias,
                               m.quirks.mlp_bias, m.quirks.mlp_bias, m.quirks.mlp_bias};
  std::vector<Slot> s;
  s.push_back({names::kEmbed, {c.vocab_size, H}, &m.embed, &m.d_embed, &m.embed16});
  m.blocks.resize(size_t(c.num_hidden_layers));
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    TBlock& b = m.blocks[size_t(i)];
    auto norm = [&](const char* leaf, TNorm& t, int64_t dim) {
      t.dim = dim;
      s.push_back({names::layer(i, leaf), {dim}, &t.w, &t.dw});
    };
    auto proj = [&](int j) {
      TLinear& L = b.proj[size_t(j)];
      L.out = out[j];
      L.in = in[j];
      s.push_back(
          {names::layer(i, (std::string(kProjPath[j]) + ".weight").c_str()), {L.out, L.in}, &L.w, &L.dw, &L.w16});
      if (bias[j]) s.push_back({names::layer(i, (std::string(kProjPath[j]) + ".bias").c_str()), {L.out}, &L.b, &L.db});
    };
    norm("input_layernorm.weight", b.attn_norm, H);
    for (int j = kQ; j <= kV; ++j) proj(j);
    if (m.quirks.qk_norm) {
      norm("self_attn.q_norm.weight", b.q_norm, hd);
      norm("self_attn.k_norm.weight", b.k_norm, hd);
    }
    proj(kO);
    norm("post_attention_layernorm.weight", b.mlp_norm, H);
    for (int j = kGate; j <= kDown; ++j) proj(j);
  }
  m.final_norm.dim = H;
  s.push_back({names::kFinalNorm, {H}, &m.final_norm.w, &m.final_norm.dw});
  m.lm_head.out = c.vocab_size;
  m.lm_head.in = H;
  if (!m.quirks.tied_embeddings)
    s.push_back({names::kLmHead, {c.vocab_size, H}, &m.lm_head.w, &m.lm_head.dw, &m.lm_head.w16});
  return s;
}

Result<Tensor> get_float(const WeightStore& store, const std::string& name, const Shape& shape) {
  LATHE_ASSIGN_OR_RETURN(Tensor t, store.get(name, shape));
  if (t.dtype() != DType::F32 && t.dtype() != DType::BF16 && t.dtype() != DType::F16)
    return invalid_argument(store.file_of(name), ": tensor '", name, "' has dtype ", dtype_name(t.dtype()),
                            ", expected F32, BF16 or F16");
  return t;
}

int64_t aligned(int64_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

void allocate(TrainableModelImpl& m, int64_t total) {
  m.params = Tensor::zeros(DType::F32, {std::max<int64_t>(total, 1)});
  m.grads = Tensor::zeros(DType::F32, {std::max<int64_t>(total, 1)});
}

// The bf16 matrices never change during LoRA training: each is packed once
// here for its forward and input-gradient GEMMs (gemm_bf16.h).
void pack_bf16_base(TrainableModelImpl& m) {
  auto pack = [&](TLinear& L) {
    if (!L.w16) return;
    m.packed.push_back(std::make_unique<cpu::PackedBf16Weight>(L.w16, L.out, L.in));
    L.packed = m.packed.back().get();
  };
  for (TBlock& b : m.blocks)
    for (TLinear& L : b.proj) pack(L);
  pack(m.lm_head);
}

Status place_base(TrainableModelImpl& m, const WeightStore& store) {
  std::vector<Slot> slots = base_slots(m);
  if (m.opts.bf16_base && m.opts.full_sft)
    return invalid_argument("trainer.precision bf16-mixed holds the frozen base in bf16 and needs LoRA "
                            "(peft.peft_scheme: lora); full SFT trains f32 weights");
  if (!m.opts.full_sft) {
    for (const Slot& s : slots) {
      LATHE_ASSIGN_OR_RETURN(Tensor t, get_float(store, s.name, s.shape));
      if (m.opts.bf16_base && s.w16) {
        if (t.dtype() != DType::BF16) t = t.to(DType::BF16);
        *s.w16 = t.data<uint16_t>();  // read only: may point into the mapped file
      } else {
        if (t.dtype() != DType::F32) t = t.to_f32();
        *s.w = t.data<float>();
      }
      m.frozen.push_back(std::move(t));
    }
  } else {
    int64_t total = 0;
    for (const Slot& s : slots) {
      m.table.push_back({s.name, total, s.shape});
      total += aligned(s.shape.numel());
    }
    allocate(m, total);
    for (size_t i = 0; i < slots.size(); ++i) {
      LATHE_ASSIGN_OR_RETURN(Tensor t, get_float(store, slots[i].name, slots[i].shape));
      float* w = m.params.data<float>() + m.table[i].offset;
      convert_to_f32(t.raw(), t.dtype(), w, t.numel());
      *slots[i].w = w;
      *slots[i].dw = m.grads.data<float>() + m.table[i].offset;
    }
  }
  if (m.quirks.tied_embeddings) {
    m.lm_head.w = m.embed;
    m.lm_head.w16 = m.embed16;
    m.lm_head.dw = m.d_embed;
  }
  pack_bf16_base(m);
  return Status::ok();
}

std::string lora_key(int layer, int j, const char* ab) {
  return "base_model.model.model.layers." + std::to_string(layer) + "." + kProjPath[j] + ".lora_" + ab + ".weight";
}

uint64_t init_seed(uint64_t seed, int layer, int j) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + uint64_t(layer * kNumProj + j + 1) * 0xD1B54A32D192ED03ull;
  return z ^ (z >> 29);
}

// Takes r, lora_alpha and use_rslora from a PEFT adapter (read and checked by
// io/peft_adapter); the targeted projections are those it holds factors for.
Status adapter_lora_config(const PeftAdapter& ad, LoraConfig* cfg) {
  cfg->r = ad.config.r;
  cfg->alpha = ad.config.lora_alpha;
  cfg->rslora = ad.config.use_rslora;
  cfg->target_modules.clear();
  for (const auto& [module, pair] : ad.modules) {
    std::string leaf = module.substr(module.rfind('.') + 1);
    if (std::find(cfg->target_modules.begin(), cfg->target_modules.end(), leaf) == cfg->target_modules.end())
      cfg->target_modules.push_back(leaf);
  }
  return cfg->validate().with_context(ad.config_path);
}

// Copies the adapter's factors into params(); every factor must be one lathe trains.
Status load_adapter_tensors(TrainableModelImpl& m, const PeftAdapter& ad) {
  const std::string kPrefix = "base_model.model.";
  size_t used = 0;
  for (const ParamInfo& p : m.table) {
    // p.name: base_model.model.<module>.lora_{A,B}.weight
    const size_t ab = p.name.rfind(".lora_");
    const std::string module = p.name.substr(kPrefix.size(), ab - kPrefix.size());
    auto it = ad.modules.find(module);
    if (it == ad.modules.end())
      return not_found(ad.weights_path, ": tensor '", p.name, "' not found (the adapter's target_modules and layers must match)");
    const Tensor& t = p.name[ab + 6] == 'A' ? it->second.a : it->second.b;
    if (!(t.shape() == p.shape))
      return invalid_argument(ad.weights_path, ": tensor '", p.name, "' has shape ", t.shape().str(), ", expected ", p.shape.str());
    if (t.dtype() != DType::F32 && t.dtype() != DType::BF16 && t.dtype() != DType::F16)
      return invalid_argument(ad.weights_path, ": tensor '", p.name, "' has dtype ", dtype_name(t.dtype()), ", expected F32, BF16 or F16");
    convert_to_f32(t.raw(), t.dtype(), m.params.data<float>() + p.offset, t.numel());
    ++used;
  }
  if (used != 2 * ad.modules.size())
    for (const auto& [module, pair] : ad.modules) {
      bool known = false;
      for (const ParamInfo& p : m.table) known = known || p.name.rfind(kPrefix + module + ".lora_", 0) == 0;
      if (!known) return unsupported(ad.weights_path, ": module '", module, "' is not a LoRA target lathe trains");
    }
  return Status::ok();
}

Status place_lora(TrainableModelImpl& m) {
  PeftAdapter adapter;
  if (!m.opts.adapter_dir.empty()) {
    LATHE_ASSIGN_OR_RETURN(adapter, load_peft_adapter(m.opts.adapter_dir));
    LATHE_TRY(adapter_lora_config(adapter, &m.opts.lora));
  }
  LATHE_TRY(m.opts.lora.validate());
  LATHE_ASSIGN_OR_RETURN(std::vector<std::string> leaves, lora_target_leaves(m.opts.lora.target_modules));
  const int64_t r = m.opts.lora.r;
  int64_t total = 0;
  for (size_t i = 0; i < m.blocks.size(); ++i)
    for (int j = 0; j < kNumProj; ++j) {
      const std::string leaf = std::string(kProjPath[j]).substr(std::string(kProjPath[j]).find('.') + 1);
      if (std::find(leaves.begin(), leaves.end(), leaf) == leaves.end()) continue;
      TLinear& L = m.blocks[i].proj[size_t(j)];
      L.lora = int(m.loras.size());
      m.loras.push_back({.r = r, .in = L.in, .out = L.out});
      m.table.push_back({lora_key(int(i), j, "A"), total, {r, L.in}});
      total += aligned(r * L.in);
      m.table.push_back({lora_key(int(i), j, "B"), total, {L.out, r}});
      total += aligned(L.out * r);
    }
  allocate(m, total);
  float* p = m.params.data<float>();
  float* g = m.grads.data<float>();
  for (size_t k = 0; k < m.loras.size(); ++k) {
    TLora& a = m.loras[k];
    const ParamInfo& pa = m.table[2 * k];
    const ParamInfo& pb = m.table[2 * k + 1];
    a.a = p + pa.offset, a.da = g + pa.offset, a.b = p + pb.offset, a.db = g + pb.offset;
  }
  for (size_t i = 0; i < m.blocks.size(); ++i)
    for (int j = 0; j < kNumProj; ++j)
      if (int k = m.blocks[i].proj[size_t(j)].lora; k >= 0) lora_init_a(m.loras[size_t(k)].a, r, m.loras[size_t(k)].in, init_seed(m.opts.seed, int(i), j));
  if (!m.opts.adapter_dir.empty())
    LATHE_TRY(load_adapter_tensors(m, adapter));
  return Status::ok();
}

Status make_dir(const std::string& dir, const char* what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return io_error(what, ": cannot create ", dir, ": ", ec.message());
  return Status::ok();
}

Status write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) return io_error("cannot write ", path);
  return Status::ok();
}

}  // namespace

TrainableModel::TrainableModel(std::unique_ptr<TrainableModelImpl> impl) : impl_(std::move(impl)) {}
TrainableModel::~TrainableModel() = default;

Result<std::unique_ptr<TrainableModel>> TrainableModel::load(const std::string& model_dir,
                                                             const TrainableModelOptions& options) {
  auto m = std::make_unique<TrainableModelImpl>();
  m->opts = options;
  m->model_dir = model_dir;
  LATHE_ASSIGN_OR_RETURN(ModelHeader header, load_model_header(model_dir));
  m->cfg = std::move(header.cfg);
  m->quirks = header.quirks;
  m->inv_freq = std::move(header.inv_freq);
  LATHE_ASSIGN_OR_RETURN(WeightStore store, WeightStore::open_dir(model_dir));
  LATHE_TRY(place_base(*m, store));
  if (!options.full_sft) LATHE_TRY(place_lora(*m));
  return std::unique_ptr<TrainableModel>(new TrainableModel(std::move(m)));
}

Result<PassLoss> TrainableModel::forward_backward(const MicroBatch& mb, float loss_scale) {
  return impl_->run(mb, loss_scale, /*backward=*/true);
}
Result<PassLoss> TrainableModel::forward_loss(const MicroBatch& mb) { return impl_->run(mb, 1.0f, false); }

std::span<float> TrainableModel::params() {
  return {impl_->params.data<float>(), size_t(impl_->params.numel())};
}
std::span<float> TrainableModel::grads() { return {impl_->grads.data<float>(), size_t(impl_->grads.numel())}; }
void TrainableModel::zero_grads() { std::memset(impl_->grads.raw(), 0, size_t(impl_->grads.nbytes())); }
const std::vector<ParamInfo>& TrainableModel::param_table() const { return impl_->table; }
const ParamInfo* TrainableModel::find_param(std::string_view name) const {
  for (const ParamInfo& p : impl_->table)
    if (p.name == name) return &p;
  return nullptr;
}
const ModelConfig& TrainableModel::config() const { return impl_->cfg; }
const LoraConfig& TrainableModel::lora_config() const { return impl_->opts.lora; }
bool TrainableModel::full_sft() const { return impl_->opts.full_sft; }
int64_t TrainableModel::activation_bytes() const { return impl_->arena.capacity_bytes(); }

void TrainableModel::set_phase_timing(bool on) {
  impl_->time_phases = on;
  impl_->phase_s.fill(0.0);
  impl_->pass_s = 0;
}

std::vector<std::pair<std::string, double>> TrainableModel::phase_seconds() const {
  const char* const names[kNumPhases] = {"base GEMMs", "LoRA", "attention", "LM head + CE", "base + LoRA fused"};
  std::vector<std::pair<std::string, double>> out;
  double sum = 0;
  for (int p = 0; p < kNumPhases; ++p) {
    out.emplace_back(names[p], impl_->phase_s[size_t(p)]);
    sum += impl_->phase_s[size_t(p)];
  }
  out.emplace_back("rest", impl_->pass_s - sum);
  out.emplace_back("pass", impl_->pass_s);
  return out;
}
uint64_t TrainableModel::passes_run() const { return impl_->passes; }
void TrainableModel::set_passes_run(uint64_t n) { impl_->passes = n; }

Status TrainableModel::save_adapter_peft(const std::string& dir) const {
  const TrainableModelImpl& m = *impl_;
  if (m.opts.full_sft) return invalid_argument("save_adapter_peft: the model trains every weight (full SFT); use save_full");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const ParamInfo& p : m.table) {
    Tensor t = Tensor::empty(DType::F32, p.shape);
    std::memcpy(t.raw(), m.params.data<float>() + p.offset, size_t(t.nbytes()));
    tensors.emplace_back(p.name, std::move(t));
  }
  LATHE_ASSIGN_OR_RETURN(PeftAdapterConfig config, peft_config_of(m.opts.lora, m.model_dir));
  return write_peft_adapter(dir, config, tensors);
}

Status TrainableModel::save_full(const std::string& dir) const {
  const TrainableModelImpl& m = *impl_;
  if (!m.opts.full_sft) return invalid_argument("save_full: the model trains LoRA adapters; use save_adapter_peft");
  LATHE_TRY(make_dir(dir, "save_full"));
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const ParamInfo& p : m.table) {
    Tensor t = Tensor::empty(DType::F32, p.shape);
    std::memcpy(t.raw(), m.params.data<float>() + p.offset, size_t(t.nbytes()));
    tensors.emplace_back(p.name, std::move(t));
  }
  LATHE_TRY(write_weights(dir, tensors));
  // The source config, its dtype now the f32 the weights are written in.
  std::ifstream f(m.model_dir + "/config.json");
  std::stringstream text;
  text << f.rdbuf();
  try {
    nlohmann::json j = nlohmann::json::parse(text.str());
    for (const char* key : {"dtype", "torch_dtype"})
      if (j.contains(key)) j[key] = "float32";
    return write_text(dir + "/config.json", j.dump(2) + "\n");
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument("save_full: ", m.model_dir, "/config.json: ", e.what());
  }
}

}  // namespace lathe
