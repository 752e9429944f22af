// Full-parameter training on the GPU (CudaTrainOptions::full_sft): every
// weight has an f32 master and an f32 gradient, in one flat buffer laid out
// as TrainableModel's full-SFT table (transformers' names, in its order,
// 16-float aligned), so parameters, gradients, AdamW moments, checkpoints
// and the export all go through the host's table unchanged. The forward
// reads the bf16 copies the LoRA path reads as its frozen base; AdamW
// rewrites them from the masters in its update (CudaAdamWParam::working).
//
// Gradients, added into the f32 buffer by the backward:
//   projections  dW += dyᵀ·x per member (its columns of the group's dy),
//                an f32-output GEMM with beta 1 run before the group's dx
//                GEMM (down's dx overwrites its own input);
//   biases       column sums of dy;
//   norms        Σ_rows dy ⊙ h·rstd, before the norm's backward (the q/k
//                norms' backward writes over its dy);
//   LM head      cross_entropy's d_w (tied: into the embedding's);
//   embedding    the f32 gradient of the layer-0 input, summed per token.
// Bias, norm and embedding sums run in a fixed order (backends/cuda/
// sft_ops.h), and the GEMMs are deterministic, so one batch gives the same
// bits every time: a resumed run repeats an uninterrupted one.
// Memory per parameter: bf16 copy 2 + master 4 + gradient 4 + moments 8 =
// 18 bytes; Llama-8B's 8.0 B parameters need ~135 GiB before activations,
// which one H200 does not hold: create() refuses with the number.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <string>

#include "backends/cuda/device.h"
#include "backends/cuda/sft_ops.h"
#include "train/cuda_model_impl.h"

