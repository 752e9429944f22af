// The LoRA rank products (lora_ops.h: u = x·Aᵀ, du = dy·B) on the tensor
// cores with their 3-term sum, scale and 4-term split in the epilogue. The
// GEMM path computes the same products into f32 parts (four terms, the
// fourth a copy of the first that only the base GEMM needs) and sums them
// in a second kernel; here a thread block owns block_rows rows and every
// column of its job (members·r ≤ 96), walks K through a 3-stage cp.async
// pipeline and adds the three terms' products into one f32 accumulator, so
// nothing but x, the small term copies and the bf16 split moves (and, on
// request, a compact (hi, lo) copy of the split for a later GEMM). A job's K
// loop is the whole reduction: no split-K, no partial sums, fixed order.
//
// Tiles: 64 or 128 rows × kN columns (kN = members·r rounded up to 32;
// columns past members·r are zeros in shared memory and never stored),
// kBK = 64 of K a stage; warps of 32 rows × kN/2 columns (m16n8k16, the
// fragment helpers of attention_common.cuh). W's stage holds the three
// terms' [kN, kBK] (by rows, the A4 planes) or [kBK, kN] (by k, B4) tiles.
// Rows and K past the end load as zeros (cp.async's zero fill).
#include <algorithm>

#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/context_impl.h"
#include "backends/cuda/lora_ops.h"

