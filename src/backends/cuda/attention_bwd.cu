// Flash-style attention backward on tensor cores, as three kernels:
//   1. delta: D = rowsum(dO ⊙ O) per row and head (f32, in the workspace;
//      attention_delta.cu);
//   2. dq: per block of 64 query rows, walk the visible keys, recompute
//      P = exp(S − lse), dP = dO·Vᵀ, dS = P ⊙ (dP − D), accumulate dQ = dS·K;
//   3. dkdv: per block of 64 keys of one KV head, loop over the query heads
//      of its group and their visible query rows, recompute Pᵀ = exp(K·Qᵀ −
//      lse), accumulate dV = Pᵀ·dO and dK = dSᵀ·Q.
// Splitting dq from dk/dv recomputes the scores twice but needs no atomics
// and no fp32 accumulation buffer for d_q; summing the heads of a GQA group
// inside one block makes d_k/d_v deterministic. The two kernels are
// independent, so dq runs on a second stream beside dkdv and fills the SMs
// the causal dkdv blocks' ragged tail leaves idle (LATHE_ATTN_BWD_STREAMS;
// H200, 12:53 UTC 2026-11-30: in the 1B training step 44.7 → 41.2 ms, at 8B
// 84 → 76 ms; alone at head_dim 128 170 → 181 TFLOP/s, at 64 151 → 153). Fragment layouts are those
// of attention_common.cuh. AttnBwdKernels::kFused replaces 2 and 3 by one
// kernel (fused_bwd_kernel below): the dkdv blocks also multiply dS by K and
// add their d_q shares, in a fixed order per query tile, into an f32 d_q in
// the workspace: five tile products per (key tile, query tile) instead of
// seven, for a larger workspace.
//
// The fast kernels differ from the simple ones (kept as an on-device oracle,
// AttentionVarlenBwdArgs::simple) in three independent ways, each a
// compile-time switch so a wrong result can be bisected to one of them
// (-DLATHE_ATTN_BWD_LDMATRIX=0 etc.):
//   LDMATRIX  fragments through ldmatrix (.trans for the Kᵀ, Qᵀ, dOᵀ operands
//             of dQ, dK, dV) instead of 32- and 16-bit shared loads;
//   CP_ASYNC  the streamed tiles (K/V in dq; Q, dO, lse, delta in dkdv)
//             double-buffered through cp.async, the next in flight while
//             this one is computed;
//   UNMASKED  tiles wholly below the diagonal (no window, inside the
//             document) skip the per-element visibility test.
// The arithmetic is the same on both paths, so they agree to the bit up to
// the compiler's instruction choices.
//
// Where it stands (H200, 8 documents × 2048, 32/8 heads, head_dim 128):
// 171 TFLOP/s counted as 2.5× the forward (the simple kernels: 108). Both
// kernels hold 255 registers, so registers and shared memory allow 2 blocks
// (8 warps) per SM, and they are latency-bound: ~5 cycles between issued
// instructions per warp, tensor-core instructions under a fifth of those,
// each warp re-reading from shared memory the operands its neighbours read.
// On Hopper the same scheme also runs on warpgroup instructions
// (attention_bwd_sm90.cu, AttnBwdKernels::kWgmma): one read of each operand
// per four warps, and the delta kernel here in front of it; alone 212
// TFLOP/s at head_dim 128, 174 at 64 (these kernels: 152).
// The fused kernel (11:17 UTC 2026-11-30, main 132d5cd, same shapes): 129
// TFLOP/s at head_dim 128, 114 at 64 with the d_q shares as L2 reductions
// (95 both by load, add, store), against these kernels' 170 and 151; in the
// 1B training step its backward took 55.7 ms against 44.4. Five products
// instead of seven do not pay for the ordered sum: each step a warp waits
// an L2 round trip for its turn and another for its reductions to land
// before passing the turn on (the load-add-store build, a third round trip
// per step, is slower again by about that much).
#include "backends/cuda/attention.h"

#include <algorithm>
#include "backends/cuda/attention_common.cuh"

#include <cmath>
#include <string>
#include <type_traits>

#include "core/env.h"

#ifndef LATHE_ATTN_BWD_LDMATRIX
#define LATHE_ATTN_BWD_LDMATRIX 1
#endif
#ifndef LATHE_ATTN_BWD_CP_ASYNC
#define LATHE_ATTN_BWD_CP_ASYNC 1
#endif
#ifndef LATHE_ATTN_BWD_UNMASKED
#define LATHE_ATTN_BWD_UNMASKED 1
#endif
// AttnBwdKernels::kAuto picks the wgmma kernels where they run (1). Off:
// alone they are faster (below), but inside the H200 training step they
// took longer than these (1B 54 against 42 ms per step, 8B 90 against 82),
// which is not understood yet.
#ifndef LATHE_ATTN_BWD_SM90_AUTO
#define LATHE_ATTN_BWD_SM90_AUTO 0
#endif
// AttnBwdKernels::kAuto picks the fused kernel up to this head_dim (0: never).
#ifndef LATHE_ATTN_BWD_FUSED_AUTO
#define LATHE_ATTN_BWD_FUSED_AUTO 0
#endif
// AttnBwdKernels::kAuto picks the warp-specialized kernels where they run,
// with d_q from the stored dS (1; H200, 8 documents × 2048, 32/8 heads:
// head_dim 128 2.27 ms against 3.68 for mma.sync, 64 1.92 against 2.00).
#ifndef LATHE_ATTN_BWD_WS_AUTO
#define LATHE_ATTN_BWD_WS_AUTO 1
#endif
#ifndef LATHE_ATTN_BWD_SM90_ROWS  // rows per thread block of the wgmma kernels by default: 64 or 128
#define LATHE_ATTN_BWD_SM90_ROWS 64
#endif
#ifndef LATHE_ATTN_BWD_MIN_BLOCKS_64
#define LATHE_ATTN_BWD_MIN_BLOCKS_64 3
#endif
#ifndef LATHE_ATTN_BWD_MIN_BLOCKS_32
#define LATHE_ATTN_BWD_MIN_BLOCKS_32 4
#endif

