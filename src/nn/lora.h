// LoRA (low-rank adaptation) of a linear layer, as PEFT defines it:
//   y = x·Wᵀ + b + scale · dropout(x)·Aᵀ·Bᵀ,   scale = alpha / r, or alpha / √r with rsLoRA
// A [r, in] starts as PEFT's nn.init.kaiming_uniform_(a=√5), i.e. uniform on
// (−1/√in, 1/√in), drawn from lathe's own seeded generator; B [out, r] starts
// at zero, so training starts from the base model exactly.
//
// Dropout masks are a counter-based hash of (seed, element index): a forward
// recomputed for activation checkpointing draws the same mask, and backward
// needs no stored mask. Adapters are named as NeMo does (linear_qkv,
// linear_proj, linear_fc1, linear_fc2) or as Hugging Face does (q_proj ...
// down_proj); both map to the HF leaves.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "nn/arena.h"

namespace lathe {

struct LoraConfig {
  int r = 32;             // peft.dim
  float alpha = 32.0f;    // peft.alpha
  float dropout = 0.0f;   // peft.dropout
  bool rslora = false;    // scale alpha / √r instead of alpha / r
  std::vector<std::string> target_modules = {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"};
  float scale() const;
  Status validate() const;  // messages start with "peft: "
};

// The HF leaves the modules name, in layer order (q_proj, k_proj, v_proj,
// o_proj, gate_proj, up_proj, down_proj order, no duplicates). Unknown names
// are an error listing the known ones.
Result<std::vector<std::string>> lora_target_leaves(const std::vector<std::string>& modules);
// Where a leaf sits in a decoder layer: "q_proj" → "self_attn.q_proj".
std::string lora_module_path(const std::string& leaf);

// Merges an adapter into its weight: w [out, in] += scale · b [out, r] · a [r, in],
// all f32, accumulated into w one rank at a time (the order every merge in
// lathe uses, so a model merged at load and one merged at export agree bit for
// bit). Borrows all three; OpenMP over rows.
void lora_merge(float* w, const float* a, const float* b, int64_t out, int64_t in, int64_t r, float scale);

// Kaiming-uniform A [r, in] from seed (splitmix64; the same on every platform).
void lora_init_a(float* a, int64_t r, int64_t in, uint64_t seed);
// True when element i survives dropout p under seed.
bool lora_dropout_keep(uint64_t seed, int64_t i, float p);

struct LoraWeights {
  TensorView a{};   // [r, in] f32
  TensorView b{};   // [out, r] f32
  TensorView da{};  // [r, in] f32, accumulated; empty when frozen
  TensorView db{};  // [out, r] f32, accumulated
  float scale = 1.0f;
  float dropout = 0.0f;
  uint64_t dropout_seed = 0;  // this adapter's mask for this pass
  // bf16-mixed: the four products that carry activations forward and back
  // (x·Aᵀ, u·Bᵀ, dy·B, du·A) take bf16 operands, rounded to nearest-even,
  // with f32 sums (gemm_bf16: AMX tiles on CPUs with them), as autocast
  // runs an adapter's matmuls; the weight gradients dA = duᵀ·x and
  // dB = dyᵀ·u stay f32 products, and A, B, u and every gradient stay f32
  // in memory. False: all f32.
  bool bf16 = false;
};

// What forward keeps for backward (views into the caller's arena).
struct LoraSaved {
  TensorView x_drop{};  // [n, in] dropout(x); empty when dropout is 0 (x itself is used)
  TensorView u{};       // [n, r] scale · dropout(x)·Aᵀ
};

// y += scale·dropout(x)·Aᵀ·Bᵀ; x [n, in], y [n, out]. With saved, its views
// are allocated from arena and outlive the call; without, scratch is scoped.
Status lora_forward(const LoraWeights& w, TensorView x, TensorView y, Arena& arena, LoraSaved* saved);
// da += ∂/∂A, db += ∂/∂B, and dx += ∂/∂x through the adapter (dx may be
// empty). x is forward's input, saved what forward kept. Scratch is scoped.
Status lora_backward(const LoraWeights& w, TensorView x, TensorView dy, TensorView dx, const LoraSaved& saved,
                     Arena& arena);

// Adapters on linears that share their input x (q/k/v, gate/up), dropout 0
// and one scale: x·Aᵀ of all of them is one GEMM (x is read and packed once,
// the product is Σr wide instead of r), and in backward the A gradients and
// dx are one GEMM each. The same sums as lora_forward / lora_backward on
// each adapter, in another order (so not bit-identical to them). Falls back
// to those when the adapters do not qualify. saved: one per adapter, required.
constexpr size_t kMaxLoraGroup = 3;
Status lora_forward_group(std::span<const LoraWeights> w, TensorView x, std::span<const TensorView> y, Arena& arena,
                          std::span<LoraSaved> saved);
Status lora_backward_group(std::span<const LoraWeights> w, TensorView x, std::span<const TensorView> dy,
                           TensorView dx, std::span<const LoraSaved> saved, Arena& arena);

}  // namespace lathe
