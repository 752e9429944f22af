// One training pass of TrainableModel: the explicit forward of every layer,
// the LM head fused with cross-entropy, then the explicit backward of every
// layer in reverse, each reading what its forward kept. Per decoder layer:
//   xn1 = norm(h_in); q, k, v = proj(xn1) [+ q/k norm] [+ RoPE]
//   h_mid = h_in + o(attention(q, k, v));  xn2 = norm(h_mid)
//   h_out = h_mid + down(silu(gate(xn2)) ⊙ up(xn2))
// and backward walks the same lines bottom-up. The residual gradient dh is
// carried in place: each norm's backward adds its input gradient into it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/gemm_bf16.h"
#include "core/check.h"
#include "core/parallel.h"
#include "train/trainable_impl.h"

namespace lathe {

namespace {

TensorView fv(const float* p, Shape s) { return {const_cast<float*>(p), DType::F32, s, Device::cpu()}; }
TensorView bv(const uint16_t* p, Shape s) { return {const_cast<uint16_t*>(p), DType::BF16, s, Device::cpu()}; }
TensorView iv(const int32_t* p, int64_t n) { return {const_cast<int32_t*>(p), DType::I32, {n}, Device::cpu()}; }

uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr Proj kQkv[] = {kQ, kK, kV};

// SwiGLU (forward or backward) on rows [r0, r0 + rows) of the MLP's
// activations: the row work a fused gate/up (down) group runs per chunk.
struct SwigluRows {
  TensorView gate{}, up{}, act{}, d_act{}, d_gate{}, d_up{};

  static TensorView rows_of(const TensorView& t, int64_t r0, int64_t rows) { return t.slice_rows(r0, r0 + rows); }
  static void forward(void* ctx, int64_t r0, int64_t rows, int) {
    const SwigluRows& w = *static_cast<const SwigluRows*>(ctx);
    const Status st = cpu::swiglu_forward(
        {.gate = rows_of(w.gate, r0, rows), .up = rows_of(w.up, r0, rows), .out = rows_of(w.act, r0, rows)});
    LATHE_CHECK(st.is_ok(), st.message());
  }
  static void backward(void* ctx, int64_t r0, int64_t rows, int) {
    const SwigluRows& w = *static_cast<const SwigluRows*>(ctx);
    const Status st = cpu::swiglu_backward({.gate = rows_of(w.gate, r0, rows), .up = rows_of(w.up, r0, rows),
                                            .d_out = rows_of(w.d_act, r0, rows),
                                            .d_gate = rows_of(w.d_gate, r0, rows), .d_up = rows_of(w.d_up, r0, rows)});
    LATHE_CHECK(st.is_ok(), st.message());
  }
};

// RoPE on rows [r0, r0 + rows) of q and k: the row work of a fused q/k/v
// group (no q/k norms).
struct RopeRows {
  TensorView q{}, k{}, cos{}, sin{};
  int64_t nh = 0, nkv = 0, hd = 0;

