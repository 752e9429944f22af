// CudaTrainableModel set-up: checking the shape, carving the one device
// arena (the same carve runs twice: once to size the arena, once to hand out
// its pointers), the LoRA table (TrainableModel's layout: per layer, per
// targeted projection, A then B, 16-float aligned), weight upload by
// transformers' name, random init for benchmarks, and the optimizer.
#include "train/cuda_model.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "backends/cuda/attention.h"
#include "core/dtype.h"
#include "core/parallel.h"
#include "train/cuda_model_impl.h"

namespace lathe {

namespace {

constexpr int64_t kAlignFloats = 16;
const char* const kProjPath[kCnumProj] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                          "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                          "mlp.down_proj"};

int64_t aligned(int64_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }
std::string layer_name(int64_t l, const std::string& leaf) {
  return "model.layers." + std::to_string(l) + "." + leaf;
}

Status check_shape(const CudaModelShape& s, const CudaTrainOptions& o) {
  if (s.vocab <= 0 || s.hidden <= 0 || s.inter <= 0 || s.n_layer <= 0 || s.n_head <= 0 || s.n_kv <= 0)
    return invalid_argument("cuda trainer: model sizes must be positive");
  if (s.head_dim != 64 && s.head_dim != 128)
    return unsupported("cuda trainer: head_dim ", s.head_dim, " (the GPU attention kernels take 64 or 128)");
  if (s.n_head % s.n_kv != 0)
    return invalid_argument("cuda trainer: ", s.n_head, " heads are not a multiple of ", s.n_kv, " KV heads");
  if (s.hidden % 8 != 0 || s.inter % 8 != 0)
    return unsupported("cuda trainer: hidden_size and intermediate_size must be multiples of 8");
  if (int64_t(s.inv_freq.size()) != s.head_dim / 2)
    return invalid_argument("cuda trainer: ", s.inv_freq.size(), " RoPE frequencies for head_dim ", s.head_dim);
  if (o.max_tokens <= 0) return invalid_argument("cuda trainer: max_tokens must be positive");
  if (o.lora_r <= 0) return invalid_argument("cuda trainer: LoRA r must be positive");
  return Status::ok();
}

// Typed views of an arena allocator alloc(bytes, what) -> Result<void*>.
template <class Alloc>
struct Carver {
  Alloc& alloc;
  Result<bf16p> bf(int64_t n, const char* what) {
    LATHE_ASSIGN_OR_RETURN(void* p, alloc(size_t(n) * 2, what));
    return static_cast<bf16p>(p);
  }
  Result<float*> f32(int64_t n, const char* what) {
    LATHE_ASSIGN_OR_RETURN(void* p, alloc(size_t(n) * 4, what));
    return static_cast<float*>(p);
  }
  Result<int32_t*> i32(int64_t n, const char* what) {
    LATHE_ASSIGN_OR_RETURN(void* p, alloc(size_t(n) * 4, what));
    return static_cast<int32_t*>(p);
  }
};

// The frozen base and the flat LoRA buffers.
template <class C>
Status carve_weights(CudaModelImpl& m, C& c) {
  const CudaModelShape& s = m.s;
  const int64_t H = s.hidden, hd = s.head_dim;
  auto bf = [&](int64_t n, const char* what) { return c.bf(n, what); };
  auto f32 = [&](int64_t n, const char* what) { return c.f32(n, what); };
  LATHE_ASSIGN_OR_RETURN(m.embed, bf(s.vocab * H, "embedding"));
  if (s.tied) {
    m.lm_head = m.embed;
  } else {
    LATHE_ASSIGN_OR_RETURN(m.lm_head, bf(s.vocab * H, "lm_head"));
  }
  LATHE_ASSIGN_OR_RETURN(m.final_norm, bf(H, "final norm"));
  for (CBlock& b : m.blocks) {
    LATHE_ASSIGN_OR_RETURN(b.attn_norm, bf(H, "norm"));
    LATHE_ASSIGN_OR_RETURN(b.mlp_norm, bf(H, "norm"));
    if (s.qk_norm) {
      LATHE_ASSIGN_OR_RETURN(b.q_norm, bf(hd, "q_norm"));
      LATHE_ASSIGN_OR_RETURN(b.k_norm, bf(hd, "k_norm"));
    }
    for (int j = 0; j < kCnumProj; ++j) {
      CLinear& L = b.proj[size_t(j)];
      LATHE_ASSIGN_OR_RETURN(L.w, bf(L.out * L.in, "projection"));
      if (s.qkv_bias && j <= kCv) {
        LATHE_ASSIGN_OR_RETURN(L.bias8, bf(8 * L.out, "bias"));
      }
    }
  }
  // LoRA: fp32 masters and grads, 4-term bf16 copies at 4× the offsets.
  LATHE_ASSIGN_OR_RETURN(m.params, f32(std::max<int64_t>(m.n_flat, 1), "LoRA params"));
  LATHE_ASSIGN_OR_RETURN(m.grads, f32(std::max<int64_t>(m.n_flat, 1), "LoRA grads"));
  LATHE_ASSIGN_OR_RETURN(m.split, bf(4 * std::max<int64_t>(m.n_flat, 1), "LoRA 4-term copies"));
  LATHE_ASSIGN_OR_RETURN(void* table, c.alloc(std::max<size_t>(m.table.size(), 1) * sizeof(cuda::LoraSplitFactor),
                                              "LoRA split table"));
  m.split_table = static_cast<cuda::LoraSplitFactor*>(table);
  return Status::ok();
}

// Layer inputs and what each layer keeps for its backward.
template <class C>
Status carve_acts(CudaModelImpl& m, C& c) {
  const CudaModelShape& s = m.s;
  const int64_t T = m.o.max_tokens, H = s.hidden, F = s.inter, hd = s.head_dim;
  const int64_t qd = s.n_head * hd, kvd = s.n_kv * hd, r = m.o.lora_r;
  auto bf = [&](int64_t n, const char* what) { return c.bf(n, what); };
  auto f32 = [&](int64_t n, const char* what) { return c.f32(n, what); };
  for (bf16p& h : m.hs) {
    LATHE_ASSIGN_OR_RETURN(h, bf(T * H, "layer input"));
  }
  for (CActs& a : m.acts) {
    LATHE_ASSIGN_OR_RETURN(a.xn1, bf(T * H, "xn1"));
    LATHE_ASSIGN_OR_RETURN(a.rstd1, f32(T, "rstd1"));
    if (s.qk_norm) {
      LATHE_ASSIGN_OR_RETURN(a.q_raw, bf(T * qd, "q_raw"));
      LATHE_ASSIGN_OR_RETURN(a.k_raw, bf(T * kvd, "k_raw"));
      LATHE_ASSIGN_OR_RETURN(a.q_rstd, f32(T * s.n_head, "q_rstd"));
      LATHE_ASSIGN_OR_RETURN(a.k_rstd, f32(T * s.n_kv, "k_rstd"));
    }
    LATHE_ASSIGN_OR_RETURN(a.q, bf(T * qd, "q"));
    LATHE_ASSIGN_OR_RETURN(a.k, bf(T * kvd, "k"));
    LATHE_ASSIGN_OR_RETURN(a.v, bf(T * kvd, "v"));
    LATHE_ASSIGN_OR_RETURN(a.attn, bf(T * qd, "attention out"));
    LATHE_ASSIGN_OR_RETURN(a.lse, f32(T * s.n_head, "lse"));
    LATHE_ASSIGN_OR_RETURN(a.h_mid, bf(T * H, "h_mid"));
    LATHE_ASSIGN_OR_RETURN(a.xn2, bf(T * H, "xn2"));
    LATHE_ASSIGN_OR_RETURN(a.rstd2, f32(T, "rstd2"));
    LATHE_ASSIGN_OR_RETURN(a.gate, bf(T * F, "gate"));
    LATHE_ASSIGN_OR_RETURN(a.up, bf(T * F, "up"));
    for (int j = 0; j < kCnumProj; ++j) {
      if (m.o.targets[size_t(j)]) {
        LATHE_ASSIGN_OR_RETURN(a.u[size_t(j)], bf(T * 4 * r, "LoRA u"));
      }
    }
  }
  return Status::ok();
}

// Buffers every layer reuses, workspaces and the batch's inputs.
template <class C, class Alloc>
Status carve_scratch(CudaModelImpl& m, C& c, Alloc& alloc) {
  const CudaModelShape& s = m.s;
  const int64_t T = m.o.max_tokens, H = s.hidden, F = s.inter, hd = s.head_dim;
  const int64_t qd = s.n_head * hd, kvd = s.n_kv * hd, r = m.o.lora_r;
  auto bf = [&](int64_t n, const char* what) { return c.bf(n, what); };
  auto f32 = [&](int64_t n, const char* what) { return c.f32(n, what); };
  auto i32 = [&](int64_t n, const char* what) { return c.i32(n, what); };
  CScratch& x = m.x;
  LATHE_ASSIGN_OR_RETURN(x.tmp_h, bf(T * H, "tmp_h"));
  LATHE_ASSIGN_OR_RETURN(x.act, bf(T * F, "act"));
  LATHE_ASSIGN_OR_RETURN(x.d_act, bf(T * F, "d_act"));
  LATHE_ASSIGN_OR_RETURN(x.d_xn, bf(T * H, "d_xn"));
  LATHE_ASSIGN_OR_RETURN(x.d_attn, bf(T * qd, "d_attn"));
  LATHE_ASSIGN_OR_RETURN(x.dq, bf(T * qd, "dq"));
  LATHE_ASSIGN_OR_RETURN(x.dk, bf(T * kvd, "dk"));
  LATHE_ASSIGN_OR_RETURN(x.dv, bf(T * kvd, "dv"));
  LATHE_ASSIGN_OR_RETURN(x.dh_bf, bf(T * H, "dh bf16"));
  LATHE_ASSIGN_OR_RETURN(x.xf, bf(T * H, "final norm out"));
  LATHE_ASSIGN_OR_RETURN(x.d_xf, bf(T * H, "d final norm out"));
  LATHE_ASSIGN_OR_RETURN(x.du, bf(T * 4 * r, "LoRA du"));
  const int64_t widest = std::max({H, F, qd});
  LATHE_ASSIGN_OR_RETURN(x.lora_f32, f32(std::max(T * 4 * r, widest * 2 * r), "LoRA partial products"));
  LATHE_ASSIGN_OR_RETURN(x.ones8, bf(T * 8, "bias ones"));
  LATHE_ASSIGN_OR_RETURN(x.dh, f32(T * H, "dh"));
  LATHE_ASSIGN_OR_RETURN(x.rstd_f, f32(T, "final rstd"));
  if (s.qk_norm) {
    LATHE_ASSIGN_OR_RETURN(x.dqk, f32(T * qd, "q/k norm grad"));
  }
  LATHE_ASSIGN_OR_RETURN(x.cos, f32(T * hd / 2, "rope cos"));
  LATHE_ASSIGN_OR_RETURN(x.sin, f32(T * hd / 2, "rope sin"));
  LATHE_ASSIGN_OR_RETURN(x.inv_freq, f32(hd / 2, "inv_freq"));
  LATHE_ASSIGN_OR_RETURN(x.ce_ws, alloc(cuda::cross_entropy_workspace_bytes(s.vocab, 0), "cross-entropy workspace"));
  LATHE_ASSIGN_OR_RETURN(x.attn_ws, alloc(cuda::attention_varlen_backward_workspace_bytes(T, int(s.n_head)),
                                          "attention workspace"));
  LATHE_ASSIGN_OR_RETURN(x.tokens, i32(T, "tokens"));
  LATHE_ASSIGN_OR_RETURN(x.targets, i32(T, "targets"));
  LATHE_ASSIGN_OR_RETURN(x.positions, i32(T, "positions"));
  LATHE_ASSIGN_OR_RETURN(x.cu_seqlens, i32(T + 1, "cu_seqlens"));
  return Status::ok();
}

// Hands out the arena: alloc(bytes, what) -> Result<void*>.
template <class Alloc>
Status carve(CudaModelImpl& m, Alloc&& alloc) {
  Carver<Alloc> c{alloc};
  LATHE_TRY(carve_weights(m, c));
  LATHE_TRY(carve_acts(m, c));
  return carve_scratch(m, c, alloc);
}

// Shapes of the projections, the LoRA table and the name map (no memory yet).
void lay_out(CudaModelImpl& m) {
  const CudaModelShape& s = m.s;
  const int64_t H = s.hidden, hd = s.head_dim, F = s.inter, r = m.o.lora_r;
  const int64_t out[kCnumProj] = {s.n_head * hd, s.n_kv * hd, s.n_kv * hd, H, F, F, H};
  const int64_t in[kCnumProj] = {H, H, H, s.n_head * hd, H, H, F};
  m.blocks.assign(size_t(s.n_layer), {});
  int64_t total = 0;
  for (int64_t l = 0; l < s.n_layer; ++l)
    for (int j = 0; j < kCnumProj; ++j) {
      CLinear& L = m.blocks[size_t(l)].proj[size_t(j)];
      L.out = out[j];
      L.in = in[j];
      if (!m.o.targets[size_t(j)]) continue;
      L.lora = int(m.loras.size());
      m.loras.push_back({.r = r, .in = L.in, .out = L.out});
      const std::string key = "base_model.model.model.layers." + std::to_string(l) + "." + kProjPath[j] + ".lora_";
      m.table.push_back({key + "A.weight", total, {r, L.in}});
      total += aligned(r * L.in);
      m.table.push_back({key + "B.weight", total, {L.out, r}});
      total += aligned(L.out * r);
    }
  m.n_flat = total;
  m.hs.assign(size_t(s.n_layer + 1), nullptr);
  m.acts.assign(m.o.activations_checkpoint ? 1 : size_t(s.n_layer), {});
}

void name_base(CudaModelImpl& m) {
  const CudaModelShape& s = m.s;
  m.base["model.embed_tokens.weight"] = {m.embed, s.vocab * s.hidden};
  if (!s.tied) m.base["lm_head.weight"] = {m.lm_head, s.vocab * s.hidden};
  m.base["model.norm.weight"] = {m.final_norm, s.hidden};
  for (int64_t l = 0; l < s.n_layer; ++l) {
    CBlock& b = m.blocks[size_t(l)];
    m.base[layer_name(l, "input_layernorm.weight")] = {b.attn_norm, s.hidden};
    m.base[layer_name(l, "post_attention_layernorm.weight")] = {b.mlp_norm, s.hidden};
    if (s.qk_norm) {
      m.base[layer_name(l, "self_attn.q_norm.weight")] = {b.q_norm, s.head_dim};
      m.base[layer_name(l, "self_attn.k_norm.weight")] = {b.k_norm, s.head_dim};
    }
    for (int j = 0; j < kCnumProj; ++j) {
      CLinear& L = b.proj[size_t(j)];
      m.base[layer_name(l, std::string(kProjPath[j]) + ".weight")] = {L.w, L.out * L.in};
      if (L.bias8) m.base[layer_name(l, std::string(kProjPath[j]) + ".bias")] = {L.bias8, L.out};
    }
  }
}

// bf16 copies of host f32 values, converted and sent a chunk at a time.
Status upload_bf16(cuda::CudaContext& ctx, bf16p dst, const float* src, int64_t n) {
  constexpr int64_t kChunk = int64_t{1} << 24;
  std::vector<uint16_t> buf(size_t(std::min(n, kChunk)));
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = std::min(kChunk, n - i);
    parallel_for(len, 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) buf[size_t(k)] = f32_to_bf16(src[i + k]);
    });
    LATHE_TRY(cuda::copy_to_device(ctx, dst + i, buf.data(), size_t(len) * 2));
  }
  return Status::ok();
}

}  // namespace