namespace lathe::cuda {
namespace attn {
namespace {

template <bool kLdmatrix_, bool kAsync_, bool kUnmasked_>
struct BwdPath {
  static constexpr bool kLdmatrix = kLdmatrix_, kAsync = kAsync_, kUnmasked = kUnmasked_;
  static constexpr int kBufs = kAsync ? 2 : 1;  // buffers of each streamed tile
};
using SimplePath = BwdPath<false, false, false>;
using FastPath = BwdPath<LATHE_ATTN_BWD_LDMATRIX != 0, LATHE_ATTN_BWD_CP_ASYNC != 0, LATHE_ATTN_BWD_UNMASKED != 0>;

// Thread blocks per SM the registers of the fast kernels must allow (their
// shared memory allows 2 at head_dim 128, 4 at 64, 6 at 32; at 128 the
// dK/dV accumulators alone take 128 registers, so 2 is all there is).
template <int D, class Path>
constexpr int bwd_min_blocks() {
  if (!Path::kAsync) return 1;
  return D == 128 ? 2 : D == 64 ? LATHE_ATTN_BWD_MIN_BLOCKS_64 : LATHE_ATTN_BWD_MIN_BLOCKS_32;
}

// dq: S = Q·Kᵀ and dP = dO·Vᵀ for one K/V tile, dS in place of S, dQ += dS·K.
template <int D, class Path>
__device__ __forceinline__ void dq_tile(float (*dq)[4], const uint32_t (*qf)[4], const uint32_t (*of)[4],
                                        const bf16* sK, const bf16* sV, bool masked, int kt, int row_a, int row_b,
                                        int n, int window, float sl2, const float lse2[2], const float dlt[2]) {
  constexpr int kS = D + 8;
  const int c = threadIdx.x % 4;
  float s[8][4] = {}, dp[8][4] = {};
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
      uint32_t b0[2], b1[2];
      frag_b_rows2<Path::kLdmatrix>(b0, b1, sK, kS, j * 8, kk * 16);
      mma_bf16(s[j], qf[kk], b0);
      mma_bf16(s[j + 1], qf[kk], b1);
      frag_b_rows2<Path::kLdmatrix>(b0, b1, sV, kS, j * 8, kk * 16);
      mma_bf16(dp[j], of[kk], b0);
      mma_bf16(dp[j + 1], of[kk], b1);
    }
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = kt + j * 8 + 2 * c + (e & 1);
      const bool vis = !masked || visible(key, e < 2 ? row_a : row_b, n, window);
      const float pr = vis ? fast_exp2(fmaf(s[j][e], sl2, -lse2[e / 2])) : 0.f;
      s[j][e] = pr * (dp[j][e] - dlt[e / 2]);  // dS
    }
  scores_times_tile<D, Path::kLdmatrix>(dq, s, sK);
}

// The grid is (head, document, tile) with the tile slowest, so blocks are
// dispatched tile by tile across every head and document, in reverse: the
// last query tiles see the most keys and all of them start first, so the
// short ones fill the tail (H200, 14:37 UTC 2026-11-30, against tiles
// fastest: alone 154.5 → 167.5 TFLOP/s at head_dim 64, 180.9 → 185.0 at
// 128; in the training step 1B 42.4 → 42.2 ms, 8B 77.4 → 75.9 ms).
template <int D, class Path>
__global__ void __launch_bounds__(kThreads, bwd_min_blocks<D, Path>()) dq_kernel(BwdParams p) {
  constexpr int kS = D + 8, kTile = kBlockRows * kS;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sO = sQ + kTile;  // d_out rows
  bf16* sK = sO + kTile;  // kBufs K tiles, then kBufs V tiles
  bf16* sV = sK + Path::kBufs * kTile;

  const int h = blockIdx.x, hk = h / (p.n_head / p.n_head_kv);
  const int64_t base = p.cu[blockIdx.y];
  const int n = p.cu[blockIdx.y + 1] - p.cu[blockIdx.y];
  const int i0 = (gridDim.z - 1 - blockIdx.z) * kBlockRows;
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

  stage_tile<D, Path::kAsync>(sQ, p.q, base, i0, n, p.n_head, h);
  stage_tile<D, Path::kAsync>(sO, p.d_out, base, i0, n, p.n_head, h);
  if constexpr (Path::kAsync) {  // Q/dO in one group, the first K/V tile in flight behind it
    cp_async_commit();
    load_tile_async<D>(sK, p.k, base, k_first, k_last + 1, p.n_head_kv, hk);
    load_tile_async<D>(sV, p.v, base, k_first, k_last + 1, p.n_head_kv, hk);
    cp_async_commit();
    cp_async_wait_one();
  }
  __syncthreads();
  uint32_t qf[D / 16][4], of[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    frag_a<Path::kLdmatrix>(qf[kk], sQ, kS, warp * 16, kk * 16);
    frag_a<Path::kLdmatrix>(of[kk], sO, kS, warp * 16, kk * 16);
  }
  float dq[D / 8][4] = {};

  for (int kt = k_first, buf = 0; kt <= k_last; kt += kBlockRows, buf ^= Path::kBufs - 1) {
    if constexpr (Path::kAsync) {
      if (kt + kBlockRows <= k_last) {  // prefetch the next tile into the other buffer
        load_tile_async<D>(sK + (buf ^ 1) * kTile, p.k, base, kt + kBlockRows, k_last + 1, p.n_head_kv, hk);
        load_tile_async<D>(sV + (buf ^ 1) * kTile, p.v, base, kt + kBlockRows, k_last + 1, p.n_head_kv, hk);
      }
      cp_async_commit();  // possibly empty: keeps "all but the newest group" meaning this tile
      cp_async_wait_one();
      __syncthreads();
    } else {
      __syncthreads();  // everyone is done with the previous K/V tile
      load_tile<D>(sK, p.k, base, kt, k_last + 1, p.n_head_kv, hk);
      load_tile<D>(sV, p.v, base, kt, k_last + 1, p.n_head_kv, hk);
      __syncthreads();
    }
    const bool masked = !Path::kUnmasked || p.window > 0 || kt + kBlockRows - 1 > i0;
    dq_tile<D, Path>(dq, qf, of, sK + buf * kTile, sV + buf * kTile, masked, kt, row_a, row_b, n, p.window, sl2,
                     lse2, dlt);
    if constexpr (Path::kAsync) __syncthreads();  // everyone is done with this buffer before it is refilled
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

// The fused kernel's dSᵀ tile in shared memory: [64 keys][64 queries] bf16.
constexpr int kDsStride = kBlockRows + 8;

// dkdv: Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ for one query tile (rows are this block's
// keys, columns the tile's queries), then dV += Pᵀ·dO and dK += dSᵀ·Q. With
// kStoreDs, dSᵀ also goes to sS as the bf16 values dK's product multiplies.
template <int D, class Path, bool kStoreDs = false>
__device__ __forceinline__ void dkdv_tile(float (*dk)[4], float (*dv)[4], const bf16* sK, const bf16* sV,
                                          const bf16* sQ, const bf16* sO, const float* sL, const float* sD,
                                          bool masked, int qt, int key_a, int key_b, int n, int window, float sl2,
                                          bf16* sS = nullptr) {
  constexpr int kS = D + 8;
  const int warp = threadIdx.x / 32, c = threadIdx.x % 4;
  float s[8][4] = {}, dp[8][4] = {};
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t ak[4], av[4];
    frag_a<Path::kLdmatrix>(ak, sK, kS, warp * 16, kk * 16);
    frag_a<Path::kLdmatrix>(av, sV, kS, warp * 16, kk * 16);
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
      uint32_t b0[2], b1[2];
      frag_b_rows2<Path::kLdmatrix>(b0, b1, sQ, kS, j * 8, kk * 16);
      mma_bf16(s[j], ak, b0);
      mma_bf16(s[j + 1], ak, b1);
      frag_b_rows2<Path::kLdmatrix>(b0, b1, sO, kS, j * 8, kk * 16);
      mma_bf16(dp[j], av, b0);
      mma_bf16(dp[j + 1], av, b1);
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = j * 8 + 2 * c + (e & 1), qi = qt + col;
      const bool vis = !masked || (qi < n && visible(e < 2 ? key_a : key_b, qi, n, window));
      const float pr = vis ? fast_exp2(fmaf(s[j][e], sl2, -sL[col] * kLog2e)) : 0.f;
      s[j][e] = pr;
      dp[j][e] = pr * (dp[j][e] - sD[col]);  // dSᵀ
    }
  if constexpr (kStoreDs) {
    const int g = threadIdx.x % 32 / 4;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      bf16* at = sS + (warp * 16 + g) * kDsStride + j * 8 + 2 * c;
      *reinterpret_cast<uint32_t*>(at) = pack_bf16(dp[j][0], dp[j][1]);
      *reinterpret_cast<uint32_t*>(at + 8 * kDsStride) = pack_bf16(dp[j][2], dp[j][3]);
    }
  }
  scores_times_tile<D, Path::kLdmatrix>(dv, s, sO);
  scores_times_tile<D, Path::kLdmatrix>(dk, dp, sQ);
}

// A dkdv block's result: rows key_a and key_b (= key_a + 8) of this thread's
// C fragments, dK scaled, both rounded to bf16.
template <int D>
__device__ __forceinline__ void store_dk_dv(const BwdParams& p, const float (*dk)[4], const float (*dv)[4],
                                            int64_t base, int key_a, int key_b, int n, int hk) {
  const int c = threadIdx.x % 4;
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

// Stages query tile `it` of a dkdv block — head hk·group + it / n_qt, rows
// j0 + (it % n_qt)·64 — with its lse and delta (zero past the document).
template <int D, bool kAsync>
__device__ __forceinline__ void stage_query_tile(const BwdParams& p, bf16* sQ, bf16* sO, float* sL, float* sD,
                                                 int64_t base, int n, int hk, int j0, int n_qt, int it) {
  const int h = hk * (p.n_head / p.n_head_kv) + it / n_qt, qt = j0 + (it % n_qt) * kBlockRows;
  stage_tile<D, kAsync>(sQ, p.q, base, qt, n, p.n_head, h);
  stage_tile<D, kAsync>(sO, p.d_out, base, qt, n, p.n_head, h);
  for (int r = threadIdx.x; r < kBlockRows; r += kThreads) {
    const bool in = qt + r < n;
    const int64_t at = in ? (base + qt + r) * p.n_head + h : 0;
    if constexpr (kAsync) {
      cp_async4(sL + r, p.lse + at, in);
      cp_async4(sD + r, p.delta + at, in);
    } else {
      sL[r] = in ? p.lse[at] : 0.f;
      sD[r] = in ? p.delta[at] : 0.f;
    }
  }
}

// Grid (KV head, document, key tile), the tile slowest: key tile 0 of every
// head and document sees the most queries and is dispatched first.
template <int D, class Path>
__global__ void __launch_bounds__(kThreads, bwd_min_blocks<D, Path>()) dkdv_kernel(BwdParams p) {
  constexpr int kS = D + 8, kTile = kBlockRows * kS, kBufs = Path::kBufs;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);
  bf16* sV = sK + kTile;
  bf16* sQ = sV + kTile;  // kBufs Q tiles
  bf16* sO = sQ + kBufs * kTile;  // kBufs d_out tiles
  float* sL = reinterpret_cast<float*>(sO + kBufs * kTile);  // kBufs × 64 lse
  float* sD = sL + kBufs * kBlockRows;  // kBufs × 64 delta

  const int hk = blockIdx.x, group = p.n_head / p.n_head_kv;
  const int64_t base = p.cu[blockIdx.y];
  const int n = p.cu[blockIdx.y + 1] - p.cu[blockIdx.y];
  const int j0 = blockIdx.z * kBlockRows;
  if (j0 >= n) return;
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4;
  const int key_a = j0 + warp * 16 + g, key_b = key_a + 8;
  const int q_last = p.window > 0 ? min(n - 1, min(j0 + kBlockRows, n) - 1 + p.window - 1) : n - 1;
  const int n_qt = (q_last - j0) / kBlockRows + 1, n_iter = group * n_qt;
  const float sl2 = p.scale * kLog2e;

  stage_tile<D, Path::kAsync>(sK, p.k, base, j0, n, p.n_head_kv, hk);
  stage_tile<D, Path::kAsync>(sV, p.v, base, j0, n, p.n_head_kv, hk);
  if constexpr (Path::kAsync) {  // the first query tile joins the K/V group
    stage_query_tile<D, true>(p, sQ, sO, sL, sD, base, n, hk, j0, n_qt, 0);
    cp_async_commit();
  }
  float dk[D / 8][4] = {}, dv[D / 8][4] = {};

  for (int it = 0, buf = 0; it < n_iter; ++it, buf ^= kBufs - 1) {
    if constexpr (Path::kAsync) {
      if (it + 1 < n_iter)
        stage_query_tile<D, true>(p, sQ + (buf ^ 1) * kTile, sO + (buf ^ 1) * kTile, sL + (buf ^ 1) * kBlockRows,
                                  sD + (buf ^ 1) * kBlockRows, base, n, hk, j0, n_qt, it + 1);
      cp_async_commit();
      cp_async_wait_one();
      __syncthreads();
    } else {
      __syncthreads();  // everyone is done with the previous query tile
      stage_query_tile<D, false>(p, sQ, sO, sL, sD, base, n, hk, j0, n_qt, it);
      __syncthreads();
    }
    const int qt = j0 + (it % n_qt) * kBlockRows;
    const bool masked = !Path::kUnmasked || p.window > 0 || qt < j0 + kBlockRows - 1 || qt + kBlockRows > n;
    dkdv_tile<D, Path>(dk, dv, sK, sV, sQ + buf * kTile, sO + buf * kTile, sL + buf * kBlockRows,
                       sD + buf * kBlockRows, masked, qt, key_a, key_b, n, p.window, sl2);
    if constexpr (Path::kAsync) __syncthreads();  // everyone is done with this buffer before it is refilled
  }
  store_dk_dv<D>(p, dk, dv, base, key_a, key_b, n, hk);
}

// ---- The fused backward: one kernel, one S/dP per tile pair ----
//
// A block per key tile j (64 keys of one KV head, as dkdv_kernel) walks the
// query tiles i it sees from the last down to its own diagonal, the heads of
// its group innermost, and besides dK and dV multiplies its dSᵀ tile (kept in
// shared memory) by its K tile: its share of dQ for (head, i). The shares of
// one (head, i) come from the key tiles first_key_tile(i) .. i, and are added
// into an f32 d_q in the workspace in that order: block j waits until the
// tile's turn counter says that the rank = j − first_key_tile(i) blocks
// before it are done, adds its share (a reduction in L2, no reply awaited;
// or load, add, store: AttentionVarlenBwdArgs::fused_load_store) and passes
// the turn on; the first stores, the last (the diagonal block) loads the sum
// and writes the bf16 d_q instead. Each warp waits, adds and passes for its
// own 16 query rows (the counter counts warps), so no block-wide barrier
// sits in the turn. The sum is the same sequence of fp32 additions whatever
// the timing, so the result is bitwise repeatable. A block waits only for
// blocks of lower blockIdx.x in its own (KV head, document) column, which
// start no later than it does, so the turns cannot deadlock; walking the
// query tiles downward puts every block of a column on the same query tile
// at the same step, so the turns pass along a column as a
// wavefront rather than one block waiting for another's whole walk.

// The fused kernel's f32 d_q [n_tokens, n_head, D] and its turn counters
// (one per row and head; the delta kernel zeroes them), in the workspace.
struct FusedSum {
  float* dq_acc = nullptr;
  int* turn = nullptr;
  bool load_store = false;  // the middle shares by load, add, store instead of reductions in L2
};

// Thread blocks per SM the fused kernel's registers must allow (its shared
// memory allows 2 at head_dim 128, 3 at 64, 5 at 32; at 32 more would spill).
template <int D>
constexpr int fused_min_blocks() {
  return D == 128 ? 2 : 3;
}

// Below head_dim 128 the fused kernel adds each step's d_q share one step
// late, after the next tile's products, from a second dSᵀ buffer: the turn
// has a step's time to arrive, and no barrier separates the dSᵀ stores from
// the product that reads them. (At 128 the second buffer would leave room
// for one block per SM only.) LATHE_ATTN_BWD_FUSED_DEFER=0: never.
#ifndef LATHE_ATTN_BWD_FUSED_DEFER
#define LATHE_ATTN_BWD_FUSED_DEFER 1
#endif
template <int D>
constexpr bool fused_defers() {
  return LATHE_ATTN_BWD_FUSED_DEFER && D < 128;
}

// The first key tile that sees query tile i (every one up to i without a window).
__device__ __forceinline__ int first_key_tile(int i, int window) {
  return window > 0 ? max(0, i * kBlockRows - window + 1) / kBlockRows : 0;
}

// Lane 0 spins until *turn >= want (the count of warps that have added
// before; this block's other warps may have added already), then the warp
// goes on. A turn that never comes would be a bug; after 10 s the kernel
// traps, so it fails instead of hanging.
__device__ __forceinline__ void wait_turn_lane(const int* turn, int want) {
  uint64_t start = 0;
  for (int spins = 0;; ++spins) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(turn) : "memory");
    if (v >= want) return;
    if (spins < 4096) continue;
    uint64_t now;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(now));
    if (start == 0) start = now;
    if (now - start > 10'000'000'000ull) __trap();
    __nanosleep(100);
  }
}
__device__ __forceinline__ void wait_turn(const int* turn, int want) {
  if (threadIdx.x % 32 == 0) wait_turn_lane(turn, want);
  __syncwarp();
}
// *sum += v where the data lies (a reduction without a reply: the turn, not
// the atomicity, orders the additions; subnormal values flush to zero).
__device__ __forceinline__ void add_in_l2(float4* sum, float4 v) {
#if __CUDA_ARCH__ >= 900
  atomicAdd(sum, v);
#else
  atomicAdd(&sum->x, v.x);
  atomicAdd(&sum->y, v.y);
  atomicAdd(&sum->z, v.z);
  atomicAdd(&sum->w, v.w);
#endif
}

