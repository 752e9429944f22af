// A Llama-family model (Llama, Mistral, Qwen2, Qwen3) set up for training on
// the CPU: LoRA adapters on a frozen base, or every weight (full SFT).
//
// What trains lives in one flat f32 buffer (params()) with a twin of the
// same layout for gradients (grads()), so the optimizer, a checkpoint and a
// data-parallel all-reduce each see one contiguous block; param_table()
// names each tensor's slice (PEFT's key names for adapters, transformers'
// names for full SFT; offsets 16-float aligned, gaps are zero). The frozen
// base is held in f32 (bf16/f16 files are widened at load), or with
// bf16_base its matrices in bf16 (half the memory; f32 files are rounded).
//
// One training pass, forward_backward(), runs a packed micro batch through
// the explicit forward of every layer (activations kept in an arena that is
// reused from pass to pass, so steady state allocates nothing), the LM head
// fused with cross-entropy chunked over tokens, and the explicit backward of
// every layer, ADDING the gradients of loss_scale · Σ token losses into
// grads(). With activations_checkpoint, only each layer's input is kept and
// the layer's forward is recomputed just before its backward (identical
// results: same kernels, same dropout masks).
//
// Threads: one pass at a time per model (not thread-safe); kernels use
// OpenMP across rows, heads and GEMM tiles.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/hf_config.h"
#include "nn/lora.h"
#include "train/batcher.h"

namespace lathe {

struct TrainableModelOptions {
  bool full_sft = false;         // train every weight; else LoRA on the frozen base
  LoraConfig lora;               // ignored for full SFT
  // A PEFT adapter directory (adapter_config.json + adapter_model.safetensors)
  // to start LoRA from. Its r, lora_alpha, use_rslora and target_modules
  // replace lora's (dropout stays lora's).
  std::string adapter_dir;
  bool activations_checkpoint = false;  // recompute each layer's forward in backward
  // bf16 mixed precision (trainer.precision: bf16-mixed), LoRA only: the
  // frozen matrices (embedding, projections, LM head) are held in bf16 and
  // their GEMMs (forward and input gradients) take bf16 operands with f32
  // sums; activations, norms, LoRA factors, gradients and the loss stay f32.
  // Where the bf16 GEMM runs on AMX tiles, attention's products and the
  // adapters' x·Aᵀ, u·Bᵀ, dy·B and du·A take bf16 operands with f32 sums too
  // (as torch autocast; softmax, lse and the adapters' weight gradients stay
  // f32), and the projections run fused with their adapters, SwiGLU and the
  // frozen norms (trainable_fused.cpp); elsewhere those stay f32.
  bool bf16_base = false;
  uint64_t seed = 1234;                 // LoRA A init and dropout masks
  // Tokens per chunk of the fused LM head + cross-entropy (its logits
  // workspace is chunk x vocab f32); 0: cross_entropy_chunk_rows(vocab).
  int64_t lm_head_chunk_rows = 0;
};

struct ParamInfo {
  std::string name;    // "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" or "model.norm.weight"
  int64_t offset = 0;  // in floats, into params() and grads()
  Shape shape;
  int64_t numel() const { return shape.numel(); }
};

struct PassLoss {
  double loss_sum = 0;      // Σ cross-entropy over the supervised tokens (not scaled)
  int64_t n_supervised = 0;
};

class TrainableModelImpl;

class TrainableModel {
 public:
  // Loads config.json and the weights of model_dir, builds the trainable
  // parameters (LoRA: A random, B zero, or the adapter's tensors; full: a
  // copy of every weight) and zeroes the gradients. Errors name the file,
  // key or tensor.
  static Result<std::unique_ptr<TrainableModel>> load(const std::string& model_dir,
                                                      const TrainableModelOptions& options);
  ~TrainableModel();

  // One micro batch forward and backward. Gradients of
  // loss_scale · Σ_supervised loss_i are added to grads(); pass
  // loss_scale = 1 / (supervised tokens of the whole global batch) for
  // transformers' mean. Returns the unscaled loss sum and token count.
  Result<PassLoss> forward_backward(const MicroBatch& mb, float loss_scale);
  // Forward only (evaluation): the loss sum and token count, no gradients.
  Result<PassLoss> forward_loss(const MicroBatch& mb);

  std::span<float> params();
  std::span<float> grads();
  void zero_grads();
  const std::vector<ParamInfo>& param_table() const;
  const ParamInfo* find_param(std::string_view name) const;

  const ModelConfig& config() const;
  const LoraConfig& lora_config() const;  // effective (after an adapter's config)
  bool full_sft() const;
  // Where the dropout mask stream stands: passes run so far (training and
  // evaluation alike; each draws its masks from its index). Checkpoints save
  // it so a resumed run draws the same masks as an uninterrupted one.
  uint64_t passes_run() const;
  void set_passes_run(uint64_t n);
  // Bytes of the activation arena after the passes so far.
  int64_t activation_bytes() const;
  // Benchmarks: wall seconds of the passes since timing was switched on, per
  // phase ("base GEMMs" forward and input gradient, "LoRA", "attention",
  // "LM head + CE", "rest": norms, RoPE, SwiGLU, copies), then "pass" (all).
  // Switching it on zeroes the sums. Off by default.
  void set_phase_timing(bool on);
  std::vector<std::pair<std::string, double>> phase_seconds() const;

  // LoRA: adapter_config.json + adapter_model.safetensors (f32) with PEFT's
  // key names, loadable by peft.PeftModel.from_pretrained. Creates dir.
  Status save_adapter_peft(const std::string& dir) const;
  // Full SFT: model.safetensors (sharded past 5 GiB) with transformers'
  // names, plus the source config.json. Creates dir.
  Status save_full(const std::string& dir) const;

  // The loaded tensors and layout, for another backend to copy (train/cuda_trainable).
  const TrainableModelImpl& internals() const { return *impl_; }

 private:
  explicit TrainableModel(std::unique_ptr<TrainableModelImpl> impl);
  std::unique_ptr<TrainableModelImpl> impl_;
};

}  // namespace lathe
