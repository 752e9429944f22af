// The CUDA backend's ops: a context (device, stream, cuBLASLt handle and its
// workspace), a device arena planned up front, bf16 GEMMs through cuBLASLt and
// the training kernels (RMSNorm fused with the residual add, RoPE, SwiGLU,
// embedding, LM head fused with cross-entropy, multi-tensor AdamW, dtype
// conversion). Arguments are raw device pointers with explicit sizes: the
// tensors live in arenas and the CPU TensorView contracts (f32 activations)
// do not describe the bf16 storage used here. All calls enqueue on the
// context's stream and return without waiting, except where a result must
// reach the host (cross_entropy's loss). Without nvcc every call returns
// "this build has no CUDA" (stub.cpp). One thread drives one context.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/cuda/device.h"
#include "core/dtype.h"
#include "core/status.h"
#include "ops/cross_entropy.h"
#include "ops/rope.h"

namespace lathe::cuda {

// bf16 on the device, as raw bits (host code never does arithmetic on it).
using bf16_bits = uint16_t;

// ---- Context -------------------------------------------------------------

// Owns a non-blocking stream, a cuBLASLt handle, its workspace and the GEMM
// algorithm cache (one heuristic query per shape). Move-only.
class CudaContext {
 public:
  static constexpr size_t kDefaultWorkspaceBytes = size_t{64} << 20;
  static Result<CudaContext> create(int device, size_t workspace_bytes = kDefaultWorkspaceBytes);
  CudaContext();
  CudaContext(CudaContext&&) noexcept;
  CudaContext& operator=(CudaContext&&) noexcept;
  ~CudaContext();

  int device() const;
  void* stream() const;  // cudaStream_t
  Status synchronize() const;
  // Error of the last kernel launch on this thread, if any (cudaGetLastError).
  Status check_launch(const char* what) const;

  struct Impl;
  Impl* impl() const { return impl_.get(); }

 private:
  std::unique_ptr<Impl> impl_;
};

// Copies ordered on the context's stream (the stream is non-blocking, so
// plain cudaMemcpy would not be ordered with its kernels). copy_to_host waits
// for the stream.
Status copy_to_device(CudaContext& ctx, void* dst, const void* src, size_t bytes);
Status copy_to_host(CudaContext& ctx, void* dst, const void* src, size_t bytes);
// Either way (device or pinned host memory at both ends), without waiting:
// the host must keep pinned buffers alive until the stream has run it.
Status copy_async(CudaContext& ctx, void* dst, const void* src, size_t bytes);
// rows × width_bytes from host src (rows src_pitch bytes apart) into device
// dst (rows dst_pitch bytes apart): a block of a wider device matrix.
Status copy_to_device_2d(CudaContext& ctx, void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                         size_t width_bytes, size_t rows);
Status fill_zero(CudaContext& ctx, void* dst, size_t bytes);

// Offsets for a set of buffers, computed before anything is allocated: each
// buffer is 256-byte aligned (what cuBLASLt and vector loads want).
class ArenaPlan {
 public:
  static constexpr size_t kAlign = 256;
  size_t add(size_t bytes);  // returns the buffer's offset
  size_t total_bytes() const { return total_; }

 private:
  size_t total_ = 0;
};

// One cudaMalloc, handed out by bump allocation and reset at each step, so
// the step itself never allocates. Exhaustion is a kOutOfMemory Status naming
// what was asked for.
class DeviceArena {
 public:
  static Result<DeviceArena> create(int device, size_t bytes);
  Result<void*> alloc(size_t bytes, const char* what);
  template <class T>
  Result<T*> alloc_n(int64_t n, const char* what) {
    LATHE_ASSIGN_OR_RETURN(void* p, alloc(static_cast<size_t>(n) * sizeof(T), what));
    return static_cast<T*>(p);
  }
  void reset() { used_ = 0; }
  size_t used() const { return used_; }
  size_t high_water() const { return high_water_; }
  size_t capacity() const { return buffer_.size_bytes(); }
  void* base() const { return buffer_.data(); }