// The warp's stores are done: the next may go. A count with release
// semantics (after the warp barrier, it covers every lane's stores); lighter
// than a sequentially consistent fence before a plain count.
__device__ __forceinline__ void pass_turn(int* turn) {
  __syncwarp();
  if (threadIdx.x % 32 == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(turn) : "memory");
}

// This block's share of dQ for query tile `it_q` of head h: dS (the
// transpose of sS) times the K tile, per warp 16 query rows, in column
// chunks of at most 64; then its turn at the f32 sum (see above).
template <int D, bool kRed>
__device__ __forceinline__ void add_dq_share(const BwdParams& p, const FusedSum& f, const bf16* sS, const bf16* sK,
                                             int64_t base, int n, int h, int it_q, int jt) {
  constexpr int kS = D + 8, kChunk = D < 64 ? D : 64, kWarps = kThreads / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4, mi = lane / 8;
  const int rank = jt - first_key_tile(it_q, p.window);
  const bool last = jt == it_q;
  int* turn = f.turn + (base + int64_t(it_q) * kBlockRows) * p.n_head + h;
  const int row_a = it_q * kBlockRows + warp * 16 + g;
#pragma unroll
  for (int col0 = 0; col0 < D; col0 += kChunk) {
    float acc[kChunk / 8][4] = {};
#pragma unroll
    for (int kc = 0; kc < 4; ++kc) {
      uint32_t a[4];  // A[query][key] = sS[key][query]: the transposed 8×8 matrices
      ldmatrix_x4_trans(a, sS + (kc * 16 + (mi / 2) * 8 + lane % 8) * kDsStride + warp * 16 + (mi % 2) * 8);
#pragma unroll
      for (int dn = 0; dn < kChunk / 8; dn += 2) {
        uint32_t b0[2], b1[2];
        load_b_cols_x2(b0, b1, sK, kS, kc * 16, col0 + dn * 8);
        mma_bf16(acc[dn], a, b0);
        mma_bf16(acc[dn + 1], a, b1);
      }
    }
    if (col0 == 0 && rank > 0) wait_turn(turn, rank * kWarps);
    // Lanes c and c ^ 1 swap halves so that each holds four adjacent
    // columns of one row: the even lane row g, the odd one row g + 8.
    const bool odd = c & 1;
    const int row = row_a + (odd ? 8 : 0);
    const int64_t off = ((base + row) * p.n_head + h) * D + col0 + 4 * (c / 2);
#pragma unroll
    for (int dn = 0; dn < kChunk / 8; ++dn) {
      const float give0 = odd ? acc[dn][0] : acc[dn][2], give1 = odd ? acc[dn][1] : acc[dn][3];
      const float got0 = __shfl_xor_sync(0xffffffffu, give0, 1), got1 = __shfl_xor_sync(0xffffffffu, give1, 1);
      float4 v = odd ? make_float4(got0, got1, acc[dn][2], acc[dn][3])
                     : make_float4(acc[dn][0], acc[dn][1], got0, got1);
      if (row >= n) continue;
      float4* sum = reinterpret_cast<float4*>(f.dq_acc + off + dn * 8);
      if (last) {
        if (rank > 0) {
          const float4 b = __ldcg(sum);
          v = make_float4(b.x + v.x, b.y + v.y, b.z + v.z, b.w + v.w);
        }
        *reinterpret_cast<uint2*>(p.d_q + off + dn * 8) =
            make_uint2(pack_bf16(v.x * p.scale, v.y * p.scale), pack_bf16(v.z * p.scale, v.w * p.scale));
      } else if (rank == 0) {
        __stcg(sum, v);
      } else if (kRed) {
        add_in_l2(sum, v);
      } else {
        const float4 b = __ldcg(sum);
        __stcg(sum, make_float4(b.x + v.x, b.y + v.y, b.z + v.z, b.w + v.w));
      }
    }
  }
  if (!last) pass_turn(turn);
}

