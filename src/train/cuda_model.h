// LoRA training of a Llama-family model on one NVIDIA GPU: the forward and
// explicit backward of trainable_pass.cpp with the CUDA backend's kernels.
//
// Numerics: the frozen base (embedding, norms, projections, biases, LM head)
// lives on the device in bf16; activations are bf16, every GEMM and row
// kernel accumulates in fp32, the residual stream's gradient is carried in
// fp32. The LoRA branch is fp32 as in PEFT (adapters in f32, x upcast):
// A and B have fp32 masters and gradients, and the GEMMs read 4-term bf16
// copies of them (backends/cuda/lora_ops.h, rewritten after each update),
// which makes every LoRA product an f32 one on the tensor cores. Per
// projection y = x·Wᵀ [+ b] + s·(x·Aᵀ)·Bᵀ, what is rounded to bf16 where:
//   forward:  u = x·Aᵀ in f32; s·u kept as 4 bf16 terms (hi + lo, 2⁻¹⁶
//             relative) in the GEMM input's row; then ONE GEMM over
//             [x | s·u terms]·[W | B terms]ᵀ (the LoRA terms in its K
//             dimension, the bias in its epilogue) rounds x·Wᵀ + b + s·u·Bᵀ
//             to bf16 once: the f32 sum of the f32 base product and the f32
//             LoRA branch (HF rounds x·Wᵀ + b first, then the sum).
//   backward: du = s·dy·B, dA = duᵀ·x and dB = dyᵀ·(s·u) in f32 (summed into
//             the f32 gradients); dx = [dy | du terms]·[W ; A terms], one GEMM
//             rounding dy·W + du·A once.
// (train/cuda_model_impl.h has the extended weights' layout.)
//
// LoRA dropout (p > 0) draws the CPU trainer's masks (nn/lora.h: a hash of
// the pass, the adapter and the element; q, k and v each their own) and
// regenerates them where needed instead of storing them: u = (mask∘x)·Aᵀ
// ·s/(1 − p) (mask∘x is exact bf16) by one GEMM per member, dA from the
// same masked x, and dx = dy·W + Σ mask∘(du·A)/(1 − p) summed in f32 and
// rounded once: the A part leaves the fused backward GEMM (a GEMM per
// member and a masked add), over chunks of tokens whose f32 rows fit the
// path's 64 MiB buffers. Without dropout nothing of this runs or is
// allocated.
//
// Speed: q|k|v and gate|up are one GEMM each (weights stored stacked), and
// so are the LoRA x·Aᵀ of their members; the LoRA B product rides in the
// base GEMM (no separate pass over the output); small kernels split q|k|v
// into the attention's q, k, v (RoPE on the way) and merge their gradients
// back.
//
// Memory: everything, weights, per-layer activations and scratch, comes from
// one device arena whose layout is planned at create() for max_tokens tokens
// per micro batch; a pass only uploads the batch's ids and runs kernels.
// The one exception: with LoRA and an untied head the frozen embedding
// table (1 GiB at Llama-8B, of which a step reads only the batch's rows)
// lives in pinned host memory (CudaTrainOptions::host_embedding), and what
// it would take of the arena goes to selective's kept layers.
// CudaRecompute picks what the backward recomputes instead of keeping: none;
// selective (keeps the attention output and gate|up, the expensive ones,
// and reruns the norms, the q|k|v and o projections, RoPE and the LoRA
// x·Aᵀ of the inputs it reruns: ~20% of the forward's GEMM FLOPs, ~8% of a
// step's, at Llama-8B shapes, for ~1/3 less activation memory than none;
// with max_arena_bytes, as many layers as fit keep q, k, v and h_mid and
// rerun only their norms and those norms' LoRA x·Aᵀ); full (keeps each
// layer's input only, reruns its forward: ~1/3 more work). The last layer's
// forward is still in the shared buffers when the backward starts: it reruns
// nothing. Scratch that is dead while the LM head runs holds the
// cross-entropy workspace.
// Recomputed values are bitwise the ones the forward made.
//
// This file depends only on core, ops and the CUDA backend (the benchmark
// links it alone); train/cuda_trainable.h builds one from a loaded
// TrainableModel for the Trainer. With CudaTrainOptions::full_sft every
// weight trains instead (cuda_model_sft.cpp). Refused: head_dim other than
// 32, 64 or 128 (the attention kernels' sizes), and a full SFT the device's
// memory cannot hold.
// Threads: one thread drives one model.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_ops.h"
#include "core/status.h"
#include "train/trainable_model.h"

