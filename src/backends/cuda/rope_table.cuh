// Entry i (token i / half, pair i % half) of the RoPE cos/sin tables
// (cuda_ops.h rope_tables): the angle formed in f32 as the CPU does, cos and
// sin in double. Shared by rope_tables and the decode step's inputs kernel
// (decode_ops.cu), so both write the same bits. Not part of the backend's
// interface.
#pragma once

#include <cstdint>

#include "backends/cuda/cuda_ops.h"

namespace lathe::cuda {

__device__ __forceinline__ void rope_table_entry(const RopeTablesCudaArgs& a, int64_t i) {
  const int64_t t = i / a.half, p = i % a.half;
  const float angle = static_cast<float>(a.positions[t]) * a.inv_freq[p];
  a.cos[i] = static_cast<float>(cos(static_cast<double>(angle)));
  a.sin[i] = static_cast<float>(sin(static_cast<double>(angle)));
}

}  // namespace lathe::cuda