// Stages query tile qt of head h with its lse and delta (zero past the document).
template <int D>
__device__ __forceinline__ void stage_fused_tile(const BwdParams& p, bf16* sQ, bf16* sO, float* sL, float* sD,
                                                 int64_t base, int n, int h, int qt) {
  load_tile_async<D>(sQ, p.q, base, qt, n, p.n_head, h);
  load_tile_async<D>(sO, p.d_out, base, qt, n, p.n_head, h);
  stage_lse_delta<kThreads>(p, sL, sD, base, qt, n, h);
}

template <int D, bool kRed>
__global__ void __launch_bounds__(kThreads, fused_min_blocks<D>()) fused_bwd_kernel(BwdParams p, FusedSum f) {
  using Path = BwdPath<true, true, true>;
  constexpr int kS = D + 8, kTile = kBlockRows * kS, kSTile = kBlockRows * kDsStride;
  constexpr bool kDefer = fused_defers<D>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);
  bf16* sV = sK + kTile;
  bf16* sQ = sV + kTile;                                         // 2 Q tiles
  bf16* sO = sQ + 2 * kTile;                                     // 2 d_out tiles
  bf16* sS = sO + 2 * kTile;                                     // dSᵀ (2 with kDefer)
  float* sL = reinterpret_cast<float*>(sS + (kDefer ? 2 : 1) * kSTile);  // 2 × 64 lse
  float* sD = sL + 2 * kBlockRows;                               // 2 × 64 delta

  const int hk = blockIdx.y, group = p.n_head / p.n_head_kv;
  const int64_t base = p.cu[blockIdx.z];
  const int n = p.cu[blockIdx.z + 1] - p.cu[blockIdx.z];
  const int jt = blockIdx.x, j0 = jt * kBlockRows;
  if (j0 >= n) return;
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4;
  const int key_a = j0 + warp * 16 + g, key_b = key_a + 8;
  const int n_tiles = (n + kBlockRows - 1) / kBlockRows;
  const int i_hi =  // the last query tile that sees this key tile (a window wider than the document: none)
      p.window > 0 ? min(n_tiles - 1, ((jt + 1) * kBlockRows + min(p.window, n) - 2) / kBlockRows) : n_tiles - 1;
  const int n_iter = group * (i_hi - jt + 1);
  const float sl2 = p.scale * kLog2e;
  auto head_of = [&](int it) { return hk * group + it % group; };
  auto tile_of = [&](int it) { return i_hi - it / group; };

  load_tile_async<D>(sK, p.k, base, j0, n, p.n_head_kv, hk);
  load_tile_async<D>(sV, p.v, base, j0, n, p.n_head_kv, hk);
  stage_fused_tile<D>(p, sQ, sO, sL, sD, base, n, head_of(0), tile_of(0) * kBlockRows);
  cp_async_commit();
  float dk[D / 8][4] = {}, dv[D / 8][4] = {};

  for (int it = 0, buf = 0; it < n_iter; ++it, buf ^= 1) {
    cp_async_wait_all();  // this tile
    __syncthreads();      // ... for every thread; and everyone is done with sS and the other buffer
    if (it + 1 < n_iter) {
      stage_fused_tile<D>(p, sQ + (buf ^ 1) * kTile, sO + (buf ^ 1) * kTile, sL + (buf ^ 1) * kBlockRows,
                          sD + (buf ^ 1) * kBlockRows, base, n, head_of(it + 1), tile_of(it + 1) * kBlockRows);
      cp_async_commit();
    }
    const int it_q = tile_of(it), qt = it_q * kBlockRows;
    const bool masked = p.window > 0 || it_q == jt || qt + kBlockRows > n;
    bf16 *q_buf = sQ + buf * kTile, *o_buf = sO + buf * kTile, *s_buf = sS + (kDefer ? buf : 0) * kSTile;
    float *l_buf = sL + buf * kBlockRows, *d_buf = sD + buf * kBlockRows;
    if (masked)  // a literal each way, so both loops are compiled (the compiler may not split them itself)
      dkdv_tile<D, Path, true>(dk, dv, sK, sV, q_buf, o_buf, l_buf, d_buf, true, qt, key_a, key_b, n, p.window, sl2,
                               s_buf);
    else
      dkdv_tile<D, Path, true>(dk, dv, sK, sV, q_buf, o_buf, l_buf, d_buf, false, qt, key_a, key_b, n, p.window, sl2,
                               s_buf);
    if constexpr (kDefer) {  // the previous step's share: its dSᵀ was whole at the barrier above
      if (it > 0)
        add_dq_share<D, kRed>(p, f, sS + (buf ^ 1) * kSTile, sK, base, n, head_of(it - 1), tile_of(it - 1), jt);
    } else {
      __syncthreads();  // dSᵀ is whole
      add_dq_share<D, kRed>(p, f, sS, sK, base, n, head_of(it), it_q, jt);
    }
  }
  if constexpr (kDefer) {
    __syncthreads();
    add_dq_share<D, kRed>(p, f, sS + ((n_iter - 1) & 1) * kSTile, sK, base, n, head_of(n_iter - 1),
                          tile_of(n_iter - 1), jt);
  }
  store_dk_dv<D>(p, dk, dv, base, key_a, key_b, n, hk);
}

