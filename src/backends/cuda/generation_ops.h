// The small device pieces generation needs besides the training kernels:
// bias add, appending k/v rows to a KV cache at a position read from device
// memory, a plain attention kernel for any head_dim (the flash kernels
// compile 64 and 128 only; this one is also their slow twin in tests), a
// random fill (benchmarks), and a captured CUDA graph. (The greedy pick is
// decode_ops.h's greedy_pick.) Everything a decode step reads
// that changes per token (token id, position) is a device pointer, so one
// captured graph replays for every step. Stubs in generation_stub.cpp.
#pragma once

#include <cstdint>
#include <functional>

#include "backends/cuda/cuda_ops.h"

namespace lathe::cuda {

// y[r, c] += b[c] for a row-major [rows, cols] bf16 y.
Status add_bias(CudaContext& ctx, bf16_bits* y, const bf16_bits* b, int64_t rows, int64_t cols);

// Rows *pos0 .. *pos0 + n_tokens − 1 of the caches get the rows of k and v.
// Rows past max_rows are skipped (the caller checks positions on the host).
struct KvAppendArgs {
  const bf16_bits* k = nullptr;  // [n_tokens, row_elems]
  const bf16_bits* v = nullptr;  // [n_tokens, row_elems]
  bf16_bits* k_cache = nullptr;  // [max_rows, row_elems]
  bf16_bits* v_cache = nullptr;  // [max_rows, row_elems]
  const int32_t* pos0 = nullptr;  // device, one value
  int64_t n_tokens = 0, row_elems = 0, max_rows = 0;
};
Status kv_append(CudaContext& ctx, const KvAppendArgs& a);

// Causal grouped-query attention of query row i (position *pos0 + i) against
// cache rows 0 .. *pos0 + i (only j > pos − window with a window), softmax in
// f32 with a running max. One warp per (row, head); head_dim <= 256.
struct SimpleAttentionArgs {
  const bf16_bits* q = nullptr;        // [n_tokens, n_head, head_dim]
  const bf16_bits* k_cache = nullptr;  // [n_ctx, n_head_kv, head_dim]
  const bf16_bits* v_cache = nullptr;  // [n_ctx, n_head_kv, head_dim]
  bf16_bits* out = nullptr;            // [n_tokens, n_head, head_dim]
  const int32_t* pos0 = nullptr;       // device, one value
  int n_tokens = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  int window = 0;
  float scale = 1.0f;
};
Status attention_simple(CudaContext& ctx, const SimpleAttentionArgs& a);

// dst[i] = mean + stddev · u_i with u_i uniform on [−√3, √3] (unit variance)
// from a hash of (seed, i): deterministic, no host memory.
Status fill_random_bf16(CudaContext& ctx, bf16_bits* dst, int64_t n, uint64_t seed, float mean, float stddev);

// A CUDA graph captured from the work body enqueues on ctx's stream, replayed
// with launch(). Nothing in body may synchronize or copy from host memory.
// Move-only.
class CudaGraph {
 public:
  static Result<CudaGraph> capture(CudaContext& ctx, const std::function<Status()>& body);
  CudaGraph() = default;
  CudaGraph(CudaGraph&& o) noexcept;
  CudaGraph& operator=(CudaGraph&& o) noexcept;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  ~CudaGraph();
  bool empty() const { return exec_ == nullptr; }
  Status launch(CudaContext& ctx) const;

 private:
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
};

}  // namespace lathe::cuda
