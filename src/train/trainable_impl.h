// Internal to TrainableModel: the model as raw f32 pointers into the frozen
// base or the flat parameter buffer (bf16 pointers for the frozen matrices
// under bf16_base), and what one layer's forward keeps for its backward. Shared by trainable_model.cpp (load, save) and
// trainable_pass.cpp (forward, backward).
#pragma once

#include <array>
#include <memory>
#include <span>
#include <vector>

#include "backends/cpu/gemm_amx.h"
#include "backends/cpu/gemm_bf16.h"

#include "models/family.h"
#include "nn/arena.h"
#include "nn/lora.h"
#include "train/trainable_model.h"

namespace lathe {

// Where a CPU pass spends its time, when TrainableModel::set_phase_timing is on.
// kPhaseFused: base and adapter products run as one group (trainable_fused.cpp).
enum Phase : int { kPhaseBase, kPhaseLora, kPhaseAttention, kPhaseHead, kPhaseFused, kNumPhases };

// The seven projections of a decoder layer, in HF order.
enum Proj : int { kQ, kK, kV, kO, kGate, kUp, kDown, kNumProj };

struct TLinear {
  float* w = nullptr;   // [out, in]; null when the frozen base is held in bf16
  const uint16_t* w16 = nullptr;  // [out, in] bf16 (bf16_base), else null
  const cpu::PackedBf16Weight* packed = nullptr;  // w16 packed for its GEMMs (bf16_base), else null
  float* b = nullptr;   // [out] or null
  float* dw = nullptr;  // gradients when the weight trains, else null
  float* db = nullptr;
  int64_t out = 0, in = 0;
  int lora = -1;        // index into TrainableModelImpl::loras, or -1
};

struct TNorm {
  float* w = nullptr;   // [dim]; null when the layer has no such norm
  float* dw = nullptr;
  int64_t dim = 0;
};

struct TLora {
  float *a = nullptr, *b = nullptr, *da = nullptr, *db = nullptr;  // A [r, in], B [out, r]
  int64_t r = 0, in = 0, out = 0;
};

struct TBlock {
  TNorm attn_norm, mlp_norm, q_norm, k_norm;
  std::array<TLinear, kNumProj> proj;
};

// One layer's forward, kept for its backward (views into the arena).
struct LayerActs {
  TensorView h_in, xn1, rstd1, q_raw, k_raw, q_rstd, k_rstd, q, k, v, attn, lse, h_mid, xn2, rstd2, gate, up, act;
  std::array<LoraSaved, kNumProj> lora;
};

// What every layer of one pass shares.
struct PassCtx {
  int64_t n = 0;
  TensorView cos, sin;     // [n, head_dim / 2]
  TensorView cu_seqlens;   // [n_docs + 1] i32
  TensorView attn_ws;      // attention workspace
  uint64_t dropout_base = 0;
  float dropout = 0.0f;     // LoRA dropout of this pass: the recipe's in training, 0 in evaluation
};

class TrainableModelImpl {
 public:
  ModelConfig cfg;
  FamilyQuirks quirks;
  TrainableModelOptions opts;
  std::string model_dir;
  std::vector<float> inv_freq;      // [head_dim / 2]
  std::vector<Tensor> frozen;       // keeps the frozen base alive
  std::vector<std::unique_ptr<cpu::PackedBf16Weight>> packed;  // the bf16 matrices packed (bf16_base)
  Tensor params, grads;             // flat f32
  std::vector<ParamInfo> table;
  float* embed = nullptr;           // [vocab, hidden]; null when held in bf16
  const uint16_t* embed16 = nullptr;  // [vocab, hidden] bf16 (bf16_base)
  float* d_embed = nullptr;
  TLinear lm_head;                  // w may alias embed (tied)
  TNorm final_norm;
  std::vector<TBlock> blocks;
  std::vector<TLora> loras;
  Arena arena;
  std::vector<TensorView> hs;   // [n_layer + 1] layer inputs of the current pass
  std::vector<LayerActs> acts;  // [n_layer], or [1] with activation checkpointing
  uint64_t passes = 0;
  bool time_phases = false;
  std::array<double, kNumPhases> phase_s{};  // wall seconds per phase
  double pass_s = 0;                         // wall seconds of whole passes

  // Adds the wall time of its scope to phase p (when timing is on).
  class PhaseScope {
   public:
    PhaseScope(TrainableModelImpl& m, Phase p);
    ~PhaseScope();
    PhaseScope(const PhaseScope&) = delete;
    PhaseScope& operator=(const PhaseScope&) = delete;

   private:
    double* acc_;
    int64_t t0_ns_ = 0;
  };

  Result<PassLoss> run(const MicroBatch& mb, float loss_scale, bool backward);

 private:
  Result<PassLoss> run_timed(const MicroBatch& mb, float loss_scale, bool backward);
  Status layer_forward(int l, const PassCtx& p, TensorView h_in, TensorView h_out, LayerActs& s);
  Status layer_backward(int l, const PassCtx& p, const LayerActs& s, TensorView dh);
  Status lin_forward(int l, Proj j, const PassCtx& p, TensorView x, TensorView y, bool accumulate, LoraSaved* saved);
  Status lin_backward(int l, Proj j, const PassCtx& p, TensorView x, TensorView dy, TensorView dx, bool accumulate,
                      const LoraSaved& saved);
  // Projections sharing input x (q/k/v, gate/up): each y = x·Wᵀ (+ LoRA),
  // their adapters as one group under bf16_base; dx = Σ of their input
  // gradients (overwritten).
  Status lin_forward_group(int l, std::span<const Proj> js, const PassCtx& p, TensorView x,
                           std::span<const TensorView> ys, LayerActs& s);
  Status lin_backward_group(int l, std::span<const Proj> js, const PassCtx& p, TensorView x,
                            std::span<const TensorView> dys, TensorView dx, const LayerActs& s);
  // bf16-mixed on AMX (trainable_fused.cpp): whether projections js of
  // layer l (sharing one input) can run fused, and their forward (y_i =
  // x·W_iᵀ + LoRA, overwriting or accumulating) and backward (dx = Σ input
  // gradients, overwriting or accumulating; adapters' dA, dB accumulated).
  bool fused_ok(int l, std::span<const Proj> js) const;
  // after: row-local work on each chunk of rows once the group is done with
  // it (gemm_amx.h, AmxGroupAfter), e.g. SwiGLU on fresh gate and up rows.
  Status fused_forward(int l, std::span<const Proj> js, TensorView x, std::span<const TensorView> ys,
                       bool accumulate, LayerActs& s, const cpu::AmxGroupAfter* after = nullptr);
  Status fused_backward(int l, std::span<const Proj> js, TensorView x, std::span<const TensorView> dys,
                        TensorView dx, bool accumulate, const LayerActs& s,
                        const cpu::AmxGroupAfter* after = nullptr, const cpu::AmxGroupAfter* before = nullptr);
  // One projection: fused when it can be, else lin_forward / lin_backward.
  Status lin_forward_one(int l, Proj j, const PassCtx& p, TensorView x, TensorView y, bool accumulate,
                         LayerActs& s);
  Status lin_backward_one(int l, Proj j, const PassCtx& p, TensorView x, TensorView dy, TensorView dx,
                          const LayerActs& s);
  Status base_forward(const TLinear& L, TensorView x, TensorView y, bool accumulate);
  Status base_backward(const TLinear& L, TensorView x, TensorView dy, TensorView dx, bool accumulate);
  LoraWeights lora_weights(int l, Proj j, const PassCtx& p) const;
  bool bf16_adapters() const;
};

}  // namespace lathe