 private:
  DeviceBuffer buffer_;
  size_t used_ = 0;
  size_t high_water_ = 0;
};

// ---- GEMM ----------------------------------------------------------------

// Row-major C[m, n] = alpha · op(A)·op(B) + beta · C, bf16 inputs, fp32
// accumulation, C bf16 or f32. A is stored [m, k] (or [k, m] when trans_a),
// B is stored [k, n] (or [n, k] when trans_b), densely packed unless a row
// stride lda / ldb / ldc (elements between consecutive stored rows, >= the
// stored row length) says otherwise: column blocks of a wider matrix, such as
// one projection's slice of a fused q|k|v output. The three
// uses of a linear layer y = x·Wᵀ (W [out, in]):
//   forward  y[T, out]  = x·Wᵀ   : A = x,  B = W,  trans_b
//   dX       dx[T, in]  = dy·W   : A = dy, B = W
//   dW       dW[out,in] += dyᵀ·x : A = dy, B = x,  trans_a, beta = 1
// With `bias` (bf16 [n], bf16 output and beta = 0 only): C = bf16(A·B +
// bias), the bias added in f32 before the one rounding (cuBLASLt's bias
// epilogue).
struct GemmArgs {
  const bf16_bits* a = nullptr;
  const bf16_bits* b = nullptr;
  void* c = nullptr;
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  DType c_dtype = DType::BF16;  // BF16 or F32
  float alpha = 1.0f, beta = 0.0f;
  int64_t lda = 0, ldb = 0, ldc = 0;  // row strides in elements; 0: packed
  const bf16_bits* bias = nullptr;    // [n] or null
};
Status gemm(CudaContext& ctx, const GemmArgs& a);  // messages start with "cuda gemm: "

// ---- Pointwise and row kernels --------------------------------------------

// h = x + residual (rounded to bf16: the new residual stream), then
// y = bf16(w · h·rstd) with rstd = rsqrt(mean(h²) + eps) in f32. With no
// residual, h = x and h_out may be null. rstd is saved when non-null. y's
// rows may be ld_y elements apart (the first dim columns of a wider matrix;
// 0: packed).
struct RmsNormResidualArgs {
  const bf16_bits* x = nullptr;         // [rows, dim]
  const bf16_bits* residual = nullptr;  // [rows, dim] or null
  bf16_bits* h_out = nullptr;           // [rows, dim] or null (only without residual)
  const bf16_bits* w = nullptr;         // [dim]
  bf16_bits* y = nullptr;               // [rows, dim]
  float* rstd = nullptr;                // [rows] or null
  int64_t rows = 0, dim = 0;
  float eps = 1e-6f;
  int64_t ld_y = 0;                     // y's row stride in elements; 0: dim
};
Status rms_norm_residual_forward(CudaContext& ctx, const RmsNormResidualArgs& a);

// Backward of the above through h: g = rstd·(w⊙dy − ĥ·mean(w⊙dy⊙ĥ)) with
// ĥ = h·rstd; dh = g (or dh += g when accumulate: the residual stream's
// gradient from later layers is already there). dh is the gradient of both x
// and residual. dh_bf, when non-null, gets the same new dh rounded once to
// bf16 (what f32_to_bf16 of dh gives: the copy a GEMM reads); without
// accumulate dh may be null then. dh_bf may alias dy (then packed). Its rows
// may be ld_dh_bf elements apart (0: packed). dw += Σ_rows dy⊙ĥ when
// non-null.
struct RmsNormResidualBackwardArgs {
  const bf16_bits* h = nullptr;   // [rows, dim], the forward's h
  const bf16_bits* w = nullptr;   // [dim]
  const float* rstd = nullptr;    // [rows]
  const bf16_bits* dy = nullptr;  // [rows, dim]
  float* dh = nullptr;            // [rows, dim] or null (only with dh_bf and no accumulate)
  float* dw = nullptr;            // [dim] or null
  bf16_bits* dh_bf = nullptr;     // [rows, dim] (row stride ld_dh_bf) or null
  int64_t rows = 0, dim = 0;
  bool accumulate = false;
  int64_t ld_dh_bf = 0;  // dh_bf's row stride in elements; 0: dim
};
Status rms_norm_residual_backward(CudaContext& ctx, const RmsNormResidualBackwardArgs& a);

// cos/sin tables [n_tokens, half] f32 for the given positions; inv_freq comes
// from rope_inv_freq() (ops/rope.h), so the tables match the CPU's.
struct RopeTablesCudaArgs {
  const float* inv_freq = nullptr;  // [half]
  const int32_t* positions = nullptr;  // [n_tokens]
  float* cos = nullptr;
  float* sin = nullptr;
  int64_t n_tokens = 0, half = 0;
};
Status rope_tables(CudaContext& ctx, const RopeTablesCudaArgs& a);

// rotate_half RoPE on x [n_tokens, n_head, 2·half] in place; inverse rotates
// by −angle, which is the backward.
struct RopeCudaArgs {
  bf16_bits* x = nullptr;
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t n_tokens = 0, n_head = 0, half = 0;
  bool inverse = false;
};
Status rope_apply(CudaContext& ctx, const RopeCudaArgs& a);

// out = silu(gate)·up, computed in f32; out may alias gate or up.
struct SwigluCudaArgs {
  const bf16_bits* gate = nullptr;
  const bf16_bits* up = nullptr;
  bf16_bits* out = nullptr;
  int64_t n = 0;  // elements
};
Status swiglu_forward(CudaContext& ctx, const SwigluCudaArgs& a);

// d_up = d_out·silu(gate), d_gate = d_out·up·s·(1 + gate·(1 − s)).
struct SwigluBackwardCudaArgs {
  const bf16_bits* gate = nullptr;
  const bf16_bits* up = nullptr;
  const bf16_bits* d_out = nullptr;
  bf16_bits* d_gate = nullptr;  // may alias gate
  bf16_bits* d_up = nullptr;    // may alias up
  int64_t n = 0;
};
Status swiglu_backward(CudaContext& ctx, const SwigluBackwardCudaArgs& a);

// SwiGLU's backward on [gate | up] rows that also gives back the forward's
// output: d_gu as swiglu_rows_backward (train_fused.h) from gu and d_out,
// and, with write_act, act = silu(gate)·up (the forward's value, bit for
// bit) written over d_out, row for row. A trainer that recomputes act only
// for the LoRA gradients of the down projection gets it from the kernel
// that reads gate|up anyway. d_gu may alias gu with the same stride.
struct SwigluRowsBackwardActArgs {
  const bf16_bits* gu = nullptr;  // [n_tokens, 2F], rows ld_gu apart
  bf16_bits* d_out = nullptr;     // [n_tokens, F], rows ld_d_out apart: d act in, act out (write_act)
  bf16_bits* d_gu = nullptr;      // [n_tokens, 2F], rows ld_d_gu apart
  int64_t n_tokens = 0, inter = 0;
  int64_t ld_gu = 0, ld_d_out = 0, ld_d_gu = 0;  // row strides in elements; 0: packed
  bool write_act = true;
};
Status swiglu_rows_backward_act(CudaContext& ctx, const SwigluRowsBackwardActArgs& a);

// out[i] = table[tokens[i]]. Ids are checked on the host before they are
// uploaded (the batcher's job); an id outside [0, vocab) yields a zero row.
struct EmbeddingCudaArgs {
  const int32_t* tokens = nullptr;  // [n]
  const bf16_bits* table = nullptr;  // [vocab, dim]
  bf16_bits* out = nullptr;         // [n, dim]
  int64_t n = 0, vocab = 0, dim = 0;
};
Status embedding_forward(CudaContext& ctx, const EmbeddingCudaArgs& a);

// d_table[tokens[i]] += d_out[i] by f32 atomics (repeated ids add up).
struct EmbeddingBackwardCudaArgs {
  const int32_t* tokens = nullptr;
  const bf16_bits* d_out = nullptr;  // [n, dim]
  float* d_table = nullptr;          // [vocab, dim], accumulated
  int64_t n = 0, vocab = 0, dim = 0;
};
Status embedding_backward(CudaContext& ctx, const EmbeddingBackwardCudaArgs& a);

// ---- LM head + cross-entropy -----------------------------------------------

// As ops/cross_entropy.h on the device: rows are taken chunk_rows at a time;
// the chunk's logits [chunk_rows, vocab] are made by a GEMM into the
// workspace, reduced per row (max, Σ exp), turned into the bf16 gradient
// grad_scale·(softmax − onehot) (zero for ignored rows), and pushed through
// two more GEMMs: d_hidden[chunk] = g·w and d_w += gᵀ·hidden[chunk].
// Logits: kBf16 rounds them once to bf16 (what a bf16 model's lm_head
// returns before the loss upcasts) and writes the gradient over them;
// kF32 keeps them as the GEMM accumulates them, the gradient beside them
// (three times the workspace per row). kAuto: LATHE_CUDA_CE (core/env.h),
// bf16 unless it says f32, read at each call. The loss is summed in a fixed
// order: the same bits on every run at the same chunk_rows.
enum class CeLogits : uint8_t { kAuto, kF32, kBf16 };
struct CrossEntropyCudaArgs {
  const bf16_bits* hidden = nullptr;  // [n, dim]
  const bf16_bits* w = nullptr;       // [vocab, dim]
  const int32_t* targets = nullptr;   // [n], kCrossEntropyIgnore for unsupervised rows
  bf16_bits* d_hidden = nullptr;      // [n, dim] or null (loss only)
  float* d_w = nullptr;               // [vocab, dim] accumulated, or null (head frozen)
  void* workspace = nullptr;          // cross_entropy_workspace_bytes(vocab, chunk_rows, logits)
  int64_t n = 0, vocab = 0, dim = 0;
  int64_t chunk_rows = 0;             // 0: as many as fit in the default workspace (cross_entropy.cu)
  float grad_scale = 1.0f;
  CeLogits logits = CeLogits::kAuto;
};
// The workspace a call with the same vocab, chunk_rows and logits needs
// (kAuto read from the environment now: size it in the process that calls).
size_t cross_entropy_workspace_bytes(int64_t vocab, int64_t chunk_rows, CeLogits logits = CeLogits::kAuto);
// Enqueues the pass on ctx's stream without waiting; its loss counters land
// in `counters`, device memory of cross_entropy_counter_bytes() that the
// caller owns and keeps until it reads them (not the workspace, which later
// work may reuse). Argument errors return here.
size_t cross_entropy_counter_bytes();
Status cross_entropy_enqueue(CudaContext& ctx, const CrossEntropyCudaArgs& a, void* counters);
// Waits for ctx's stream and reads what the enqueue left in counters: the
// loss sum and supervised count, or an error counting the targets outside
// [0, vocab) that are not the ignore index.
Result<CrossEntropyStats> cross_entropy_counters(CudaContext& ctx, const void* counters, int64_t vocab);
// Both, the counters in the workspace: waits.
Result<CrossEntropyStats> cross_entropy(CudaContext& ctx, const CrossEntropyCudaArgs& a);

// ---- AdamW -----------------------------------------------------------------

// One trainable tensor on the device: fp32 master, fp32 gradient and, when
// the model computes in bf16, the bf16 working copy rewritten by each step.
struct CudaAdamWParam {
  std::string name;
  float* param = nullptr;
  float* grad = nullptr;  // scaled in place by clip_grad_norm
  bf16_bits* working = nullptr;  // may be null
  int64_t n = 0;
  bool decay = true;
};

// torch.optim.AdamW's hyperparameters (as train/adamw.h's AdamWConfig, which
// lives in a layer above the backends).
struct CudaAdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool maximize = false;
  // Norm weights and biases get no weight decay (train/adamw.h's option);
  // the model that registers the tensors applies it by name.
  bool no_decay_norm_and_bias = false;
};

