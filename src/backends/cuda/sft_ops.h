// Kernels of full-parameter training on the GPU (train/cuda_model_sft.cpp)
// that must give the same bits on every run, so a resumed run repeats an
// uninterrupted one: no atomics, every sum in a fixed order.
//   column_grad: out[j] += Σ_rows dy[r, j] (a bias's gradient) or
//     Σ_rows dy[r, j]·h[r, j]·rstd[r] (an RMSNorm weight's: dy times the
//     normalized input, as the forward's y = bf16((h·rstd)·w)). Rows are cut
//     into fixed chunks (from rows and cols only); each chunk's column sums
//     go to a workspace and a second kernel adds them up in chunk order.
//   embedding_grad: d_table[tok] += Σ d_out[p] over the positions p of each
//     token, from a host-built index of the batch (tokens sorted, positions
//     of each in increasing order): one sum per distinct token.
// Calls enqueue on the context's stream; in a build without CUDA they return
// "no CUDA" (sft_stub.cpp).
#pragma once

#include <cstdint>

#include "backends/cuda/cuda_ops.h"

namespace lathe::cuda {

struct ColumnGradArgs {
  const bf16_bits* dy = nullptr;  // [rows, cols], row stride ld_dy (0: cols)
  int64_t ld_dy = 0;
  const bf16_bits* h = nullptr;   // [rows, cols] packed, or null (bias: plain column sums)
  const float* rstd = nullptr;    // [rows], with h
  float* out = nullptr;           // [cols], accumulated
  float* workspace = nullptr;     // column_grad_workspace_floats(rows, cols)
  int64_t rows = 0, cols = 0;
};
// Rows per chunk; the workspace holds one row of column sums per chunk.
inline constexpr int64_t kColumnGradChunkRows = 256;
inline int64_t column_grad_workspace_floats(int64_t rows, int64_t cols) {
  return (rows + kColumnGradChunkRows - 1) / kColumnGradChunkRows * cols;
}
Status column_grad(CudaContext& ctx, const ColumnGradArgs& a);

struct EmbeddingGradArgs {
  const float* d_out = nullptr;     // [n, dim] f32: the gradient of the embedding's output
  const int32_t* tokens = nullptr;  // [n_unique] distinct token ids
  const int32_t* starts = nullptr;  // [n_unique + 1] into positions
  const int32_t* positions = nullptr;  // [n] rows of d_out, grouped by token, increasing within a token
  float* d_table = nullptr;         // [vocab, dim], accumulated
  int64_t n_unique = 0, dim = 0, vocab = 0;
};
Status embedding_grad(CudaContext& ctx, const EmbeddingGradArgs& a);

}  // namespace lathe::cuda
