// Internal to CudaTrainableModel: device pointers into the one arena (the
// frozen base, the flat LoRA parameters, per-layer activations, scratch)
// shared by cuda_model.cpp (planning, weights, optimizer) and
// cuda_model_pass.cpp (forward and backward).
//
// Projections are fused by input: q|k|v, o, gate|up and down are one GEMM
// each (a group's weights are its members' stacked by rows, so one output
// row is [q | k | v] or [gate | up]), and the LoRA terms ride in that GEMM's
// K dimension, so each projection is one GEMM that rounds once. A group
// with LoRA members (w = n_lora·4r columns of 4-term copies, lora_ops.h)
// keeps ONE extended weight, row stride ldw = in + w:
//
//              columns [0, in)          [in, in + w)
//   rows [0, out)        W               B4 of the member owning the row, in
//                                        its slot's 4r columns (zeros in the
//                                        other slots: block-diagonal)
//   rows [out, out + w)  A4 planes of    zero (never read)
//                        the members,
//                        in slot order
//
// and its GEMM input x carries the same w columns after its in: x_ext =
// [x | s·u4] with u = x·Aᵀ (f32, from x·A4ᵀ) split into 4 terms. Then
//   forward   y  = x_ext · W_ext[0:out, :]ᵀ      = x·Wᵀ + s·u·Bᵀ     (K = in + w)
//   backward  dx = dy_ext · W_ext[:, 0:in]       = dy·W + du·A       (K = out + w)
// with dy_ext = [dy | du4], du = s·dy·B (f32, from dy·B4) split the same
// way; u's and du's GEMMs read A4 and B4 inside W_ext (ldb = ldw), and
// dB = dyᵀ·(s·u), dA = duᵀ·x read the hi and lo terms back out of x_ext and
// dy_ext. A group without LoRA has w = 0 (ldw = in). The buffers a GEMM
// reads as x_ext (xn1, attn, xn2, act) and dy_ext (the q|k|v scratch,
// gate|up, dh_bf) are allocated with the extra columns; their producers
// write rows with a stride.
#pragma once

#include <array>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/lora_ops.h"
#include "backends/cuda/phase_timer.h"
#include "train/cuda_model.h"

