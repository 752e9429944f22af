// The activation-side LoRA products (lora_ops.h: lora_project): u = x·Aᵀ in
// the forward and du = s·dy·B in the backward, each an exact bf16 operand
// times the three terms of an f32 factor, summed in f32 and written straight
// out as the 4-term copy (hi, hi, hi, lo) the next products read. One
// launch covers every member of a fused group; a thread block owns 64 (or
// 32) tokens of one member and all its r columns (up to 64; more are further
// blocks), walks the whole reduction (the input's width), and keeps one f32
// accumulator per term, summed in the order hi + mid + lo, as a GEMM with
// the terms in separate columns followed by a parts sum would. Blocks of
// the same tokens for different members are adjacent, so a shared input
// (x of q|k|v or gate|up) comes from DRAM once.
//
// Shared tiles: 64 tokens (32 where 64 would leave SMs idle) × 64 inputs of
// X, and the factor's three terms over the same 64 inputs, three stages
// deep through cp.async (plain copies where rows are not 16-byte aligned:
// the small ranks of the test models).
// A's terms are rows of the reduction index (B fragments without .trans);
// B4's rows are the reduction index (fragments through ldmatrix.trans).
#include <algorithm>

#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/context_impl.h"
#include "backends/cuda/lora_ops.h"

namespace lathe::cuda {
namespace {

using attn::bf16;

constexpr int kThreads = 128;  // four warps
constexpr int kK = 64;         // reduction steps per stage
constexpr int kStages = 3;
constexpr int kXPad = kK + 8;

// kR tokens and kNB 16-column blocks of r per block. The factor tile is
// [term][j][c] (A, row stride kK + 8) or [c][term · 16kNB + j] (B4, row
// stride 48kNB + 8).
template <int kNB, bool kByRow, int kR>
struct PTiles {
  static constexpr int kN = kNB * 16;
  static constexpr int kFStride = kByRow ? 3 * kN + 8 : kK + 8;
  static constexpr int kFRows = kByRow ? kK : 3 * kN;
  static constexpr int kX = kStages * kR * kXPad;
  static constexpr int kF = kStages * kFRows * kFStride;
  static constexpr size_t kBytes = size_t(kX + kF) * sizeof(bf16);
};

struct ProjParams {
  LoraProjectArgs a;
  bool vec_x = false, vec_f = false, pairs = false;
};

// X rows t0.., reduction columns c0.. of member m (k columns).
template <int kR>
__device__ __forceinline__ void stage_x(bf16* s, const ProjParams& p, const bf16* x, int64_t k, int64_t t0,
                                        int64_t c0) {
  const int64_t T = p.a.tokens;
  if (p.vec_x) {
    constexpr int kChunks = kK / 8;
    for (int i = threadIdx.x; i < kR * kChunks; i += kThreads) {
      const int row = i / kChunks, c = (i % kChunks) * 8;
      const bool valid = t0 + row < T && c0 + c < k;
      attn::cp_async16(s + row * kXPad + c, valid ? x + (t0 + row) * p.a.ldx + c0 + c : x, valid);
    }
    return;
  }
  for (int i = threadIdx.x; i < kR * kK; i += kThreads) {
    const int row = i / kK, c = i % kK;
    s[row * kXPad + c] =
        t0 + row < T && c0 + c < k ? x[(t0 + row) * p.a.ldx + c0 + c] : __float2bfloat16_rn(0.0f);
  }
}

// The factor's three terms for reduction columns c0.. and r columns j0..
template <int kNB, bool kByRow, int kR>
__device__ __forceinline__ void stage_f(bf16* s, const ProjParams& p, const bf16* f, int64_t k, int64_t c0,
                                        int64_t j0) {
  using Tl = PTiles<kNB, kByRow, kR>;
  constexpr int kN = Tl::kN;
  const int64_t r = p.a.r;
  if constexpr (kByRow) {  // B4 [k, 4, r]: element (c, term, j) at c·4r + term·r + j
    if (p.vec_f) {
      constexpr int kChunks = 3 * kN / 8;
      for (int i = threadIdx.x; i < kK * kChunks; i += kThreads) {
        const int row = i / kChunks, ci = i % kChunks, term = ci / (kN / 8), jj = (ci % (kN / 8)) * 8;
        const bool valid = c0 + row < k && j0 + jj < r;
        const bf16* src = valid ? f + (c0 + row) * 4 * r + term * r + j0 + jj : f;
        attn::cp_async16(s + row * Tl::kFStride + term * kN + jj, src, valid);
      }
      return;
    }
    for (int i = threadIdx.x; i < kK * 3 * kN; i += kThreads) {
      const int row = i / (3 * kN), col = i % (3 * kN), term = col / kN, jj = col % kN;
      const bool valid = c0 + row < k && j0 + jj < r;
      s[row * Tl::kFStride + col] = valid ? f[(c0 + row) * 4 * r + term * r + j0 + jj] : __float2bfloat16_rn(0.0f);
    }
  } else {  // A4 planes [4, r, k]: element (term, j, c) at (term·r + j)·k + c
    if (p.vec_f) {
      constexpr int kChunks = kK / 8;
      for (int i = threadIdx.x; i < 3 * kN * kChunks; i += kThreads) {
        const int row = i / kChunks, c = (i % kChunks) * 8, term = row / kN, jj = row % kN;
        const bool valid = j0 + jj < r && c0 + c < k;
        const bf16* src = valid ? f + (term * r + j0 + jj) * k + c0 + c : f;
        attn::cp_async16(s + row * Tl::kFStride + c, src, valid);
      }
      return;
    }
    for (int i = threadIdx.x; i < 3 * kN * kK; i += kThreads) {
      const int row = i / kK, c = i % kK, term = row / kN, jj = row % kN;
      const bool valid = j0 + jj < r && c0 + c < k;
      s[row * Tl::kFStride + c] = valid ? f[(term * r + j0 + jj) * k + c0 + c] : __float2bfloat16_rn(0.0f);
    }
  }
}

// acc[term] += X·F_termᵀ over one stage for the warp's tile: kMW 16-token
// tiles from token w_m·16kMW and kNW 16-column blocks from column block
// w_n·kNW (two warps along the columns when kNB is even, so that each
// fragment loaded feeds more products).
template <int kNB, int kR>
struct WarpTile {
  static constexpr int kWarpsN = kNB % 2 == 0 ? 2 : 1;
  static constexpr int kNW = kNB / kWarpsN;
  static constexpr int kMW = kR / 16 / (4 / kWarpsN);
  static_assert(kMW >= 1, "32-token blocks need an even number of column blocks");
};

template <int kNB, bool kByRow, int kR>
__device__ __forceinline__ void stage_mma(const bf16* sx, const bf16* sf,
                                          float (&acc)[3][WarpTile<kNB, kR>::kMW][2 * WarpTile<kNB, kR>::kNW][4]) {
  using Tl = PTiles<kNB, kByRow, kR>;
  using W = WarpTile<kNB, kR>;
  const int w = threadIdx.x / 32, wm = w / W::kWarpsN, wn = w % W::kWarpsN;
#pragma unroll
  for (int kk = 0; kk < kK; kk += 16) {
    uint32_t a[W::kMW][4];
#pragma unroll
    for (int mi = 0; mi < W::kMW; ++mi) attn::load_a_x4(a[mi], sx, kXPad, (wm * W::kMW + mi) * 16, kk);
#pragma unroll
    for (int term = 0; term < 3; ++term)
#pragma unroll
      for (int nb = 0; nb < W::kNW; ++nb) {
        const int n0 = (wn * W::kNW + nb) * 16;
        uint32_t b0[2], b1[2];
        if constexpr (kByRow) {
          attn::load_b_cols_x2(b0, b1, sf + term * Tl::kN, Tl::kFStride, kk, n0);
        } else {
          attn::load_b_rows_x2(b0, b1, sf + term * Tl::kN * Tl::kFStride, Tl::kFStride, n0, kk);
        }
#pragma unroll
        for (int mi = 0; mi < W::kMW; ++mi) {
          attn::mma_bf16(acc[term][mi][2 * nb], a[mi], b0);
          attn::mma_bf16(acc[term][mi][2 * nb + 1], a[mi], b1);
        }
      }
  }
}

// (hi, hi, hi, lo) of v at o (the hi copies r apart).
__device__ __forceinline__ void put4(bf16* o, int64_t r, float v) {
  const bf16 hi = __float2bfloat16_rn(v);
  o[0] = hi, o[r] = hi, o[2 * r] = hi;
  o[3 * r] = __float2bfloat16_rn(v - __bfloat162float(hi));
}
__device__ __forceinline__ void put4_pair(bf16* o, int64_t r, float v0, float v1) {
  const __nv_bfloat162 hi = __floats2bfloat162_rn(v0, v1);
  const float2 h = __bfloat1622float2(hi);
  auto* q = reinterpret_cast<__nv_bfloat162*>(o);
  const int64_t r2 = r / 2;
  q[0] = hi, q[r2] = hi, q[2 * r2] = hi;
  q[3 * r2] = __floats2bfloat162_rn(v0 - h.x, v1 - h.y);
}

// Block (x = token tile · members + member, z = column chunk of r).
template <int kNB, bool kByRow, int kR>
__global__ void __launch_bounds__(kThreads) project_kernel(ProjParams p) {
  using Tl = PTiles<kNB, kByRow, kR>;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sx = reinterpret_cast<bf16*>(smem);
  bf16* sf = sx + Tl::kX;
  const int nm = p.a.n_members, m = int(blockIdx.x) % nm;
  const LoraProjectMember& mem = p.a.members[m];
  const int64_t t0 = int64_t(blockIdx.x / nm) * kR, j0 = int64_t(blockIdx.z) * Tl::kN, k = mem.k;
  const bf16* x = reinterpret_cast<const bf16*>(mem.x);
  const bf16* f = reinterpret_cast<const bf16*>(mem.f);
  const int steps = int((k + kK - 1) / kK);

  using W = WarpTile<kNB, kR>;
  float acc[3][W::kMW][2 * W::kNW][4] = {};
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < steps) {
      stage_x<kR>(sx + st * kR * kXPad, p, x, k, t0, int64_t(st) * kK);
      stage_f<kNB, kByRow, kR>(sf + st * Tl::kFRows * Tl::kFStride, p, f, k, int64_t(st) * kK, j0);
    }
    attn::cp_async_commit();
  }
  for (int it = 0; it < steps; ++it) {
    attn::cp_async_wait_one();
    __syncthreads();
    const int next = it + kStages - 1;
    if (next < steps) {
      const int b = next % kStages;
      stage_x<kR>(sx + b * kR * kXPad, p, x, k, t0, int64_t(next) * kK);
      stage_f<kNB, kByRow, kR>(sf + b * Tl::kFRows * Tl::kFStride, p, f, k, int64_t(next) * kK, j0);
    }
    attn::cp_async_commit();
    const int b = it % kStages;
    stage_mma<kNB, kByRow, kR>(sx + b * kR * kXPad, sf + b * Tl::kFRows * Tl::kFStride, acc);
  }