CudaTrainableModel::CudaTrainableModel(std::unique_ptr<CudaModelImpl> impl) : impl_(std::move(impl)) {}
CudaTrainableModel::~CudaTrainableModel() = default;

Result<std::unique_ptr<CudaTrainableModel>> CudaTrainableModel::create(const CudaModelShape& shape,
                                                                       const CudaTrainOptions& options) {
  LATHE_TRY(check_shape(shape, options));
  auto m = std::make_unique<CudaModelImpl>();
  m->s = shape;
  m->o = options;
  lay_out(*m);
  size_t total = 0;
  LATHE_TRY(carve(*m, [&](size_t bytes, const char*) -> Result<void*> {
    total += (bytes + cuda::ArenaPlan::kAlign - 1) / cuda::ArenaPlan::kAlign * cuda::ArenaPlan::kAlign;
    return static_cast<void*>(nullptr);
  }));
  LATHE_ASSIGN_OR_RETURN(m->ctx, cuda::CudaContext::create(options.device));
  LATHE_ASSIGN_OR_RETURN(m->arena, cuda::DeviceArena::create(options.device, total));
  LATHE_TRY(carve(*m, [&](size_t bytes, const char* what) { return m->arena.alloc(bytes, what); }));
  LATHE_TRY(cuda::fill_zero(m->ctx, m->arena.base(), total));
  name_base(*m);
  std::vector<cuda::LoraSplitFactor> factors;
  for (size_t k = 0; k < m->loras.size(); ++k) {
    CLora& a = m->loras[k];
    const int64_t oa = m->table[2 * k].offset, ob = m->table[2 * k + 1].offset;
    a.a = m->params + oa, a.da = m->grads + oa, a.a4 = m->split + 4 * oa;
    a.b = m->params + ob, a.db = m->grads + ob, a.b4 = m->split + 4 * ob;
    factors.push_back({.src = oa, .dst = 4 * oa, .rows = a.r, .cols = a.in, .by_row = 0});
    factors.push_back({.src = ob, .dst = 4 * ob, .rows = a.out, .cols = a.r, .by_row = 1});
    m->max_factor_numel = std::max({m->max_factor_numel, a.r * a.in, a.out * a.r});
  }
  LATHE_TRY(cuda::copy_to_device(m->ctx, m->split_table, factors.data(), factors.size() * sizeof(factors[0])));
  std::vector<uint16_t> ones(size_t(options.max_tokens * 8), 0);
  for (int64_t t = 0; t < options.max_tokens; ++t) ones[size_t(t * 8)] = f32_to_bf16(1.0f);
  LATHE_TRY(cuda::copy_to_device(m->ctx, m->x.ones8, ones.data(), ones.size() * 2));
  LATHE_TRY(cuda::copy_to_device(m->ctx, m->x.inv_freq, shape.inv_freq.data(), shape.inv_freq.size() * 4));
  std::vector<cuda::CudaAdamWParam> ps;
  for (const ParamInfo& p : m->table)
    ps.push_back({.name = p.name, .param = m->params + p.offset, .grad = m->grads + p.offset,
                  .working = nullptr, .n = p.numel(), .decay = true});
  LATHE_ASSIGN_OR_RETURN(cuda::CudaAdamW opt, cuda::CudaAdamW::create(m->ctx, options.adamw, std::move(ps)));
  m->adamw.emplace(std::move(opt));
  LATHE_TRY(m->ctx.synchronize());
  return std::unique_ptr<CudaTrainableModel>(new CudaTrainableModel(std::move(m)));
}

