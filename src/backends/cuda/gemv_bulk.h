// The launcher of the skinny GEMM's shared-memory ring (gemv_bulk.cu), for
// gemv() to call with 1..4 rows of an already checked GemvArgs. Not part of
// the backend's interface.
#pragma once

#include <cuda_runtime.h>

#include "backends/cuda/decode_ops.h"

namespace lathe::cuda {

cudaError_t launch_gemv_bulk(const GemvArgs& a, cudaStream_t st, int device);
// Its grid on device: a block per SM times a.blocks_per_sm, fewer for fewer tiles.
int64_t gemv_bulk_grid(const GemvArgs& a, int device);

// A diagnostic for the bench: count GEMVs (w[i]: n[i] x k[i], one x row,
// f32 out) through one persistent ring kernel of per_sm (1 or 2: all
// resident at once) blocks per SM.
constexpr int kGemvChainMax = 48;
struct GemvChain {
  const bf16_bits* w[kGemvChainMax];
  int32_t n[kGemvChainMax], k[kGemvChainMax];
  int count = 0;
  const bf16_bits* x = nullptr;  // [max k]
  float* out = nullptr;          // [max n]
  bool fill_at_once = false;
  // Zero at launch, or null: with it, the consumers wait before each GEMV
  // until every block has written the previous one's outputs (a grid
  // barrier, as between the stages of a decode step).
  unsigned* barrier = nullptr;
  int ring_kib = 0;  // 0: kGemvBulkRingKib
  int in_flight = 0;  // > 0: the producer keeps at most this many units requested and not landed
};
cudaError_t launch_gemv_chain(const GemvChain& c, int per_sm, cudaStream_t st, int device);

}  // namespace lathe::cuda
