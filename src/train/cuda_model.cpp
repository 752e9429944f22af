// CudaTrainableModel set-up: checking the shape, carving the one device
// arena (the same carve runs twice: once to size the arena, once to hand out
// its pointers), the LoRA table (TrainableModel's layout: per layer, per
// targeted projection, A then B, 16-float aligned), the fused projections
// (a member's weight is a row block of its group's extended weight, rows
// ldw apart: uploads by transformers' name land there; the LoRA factors'
// 4-term copies are written beside them, cuda_model_impl.h), random init
// for benchmarks, and the optimizer. The
// recompute mode decides which activations are per layer and which are one
// shared copy that the backward recomputes.
#include "train/cuda_model.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>

#include "backends/cuda/attention.h"
#include "core/dtype.h"
#include "core/env.h"
#include "core/parallel.h"
#include "train/cuda_model_impl.h"

namespace lathe {

namespace {

constexpr int64_t kDropScratchFloats = int64_t{1} << 24;  // each of LoRA dropout's two buffers
const auto& kProjPath = names::kProjPaths;
static_assert(std::size(names::kProjPaths) == kCnumProj);


Status check_shape(const CudaModelShape& s, const CudaTrainOptions& o) {
  if (s.vocab <= 0 || s.hidden <= 0 || s.inter <= 0 || s.n_layer <= 0 || s.n_head <= 0 || s.n_kv <= 0)
    return invalid_argument("cuda trainer: model sizes must be positive");
  if (s.head_dim != 32 && s.head_dim != 64 && s.head_dim != 128)
    return unsupported("cuda trainer: head_dim ", s.head_dim, " (the GPU attention kernels take 32, 64 or 128)");
  if (s.n_head % s.n_kv != 0)
    return invalid_argument("cuda trainer: ", s.n_head, " heads are not a multiple of ", s.n_kv, " KV heads");
  if (s.hidden % 8 != 0 || s.inter % 8 != 0)
    return unsupported("cuda trainer: hidden_size and intermediate_size must be multiples of 8");
  if (int64_t(s.inv_freq.size()) != s.head_dim / 2)
    return invalid_argument("cuda trainer: ", s.inv_freq.size(), " RoPE frequencies for head_dim ", s.head_dim);
  if (o.max_tokens <= 0) return invalid_argument("cuda trainer: max_tokens must be positive");
  if (o.lora_r <= 0) return invalid_argument("cuda trainer: LoRA r must be positive");
  if (!(o.lora_dropout >= 0.0f && o.lora_dropout < 1.0f))
    return invalid_argument("cuda trainer: LoRA dropout ", o.lora_dropout, " must be in [0, 1)");
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
  if (!m.host_embed) {
    LATHE_ASSIGN_OR_RETURN(m.embed, bf(s.vocab * H, "embedding"));
  }
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
    for (int g = 0; g < kGnum; ++g) {
      CGroup& G = b.g[size_t(g)];
      LATHE_ASSIGN_OR_RETURN(bf16p ext, bf(G.ext_numel(), "projection (with its LoRA copies)"));
      G.w = ext ? ext + G.x_col : nullptr;
      if (s.qkv_bias && g == kGqkv) {
        LATHE_ASSIGN_OR_RETURN(G.bias, bf(G.out, "bias"));
      }
    }
  }
  // LoRA: fp32 masters and grads (the 4-term copies live in the groups' w).
  LATHE_ASSIGN_OR_RETURN(m.params, f32(std::max<int64_t>(m.n_flat, 1), "LoRA params"));
  LATHE_ASSIGN_OR_RETURN(m.grads, f32(std::max<int64_t>(m.n_flat, 1), "LoRA grads"));
  LATHE_ASSIGN_OR_RETURN(void* table, c.alloc(std::max<size_t>(m.table.size(), 1) * sizeof(cuda::LoraSplitFactor),
                                              "LoRA split table"));
  m.split_table = static_cast<cuda::LoraSplitFactor*>(table);
  return Status::ok();
}

// Layer inputs and what the backward reads of each layer: a buffer kept per
// layer, or (recomputed in the backward) one copy all layers share. The
// LoRA u of a group lives in its input's row (x_ext), so it is kept or
// recomputed with that input.
//   none:      everything per layer (silu(gate)·up too);
//   selective: per layer the attention output (with o's u) and lse and
//              [gate | up]; shared the norms' outputs (with the u of q|k|v
//              and gate|up), q/k/v and h_mid (the q|k|v and o GEMMs rerun)
//              and silu(gate)·up (the scratch's, with down's u; SwiGLU's
//              backward gives it back, cuda_model_pass.cpp) — except in
//              the first keep_layers layers, which keep q/k/v and h_mid as
//              well and rerun only the two norms and the u in their rows;
//   full:      everything shared (each layer's forward reruns).
template <class C>
Status carve_acts(CudaModelImpl& m, C& c) {
  const CudaModelShape& s = m.s;
  const int64_t T = m.o.max_tokens, H = s.hidden, hd = s.head_dim;
  const int64_t qd = s.n_head * hd, kvd = s.n_kv * hd;
  const bool all = m.o.recompute == CudaRecompute::kNone;
  const bool mid = all || m.o.recompute == CudaRecompute::kSelective;
  for (bf16p& h : m.hs) {
    LATHE_ASSIGN_OR_RETURN(h, c.bf(T * H, "layer input"));
  }
  CActs shared;
  std::set<std::string> made;  // the shared copies handed out (pointers are null while sizing)
  const bool offload = m.off.count() > 0;
  for (int i = 0; i < 2; ++i) {
    m.off.stage[i] = nullptr;
    if (offload) {
      LATHE_ASSIGN_OR_RETURN(m.off.stage[i], c.bf(T * m.ld_gu, "gate|up staging (host offload)"));
    }
  }
  for (size_t l = 0; l < m.acts.size(); ++l) {
    CActs& a = m.acts[l];
    const bool layer = all || int64_t(l) < m.keep_layers;  // keeps what selective reruns GEMMs for
    auto bf = [&](bf16p CActs::*field, bool keep, int64_t n, const char* what) -> Status {
      if (!keep && !made.insert(what).second) {
        a.*field = shared.*field;
        return Status::ok();
      }
      LATHE_ASSIGN_OR_RETURN(a.*field, c.bf(n, what));
      if (!keep) shared.*field = a.*field;
      return Status::ok();
    };
    auto f32 = [&](float* CActs::*field, bool keep, int64_t n, const char* what) -> Status {
      if (!keep && !made.insert(what).second) {
        a.*field = shared.*field;
        return Status::ok();
      }
      LATHE_ASSIGN_OR_RETURN(a.*field, c.f32(n, what));
      if (!keep) shared.*field = a.*field;
      return Status::ok();
    };
    LATHE_TRY(bf(&CActs::xn1, all, T * m.group(kGqkv).ldx, "xn1"));
    LATHE_TRY(f32(&CActs::rstd1, all, T, "rstd1"));
    if (s.qk_norm) {
      LATHE_TRY(bf(&CActs::q_raw, layer, T * qd, "q_raw"));
      LATHE_TRY(bf(&CActs::k_raw, layer, T * kvd, "k_raw"));
      LATHE_TRY(f32(&CActs::q_rstd, layer, T * s.n_head, "q_rstd"));
      LATHE_TRY(f32(&CActs::k_rstd, layer, T * s.n_kv, "k_rstd"));
    }
    LATHE_TRY(bf(&CActs::q, layer, T * qd, "q"));
    LATHE_TRY(bf(&CActs::k, layer, T * kvd, "k"));
    LATHE_TRY(bf(&CActs::v, layer, T * kvd, "v"));
    LATHE_TRY(bf(&CActs::attn, mid, T * m.group(kGo).ldx, "attention out"));
    LATHE_TRY(f32(&CActs::lse, mid, T * s.n_head, "lse"));
    LATHE_TRY(bf(&CActs::h_mid, layer, T * H, "h_mid"));
    LATHE_TRY(bf(&CActs::xn2, all, T * m.group(kGgu).ldx, "xn2"));
    LATHE_TRY(f32(&CActs::rstd2, all, T, "rstd2"));
    if (m.off.of(int64_t(l)) >= 0) {
      a.gu = m.off.stage[m.off.of(int64_t(l))];  // in pinned host memory between the forward and the backward
    } else {
      LATHE_TRY(bf(&CActs::gu, mid, T * m.ld_gu, "gate|up"));
    }
    a.act = nullptr;  // per layer with none; else the scratch's (carve_scratch)
    if (all) {
      LATHE_ASSIGN_OR_RETURN(a.act, c.bf(T * m.group(kGdown).ldx, "silu(gate)·up"));
    }
  }
  return Status::ok();
}

// Offsets inside one arena block; the sizing pass (base null) hands out
// null pointers and only counts.
struct SubCarver {
  char* base = nullptr;
  size_t used = 0;
  template <class T>
  T* take(int64_t n) {
    const size_t at = used;
    used += (size_t(n) * sizeof(T) + cuda::ArenaPlan::kAlign - 1) / cuda::ArenaPlan::kAlign * cuda::ArenaPlan::kAlign;
    return base ? reinterpret_cast<T*>(base + at) : nullptr;
  }
};

// The scratch that is dead while the LM head runs (the layers' forward and
// backward buffers); the head's cross-entropy workspace overlays it. Inside,
// the backward's gradients of the attention output, q, k, v and the norms'
// outputs overlay act (silu(gate)·up, then its gradient), which is dead
// whenever they are live (at Llama-8B's sizes they fill it exactly):
//   act / d_act ........................... down's backward (d_act in act's
//                                           x_ext rows), SwiGLU's backward (act
//                                           back for down's LoRA gradients)
//   d_attn (at 0) | dq | dk | dv | d_xn ... o's and attention's backward, the q|k|v merge;
//                                           gate|up's and q|k|v's backward, then the norms'
// After a backward they hold layer 0's gradients; act does not.
void carve_layer_scratch(CudaModelImpl& m, SubCarver& c) {
  const CudaModelShape& s = m.s;
  const int64_t T = m.o.max_tokens, H = s.hidden, F = s.inter, hd = s.head_dim;
  const int64_t qd = s.n_head * hd, kvd = s.n_kv * hd, r = m.o.lora_r;
  CScratch& x = m.x;
  x.qkv = c.take<cuda::bf16_bits>(T * m.ld_qkv);
  x.tmp_h = c.take<cuda::bf16_bits>(T * H);
  x.act = c.take<cuda::bf16_bits>(T * std::max(m.group(kGdown).ldx, 2 * qd + 2 * kvd + H));
  x.d_attn = x.act;
  x.dq = x.act ? x.d_attn + T * qd : nullptr;
  x.dk = x.act ? x.dq + T * qd : nullptr;
  x.dv = x.act ? x.dk + T * kvd : nullptr;
  x.d_xn = x.act ? x.dv + T * kvd : nullptr;
  x.dh_bf = c.take<cuda::bf16_bits>(T * m.ld_dh_bf);
  const int64_t lora_floats = std::max({T * 3 * 4 * r, std::max({H, F, qd}) * 2 * r, m.lora_batch_floats(T)});
  x.lora_f32 = c.take<float>(lora_floats);
  // The LoRA side stream's, as large: it runs only in the backward, between
  // recomputations (cuda_model_overlap.cpp), where tmp_h is dead; its own
  // buffer when tmp_h is too small.
  x.lora_side_f32 = nullptr;
  if (m.overlap_mode > 0)
    x.lora_side_f32 = lora_floats * 4 <= T * H * 2 ? reinterpret_cast<float*>(x.tmp_h) : c.take<float>(lora_floats);
  x.dh = c.take<float>(T * H);
  // LoRA dropout only: rows of a projection's input gradient summed in f32
  // and of one member's f32 du·A (before that, its masked input in bf16), as
  // wide as the widest input carrying LoRA and as many rows as 64 MiB of
  // f32 hold (the dropout path runs over chunks of tokens). Nothing without
  // dropout.
  const int64_t drop_in = m.dropout() ? m.max_lora_in() : 0;
  m.drop_cap = drop_in ? std::clamp<int64_t>(kDropScratchFloats / drop_in, 1, T) : 0;
  m.drop_floats = m.drop_cap * drop_in;
  m.drop_rows = 0;
  x.drop_acc = c.take<float>(m.drop_floats);
  x.drop_tmp = c.take<float>(m.drop_floats);
  if (!drop_in) x.drop_acc = x.drop_tmp = nullptr;
}

// Buffers every layer reuses, workspaces and the batch's inputs.
template <class C, class Alloc>
Status carve_scratch(CudaModelImpl& m, C& c, Alloc& alloc) {
  const CudaModelShape& s = m.s;
  const int64_t T = m.o.max_tokens, H = s.hidden, hd = s.head_dim;
  auto bf = [&](int64_t n, const char* what) { return c.bf(n, what); };
  auto f32 = [&](int64_t n, const char* what) { return c.f32(n, what); };
  auto i32 = [&](int64_t n, const char* what) { return c.i32(n, what); };
  CScratch& x = m.x;
  SubCarver sizing;
  carve_layer_scratch(m, sizing);
  const size_t ce_bytes = cuda::cross_entropy_workspace_bytes(s.vocab, 0);
  LATHE_ASSIGN_OR_RETURN(void* shared, alloc(std::max(sizing.used, ce_bytes), "layer scratch / cross-entropy workspace"));
  SubCarver sub{.base = static_cast<char*>(shared)};
  carve_layer_scratch(m, sub);
  x.ce_ws = shared;
  for (CActs& a : m.acts)
    if (!a.act) a.act = x.act;  // not kept: the backward recomputes it into the scratch
  LATHE_ASSIGN_OR_RETURN(x.xf, bf(T * H, "final norm out"));
  LATHE_ASSIGN_OR_RETURN(x.d_xf, bf(T * H, "d final norm out"));
  LATHE_ASSIGN_OR_RETURN(x.rstd_f, f32(T, "final rstd"));
  LATHE_ASSIGN_OR_RETURN(x.cos, f32(T * hd / 2, "rope cos"));
  LATHE_ASSIGN_OR_RETURN(x.sin, f32(T * hd / 2, "rope sin"));
  LATHE_ASSIGN_OR_RETURN(x.inv_freq, f32(hd / 2, "inv_freq"));
  // The dS tiles of the Hopper backward go first into the layer's gate|up
  // and h_mid, dead by then (CudaModelImpl::ds_spare_bytes), the rest here.
  const std::array<size_t, 2> spare = m.ds_spare_bytes();
  x.attn_ws_bytes = cuda::attention_varlen_backward_workspace_bytes(
      T, int(s.n_head), int(hd), cuda::AttnBwdKernels::kAuto, std::min(m.o.max_seqlen, T), 0,
      cuda::attention_ds_spare_tiles(spare[0]) + cuda::attention_ds_spare_tiles(spare[1]));
  LATHE_ASSIGN_OR_RETURN(x.attn_ws, alloc(x.attn_ws_bytes, "attention workspace"));
  LATHE_ASSIGN_OR_RETURN(x.ce_counters, alloc(cuda::cross_entropy_counter_bytes(), "cross-entropy counters"));
  LATHE_ASSIGN_OR_RETURN(x.tokens, i32(T, "tokens"));
  LATHE_ASSIGN_OR_RETURN(x.targets, i32(T, "targets"));
  LATHE_ASSIGN_OR_RETURN(x.positions, i32(T, "positions"));
  LATHE_ASSIGN_OR_RETURN(x.cu_seqlens, i32(T + 1, "cu_seqlens"));
  if (m.o.full_sft) {
    LATHE_ASSIGN_OR_RETURN(m.sft.col_ws, f32(sft_column_ws_floats(m), "full SFT column sums"));
    LATHE_ASSIGN_OR_RETURN(m.sft.emb_index, i32(3 * T + 1, "full SFT embedding index"));
  }
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

// A group's extended weight and x_ext (cuda_model_impl.h): with several
// LoRA members, member 0's u4 left of x and two forward sections.
void lay_out_group(CudaModelImpl& m, CGroup& G) {
  const int64_t q = 4 * m.o.lora_r, nl = int64_t(G.loras.size());
  G.lw = nl * q;
  G.ldx = G.in + G.lw;
  if (nl < 2) {
    G.x_col = 0;
    G.ldw = G.in + G.lw;
    G.sections = {{.row0 = 0, .rows = G.out, .k0 = 0, .k = G.in + G.lw}};
    if (nl == 1) m.loras[size_t(G.loras[0])].u_col = G.in;
    return;
  }
  const CLora& first = m.loras[size_t(G.loras[0])];
  const int64_t split = first.col + first.out;  // member 0 is followed by another LoRA member: split < out
  G.x_col = q;
  G.ldw = G.in + std::max(q, G.lw - q);
  G.sections = {{.row0 = 0, .rows = split, .k0 = 0, .k = q + G.in},
                {.row0 = split, .rows = G.out - split, .k0 = q, .k = G.in + G.lw - q}};
  for (int k : G.loras) {
    CLora& a = m.loras[size_t(k)];
    a.u_col = a.slot == 0 ? 0 : G.in + a.slot * q;  // slot s ≥ 1: x_col + in + (s − 1)·4r
  }
}

// Shapes of the fused projections and their LoRA extension (lw, ldw), the
// LoRA table and the dy_ext strides (no memory yet; the 4-term copies'
// places in the groups' w are known once the arena is carved:
// place_split_copies).
void lay_out(CudaModelImpl& m) {
  const CudaModelShape& s = m.s;
  const int64_t H = s.hidden, hd = s.head_dim, F = s.inter, r = m.o.lora_r;
  const int64_t out[kCnumProj] = {s.n_head * hd, s.n_kv * hd, s.n_kv * hd, H, F, F, H};
  const int64_t in[kCnumProj] = {H, H, H, s.n_head * hd, H, H, F};
  m.blocks.assign(size_t(s.n_layer), {});
  int64_t total = 0;
  for (int64_t l = 0; l < s.n_layer; ++l) {
    CBlock& b = m.blocks[size_t(l)];
    for (int j = 0; j < kCnumProj; ++j) {
      CGroup& G = b.g[size_t(kGroupOf[j])];
      const int64_t col = G.out;
      G.in = in[j];
      G.out += out[j];
      if (m.o.full_sft || !m.o.targets[size_t(j)]) continue;  // full SFT: no LoRA, whatever targets says
      G.loras.push_back(int(m.loras.size()));
      m.loras.push_back({.r = r, .in = in[j], .out = out[j], .col = col, .slot = int64_t(G.loras.size()) - 1,
                         .layer = l, .proj = j});
      const std::string key = "base_model.model.model.layers." + std::to_string(l) + "." + kProjPath[j] + ".lora_";
      m.table.push_back({key + "A.weight", total, {r, in[j]}});
      m.factors.push_back({.src = total, .rows = r, .cols = in[j], .by_row = 0});
      total += aligned_floats(r * in[j]);
      m.table.push_back({key + "B.weight", total, {out[j], r}});
      m.factors.push_back({.src = total, .rows = out[j], .cols = r, .by_row = 1});
      total += aligned_floats(out[j] * r);
      m.max_factor_numel = std::max({m.max_factor_numel, r * in[j], out[j] * r});
    }
    for (CGroup& G : b.g) lay_out_group(m, G);
  }
  m.ld_qkv = m.group(kGqkv).out + m.group(kGqkv).lw;
  m.ld_gu = m.group(kGgu).out + m.group(kGgu).lw;
  m.ld_dh_bf = H + std::max(m.group(kGo).lw, m.group(kGdown).lw);
  m.n_flat = total;
  if (m.o.full_sft) sft_lay_out(m);  // every weight trains: the host's full-SFT table
  m.hs.assign(size_t(s.n_layer + 1), nullptr);
  m.acts.assign(size_t(s.n_layer), {});
  m.last_shared = m.o.recompute == CudaRecompute::kNone ? -1 : s.n_layer - 1;
}

// Where each factor's 4-term copy goes inside its group's w (offsets from
// the arena's base, row stride ldw), once the arena is carved.
void place_split_copies(CudaModelImpl& m) {
  const bf16p base = static_cast<bf16p>(m.arena.base());
  for (size_t k = 0; k < m.loras.size(); ++k) {
    CLora& a = m.loras[k];
    a.a = m.params + m.table[2 * k].offset, a.da = m.grads + m.table[2 * k].offset;
    a.b = m.params + m.table[2 * k + 1].offset, a.db = m.grads + m.table[2 * k + 1].offset;
  }
  for (CBlock& b : m.blocks)
    for (CGroup& G : b.g)
      for (int k : G.loras) {
        CLora& a = m.loras[size_t(k)];
        a.a4 = G.a4() + a.slot * 4 * a.r * G.ldw;         // rows [out + slot·4r, +4r), columns [0, in)
        a.b4 = G.w + a.col * G.ldw + (a.u_col - G.x_col);  // rows [col, col + out), beside W as u4 beside x
        m.factors[2 * size_t(k)].dst = a.a4 - base;
        m.factors[2 * size_t(k) + 1].dst = a.b4 - base;
        m.factors[2 * size_t(k)].ld = m.factors[2 * size_t(k) + 1].ld = G.ldw;
      }
}

void name_base(CudaModelImpl& m) {
  const CudaModelShape& s = m.s;
  using BT = CudaModelImpl::BaseTensor;
  const int64_t H = s.hidden;
  m.base["model.embed_tokens.weight"] = BT{m.embed, s.vocab, H, H, m.host_embed ? m.embed_host.data() : nullptr};
  if (!s.tied) m.base["lm_head.weight"] = BT{m.lm_head, s.vocab, H, H};
  m.base["model.norm.weight"] = BT{m.final_norm, 1, H, H};
  const int64_t hd = s.head_dim, F = s.inter;
  const int64_t out[kCnumProj] = {s.n_head * hd, s.n_kv * hd, s.n_kv * hd, H, F, F, H};
  for (int64_t l = 0; l < s.n_layer; ++l) {
    CBlock& b = m.blocks[size_t(l)];
    m.base[names::layer(l, "input_layernorm.weight")] = BT{b.attn_norm, 1, H, H};
    m.base[names::layer(l, "post_attention_layernorm.weight")] = BT{b.mlp_norm, 1, H, H};
    if (s.qk_norm) {
      m.base[names::layer(l, "self_attn.q_norm.weight")] = BT{b.q_norm, 1, hd, hd};
      m.base[names::layer(l, "self_attn.k_norm.weight")] = BT{b.k_norm, 1, hd, hd};
    }
    std::array<int64_t, kGnum> col{};  // a member's first row in its group's weight
    for (int j = 0; j < kCnumProj; ++j) {
      const CGroup& G = b.g[size_t(kGroupOf[j])];
      int64_t& c = col[size_t(kGroupOf[j])];
      m.base[names::layer(l, std::string(kProjPath[j]) + ".weight")] = BT{G.w + c * G.ldw, out[j], G.in, G.ldw};
      if (G.bias) m.base[names::layer(l, std::string(kProjPath[j]) + ".bias")] = BT{G.bias + c, 1, out[j], out[j]};
      c += out[j];
    }
  }
}

// Host bf16 rows [rows, cols] (packed) into t, rows t.ld apart.
Status upload_rows(cuda::CudaContext& ctx, const CudaModelImpl::BaseTensor& t, const uint16_t* src, int64_t rows,
                   int64_t row0) {
  if (t.host) {  // pinned host memory (packed): plain stores, once no pass still reads it
    LATHE_TRY(ctx.synchronize());
    std::memcpy(static_cast<uint16_t*>(t.host) + row0 * t.cols, src, size_t(rows * t.cols) * 2);
    return Status::ok();
  }
  if (t.ld == t.cols)
    return cuda::copy_to_device(ctx, t.p + row0 * t.ld, src, size_t(rows * t.cols) * 2);
  return cuda::copy_to_device_2d(ctx, t.p + row0 * t.ld, size_t(t.ld) * 2, src, size_t(t.cols) * 2,
                                 size_t(t.cols) * 2, size_t(rows));
}

// bf16 copies of host f32 values, converted and sent some rows at a time.
Status upload_bf16(cuda::CudaContext& ctx, const CudaModelImpl::BaseTensor& t, const float* src) {
  constexpr int64_t kChunk = int64_t{1} << 24;
  const int64_t step = std::max<int64_t>(1, kChunk / t.cols);  // rows per chunk
  std::vector<uint16_t> buf(size_t(std::min(t.rows, step) * t.cols));
  for (int64_t r0 = 0; r0 < t.rows; r0 += step) {
    const int64_t rows = std::min(step, t.rows - r0), len = rows * t.cols;
    const float* from = src + r0 * t.cols;
    parallel_for(len, 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) buf[size_t(k)] = f32_to_bf16(from[k]);
    });
    // A copy from pageable memory has left buf when it returns; the 2D
    // copy is waited for all the same before buf is refilled.
    LATHE_TRY(upload_rows(ctx, t, buf.data(), rows, r0));
    if (t.ld != t.cols && r0 + step < t.rows) LATHE_TRY(ctx.synchronize());
  }
  return Status::ok();
}

}  // namespace