Status CudaTrainableModel::upload_base(const std::string& name, std::span<const float> values) {
  auto it = impl_->base.find(name);
  if (it == impl_->base.end()) return not_found("cuda trainer: no base tensor '", name, "'");
  if (int64_t(values.size()) != it->second.second)
    return invalid_argument("cuda trainer: tensor '", name, "' has ", values.size(), " values, expected ",
                            it->second.second);
  return upload_bf16(impl_->ctx, it->second.first, values.data(), int64_t(values.size()));
}

Status CudaTrainableModel::upload_base_bf16(const std::string& name, std::span<const uint16_t> values) {
  auto it = impl_->base.find(name);
  if (it == impl_->base.end()) return not_found("cuda trainer: no base tensor '", name, "'");
  if (int64_t(values.size()) != it->second.second)
    return invalid_argument("cuda trainer: tensor '", name, "' has ", values.size(), " values, expected ",
                            it->second.second);
  return cuda::copy_to_device(impl_->ctx, it->second.first, values.data(), values.size_bytes());
}

std::vector<std::string> CudaTrainableModel::base_names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : impl_->base) out.push_back(name);
  return out;
}

Status CudaTrainableModel::fill_random(uint64_t seed, float std) {
  CudaModelImpl& m = *impl_;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, std);
  // One pool of random bf16 values, reused from a random start for each tensor.
  constexpr int64_t kPool = int64_t{1} << 22;
  std::vector<uint16_t> pool(size_t(2 * kPool));
  for (uint16_t& v : pool) v = f32_to_bf16(dist(rng));
  std::vector<uint16_t> ones(size_t(std::max(m.s.hidden, m.s.head_dim)), f32_to_bf16(1.0f));
  for (const auto& [name, t] : m.base) {
    const bool is_norm = name.find("norm") != std::string::npos;
    if (name.ends_with(".bias")) continue;  // stays zero
    if (is_norm) {
      LATHE_TRY(cuda::copy_to_device(m.ctx, t.first, ones.data(), size_t(t.second) * 2));
      continue;
    }
    for (int64_t i = 0; i < t.second; i += kPool) {
      const int64_t len = std::min(kPool, t.second - i);
      const size_t start = size_t(rng() % uint64_t(kPool));
      LATHE_TRY(cuda::copy_to_device(m.ctx, t.first + i, pool.data() + start, size_t(len) * 2));
    }
  }
  std::vector<float> host(size_t(m.n_flat), 0.0f);
  for (size_t k = 0; k < m.table.size(); k += 2)  // A random, B zero
    for (int64_t i = 0; i < m.table[k].numel(); ++i) host[size_t(m.table[k].offset + i)] = dist(rng);
  return upload_params(host);
}

