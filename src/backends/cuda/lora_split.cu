// The two elementwise kernels of the fp32 LoRA branch (lora_ops.h): the
// 4-term bf16 copies of the f32 factors, rewritten after each optimizer
// step, and the sum of a stacked GEMM's partial products (into an f32
// gradient, or into the 4-term copy of an activation-side value). The
// copies take 4 columns a thread where the factor allows (grid-stride, one
// row of blocks per factor), else one value. The sums run several
// at once (every member of a fused group, each its own job): a training
// step makes hundreds of them, most a few microseconds of work, so one
// launch per group and phase instead of one per member, each job its own
// run of thread blocks. A thread sums 4 neighbouring columns with 16-byte
// loads (8-byte bf16 stores) where every stride and pointer allows, with
// 32-bit index arithmetic; else one value, the earlier kernel. Both add
// the parts in order from 0, scale, then add to the sum, each rounded
// (__fadd_rn / __fmul_rn: no contraction), so every path gives the same
// bits.
#include "backends/cuda/context_impl.h"
#include "backends/cuda/lora_ops.h"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 256;

// hi + mid + lo = v: each difference is exact in f32.
__device__ __forceinline__ void split3(float v, float* hi, float* mid, float* lo) {
  *hi = __bfloat162float(__float2bfloat16_rn(v));
  const float r1 = v - *hi;
  *mid = __bfloat162float(__float2bfloat16_rn(r1));
  *lo = r1 - *mid;
}

union Bf16x4 {
  uint2 word;
  __nv_bfloat16 h[4];
};

__device__ __forceinline__ void store4(bf16_bits* d, const float (&v)[4]) {
  Bf16x4 u;
#pragma unroll
  for (int e = 0; e < 4; ++e) u.h[e] = __float2bfloat16_rn(v[e]);
  *reinterpret_cast<uint2*>(d) = u.word;
}

// Where term p of element (row, col) of factor f goes.
__device__ __forceinline__ int64_t term_at(const LoraSplitFactor& f, int64_t row, int64_t col, int p) {
  if (f.by_row) return row * (f.ld ? f.ld : 4 * f.cols) + p * f.cols + col;
  return (p * f.rows + row) * (f.ld ? f.ld : f.cols) + col;
}

// Factors whose columns, offsets and row stride are multiples of 4 (every
// LoRA factor of the trainer's) take 4 columns a thread: one 16-byte load,
// four 8-byte stores, 32-bit index arithmetic (a factor has < 2^31 values).
__global__ void split_weights_kernel(LoraSplitWeightsArgs a) {
  const LoraSplitFactor f = a.factors[blockIdx.y];
  const int64_t numel = f.rows * f.cols;
  bf16_bits* d = a.dst + f.dst;
  const bool by4 = f.cols % 4 == 0 && f.src % 4 == 0 && f.dst % 4 == 0 && f.ld % 4 == 0 &&
                   reinterpret_cast<uintptr_t>(a.src) % 16 == 0 && reinterpret_cast<uintptr_t>(a.dst) % 8 == 0 &&
                   numel < (int64_t(1) << 31);
  if (by4) {
    const uint32_t q4 = uint32_t(f.cols / 4), units = uint32_t(numel / 4);
    for (uint32_t u = blockIdx.x * blockDim.x + threadIdx.x; u < units; u += gridDim.x * blockDim.x) {
      const uint32_t row = u / q4, col = (u - row * q4) * 4;
      const float4 v = *reinterpret_cast<const float4*>(a.src + f.src + int64_t(u) * 4);
      float t[4][4];  // [term][column]
      split3(v.x, &t[0][0], &t[1][0], &t[2][0]);
      split3(v.y, &t[0][1], &t[1][1], &t[2][1]);
      split3(v.z, &t[0][2], &t[1][2], &t[2][2]);
      split3(v.w, &t[0][3], &t[1][3], &t[2][3]);
#pragma unroll
      for (int p = 0; p < 4; ++p) store4(d + term_at(f, row, col, p), t[p == 3 ? 0 : p]);
    }
    return;
  }
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += int64_t(gridDim.x) * blockDim.x) {
    float t[4];
    split3(a.src[f.src + i], &t[0], &t[1], &t[2]);
    t[3] = t[0];
    const int64_t row = i / f.cols, col = i % f.cols;
    for (int p = 0; p < 4; ++p) dev::st(d, term_at(f, row, col, p), t[p]);
  }
}