namespace lathe {

using bf16p = cuda::bf16_bits*;

enum CudaProj : int { kCq, kCk, kCv, kCo, kCgate, kCup, kCdown, kCnumProj };
enum CudaGroup : int { kGqkv, kGo, kGgu, kGdown, kGnum };
inline constexpr CudaGroup kGroupOf[kCnumProj] = {kGqkv, kGqkv, kGqkv, kGo, kGgu, kGgu, kGdown};

// What the phase timer (CudaTrainableModel::set_phase_timing) charges time to.
enum CudaPhase : int {
  kPhGemmFwd, kPhGemmBwd, kPhLora, kPhAttnFwd, kPhAttnBwd, kPhElementwise, kPhHead, kPhOptimizer, kPhInput,
  kPhNum
};
inline const char* const kCudaPhaseNames[kPhNum] = {
    "base GEMM fwd", "base GEMM bwd", "LoRA (f32 branch)", "attention fwd", "attention bwd",
    "norms, RoPE, SwiGLU, casts", "LM head + CE", "clip + AdamW + LoRA copies", "batch upload"};

// One fused projection: y[T, out] = x[T, in]·wᵀ [+ bias] + Σ LoRA members.
struct CGroup {
  bf16p w = nullptr;     // [out + lw, ldw]: the extended weight (above)
  bf16p bias = nullptr;  // [out] (the bias epilogue); null without bias
  int64_t out = 0, in = 0;
  int64_t lw = 0;   // the LoRA columns: loras.size()·4r
  int64_t ldw = 0;  // in + lw: the row stride of w and of the group's x_ext
  std::vector<int> loras;  // indices into loras, in slot order
  bf16p a4() const { return w + out * ldw; }  // [lw, in] (row stride ldw): the members' A copies stacked
};

struct CLora {
  float *a = nullptr, *b = nullptr, *da = nullptr, *db = nullptr;  // fp32 masters and grads
  // 4-term bf16 copies (lora_ops.h) inside the group's w (row stride ldw):
  // A4 [4r, in] and B4 [out, 4r].
  bf16p a4 = nullptr, b4 = nullptr;
  int64_t r = 0, in = 0, out = 0;
  int64_t col = 0;  // first column of the member in its group's output
  int64_t slot = 0;  // position among the group's LoRA members
};

struct CBlock {
  bf16p attn_norm = nullptr, mlp_norm = nullptr, q_norm = nullptr, k_norm = nullptr;
  std::array<CGroup, kGnum> g;
};

// One layer's forward as its backward reads it (the layer input is hs[l]).
// Which buffers are per layer and which one shared copy is recomputed in
// the backward depends on the recompute mode (cuda_model.h). The GEMM
// inputs xn1, attn, xn2 and act are x_ext rows (row stride the group's ldw:
// x, then the 4-term s·u of the group's LoRA members).
struct CActs {
  bf16p xn1 = nullptr, q_raw = nullptr, k_raw = nullptr, q = nullptr, k = nullptr, v = nullptr, attn = nullptr;
  bf16p h_mid = nullptr, xn2 = nullptr;
  bf16p gu = nullptr;   // [T, 2F] = [gate | up], row stride CudaModelImpl::ld_gu (then dy_ext of gate|up)
  bf16p act = nullptr;  // silu(gate)·up [T, F]: kept with none, else the scratch's act (recomputed)
  float *rstd1 = nullptr, *q_rstd = nullptr, *k_rstd = nullptr, *lse = nullptr, *rstd2 = nullptr;
};

// Buffers every layer reuses, and the batch's inputs.
struct CScratch {
  bf16p qkv = nullptr;  // [T, q|k|v] (row stride ld_qkv): the fused projection's output, then dy_ext
  bf16p tmp_h = nullptr, d_xn = nullptr, d_attn = nullptr;
  bf16p act = nullptr;  // silu(gate)·up x_ext [T, F + lw] when not kept, then its gradient (packed)
  bf16p dq = nullptr, dk = nullptr, dv = nullptr, xf = nullptr, d_xf = nullptr;
  bf16p dh_bf = nullptr;  // dh rounded to bf16 by the norm backward that made dh (row stride ld_dh_bf)
  float* lora_f32 = nullptr;  // a LoRA GEMM's partial products, summed by lora_sum_parts
  float *dh = nullptr, *rstd_f = nullptr, *cos = nullptr, *sin = nullptr, *inv_freq = nullptr;
  void *ce_ws = nullptr, *attn_ws = nullptr;  // ce_ws overlays the layers' scratch (cuda_model.cpp)
  int32_t *tokens = nullptr, *targets = nullptr, *positions = nullptr, *cu_seqlens = nullptr;
};

struct CudaModelImpl {
  CudaModelShape s;
  CudaTrainOptions o;
  cuda::CudaContext ctx;
  cuda::DeviceArena arena;
  bf16p embed = nullptr, lm_head = nullptr, final_norm = nullptr;
  std::vector<CBlock> blocks;
  std::vector<CLora> loras;
  // Row strides of the dy_ext buffers: the q|k|v scratch and gate|up (out +
  // lw of their group), dh_bf (dy of o and down: hidden + the larger lw).
  int64_t ld_qkv = 0, ld_gu = 0, ld_dh_bf = 0;
  // A group's shape (every layer has the same).
  const CGroup& group(int g) const { return blocks[0].g[size_t(g)]; }
  std::vector<bf16p> hs;     // [n_layer + 1]: layer inputs, then the last layer's output
  std::vector<CActs> acts;   // [n_layer]; shared buffers repeat the same pointer
  // The last layer whose forward writes the shared buffers: they still hold
  // its activations when the backward reaches it, so it recomputes nothing
  // (-1: nothing shared).
  int64_t last_shared = -1;
  // Selective: layers [0, keep_layers) keep q/k/v, h_mid and their LoRA u
  // (planned from CudaTrainOptions::max_arena_bytes) and rerun no GEMM.
  int64_t keep_layers = 0;
  CScratch x;
  float* params = nullptr;   // flat LoRA masters
  float* grads = nullptr;
  // master → 4-term copy inside the groups' w, per factor (dst counts from
  // the arena's base)
  std::vector<cuda::LoraSplitFactor> factors;
  cuda::LoraSplitFactor* split_table = nullptr;  // device copy of factors
  int64_t max_factor_numel = 0;
  int64_t n_flat = 0;
  std::vector<ParamInfo> table;
  // A base tensor on the device: rows × cols, rows ld elements apart (a
  // projection's rows inside its group's extended weight).
  struct BaseTensor {
    bf16p p = nullptr;
    int64_t rows = 0, cols = 0, ld = 0;
    int64_t numel() const { return rows * cols; }
  };
  std::map<std::string, BaseTensor> base;
  std::optional<cuda::CudaAdamW> adamw;
  std::optional<cuda::PhaseTimer> timer;  // set while phase timing is on
  // Charges what is enqueued from here on to phase p (no-op without a timer).
  Status phase(CudaPhase p) { return timer ? timer->mark(ctx, p) : Status::ok(); }

  CActs& act_of(int64_t l) { return acts[size_t(l)]; }
  Result<PassLoss> run(const MicroBatch& mb, float loss_scale, bool backward);
  Status refresh_split();  // the 4-term copies from the masters

 private:
  Status upload_batch(const MicroBatch& mb, int* n_docs, int* max_seqlen);
  Status attention_inputs(int64_t l, int64_t n);
  Status layer_forward(int64_t l, int64_t n, int n_docs, int max_seqlen);
  Status recompute(int64_t l, int64_t n, int n_docs, int max_seqlen);
  Status layer_backward(int64_t l, int64_t n, int n_docs, int max_seqlen);
  Status attention_backward(int64_t l, int64_t n, int n_docs, int max_seqlen);
  Status lora_u(int64_t l, int g, bf16p x_ext, int64_t n);
  Status group_forward(int64_t l, int g, bf16p x_ext, bf16p y, int64_t ld_y, int64_t n);
  Status group_backward(int64_t l, int g, bf16p x_ext, bf16p dy_ext, int64_t ld_dy, bf16p dx, int64_t n);
  Status norm(const bf16p x, const bf16p residual, bf16p h_out, const bf16p w, bf16p y, float* rstd, int64_t rows,
              int64_t dim, int64_t ld_y = 0);
};

}  // namespace lathe
