// Flash-style attention forward on tensor cores (mma.sync m16n8k16 bf16).
// A thread block takes 128 query rows (64 in the 16-rows-per-warp variant)
// of one head of one document; each of its four warps owns 32 rows (16) and
// keeps their fp32 output accumulator and running max / sum in registers.
// K and V tiles of 64 keys are staged in shared memory; S = Q·Kᵀ and
// O += P·V run on tensor cores, the softmax in fp32 in the exp2 domain.
// With 32 rows a warp reuses every K/V fragment it reads from shared memory
// for two tensor-core instructions, which is what makes it the faster one
// (H200: 244 vs 212 TFLOP/s at head_dim 128). Only the key tiles a block
// can see (causal, window) are visited. The same kernels serve prefill into
// a KV cache: one sequence whose queries start at position q_pos0. On Hopper
// a third kernel does the two products with warpgroup instructions
// (attention_sm90.cuh; AttentionVarlenFwdArgs::wgmma), one warpgroup per 64
// rows, one or two warpgroups per block, its accumulators in the layout the
// softmax of attention_common.cuh expects; a fourth, warp-specialized
// (TMA producer, wgmma consumers), lives in attention_fwd_sm90.cu. Which
// one runs: launch_flash_forward below.
#include "backends/cuda/attention.h"
#include "backends/cuda/attention_common.cuh"
#include "backends/cuda/attention_sm90.cuh"

#include <cmath>
#include <string>

#include "core/env.h"

// Compile-time switches, to bisect the fast kernel on the device: skip the
// mask on tiles wholly below the diagonal (1), and the thread blocks per SM
// the registers must allow per head_dim (more blocks hide more latency; too
// many make ptxas spill: 4 at head_dim 64 does, check with -Xptxas -v).
#ifndef LATHE_ATTN_FWD_WARP_ROWS  // query rows per warp of the fast kernel: 16 or 32 (faster on the H200)
#define LATHE_ATTN_FWD_WARP_ROWS 32
#endif
// Training forwards (packed documents) at head_dim 64 take the wgmma kernel
// where it runs unless warp_rows asks for another (1). Alone on the H200 it
// does 223 TFLOP/s there against the 32-rows-per-warp kernel's 202 (at 128
// that kernel is ahead, 244 against 222), but inside the training step the
// phase did not move (12.2 against 12.3 ms at 1B), so it stays off.
#ifndef LATHE_ATTN_FWD_SM90_AUTO
#define LATHE_ATTN_FWD_SM90_AUTO 0
#endif
// The warp-specialized Hopper kernel (attention_fwd_sm90.cu) as the default
// where it runs (1); LATHE_ATTN_FWD=mma|wgmma|ws overrides at run time. On
// the H200 (8 × 2048 causal) it does 404 TFLOP/s at head_dim 128 against
// the mma.sync kernel's 218, 290 against 179 at 64; in the training step
// the attention forward drops from 14.8 to 9.7 ms (1B) and 27.0 to 14.4 ms
// (8B).
#ifndef LATHE_ATTN_FWD_WS_AUTO
#define LATHE_ATTN_FWD_WS_AUTO 1
#endif
#ifndef LATHE_ATTN_FWD_SM90_ROWS  // query rows per block of the wgmma kernel by default: 64 or 128
#define LATHE_ATTN_FWD_SM90_ROWS 64
#endif
#ifndef LATHE_ATTN_FWD_UNMASKED
#define LATHE_ATTN_FWD_UNMASKED 1
#endif
#ifndef LATHE_ATTN_FWD_MIN_BLOCKS_128
#define LATHE_ATTN_FWD_MIN_BLOCKS_128 3
#endif
#ifndef LATHE_ATTN_FWD_MIN_BLOCKS_64
#define LATHE_ATTN_FWD_MIN_BLOCKS_64 3
#endif
#ifndef LATHE_ATTN_FWD_MIN_BLOCKS_32
#define LATHE_ATTN_FWD_MIN_BLOCKS_32 4
#endif