namespace lathe::cuda {
namespace {

using attn::bf16;

constexpr int kBK = 64, kStages = 3, kTerms = 3;
constexpr int kXStride = kBK + 8;  // a row of an x or by-rows W tile, padded (16-byte aligned, no bank conflicts)

struct RankParams {
  LoraRankJob job[kLoraRankMaxJobs];
  int rows, r;
};

template <int kBM, int kN, bool kByK>
struct RankTile {
  static constexpr int kWarps = kBM / 32 * 2;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWStride = kByK ? kN + 8 : kXStride;
  static constexpr int kXElems = kBM * kXStride;
  static constexpr int kWElems = kTerms * (kByK ? kBK * kWStride : kN * kXStride);
  static constexpr int kStageElems = kXElems + kWElems;
  static constexpr int kSmemBytes = kStages * kStageElems * 2;
  static constexpr int kNT = kN / 16;  // 8-column tiles per warp (a warp takes kN/2 columns)
};

// Zeros W's padding columns [n_cols, kN) in every stage: cp.async never
// writes them.
template <int kBM, int kN, bool kByK>
__device__ void zero_padding(bf16* smem, int n_cols) {
  using T = RankTile<kBM, kN, kByK>;
  const bf16 zero = __float2bfloat16_rn(0.0f);
  const int pad = kN - n_cols;
  if (pad <= 0) return;
  for (int s = 0; s < kStages; ++s) {
    bf16* w = smem + s * T::kStageElems + T::kXElems;
    if constexpr (kByK) {
      for (int i = threadIdx.x; i < kTerms * kBK * pad; i += T::kThreads)
        w[(i / pad) * T::kWStride + n_cols + i % pad] = zero;
    } else {
      for (int i = threadIdx.x; i < kTerms * pad * kXStride; i += T::kThreads) {
        const int row = i / kXStride, p = row / pad;
        w[(p * kN + n_cols + row % pad) * kXStride + i % kXStride] = zero;
      }
    }
  }
}

// Stage s ← x rows [row0, row0 + kBM) and W's three terms, K [k0, k0 + kBK).
template <int kBM, int kN, bool kByK>
__device__ void load_stage(bf16* stage, const LoraRankJob& j, int rows, int r, int row0, int64_t k0) {
  using T = RankTile<kBM, kN, kByK>;
  const auto* x = reinterpret_cast<const bf16*>(j.x);
  const auto* w = reinterpret_cast<const bf16*>(j.w);
  for (int i = threadIdx.x; i < kBM * (kBK / 8); i += T::kThreads) {
    const int rr = i / (kBK / 8), cc = i % (kBK / 8);
    const int64_t kk = k0 + cc * 8;
    const bool ok = row0 + rr < rows && kk < j.k;
    attn::cp_async16(stage + rr * kXStride + cc * 8, ok ? x + int64_t(row0 + rr) * j.ldx + kk : x, ok);
  }
  bf16* ws = stage + T::kXElems;
  const int n_cols = j.n_members * r;
  if constexpr (kByK) {
    const int chunks = n_cols / 8;  // per row of k
    for (int i = threadIdx.x; i < kTerms * kBK * chunks; i += T::kThreads) {
      const int pk = i / chunks, n = (i % chunks) * 8, p = pk / kBK, kr = pk % kBK;
      const int64_t kk = k0 + kr;
      const bool ok = kk < j.k;
      const int64_t col = (n / r) * j.member_stride + p * j.term_stride + n % r;
      attn::cp_async16(ws + pk * T::kWStride + n, ok ? w + kk * j.ldw + col : w, ok);
    }
  } else {
    for (int i = threadIdx.x; i < kTerms * n_cols * (kBK / 8); i += T::kThreads) {
      const int pn = i / (kBK / 8), cc = i % (kBK / 8), p = pn / n_cols, n = pn % n_cols;
      const int64_t kk = k0 + cc * 8;
      const bool ok = kk < j.k;
      const int64_t row = (n / r) * j.member_stride + p * j.term_stride + n % r;
      attn::cp_async16(ws + (p * kN + n) * kXStride + cc * 8, ok ? w + row * j.ldw + kk : w, ok);
    }
  }
}

// acc += x tile · (the three W terms)ᵀ over one stage.
template <int kBM, int kN, bool kByK>
__device__ __forceinline__ void mma_stage(float (&acc)[2][kN / 16][4], const bf16* stage, int wr, int wc) {
  using T = RankTile<kBM, kN, kByK>;
  const bf16* xs = stage;
  const bf16* ws = stage + T::kXElems;
#pragma unroll
  for (int kk = 0; kk < kBK; kk += 16) {
    uint32_t a[2][4];
#pragma unroll
    for (int i = 0; i < 2; ++i) attn::load_a_x4(a[i], xs, kXStride, wr * 32 + i * 16, kk);
#pragma unroll
    for (int p = 0; p < kTerms; ++p) {
#pragma unroll
      for (int t = 0; t < T::kNT; t += 2) {
        const int n0 = wc * (kN / 2) + t * 8;
        uint32_t b0[2], b1[2];
        if constexpr (kByK) {
          attn::load_b_cols_x2(b0, b1, ws + p * kBK * T::kWStride, T::kWStride, kk, n0);
        } else {
          attn::load_b_rows_x2(b0, b1, ws + p * kN * kXStride, kXStride, n0, kk);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          attn::mma_bf16(acc[i][t], a[i], b0);
          attn::mma_bf16(acc[i][t + 1], a[i], b1);
        }
      }
    }
  }
}

__device__ __forceinline__ void store_pair(bf16* d, bf16 lo_half, bf16 hi_half) {
  *reinterpret_cast<uint32_t*>(d) = attn::pack_raw(lo_half, hi_half);
}

// v = scale·acc, split (hi, hi, hi, lo) into the member's 4r columns.
template <int kN>
__device__ void store_split(const float (&acc)[2][kN / 16][4], const LoraRankJob& j, int rows, int r, int row_base,
                            int wc) {
  const int lane = threadIdx.x % 32, g = lane / 4, c4 = lane % 4;
  auto* out = reinterpret_cast<bf16*>(j.out);
  const int n_cols = j.n_members * r;
#pragma unroll
  for (int t = 0; t < kN / 16; ++t) {
    const int n = wc * (kN / 2) + t * 8 + 2 * c4;
    if (n >= n_cols) continue;
    const int m = n / r, c = n % r;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row_base + i * 16 + g + 8 * h;
        if (row >= rows) continue;
        const float v0 = __fmul_rn(acc[i][t][2 * h], j.scale), v1 = __fmul_rn(acc[i][t][2 * h + 1], j.scale);
        const bf16 hi0 = __float2bfloat16_rn(v0), hi1 = __float2bfloat16_rn(v1);
        const bf16 lo0 = __float2bfloat16_rn(__fsub_rn(v0, __bfloat162float(hi0)));
        const bf16 lo1 = __float2bfloat16_rn(__fsub_rn(v1, __bfloat162float(hi1)));
        bf16* d = out + int64_t(row) * j.ld_out + j.out_col[m] + c;
        store_pair(d, hi0, hi1);
        store_pair(d + r, hi0, hi1);
        store_pair(d + 2 * r, hi0, hi1);
        store_pair(d + 3 * r, lo0, lo1);
        if (j.pair) {
          bf16* q = reinterpret_cast<bf16*>(j.pair) + int64_t(row) * j.ld_pair + m * 2 * r + c;
          store_pair(q, hi0, hi1);
          store_pair(q + r, lo0, lo1);
        }
      }
  }
}

template <int kBM, int kN, bool kByK>
__global__ void __launch_bounds__(RankTile<kBM, kN, kByK>::kThreads)
    rank_kernel(const __grid_constant__ RankParams p) {
  using T = RankTile<kBM, kN, kByK>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw);
  const LoraRankJob& j = p.job[blockIdx.y];
  const int row0 = int(blockIdx.x) * kBM;
  const int warp = threadIdx.x / 32, wr = warp / 2, wc = warp % 2;
  zero_padding<kBM, kN, kByK>(smem, j.n_members * p.r);
  float acc[2][kN / 16][4] = {};
  const int kt_n = int((j.k + kBK - 1) / kBK);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < kt_n) load_stage<kBM, kN, kByK>(smem + s * T::kStageElems, j, p.rows, p.r, row0, int64_t(s) * kBK);
    attn::cp_async_commit();
  }
  for (int kt = 0; kt < kt_n; ++kt) {
    attn::cp_async_wait_one();  // stage kt has landed (one newer group may be in flight)
    __syncthreads();            // ... for every thread; and stage kt − 1 is no longer read
    const int next = kt + kStages - 1;
    if (next < kt_n)
      load_stage<kBM, kN, kByK>(smem + (next % kStages) * T::kStageElems, j, p.rows, p.r, row0,
                                int64_t(next) * kBK);
    attn::cp_async_commit();  // possibly empty: keeps the group count in step
    mma_stage<kBM, kN, kByK>(acc, smem + (kt % kStages) * T::kStageElems, wr, wc);
  }
  attn::cp_async_wait_all();
  store_split<kN>(acc, j, p.rows, p.r, row0 + wr * 32, wc);
}

