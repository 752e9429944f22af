// Attention backward on Hopper's warpgroup tensor-core instruction (wgmma,
// sm_90a): the dq and dkdv kernels of attention_bwd.cu with the same split,
// masks and arithmetic (P and dS rounded to bf16 before their products, fp32
// accumulation, no atomics), but each thread block is one warpgroup of four
// warps that multiplies 64-row tiles straight out of shared memory:
//   dq:   S = Q·Kᵀ and dP = dO·Vᵀ (both operands in shared memory), then
//         dQ += dS·K with dS from registers;
//   dkdv: Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, then dV += Pᵀ·dO and dK += dSᵀ·Q with
//         Pᵀ and dSᵀ from registers.
// With mma.sync every warp reads every B fragment of its product from shared
// memory through ldmatrix; here the warpgroup reads it once, and one
// instruction does the work of 16 to 32, so the kernels stop being bound by
// shared-memory traffic and instruction issue.
// The tile layout, the products and the per-tile steps (dq_tile, dkdv_tile)
// are those of attention_sm90.cuh.
#include "backends/cuda/attention.h"
#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/attention_sm90.cuh"

namespace lathe::cuda::attn {
namespace sm90 {

// Blocks of WG warpgroups take 64·WG query rows (warpgroup w the rows
// 64w..) and share each K/V tile, which halves the tiles a query row pulls
// through L2 at WG = 2. A warpgroup skips the tiles none of its rows sees.
// Blocks run in reverse tile order (the longest first), as in attention_bwd.cu.
template <int D, int WG>
__global__ void __launch_bounds__(WG* kThreads, WG == 2 ? 1 : D == 128 ? 2 : 3) dq_sm90_kernel(BwdParams p) {
#if LATHE_SM90A_DEVICE
  constexpr int kT = tile_bytes<D>(), kRows = WG * kBlockRows, kN = WG * kThreads;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* sQ = aligned_smem(smem_raw);  // WG Q tiles
  unsigned char* sO = sQ + WG * kT;            // WG d_out tiles
  unsigned char* sK = sO + WG * kT;            // two K buffers, then two V buffers
  unsigned char* sV = sK + 2 * kT;

  const int h = blockIdx.y, hk = h / (p.n_head / p.n_head_kv);
  const int64_t base = p.cu[blockIdx.z];
  const int n = p.cu[blockIdx.z + 1] - p.cu[blockIdx.z];
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kRows;
  if (i0 >= n) return;
  const int wg = threadIdx.x / kThreads, t = threadIdx.x % kThreads;
  const int w0 = i0 + wg * kBlockRows, w_last = min(w0 + kBlockRows, n) - 1;  // this warpgroup's rows
  const int row_a = w0 + t / 32 * 16 + t % 32 / 4, row_b = row_a + 8, c = t % 4;
  const int k_last = min(i0 + kRows, n) - 1;
  const int k_first = p.window > 0 ? max(0, i0 - p.window + 1) : 0;
  const float sl2 = p.scale * kLog2e;
  float lse2[2] = {0.f, 0.f}, dlt[2] = {0.f, 0.f};
  for (int r = 0; r < 2; ++r) {
    const int row = r == 0 ? row_a : row_b;
    if (row >= n) continue;
    lse2[r] = p.lse[(base + row) * p.n_head + h] * kLog2e;
    dlt[r] = p.delta[(base + row) * p.n_head + h];
  }
  for (int w = 0; w < WG; ++w) {
    load_tile_sw<D, kN>(sQ + w * kT, p.q, base, i0 + w * kBlockRows, n, p.n_head, h);
    load_tile_sw<D, kN>(sO + w * kT, p.d_out, base, i0 + w * kBlockRows, n, p.n_head, h);
  }
  load_tile_sw<D, kN>(sK, p.k, base, k_first, k_last + 1, p.n_head_kv, hk);
  load_tile_sw<D, kN>(sV, p.v, base, k_first, k_last + 1, p.n_head_kv, hk);
  cp_async_commit();
  float dq[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dq[i] = 0.f;

  for (int kt = k_first, buf = 0; kt <= k_last; kt += kBlockRows, buf ^= 1) {
    if (kt + kBlockRows <= k_last) {  // prefetch the next tile into the other buffer
      load_tile_sw<D, kN>(sK + (buf ^ 1) * kT, p.k, base, kt + kBlockRows, k_last + 1, p.n_head_kv, hk);
      load_tile_sw<D, kN>(sV + (buf ^ 1) * kT, p.v, base, kt + kBlockRows, k_last + 1, p.n_head_kv, hk);
    }
    cp_async_commit();  // possibly empty: keeps "all but the newest group" meaning this tile
    cp_async_wait_one();
    fence_async_smem();
    __syncthreads();
    const bool seen = w0 < n && kt <= w_last && (p.window <= 0 || kt + kBlockRows - 1 > w0 - p.window);
    const bool masked = p.window > 0 || kt + kBlockRows - 1 > w0;
    if (seen)
      dq_tile<D>(dq, sQ + wg * kT, sO + wg * kT, sK + buf * kT, sV + buf * kT, masked, kt, row_a, row_b, n,
                 p.window, sl2, lse2, dlt);
    __syncthreads();  // everyone is done with this buffer before it is refilled
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r == 0 ? row_a : row_b;
    if (row >= n) continue;
    bf16* dst = p.d_q + ((base + row) * p.n_head + h) * D + 2 * c;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn)
      *reinterpret_cast<__nv_bfloat162*>(dst + dn * 8) =
          __floats2bfloat162_rn(dq[4 * dn + 2 * r] * p.scale, dq[4 * dn + 2 * r + 1] * p.scale);
  }
#else
  __trap();  // launched only where sm90_supported() holds
#endif
}

// Query tile `it` of a dkdv block (head hk·group + it / n_qt, rows j0 +
// (it % n_qt)·64) with its lse and delta, zero past the document.
template <int D, int kN>
__device__ __forceinline__ void stage_query_tile(const BwdParams& p, unsigned char* sQ, unsigned char* sO, float* sL,
                                                 float* sD, int64_t base, int n, int hk, int j0, int n_qt, int it) {
  const int h = hk * (p.n_head / p.n_head_kv) + it / n_qt, qt = j0 + (it % n_qt) * kBlockRows;
  load_tile_sw<D, kN>(sQ, p.q, base, qt, n, p.n_head, h);
  load_tile_sw<D, kN>(sO, p.d_out, base, qt, n, p.n_head, h);
  stage_lse_delta<kN>(p, sL, sD, base, qt, n, h);
}

// Blocks of WG warpgroups take 64·WG keys (warpgroup w the keys 64w..) and
// share each query tile; a warpgroup skips the tiles none of its keys sees.
template <int D, int WG>
__global__ void __launch_bounds__(WG* kThreads, WG == 2 ? 1 : 2) dkdv_sm90_kernel(BwdParams p) {
#if LATHE_SM90A_DEVICE
  constexpr int kT = tile_bytes<D>(), kRows = WG * kBlockRows, kN = WG * kThreads;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* sK = aligned_smem(smem_raw);  // WG K tiles
  unsigned char* sV = sK + WG * kT;            // WG V tiles
  unsigned char* sQ = sV + WG * kT;            // two Q buffers
  unsigned char* sO = sQ + 2 * kT;             // two d_out buffers
  float* sL = reinterpret_cast<float*>(sO + 2 * kT);  // 2 × 64 lse
  float* sD = sL + 2 * kBlockRows;                    // 2 × 64 delta

  const int hk = blockIdx.y, group = p.n_head / p.n_head_kv;
  const int64_t base = p.cu[blockIdx.z];
  const int n = p.cu[blockIdx.z + 1] - p.cu[blockIdx.z];
  const int j0 = blockIdx.x * kRows;
  if (j0 >= n) return;
  const int wg = threadIdx.x / kThreads, t = threadIdx.x % kThreads;
  const int w0 = j0 + wg * kBlockRows, w_last = min(w0 + kBlockRows, n) - 1;  // this warpgroup's keys
  const int key_a = w0 + t / 32 * 16 + t % 32 / 4, key_b = key_a + 8, c = t % 4;
  const int q_last = p.window > 0 ? min(n - 1, min(j0 + kRows, n) - 1 + p.window - 1) : n - 1;
  const int n_qt = (q_last - j0) / kBlockRows + 1, n_iter = group * n_qt;
  const float sl2 = p.scale * kLog2e;

  for (int w = 0; w < WG; ++w) {
    load_tile_sw<D, kN>(sK + w * kT, p.k, base, j0 + w * kBlockRows, n, p.n_head_kv, hk);
    load_tile_sw<D, kN>(sV + w * kT, p.v, base, j0 + w * kBlockRows, n, p.n_head_kv, hk);
  }
  stage_query_tile<D, kN>(p, sQ, sO, sL, sD, base, n, hk, j0, n_qt, 0);
  cp_async_commit();
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;

  for (int it = 0, buf = 0; it < n_iter; ++it, buf ^= 1) {
    if (it + 1 < n_iter)
      stage_query_tile<D, kN>(p, sQ + (buf ^ 1) * kT, sO + (buf ^ 1) * kT, sL + (buf ^ 1) * kBlockRows,
                              sD + (buf ^ 1) * kBlockRows, base, n, hk, j0, n_qt, it + 1);
    cp_async_commit();
    cp_async_wait_one();
    fence_async_smem();
    __syncthreads();
    const int qt = j0 + (it % n_qt) * kBlockRows;
    const bool seen = w0 < n && qt + kBlockRows - 1 >= w0 && (p.window <= 0 || qt <= w_last + p.window - 1);
    const bool masked = p.window > 0 || qt < w0 + kBlockRows - 1 || qt + kBlockRows > n;
    if (seen)
      dkdv_tile<D>(dk, dv, sK + wg * kT, sV + wg * kT, sQ + buf * kT, sO + buf * kT, sL + buf * kBlockRows,
                   sD + buf * kBlockRows, masked, qt, key_a, key_b, n, p.window, sl2);
    __syncthreads();  // everyone is done with this buffer before it is refilled
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = r == 0 ? key_a : key_b;
    if (key >= n) continue;
    const int64_t off = ((base + key) * p.n_head_kv + hk) * D + 2 * c;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {
      *reinterpret_cast<__nv_bfloat162*>(p.d_k + off + dn * 8) =
          __floats2bfloat162_rn(dk[4 * dn + 2 * r] * p.scale, dk[4 * dn + 2 * r + 1] * p.scale);
      *reinterpret_cast<__nv_bfloat162*>(p.d_v + off + dn * 8) =
          __floats2bfloat162_rn(dv[4 * dn + 2 * r], dv[4 * dn + 2 * r + 1]);
    }
  }
#else
  __trap();  // launched only where sm90_supported() holds
#endif
}

// The two products the kernels are built from, alone on one 64-row tile
// pair: s = A·Bᵀ (shared × shared, K-major), then o = bf16(s)·B (registers
// × shared, MN-major); also dp = B·Aᵀ.
template <int D>
__global__ void __launch_bounds__(kThreads)
    check_kernel(const bf16* a, const bf16* b, float* s_out, float* o_out, float* sr_out) {
#if LATHE_SM90A_DEVICE
  extern __shared__ unsigned char smem_raw[];
  unsigned char* sA = aligned_smem(smem_raw);
  unsigned char* sB = sA + tile_bytes<D>();
  load_tile_sw<D>(sA, a, 0, 0, kBlockRows, 1, 0);
  load_tile_sw<D>(sB, b, 0, 0, kBlockRows, 1, 0);
  cp_async_commit();
  cp_async_commit();
  cp_async_wait_one();
  fence_async_smem();
  __syncthreads();
  const int row = threadIdx.x / 32 * 16 + threadIdx.x % 32 / 4, c = threadIdx.x % 4;
  float s[32], dp[32], o[D / 2];
  issue_score_products<D>(s, dp, sA, sB, sB, sA);
  wg_wait<0>();
  pin(s);
  pin(dp);
  for (int i = 0; i < 32; ++i) {
    const int at = (row + (i % 4 >= 2 ? 8 : 0)) * 64 + i / 4 * 8 + 2 * c + i % 2;
    s_out[at] = s[i];
    s_out[kBlockRows * 64 + at] = dp[i];
  }
  uint32_t pa[4][4];
  for (int kc = 0; kc < 4; ++kc) c_to_a(pa[kc], reinterpret_cast<const float(*)[4]>(s), kc);
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  pin(pa);
  pin(o);
  wg_fence();
  accumulate_rows<D>(o, pa, sB);
  wg_commit();
  wg_wait<0>();
  pin(o);
  for (int i = 0; i < D / 2; ++i) o_out[(row + (i % 4 >= 2 ? 8 : 0)) * D + i / 4 * 8 + 2 * c + i % 2] = o[i];
  if (sr_out) {  // A·Bᵀ again, A's fragments from registers (load_a_frags)
    uint32_t fa[D / 16][4];
    load_a_frags<D>(fa, sA);
    pin(fa);
    wg_fence();
    issue_scores_rs<D>(s, fa, sB);
    wg_commit();
    wg_wait<0>();
    pin(s);
    for (int i = 0; i < 32; ++i) sr_out[(row + (i % 4 >= 2 ? 8 : 0)) * 64 + i / 4 * 8 + 2 * c + i % 2] = s[i];
  }
#else
  __trap();
#endif
}

template <int D, int WG>
Status launch(const BwdParams& p, int n_docs, int max_seqlen, cudaStream_t st) {
  const int tiles = (max_seqlen + WG * kBlockRows - 1) / (WG * kBlockRows);
  const int smem_dq = (2 * WG + 4) * tile_bytes<D>() + 1024;  // + room to align the tiles to 1024 bytes
  const int smem_dkdv = smem_dq + 4 * kBlockRows * int(sizeof(float));
  LATHE_TRY(cuda_check(
      cudaFuncSetAttribute(dq_sm90_kernel<D, WG>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_dq),
      "cudaFuncSetAttribute(dq_sm90)"));
  LATHE_TRY(cuda_check(
      cudaFuncSetAttribute(dkdv_sm90_kernel<D, WG>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_dkdv),
      "cudaFuncSetAttribute(dkdv_sm90)"));
  dq_sm90_kernel<D, WG><<<dim3(tiles, p.n_head, n_docs), WG * kThreads, smem_dq, st>>>(p);
  LATHE_TRY(cuda_check(cudaGetLastError(), "attention dq_sm90 launch"));
  dkdv_sm90_kernel<D, WG><<<dim3(tiles, p.n_head_kv, n_docs), WG * kThreads, smem_dkdv, st>>>(p);
  return cuda_check(cudaGetLastError(), "attention dkdv_sm90 launch");
}

}  // namespace sm90

bool sm90_supported(int d) {
  if (d != 64 && d != 128) return false;
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  return major == 9;
}

Status launch_backward_sm90(const BwdParams& p, int d, int rows, int n_docs, int max_seqlen, cudaStream_t st) {
  if (rows != 64 && rows != 128) return invalid_argument("attention backward (wgmma): rows ", rows, " (64 or 128)");
  if (d == 64)
    return rows == 64 ? sm90::launch<64, 1>(p, n_docs, max_seqlen, st) : sm90::launch<64, 2>(p, n_docs, max_seqlen, st);
  if (d == 128)
    return rows == 64 ? sm90::launch<128, 1>(p, n_docs, max_seqlen, st)
                      : sm90::launch<128, 2>(p, n_docs, max_seqlen, st);
  return unsupported("attention backward (wgmma): head_dim ", d, " (64 and 128 are compiled)");
}

}  // namespace lathe::cuda::attn