namespace lathe::cuda {
namespace attn {

Status cuda_check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::ok();
  return error(StatusCode::kInternal, "cuda: ", what, ": ", cudaGetErrorString(err));
}

namespace {

// One K/V tile of 64 keys starting at key kt for a warp's 16 rows: S = Q·Kᵀ
// (Q fragments in registers), the online softmax, O += P·V.
// kLdmatrix: B fragments through ldmatrix (two n tiles per instruction),
// otherwise through the plain element loads; the fragments are the same.
template <int D, bool kLdmatrix>
__device__ __forceinline__ void attend_tile(const uint32_t (*qf)[4], float (*o)[4], float m[2], float l[2],
                                            const bf16* sK, const bf16* sV, bool masked, int kt, int pos_a,
                                            int pos_b, int n_k, int window, float sl2) {
  constexpr int kS = D + 8;
  float s[8][4] = {};
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
    for (int n = 0; n < 8; n += 2) {
      uint32_t b0[2], b1[2];
      frag_b_rows2<kLdmatrix>(b0, b1, sK, kS, n * 8, kk * 16);
      mma_bf16(s[n], qf[kk], b0);
      mma_bf16(s[n + 1], qf[kk], b1);
    }
  online_softmax<D>(s, o, m, l, masked, kt, pos_a, pos_b, n_k, window, sl2);
  scores_times_tile<D, kLdmatrix>(o, s, sV);
}

// The same for a warp's 32 rows: two 16-row tiles, 64 rows apart (one in
// each of the two Q tiles at sQ), share every K and V fragment read from
// shared memory, which halves the shared-memory traffic per tensor-core
// instruction. Q fragments are read from shared memory per 16 columns.
// pos0: the position of this thread's first row (of the first Q tile).
template <int D>
__device__ __forceinline__ void attend_tile_wide(const bf16* sQ, float (*o)[D / 8][4], float (*m)[2], float (*l)[2],
                                                 const bf16* sK, const bf16* sV, bool masked, int kt, int pos0,
                                                 int n_k, int window, float sl2) {
  constexpr int kS = D + 8, kTile = kBlockRows * kS;
  const int warp = threadIdx.x / 32;
  float s[2][8][4] = {};
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a0[4], a1[4];
    load_a_x4(a0, sQ, kS, warp * 16, kk * 16);
    load_a_x4(a1, sQ + kTile, kS, warp * 16, kk * 16);
#pragma unroll
    for (int n = 0; n < 8; n += 2) {
      uint32_t b0[2], b1[2];
      load_b_rows_x2(b0, b1, sK, kS, n * 8, kk * 16);
      mma_bf16(s[0][n], a0, b0);
      mma_bf16(s[0][n + 1], a0, b1);
      mma_bf16(s[1][n], a1, b0);
      mma_bf16(s[1][n + 1], a1, b1);
    }
  }
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
    online_softmax<D>(s[mt], o[mt], m[mt], l[mt], masked, kt, pos0 + mt * kBlockRows, pos0 + mt * kBlockRows + 8,
                      n_k, window, sl2);
  uint32_t pa[2][4][4];  // P in bf16 A fragments: half the registers of s
#pragma unroll
  for (int kc = 0; kc < 4; ++kc) {
    c_to_a(pa[0][kc], s[0], kc);
    c_to_a(pa[1][kc], s[1], kc);
  }
#pragma unroll
  for (int kc = 0; kc < 4; ++kc)
#pragma unroll
    for (int dn = 0; dn < D / 8; dn += 2) {
      uint32_t b0[2], b1[2];
      load_b_cols_x2(b0, b1, sV, kS, kc * 16, dn * 8);
      mma_bf16(o[0][dn], pa[0][kc], b0);
      mma_bf16(o[0][dn + 1], pa[0][kc], b1);
      mma_bf16(o[1][dn], pa[1][kc], b0);
      mma_bf16(o[1][dn + 1], pa[1][kc], b1);
    }
}

// Thread blocks per SM the register allocation must allow for the pipelined
// kernel (its shared memory allows 3 at head_dim 128).
template <int D>
constexpr int min_blocks() {
  if (D == 128) return LATHE_ATTN_FWD_MIN_BLOCKS_128;
  return D == 64 ? LATHE_ATTN_FWD_MIN_BLOCKS_64 : LATHE_ATTN_FWD_MIN_BLOCKS_32;
}
// The same for the 32-rows-per-warp kernel (shared memory: 2 blocks at 128;
// one more block at 64 or 32 makes ptxas spill 50-70 bytes).
template <int D>
constexpr int min_blocks_wide() {
  return D == 128 ? 2 : D == 64 ? 2 : 3;
}

// kPipelined: K/V tiles double-buffered through cp.async, the next tile in
// flight while this one is computed, fragments read with ldmatrix; the Q
// tile passes through the second K/V buffer before the loop, and tiles
// wholly below the diagonal skip the mask. Otherwise a Q tile and one K/V
// buffer, plain loads, fragments gathered element by element, every tile
// masked (the simple version, kept as an on-device oracle for the fast one).
// Blocks run in reverse tile order: the last query tiles see the most keys
// and start first, so the short ones fill the tail.
template <int D, bool kPipelined>
__global__ void __launch_bounds__(kThreads, kPipelined ? min_blocks<D>() : 1) flash_forward_kernel(FwdParams p) {
  constexpr int kS = D + 8, kTile = kBlockRows * kS;  // shared row stride, elements per tile
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);  // kPipelined: two K tiles, then two V tiles
  bf16* sV = sK + (kPipelined ? 2 : 1) * kTile;
  bf16* sQ = kPipelined ? sK + kTile : sV + kTile;