const std::vector<ParamInfo>& CudaTrainableModel::param_table() const { return impl_->table; }
int64_t CudaTrainableModel::n_params() const { return impl_->n_flat; }

Status CudaTrainableModel::upload_params(std::span<const float> host) {
  CudaModelImpl& m = *impl_;
  if (int64_t(host.size()) != m.n_flat)
    return invalid_argument("cuda trainer: ", host.size(), " parameters given, the model has ", m.n_flat);
  if (m.n_flat == 0) return Status::ok();
  LATHE_TRY(cuda::copy_to_device(m.ctx, m.params, host.data(), host.size_bytes()));
  return m.refresh_split();
}

Status CudaModelImpl::refresh_split() {
  return cuda::lora_split_weights(ctx, {.factors = split_table, .n_factors = int(loras.size() * 2),
                                        .max_numel = max_factor_numel, .src = params, .dst = split});
}

Status CudaTrainableModel::download_params(std::span<float> host) {
  if (int64_t(host.size()) != impl_->n_flat)
    return invalid_argument("cuda trainer: room for ", host.size(), " parameters, the model has ", impl_->n_flat);
  return cuda::copy_to_host(impl_->ctx, host.data(), impl_->params, host.size_bytes());
}

Status CudaTrainableModel::download_grads(std::span<float> host) {
  if (int64_t(host.size()) != impl_->n_flat)
    return invalid_argument("cuda trainer: room for ", host.size(), " gradients, the model has ", impl_->n_flat);
  return cuda::copy_to_host(impl_->ctx, host.data(), impl_->grads, host.size_bytes());
}

