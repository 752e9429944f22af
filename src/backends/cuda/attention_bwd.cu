// Flash-style attention backward on tensor cores, as three kernels:
//   1. delta: D = rowsum(dO ⊙ O) per row and head (f32, in the workspace);
//   2. dq: per block of 64 query rows, walk the visible keys, recompute
//      P = exp(S − lse), dP = dO·Vᵀ, dS = P ⊙ (dP − D), accumulate dQ = dS·K;
//   3. dkdv: per block of 64 keys of one KV head, loop over the query heads
//      of its group and their visible query rows, recompute Pᵀ = exp(K·Qᵀ −
//      lse), accumulate dV = Pᵀ·dO and dK = dSᵀ·Q.
// Splitting dq from dk/dv recomputes the scores twice but needs no atomics
// and no fp32 accumulation buffer for d_q; summing the heads of a GQA group
// inside one block makes d_k/d_v deterministic. Fragment layouts are those
// of attention_common.cuh.
#include "backends/cuda/attention.h"
#include "backends/cuda/attention_common.cuh"

#include <cmath>

namespace lathe::cuda {
namespace attn {
namespace {

struct BwdParams {
  const bf16 *q, *k, *v, *out, *d_out;
  const float* lse;
  float* delta;
  bf16 *d_q, *d_k, *d_v;
  const int32_t* cu;
  int n_tokens, n_head, n_head_kv, window;
  float scale;
};

// One warp per (token, head); lanes stride over head_dim.
__global__ void delta_kernel(BwdParams p, int d) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= int64_t(p.n_tokens) * p.n_head) return;
  float s = 0.f;
  for (int i = threadIdx.x % 32; i < d; i += 32)
    s += __bfloat162float(p.d_out[row * d + i]) * __bfloat162float(p.out[row * d + i]);
  for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (threadIdx.x % 32 == 0) p.delta[row] = s;
}

template <int D>
__global__ void __launch_bounds__(kThreads) dq_kernel(BwdParams p) {
  constexpr int kS = D + 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sO = sQ + kBlockRows * kS;  // d_out rows
  bf16* sK = sO + kBlockRows * kS;
  bf16* sV = sK + kBlockRows * kS;

  const int h = blockIdx.y, hk = h / (p.n_head / p.n_head_kv);
  const int64_t base = p.cu[blockIdx.z];
  const int n = p.cu[blockIdx.z + 1] - p.cu[blockIdx.z];
  const int i0 = blockIdx.x * kBlockRows;
  if (i0 >= n) return;
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, c = threadIdx.x % 4;
  const int row_a = i0 + warp * 16 + g, row_b = row_a + 8;
  const int k_last = min(i0 + kBlockRows, n) - 1;
  const int k_first = p.window > 0 ? max(0, i0 - p.window + 1) : 0;
  const float sl2 = p.scale * kLog2e;
  float lse2[2] = {0.f, 0.f}, dlt[2] = {0.f, 0.f};
  for (int r = 0; r < 2; ++r) {
    const int row = r == 0 ? row_a : row_b;
    if (row >= n) continue;
    lse2[r] = p.lse[(base + row) * p.n_head + h] * kLog2e;
    dlt[r] = p.delta[(base + row) * p.n_head + h];
  }

  load_tile<D>(sQ, p.q, base, i0, n, p.n_head, h);
  load_tile<D>(sO, p.d_out, base, i0, n, p.n_head, h);
  __syncthreads();
  uint32_t qf[D / 16][4], of[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    load_a(qf[kk], sQ, kS, warp * 16, kk * 16);
    load_a(of[kk], sO, kS, warp * 16, kk * 16);
  }
  float dq[D / 8][4] = {};

  for (int kt = k_first; kt <= k_last; kt += kBlockRows) {
    __syncthreads();
    load_tile<D>(sK, p.k, base, kt, k_last + 1, p.n_head_kv, hk);
    load_tile<D>(sV, p.v, base, kt, k_last + 1, p.n_head_kv, hk);
    __syncthreads();
    float s[8][4] = {}, dp[8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        uint32_t b[2];
        load_b_rows(b, sK, kS, j * 8, kk * 16);
        mma_bf16(s[j], qf[kk], b);
        load_b_rows(b, sV, kS, j * 8, kk * 16);
        mma_bf16(dp[j], of[kk], b);
      }
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kt + j * 8 + 2 * c + (e & 1);
        const bool vis = visible(key, e < 2 ? row_a : row_b, n, p.window);
        const float pr = vis ? exp2f(s[j][e] * sl2 - lse2[e / 2]) : 0.f;
        s[j][e] = pr * (dp[j][e] - dlt[e / 2]);  // dS
      }
#pragma unroll
    for (int kc = 0; kc < 4; ++kc) {
      uint32_t a[4];
      c_to_a(a, s, kc);
#pragma unroll
      for (int dn = 0; dn < D / 8; ++dn) {
        uint32_t b[2];
        load_b_cols(b, sK, kS, kc * 16, dn * 8);
        mma_bf16(dq[dn], a, b);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r == 0 ? row_a : row_b;
    if (row >= n) continue;
    bf16* dst = p.d_q + ((base + row) * p.n_head + h) * D + 2 * c;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn)
      *reinterpret_cast<__nv_bfloat162*>(dst + dn * 8) =
          __floats2bfloat162_rn(dq[dn][2 * r] * p.scale, dq[dn][2 * r + 1] * p.scale);
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads) dkdv_kernel(BwdParams p) {
  constexpr int kS = D + 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);
  bf16* sV = sK + kBlockRows * kS;
  bf16* sQ = sV + kBlockRows * kS;
  bf16* sO = sQ + kBlockRows * kS;
  float* sL = reinterpret_cast<float*>(sO + kBlockRows * kS);  // lse · log2 e of the query tile
  float* sD = sL + kBlockRows;                                  // delta of the query tile

  const int hk = blockIdx.y, group = p.n_head / p.n_head_kv;
  const int64_t base = p.cu[blockIdx.z];
  const int n = p.cu[blockIdx.z + 1] - p.cu[blockIdx.z];
  const int j0 = blockIdx.x * kBlockRows;
  if (j0 >= n) return;
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, c = threadIdx.x % 4;
  const int key_a = j0 + warp * 16 + g, key_b = key_a + 8;
  const int j_last = min(j0 + kBlockRows, n) - 1;
  const int q_last = p.window > 0 ? min(n - 1, j_last + p.window - 1) : n - 1;
  const float sl2 = p.scale * kLog2e;

  load_tile<D>(sK, p.k, base, j0, n, p.n_head_kv, hk);
  load_tile<D>(sV, p.v, base, j0, n, p.n_head_kv, hk);
  float dk[D / 8][4] = {}, dv[D / 8][4] = {};

  for (int h = hk * group; h < (hk + 1) * group; ++h)
    for (int qt = j0; qt <= q_last; qt += kBlockRows) {
      __syncthreads();
      load_tile<D>(sQ, p.q, base, qt, n, p.n_head, h);
      load_tile<D>(sO, p.d_out, base, qt, n, p.n_head, h);
      for (int r = threadIdx.x; r < kBlockRows; r += kThreads) {
        const bool in = qt + r < n;
        sL[r] = in ? p.lse[(base + qt + r) * p.n_head + h] * kLog2e : 0.f;
        sD[r] = in ? p.delta[(base + qt + r) * p.n_head + h] : 0.f;
      }
      __syncthreads();
      float s[8][4] = {}, dp[8][4] = {};  // transposed: rows are keys, columns queries
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t ak[4], av[4];
        load_a(ak, sK, kS, warp * 16, kk * 16);
        load_a(av, sV, kS, warp * 16, kk * 16);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          uint32_t b[2];
          load_b_rows(b, sQ, kS, j * 8, kk * 16);
          mma_bf16(s[j], ak, b);
          load_b_rows(b, sO, kS, j * 8, kk * 16);
          mma_bf16(dp[j], av, b);
        }
      }
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = j * 8 + 2 * c + (e & 1), qi = qt + col;
          const bool vis = qi < n && visible(e < 2 ? key_a : key_b, qi, n, p.window);
          const float pr = vis ? exp2f(s[j][e] * sl2 - sL[col]) : 0.f;
          s[j][e] = pr;
          dp[j][e] = pr * (dp[j][e] - sD[col]);  // dSᵀ
        }