  const int h = blockIdx.y, hk = h / (p.n_head / p.n_head_kv);
  const auto [q_base, k_base, n_q, n_k] = block_seq(p);
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kBlockRows;
  if (i0 >= n_q) return;

  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4;
  const int row_a = i0 + warp * 16 + g, row_b = row_a + 8;  // local query rows of this thread
  const int pos_a = row_a + p.q_pos0, pos_b = row_b + p.q_pos0;
  const int last_row = min(i0 + kBlockRows, n_q) - 1;
  const int k_last = min(n_k - 1, last_row + p.q_pos0);
  const int k_first = p.window > 0 ? max(0, i0 + p.q_pos0 - p.window + 1) : 0;
  const float sl2 = p.scale * kLog2e;
  uint32_t qf[D / 16][4];
  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  if constexpr (kPipelined) {
    load_tile_async<D>(sQ, p.q, q_base, i0, n_q, p.n_head, h);
    cp_async_commit();
    load_tile_async<D>(sK, p.k, k_base, k_first, k_last + 1, p.n_head_kv, hk);
    load_tile_async<D>(sV, p.v, k_base, k_first, k_last + 1, p.n_head_kv, hk);
    cp_async_commit();
    cp_async_wait_one();  // the Q group
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) load_a_x4(qf[kk], sQ, kS, warp * 16, kk * 16);
    __syncthreads();  // everyone holds its Q fragments before the buffer takes K/V
    for (int kt = k_first, buf = 0; kt <= k_last; kt += kBlockRows, buf ^= 1) {
      if (kt + kBlockRows <= k_last) {  // prefetch the next tile into the other buffer
        load_tile_async<D>(sK + (buf ^ 1) * kTile, p.k, k_base, kt + kBlockRows, k_last + 1, p.n_head_kv, hk);
        load_tile_async<D>(sV + (buf ^ 1) * kTile, p.v, k_base, kt + kBlockRows, k_last + 1, p.n_head_kv, hk);
      }
      cp_async_commit();   // possibly empty: keeps "all but the newest group" meaning this tile
      cp_async_wait_one();
      __syncthreads();     // this tile's copies from every thread are visible
      const bool masked = !LATHE_ATTN_FWD_UNMASKED || p.window > 0 || kt + kBlockRows - 1 > i0 + p.q_pos0;
      attend_tile<D, true>(qf, o, m, l, sK + buf * kTile, sV + buf * kTile, masked, kt, pos_a, pos_b, n_k, p.window,
                           sl2);
      __syncthreads();     // everyone is done with this buffer before it is refilled
    }
  } else {
    load_tile<D>(sQ, p.q, q_base, i0, n_q, p.n_head, h);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) load_a(qf[kk], sQ, kS, warp * 16, kk * 16);
    for (int kt = k_first; kt <= k_last; kt += kBlockRows) {
      __syncthreads();  // everyone is done with the previous K/V tile
      load_tile<D>(sK, p.k, k_base, kt, k_last + 1, p.n_head_kv, hk);
      load_tile<D>(sV, p.v, k_base, kt, k_last + 1, p.n_head_kv, hk);
      __syncthreads();
      attend_tile<D, false>(qf, o, m, l, sK, sV, true, kt, pos_a, pos_b, n_k, p.window, sl2);
    }
  }

  store_rows<D>(p, o, m, l, q_base, row_a, row_b, n_q, h);
}