Result<CudaRecompute> parse_recompute(const std::string& text) {
  if (text == "none") return CudaRecompute::kNone;
  if (text == "selective") return CudaRecompute::kSelective;
  if (text == "full") return CudaRecompute::kFull;
  return invalid_argument("recompute mode '", text, "': expected none, selective or full");
}

CudaTrainableModel::CudaTrainableModel(std::unique_ptr<CudaModelImpl> impl) : impl_(std::move(impl)) {}
CudaTrainableModel::~CudaTrainableModel() = default;

namespace {

// Lays out m and picks selective's keep_layers: the most layers whose
// arena (returned) stays within max_arena_bytes.
Result<size_t> plan(CudaModelImpl& m) {
  int64_t overlap = m.o.lora_overlap;
  if (overlap < 0) {
    LATHE_ASSIGN_OR_RETURN(overlap, env::cuda_lora_overlap());
  }
  if (overlap > 2) return invalid_argument("cuda trainer: lora_overlap ", overlap, " (expected 0, 1 or 2)");
  const bool lora = !m.o.full_sft && m.o.lora_dropout == 0.0f;  // dropout's path stays on one stream
  m.overlap_mode = lora ? int(overlap) : 0;
  const std::string sums = env::cuda_lora_sums();
  if (!sums.empty() && sums != "joined" && sums != "separate")
    return invalid_argument("cuda trainer: LATHE_CUDA_LORA_SUMS='", sums, "' (joined or separate)");
  m.separate_lora_sums = sums == "separate";
  int64_t host_embed = m.o.host_embedding;
  if (host_embed < 0) {
    LATHE_ASSIGN_OR_RETURN(host_embed, env::cuda_host_embedding());
  }
  m.host_embed = host_embed > 0 && !m.o.full_sft && !m.s.tied;
  LATHE_ASSIGN_OR_RETURN(const int64_t act_from_bwd, env::cuda_act_from_backward());
  m.act_from_bwd = act_from_bwd > 0;
  lay_out(m);
  size_t total = 0;
  auto size_arena = [&]() -> Status {
    total = 0;
    return carve(m, [&](size_t bytes, const char*) -> Result<void*> {
      total += (bytes + cuda::ArenaPlan::kAlign - 1) / cuda::ArenaPlan::kAlign * cuda::ArenaPlan::kAlign;
      return static_cast<void*>(nullptr);
    });
  };
  const bool selective = m.o.recompute == CudaRecompute::kSelective;
  const int64_t L = m.s.n_layer;
  // k layers offloaded, spread evenly (the staging buffers alternate), then the kept layers that fit.
  auto fit = [&](int64_t k) -> Status {
    m.off.slot.assign(size_t(L), -1);
    for (int64_t i = 0; i < k; ++i) m.off.slot[size_t((2 * i + 1) * L / (2 * k))] = int(i % 2);
    if (selective && m.o.keep_layers >= 0) {
      m.keep_layers = std::min(m.o.keep_layers, L);
      return size_arena();
    }
    for (m.keep_layers = selective && m.o.max_arena_bytes > 0 ? L : 0;; --m.keep_layers) {
      LATHE_TRY(size_arena());
      if (m.keep_layers == 0 || total <= size_t(m.o.max_arena_bytes)) break;
    }
    return Status::ok();
  };
  if (!selective || m.o.offload_layers >= 0) {
    LATHE_TRY(fit(selective ? std::min(m.o.offload_layers, L) : 0));
    return total;
  }
  LATHE_TRY(fit(0));
  if (m.o.keep_layers >= 0 || m.o.max_arena_bytes <= 0 || m.keep_layers == L) return total;
  // The fewest offloaded layers that keep the most within max_arena_bytes;
  // where nothing fits, the least memory (the caller then says what is missing).
  const size_t cap = size_t(m.o.max_arena_bytes);
  int64_t best_k = 0, best_keep = m.keep_layers;
  size_t best_total = total;
  bool best_fits = total <= cap;
  for (int64_t k = 3; k <= L && !(best_fits && best_keep == L); ++k) {
    LATHE_TRY(fit(k));
    const bool fits = total <= cap;
    if (fits ? !best_fits || m.keep_layers > best_keep : !best_fits && total < best_total)
      best_k = k, best_keep = m.keep_layers, best_total = total, best_fits = fits;
  }
  LATHE_TRY(fit(best_k));
  return total;
}

}  // namespace