// v = scale · Σ_p part p (in order from 0), then sum (+)= v and the split.
__device__ __forceinline__ float sum_parts_at(const LoraPartsArgs& a, const float* s) {
  float v = 0.0f;
  for (int64_t p = 0; p < a.n_parts; ++p) v = __fadd_rn(v, s[p * a.part_stride]);
  return __fmul_rn(v, a.scale);
}

__global__ void sum_parts_kernel(LoraPartsArgs a) {
  const int64_t per_row = a.n_groups * a.cols, n = a.rows * per_row;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / per_row, gc = i % per_row, g = gc / a.cols, col = gc % a.cols;
    const float v = sum_parts_at(a, a.src + row * a.row_stride + g * a.group_stride + col);
    if (a.sum) a.sum[i] = a.accumulate ? __fadd_rn(a.sum[i], v) : v;
    if (a.split) {
      const float hi = __bfloat162float(__float2bfloat16_rn(v));
      bf16_bits* d = a.split + row * (a.split_ld ? a.split_ld : 4 * per_row) + g * 4 * a.cols + col;
      dev::st(d, 0, hi);
      dev::st(d, a.cols, hi);
      dev::st(d, 2 * a.cols, hi);
      dev::st(d, 3 * a.cols, __fsub_rn(v, hi));
    }
  }
}

// Up to kMaxPartsJobs sums of 4-column units; job j owns blocks
// [first[j], first[j + 1]).
constexpr int kMaxPartsJobs = 8;
struct PartsBatch {
  LoraPartsArgs job[kMaxPartsJobs];
  int first[kMaxPartsJobs + 1];
  int n_jobs;
};

__global__ void sum_parts4_kernel(const __grid_constant__ PartsBatch b) {
  int j = 0;
  while (j + 1 < b.n_jobs && int(blockIdx.x) >= b.first[j + 1]) ++j;
  const LoraPartsArgs& a = b.job[j];
  const uint32_t q4 = uint32_t(a.cols / 4), groups = uint32_t(a.n_groups);
  const uint32_t units = uint32_t(a.rows) * groups * q4;  // < 2^31 (checked on the host)
  const uint32_t stride = uint32_t(b.first[j + 1] - b.first[j]) * blockDim.x;
  for (uint32_t u = (blockIdx.x - uint32_t(b.first[j])) * blockDim.x + threadIdx.x; u < units; u += stride) {
    const uint32_t rg = u / q4, col = (u - rg * q4) * 4, row = rg / groups, g = rg - row * groups;
    const float* s = a.src + int64_t(row) * a.row_stride + int64_t(g) * a.group_stride + col;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t p = 0; p < a.n_parts; ++p) {
      const float4 x = *reinterpret_cast<const float4*>(s + p * a.part_stride);
      v[0] = __fadd_rn(v[0], x.x), v[1] = __fadd_rn(v[1], x.y), v[2] = __fadd_rn(v[2], x.z);
      v[3] = __fadd_rn(v[3], x.w);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = __fmul_rn(v[e], a.scale);
    if (a.sum) {
      float4* out = reinterpret_cast<float4*>(a.sum + int64_t(rg) * a.cols + col);
      if (a.accumulate) {
        const float4 o = *out;
        *out = make_float4(__fadd_rn(o.x, v[0]), __fadd_rn(o.y, v[1]), __fadd_rn(o.z, v[2]), __fadd_rn(o.w, v[3]));
      } else {
        *out = make_float4(v[0], v[1], v[2], v[3]);
      }
    }
    if (a.split) {
      float hi[4], lo[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        hi[e] = __bfloat162float(__float2bfloat16_rn(v[e]));
        lo[e] = __fsub_rn(v[e], hi[e]);
      }
      const int64_t ld = a.split_ld ? a.split_ld : 4 * int64_t(groups) * a.cols;
      bf16_bits* d = a.split + int64_t(row) * ld + int64_t(g) * 4 * a.cols + col;
      store4(d, hi);
      store4(d + a.cols, hi);
      store4(d + 2 * a.cols, hi);
      store4(d + 3 * a.cols, lo);
    }
  }
}

