// Elementwise kernels for the trainer's fused projections: q|k|v come out of
// one GEMM as rows [q (n_head·head_dim) | k | v (n_head_kv·head_dim each)]
// and gate|up as rows [gate (F) | up (F)]. These split the q|k|v rows into
// the dense q, k, v the attention kernels take (applying RoPE on the way),
// merge the attention gradients back into one row (undoing RoPE), and run
// SwiGLU on the [gate | up] rows. The fused rows may be the first columns
// of wider rows (a row stride: the trainer's GEMM inputs carry the LoRA
// terms after them). Arithmetic is f32 over bf16 storage and
// matches rope.cu and swiglu.cu term for term. Calls enqueue on the
// context's stream; without CUDA they return "no CUDA" (train_fused_stub.cpp).
#pragma once

#include <cstdint>

#include "backends/cuda/cuda_ops.h"

namespace lathe::cuda {

// Forward (split): q, k, v = the row's three parts; with cos/sin, q and k
// rotated (rotate_half RoPE) as they are written. Backward (merge): the row
// = [dq | dk | dv], with cos/sin dq and dk rotated back (by −angle).
struct QkvSplitArgs {
  bf16_bits* qkv = nullptr;  // [n_tokens, n_head·hd + 2·n_head_kv·hd]: read by split, written by merge
  bf16_bits* q = nullptr;    // [n_tokens, n_head, hd]
  bf16_bits* k = nullptr;    // [n_tokens, n_head_kv, hd]
  bf16_bits* v = nullptr;    // [n_tokens, n_head_kv, hd]
  const float* cos = nullptr;  // [n_tokens, hd / 2] or null: no rotation
  const float* sin = nullptr;
  int64_t n_tokens = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  int64_t ld_qkv = 0;  // qkv's row stride in elements; 0: packed
  bool thread_per_8_pairs = false;  // the earlier vector kernel (A/B in benches and tests; the same bits)
};
Status qkv_split(CudaContext& ctx, const QkvSplitArgs& a);
Status qkv_merge(CudaContext& ctx, const QkvSplitArgs& a);

// out[t, f] = silu(gu[t, f])·gu[t, F + f].
struct SwigluRowsArgs {
  const bf16_bits* gu = nullptr;  // [n_tokens, 2F], rows ld_gu apart
  bf16_bits* out = nullptr;       // [n_tokens, F], rows ld_out apart
  int64_t n_tokens = 0, inter = 0;
  int64_t ld_gu = 0, ld_out = 0;  // row strides in elements; 0: packed
};
Status swiglu_rows_forward(CudaContext& ctx, const SwigluRowsArgs& a);

// d_gu[t, f] = d_out·up·s·(1 + gate·(1 − s)), d_gu[t, F + f] = d_out·silu(gate);
// d_gu may alias gu with the same stride (each thread reads its gate and up
// before writing).
struct SwigluRowsBackwardArgs {
  const bf16_bits* gu = nullptr;     // [n_tokens, 2F], rows ld_gu apart
  const bf16_bits* d_out = nullptr;  // [n_tokens, F] packed
  bf16_bits* d_gu = nullptr;         // [n_tokens, 2F], rows ld_d_gu apart
  int64_t n_tokens = 0, inter = 0;
  int64_t ld_gu = 0, ld_d_gu = 0;    // row strides in elements; 0: packed
};
Status swiglu_rows_backward(CudaContext& ctx, const SwigluRowsBackwardArgs& a);

}  // namespace lathe::cuda