namespace lathe {

// The model's shape and quirks (a ModelConfig + FamilyQuirks digest).
struct CudaModelShape {
  int64_t vocab = 0, hidden = 0, inter = 0, n_layer = 0, n_head = 0, n_kv = 0, head_dim = 0;
  float eps = 1e-6f;
  bool tied = false;      // LM head = embedding
  bool qkv_bias = false;  // Qwen2
  bool qk_norm = false;   // Qwen3
  int window = 0;         // sliding window; 0: none
  std::vector<float> inv_freq;  // [head_dim / 2]
};

enum class CudaRecompute { kNone, kSelective, kFull };
// "none" | "selective" | "full"; anything else is an error naming the value.
Result<CudaRecompute> parse_recompute(const std::string& text);

struct CudaTrainOptions {
  int device = 0;
  int64_t max_tokens = 0;  // tokens of the largest micro batch
  // The longest document of a micro batch (0: not known): sizes the attention
  // backward's workspace for the kernels that keep dS (LATHE_ATTN_BWD=ws-ds).
  int64_t max_seqlen = 0;
  int lora_r = 32;
  float lora_scale = 1.0f;  // alpha / r (or alpha / sqrt(r) with rsLoRA)
  // Projections that carry LoRA, in HF order q, k, v, o, gate, up, down.
  std::array<bool, 7> targets{true, true, true, true, true, true, true};
  CudaRecompute recompute = CudaRecompute::kNone;
  // With selective: the first layers keep what selective reruns the q|k|v
  // and o GEMMs for (q, k, v, h_mid: ~3.5 hidden-size rows per token per
  // layer) while the arena stays within this many bytes; 0: none do.
  int64_t max_arena_bytes = 0;
  // With selective and ≥ 0: exactly this many (first) layers keep them,
  // whatever the budget (tests pick a mix this way).
  int64_t keep_layers = -1;
  // With selective: layers whose [gate | up] (the largest thing a layer
  // keeps) goes to pinned host memory once the forward has used it and
  // comes back before the layer's backward, through two device staging
  // buffers and a copy stream of its own, so that the arena's bytes buy
  // more layers that keep q/k/v. −1: as many as let the most layers keep
  // them within max_arena_bytes (none when all do without); ≥ 0 exactly
  // this many, spread evenly (tests). The bits are the same either way.
  int64_t offload_layers = -1;
  // Train every weight (f32 masters and gradients, TrainableModel's
  // full-SFT table) instead of LoRA; targets and lora_r are then unused.
  bool full_sft = false;
  // LoRA dropout p on each adapter's input (peft.dropout, [0, 1)), its masks
  // the CPU trainer's for the same seed (TrainableModelOptions::seed) and
  // pass count (passes_run()).
  float lora_dropout = 0.0f;
  uint64_t seed = 1234;
  // The backward's LoRA weight gradients on a second stream beside the
  // main one (cuda_model_overlap.cpp): 0 off, 1 on, 2 on with that stream
  // at the greatest priority; −1: LATHE_CUDA_LORA_OVERLAP (core/env.h,
  // default 2). Bitwise the same results in every mode; unused with LoRA
  // dropout or full SFT.
  int lora_overlap = -1;
  // The frozen embedding table in pinned host memory instead of the arena
  // (the forward gathers the batch's rows over PCIe; the bits are the
  // same): 1 on, 0 off, −1: LATHE_CUDA_HOST_EMBED (core/env.h, default 1).
  // LoRA with an untied LM head only (full SFT trains the table, a tied
  // head's GEMM reads it whole): elsewhere the table stays on the device.
  int host_embedding = -1;
  cuda::CudaAdamWConfig adamw;
};

struct CudaModelImpl;

// What create() would allocate: the arena's bytes and, with selective and
// max_arena_bytes, how many layers keep q/k/v and h_mid.
struct CudaArenaPlan {
  int64_t bytes = 0;
  int64_t optimizer_bytes = 0;  // AdamW's moments, allocated beside the arena
  int64_t layers_kept = 0;
  int64_t layers_offloaded = 0;  // CudaTrainOptions::offload_layers resolved
  // The arena by item (create()'s names, summed over layers), largest first.
  std::vector<std::pair<std::string, int64_t>> items;
};

class CudaTrainableModel {
 public:
  // Plans and allocates every device buffer; the weights are left unset
  // (upload them, or fill_random) and the LoRA factors zero.
  static Result<std::unique_ptr<CudaTrainableModel>> create(const CudaModelShape& shape,
                                                            const CudaTrainOptions& options);
  // create()'s plan without a device (no memory is touched).
  static Result<CudaArenaPlan> plan_arena(const CudaModelShape& shape, const CudaTrainOptions& options);
  ~CudaTrainableModel();