// The fast kernel with 32 rows per warp: 128 query rows per block (two Q
// tiles, kept in shared memory), K/V double-buffered through cp.async as
// above; warp w owns rows w·16.. of each Q tile.
template <int D>
__global__ void __launch_bounds__(kThreads, min_blocks_wide<D>()) flash_forward_wide_kernel(FwdParams p) {
  constexpr int kS = D + 8, kTile = kBlockRows * kS, kRows = 2 * kBlockRows;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // two Q tiles, two K tiles, two V tiles
  bf16* sK = sQ + 2 * kTile;
  bf16* sV = sK + 2 * kTile;

  const int h = blockIdx.y, hk = h / (p.n_head / p.n_head_kv);
  const auto [q_base, k_base, n_q, n_k] = block_seq(p);
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kRows;
  if (i0 >= n_q) return;

  const int row0 = i0 + threadIdx.x / 32 * 16 + threadIdx.x % 32 / 4;  // this thread's first row
  const int last_row = min(i0 + kRows, n_q) - 1;
  const int k_last = min(n_k - 1, last_row + p.q_pos0);
  const int k_first = p.window > 0 ? max(0, i0 + p.q_pos0 - p.window + 1) : 0;
  const float sl2 = p.scale * kLog2e;
  float o[2][D / 8][4] = {};
  float m[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}}, l[2][2] = {};

  load_tile_async<D>(sQ, p.q, q_base, i0, n_q, p.n_head, h);
  load_tile_async<D>(sQ + kTile, p.q, q_base, i0 + kBlockRows, n_q, p.n_head, h);
  load_tile_async<D>(sK, p.k, k_base, k_first, k_last + 1, p.n_head_kv, hk);
  load_tile_async<D>(sV, p.v, k_base, k_first, k_last + 1, p.n_head_kv, hk);
  cp_async_commit();
  for (int kt = k_first, buf = 0; kt <= k_last; kt += kBlockRows, buf ^= 1) {
    if (kt + kBlockRows <= k_last) {  // prefetch the next tile into the other buffer
      load_tile_async<D>(sK + (buf ^ 1) * kTile, p.k, k_base, kt + kBlockRows, k_last + 1, p.n_head_kv, hk);
      load_tile_async<D>(sV + (buf ^ 1) * kTile, p.v, k_base, kt + kBlockRows, k_last + 1, p.n_head_kv, hk);
    }
    cp_async_commit();  // possibly empty: keeps "all but the newest group" meaning this tile
    cp_async_wait_one();
    __syncthreads();  // this tile's copies (and the first time Q's) from every thread are visible
    const bool masked = !LATHE_ATTN_FWD_UNMASKED || p.window > 0 || kt + kBlockRows - 1 > i0 + p.q_pos0;
    attend_tile_wide<D>(sQ, o, m, l, sK + buf * kTile, sV + buf * kTile, masked, kt, row0 + p.q_pos0, n_k, p.window,
                        sl2);
    __syncthreads();  // everyone is done with this buffer before it is refilled
  }
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    const int row = row0 + mt * kBlockRows;
    store_rows<D>(p, o[mt], m[mt], l[mt], q_base, row, row + 8, n_q, h);
  }
}