namespace lathe::cuda {

Status attention_wgmma_check(const AttentionWgmmaCheckArgs& a) {
  if (!attn::sm90_supported(a.head_dim))
    return unsupported("attention_wgmma_check: needs a Hopper device and head_dim 64 or 128 (head_dim ", a.head_dim,
                       ")");
  if (!a.a || !a.b || !a.s || !a.o) return invalid_argument("attention_wgmma_check: a, b, s and o must be set");
  auto st = static_cast<cudaStream_t>(a.stream);
  const auto* pa = static_cast<const attn::bf16*>(a.a);
  const auto* pb = static_cast<const attn::bf16*>(a.b);
  auto run = [&](auto kernel, int smem) {
    LATHE_TRY(attn::cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                               "cudaFuncSetAttribute(check)"));
    kernel<<<1, attn::kThreads, smem, st>>>(pa, pb, a.s, a.o, a.s_regs);
    return attn::cuda_check(cudaGetLastError(), "attention_wgmma_check launch");
  };
  if (a.head_dim == 64) return run(attn::sm90::check_kernel<64>, 2 * attn::sm90::tile_bytes<64>() + 1024);
  return run(attn::sm90::check_kernel<128>, 2 * attn::sm90::tile_bytes<128>() + 1024);
}

}  // namespace lathe::cuda
