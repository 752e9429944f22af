// RMSNorm fused with the residual add, forward and backward. The fast path
// holds a row in registers, read once with 16-byte loads and written once:
// rows of more than 256 elements take one block per row (kPer 8-element
// chunks per thread, ≤ 512 threads), rows of 40..256 elements (the q/k norms
// over one head) a group of 8, 16 or 32 lanes of a warp. Rows that are not
// a multiple of 8 long or not 16-byte aligned, and the backward with a
// weight gradient (dw, which only the tests ask for), take the scalar
// kernels: one block per row reading it twice, and blocks striding over
// rows with dw's partial sums in shared memory (one f32 atomic per column
// per block).
// Rounding (both paths): h = bf16(x + residual), rstd = rsqrt(Σh²/dim + eps)
// in f32 from that bf16 h, y = bf16((h·rstd)·w); the backward in f32 with
// dh = dh + g rounded once to bf16 for dh_bf. The sums' order differs
// between the paths (last-bit differences in rstd); a given shape always
// takes the same path, so a recomputation is bitwise the forward. The
// forward's y and the backward's dh_bf may have a row stride (ld_y,
// ld_dh_bf: the first dim columns of a wider matrix); the register path
// takes strides that keep rows 16-byte aligned.
#include "backends/cuda/context_impl.h"
#include "backends/cuda/vec8.cuh"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 256;
// Backward: enough blocks to fill an H200 several times over; dw partials
// live in the default 48 KiB of shared memory (dim <= 12288).
constexpr int64_t kMaxBwdBlocks = 1024;
constexpr size_t kMaxDwShared = 48 * 1024;
// Register path, one block per row: at most this many threads (each with
// 1, 2, 4 or 8 chunks of 8 elements; fewer registers per thread than
// 256-thread blocks with twice the chunks, so more rows in flight).
constexpr int kMaxRowThreads = 512;

__global__ void rms_norm_residual_fwd(RmsNormResidualArgs a) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t base = row * a.dim, ybase = row * (a.ld_y ? a.ld_y : a.dim);
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < a.dim; j += blockDim.x) {
    float h = dev::ld(a.x, base + j);
    if (a.residual) {
      // The residual stream is stored in bf16: normalize what is stored.
      h = dev::round_bf16(h + dev::ld(a.residual, base + j));
      if (a.h_out) dev::st(a.h_out, base + j, h);
    } else if (a.h_out) {
      dev::st(a.h_out, base + j, h);
    }
    ss += h * h;
  }
  ss = dev::block_sum(ss, scratch);
  const float rstd = rsqrtf(ss / static_cast<float>(a.dim) + a.eps);
  if (a.rstd && threadIdx.x == 0) a.rstd[row] = rstd;
  for (int64_t j = threadIdx.x; j < a.dim; j += blockDim.x) {
    // h_out may alias x or residual (residual += x in place): read h back
    // from it; each thread reads only the elements it wrote.
    float h;
    if (a.h_out) {
      h = dev::ld(a.h_out, base + j);
    } else {
      h = dev::ld(a.x, base + j);
      if (a.residual) h = dev::round_bf16(h + dev::ld(a.residual, base + j));
    }
    dev::st(a.y, ybase + j, h * rstd * dev::ld(a.w, j));
  }
}

// Blocks stride over rows; each thread owns the columns j ≡ threadIdx.x
// (mod blockDim.x) and keeps their dw partial sums in shared memory (no
// shared atomics needed), added to dw once per block at the end.
__global__ void rms_norm_residual_bwd(RmsNormResidualBackwardArgs a) {
  __shared__ float scratch[32];
  extern __shared__ float dw_part[];  // [dim] when a.dw
  if (a.dw) {
    for (int64_t j = threadIdx.x; j < a.dim; j += blockDim.x) dw_part[j] = 0.0f;
  }
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const int64_t base = row * a.dim, bf_base = row * (a.ld_dh_bf ? a.ld_dh_bf : a.dim);
    const float rstd = a.rstd[row];
    float dot = 0.0f;  // Σ (w⊙dy)·ĥ
    for (int64_t j = threadIdx.x; j < a.dim; j += blockDim.x) {
      dot += dev::ld(a.w, j) * dev::ld(a.dy, base + j) * dev::ld(a.h, base + j) * rstd;
    }
    dot = dev::block_sum(dot, scratch);  // also orders the reads of dy before any write (dh_bf may alias dy)
    const float mean = dot / static_cast<float>(a.dim);
    for (int64_t j = threadIdx.x; j < a.dim; j += blockDim.x) {
      const float hn = dev::ld(a.h, base + j) * rstd;
      const float dy = dev::ld(a.dy, base + j);
      const float g = rstd * (dev::ld(a.w, j) * dy - hn * mean);
      const float v = a.accumulate ? a.dh[base + j] + g : g;
      if (a.dh) a.dh[base + j] = v;
      if (a.dh_bf) dev::st(a.dh_bf, bf_base + j, v);
      if (a.dw) dw_part[j] += dy * hn;
    }
  }
  if (a.dw) {
    for (int64_t j = threadIdx.x; j < a.dim; j += blockDim.x) atomicAdd(&a.dw[j], dw_part[j]);
  }
}