// The Hopper kernel (attention_sm90.cuh): WG warpgroups per block, each
// with 64 query rows (warpgroup w the rows 64w..) sharing the K/V tiles;
// S = Q·Kᵀ with both tiles in shared memory, O += P·V with P from
// registers, K/V double-buffered through cp.async. A warpgroup skips the
// tiles none of its rows sees. The accumulators have the layout of the
// kernels above, so the online softmax and the stores are theirs.
template <int D, int WG>
__global__ void __launch_bounds__(WG* kThreads, WG == 2 ? 1 : 2) flash_forward_sm90_kernel(FwdParams p) {
#if LATHE_SM90A_DEVICE
  using namespace sm90;
  constexpr int kT = tile_bytes<D>(), kRows = WG * kBlockRows, kN = WG * kThreads;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* sQ = aligned_smem(smem_raw);  // WG Q tiles
  unsigned char* sK = sQ + WG * kT;            // two K tiles, then two V tiles
  unsigned char* sV = sK + 2 * kT;

  const int h = blockIdx.y, hk = h / (p.n_head / p.n_head_kv);
  const auto [q_base, k_base, n_q, n_k] = block_seq(p);
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kRows;
  if (i0 >= n_q) return;
  const int wg = threadIdx.x / kThreads, t = threadIdx.x % kThreads;
  const int w0 = i0 + wg * kBlockRows, w_last = min(w0 + kBlockRows, n_q) - 1;  // this warpgroup's rows
  const int row_a = w0 + t / 32 * 16 + t % 32 / 4, row_b = row_a + 8;
  const int last_row = min(i0 + kRows, n_q) - 1;
  const int k_last = min(n_k - 1, last_row + p.q_pos0);
  const int k_first = p.window > 0 ? max(0, i0 + p.q_pos0 - p.window + 1) : 0;
  const float sl2 = p.scale * kLog2e;
  float o[D / 2], s[32];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  for (int w = 0; w < WG; ++w) load_tile_sw<D, kN>(sQ + w * kT, p.q, q_base, i0 + w * kBlockRows, n_q, p.n_head, h);
  load_tile_sw<D, kN>(sK, p.k, k_base, k_first, k_last + 1, p.n_head_kv, hk);
  load_tile_sw<D, kN>(sV, p.v, k_base, k_first, k_last + 1, p.n_head_kv, hk);
  cp_async_commit();
  for (int kt = k_first, buf = 0; kt <= k_last; kt += kBlockRows, buf ^= 1) {
    if (kt + kBlockRows <= k_last) {  // prefetch the next tile into the other buffer
      load_tile_sw<D, kN>(sK + (buf ^ 1) * kT, p.k, k_base, kt + kBlockRows, k_last + 1, p.n_head_kv, hk);
      load_tile_sw<D, kN>(sV + (buf ^ 1) * kT, p.v, k_base, kt + kBlockRows, k_last + 1, p.n_head_kv, hk);
    }
    cp_async_commit();  // possibly empty: keeps "all but the newest group" meaning this tile
    cp_async_wait_one();
    fence_async_smem();
    __syncthreads();
    const int pos0 = w0 + p.q_pos0;  // this warpgroup's first position
    const bool seen =
        w0 < n_q && kt <= w_last + p.q_pos0 && (p.window <= 0 || kt + kBlockRows - 1 > pos0 - p.window);
    if (seen) {
      const bool masked = !LATHE_ATTN_FWD_UNMASKED || p.window > 0 || kt + kBlockRows - 1 > pos0;
      wg_fence();
      issue_scores<D>(s, sQ + wg * kT, sK + buf * kT);
      wg_commit();
      wg_wait<0>();
      pin(s);
      online_softmax<D>(reinterpret_cast<float(*)[4]>(s), reinterpret_cast<float(*)[4]>(o), m, l, masked, kt,
                        row_a + p.q_pos0, row_b + p.q_pos0, n_k, p.window, sl2);
      uint32_t pa[4][4];
#pragma unroll
      for (int kc = 0; kc < 4; ++kc) c_to_a(pa[kc], reinterpret_cast<const float(*)[4]>(s), kc);
      pin(pa);
      pin(o);
      wg_fence();
      accumulate_rows<D>(o, pa, sV + buf * kT);
      wg_commit();
      wg_wait<0>();
      pin(o);
    }
    __syncthreads();  // everyone is done with this buffer before it is refilled
  }
  store_rows<D>(p, reinterpret_cast<const float(*)[4]>(o), m, l, q_base, row_a, row_b, n_q, h);
#else
  __trap();  // launched only where sm90_supported() holds
#endif
}

