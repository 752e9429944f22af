// Embedding gather (bf16 rows copied as they are) and its backward, which
// adds each d_out row into the f32 gradient of its token's row with atomics
// (repeated ids add up; the order of the adds is not fixed, so the result
// may differ from a serial sum in the last bits). The gather moves 16 bytes
// per load where rows allow it: the table may be pinned host memory read
// over PCIe (the LoRA trainer's), where narrow reads cost the most.
#include "backends/cuda/context_impl.h"
#include "backends/cuda/vec8.cuh"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void embedding_fwd(EmbeddingCudaArgs a) {
  const int64_t row = blockIdx.x;
  const int32_t id = a.tokens[row];
  const bool valid = id >= 0 && id < a.vocab;
  for (int64_t j = threadIdx.x; j < a.dim; j += blockDim.x) {
    a.out[row * a.dim + j] = valid ? a.table[static_cast<int64_t>(id) * a.dim + j] : bf16_bits{0};
  }
}

// Rows as 16-byte chunks (dim a multiple of 8, table and out 16-byte aligned).
__global__ void embedding_fwd16(EmbeddingCudaArgs a) {
  const int64_t row = blockIdx.x;
  const int32_t id = a.tokens[row];
  const bool valid = id >= 0 && id < a.vocab;
  const int64_t chunks = a.dim / 8;
  const uint4* src = reinterpret_cast<const uint4*>(a.table + static_cast<int64_t>(valid ? id : 0) * a.dim);
  uint4* dst = reinterpret_cast<uint4*>(a.out + row * a.dim);
  for (int64_t j = threadIdx.x; j < chunks; j += blockDim.x) dst[j] = valid ? src[j] : make_uint4(0, 0, 0, 0);
}

__global__ void embedding_bwd(EmbeddingBackwardCudaArgs a) {
  const int64_t row = blockIdx.x;
  const int32_t id = a.tokens[row];
  if (id < 0 || id >= a.vocab) return;
  for (int64_t j = threadIdx.x; j < a.dim; j += blockDim.x) {
    atomicAdd(&a.d_table[static_cast<int64_t>(id) * a.dim + j], dev::ld(a.d_out, row * a.dim + j));
  }
}

}  // namespace

Status embedding_forward(CudaContext& ctx, const EmbeddingCudaArgs& a) {
  if (a.n < 0 || a.vocab <= 0 || a.dim <= 0) {
    return invalid_argument("cuda embedding: bad shape n=", a.n, " vocab=", a.vocab, " dim=", a.dim);
  }
  if (a.n == 0) return Status::ok();
  if (!a.tokens || !a.table || !a.out) return invalid_argument("cuda embedding: null argument");
  if (a.dim % 8 == 0 && aligned16(a.table, a.out)) {
    embedding_fwd16<<<static_cast<unsigned>(a.n), kThreads, 0, stream_of(ctx)>>>(a);
  } else {
    embedding_fwd<<<static_cast<unsigned>(a.n), kThreads, 0, stream_of(ctx)>>>(a);
  }
  return ctx.check_launch("embedding_fwd");
}

Status embedding_backward(CudaContext& ctx, const EmbeddingBackwardCudaArgs& a) {
  if (a.n < 0 || a.vocab <= 0 || a.dim <= 0) {
    return invalid_argument("cuda embedding_backward: bad shape n=", a.n, " vocab=", a.vocab, " dim=", a.dim);
  }
  if (a.n == 0) return Status::ok();
  if (!a.tokens || !a.d_out || !a.d_table) return invalid_argument("cuda embedding_backward: null argument");
  embedding_bwd<<<static_cast<unsigned>(a.n), kThreads, 0, stream_of(ctx)>>>(a);
  return ctx.check_launch("embedding_bwd");
}

}  // namespace lathe::cuda