// ---- Register-resident rows ------------------------------------------------
// kGroup > 0: kGroup lanes per row (kPer = 1), blockDim / kGroup rows per
// block; kGroup == 0: one block per row, kPer chunks per thread.
struct RowSlot {
  int64_t row;
  int lane, width;
};

template <int kGroup>
__device__ __forceinline__ RowSlot row_slot() {
  if constexpr (kGroup > 0) {
    return {int64_t(blockIdx.x) * (blockDim.x / kGroup) + threadIdx.x / kGroup, int(threadIdx.x % kGroup), kGroup};
  } else {
    return {int64_t(blockIdx.x), int(threadIdx.x), int(blockDim.x)};
  }
}

template <int kGroup>
__device__ __forceinline__ float row_sum(float x, float* scratch) {
  if constexpr (kGroup > 0) {
    return dev::group_sum<kGroup>(x);
  } else {
    return dev::block_sum(x, scratch);
  }
}

// Every thread reaches the reduction (rows past the end with zeros); reads
// all come before it and writes after, so outputs may alias inputs.
template <int kPer, int kGroup>
__global__ void rms_fwd_vec(RmsNormResidualArgs a) {
  __shared__ float scratch[32];
  const RowSlot s = row_slot<kGroup>();
  const bool live = s.row < a.rows;
  const int64_t chunks = a.dim / 8, base = s.row * a.dim;
  float h[kPer][8];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t c = s.lane + int64_t(k) * s.width;
    if (!live || c >= chunks) continue;
    dev::ld8(a.x, base + c * 8, h[k]);
    if (a.residual) {
      float r[8];
      dev::ld8(a.residual, base + c * 8, r);
#pragma unroll
      for (int e = 0; e < 8; ++e) h[k][e] = dev::round_bf16(h[k][e] + r[e]);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += h[k][e] * h[k][e];
  }
  ss = row_sum<kGroup>(ss, scratch);
  if (!live) return;
  const float rstd = rsqrtf(ss / static_cast<float>(a.dim) + a.eps);
  if (a.rstd && s.lane == 0) a.rstd[s.row] = rstd;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t c = s.lane + int64_t(k) * s.width;
    if (c >= chunks) continue;
    if (a.h_out) dev::st8(a.h_out, base + c * 8, h[k]);
    float w[8], y[8];
    dev::ld8(a.w, c * 8, w);
#pragma unroll
    for (int e = 0; e < 8; ++e) y[e] = h[k][e] * rstd * w[e];
    dev::st8(a.y, s.row * (a.ld_y ? a.ld_y : a.dim) + c * 8, y);
  }
}

template <int kPer, int kGroup>
__global__ void rms_bwd_vec(RmsNormResidualBackwardArgs a) {
  __shared__ float scratch[32];
  const RowSlot s = row_slot<kGroup>();
  const bool live = s.row < a.rows;
  const int64_t chunks = a.dim / 8, base = s.row * a.dim;
  const float rstd = live ? a.rstd[s.row] : 0.0f;
  float h[kPer][8], dy[kPer][8];
  float dot = 0.0f;  // Σ (w⊙dy)·ĥ
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t c = s.lane + int64_t(k) * s.width;
    if (!live || c >= chunks) continue;
    float w[8];
    dev::ld8(a.h, base + c * 8, h[k]);
    dev::ld8(a.dy, base + c * 8, dy[k]);
    dev::ld8(a.w, c * 8, w);
#pragma unroll
    for (int e = 0; e < 8; ++e) dot += w[e] * dy[k][e] * h[k][e] * rstd;
  }
  dot = row_sum<kGroup>(dot, scratch);
  if (!live) return;
  const float mean = dot / static_cast<float>(a.dim);
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t c = s.lane + int64_t(k) * s.width;
    if (c >= chunks) continue;
    float w[8], v[8];
    dev::ld8(a.w, c * 8, w);
    if (a.accumulate) {
      dev::ld8(a.dh, base + c * 8, v);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = 0.0f;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float hn = h[k][e] * rstd;
      const float g = rstd * (w[e] * dy[k][e] - hn * mean);
      v[e] = a.accumulate ? v[e] + g : g;
    }
    if (a.dh) dev::st8(a.dh, base + c * 8, v);
    if (a.dh_bf) dev::st8(a.dh_bf, s.row * (a.ld_dh_bf ? a.ld_dh_bf : a.dim) + c * 8, v);
  }
}

// The register path's shape for a row of `dim` elements: threads per
// block, rows per block and the (kPer, kGroup) instance; false when the
// scalar kernel must run.
struct VecPlan {
  int per = 0, group = 0, threads = 0;
  int64_t rows_per_block = 1;
};

bool plan_vec(int64_t dim, VecPlan* p) {
  if (dim % 8 != 0) return false;
  const int64_t chunks = dim / 8;
  if (chunks < 5) return false;
  if (chunks <= 32) {
    p->per = 1;
    p->group = chunks <= 8 ? 8 : chunks <= 16 ? 16 : 32;
    p->threads = kThreads;
    p->rows_per_block = kThreads / p->group;
    return true;
  }
  for (int per : {1, 2, 4, 8}) {
    if (chunks <= int64_t(per) * kMaxRowThreads) {
      p->per = per;
      p->group = 0;
      p->threads = int((chunks + per - 1) / per + 31) / 32 * 32;
      return true;
    }
  }
  return false;
}