  static void forward(void* ctx, int64_t r0, int64_t rows, int) {
    const RopeRows& r = *static_cast<const RopeRows*>(ctx);
    const TensorView cs = r.cos.slice_rows(r0, r0 + rows), sn = r.sin.slice_rows(r0, r0 + rows);
    Status st = cpu::rope_forward({.x = r.q.slice_rows(r0, r0 + rows).reshape({rows, r.nh, r.hd}), .cos = cs, .sin = sn});
    if (st.is_ok())
      st = cpu::rope_forward({.x = r.k.slice_rows(r0, r0 + rows).reshape({rows, r.nkv, r.hd}), .cos = cs, .sin = sn});
    LATHE_CHECK(st.is_ok(), st.message());
  }
  // The backward: dq and dk rotated back, before the q/k/v group reads them.
  static void inverse(void* ctx, int64_t r0, int64_t rows, int) {
    const RopeRows& r = *static_cast<const RopeRows*>(ctx);
    const TensorView cs = r.cos.slice_rows(r0, r0 + rows), sn = r.sin.slice_rows(r0, r0 + rows);
    Status st = cpu::rope_forward(
        {.x = r.q.slice_rows(r0, r0 + rows).reshape({rows, r.nh, r.hd}), .cos = cs, .sin = sn, .inverse = true});
    if (st.is_ok())
      st = cpu::rope_forward(
          {.x = r.k.slice_rows(r0, r0 + rows).reshape({rows, r.nkv, r.hd}), .cos = cs, .sin = sn, .inverse = true});
    LATHE_CHECK(st.is_ok(), st.message());
  }
};

// The q/k norms (where the layer has them) and RoPE on q and k, all rows.
Status qk_norm_rope(const LayerActs& s, const PassCtx& p, const TBlock& b, int64_t n, int64_t nh, int64_t nkv,
                    int64_t hd, float eps) {
  if (b.q_norm.w) {
    LATHE_TRY(cpu::rms_norm_forward({.x = s.q_raw.reshape({n * nh, hd}), .w = fv(b.q_norm.w, {hd}),
                                     .y = s.q.reshape({n * nh, hd}), .rstd = s.q_rstd, .eps = eps}));
    LATHE_TRY(cpu::rms_norm_forward({.x = s.k_raw.reshape({n * nkv, hd}), .w = fv(b.k_norm.w, {hd}),
                                     .y = s.k.reshape({n * nkv, hd}), .rstd = s.k_rstd, .eps = eps}));
  }
  LATHE_TRY(cpu::rope_forward({.x = s.q.reshape({n, nh, hd}), .cos = p.cos, .sin = p.sin}));
  return cpu::rope_forward({.x = s.k.reshape({n, nkv, hd}), .cos = p.cos, .sin = p.sin});
}

// RoPE's backward on dq and dk, then the q/k norms' (where the layer has them), all rows.
Status qk_norm_rope_backward(const LayerActs& s, const PassCtx& p, const TBlock& b, TensorView dq, TensorView dk,
                             int64_t n, int64_t nh, int64_t nkv, int64_t hd) {
  LATHE_TRY(cpu::rope_forward({.x = dq.reshape({n, nh, hd}), .cos = p.cos, .sin = p.sin, .inverse = true}));
  LATHE_TRY(cpu::rope_forward({.x = dk.reshape({n, nkv, hd}), .cos = p.cos, .sin = p.sin, .inverse = true}));
  if (!b.q_norm.w) return Status::ok();
  LATHE_TRY(cpu::rms_norm_backward({.x = s.q_raw.reshape({n * nh, hd}), .w = fv(b.q_norm.w, {hd}), .rstd = s.q_rstd,
                                    .dy = dq.reshape({n * nh, hd}), .dx = dq.reshape({n * nh, hd}),
                                    .dw = b.q_norm.dw ? fv(b.q_norm.dw, {hd}) : TensorView{}}));
  return cpu::rms_norm_backward({.x = s.k_raw.reshape({n * nkv, hd}), .w = fv(b.k_norm.w, {hd}), .rstd = s.k_rstd,
                                 .dy = dk.reshape({n * nkv, hd}), .dx = dk.reshape({n * nkv, hd}),
                                 .dw = b.k_norm.dw ? fv(b.k_norm.dw, {hd}) : TensorView{}});
}

// RMSNorm (forward, or backward adding into dx) on rows [r0, r0 + rows):
// the row work of a fused group whose output the norm reads (o's h_mid) or
// whose input gradient it takes (gate/up's and q/k/v's d_xn). A trained
// norm weight sums over all rows, so only frozen norms go here.
struct NormRows {
  TensorView x{}, w{}, y{}, rstd{}, dy{}, dx{};
  float eps = 0;