  const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  const int wm = w / W::kWarpsN, wn = w % W::kWarpsN;
  const int64_t r = p.a.r;
  bf16* out = reinterpret_cast<bf16*>(p.a.out) + m * 4 * r;
#pragma unroll
  for (int mi = 0; mi < W::kMW; ++mi)
#pragma unroll
    for (int nt = 0; nt < 2 * W::kNW; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t t = t0 + (wm * W::kMW + mi) * 16 + g + 8 * h, j = j0 + wn * W::kNW * 16 + nt * 8 + 2 * c;
        if (t >= p.a.tokens || j >= r) continue;
        float v[2];
        for (int e = 0; e < 2; ++e) {
          const int i = 2 * h + e;
          v[e] = ((acc[0][mi][nt][i] + acc[1][mi][nt][i]) + acc[2][mi][nt][i]) * p.a.scale;
        }
        bf16* o = out + t * p.a.ldo + j;
        if (p.pairs) {  // r even: j and j + 1 are both in range
          put4_pair(o, r, v[0], v[1]);
        } else {
          put4(o, r, v[0]);
          if (j + 1 < r) put4(o + 1, r, v[1]);
        }
      }
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// One launch: blocks of kR tokens (times members) by column chunks of r.
template <int kNB, bool kByRow, int kR>
Status launch_project(CudaContext& ctx, const ProjParams& p, int64_t chunks) {
  using Tl = PTiles<kNB, kByRow, kR>;
  static const cudaError_t attr = cudaFuncSetAttribute(project_kernel<kNB, kByRow, kR>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(Tl::kBytes));
  LATHE_CU_TRY(attr);
  const int64_t blocks = (p.a.tokens + kR - 1) / kR * p.a.n_members;
  if (blocks > int64_t(INT32_MAX) || chunks > 65535)
    return unsupported("cuda lora_project: grid too large (", blocks, " x ", chunks, ")");
  project_kernel<kNB, kByRow, kR><<<dim3(unsigned(blocks), 1, unsigned(chunks)), kThreads, Tl::kBytes,
                                    stream_of(ctx)>>>(p);
  return ctx.check_launch("lora_project");
}

template <bool kByRow>
Status launch_by_width(CudaContext& ctx, const ProjParams& p, int nb, int rows, int64_t chunks) {
  const bool small = rows == 32;
  switch (nb) {
    case 1: return launch_project<1, kByRow, 64>(ctx, p, chunks);
    case 2:
      return small ? launch_project<2, kByRow, 32>(ctx, p, chunks) : launch_project<2, kByRow, 64>(ctx, p, chunks);
    case 3: return launch_project<3, kByRow, 64>(ctx, p, chunks);
    default:
      return small ? launch_project<4, kByRow, 32>(ctx, p, chunks) : launch_project<4, kByRow, 64>(ctx, p, chunks);
  }
}

int sm_count(int device) {
  int n = 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0) return 108;
  return n;
}

}  // namespace