#pragma unroll
      for (int kc = 0; kc < 4; ++kc) {
        uint32_t ap[4], ads[4];
        c_to_a(ap, s, kc);
        c_to_a(ads, dp, kc);
#pragma unroll
        for (int dn = 0; dn < D / 8; ++dn) {
          uint32_t b[2];
          load_b_cols(b, sO, kS, kc * 16, dn * 8);
          mma_bf16(dv[dn], ap, b);
          load_b_cols(b, sQ, kS, kc * 16, dn * 8);
          mma_bf16(dk[dn], ads, b);
        }
      }
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = r == 0 ? key_a : key_b;
    if (key >= n) continue;
    const int64_t off = ((base + key) * p.n_head_kv + hk) * D + 2 * c;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {
      *reinterpret_cast<__nv_bfloat162*>(p.d_k + off + dn * 8) =
          __floats2bfloat162_rn(dk[dn][2 * r] * p.scale, dk[dn][2 * r + 1] * p.scale);
      *reinterpret_cast<__nv_bfloat162*>(p.d_v + off + dn * 8) =
          __floats2bfloat162_rn(dv[dn][2 * r], dv[dn][2 * r + 1]);
    }
  }
}

template <int D>
Status launch(const BwdParams& p, int n_docs, int max_seqlen, cudaStream_t st) {
  const int rows = p.n_tokens * p.n_head;  // < 2^31, checked by the caller
  delta_kernel<<<(rows + 3) / 4, 128, 0, st>>>(p, D);
  LATHE_TRY(cuda_check(cudaGetLastError(), "attention delta launch"));
  const int tiles = (max_seqlen + kBlockRows - 1) / kBlockRows;
  const int smem_dq = 4 * kBlockRows * (D + 8) * int(sizeof(bf16));
  const int smem_dkdv = smem_dq + 2 * kBlockRows * int(sizeof(float));
  LATHE_TRY(cuda_check(cudaFuncSetAttribute(dq_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_dq),
                       "cudaFuncSetAttribute(dq)"));
  LATHE_TRY(cuda_check(cudaFuncSetAttribute(dkdv_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_dkdv),
                       "cudaFuncSetAttribute(dkdv)"));
  dq_kernel<D><<<dim3(tiles, p.n_head, n_docs), kThreads, smem_dq, st>>>(p);
  LATHE_TRY(cuda_check(cudaGetLastError(), "attention dq launch"));
  dkdv_kernel<D><<<dim3(tiles, p.n_head_kv, n_docs), kThreads, smem_dkdv, st>>>(p);
  return cuda_check(cudaGetLastError(), "attention dkdv launch");
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace
}  // namespace attn