// Blocks for n values, at most `cap` (the loops stride over the rest).
unsigned grid_for(int64_t n, unsigned cap) {
  const unsigned b = blocks_for(n, kThreads);
  return b < cap ? b : cap;
}

}  // namespace

Status lora_split_weights(CudaContext& ctx, const LoraSplitWeightsArgs& a) {
  if (a.n_factors < 0 || a.max_numel < 0) return invalid_argument("cuda lora_split_weights: negative size");
  if (a.n_factors == 0 || a.max_numel == 0) return Status::ok();
  if (!a.factors || !a.src || !a.dst) return invalid_argument("cuda lora_split_weights: null argument");
  if (a.n_factors > 65535) return unsupported("cuda lora_split_weights: ", a.n_factors, " factors (at most 65535)");
  // Hundreds of factors of very different sizes: few blocks per factor.
  const dim3 grid(grid_for((a.max_numel + 3) / 4, 64), unsigned(a.n_factors));
  split_weights_kernel<<<grid, kThreads, 0, stream_of(ctx)>>>(a);
  return ctx.check_launch("lora_split_weights");
}

namespace {

Status check_parts(const LoraPartsArgs& a) {
  if (a.rows < 0 || a.cols < 0 || a.n_groups < 1 || a.n_parts < 1)
    return invalid_argument("cuda lora_sum_parts: bad shape rows=", a.rows, " cols=", a.cols, " groups=", a.n_groups,
                            " parts=", a.n_parts);
  if (a.rows * a.n_groups * a.cols == 0) return Status::ok();
  if (!a.src || (!a.sum && !a.split)) return invalid_argument("cuda lora_sum_parts: null argument");
  if (a.split_ld != 0 && a.split_ld < 4 * a.n_groups * a.cols)
    return invalid_argument("cuda lora_sum_parts: split_ld ", a.split_ld, " is shorter than a row (",
                            4 * a.n_groups * a.cols, ")");
  return Status::ok();
}

// True when a's sum takes 4-column units: every stride a multiple of 4
// floats, 16-byte f32 and 8-byte bf16 pointers, fewer than 2^31 units.
bool by_fours(const LoraPartsArgs& a) {
  auto at = [](const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
  return a.cols % 4 == 0 && a.row_stride % 4 == 0 && a.group_stride % 4 == 0 && a.part_stride % 4 == 0 &&
         a.split_ld % 4 == 0 && at(a.src, 16) && at(a.sum, 16) && at(a.split, 8) &&
         a.rows * a.n_groups * (a.cols / 4) < (int64_t(1) << 31);
}

}  // namespace

Status lora_sum_parts(CudaContext& ctx, const LoraPartsArgs& a) { return lora_sum_parts_many(ctx, &a, 1); }

Status lora_sum_parts_many(CudaContext& ctx, const LoraPartsArgs* jobs, int n_jobs, bool one_per_value) {
  if (n_jobs < 0 || (n_jobs > 0 && !jobs)) return invalid_argument("cuda lora_sum_parts: bad job list");
  for (int j = 0; j < n_jobs; ++j) LATHE_TRY(check_parts(jobs[j]));
  PartsBatch b{};
  auto flush = [&]() -> Status {
    if (b.n_jobs == 0) return Status::ok();
    sum_parts4_kernel<<<unsigned(b.first[b.n_jobs]), kThreads, 0, stream_of(ctx)>>>(b);
    b.n_jobs = 0;
    return ctx.check_launch("lora_sum_parts");
  };
  for (int j = 0; j < n_jobs; ++j) {
    const LoraPartsArgs& a = jobs[j];
    const int64_t n = a.rows * a.n_groups * a.cols;
    if (n == 0) continue;
    if (one_per_value || !by_fours(a)) {
      sum_parts_kernel<<<grid_for(n, 4096), kThreads, 0, stream_of(ctx)>>>(a);
      LATHE_TRY(ctx.check_launch("lora_sum_parts"));
      continue;
    }
    if (b.n_jobs == kMaxPartsJobs) LATHE_TRY(flush());
    b.job[b.n_jobs] = a;
    b.first[b.n_jobs + 1] = b.first[b.n_jobs] + int(grid_for(n / 4, 4096));
    ++b.n_jobs;
  }
  return flush();
}

}  // namespace lathe::cuda