Status lora_project(CudaContext& ctx, const LoraProjectArgs& a) {
  if (a.n_members < 1 || a.n_members > kLoraMaxMembers)
    return invalid_argument("cuda lora_project: ", a.n_members, " members (1 to ", kLoraMaxMembers, ")");
  if (a.r <= 0 || a.tokens <= 0 || a.ldo < a.n_members * 4 * a.r)
    return invalid_argument("cuda lora_project: bad shape r=", a.r, " tokens=", a.tokens, " ldo=", a.ldo);
  if (!a.out) return invalid_argument("cuda lora_project: null output");
  ProjParams p{.a = a};
  p.vec_x = a.ldx % 8 == 0;
  p.vec_f = a.by_row ? a.r % 8 == 0 : true;
  for (int m = 0; m < a.n_members; ++m) {
    const LoraProjectMember& mem = a.members[m];
    if (mem.k <= 0 || a.ldx < mem.k || !mem.x || !mem.f)
      return invalid_argument("cuda lora_project: member ", m, " has ", mem.k, " inputs (row stride ", a.ldx,
                              ") or a null pointer");
    p.vec_x = p.vec_x && mem.k % 8 == 0 && aligned16(mem.x);
    p.vec_f = p.vec_f && aligned16(mem.f) && (a.by_row || mem.k % 8 == 0);
  }
  p.pairs = a.r % 2 == 0 && a.ldo % 2 == 0 && reinterpret_cast<uintptr_t>(a.out) % 4 == 0;
  const int nb = int(std::min<int64_t>(4, (a.r + 15) / 16));
  const int64_t chunks = (a.r + nb * 16 - 1) / (nb * 16);
  // 64-token blocks, or 32 where that leaves fewer blocks than two per SM
  // (the 8B shape's o and down at 8192 tokens): 32 needs an even nb.
  int rows = a.block_tokens;
  if (rows != 0 && rows != 32 && rows != 64)
    return invalid_argument("cuda lora_project: block_tokens ", rows, " (0, 32 or 64)");
  if (rows == 0) {
    const int64_t blocks64 = (a.tokens + 63) / 64 * a.n_members * chunks;
    rows = blocks64 < 2 * int64_t(sm_count(ctx.device())) ? 32 : 64;
  }
  if (nb % 2 != 0) rows = 64;
  return a.by_row ? launch_by_width<true>(ctx, p, nb, rows, chunks)
                  : launch_by_width<false>(ctx, p, nb, rows, chunks);
}

}  // namespace lathe::cuda