size_t attention_varlen_backward_workspace_bytes(int64_t n_tokens, int n_head) {
  return size_t(n_tokens > 0 ? n_tokens : 0) * size_t(n_head > 0 ? n_head : 0) * sizeof(float);
}

Status attention_varlen_backward(const AttentionVarlenBwdArgs& a) {
  const char* kName = "attention_varlen_backward: ";
  if (a.head_dim != 64 && a.head_dim != 128)
    return unsupported(kName, "head_dim ", a.head_dim, " is not compiled (64 and 128 are)");
  if (a.n_head <= 0 || a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0)
    return invalid_argument(kName, "n_head ", a.n_head, " is not a multiple of n_head_kv ", a.n_head_kv);
  if (a.n_docs < 0 || a.max_seqlen < 0 || a.n_tokens < 0 || a.window < 0)
    return invalid_argument(kName, "negative n_docs, max_seqlen, n_tokens or window");
  if (a.n_tokens == 0 || a.n_docs == 0) return Status::ok();
  if (a.max_seqlen == 0) return invalid_argument(kName, "max_seqlen is 0 with ", a.n_tokens, " tokens");
  if (int64_t(a.n_tokens) * a.n_head > INT32_MAX) return invalid_argument(kName, "n_tokens × n_head exceeds 2^31");
  const void* all[] = {a.q, a.k, a.v, a.out, a.lse, a.d_out, a.d_q, a.d_k, a.d_v, a.cu_seqlens, a.workspace};
  for (const void* ptr : all)
    if (!ptr)
      return invalid_argument(kName, "q, k, v, out, lse, d_out, d_q, d_k, d_v, cu_seqlens and workspace must be set");
  const void* bf16_tensors[] = {a.q, a.k, a.v, a.d_out, a.d_q, a.d_k, a.d_v};
  for (const void* ptr : bf16_tensors)
    if (!attn::aligned16(ptr)) return invalid_argument(kName, "bf16 tensors must be 16-byte aligned");
  using attn::bf16;
  attn::BwdParams p{static_cast<const bf16*>(a.q),     static_cast<const bf16*>(a.k),
                    static_cast<const bf16*>(a.v),     static_cast<const bf16*>(a.out),
                    static_cast<const bf16*>(a.d_out), a.lse,
                    static_cast<float*>(a.workspace),  static_cast<bf16*>(a.d_q),
                    static_cast<bf16*>(a.d_k),         static_cast<bf16*>(a.d_v),
                    a.cu_seqlens,                      a.n_tokens,
                    a.n_head,                          a.n_head_kv,
                    a.window,                          a.scale};
  auto st = static_cast<cudaStream_t>(a.stream);
  return a.head_dim == 64 ? attn::launch<64>(p, a.n_docs, a.max_seqlen, st)
                          : attn::launch<128>(p, a.n_docs, a.max_seqlen, st);
}

}  // namespace lathe::cuda