Result<CudaArenaPlan> CudaTrainableModel::plan_arena(const CudaModelShape& shape, const CudaTrainOptions& options) {
  LATHE_TRY(check_shape(shape, options));
  CudaModelImpl m;
  m.s = shape;
  m.o = options;
  LATHE_ASSIGN_OR_RETURN(size_t total, plan(m));
  CudaArenaPlan out{.bytes = int64_t(total), .optimizer_bytes = 8 * m.n_flat, .layers_kept = m.keep_layers,
                    .layers_offloaded = m.off.count(), .items = {}};
  std::map<std::string, int64_t> by_item;
  LATHE_TRY(carve(m, [&](size_t bytes, const char* what) -> Result<void*> {
    const size_t a = cuda::ArenaPlan::kAlign;
    by_item[what] += int64_t((bytes + a - 1) / a * a);
    return static_cast<void*>(nullptr);
  }));
  out.items.assign(by_item.begin(), by_item.end());
  std::stable_sort(out.items.begin(), out.items.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

Result<std::unique_ptr<CudaTrainableModel>> CudaTrainableModel::create(const CudaModelShape& shape,
                                                                       const CudaTrainOptions& options) {
  LATHE_TRY(check_shape(shape, options));
  auto m = std::make_unique<CudaModelImpl>();
  m->s = shape;
  m->o = options;
  LATHE_ASSIGN_OR_RETURN(const size_t total, plan(*m));
  LATHE_TRY(sft_check_fits(*m, total));
  LATHE_ASSIGN_OR_RETURN(m->ctx, cuda::CudaContext::create(options.device));
  LATHE_TRY(m->side_start());
  LATHE_ASSIGN_OR_RETURN(m->arena, cuda::DeviceArena::create(options.device, total));
  LATHE_TRY(carve(*m, [&](size_t bytes, const char* what) { return m->arena.alloc(bytes, what); }));
  LATHE_TRY(m->offload_start());
  if (m->host_embed) {
    const size_t bytes = size_t(shape.vocab * shape.hidden) * 2;
    LATHE_ASSIGN_OR_RETURN(m->embed_host, cuda::PinnedBuffer::alloc(options.device, bytes));
    std::memset(m->embed_host.data(), 0, bytes);
    m->embed = static_cast<bf16p>(m->embed_host.device_data());
  }
  // Zeros everywhere, which the extended weights' off-diagonal LoRA slots
  // and unread corner keep.
  LATHE_TRY(cuda::fill_zero(m->ctx, m->arena.base(), total));
  name_base(*m);
  place_split_copies(*m);
  if (options.full_sft) LATHE_TRY(m->sft_bind());
  LATHE_TRY(cuda::copy_to_device(m->ctx, m->split_table, m->factors.data(),
                                 m->factors.size() * sizeof(cuda::LoraSplitFactor)));
  LATHE_TRY(cuda::copy_to_device(m->ctx, m->x.inv_freq, shape.inv_freq.data(), shape.inv_freq.size() * 4));
  LATHE_ASSIGN_OR_RETURN(cuda::CudaAdamW opt, cuda::CudaAdamW::create(m->ctx, options.adamw, m->adamw_params()));
  m->adamw.emplace(std::move(opt));
  LATHE_TRY(m->ctx.synchronize());
  return std::unique_ptr<CudaTrainableModel>(new CudaTrainableModel(std::move(m)));
}

Status CudaTrainableModel::upload_base(const std::string& name, std::span<const float> values) {
  auto it = impl_->base.find(name);
  if (it == impl_->base.end()) return not_found("cuda trainer: no base tensor '", name, "'");
  if (int64_t(values.size()) != it->second.numel())
    return invalid_argument("cuda trainer: tensor '", name, "' has ", values.size(), " values, expected ",
                            it->second.numel());
  return upload_bf16(impl_->ctx, it->second, values.data());
}

Status CudaTrainableModel::upload_base_bf16(const std::string& name, std::span<const uint16_t> values) {
  auto it = impl_->base.find(name);
  if (it == impl_->base.end()) return not_found("cuda trainer: no base tensor '", name, "'");
  if (int64_t(values.size()) != it->second.numel())
    return invalid_argument("cuda trainer: tensor '", name, "' has ", values.size(), " values, expected ",
                            it->second.numel());
  return upload_rows(impl_->ctx, it->second, values.data(), it->second.rows, 0);
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
      LATHE_TRY(cuda::copy_to_device(m.ctx, t.p, ones.data(), size_t(t.numel()) * 2));
      continue;
    }
    const int64_t step = std::max<int64_t>(1, kPool / t.cols);  // rows per draw
    for (int64_t r0 = 0; r0 < t.rows; r0 += step) {
      const size_t start = size_t(rng() % uint64_t(kPool));
      LATHE_TRY(upload_rows(m.ctx, t, pool.data() + start, std::min(step, t.rows - r0), r0));
    }
  }
  LATHE_TRY(m.ctx.synchronize());  // the pool is freed on return
  if (m.o.full_sft) return m.sft_masters_from_copies();
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
  if (o.full_sft) return sft_refresh();
  return cuda::lora_split_weights(ctx, {.factors = split_table, .n_factors = int(loras.size() * 2),
                                        .max_numel = max_factor_numel, .src = params,
                                        .dst = static_cast<bf16p>(arena.base())});
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
  return impl_->o.full_sft ? Status::ok() : impl_->refresh_split();  // full SFT: the step rewrote the bf16 copies
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
Result<std::vector<float>> CudaTrainableModel::read_buffer(const std::string& name, int64_t n_tokens) {
  CudaModelImpl& m = *impl_;
  const CudaModelShape& s = m.s;
  if (n_tokens <= 0 || n_tokens > m.o.max_tokens)
    return invalid_argument("cuda trainer: read_buffer of ", n_tokens, " tokens (planned for ", m.o.max_tokens, ")");
  const int64_t H = s.hidden, F = s.inter, qd = s.n_head * s.head_dim, kvd = s.n_kv * s.head_dim;
  // name -> (bf16 buffer or f32 buffer, values per token, row stride: the
  // x_ext and dy_ext rows carry LoRA columns after their values)
  std::map<std::string, std::tuple<const cuda::bf16_bits*, const float*, int64_t, int64_t>> at = {
      {"xf", {m.x.xf, nullptr, H, H}},
      {"d_xf", {m.x.d_xf, nullptr, H, H}},
      {"dh", {nullptr, m.x.dh, H, H}},
      {"dh_bf", {m.x.dh_bf, nullptr, H, m.ld_dh_bf}},
      {"d_xn", {m.x.d_xn, nullptr, H, H}},
      {"qkv", {m.x.qkv, nullptr, qd + 2 * kvd, m.ld_qkv}},
      {"dq", {m.x.dq, nullptr, qd, qd}},
      {"dk", {m.x.dk, nullptr, kvd, kvd}},
      {"dv", {m.x.dv, nullptr, kvd, kvd}},
      {"d_attn", {m.x.d_attn, nullptr, qd, qd}},
      {"act", {m.x_of(m.x.act, kGdown), nullptr, F, m.group(kGdown).ldx}}};
  for (int64_t l = 0; l <= s.n_layer; ++l) at["hs." + std::to_string(l)] = {m.hs[size_t(l)], nullptr, H, H};
  for (int64_t l = 0; l < s.n_layer; ++l) {
    const CActs& a = m.acts[size_t(l)];
    const std::string k = "." + std::to_string(l);
    at["xn1" + k] = {m.x_of(a.xn1, kGqkv), nullptr, H, m.group(kGqkv).ldx};
    at["rstd1" + k] = {nullptr, a.rstd1, 1, 1};
    at["q" + k] = {a.q, nullptr, qd, qd};
    at["k" + k] = {a.k, nullptr, kvd, kvd};
    at["v" + k] = {a.v, nullptr, kvd, kvd};
    at["attn" + k] = {m.x_of(a.attn, kGo), nullptr, qd, m.group(kGo).ldx};
    at["lse" + k] = {nullptr, a.lse, s.n_head, s.n_head};
    at["h_mid" + k] = {a.h_mid, nullptr, H, H};
    at["xn2" + k] = {m.x_of(a.xn2, kGgu), nullptr, H, m.group(kGgu).ldx};
    at["rstd2" + k] = {nullptr, a.rstd2, 1, 1};
    at["gu" + k] = {a.gu, nullptr, 2 * F, m.ld_gu};
  }
  auto it = at.find(name);
  if (it == at.end()) return not_found("cuda trainer: no buffer '", name, "'");
  const auto [b16, f32, per, ld] = it->second;
  const size_t n = size_t(n_tokens * per), span = size_t((n_tokens - 1) * ld + per);
  std::vector<float> out(n);
  if (f32) {
    LATHE_TRY(cuda::copy_to_host(m.ctx, out.data(), f32, n * 4));
    return out;
  }
  std::vector<uint16_t> bits(span);
  LATHE_TRY(cuda::copy_to_host(m.ctx, bits.data(), b16, span * 2));
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t i = 0; i < per; ++i) out[size_t(t * per + i)] = bf16_to_f32(bits[size_t(t * ld + i)]);
  return out;
}

cuda::CudaAdamW& CudaTrainableModel::optimizer() { return *impl_->adamw; }
cuda::CudaContext& CudaTrainableModel::context() { return impl_->ctx; }
int64_t CudaTrainableModel::arena_bytes() const { return int64_t(impl_->arena.capacity()); }
int64_t CudaTrainableModel::layers_kept() const { return impl_->keep_layers; }
int64_t CudaTrainableModel::layers_offloaded() const { return impl_->off.count(); }
CudaRecompute CudaTrainableModel::recompute() const { return impl_->o.recompute; }
uint64_t CudaTrainableModel::passes_run() const { return impl_->passes; }
void CudaTrainableModel::set_dropout_chunk_rows(int64_t rows) {
  impl_->drop_rows = std::clamp<int64_t>(rows, 1, std::max<int64_t>(impl_->drop_cap, 1));
}
void CudaTrainableModel::set_passes_run(uint64_t n) { impl_->passes = n; }

}  // namespace lathe