Result<PassLoss> CudaTrainableModel::forward_backward(const MicroBatch& mb, float loss_scale) {
  return impl_->run(mb, loss_scale, true);
}
Result<PassLoss> CudaTrainableModel::forward_loss(const MicroBatch& mb) { return impl_->run(mb, 1.0f, false); }

Status CudaTrainableModel::zero_grads() {
  return cuda::fill_zero(impl_->ctx, impl_->grads, size_t(std::max<int64_t>(impl_->n_flat, 1)) * 4);
}
Result<double> CudaTrainableModel::clip_grad_norm(double max_norm) {
  LATHE_TRY(impl_->phase(kPhOptimizer));
  return impl_->adamw->clip_grad_norm(impl_->ctx, max_norm);
}
Status CudaTrainableModel::adamw_step(double lr) {
  LATHE_TRY(impl_->phase(kPhOptimizer));
  LATHE_TRY(impl_->adamw->step(impl_->ctx, lr));
  return impl_->refresh_split();
}

Status CudaTrainableModel::set_phase_timing(bool on) {
  if (!on) {
    impl_->timer.reset();
    return Status::ok();
  }
  LATHE_ASSIGN_OR_RETURN(cuda::PhaseTimer t,
                         cuda::PhaseTimer::create(std::vector<std::string>(kCudaPhaseNames, kCudaPhaseNames + kPhNum)));
  impl_->timer.emplace(std::move(t));
  return Status::ok();
}

Result<std::vector<std::pair<std::string, double>>> CudaTrainableModel::phase_times_ms() {
  if (!impl_->timer) return invalid_argument("cuda trainer: phase timing is off (set_phase_timing(true) first)");
  LATHE_ASSIGN_OR_RETURN(std::vector<double> ms, impl_->timer->totals_ms(impl_->ctx));
  std::vector<std::pair<std::string, double>> out;
  for (size_t i = 0; i < ms.size(); ++i) out.emplace_back(impl_->timer->names()[i], ms[i]);
  impl_->timer->reset();
  return out;
}
cuda::CudaAdamW& CudaTrainableModel::optimizer() { return *impl_->adamw; }
cuda::CudaContext& CudaTrainableModel::context() { return impl_->ctx; }
int64_t CudaTrainableModel::arena_bytes() const { return int64_t(impl_->arena.capacity()); }

}  // namespace lathe