template <int D, int WG>
Status launch_sm90(const FwdParams& p, void* stream) {
  if constexpr (D != 64 && D != 128) {
    return unsupported("attention forward (wgmma): head_dim ", D, " (64 and 128 are compiled)");
  } else {
    const int smem = (WG + 4) * sm90::tile_bytes<D>() + 1024;  // + room to align the tiles to 1024 bytes
    auto* kernel = flash_forward_sm90_kernel<D, WG>;
    LATHE_TRY(cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                         "cudaFuncSetAttribute(flash_forward_sm90)"));
    const dim3 grid((p.max_q + WG * kBlockRows - 1) / (WG * kBlockRows), p.n_head, p.cu ? p.n_docs : 1);
    kernel<<<grid, WG * kThreads, smem, static_cast<cudaStream_t>(stream)>>>(p);
    return cuda_check(cudaGetLastError(), "flash_forward_sm90 launch");
  }
}

template <int D, bool kPipelined>
Status launch(const FwdParams& p, void* stream) {
  const int smem = (kPipelined ? 4 : 3) * kBlockRows * (D + 8) * int(sizeof(bf16));
  auto* kernel = flash_forward_kernel<D, kPipelined>;
  LATHE_TRY(cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                       "cudaFuncSetAttribute(flash_forward)"));
  const dim3 grid((p.max_q + kBlockRows - 1) / kBlockRows, p.n_head, p.cu ? p.n_docs : 1);
  kernel<<<grid, kThreads, smem, static_cast<cudaStream_t>(stream)>>>(p);
  return cuda_check(cudaGetLastError(), "flash_forward launch");
}

template <int D>
Status launch_wide(const FwdParams& p, void* stream) {
  const int smem = 6 * kBlockRows * (D + 8) * int(sizeof(bf16));
  auto* kernel = flash_forward_wide_kernel<D>;
  LATHE_TRY(cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                       "cudaFuncSetAttribute(flash_forward_wide)"));
  const dim3 grid((p.max_q + 2 * kBlockRows - 1) / (2 * kBlockRows), p.n_head, p.cu ? p.n_docs : 1);
  kernel<<<grid, kThreads, smem, static_cast<cudaStream_t>(stream)>>>(p);
  return cuda_check(cudaGetLastError(), "flash_forward_wide launch");
}

}  // namespace

// The kernel for head_dim d when simple is not set: the fields, else
// kernels, else LATHE_ATTN_FWD (read once; wgmma and ws only where they
// run), else the compiled default.
// "ws-persistent" sets p.ws_persistent where the call left it open.
Result<AttnFwdKernels> resolve_kernels(FwdParams& p, int d) {
  if (p.wgmma) return AttnFwdKernels::kWgmma;
  if (p.warp_rows != 0) return AttnFwdKernels::kMma;
  if (p.kernels != AttnFwdKernels::kAuto) return p.kernels;
  static const std::string named = env::attn_fwd_kernels();
  if (named == "mma") return AttnFwdKernels::kMma;
  if (named == "wgmma" || named == "ws" || named == "ws-persistent") {
    if (!sm90_supported(d)) return AttnFwdKernels::kMma;
    if (named == "ws-persistent" && p.ws_persistent < 0) p.ws_persistent = 1;
    return named == "wgmma" ? AttnFwdKernels::kWgmma : AttnFwdKernels::kWs;
  }
  if (!named.empty()) return invalid_argument("LATHE_ATTN_FWD='", named, "' (mma, wgmma, ws or ws-persistent)");
  if (LATHE_ATTN_FWD_WS_AUTO && sm90_supported(d)) return AttnFwdKernels::kWs;
  if (LATHE_ATTN_FWD_SM90_AUTO && d == 64 && p.cu && sm90_supported(d)) return AttnFwdKernels::kWgmma;
  return AttnFwdKernels::kMma;
}