template <int kBM, int kN, bool kByK>
Status launch(CudaContext& ctx, const RankParams& p, int n_jobs) {
  using T = RankTile<kBM, kN, kByK>;
  auto* kernel = rank_kernel<kBM, kN, kByK>;
  LATHE_TRY(cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes),
                       "cudaFuncSetAttribute(lora_rank_product)"));
  const dim3 grid(unsigned((p.rows + kBM - 1) / kBM), unsigned(n_jobs));
  kernel<<<grid, T::kThreads, T::kSmemBytes, stream_of(ctx)>>>(p);
  return ctx.check_launch("lora_rank_product");
}

template <int kBM, bool kByK>
Status launch_n(CudaContext& ctx, const RankParams& p, int n_jobs, int n_cols) {
  if (n_cols <= 32) return launch<kBM, 32, kByK>(ctx, p, n_jobs);
  if (n_cols <= 64) return launch<kBM, 64, kByK>(ctx, p, n_jobs);
  return launch<kBM, 96, kByK>(ctx, p, n_jobs);
}

bool aligned(const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

int multiprocessors(int device) {
  int n = 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0) return 132;
  return n;
}

}  // namespace

bool lora_rank_supported(const LoraRankArgs& a) {
  if (a.n_jobs < 1 || a.n_jobs > kLoraRankMaxJobs || a.r < 8 || a.r % 8 != 0 || a.rows < 1 ||
      a.rows > (int64_t(1) << 30))
    return false;
  for (int i = 0; i < a.n_jobs; ++i) {
    const LoraRankJob& j = a.job[i];
    if (!j.x || !j.w || !j.out || j.n_members < 1 || j.n_members > 3 || j.n_members * a.r > 96 || j.k < 1) return false;
    if (j.k % 8 || j.ldx % 8 || j.ldw % 8 || j.term_stride % 8 || j.member_stride % 8 || j.ld_out % 2) return false;
    if (!aligned(j.x, 16) || !aligned(j.w, 16) || !aligned(j.out, 4)) return false;
    for (int m = 0; m < j.n_members; ++m)
      if (j.out_col[m] % 2) return false;
    if (j.pair && (j.ld_pair % 2 || j.ld_pair < 2 * a.r * j.n_members || !aligned(j.pair, 4))) return false;
  }
  return true;
}

Status lora_rank_product(CudaContext& ctx, const LoraRankArgs& a) {
  if (a.rows == 0) return Status::ok();
  if (!lora_rank_supported(a))
    return invalid_argument("cuda lora_rank_product: unsupported shape or alignment (rows ", a.rows, ", r ", a.r,
                            ", jobs ", a.n_jobs, ")");
  RankParams p{};
  int n_cols = 0;
  for (int i = 0; i < a.n_jobs; ++i) {
    p.job[i] = a.job[i];
    n_cols = std::max(n_cols, int(a.job[i].n_members * a.r));
  }
  p.rows = int(a.rows), p.r = int(a.r);
  int bm = a.block_rows;
  if (bm == 0) {  // 128 rows a block (half W's reads from L2) once that still gives most SMs a block
    static const int sms = multiprocessors(ctx.device());  // one device a process in the trainer
    bm = (a.rows + 127) / 128 * a.n_jobs >= int64_t(sms) * 9 / 10 ? 128 : 64;
  }
  if (bm != 64 && bm != 128) return invalid_argument("cuda lora_rank_product: block_rows ", bm, " (64 or 128)");
  if (bm == 128) return a.w_by_k ? launch_n<128, true>(ctx, p, a.n_jobs, n_cols) : launch_n<128, false>(ctx, p, a.n_jobs, n_cols);
  return a.w_by_k ? launch_n<64, true>(ctx, p, a.n_jobs, n_cols) : launch_n<64, false>(ctx, p, a.n_jobs, n_cols);
}

}  // namespace lathe::cuda
