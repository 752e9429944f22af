// The deterministic gradient sums of full-parameter training (sft_ops.h).
// column_grad: a block owns 32 columns of one chunk of rows; its 8 warps
// take every 8th row, and the 8 partial sums are added in warp order, so
// every sum's order depends only on rows and cols. embedding_grad: a block
// per distinct token adds that token's rows in position order.
#include "backends/cuda/context_impl.h"
#include "backends/cuda/sft_ops.h"

namespace lathe::cuda {
namespace {

constexpr int kCols = 32;  // columns per block (one warp's lanes)
constexpr int kRowLanes = 8;  // warps per block, each over every 8th row of the chunk

__global__ void column_partials(ColumnGradArgs a, int64_t ld) {
  __shared__ float part[kRowLanes][kCols];
  const int64_t col = int64_t(blockIdx.x) * kCols + threadIdx.x;
  const int64_t begin = int64_t(blockIdx.y) * kColumnGradChunkRows;
  const int64_t end = begin + kColumnGradChunkRows < a.rows ? begin + kColumnGradChunkRows : a.rows;
  float acc = 0.0f;
  if (col < a.cols) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowLanes) {
      const float dy = dev::ld(a.dy, r * ld + col);
      acc += a.h ? dy * (dev::ld(a.h, r * a.cols + col) * a.rstd[r]) : dy;
    }
  }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < a.cols) {
    float s = part[0][threadIdx.x];
    for (int k = 1; k < kRowLanes; ++k) s += part[k][threadIdx.x];
    a.workspace[int64_t(blockIdx.y) * a.cols + col] = s;
  }
}

__global__ void column_total(ColumnGradArgs a, int64_t n_chunks) {
  const int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= a.cols) return;
  float s = 0.0f;
  for (int64_t c = 0; c < n_chunks; ++c) s += a.workspace[c * a.cols + col];
  a.out[col] += s;
}

__global__ void embedding_sorted_grad(EmbeddingGradArgs a) {
  const int64_t u = blockIdx.x;
  const int32_t tok = a.tokens[u];
  if (tok < 0 || tok >= a.vocab) return;
  const int32_t b = a.starts[u], e = a.starts[u + 1];
  for (int64_t j = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; j < a.dim; j += int64_t(gridDim.y) * blockDim.x) {
    float s = 0.0f;
    for (int32_t k = b; k < e; ++k) s += a.d_out[int64_t(a.positions[k]) * a.dim + j];
    a.d_table[int64_t(tok) * a.dim + j] += s;
  }
}

}  // namespace

Status column_grad(CudaContext& ctx, const ColumnGradArgs& a) {
  if (a.rows < 0 || a.cols <= 0) return invalid_argument("cuda column_grad: bad shape rows=", a.rows, " cols=", a.cols);
  const int64_t ld = a.ld_dy ? a.ld_dy : a.cols;
  if (ld < a.cols) return invalid_argument("cuda column_grad: row stride ", ld, " < ", a.cols, " columns");
  if (!a.dy || !a.out || !a.workspace || (a.h && !a.rstd))
    return invalid_argument("cuda column_grad: dy, out, workspace (and rstd with h) are required");
  if (a.rows == 0) return Status::ok();
  const int64_t n_chunks = (a.rows + kColumnGradChunkRows - 1) / kColumnGradChunkRows;
  if (n_chunks > 65535) return unsupported("cuda column_grad: ", a.rows, " rows is more than 65535 chunks");
  const dim3 grid(blocks_for(a.cols, kCols), static_cast<unsigned>(n_chunks));
  column_partials<<<grid, dim3(kCols, kRowLanes), 0, stream_of(ctx)>>>(a, ld);
  LATHE_TRY(ctx.check_launch("column_grad partials"));
  column_total<<<blocks_for(a.cols, 256), 256, 0, stream_of(ctx)>>>(a, n_chunks);
  return ctx.check_launch("column_grad total");
}

Status embedding_grad(CudaContext& ctx, const EmbeddingGradArgs& a) {
  if (a.n_unique < 0 || a.dim <= 0 || a.vocab <= 0)
    return invalid_argument("cuda embedding_grad: bad shape n_unique=", a.n_unique, " dim=", a.dim);
  if (a.n_unique == 0) return Status::ok();
  if (!a.d_out || !a.tokens || !a.starts || !a.positions || !a.d_table)
    return invalid_argument("cuda embedding_grad: null argument");
  if (a.n_unique > 0x7fffffff) return unsupported("cuda embedding_grad: too many distinct tokens");
  constexpr int kThreads = 128;
  const unsigned col_blocks = blocks_for(a.dim, kThreads * 4);  // each thread ≥ 4 columns of a wide row
  embedding_sorted_grad<<<dim3(static_cast<unsigned>(a.n_unique), col_blocks), kThreads, 0, stream_of(ctx)>>>(a);
  return ctx.check_launch("embedding_grad");
}

}  // namespace lathe::cuda