namespace lathe {

namespace {

std::array<int64_t, kCnumProj> proj_out(const CudaModelShape& s) {
  const int64_t q = s.n_head * s.head_dim, kv = s.n_kv * s.head_dim;
  return {q, kv, kv, s.hidden, s.inter, s.inter, s.hidden};
}
std::array<int64_t, kCnumProj> proj_in(const CudaModelShape& s) {
  return {s.hidden, s.hidden, s.hidden, s.n_head * s.head_dim, s.hidden, s.hidden, s.inter};
}

// Norm weights and biases: torch's usual no-decay group (train/adamw.h's
// is_no_decay_param; this file links without the host optimizer).
bool no_decay_name(const std::string& name) {
  return name.ends_with(".bias") || name == "bias" || name.find("norm") != std::string::npos;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", bytes / double(int64_t{1} << 30));
  return buf;
}

}  // namespace

void sft_lay_out(CudaModelImpl& m) {
  const CudaModelShape& s = m.s;
  const auto out = proj_out(s), in = proj_in(s);
  int64_t total = 0;
  auto add = [&](const std::string& name, Shape shape) {
    m.table.push_back({name, total, shape});
    total += aligned_floats(shape.numel());
  };
  auto proj = [&](int64_t l, int j) {
    add(names::layer(l, std::string(names::kProjPaths[j]) + ".weight"), {out[size_t(j)], in[size_t(j)]});
    if (s.qkv_bias && kGroupOf[j] == kGqkv)
      add(names::layer(l, std::string(names::kProjPaths[j]) + ".bias"), {out[size_t(j)]});
  };
  m.table.clear();
  add("model.embed_tokens.weight", {s.vocab, s.hidden});
  for (int64_t l = 0; l < s.n_layer; ++l) {
    add(names::layer(l, "input_layernorm.weight"), {s.hidden});
    for (int j = kCq; j <= kCv; ++j) proj(l, j);
    if (s.qk_norm) {
      add(names::layer(l, "self_attn.q_norm.weight"), {s.head_dim});
      add(names::layer(l, "self_attn.k_norm.weight"), {s.head_dim});
    }
    proj(l, kCo);
    add(names::layer(l, "post_attention_layernorm.weight"), {s.hidden});
    for (int j = kCgate; j <= kCdown; ++j) proj(l, j);
  }
  add("model.norm.weight", {s.hidden});
  if (!s.tied) add("lm_head.weight", {s.vocab, s.hidden});
  m.n_flat = total;
}

int64_t sft_column_ws_floats(const CudaModelImpl& m) {
  const CudaModelShape& s = m.s;
  const int64_t T = m.o.max_tokens;
  int64_t most = cuda::column_grad_workspace_floats(T, std::max(s.hidden, s.n_head * s.head_dim));
  if (s.qk_norm) most = std::max(most, cuda::column_grad_workspace_floats(T * s.n_head, s.head_dim));
  return most;
}

Status sft_check_fits(const CudaModelImpl& m, size_t arena_bytes) {
  if (!m.o.full_sft) return Status::ok();
  LATHE_ASSIGN_OR_RETURN(cuda::DeviceInfo info, cuda::device_info(m.o.device));
  const double need = double(arena_bytes) + 8.0 * double(m.n_flat) + double(cuda::CudaContext::kDefaultWorkspaceBytes);
  if (need <= double(info.total_bytes)) return Status::ok();
  return unsupported("--device cuda: full SFT of this model needs ", gib(need), " GiB of device memory (",
                     gib(18.0 * double(m.n_flat)), " GiB for ", m.n_flat,
                     " parameters: bf16 copies, f32 masters, gradients and AdamW moments; the rest activations for ",
                     m.o.max_tokens, " tokens), and cuda:", m.o.device, " (", info.name, ") has ",
                     gib(double(info.total_bytes)),
                     " GiB; train LoRA on it (peft.peft_scheme=lora) or use --device cpu");
}

Status CudaModelImpl::sft_bind() {
  std::map<std::string, float*> grad_of;
  sft.copies.clear();
  for (const ParamInfo& p : table) {
    auto it = base.find(p.name);  // without LoRA every base tensor is dense (row stride = its columns)
    if (it == base.end() || it->second.numel() != p.numel() || it->second.ld != it->second.cols)
      return error(StatusCode::kInternal, "cuda trainer: full SFT parameter ", p.name, " has no dense bf16 copy");
    sft.copies.push_back({params + p.offset, it->second.p, p.numel()});
    grad_of[p.name] = grads + p.offset;
  }
  auto g = [&](const std::string& name) -> float* {
    auto it = grad_of.find(name);
    return it == grad_of.end() ? nullptr : it->second;
  };
  sft.embed = g("model.embed_tokens.weight");
  sft.lm_head = s.tied ? sft.embed : g("lm_head.weight");
  sft.final_norm = g("model.norm.weight");
  sft.blocks.assign(size_t(s.n_layer), {});
  for (int64_t l = 0; l < s.n_layer; ++l) {
    CSftBlock& b = sft.blocks[size_t(l)];
    b.attn_norm = g(names::layer(l, "input_layernorm.weight"));
    b.mlp_norm = g(names::layer(l, "post_attention_layernorm.weight"));
    b.q_norm = g(names::layer(l, "self_attn.q_norm.weight"));
    b.k_norm = g(names::layer(l, "self_attn.k_norm.weight"));
    for (int j = 0; j < kCnumProj; ++j) {
      b.dw[size_t(j)] = g(names::layer(l, std::string(names::kProjPaths[j]) + ".weight"));
      b.db[size_t(j)] = g(names::layer(l, std::string(names::kProjPaths[j]) + ".bias"));
    }
  }
  return Status::ok();
}

std::vector<cuda::CudaAdamWParam> CudaModelImpl::adamw_params() const {
  std::vector<cuda::CudaAdamWParam> ps;
  for (size_t i = 0; i < table.size(); ++i) {
    const ParamInfo& p = table[i];
    const bool decay = !(o.adamw.no_decay_norm_and_bias && no_decay_name(p.name));
    ps.push_back({.name = p.name, .param = params + p.offset, .grad = grads + p.offset,
                  .working = o.full_sft ? sft.copies[i].bf16 : nullptr, .n = p.numel(), .decay = decay});
  }
  return ps;
}

Status CudaModelImpl::sft_refresh() {
  for (const CSftCopy& c : sft.copies) LATHE_TRY(cuda::f32_to_bf16(ctx, c.master, c.bf16, c.n));
  return Status::ok();
}

Status CudaModelImpl::sft_masters_from_copies() {
  for (const CSftCopy& c : sft.copies) LATHE_TRY(cuda::bf16_to_f32(ctx, c.bf16, c.master, c.n));
  return Status::ok();
}

// dW_j += dy_jᵀ·x for each member j of group g (dy_j: its columns of the
// group's dy, rows ld_dy apart; x at column x_col of x_ext, rows ldx apart:
// without LoRA both are dense), and the bias's column sums.
Status CudaModelImpl::sft_group_grads(int64_t l, int g, const bf16p xe, const bf16p dy, int64_t ld_dy, int64_t n) {
  const CGroup& G = blocks[size_t(l)].g[size_t(g)];
  const CSftBlock& b = sft.blocks[size_t(l)];
  const auto out = proj_out(s);
  LATHE_TRY(phase(kPhGemmBwd));
  int64_t col = 0;
  for (int j = 0; j < kCnumProj; ++j) {
    if (kGroupOf[j] != g) continue;
    const int64_t oj = out[size_t(j)];
    LATHE_TRY(cuda::gemm(ctx, {.a = dy + col, .b = xe + G.x_col, .c = b.dw[size_t(j)], .m = oj, .n = G.in, .k = n,
                               .trans_a = true, .c_dtype = DType::F32, .beta = 1.0f, .lda = ld_dy, .ldb = G.ldx}));
    if (b.db[size_t(j)])
      LATHE_TRY(cuda::column_grad(ctx, {.dy = dy + col, .ld_dy = ld_dy, .out = b.db[size_t(j)],
                                        .workspace = sft.col_ws, .rows = n, .cols = oj}));
    col += oj;
  }
  return Status::ok();
}

Status CudaModelImpl::sft_norm_grad(float* dw, const bf16p dy, const bf16p h, const float* rstd, int64_t rows,
                                    int64_t dim) {
  if (!o.full_sft || !dw) return Status::ok();
  return cuda::column_grad(ctx, {.dy = dy, .h = h, .rstd = rstd, .out = dw, .workspace = sft.col_ws, .rows = rows,
                                 .cols = dim});
}

// The batch's tokens sorted (stable: positions increase within a token),
// uploaded as [distinct tokens | starts | positions], then one sum per
// distinct token of the f32 gradient of the embedding's output (dh).
Status CudaModelImpl::sft_embedding_grad(const MicroBatch& mb) {
  const int64_t n = mb.n_tokens();
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return mb.input_ids[size_t(a)] < mb.input_ids[size_t(b)]; });
  std::vector<int32_t>& idx = sft.host_index;
  idx.clear();
  std::vector<int32_t> starts;
  for (int64_t k = 0; k < n; ++k) {
    const int32_t tok = mb.input_ids[size_t(order[size_t(k)])];
    if (k == 0 || tok != idx.back()) {
      idx.push_back(tok);
      starts.push_back(int32_t(k));
    }
  }
  const int64_t u = int64_t(idx.size());
  starts.push_back(int32_t(n));
  idx.insert(idx.end(), starts.begin(), starts.end());
  idx.insert(idx.end(), order.begin(), order.end());
  LATHE_TRY(cuda::copy_to_device(ctx, sft.emb_index, idx.data(), idx.size() * 4));
  return cuda::embedding_grad(ctx, {.d_out = x.dh, .tokens = sft.emb_index, .starts = sft.emb_index + u,
                                    .positions = sft.emb_index + 2 * u + 1, .d_table = sft.embed, .n_unique = u,
                                    .dim = s.hidden, .vocab = s.vocab});
}

}  // namespace lathe
