// One training pass of CudaTrainableModel: trainable_pass.cpp's forward and
// backward with the device kernels. The residual add is fused into the norm
// that follows it, so per layer l (input hs[l], its norm xn1 made by the
// previous layer's last step):
//   [q|k|v] = qkv(xn1) [+ bias]; split (+ q/k norm) + RoPE; a = attention(q, k, v)
//   h_mid = hs[l] + o(a), xn2 = norm(h_mid)            (one fused kernel)
//   [gate|up] = gu(xn2); t = down(silu(gate) ⊙ up)
//   hs[l + 1] = h_mid + t, next xn1 = norm(hs[l + 1])  (one fused kernel)
// The backward carries the residual stream's gradient dh in fp32; each norm's
// backward adds its input gradient into it and writes dh rounded to bf16
// beside it, the copy the next GEMMs read. Before a layer's backward, what
// its recompute mode did not keep is recomputed by the same kernels on the
// same inputs (bitwise the same values).
#include <algorithm>
#include <array>
#include <cmath>

#include "backends/cuda/attention.h"
#include "backends/cuda/lora_ops.h"
#include "backends/cuda/train_fused.h"
#include "train/cuda_model_impl.h"

namespace lathe {

namespace {

Status check_micro_batch(const MicroBatch& mb, int64_t max_tokens, int64_t vocab) {
  const size_t n = mb.input_ids.size();
  if (n == 0) return invalid_argument("cuda forward: the micro batch has no tokens");
  if (int64_t(n) > max_tokens)
    return invalid_argument("cuda forward: the micro batch has ", n, " tokens, the model was planned for ",
                            max_tokens);
  if (mb.labels.size() != n || mb.position_ids.size() != n)
    return invalid_argument("cuda forward: micro batch has ", n, " input_ids but ", mb.labels.size(),
                            " labels and ", mb.position_ids.size(), " position_ids");
  if (mb.cu_seqlens.size() < 2 || mb.cu_seqlens.front() != 0 || size_t(mb.cu_seqlens.back()) != n)
    return invalid_argument("cuda forward: cu_seqlens must run from 0 to the ", n, " tokens");
  for (size_t d = 0; d + 1 < mb.cu_seqlens.size(); ++d)
    if (mb.cu_seqlens[d + 1] < mb.cu_seqlens[d]) return invalid_argument("cuda forward: cu_seqlens decreases at ", d);
  for (size_t i = 0; i < n; ++i) {
    if (mb.input_ids[i] < 0 || mb.input_ids[i] >= vocab)
      return invalid_argument("cuda forward: token ", mb.input_ids[i], " at ", i, " is outside the vocabulary of ",
                              vocab);
    if (mb.labels[i] != kCrossEntropyIgnore && (mb.labels[i] < 0 || mb.labels[i] >= vocab))
      return invalid_argument("cuda forward: label ", mb.labels[i], " at ", i, " is outside the vocabulary of ",
                              vocab);
  }
  return Status::ok();
}

}  // namespace

Status CudaModelImpl::norm(const bf16p xin, const bf16p residual, bf16p h_out, const bf16p w, bf16p y, float* rstd,
                           int64_t rows, int64_t dim, int64_t ld_y) {
  return cuda::rms_norm_residual_forward(ctx, {.x = xin, .residual = residual, .h_out = h_out, .w = w, .y = y,
                                               .rstd = rstd, .rows = rows, .dim = dim, .eps = s.eps, .ld_y = ld_y});
}

// u = x·Aᵀ of group g's LoRA members into their x_ext columns: x times A's
// three terms (exact: x is bf16; one GEMM over the stacked A4 inside the
// group's weight), summed in f32 by lora_sum_parts, which scales by s and
// writes the 4-term split (hi, hi, hi, lo) of s·u straight into the x_ext
// row (member 0 left of x when it has company, the rest right of it). The
// same kernels on the same x give bitwise the same u, so a recomputation
// reruns this (on the side stream where only the LoRA gradients read it:
// lora_u_for_grads). With dropout each member's product reads its own
// masked x (its mask regenerated: the same again in a recomputation) and
// the sum scales by s/(1 − p). `part` holds the f32 products: c's scratch.
Status CudaModelImpl::lora_u_on(cuda::CudaContext& c, float* part, int64_t l, int g, bf16p xe, int64_t n) {
  const CGroup& G = blocks[size_t(l)].g[size_t(g)];
  if (G.loras.empty()) return Status::ok();
  LATHE_TRY(phase(kPhLora));
  const int64_t r = o.lora_r, nl = int64_t(G.loras.size()), left = G.x_col > 0 ? 1 : 0;
  if (dropout())
    LATHE_TRY(lora_u_dropout_products(G, xe, n));  // main stream only (no side stream with dropout)
  else
    LATHE_TRY(cuda::gemm(c, {.a = xe + G.x_col, .b = G.a4(), .c = part, .m = n, .n = G.lw, .k = G.in,
                             .trans_b = true, .c_dtype = DType::F32, .lda = G.ldx, .ldb = G.ldw}));
  const float scale = dropout() ? o.lora_scale * (1.0f / (1.0f - o.lora_dropout)) : o.lora_scale;
  cuda::LoraPartsArgs parts[2];
  parts[0] = {.src = part, .rows = n, .cols = r, .n_groups = 1, .n_parts = 3, .row_stride = G.lw,
              .group_stride = 4 * r, .part_stride = r, .scale = scale, .split = xe, .split_ld = G.ldx};
  parts[1] = parts[0];  // the members right of x (after member 0 when it sits left of x)
  parts[1].src = part + left * 4 * r;
  parts[1].n_groups = nl - left;
  parts[1].split = xe + G.x_col + G.in;
  return cuda::lora_sum_parts_many(c, left ? parts : parts + 1, left ? 2 : 1);
}

Status CudaModelImpl::lora_u(int64_t l, int g, bf16p xe, int64_t n) { return lora_u_on(ctx, x.lora_f32, l, g, xe, n); }

// y = bf16(x·Wᵀ [+ b] + Σ_members s·u·Bᵀ) for one fused group, each output
// element rounded once: per section one GEMM over x_ext's columns against
// the extended weight's (cuda_model_impl.h), the LoRA terms [s·u4]·B4ᵀ in
// the same f32 accumulator as the base product, the bias added by the
// GEMM's epilogue in f32 before the rounding. s·u's 4-term split makes its
// product with B's 4-term copy f32-accurate (lora_ops.h), so the one
// rounding is that of the f32 base product plus the f32 LoRA branch. y's
// rows are ld_y apart (0: packed). u_kept: x_ext still holds this pass's
// s·u terms (a recomputation over a kept input), which are not rerun.
Status CudaModelImpl::group_forward(int64_t l, int g, bf16p xe, bf16p y, int64_t ld_y, int64_t n, bool u_kept) {
  const CGroup& G = blocks[size_t(l)].g[size_t(g)];
  if (!u_kept) LATHE_TRY(lora_u(l, g, xe, n));
  LATHE_TRY(phase(kPhGemmFwd));
  for (const CSection& c : G.sections)
    LATHE_TRY(cuda::gemm(ctx, {.a = xe + c.k0, .b = G.w + c.row0 * G.ldw + (c.k0 - G.x_col), .c = y + c.row0,
                               .m = n, .n = c.rows, .k = c.k, .trans_b = true, .lda = G.ldx, .ldb = G.ldw,
                               .ldc = ld_y ? ld_y : G.out, .bias = G.bias ? G.bias + c.row0 : nullptr}));
  return Status::ok();
}

int64_t CudaModelImpl::lora_batch_floats(int64_t tokens) const {
  int64_t most = 0;
  if (blocks.empty()) return 0;
  for (const CGroup& G : blocks[0].g) {
    int64_t need = lora_part_floats(tokens * G.lw);
    for (int k : G.loras)
      need += lora_part_floats(loras[size_t(k)].out * 2 * o.lora_r) + lora_part_floats(2 * o.lora_r * G.in);
    most = std::max(most, need);
  }
  return most;
}

// dB = dyᵀ·[u_hi | u_lo] → [out, 2r] per member of G (u carries s), each
// member's into its own block from `part`, on context c; the sums into
// the members' f32 gradients go to `sums`.
Status CudaModelImpl::lora_db(cuda::CudaContext& c, float*& part, const CGroup& G, const bf16p xe, const bf16p dye,
                              int64_t ld_dy, int64_t n, CPartSums& sums) {
  const int64_t r = o.lora_r;
  for (int k : G.loras) {
    const CLora& a = loras[size_t(k)];
    LATHE_TRY(cuda::gemm(c, {.a = dye + a.col, .b = xe + a.u_col + 2 * r, .c = part, .m = a.out, .n = 2 * r,
                             .k = n, .trans_a = true, .c_dtype = DType::F32, .lda = ld_dy, .ldb = G.ldx}));
    sums.add({.src = part, .rows = a.out, .cols = r, .n_parts = 2, .row_stride = 2 * r, .part_stride = r,
              .sum = a.db, .accumulate = true});
    part += lora_part_floats(a.out * 2 * r);
  }
  return Status::ok();
}

// dA = [du_hi | du_lo]ᵀ·x → [2r, in] per member of G (du from dy_ext's
// columns), each into its own block from `part`, on c; the sums to `sums`.
Status CudaModelImpl::lora_da(cuda::CudaContext& c, float*& part, const CGroup& G, const bf16p xe, const bf16p dye,
                              int64_t ld_dy, int64_t n, CPartSums& sums) {
  const int64_t r = o.lora_r;
  for (int k : G.loras) {
    const CLora& a = loras[size_t(k)];
    LATHE_TRY(cuda::gemm(c, {.a = dye + G.out + a.slot * 4 * r + 2 * r, .b = xe + G.x_col, .c = part, .m = 2 * r,
                             .n = G.in, .k = n, .trans_a = true, .c_dtype = DType::F32, .lda = ld_dy,
                             .ldb = G.ldx}));
    sums.add({.src = part, .rows = r, .cols = G.in, .n_parts = 2, .row_stride = G.in, .part_stride = r * G.in,
              .sum = a.da, .accumulate = true});
    part += lora_part_floats(2 * r * G.in);
  }
  return Status::ok();
}

// du = s·dy·B of every member of G, split into dy_ext's columns [out, out +
// lw): dy times B's three terms, a GEMM per member into f32 parts and one
// lora_sum_parts.
Status CudaModelImpl::lora_du(const CGroup& G, const bf16p dye, int64_t ld_dy, int64_t n) {
  const int64_t r = o.lora_r, nl = int64_t(G.loras.size());
  for (int k : G.loras) {  // du = s·dy·B: dy times B's three terms
    const CLora& a = loras[size_t(k)];
    LATHE_TRY(cuda::gemm(ctx, {.a = dye + a.col, .b = a.b4, .c = x.lora_f32 + a.slot * 4 * r, .m = n, .n = 4 * r,
                               .k = a.out, .c_dtype = DType::F32, .lda = ld_dy, .ldb = G.ldw, .ldc = G.lw}));
  }
  return cuda::lora_sum_parts(ctx, {.src = x.lora_f32, .rows = n, .cols = r, .n_groups = nl, .n_parts = 3,
                                    .row_stride = G.lw, .group_stride = 4 * r, .part_stride = r,
                                    .scale = o.lora_scale, .split = dye + G.out, .split_ld = ld_dy});
}

// The backward of group_forward from dy_ext (dy in columns [0, out), rows
// ld_dy apart, room for du in [out, out + lw)). In f32 per member: dB =
// dyᵀ·(s·u) from x_ext's hi and lo terms, du = s·dy·B (dy times B4 inside
// the extended weight, split into dy_ext's columns: lora_du),
// dA = duᵀ·x from its hi and lo terms; all exact against the split factors
// (dy and x are bf16), summed into the f32 gradients. Then dx =
// dy_ext·[W ; A4 planes] = dy·W + du·A, K = out + lw, ONE GEMM rounded once
// (dx packed). dx may overlay x_ext: the LoRA gradients read it first. With
// dropout, dA and dx take the masks (lora_da_dropout, lora_dx_dropout); dB
// and du do not. The members' dB and dA sums are one launch per group
// (their parts side by side in the scratch, after du's; two launches with
// LATHE_CUDA_LORA_SUMS=separate).
//   With the side stream (cuda_model_overlap.cpp) dB and dA run there, on
// its own scratch, while the main stream computes du and then dx (dB from
// the start, dA once du is split). The same kernels on the same data: the
// same bits, with or without it.
Status CudaModelImpl::group_backward(int64_t l, int g, bf16p xe, bf16p dye, int64_t ld_dy, bf16p dx, int64_t n) {
  if (o.full_sft) LATHE_TRY(sft_group_grads(l, g, xe, dye, ld_dy, n));  // before dx overwrites anything
  const CGroup& G = blocks[size_t(l)].g[size_t(g)];
  const int64_t nl = int64_t(G.loras.size());
  const bool on_side = overlap() && nl > 0;
  cuda::CudaContext& c = on_side ? *side.ctx : ctx;
  float* part = on_side ? x.lora_side_f32 : x.lora_f32;
  if (nl > 0) {
    LATHE_TRY(phase(kPhLora));
    if (on_side) LATHE_TRY(side_fork());
    // dB's and dA's parts after du's (which the serial order writes into the
    // same scratch), summed together in one launch once dA's are made.
    CPartSums sums;
    part += lora_part_floats(n * G.lw);
    LATHE_TRY(lora_db(c, part, G, xe, dye, ld_dy, n, sums));
    if (separate_lora_sums) LATHE_TRY(sums.flush(c));
    LATHE_TRY(lora_du(G, dye, ld_dy, n));
    if (dropout()) {  // dB's sums first (dA's parts start over at the scratch); dx with the masked du·A
      LATHE_TRY(sums.flush(c));
      LATHE_TRY(lora_da_dropout(G, xe, dye, ld_dy, n));
      return lora_dx_dropout(G, dye, ld_dy, dx, n);
    }
    if (on_side) LATHE_TRY(side_fork());  // du is split
    LATHE_TRY(lora_da(c, part, G, xe, dye, ld_dy, n, sums));
    LATHE_TRY(sums.flush(c));
  }
  LATHE_TRY(side_before_dx(on_side, dx_overlays(dx, G.in, xe, G.ldx, dye, ld_dy, n)));
  LATHE_TRY(phase(kPhGemmBwd));
  return cuda::gemm(ctx, {.a = dye, .b = G.w, .c = dx, .m = n, .n = G.in, .k = G.out + G.lw, .lda = ld_dy,
                          .ldb = G.ldw});
}

// q, k, v of layer l (RoPE applied) from its xn1.
Status CudaModelImpl::attention_inputs(int64_t l, int64_t n) {
  const CBlock& b = blocks[size_t(l)];
  CActs& a = act_of(l);
  const int64_t hd = s.head_dim, nh = s.n_head, nkv = s.n_kv;
  LATHE_TRY(group_forward(l, kGqkv, a.xn1, x.qkv, ld_qkv, n));
  LATHE_TRY(phase(kPhElementwise));
  if (!s.qk_norm)
    return cuda::qkv_split(ctx, {.qkv = x.qkv, .q = a.q, .k = a.k, .v = a.v, .cos = x.cos, .sin = x.sin,
                                 .n_tokens = n, .n_head = nh, .n_head_kv = nkv, .head_dim = hd, .ld_qkv = ld_qkv});
  LATHE_TRY(cuda::qkv_split(ctx, {.qkv = x.qkv, .q = a.q_raw, .k = a.k_raw, .v = a.v, .n_tokens = n, .n_head = nh,
                                  .n_head_kv = nkv, .head_dim = hd, .ld_qkv = ld_qkv}));
  LATHE_TRY(norm(a.q_raw, nullptr, nullptr, b.q_norm, a.q, a.q_rstd, n * nh, hd));
  LATHE_TRY(norm(a.k_raw, nullptr, nullptr, b.k_norm, a.k, a.k_rstd, n * nkv, hd));
  LATHE_TRY(cuda::rope_apply(ctx, {.x = a.q, .cos = x.cos, .sin = x.sin, .n_tokens = n, .n_head = nh, .half = hd / 2}));
  return cuda::rope_apply(ctx, {.x = a.k, .cos = x.cos, .sin = x.sin, .n_tokens = n, .n_head = nkv, .half = hd / 2});
}

// Layer l's forward from hs[l] and acts.xn1 / rstd1; leaves the MLP output
// in x.tmp_h (the caller's fused norm adds it to h_mid).
Status CudaModelImpl::layer_forward(int64_t l, int64_t n, int n_docs, int max_seqlen) {
  const CBlock& b = blocks[size_t(l)];
  CActs& a = act_of(l);
  const int64_t hd = s.head_dim;
  LATHE_TRY(attention_inputs(l, n));
  LATHE_TRY(phase(kPhAttnFwd));
  LATHE_TRY(cuda::attention_varlen_forward({.q = a.q, .k = a.k, .v = a.v, .out = x_of(a.attn, kGo), .lse = a.lse,
                                            .cu_seqlens = x.cu_seqlens, .n_docs = n_docs, .max_seqlen = max_seqlen,
                                            .n_tokens = int(n), .n_head = int(s.n_head), .n_head_kv = int(s.n_kv),
                                            .head_dim = int(hd), .window = s.window,
                                            .scale = 1.0f / std::sqrt(float(hd)), .stream = ctx.stream(),
                                            .ld_out = group(kGo).ldx}));
  LATHE_TRY(group_forward(l, kGo, a.attn, x.tmp_h, 0, n));
  LATHE_TRY(phase(kPhElementwise));
  LATHE_TRY(norm(x.tmp_h, hs[size_t(l)], a.h_mid, b.mlp_norm, x_of(a.xn2, kGgu), a.rstd2, n, s.hidden,
                 group(kGgu).ldx));
  LATHE_TRY(offload_before_write(l));
  LATHE_TRY(group_forward(l, kGgu, a.xn2, a.gu, ld_gu, n));
  LATHE_TRY(phase(kPhElementwise));
  LATHE_TRY(cuda::swiglu_rows_forward(ctx, {.gu = a.gu, .out = x_of(a.act, kGdown), .n_tokens = n,
                                            .inter = s.inter, .ld_gu = ld_gu, .ld_out = group(kGdown).ldx}));
  LATHE_TRY(offload_after_forward(l, n));
  return group_forward(l, kGdown, a.act, x.tmp_h, 0, n);
}

// What layer l's backward reads and its recompute mode did not keep: with
// "full" the whole forward from hs[l]; with "selective" xn1, q|k|v (GEMM
// and LoRA) and o (its GEMM: its LoRA u lives in the kept attention
// output's rows), q, k, v, h_mid and xn2 with gate|up's LoRA u, or in a
// layer that keeps q, k, v and h_mid only the norms' outputs xn1 and xn2
// and the LoRA u of q|k|v and gate|up that live in their rows (x_ext). The
// last layer to write the shared buffers finds its own values there. The
// LoRA side stream's work of the layer above reads shared buffers this
// rewrites: it is waited for first.
Status CudaModelImpl::recompute(int64_t l, int64_t n, int n_docs, int max_seqlen) {
  if (o.recompute == CudaRecompute::kNone) return Status::ok();
  LATHE_TRY(side_join());
  if (l == last_shared) return Status::ok();
  CActs& a = act_of(l);
  const CBlock& b = blocks[size_t(l)];
  const int64_t H = s.hidden;
  LATHE_TRY(phase(kPhElementwise));
  LATHE_TRY(norm(hs[size_t(l)], nullptr, nullptr, b.attn_norm, x_of(a.xn1, kGqkv), a.rstd1, n, H,
                 group(kGqkv).ldx));
  if (o.recompute == CudaRecompute::kFull) return layer_forward(l, n, n_docs, max_seqlen);
  if (l < keep_layers) {
    LATHE_TRY(lora_u_for_grads(l, kGqkv, a.xn1, n));
    LATHE_TRY(phase(kPhElementwise));
    LATHE_TRY(norm(a.h_mid, nullptr, nullptr, b.mlp_norm, x_of(a.xn2, kGgu), a.rstd2, n, H, group(kGgu).ldx));
    return lora_u_for_grads(l, kGgu, a.xn2, n);
  }
  LATHE_TRY(attention_inputs(l, n));
  LATHE_TRY(group_forward(l, kGo, a.attn, x.tmp_h, 0, n, /*u_kept=*/true));  // the attention output is kept
  LATHE_TRY(phase(kPhElementwise));
  LATHE_TRY(norm(x.tmp_h, hs[size_t(l)], a.h_mid, b.mlp_norm, x_of(a.xn2, kGgu), a.rstd2, n, H, group(kGgu).ldx));
  return lora_u_for_grads(l, kGgu, a.xn2, n);
}

// Layer l's backward; x.dh holds the gradient of hs[l + 1] and x.dh_bf its
// bf16 copy (both from the norm backward that made it); they become those
// of hs[l].
Status CudaModelImpl::layer_backward(int64_t l, int64_t n, int n_docs, int max_seqlen) {
  const CBlock& b = blocks[size_t(l)];
  CActs& a = act_of(l);
  const int64_t H = s.hidden, F = s.inter;
  if (act_from_bwd && !o.full_sft && !dropout()) {
    LATHE_TRY(down_backward(l, n));
  } else {
    // Full SFT's dW and dropout's masked dA read act before dx: act (with
    // down's LoRA u in its row) is kept (none), still in the scratch
    // (full's rerun just made it), or rerun here (the head's workspace
    // overlaid the scratch since).
    LATHE_TRY(phase(kPhElementwise));
    const bool act_ready = a.act != x.act || (o.recompute == CudaRecompute::kFull && l != last_shared);
    if (!act_ready) {
      LATHE_TRY(cuda::swiglu_rows_forward(ctx, {.gu = a.gu, .out = x_of(x.act, kGdown), .n_tokens = n,
                                                .inter = F, .ld_gu = ld_gu, .ld_out = group(kGdown).ldx}));
      LATHE_TRY(lora_u_for_grads(l, kGdown, x.act, n));
    }
    // x.act becomes act's gradient (packed; down's LoRA reads act before),
    // and [gate | up] its own (in place, gate|up's dy_ext).
    LATHE_TRY(group_backward(l, kGdown, a.act, x.dh_bf, ld_dh_bf, x.act, n));
    LATHE_TRY(phase(kPhElementwise));
    LATHE_TRY(cuda::swiglu_rows_backward(ctx, {.gu = a.gu, .d_out = x.act, .d_gu = a.gu, .n_tokens = n,
                                               .inter = F, .ld_gu = ld_gu, .ld_d_gu = ld_gu}));
  }
  LATHE_TRY(group_backward(l, kGgu, a.xn2, a.gu, ld_gu, x.d_xn, n));
  LATHE_TRY(phase(kPhElementwise));
  if (o.full_sft) LATHE_TRY(sft_norm_grad(sft.blocks[size_t(l)].mlp_norm, x.d_xn, a.h_mid, a.rstd2, n, H));
  LATHE_TRY(cuda::rms_norm_residual_backward(ctx, {.h = a.h_mid, .w = b.mlp_norm, .rstd = a.rstd2, .dy = x.d_xn,
                                                   .dh = x.dh, .dh_bf = x.dh_bf, .rows = n, .dim = H,
                                                   .accumulate = true, .ld_dh_bf = ld_dh_bf}));
  return attention_backward(l, n, n_docs, max_seqlen);
}

// down's backward (LoRA without dropout, or no LoRA on down) in the order
// that needs silu(gate)·up last: du, then dx = d act straight into the
// scratch's act rows (x_ext's stride, its LoRA columns untouched), then
// SwiGLU's backward, which turns d act back into act in place (bitwise the
// forward's) as it makes [gate | up]'s gradient, then down's LoRA u (when
// not kept or left by full's rerun), dB and dA. The recompute modes keep no
// separate SwiGLU forward for act, and dx waits for none of down's LoRA
// gradients. With the side stream, u, dB and dA run there (one fork after
// SwiGLU's backward: du, act are made); the done event recorded after them
// is what gate|up's dx waits for, as it overlays act (x.d_xn).
Status CudaModelImpl::down_backward(int64_t l, int64_t n) {
  const CGroup& G = blocks[size_t(l)].g[kGdown];
  CActs& a = act_of(l);
  const int64_t nl = int64_t(G.loras.size());
  const bool act_kept = a.act != x.act;  // none: the forward's act and u, per layer
  const bool u_left = o.recompute == CudaRecompute::kFull && l != last_shared;  // full's rerun: u in x.act's row
  const bool on_side = overlap() && nl > 0;
  if (nl > 0) {
    LATHE_TRY(phase(kPhLora));
    LATHE_TRY(lora_du(G, x.dh_bf, ld_dh_bf, n));
  } else {
    LATHE_TRY(side_before_dx(false, false));
  }
  LATHE_TRY(phase(kPhGemmBwd));
  LATHE_TRY(cuda::gemm(ctx, {.a = x.dh_bf, .b = G.w, .c = x_of(x.act, kGdown), .m = n, .n = G.in,
                             .k = G.out + G.lw, .lda = ld_dh_bf, .ldb = G.ldw, .ldc = G.ldx}));
  LATHE_TRY(phase(kPhElementwise));
  LATHE_TRY(cuda::swiglu_rows_backward_act(ctx, {.gu = a.gu, .d_out = x_of(x.act, kGdown), .d_gu = a.gu,
                                                 .n_tokens = n, .inter = s.inter, .ld_gu = ld_gu,
                                                 .ld_d_out = G.ldx, .ld_d_gu = ld_gu,
                                                 .write_act = nl > 0 && !act_kept}));
  if (nl == 0) return Status::ok();
  if (!act_kept && !u_left) LATHE_TRY(lora_u_for_grads(l, kGdown, x.act, n));
  LATHE_TRY(phase(kPhLora));
  if (on_side) LATHE_TRY(side_fork());
  cuda::CudaContext& c = on_side ? *side.ctx : ctx;
  float* part = (on_side ? x.lora_side_f32 : x.lora_f32) + lora_part_floats(n * G.lw);
  CPartSums sums;
  LATHE_TRY(lora_db(c, part, G, a.act, x.dh_bf, ld_dh_bf, n, sums));
  if (separate_lora_sums) LATHE_TRY(sums.flush(c));
  LATHE_TRY(lora_da(c, part, G, a.act, x.dh_bf, ld_dh_bf, n, sums));
  LATHE_TRY(sums.flush(c));
  return side_before_dx(on_side, false);
}

// The attention half of layer l's backward.
Status CudaModelImpl::attention_backward(int64_t l, int64_t n, int n_docs, int max_seqlen) {
  const CBlock& b = blocks[size_t(l)];
  CActs& a = act_of(l);
  const int64_t H = s.hidden, hd = s.head_dim, nh = s.n_head, nkv = s.n_kv;
  LATHE_TRY(group_backward(l, kGo, a.attn, x.dh_bf, ld_dh_bf, x.d_attn, n));
  LATHE_TRY(phase(kPhAttnBwd));
  const std::array<size_t, 2> spare = ds_spare_bytes();
  LATHE_TRY(cuda::attention_varlen_backward(
      {.q = a.q, .k = a.k, .v = a.v, .out = x_of(a.attn, kGo), .lse = a.lse, .d_out = x.d_attn, .d_q = x.dq, .d_k = x.dk,
       .d_v = x.dv, .cu_seqlens = x.cu_seqlens, .workspace = x.attn_ws, .n_docs = n_docs, .max_seqlen = max_seqlen,
       .n_tokens = int(n), .n_head = int(nh), .n_head_kv = int(nkv), .head_dim = int(hd), .window = s.window,
       .scale = 1.0f / std::sqrt(float(hd)), .stream = ctx.stream(), .ld_out = group(kGo).ldx,
       .workspace_bytes = x.attn_ws_bytes, .ds_spare = {spare[0] ? a.gu : nullptr, spare[1] ? a.h_mid : nullptr},
       .ds_spare_bytes = {spare[0], spare[1]}}));
  LATHE_TRY(phase(kPhElementwise));
  cuda::QkvSplitArgs merge{.qkv = x.qkv, .q = x.dq, .k = x.dk, .v = x.dv, .cos = x.cos, .sin = x.sin,
                           .n_tokens = n, .n_head = nh, .n_head_kv = nkv, .head_dim = hd, .ld_qkv = ld_qkv};
  if (s.qk_norm) {  // RoPE's inverse, then the q/k norms' backward (bf16 in place), before merging
    LATHE_TRY(cuda::rope_apply(ctx, {.x = x.dq, .cos = x.cos, .sin = x.sin, .n_tokens = n, .n_head = nh,
                                     .half = hd / 2, .inverse = true}));
    LATHE_TRY(cuda::rope_apply(ctx, {.x = x.dk, .cos = x.cos, .sin = x.sin, .n_tokens = n, .n_head = nkv,
                                     .half = hd / 2, .inverse = true}));
    if (o.full_sft) {  // before the norms' backward writes over dq, dk
      LATHE_TRY(sft_norm_grad(sft.blocks[size_t(l)].q_norm, x.dq, a.q_raw, a.q_rstd, n * nh, hd));
      LATHE_TRY(sft_norm_grad(sft.blocks[size_t(l)].k_norm, x.dk, a.k_raw, a.k_rstd, n * nkv, hd));
    }
    LATHE_TRY(cuda::rms_norm_residual_backward(ctx, {.h = a.q_raw, .w = b.q_norm, .rstd = a.q_rstd, .dy = x.dq,
                                                     .dh_bf = x.dq, .rows = n * nh, .dim = hd}));
    LATHE_TRY(cuda::rms_norm_residual_backward(ctx, {.h = a.k_raw, .w = b.k_norm, .rstd = a.k_rstd, .dy = x.dk,
                                                     .dh_bf = x.dk, .rows = n * nkv, .dim = hd}));
    merge.cos = merge.sin = nullptr;
  }
  LATHE_TRY(cuda::qkv_merge(ctx, merge));
  LATHE_TRY(group_backward(l, kGqkv, a.xn1, x.qkv, ld_qkv, x.d_xn, n));
  LATHE_TRY(phase(kPhElementwise));
  if (o.full_sft) LATHE_TRY(sft_norm_grad(sft.blocks[size_t(l)].attn_norm, x.d_xn, hs[size_t(l)], a.rstd1, n, H));
  // Layer 0's input gradient is not read as bf16.
  return cuda::rms_norm_residual_backward(ctx, {.h = hs[size_t(l)], .w = b.attn_norm, .rstd = a.rstd1,
                                                .dy = x.d_xn, .dh = x.dh, .dh_bf = l > 0 ? x.dh_bf : nullptr,
                                                .rows = n, .dim = H, .accumulate = true, .ld_dh_bf = ld_dh_bf});
}

Status CudaModelImpl::upload_batch(const MicroBatch& mb, int* n_docs, int* max_seqlen) {
  LATHE_TRY(check_micro_batch(mb, o.max_tokens, s.vocab));
  const size_t n = mb.input_ids.size();
  *n_docs = int(mb.cu_seqlens.size()) - 1;
  *max_seqlen = 0;
  for (int d = 0; d < *n_docs; ++d) *max_seqlen = std::max(*max_seqlen, mb.cu_seqlens[size_t(d + 1)] - mb.cu_seqlens[size_t(d)]);
  if (*n_docs > o.max_tokens) return invalid_argument("cuda forward: more documents than tokens");
  LATHE_TRY(cuda::copy_to_device(ctx, x.tokens, mb.input_ids.data(), n * 4));
  LATHE_TRY(cuda::copy_to_device(ctx, x.targets, mb.labels.data(), n * 4));
  LATHE_TRY(cuda::copy_to_device(ctx, x.positions, mb.position_ids.data(), n * 4));
  return cuda::copy_to_device(ctx, x.cu_seqlens, mb.cu_seqlens.data(), mb.cu_seqlens.size() * 4);
}

Result<PassLoss> CudaModelImpl::run(const MicroBatch& mb, float loss_scale, bool backward) {
  int n_docs = 0, max_seqlen = 0;
  LATHE_TRY(phase(kPhInput));
  LATHE_TRY(upload_batch(mb, &n_docs, &max_seqlen));
  training_pass = backward;
  start_pass();
  LATHE_TRY(phase(kPhElementwise));
  const int64_t n = mb.n_tokens(), H = s.hidden, L = s.n_layer;
  LATHE_TRY(cuda::rope_tables(ctx, {.inv_freq = x.inv_freq, .positions = x.positions, .cos = x.cos, .sin = x.sin,
                                    .n_tokens = n, .half = s.head_dim / 2}));
  LATHE_TRY(phase(kPhInput));  // the gather reads pinned host memory over PCIe with host_embed
  LATHE_TRY(cuda::embedding_forward(ctx, {.tokens = x.tokens, .table = embed, .out = hs[0], .n = n,
                                          .vocab = s.vocab, .dim = H}));
  LATHE_TRY(phase(kPhElementwise));
  const int64_t ld_xn1 = group(kGqkv).ldx;
  LATHE_TRY(norm(hs[0], nullptr, nullptr, blocks[0].attn_norm, x_of(act_of(0).xn1, kGqkv), act_of(0).rstd1, n, H,
                 ld_xn1));
  for (int64_t l = 0; l < L; ++l) {
    LATHE_TRY(layer_forward(l, n, n_docs, max_seqlen));
    LATHE_TRY(phase(kPhElementwise));
    const bool last = l + 1 == L;
    LATHE_TRY(norm(x.tmp_h, act_of(l).h_mid, hs[size_t(l + 1)], last ? final_norm : blocks[size_t(l + 1)].attn_norm,
                   last ? x.xf : x_of(act_of(l + 1).xn1, kGqkv), last ? x.rstd_f : act_of(l + 1).rstd1, n, H,
                   last ? 0 : ld_xn1));
  }
  LATHE_TRY(phase(kPhHead));
  // The loss counters stay on the device until the pass is enqueued: one
  // wait at its end, not a drained stream between forward and backward.
  Status ce = cuda::cross_entropy_enqueue(ctx, {.hidden = x.xf, .w = lm_head, .targets = x.targets,
                                                .d_hidden = backward ? x.d_xf : nullptr,
                                                .d_w = backward && o.full_sft ? sft.lm_head : nullptr,
                                                .workspace = x.ce_ws, .n = n, .vocab = s.vocab, .dim = H,
                                                .grad_scale = loss_scale},
                                          x.ce_counters);
  if (!ce.is_ok()) return ce.with_context("cuda forward");
  auto pass_loss = [&]() -> Result<PassLoss> {
    auto stats = cuda::cross_entropy_counters(ctx, x.ce_counters, s.vocab);
    if (!stats.is_ok()) return stats.status().with_context("cuda forward");
    return PassLoss{.loss_sum = stats->loss_sum, .n_supervised = stats->n_valid};
  };
  if (!backward) return pass_loss();
  LATHE_TRY(phase(kPhElementwise));
  if (o.full_sft) LATHE_TRY(sft_norm_grad(sft.final_norm, x.d_xf, hs[size_t(L)], x.rstd_f, n, H));
  LATHE_TRY(cuda::rms_norm_residual_backward(ctx, {.h = hs[size_t(L)], .w = final_norm, .rstd = x.rstd_f,
                                                   .dy = x.d_xf, .dh = x.dh, .dh_bf = x.dh_bf, .rows = n,
                                                   .dim = H, .ld_dh_bf = ld_dh_bf}));
  LATHE_TRY(offload_begin_backward(n));
  for (int64_t l = L - 1; l >= 0; --l) {
    LATHE_TRY(recompute(l, n, n_docs, max_seqlen));
    LATHE_TRY(offload_before_backward(l));
    LATHE_TRY(layer_backward(l, n, n_docs, max_seqlen));
    LATHE_TRY(offload_after_backward(l, n));
  }
  LATHE_TRY(side_join());  // the LoRA gradients are complete on the main stream
  if (o.full_sft) LATHE_TRY(sft_embedding_grad(mb));  // x.dh: the gradient of hs[0]
  LATHE_TRY(ctx.check_launch("cuda backward"));
  return pass_loss();
}

}  // namespace lathe