// Multi-tensor AdamW: one launch updates every tensor (a chunk table built at
// create time maps blocks to tensor ranges). The update is src/train/adamw's
// (torch's AdamW): same scalars in double, applied in fp32 (no amsgrad).
// Owns the fp32 m and v.
class CudaAdamW {
 public:
  static Result<CudaAdamW> create(CudaContext& ctx, const CudaAdamWConfig& config, std::vector<CudaAdamWParam> params);
  Status step(CudaContext& ctx, double lr);
  // torch.nn.utils.clip_grad_norm_ over every registered gradient, as
  // train/adamw.h: total = sqrt(Σ g²) (accumulated in double), and when
  // max_norm > 0 and total is finite the gradients are scaled by
  // min(1, max_norm / (total + 1e-6)). Returns the pre-clip total; waits for
  // the stream to read it back.
  Result<double> clip_grad_norm(CudaContext& ctx, double max_norm);
  int64_t steps_taken() const { return step_; }
  // Copies moments of parameter i to the host (tests, checkpoints).
  Status read_moments(CudaContext& ctx, size_t i, std::vector<float>* m, std::vector<float>* v) const;
  // Restores them (resuming from a checkpoint); sizes must be the tensor's.
  Status write_moments(CudaContext& ctx, size_t i, std::span<const float> m, std::span<const float> v);
  void set_steps_taken(int64_t n) { step_ = n; }

 private:
  CudaAdamWConfig config_;
  std::vector<CudaAdamWParam> params_;
  std::vector<int64_t> offset_;
  int64_t total_ = 0;
  int64_t n_chunks_ = 0;
  DeviceBuffer state_;   // [m | v] f32
  DeviceBuffer tables_;  // tensor and chunk descriptors, then one double for the norm
  int64_t step_ = 0;
};

// ---- Conversion ----------------------------------------------------------

Status bf16_to_f32(CudaContext& ctx, const bf16_bits* src, float* dst, int64_t n);
Status f32_to_bf16(CudaContext& ctx, const float* src, bf16_bits* dst, int64_t n);

}  // namespace lathe::cuda
