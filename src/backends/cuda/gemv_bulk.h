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

}  // namespace lathe::cuda
