// Internal to CudaTrainableModel: device pointers into the one arena (the
// frozen base, the flat LoRA parameters, per-layer activations, scratch)
// shared by cuda_model.cpp (planning, weights, optimizer) and
// cuda_model_pass.cpp (forward and backward).
//
// Projections are fused by input: q|k|v, o, gate|up and down are one GEMM
// each (a group's weights are its members' stacked by rows, so one output
// row is [q | k | v] or [gate | up]); the LoRA A factors of a group's
// members are stacked the same way (one x·Aᵀ GEMM per group), while each
// member's B writes its own column block of the group's output.
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
  bf16p w = nullptr;      // [out, in]
  bf16p bias8 = nullptr;  // [8, out]: row 0 the bias, rows 1..7 zero; null without bias
  int64_t out = 0, in = 0;
  std::vector<int> loras;  // indices into loras, in slot order
  bf16p a4 = nullptr;      // [loras.size()·4r, in]: the members' A copies stacked
};

struct CLora {
  float *a = nullptr, *b = nullptr, *da = nullptr, *db = nullptr;  // fp32 masters and grads
  bf16p a4 = nullptr, b4 = nullptr;  // 4-term bf16 copies (lora_ops.h): [4r, in], [out, 4r]
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
// the backward depends on the recompute mode (cuda_model.h).
struct CActs {
  bf16p xn1 = nullptr, q_raw = nullptr, k_raw = nullptr, q = nullptr, k = nullptr, v = nullptr, attn = nullptr;
  bf16p h_mid = nullptr, xn2 = nullptr, gu = nullptr;  // gu: [T, 2F] = [gate | up]
  bf16p act = nullptr;  // silu(gate)·up [T, F]: kept with none, else the scratch's act (recomputed)
  float *rstd1 = nullptr, *q_rstd = nullptr, *k_rstd = nullptr, *lse = nullptr, *rstd2 = nullptr;
  std::array<bf16p, kGnum> u{};  // x·Aᵀ per group, 4-term [T, n_lora, 4, r]
};

// Buffers every layer reuses, and the batch's inputs.
struct CScratch {
  bf16p qkv = nullptr;  // [T, q|k|v]: the fused projection's output, then its gradient
  bf16p tmp_h = nullptr, d_xn = nullptr, d_attn = nullptr;
  bf16p act = nullptr;  // silu(gate)·up [T, F] when not kept, then its gradient
  bf16p dq = nullptr, dk = nullptr, dv = nullptr, xf = nullptr, d_xf = nullptr;
  bf16p dh_bf = nullptr;  // dh rounded to bf16 by the norm backward that made dh
  bf16p du = nullptr;         // s·dy·B per group member, 4-term [T, n_lora, 4, r]
  float* lora_f32 = nullptr;  // a LoRA GEMM's partial products, summed by lora_sum_parts
  bf16p ones8 = nullptr;  // [max_tokens, 8], column 0 ones
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
  bf16p split = nullptr;     // 4-term copies of the masters, grouped (CGroup::a4)
  int64_t n_split = 0;
  std::vector<cuda::LoraSplitFactor> factors;     // master → copy, per factor
  cuda::LoraSplitFactor* split_table = nullptr;  // device copy of factors
  int64_t max_factor_numel = 0;
  int64_t n_flat = 0;
  std::vector<ParamInfo> table;
  std::map<std::string, std::pair<bf16p, int64_t>> base;  // name -> (device tensor, elements)
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
  Status group_forward(int64_t l, int g, const bf16p x, bf16p y, int64_t n);
  Status group_backward(int64_t l, int g, const bf16p x, const bf16p dy, bf16p dx, int64_t n, bool accumulate);
  Status norm(const bf16p x, const bf16p residual, bf16p h_out, const bf16p w, bf16p y, float* rstd, int64_t rows,
              int64_t dim);
};

}  // namespace lathe