Status launch_flash_forward(const FwdParams& given, void* stream) {
  if (given.max_q <= 0) return Status::ok();
  FwdParams p = given;
  const int warp_rows = p.warp_rows != 0 ? p.warp_rows : LATHE_ATTN_FWD_WARP_ROWS;
  return with_head_dim(p.head_dim, [&](auto d) -> Status {
    constexpr int D = decltype(d)::value;
    if (p.simple) return launch<D, false>(p, stream);
    LATHE_ASSIGN_OR_RETURN(const AttnFwdKernels kernels, resolve_kernels(p, D));
    if (kernels == AttnFwdKernels::kWgmma || kernels == AttnFwdKernels::kWs) {
      if (!sm90_supported(D))
        return unsupported("attention forward: the ", kernels == AttnFwdKernels::kWs ? "warp-specialized" : "wgmma",
                           " kernel needs a Hopper device and head_dim 64 or 128 (head_dim ", D, ")");
      if (kernels == AttnFwdKernels::kWs) return launch_forward_ws(p, stream);
      const int rows = p.wgmma_rows != 0 ? p.wgmma_rows : LATHE_ATTN_FWD_SM90_ROWS;
      return rows == 128 ? launch_sm90<D, 2>(p, stream) : launch_sm90<D, 1>(p, stream);
    }
    return warp_rows == 32 ? launch_wide<D>(p, stream) : launch<D, true>(p, stream);
  });
}

}  // namespace attn

namespace {
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
}  // namespace

Status attention_varlen_forward(const AttentionVarlenFwdArgs& a) {
  if (!attn::head_dim_compiled(a.head_dim))
    return unsupported("attention_varlen_forward: head_dim ", a.head_dim,
                       " is not compiled (" LATHE_ATTN_HEAD_DIMS " are)");
  if (a.n_head <= 0 || a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0)
    return invalid_argument("attention_varlen_forward: n_head ", a.n_head, " is not a multiple of n_head_kv ",
                            a.n_head_kv);
  if (a.n_docs < 0 || a.max_seqlen < 0 || a.n_tokens < 0 || a.window < 0)
    return invalid_argument("attention_varlen_forward: negative n_docs, max_seqlen, n_tokens or window");
  if (a.warp_rows != 0 && a.warp_rows != 16 && a.warp_rows != 32)
    return invalid_argument("attention_varlen_forward: warp_rows ", a.warp_rows, " (0, 16 or 32)");
  if (a.wgmma_rows != 0 && a.wgmma_rows != 64 && a.wgmma_rows != 128)
    return invalid_argument("attention_varlen_forward: wgmma_rows ", a.wgmma_rows, " (0, 64 or 128)");
  if (a.ws_rows != 0 && a.ws_rows != 128 && !(a.ws_rows == 192 && a.head_dim == 64))
    return invalid_argument("attention_varlen_forward: ws_rows ", a.ws_rows, " (0, 128, or 192 at head_dim 64)");
  if (a.ws_keys != 0 && a.ws_keys != 64 && a.ws_keys != 128)
    return invalid_argument("attention_varlen_forward: ws_keys ", a.ws_keys, " (0, 64 or 128)");
  if (a.n_tokens == 0 || a.n_docs == 0) return Status::ok();
  if (a.max_seqlen == 0)
    return invalid_argument("attention_varlen_forward: max_seqlen is 0 with ", a.n_tokens, " tokens");
  if (!a.q || !a.k || !a.v || !a.out || !a.cu_seqlens)
    return invalid_argument("attention_varlen_forward: q, k, v, out and cu_seqlens must be set");
  if (!aligned16(a.q) || !aligned16(a.k) || !aligned16(a.v) || !aligned16(a.out))
    return invalid_argument("attention_varlen_forward: q, k, v and out must be 16-byte aligned");
  if (a.ld_out != 0 && (a.ld_out < int64_t(a.n_head) * a.head_dim || a.ld_out % 2 != 0))
    return invalid_argument("attention_varlen_forward: ld_out ", a.ld_out, " (even, at least n_head·head_dim = ",
                            int64_t(a.n_head) * a.head_dim, ")");
  attn::FwdParams p{static_cast<const attn::bf16*>(a.q), static_cast<const attn::bf16*>(a.k),
                    static_cast<const attn::bf16*>(a.v), static_cast<attn::bf16*>(a.out), a.lse, a.cu_seqlens,
                    a.n_docs, a.max_seqlen, 0, 0, a.n_head, a.n_head_kv, a.head_dim, a.window, a.scale, a.simple,
                    a.warp_rows, a.wgmma, a.wgmma_rows, a.ld_out, a.n_tokens, a.ws_rows, a.ws_keys, a.kernels,
                    a.ws_persistent};
  return attn::launch_flash_forward(p, a.stream);
}

}  // namespace lathe::cuda