  static TensorView rows_of(const TensorView& t, int64_t r0, int64_t rows) { return t.slice_rows(r0, r0 + rows); }
  static void forward(void* ctx, int64_t r0, int64_t rows, int) {
    const NormRows& n = *static_cast<const NormRows*>(ctx);
    const Status st = cpu::rms_norm_forward({.x = rows_of(n.x, r0, rows), .w = n.w, .y = rows_of(n.y, r0, rows),
                                             .rstd = rows_of(n.rstd, r0, rows), .eps = n.eps, .vector_sums = true});
    LATHE_CHECK(st.is_ok(), st.message());
  }
  static void backward(void* ctx, int64_t r0, int64_t rows, int) {
    const NormRows& n = *static_cast<const NormRows*>(ctx);
    const Status st = cpu::rms_norm_backward({.x = rows_of(n.x, r0, rows), .w = n.w, .rstd = rows_of(n.rstd, r0, rows),
                                              .dy = rows_of(n.dy, r0, rows), .dx = rows_of(n.dx, r0, rows),
                                              .accumulate = true, .vector_sums = true});
    LATHE_CHECK(st.is_ok(), st.message());
  }
};
constexpr Proj kGateUp[] = {kGate, kUp};

// A residual copy (rows of hidden floats, a few MiB): split over the threads.
void copy(TensorView dst, TensorView src) {
  const int64_t bytes = src.nbytes(), grain = int64_t{256} << 10;
  parallel_for((bytes + grain - 1) / grain, 1, [&](int64_t b, int64_t e) {
    const int64_t lo = b * grain, hi = std::min(bytes, e * grain);
    std::memcpy(static_cast<char*>(dst.data) + lo, static_cast<const char*>(src.data) + lo, size_t(hi - lo));
  });
}

Status check_micro_batch(const MicroBatch& mb) {
  const size_t n = mb.input_ids.size();
  if (n == 0) return invalid_argument("forward: the micro batch has no tokens");
  if (mb.labels.size() != n || mb.position_ids.size() != n)
    return invalid_argument("forward: micro batch has ", n, " input_ids but ", mb.labels.size(), " labels and ",
                            mb.position_ids.size(), " position_ids");
  if (mb.cu_seqlens.size() < 2 || mb.cu_seqlens.front() != 0 || size_t(mb.cu_seqlens.back()) != n)
    return invalid_argument("forward: cu_seqlens must run from 0 to the ", n, " tokens");
  return Status::ok();
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

TrainableModelImpl::PhaseScope::PhaseScope(TrainableModelImpl& m, Phase p)
    : acc_(m.time_phases ? &m.phase_s[size_t(p)] : nullptr) {
  if (acc_) t0_ns_ = now_ns();
}

TrainableModelImpl::PhaseScope::~PhaseScope() {
  if (acc_) *acc_ += double(now_ns() - t0_ns_) * 1e-9;
}

// bf16-mixed adapters take bf16 products where the bf16 GEMM runs on AMX
// tiles; the AVX512-BF16 kernel's register tile (32 columns, threads
// sharing columns) does not pay at rank-wide shapes, so there they stay f32.
bool TrainableModelImpl::bf16_adapters() const {
  return opts.bf16_base && cpu::bf16_gemm_path() == cpu::Bf16GemmPath::kAmx;
}

LoraWeights TrainableModelImpl::lora_weights(int l, Proj j, const PassCtx& p) const {
  const TLora& a = loras[size_t(blocks[size_t(l)].proj[j].lora)];
  return {.a = fv(a.a, {a.r, a.in}), .b = fv(a.b, {a.out, a.r}), .da = fv(a.da, {a.r, a.in}),
          .db = fv(a.db, {a.out, a.r}), .scale = opts.lora.scale(), .dropout = p.dropout,
          .dropout_seed = mix64(p.dropout_base ^ uint64_t(l * kNumProj + j)), .bf16 = bf16_adapters()};
}

// f32 weights: one sgemm split over the threads by rows of x (bigger tiles
// than the inference kernel's, which favours few tokens); a bf16 frozen
// base: the bf16 GEMM, x rounded to bf16 as it is packed, f32 sums.
Status TrainableModelImpl::base_forward(const TLinear& L, TensorView x, TensorView y, bool accumulate) {
  PhaseScope timed(*this, kPhaseBase);
  const int64_t n = x.shape[0];
  if (x.shape[1] != L.in || y.shape[0] != n || y.shape[1] != L.out)
    return invalid_argument("linear: x ", x.shape.str(), " and y ", y.shape.str(), " do not fit w [", L.out, ", ",
                            L.in, "]");
  float* out = y.ptr<float>();
  if (L.packed)
    L.packed->forward(n, 1.0f, x.ptr<const float>(), L.in, accumulate, out, L.out);
  else if (L.w16)
    cpu::gemm_bf16(true, n, L.out, L.in, 1.0f, x.ptr<const float>(), L.in, L.w16, L.in, accumulate, out, L.out);
  else
    cpu::sgemm(false, true, n, L.out, L.in, 1.0f, x.ptr<const float>(), L.in, L.w, L.in, accumulate ? 1.0f : 0.0f,
               out, L.out);
  if (L.b)
    parallel_for(n, 16, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t)
        for (int64_t r = 0; r < L.out; ++r) out[t * L.out + r] += L.b[r];
    });
  return Status::ok();
}

Status TrainableModelImpl::base_backward(const TLinear& L, TensorView x, TensorView dy, TensorView dx,
                                         bool accumulate) {
  PhaseScope timed(*this, kPhaseBase);
  if (!L.w16)
    return cpu::linear_backward({.x = x, .w = fv(L.w, {L.out, L.in}), .dy = dy, .dx = dx,
                                 .dw = L.dw ? fv(L.dw, {L.out, L.in}) : TensorView{},
                                 .db = L.db ? fv(L.db, {L.out}) : TensorView{}, .accumulate_dx = accumulate});
  // Frozen bf16 base: only the input gradient.
  if (dy.shape.rank() != 2 || dy.shape[1] != L.out || (!dx.empty() && !(dx.shape == Shape{dy.shape[0], L.in})))
    return invalid_argument("linear backward: dy ", dy.shape.str(), " and dx ", dx.shape.str(), " do not fit w [",
                            L.out, ", ", L.in, "]");
  if (dx.empty()) return Status::ok();
  if (L.packed)
    L.packed->backward(dy.shape[0], 1.0f, dy.ptr<const float>(), L.out, accumulate, dx.ptr<float>(), L.in);
  else
    cpu::gemm_bf16(false, dy.shape[0], L.in, L.out, 1.0f, dy.ptr<const float>(), L.out, L.w16, L.in, accumulate,
                   dx.ptr<float>(), L.in);
  return Status::ok();
}

Status TrainableModelImpl::lin_forward(int l, Proj j, const PassCtx& p, TensorView x, TensorView y, bool accumulate,
                                       LoraSaved* saved) {
  const TLinear& L = blocks[size_t(l)].proj[j];
  LATHE_TRY(base_forward(L, x, y, accumulate));
  if (L.lora < 0) return Status::ok();
  PhaseScope timed(*this, kPhaseLora);
  return lora_forward(lora_weights(l, j, p), x, y, arena, saved);
}

Status TrainableModelImpl::lin_backward(int l, Proj j, const PassCtx& p, TensorView x, TensorView dy, TensorView dx,
                                        bool accumulate, const LoraSaved& saved) {
  const TLinear& L = blocks[size_t(l)].proj[j];
  LATHE_TRY(base_backward(L, x, dy, dx, accumulate));
  if (L.lora < 0) return Status::ok();
  PhaseScope timed(*this, kPhaseLora);
  return lora_backward(lora_weights(l, j, p), x, dy, dx, saved, arena);
}

// The f32 path keeps one adapter per call, so its results stay exactly what
// they were before grouping existed; bf16_base groups the adapters.
Status TrainableModelImpl::lin_forward_one(int l, Proj j, const PassCtx& p, TensorView x, TensorView y,
                                           bool accumulate, LayerActs& s) {
  if (fused_ok(l, {&j, 1})) return fused_forward(l, {&j, 1}, x, {&y, 1}, accumulate, s);
  return lin_forward(l, j, p, x, y, accumulate, &s.lora[j]);
}

Status TrainableModelImpl::lin_backward_one(int l, Proj j, const PassCtx& p, TensorView x, TensorView dy,
                                            TensorView dx, const LayerActs& s) {
  if (fused_ok(l, {&j, 1})) return fused_backward(l, {&j, 1}, x, {&dy, 1}, dx, false, s);
  return lin_backward(l, j, p, x, dy, dx, false, s.lora[j]);
}

Status TrainableModelImpl::lin_forward_group(int l, std::span<const Proj> js, const PassCtx& p, TensorView x,
                                             std::span<const TensorView> ys, LayerActs& s) {
  if (fused_ok(l, js)) return fused_forward(l, js, x, ys, false, s);
  bool all_lora = opts.bf16_base;
  for (Proj j : js) all_lora = all_lora && blocks[size_t(l)].proj[j].lora >= 0;
  if (!all_lora) {
    for (size_t i = 0; i < js.size(); ++i) LATHE_TRY(lin_forward(l, js[i], p, x, ys[i], false, &s.lora[js[i]]));
    return Status::ok();
  }
  LoraWeights w[kMaxLoraGroup];
  LoraSaved saved[kMaxLoraGroup];
  for (size_t i = 0; i < js.size(); ++i) {
    LATHE_TRY(base_forward(blocks[size_t(l)].proj[js[i]], x, ys[i], false));
    w[i] = lora_weights(l, js[i], p);
  }
  {
    PhaseScope timed(*this, kPhaseLora);
    LATHE_TRY(lora_forward_group({w, js.size()}, x, ys, arena, {saved, js.size()}));
  }
  for (size_t i = 0; i < js.size(); ++i) s.lora[js[i]] = saved[i];
  return Status::ok();
}

Status TrainableModelImpl::lin_backward_group(int l, std::span<const Proj> js, const PassCtx& p, TensorView x,
                                              std::span<const TensorView> dys, TensorView dx, const LayerActs& s) {
  if (fused_ok(l, js)) return fused_backward(l, js, x, dys, dx, false, s);
  bool all_lora = opts.bf16_base;
  for (Proj j : js) all_lora = all_lora && blocks[size_t(l)].proj[j].lora >= 0;
  if (!all_lora) {
    for (size_t i = 0; i < js.size(); ++i) LATHE_TRY(lin_backward(l, js[i], p, x, dys[i], dx, i > 0, s.lora[js[i]]));
    return Status::ok();
  }
  LoraWeights w[kMaxLoraGroup];
  LoraSaved saved[kMaxLoraGroup];
  for (size_t i = 0; i < js.size(); ++i) {
    LATHE_TRY(base_backward(blocks[size_t(l)].proj[js[i]], x, dys[i], dx, i > 0));
    w[i] = lora_weights(l, js[i], p);
    saved[i] = s.lora[js[i]];
  }
  PhaseScope timed(*this, kPhaseLora);
  return lora_backward_group({w, js.size()}, x, dys, dx, {saved, js.size()}, arena);
}

Status TrainableModelImpl::layer_forward(int l, const PassCtx& p, TensorView h_in, TensorView h_out, LayerActs& s) {
  const TBlock& b = blocks[size_t(l)];
  const int64_t n = p.n, H = cfg.hidden_size, hd = cfg.head_dim, nh = cfg.num_attention_heads;
  const int64_t nkv = cfg.num_key_value_heads, F = cfg.intermediate_size;
  const float eps = cfg.rms_norm_eps;
  Arena& a = arena;
  s.h_in = h_in;
  s.xn1 = a.alloc(DType::F32, {n, H});
  s.rstd1 = a.alloc(DType::F32, {n});
  const bool vs = opts.bf16_base;  // bf16-mixed: norms' row sums in vector lanes
  LATHE_TRY(cpu::rms_norm_forward(
      {.x = h_in, .w = fv(b.attn_norm.w, {H}), .y = s.xn1, .rstd = s.rstd1, .eps = eps, .vector_sums = vs}));
  const bool qk_norm = b.q_norm.w != nullptr;
  s.q = a.alloc(DType::F32, {n, nh * hd});
  s.k = a.alloc(DType::F32, {n, nkv * hd});
  s.v = a.alloc(DType::F32, {n, nkv * hd});
  if (qk_norm) {
    s.q_raw = a.alloc(DType::F32, {n, nh * hd});
    s.k_raw = a.alloc(DType::F32, {n, nkv * hd});
    s.q_rstd = a.alloc(DType::F32, {n * nh});
    s.k_rstd = a.alloc(DType::F32, {n * nkv});
  }
  const TensorView qkv[] = {qk_norm ? s.q_raw : s.q, qk_norm ? s.k_raw : s.k, s.v};
  if (!qk_norm && fused_ok(l, kQkv)) {  // RoPE on each chunk of rows as soon as its q and k are out
    RopeRows rows{.q = s.q, .k = s.k, .cos = p.cos, .sin = p.sin, .nh = nh, .nkv = nkv, .hd = hd};
    const cpu::AmxGroupAfter after{&RopeRows::forward, &rows};
    LATHE_TRY(fused_forward(l, kQkv, s.xn1, qkv, false, s, &after));
  } else {
    LATHE_TRY(lin_forward_group(l, kQkv, p, s.xn1, qkv, s));
    LATHE_TRY(qk_norm_rope(s, p, b, n, nh, nkv, hd, eps));
  }
  s.attn = a.alloc(DType::F32, {n, nh * hd});
  s.lse = a.alloc(DType::F32, {n, nh});
  {
    PhaseScope timed(*this, kPhaseAttention);
    LATHE_TRY(cpu::attention_varlen_forward({.q = s.q.reshape({n, nh, hd}), .k = s.k.reshape({n, nkv, hd}),
                                             .v = s.v.reshape({n, nkv, hd}), .out = s.attn.reshape({n, nh, hd}),
                                             .lse = s.lse, .cu_seqlens = p.cu_seqlens, .workspace = p.attn_ws,
                                             .window = quirks.sliding_window, .scale = 1.0f / std::sqrt(float(hd)),
                                             .bf16_products = opts.bf16_base}));
  }
  s.h_mid = a.alloc(DType::F32, {n, H});
  copy(s.h_mid, h_in);
  s.xn2 = a.alloc(DType::F32, {n, H});
  s.rstd2 = a.alloc(DType::F32, {n});
  const Proj o[] = {kO};
  if (fused_ok(l, o)) {  // the MLP's norm on each chunk of rows as soon as its h_mid is out
    NormRows rows{.x = s.h_mid, .w = fv(b.mlp_norm.w, {H}), .y = s.xn2, .rstd = s.rstd2, .eps = eps};
    const cpu::AmxGroupAfter after{&NormRows::forward, &rows};
    LATHE_TRY(fused_forward(l, o, s.attn, {&s.h_mid, 1}, true, s, &after));
  } else {
    LATHE_TRY(lin_forward_one(l, kO, p, s.attn, s.h_mid, true, s));
    LATHE_TRY(cpu::rms_norm_forward(
        {.x = s.h_mid, .w = fv(b.mlp_norm.w, {H}), .y = s.xn2, .rstd = s.rstd2, .eps = eps, .vector_sums = vs}));
  }
  s.gate = a.alloc(DType::F32, {n, F});
  s.up = a.alloc(DType::F32, {n, F});
  s.act = a.alloc(DType::F32, {n, F});
  const TensorView gate_up[] = {s.gate, s.up};
  if (fused_ok(l, kGateUp)) {  // SwiGLU on each chunk of rows as soon as its gate and up are out
    SwigluRows rows{.gate = s.gate, .up = s.up, .act = s.act};
    const cpu::AmxGroupAfter after{&SwigluRows::forward, &rows};
    LATHE_TRY(fused_forward(l, kGateUp, s.xn2, gate_up, false, s, &after));
  } else {
    LATHE_TRY(lin_forward_group(l, kGateUp, p, s.xn2, gate_up, s));
    LATHE_TRY(cpu::swiglu_forward({.gate = s.gate, .up = s.up, .out = s.act}));
  }
  copy(h_out, s.h_mid);
  return lin_forward_one(l, kDown, p, s.act, h_out, true, s);
}

Status TrainableModelImpl::layer_backward(int l, const PassCtx& p, const LayerActs& s, TensorView dh) {
  Arena::Scope scope(arena);
  const TBlock& b = blocks[size_t(l)];
  const int64_t n = p.n, H = cfg.hidden_size, hd = cfg.head_dim, nh = cfg.num_attention_heads;
  const int64_t nkv = cfg.num_key_value_heads, F = cfg.intermediate_size;
  Arena& a = arena;
  // MLP: h_out = h_mid + down(act), act = swiglu(gate(xn2), up(xn2)), xn2 = norm(h_mid).
  TensorView d_act = a.alloc(DType::F32, {n, F}), d_gate = a.alloc(DType::F32, {n, F});
  TensorView d_up = a.alloc(DType::F32, {n, F}), d_xn = a.alloc(DType::F32, {n, H});
  const Proj down[] = {kDown};
  if (fused_ok(l, down)) {  // SwiGLU's backward on each chunk of rows as soon as its d_act is out
    SwigluRows rows{.gate = s.gate, .up = s.up, .d_act = d_act, .d_gate = d_gate, .d_up = d_up};
    const cpu::AmxGroupAfter after{&SwigluRows::backward, &rows};
    LATHE_TRY(fused_backward(l, down, s.act, {&dh, 1}, d_act, false, s, &after));
  } else {
    LATHE_TRY(lin_backward_one(l, kDown, p, s.act, dh, d_act, s));
    LATHE_TRY(cpu::swiglu_backward({.gate = s.gate, .up = s.up, .d_out = d_act, .d_gate = d_gate, .d_up = d_up}));
  }
  const TensorView d_gate_up[] = {d_gate, d_up};
  if (fused_ok(l, kGateUp) && !b.mlp_norm.dw) {  // the norm's backward on each chunk as soon as its d_xn is out
    NormRows rows{.x = s.h_mid, .w = fv(b.mlp_norm.w, {H}), .rstd = s.rstd2, .dy = d_xn, .dx = dh};
    const cpu::AmxGroupAfter after{&NormRows::backward, &rows};
    LATHE_TRY(fused_backward(l, kGateUp, s.xn2, d_gate_up, d_xn, false, s, &after));
  } else {
    LATHE_TRY(lin_backward_group(l, kGateUp, p, s.xn2, d_gate_up, d_xn, s));
    LATHE_TRY(cpu::rms_norm_backward({.x = s.h_mid, .w = fv(b.mlp_norm.w, {H}), .rstd = s.rstd2, .dy = d_xn,
                                      .dx = dh, .dw = b.mlp_norm.dw ? fv(b.mlp_norm.dw, {H}) : TensorView{},
                                      .accumulate = true, .vector_sums = opts.bf16_base}));
  }
  // Attention: h_mid = h_in + o(attn(rope(q), rope(k), v)), q, k, v from xn1 = norm(h_in).
  TensorView d_attn = a.alloc(DType::F32, {n, nh * hd});
  TensorView dq = a.alloc(DType::F32, {n, nh * hd}), dk = a.alloc(DType::F32, {n, nkv * hd});
  TensorView dv = a.alloc(DType::F32, {n, nkv * hd});
  LATHE_TRY(lin_backward_one(l, kO, p, s.attn, dh, d_attn, s));
  {
    PhaseScope timed(*this, kPhaseAttention);
    LATHE_TRY(cpu::attention_varlen_backward(
        {.q = s.q.reshape({n, nh, hd}), .k = s.k.reshape({n, nkv, hd}), .v = s.v.reshape({n, nkv, hd}),
         .out = s.attn.reshape({n, nh, hd}), .lse = s.lse, .cu_seqlens = p.cu_seqlens,
         .d_out = d_attn.reshape({n, nh, hd}), .d_q = dq.reshape({n, nh, hd}), .d_k = dk.reshape({n, nkv, hd}),
         .d_v = dv.reshape({n, nkv, hd}), .workspace = p.attn_ws, .window = quirks.sliding_window,
         .scale = 1.0f / std::sqrt(float(hd)), .bf16_products = opts.bf16_base}));
  }
  // The gradient into layer 0's input reaches only the embedding: when that
  // is frozen (LoRA) and so is the first norm, it is never formed (autograd
  // skips it too: nothing upstream requires a gradient).
  const bool input_grad = l > 0 || d_embed || b.attn_norm.dw;
  const TensorView d_qkv[] = {dq, dk, dv};
  if (!b.q_norm.w && fused_ok(l, kQkv) && !b.attn_norm.dw) {
    // RoPE's backward on each chunk of dq, dk rows before the group reads
    // them; the norm's backward after it (as the MLP's norm above).
    RopeRows rope{.q = dq, .k = dk, .cos = p.cos, .sin = p.sin, .nh = nh, .nkv = nkv, .hd = hd};
    NormRows norm{.x = s.h_in, .w = fv(b.attn_norm.w, {H}), .rstd = s.rstd1, .dy = d_xn, .dx = dh};
    const cpu::AmxGroupAfter before{&RopeRows::inverse, &rope}, after{&NormRows::backward, &norm};
    return fused_backward(l, kQkv, s.xn1, d_qkv, input_grad ? d_xn : TensorView{}, false, s,
                          input_grad ? &after : nullptr, &before);
  }
  LATHE_TRY(qk_norm_rope_backward(s, p, b, dq, dk, n, nh, nkv, hd));
  LATHE_TRY(lin_backward_group(l, kQkv, p, s.xn1, d_qkv, input_grad ? d_xn : TensorView{}, s));
  if (!input_grad) return Status::ok();
  return cpu::rms_norm_backward({.x = s.h_in, .w = fv(b.attn_norm.w, {H}), .rstd = s.rstd1, .dy = d_xn, .dx = dh,
                                 .dw = b.attn_norm.dw ? fv(b.attn_norm.dw, {H}) : TensorView{}, .accumulate = true,
                                 .vector_sums = opts.bf16_base});
}

Result<PassLoss> TrainableModelImpl::run(const MicroBatch& mb, float loss_scale, bool backward) {
  LATHE_TRY(check_micro_batch(mb));
  const int64_t t0 = time_phases ? now_ns() : 0;
  Result<PassLoss> r = run_timed(mb, loss_scale, backward);
  if (time_phases) pass_s += double(now_ns() - t0) * 1e-9;
  return r;
}

Result<PassLoss> TrainableModelImpl::run_timed(const MicroBatch& mb, float loss_scale, bool backward) {
  arena.reset();
  const int64_t n = mb.n_tokens(), H = cfg.hidden_size, V = cfg.vocab_size, half = cfg.head_dim / 2;
  const int n_layer = int(blocks.size());
  const bool keep_all = !opts.activations_checkpoint;
  PassCtx p{.n = n, .cos = arena.alloc(DType::F32, {n, half}), .sin = arena.alloc(DType::F32, {n, half}),
            .cu_seqlens = iv(mb.cu_seqlens.data(), int64_t(mb.cu_seqlens.size())), .attn_ws = {},
            .dropout_base = mix64(opts.seed ^ mix64(passes++)), .dropout = backward ? opts.lora.dropout : 0.0f};
  int64_t longest = 0;
  for (size_t d = 0; d + 1 < mb.cu_seqlens.size(); ++d)
    longest = std::max<int64_t>(longest, mb.cu_seqlens[d + 1] - mb.cu_seqlens[d]);
  p.attn_ws = arena.alloc(DType::F32, {attention_varlen_workspace_floats(longest, num_threads())});
  const TensorView tokens = iv(mb.input_ids.data(), n);
  LATHE_TRY(cpu::rope_tables({.inv_freq = fv(inv_freq.data(), {half}), .positions = iv(mb.position_ids.data(), n),
                              .cos = p.cos, .sin = p.sin}));
  // h[l] is layer l's input; h[n_layer] the last layer's output.
  std::vector<TensorView>& h = hs;
  h.resize(size_t(n_layer + 1));
  for (TensorView& t : h) t = arena.alloc(DType::F32, {n, H});
  const TensorView table = embed16 ? bv(embed16, {V, H}) : fv(embed, {V, H});
  LATHE_TRY(cpu::embedding_forward({.tokens = tokens, .table = table, .out = h[0]}).with_context("forward"));
  acts.resize(keep_all ? size_t(n_layer) : 1);
  for (int l = 0; l < n_layer; ++l) {
    if (keep_all) {
      LATHE_TRY(layer_forward(l, p, h[size_t(l)], h[size_t(l) + 1], acts[size_t(l)]));
    } else {
      Arena::Scope scope(arena);
      LATHE_TRY(layer_forward(l, p, h[size_t(l)], h[size_t(l) + 1], acts[0]));
    }
  }
  TensorView xf = arena.alloc(DType::F32, {n, H}), rstd_f = arena.alloc(DType::F32, {n});
  LATHE_TRY(cpu::rms_norm_forward(
      {.x = h.back(), .w = fv(final_norm.w, {H}), .y = xf, .rstd = rstd_f, .eps = cfg.rms_norm_eps,
       .vector_sums = opts.bf16_base}));
  TensorView d_xf = backward ? arena.alloc(DType::F32, {n, H}) : TensorView{};
  // A packed head streams w once per chunk: chunks of up to 1024 rows (logits
  // near 128 MiB at most), else cross_entropy_chunk_rows.
  const int64_t chunk = opts.lm_head_chunk_rows > 0 ? opts.lm_head_chunk_rows
                        : lm_head.packed && lm_head.packed->packed()
                            ? std::clamp<int64_t>((int64_t{32} << 20) / V, cross_entropy_chunk_rows(V), 1024)
                            : cross_entropy_chunk_rows(V);
  const TensorView head = lm_head.w16 ? bv(lm_head.w16, {V, H}) : fv(lm_head.w, {V, H});
  Result<CrossEntropyStats> ce = CrossEntropyStats{};
  {
    PhaseScope timed(*this, kPhaseHead);
    ce = cpu::cross_entropy({.hidden = xf,
                             .w = head,
                             .targets = iv(mb.labels.data(), n),
                             .d_hidden = d_xf,
                             .d_w = backward && lm_head.dw ? fv(lm_head.dw, {V, H}) : TensorView{},
                             .workspace = arena.alloc(DType::F32, {cross_entropy_workspace_floats(V, H, chunk)}),
                             .chunk_rows = chunk,
                             .grad_scale = loss_scale},
                            lm_head.packed);
  }
  if (!ce.is_ok()) return ce.status().with_context("forward");
  PassLoss loss{.loss_sum = ce->loss_sum, .n_supervised = ce->n_valid};
  if (!backward) return loss;

  TensorView dh = arena.alloc(DType::F32, {n, H});
  LATHE_TRY(cpu::rms_norm_backward({.x = h.back(), .w = fv(final_norm.w, {H}), .rstd = rstd_f, .dy = d_xf, .dx = dh,
                                    .dw = final_norm.dw ? fv(final_norm.dw, {H}) : TensorView{},
                                    .vector_sums = opts.bf16_base}));
  for (int l = n_layer - 1; l >= 0; --l) {
    if (keep_all) {
      LATHE_TRY(layer_backward(l, p, acts[size_t(l)], dh));
    } else {
      Arena::Scope scope(arena);
      TensorView h_out = arena.alloc(DType::F32, {n, H});
      LATHE_TRY(layer_forward(l, p, h[size_t(l)], h_out, acts[0]));
      LATHE_TRY(layer_backward(l, p, acts[0], dh));
    }
  }
  if (d_embed) LATHE_TRY(cpu::embedding_backward({.tokens = tokens, .d_out = dh, .d_table = fv(d_embed, {V, H})}));
  return loss;
}

}  // namespace lathe
