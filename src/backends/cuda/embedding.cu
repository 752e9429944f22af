// Embedding gather (bf16 rows copied as they are) and its backward, which
// adds each d_out row into the f32 gradient of its token's row with atomics
// (repeated ids add up; the order of the adds is not fixed, so the result
// may differ from a serial sum in the last bits).
#include "backends/cuda/context_impl.h"

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
  embedding_fwd<<<static_cast<unsigned>(a.n), kThreads, 0, stream_of(ctx)>>>(a);
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
