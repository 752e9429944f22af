// The repetition penalty of the pick kernels (decode_ops.h, SeenPenalty) as
// a device function. Not part of the backend's interface.
#pragma once

#include <cstdint>

#include "backends/cuda/decode_ops.h"

namespace lathe::cuda {

// Logit v of token id in row r, penalized when the row's sequence holds id.
__device__ __forceinline__ float penalized(const SeenPenalty& p, int64_t r, int64_t id, float v) {
  if (!p.seen || p.penalty == 1.0f) return v;
  if (!((p.seen[r * p.stride + id / 32] >> (id % 32)) & 1u)) return v;
  return v < 0.0f ? v * p.penalty : v / p.penalty;
}

}  // namespace lathe::cuda