  // ---- Weights ---------------------------------------------------------
  // Frozen base tensors by transformers' name ("model.layers.3.mlp.up_proj.weight",
  // "model.embed_tokens.weight", ...), uploaded from f32 and rounded to bf16.
  Status upload_base(const std::string& name, std::span<const float> values);
  Status upload_base_bf16(const std::string& name, std::span<const uint16_t> values);  // bf16 bits as they are
  // Every base name the model expects, in load order.
  std::vector<std::string> base_names() const;
  // Random base for benchmarks: projections and embedding N(0, std), norms 1,
  // biases 0; LoRA A N(0, std), B 0.
  Status fill_random(uint64_t seed, float std = 0.02f);

  // ---- Trainable parameters (same layout as TrainableModel's table) ------
  const std::vector<ParamInfo>& param_table() const;
  int64_t n_params() const;  // flat length (with alignment gaps)
  Status upload_params(std::span<const float> host);  // also refreshes the bf16 copies
  Status download_params(std::span<float> host);
  Status download_grads(std::span<float> host);

  // ---- Passes and the optimizer --------------------------------------------
  Result<PassLoss> forward_backward(const MicroBatch& mb, float loss_scale);
  Result<PassLoss> forward_loss(const MicroBatch& mb);
  Status zero_grads();
  Result<double> clip_grad_norm(double max_norm);  // pre-clip total
  Status adamw_step(double lr);
  cuda::CudaAdamW& optimizer();
  cuda::CudaContext& context();

  int64_t arena_bytes() const;  // device memory this model holds
  int64_t layers_kept() const;  // selective: layers that rerun no GEMM (max_arena_bytes)
  int64_t layers_offloaded() const;  // selective: layers whose [gate | up] waits in host memory
  CudaRecompute recompute() const;   // CudaTrainOptions::recompute as created
  // Where the dropout mask stream stands, as TrainableModel::passes_run():
  // passes run so far (forward_backward and forward_loss alike; each draws
  // its masks from its index). Set it from a checkpoint to resume the masks.
  uint64_t passes_run() const;
  void set_passes_run(uint64_t n);
  // LoRA dropout runs over the micro batch in chunks of tokens (as many as
  // its 64 MiB f32 buffers hold rows of a projection's input); this makes
  // them `rows` long in every projection, at most what the buffers hold at
  // the widest input (tests: several chunks on a small batch).
  void set_dropout_chunk_rows(int64_t rows);

  // A copy, as f32, of one device buffer's first n_tokens rows as the last
  // pass left it, for comparing the pass with tools/emulate_cuda_train.py:
  // per layer l "hs.l" (l ≤ n_layer), "xn1.l", "rstd1.l", "q.l", "k.l", "v.l",
  // "attn.l", "lse.l", "h_mid.l", "xn2.l", "rstd2.l", "gu.l" (after a
  // backward: its gradient); scratch "xf", "d_xf", "dh", "dh_bf", "d_xn",
  // "qkv", "dq", "dk", "dv", "d_attn", "act" (after a backward: layer 0's
  // gradients, except act, which the attention's gradients overlay). With a
  // recompute mode, shared buffers hold the last layer written; the scratch
  // holds the cross-entropy workspace after a forward_loss.
  Result<std::vector<float>> read_buffer(const std::string& name, int64_t n_tokens);

  // Profiling: with timing on, CUDA events cut the stream's timeline into
  // phases (base GEMMs, LoRA, attention, elementwise, LM head, optimizer,
  // upload); phase_times_ms() waits for the stream and returns the
  // milliseconds of each since timing was switched on or last read (idle
  // stream time counts to the phase then open). Costs an event per phase
  // change: leave it off for throughput runs.
  Status set_phase_timing(bool on);
  Result<std::vector<std::pair<std::string, double>>> phase_times_ms();

 private:
  explicit CudaTrainableModel(std::unique_ptr<CudaModelImpl> impl);
  std::unique_ptr<CudaModelImpl> impl_;
};

}  // namespace lathe