template <class Args, template <int, int> class K>
void launch_plan(const VecPlan& p, const Args& a, cudaStream_t st) {
  const unsigned grid = static_cast<unsigned>((a.rows + p.rows_per_block - 1) / p.rows_per_block);
  if (p.group == 8) K<1, 8>::run(grid, p.threads, st, a);
  if (p.group == 16) K<1, 16>::run(grid, p.threads, st, a);
  if (p.group == 32) K<1, 32>::run(grid, p.threads, st, a);
  if (p.group != 0) return;
  if (p.per == 1) K<1, 0>::run(grid, p.threads, st, a);
  if (p.per == 2) K<2, 0>::run(grid, p.threads, st, a);
  if (p.per == 4) K<4, 0>::run(grid, p.threads, st, a);
  if (p.per == 8) K<8, 0>::run(grid, p.threads, st, a);
}

template <int kPer, int kGroup>
struct FwdVec {
  static void run(unsigned grid, int threads, cudaStream_t st, const RmsNormResidualArgs& a) {
    rms_fwd_vec<kPer, kGroup><<<grid, threads, 0, st>>>(a);
  }
};
template <int kPer, int kGroup>
struct BwdVec {
  static void run(unsigned grid, int threads, cudaStream_t st, const RmsNormResidualBackwardArgs& a) {
    rms_bwd_vec<kPer, kGroup><<<grid, threads, 0, st>>>(a);
  }
};

}  // namespace

Status rms_norm_residual_forward(CudaContext& ctx, const RmsNormResidualArgs& a) {
  if (a.rows < 0 || a.dim <= 0) return invalid_argument("cuda rms_norm: bad shape rows=", a.rows, " dim=", a.dim);
  if (!a.x || !a.w || !a.y) return invalid_argument("cuda rms_norm: x, w and y are required");
  if (!(a.eps > 0.0f)) return invalid_argument("cuda rms_norm: eps must be > 0, got ", a.eps);
  if (a.ld_y != 0 && a.ld_y < a.dim) return invalid_argument("cuda rms_norm: ld_y ", a.ld_y, " < dim ", a.dim);
  if (a.rows == 0) return Status::ok();
  VecPlan p;
  if (plan_vec(a.dim, &p) && aligned16(a.x, a.residual, a.h_out, a.w, a.y) && a.ld_y % 8 == 0) {
    launch_plan<RmsNormResidualArgs, FwdVec>(p, a, stream_of(ctx));
  } else {
    rms_norm_residual_fwd<<<static_cast<unsigned>(a.rows), kThreads, 0, stream_of(ctx)>>>(a);
  }
  return ctx.check_launch("rms_norm_residual_fwd");
}

Status rms_norm_residual_backward(CudaContext& ctx, const RmsNormResidualBackwardArgs& a) {
  if (a.rows < 0 || a.dim <= 0) {
    return invalid_argument("cuda rms_norm_backward: bad shape rows=", a.rows, " dim=", a.dim);
  }
  if (!a.h || !a.w || !a.rstd || !a.dy || !(a.dh || a.dh_bf)) {
    return invalid_argument("cuda rms_norm_backward: h, w, rstd, dy and dh or dh_bf are required");
  }
  if (a.accumulate && !a.dh) return invalid_argument("cuda rms_norm_backward: accumulate needs dh");
  if (a.ld_dh_bf != 0 && (a.ld_dh_bf < a.dim || static_cast<const void*>(a.dh_bf) == a.dy))
    return invalid_argument("cuda rms_norm_backward: ld_dh_bf ", a.ld_dh_bf, " for dim ", a.dim,
                            " (at least dim; 0 when dh_bf aliases dy)");
  if (a.rows == 0) return Status::ok();
  VecPlan p;
  if (!a.dw && plan_vec(a.dim, &p) && aligned16(a.h, a.w, a.dy, a.dh, a.dh_bf) && a.ld_dh_bf % 8 == 0) {
    launch_plan<RmsNormResidualBackwardArgs, BwdVec>(p, a, stream_of(ctx));
    return ctx.check_launch("rms_norm_residual_bwd");
  }
  const size_t shmem = a.dw ? static_cast<size_t>(a.dim) * sizeof(float) : 0;
  if (shmem > kMaxDwShared) {
    return unsupported("cuda rms_norm_backward: dim ", a.dim, " needs ", shmem, " bytes of shared memory for dw (at most ",
                       kMaxDwShared, ")");
  }
  const unsigned grid = static_cast<unsigned>(a.rows < kMaxBwdBlocks ? a.rows : kMaxBwdBlocks);
  rms_norm_residual_bwd<<<grid, kThreads, shmem, stream_of(ctx)>>>(a);
  return ctx.check_launch("rms_norm_residual_bwd");
}

}  // namespace lathe::cuda