template <int D, bool kRed>
Status launch_fused_as(const BwdParams& p, const FusedSum& f, int n_docs, int max_seqlen, cudaStream_t st) {
  const int tiles = (max_seqlen + kBlockRows - 1) / kBlockRows;
  const int tile_bytes = kBlockRows * (D + 8) * int(sizeof(bf16));
  const int smem = 6 * tile_bytes + (fused_defers<D>() ? 2 : 1) * kBlockRows * kDsStride * int(sizeof(bf16)) +
                   4 * kBlockRows * int(sizeof(float));
  LATHE_TRY(cuda_check(
      cudaFuncSetAttribute(fused_bwd_kernel<D, kRed>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
      "cudaFuncSetAttribute(fused backward)"));
  fused_bwd_kernel<D, kRed><<<dim3(tiles, p.n_head_kv, n_docs), kThreads, smem, st>>>(p, f);
  return cuda_check(cudaGetLastError(), "attention fused backward launch");
}

template <int D>
Status launch_fused(const BwdParams& p, const FusedSum& f, int n_docs, int max_seqlen, cudaStream_t st) {
  return f.load_store ? launch_fused_as<D, false>(p, f, n_docs, max_seqlen, st)
                      : launch_fused_as<D, true>(p, f, n_docs, max_seqlen, st);
}

// sm90_rows: 0 for the mma.sync kernels, else the rows per block of the
// wgmma ones, or kWsRows for the warp-specialized ones; f.dq_acc set: the
// one-kernel backward; ds: kWsDs's tiles.
constexpr int kWsRows = -1;
template <int D, class Path>
Status launch(const BwdParams& p, const FusedSum& f, int n_docs, int max_seqlen, cudaStream_t st, int sm90_rows,
              const DsTiles& ds = {}) {
  LATHE_TRY(launch_delta(p, D, f.turn, std::is_same_v<Path, SimplePath>, st));  // attention_delta.cu
  if (f.dq_acc) return launch_fused<D>(p, f, n_docs, max_seqlen, st);
  if (sm90_rows == kWsRows) return launch_backward_ws(p, D, n_docs, max_seqlen, st, ds);
  if (sm90_rows != 0) return launch_backward_sm90(p, D, sm90_rows, n_docs, max_seqlen, st);
  const int tiles = (max_seqlen + kBlockRows - 1) / kBlockRows;
  const int tile_bytes = kBlockRows * (D + 8) * int(sizeof(bf16));
  const int smem_dq = (2 + 2 * Path::kBufs) * tile_bytes;
  const int smem_dkdv = smem_dq + Path::kBufs * 2 * kBlockRows * int(sizeof(float));
  LATHE_TRY(cuda_check(cudaFuncSetAttribute(dq_kernel<D, Path>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_dq),
                       "cudaFuncSetAttribute(dq)"));
  LATHE_TRY(cuda_check(
      cudaFuncSetAttribute(dkdv_kernel<D, Path>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_dkdv),
      "cudaFuncSetAttribute(dkdv)"));
  // dkdv first: its causal blocks are the unequal ones; dq's many short
  // blocks then fill the SMs its tail leaves idle when they run beside it.
  LATHE_ASSIGN_OR_RETURN(const SideStream* side, side_stream_for(st));
  dkdv_kernel<D, Path><<<dim3(p.n_head_kv, n_docs, tiles), kThreads, smem_dkdv, st>>>(p);
  LATHE_TRY(cuda_check(cudaGetLastError(), "attention dkdv launch"));
  const cudaStream_t dq_stream = side ? side->stream : st;
  dq_kernel<D, Path><<<dim3(p.n_head, n_docs, tiles), kThreads, smem_dq, dq_stream>>>(p);
  LATHE_TRY(cuda_check(cudaGetLastError(), "attention dq launch"));
  return side ? join_side_stream(*side, st) : Status::ok();
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace
}  // namespace attn

namespace {

// The fused kernel's workspace: delta, then the turn counters, then the f32
// d_q, each section starting 16-byte aligned.
size_t fused_section_bytes(size_t rows) { return (rows * sizeof(float) + 15) / 16 * 16; }

// kAuto made concrete: LATHE_ATTN_BWD (read once), else the compiled
// default: kWsDs where it runs (LATHE_ATTN_BWD_WS_AUTO), else kMma (or,
// with LATHE_ATTN_BWD_SM90_AUTO, kWgmma where it runs).
Result<AttnBwdKernels> resolve_kernels(AttnBwdKernels k, int head_dim) {
  if (k != AttnBwdKernels::kAuto) return k;
  static const std::string named = env::attn_bwd_kernels();
  if (named == "mma") return AttnBwdKernels::kMma;
  if (named == "wgmma") return AttnBwdKernels::kWgmma;
  if (named == "fused") return AttnBwdKernels::kFused;
  if (named == "ws") return AttnBwdKernels::kWs;
  if (named == "ws-ds") return AttnBwdKernels::kWsDs;
  if (!named.empty()) return invalid_argument("LATHE_ATTN_BWD='", named, "' (mma, wgmma, fused, ws or ws-ds)");
  if (head_dim <= LATHE_ATTN_BWD_FUSED_AUTO) return AttnBwdKernels::kFused;
  if (LATHE_ATTN_BWD_WS_AUTO && attn::sm90_supported(head_dim)) return AttnBwdKernels::kWsDs;
  return LATHE_ATTN_BWD_SM90_AUTO && attn::sm90_supported(head_dim) ? AttnBwdKernels::kWgmma : AttnBwdKernels::kMma;
}

}  // namespace

size_t attention_varlen_backward_workspace_bytes(int64_t n_tokens, int n_head, int head_dim, AttnBwdKernels kernels,
                                                 int64_t max_seqlen, int64_t max_docs, int64_t ds_spare_tiles) {
  const size_t rows = size_t(n_tokens > 0 ? n_tokens : 0) * size_t(n_head > 0 ? n_head : 0);
  bool fused = false, ds = false;  // for head_dim 0: at any compiled head_dim
  for (int d : {32, 64, 128}) {
    if (head_dim > 0 && d != head_dim) continue;
    auto k = resolve_kernels(kernels, d);
    fused = fused || (k.is_ok() && k.value() == AttnBwdKernels::kFused);
    ds = ds || (k.is_ok() && k.value() == AttnBwdKernels::kWsDs);
  }
  if (ds && max_seqlen > 0 && n_tokens > 0) {  // delta, each document's first pair, the tiles the spares lack
    const int64_t docs = max_docs > 0 ? max_docs : (n_tokens + max_seqlen - 1) / max_seqlen;
    const int64_t tiles = attention_ds_pair_bound(n_tokens, docs, max_seqlen) * n_head;
    return fused_section_bytes(rows) + fused_section_bytes(size_t(n_tokens) + 1) +
           size_t(std::max<int64_t>(tiles - std::max<int64_t>(ds_spare_tiles, 0), 0)) * attn::kDsTileBytes;
  }
  if (!fused) return rows * sizeof(float);
  return 2 * fused_section_bytes(rows) + rows * size_t(head_dim > 0 ? head_dim : 128) * sizeof(float);
}

Status attention_varlen_backward(const AttentionVarlenBwdArgs& a) {
  const char* kName = "attention_varlen_backward: ";
  if (!attn::head_dim_compiled(a.head_dim))
    return unsupported(kName, "head_dim ", a.head_dim, " is not compiled (" LATHE_ATTN_HEAD_DIMS " are)");
  if (a.n_head <= 0 || a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0)
    return invalid_argument(kName, "n_head ", a.n_head, " is not a multiple of n_head_kv ", a.n_head_kv);
  if (a.n_docs < 0 || a.max_seqlen < 0 || a.n_tokens < 0 || a.window < 0)
    return invalid_argument(kName, "negative n_docs, max_seqlen, n_tokens or window");
  if (a.wgmma_rows != 0 && a.wgmma_rows != 64 && a.wgmma_rows != 128)
    return invalid_argument(kName, "wgmma_rows ", a.wgmma_rows, " (0, 64 or 128)");
  if (a.n_tokens == 0 || a.n_docs == 0) return Status::ok();
  if (a.max_seqlen == 0) return invalid_argument(kName, "max_seqlen is 0 with ", a.n_tokens, " tokens");
  if (int64_t(a.n_tokens) * a.n_head > INT32_MAX) return invalid_argument(kName, "n_tokens × n_head exceeds 2^31");
  if (a.ld_out != 0 && a.ld_out < int64_t(a.n_head) * a.head_dim)
    return invalid_argument(kName, "ld_out ", a.ld_out, " is shorter than a row (", int64_t(a.n_head) * a.head_dim, ")");
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
                    a.window,                          a.scale,
                    a.ld_out};
  LATHE_ASSIGN_OR_RETURN(const AttnBwdKernels kernels, resolve_kernels(a.kernels, a.head_dim));
  const bool ws = !a.simple && (kernels == AttnBwdKernels::kWs || kernels == AttnBwdKernels::kWsDs);
  const bool sm90 = !a.simple && (kernels == AttnBwdKernels::kWgmma || ws);
  const bool fused = !a.simple && kernels == AttnBwdKernels::kFused;
  if (sm90 && !attn::sm90_supported(a.head_dim))
    return unsupported(kName, "the ", ws ? "warp-specialized" : "wgmma",
                       " kernels need a Hopper device and head_dim 64 or 128 (head_dim ", a.head_dim, ")");
  attn::FusedSum sum;
  if (fused) {  // the workspace continues with the turn counters and the f32 d_q
    if (!attn::aligned16(a.workspace)) return invalid_argument(kName, "the workspace must be 16-byte aligned");
    const size_t rows = size_t(a.n_tokens) * size_t(a.n_head);
    const size_t section = fused_section_bytes(rows);
    sum.turn = reinterpret_cast<int*>(static_cast<char*>(a.workspace) + section);
    sum.dq_acc = reinterpret_cast<float*>(static_cast<char*>(a.workspace) + 2 * section);
    sum.load_store = a.fused_load_store;
  }
  attn::DsTiles ds;
  if (ws && kernels == AttnBwdKernels::kWsDs && a.window == 0) {  // the dS tiles, where this batch's fit
    const size_t rows = size_t(a.n_tokens) * size_t(a.n_head);
    const size_t head = fused_section_bytes(rows) + fused_section_bytes(size_t(a.n_tokens) + 1);
    const size_t need = size_t(attention_ds_pair_bound(a.n_tokens, a.n_docs, a.max_seqlen)) * size_t(a.n_head) *
                        attn::kDsTileBytes;
    if (!attn::aligned16(a.workspace) || !attn::aligned16(a.ds_spare[0]) || !attn::aligned16(a.ds_spare[1]))
      return invalid_argument(kName, "the workspace and ds_spare must be 16-byte aligned");
    int64_t end = 0;
    for (int r = 0; r < 2; ++r) {
      ds.spare[r] = a.ds_spare[r];
      end += a.ds_spare[r] ? attention_ds_spare_tiles(a.ds_spare_bytes[r]) : 0;
      ds.end[r] = end;
    }
    if (a.workspace_bytes >= head && (a.workspace_bytes - head) + size_t(end) * attn::kDsTileBytes >= need) {
      ds.pair_base = reinterpret_cast<int*>(static_cast<char*>(a.workspace) + fused_section_bytes(rows));
      ds.tiles = static_cast<char*>(a.workspace) + head;
    }
  }
  const int sm90_rows = !sm90 ? 0 : ws ? attn::kWsRows : a.wgmma_rows != 0 ? a.wgmma_rows : LATHE_ATTN_BWD_SM90_ROWS;
  auto st = static_cast<cudaStream_t>(a.stream);
  return attn::with_head_dim(a.head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    return a.simple ? attn::launch<D, attn::SimplePath>(p, {}, a.n_docs, a.max_seqlen, st, 0)
                    : attn::launch<D, attn::FastPath>(p, sum, a.n_docs, a.max_seqlen, st, sm90_rows, ds);
  });
}

}  // namespace lathe::cuda
