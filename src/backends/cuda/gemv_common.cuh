// Device helpers shared by the skinny GEMM's kernels (gemv.cu, gemv_bulk.cu):
// the streaming weight loads, the x chunks (bf16, f32, RMSNorm'd in the
// kernel), the epilogues and the mapping of a block's slots to weight rows.
// Kept in one header so every kernel computes an output element the same
// way; the launchers' shared bits (SM count, epilogue dispatch) too. Not
// part of the backend's interface.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>

#include "backends/cuda/context_impl.h"
#include "backends/cuda/decode_ops.h"

namespace lathe::cuda::gemv_detail {

inline bool paired(GemvEpilogue e) {
  return e == GemvEpilogue::kSwigluBf16 || e == GemvEpilogue::kSwigluF32 || e == GemvEpilogue::kRopeAppend;
}

// The L2 policy of the weight loads: evict first. Each weight byte is read
// once per step and the weights outgrow L2 many times over, so their lines
// are the ones to give up, not the activations or the KV cache.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ uint4 ld_streaming(const bf16_bits* p, uint64_t policy) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
  return v;
}

// 8 bf16 packed in a uint4 → 8 floats (bf16 is the high half of an f32).
__device__ __forceinline__ void unpack8(const uint4& v, float* f) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(u[i] << 16);
    f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}

// Chunk c (8 elements) of a weight row, zeros past the row's end or for a missing row.
__device__ __forceinline__ uint4 load_weights(const bf16_bits* w_row, bool valid, int64_t c, int64_t n_chunks,
                                              uint64_t policy) {
  return valid && c < n_chunks ? ld_streaming(w_row + c * 8, policy) : make_uint4(0, 0, 0, 0);
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// 8 inputs of row b from element off, as floats: the bf16 x, or x_f32
// (times the norm weights when norm_w is set, its squares added to *ss),
// unrounded.
__device__ __forceinline__ void x_chunk(const GemvArgs& a, int b, int64_t off, float* xf, float* ss) {
  if (!a.x_f32) {
    unpack8(__ldg(reinterpret_cast<const uint4*>(a.x + int64_t(b) * a.k + off)), xf);
    return;
  }
  const float4* hp = reinterpret_cast<const float4*>(a.x_f32 + int64_t(b) * a.k + off);
  const float4 h0 = __ldg(hp), h1 = __ldg(hp + 1);
  xf[0] = h0.x, xf[1] = h0.y, xf[2] = h0.z, xf[3] = h0.w, xf[4] = h1.x, xf[5] = h1.y, xf[6] = h1.z, xf[7] = h1.w;
  if (!a.norm_w) return;
  float w[8];
  unpack8(__ldg(reinterpret_cast<const uint4*>(a.norm_w + off)), w);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    *ss = fmaf(xf[i], xf[i], *ss);
    xf[i] *= w[i];
  }
}
// The same chunk as 8 bf16 for the tensor cores (an f32 input is rounded here).
__device__ __forceinline__ uint4 x_chunk_bf16(const GemvArgs& a, int b, int64_t off, float* ss) {
  if (!a.x_f32) return __ldg(reinterpret_cast<const uint4*>(a.x + int64_t(b) * a.k + off));
  float xf[8];
  x_chunk(a, b, off, xf, ss);
  return make_uint4(pack_bf16x2(xf[0], xf[1]), pack_bf16x2(xf[2], xf[3]), pack_bf16x2(xf[4], xf[5]),
                    pack_bf16x2(xf[6], xf[7]));
}

// With norm_w: the factor of x row b's sums, rstd from its per-warp sums of
// squares (added in warp order: the same for any number of rows); else 1.
template <int W>
__device__ __forceinline__ float row_scale(const GemvArgs& a, const float* ss_by_warp, int stride) {
  if (!a.norm_w) return 1.0f;
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < W; ++w) total += ss_by_warp[w * stride];
  return rsqrtf(total / static_cast<float>(a.k) + a.eps);
}

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

template <GemvEpilogue E>
constexpr bool is_swiglu() {
  return E == GemvEpilogue::kSwigluBf16 || E == GemvEpilogue::kSwigluF32;
}
template <GemvEpilogue E>
constexpr bool is_paired() {
  return is_swiglu<E>() || E == GemvEpilogue::kRopeAppend;
}

// The epilogues: output (row b, column j) from its dot product(s). Returns
// the value it stores (kStoreF32: the output itself).
template <GemvEpilogue E>
__device__ __forceinline__ float store_out(const GemvArgs& a, int b, int64_t j, float v) {
  if (a.bias) v += dev::ld(a.bias, j);
  const int64_t o = int64_t(b) * a.n + j;
  if constexpr (E == GemvEpilogue::kStoreBf16) {
    dev::st(static_cast<bf16_bits*>(a.out), o, v);
  } else if constexpr (E == GemvEpilogue::kStoreF32) {
    static_cast<float*>(a.out)[o] = v;
  } else {
    static_cast<float*>(a.out)[o] += v;
  }
  return v;
}
// Paired: j is the pair's first weight row, v1 and v2 the two sums.
template <GemvEpilogue E>
__device__ __forceinline__ void store_pair(const GemvArgs& a, int b, int64_t j, float v1, float v2) {
  if constexpr (is_swiglu<E>()) {
    if (a.bias) {
      v1 += dev::ld(a.bias, j);
      v2 += dev::ld(a.bias, a.n + j);
    }
    const float v = silu(v1) * v2;
    if constexpr (E == GemvEpilogue::kSwigluF32) {
      static_cast<float*>(a.out)[int64_t(b) * a.n + j] = v;
    } else {
      dev::st(static_cast<bf16_bits*>(a.out), int64_t(b) * a.n + j, v);
    }
  } else {
    // RoPE + KV append (rope_append_kernel's arithmetic): head rows p and p + half.
    const GemvRope& r = a.rope;
    const int hd = r.head_dim, half = hd / 2;
    const uint32_t jj = static_cast<uint32_t>(j);  // a row index, below 2^31: 32-bit division
    const int head = static_cast<int>(jj / uint32_t(hd)), p = static_cast<int>(jj % uint32_t(hd));
    if (a.bias) {
      v1 += dev::ld(a.bias, j);
      v2 += dev::ld(a.bias, j + half);
    }
    bf16_bits* dst;
    bool rotate = true;
    if (head < r.n_head) {
      dst = r.q_out + (int64_t(b) * r.n_head + head) * hd;
    } else {
      const int pos = r.pos[b];
      if (pos < 0 || pos >= r.max_ctx) return;
      const bool is_k = head < r.n_head + r.n_head_kv;
      const int hk = head - r.n_head - (is_k ? 0 : r.n_head_kv);
      dst = (is_k ? r.k_caches[b] : r.v_caches[b]) + (int64_t(pos) * r.n_head_kv + hk) * hd;
      rotate = is_k;
    }
    if (!rotate) {
      dev::st(dst, p, v1);
      dev::st(dst, p + half, v2);
      return;
    }
    const float c = r.cos[int64_t(b) * half + p], sn = r.sin[int64_t(b) * half + p];
    dev::st(dst, p, v1 * c - v2 * sn);
    dev::st(dst, p + half, v2 * c + v1 * sn);
  }
}

// Output columns (pairs for the paired epilogues) a grid covers.
__host__ __device__ inline int64_t gemv_columns(const GemvArgs& a) {
  if (a.epilogue == GemvEpilogue::kRopeAppend) return a.n / 2;
  return a.n;
}

// Output columns (pairs for the paired epilogues) per tile of R slots.
template <int R, GemvEpilogue E>
constexpr int64_t tile_columns() {
  return is_paired<E>() ? R / 2 : R;
}

// Weight row of slot r of the tile of R slots whose first output column
// (pair) is u0, or −1 from column u_end on.
template <int R, GemvEpilogue E>
__device__ __forceinline__ int64_t tile_row(const GemvArgs& a, int64_t u0, int64_t u_end, int r) {
  if constexpr (is_paired<E>()) {
    constexpr int kHalf = R / 2;
    const int64_t pair = u0 + (r % kHalf);
    if (pair >= u_end) return -1;
    const bool second = r >= kHalf;
    if constexpr (is_swiglu<E>()) {
      return second ? a.n + pair : pair;
    } else {
      // 32-bit division (a column index, below 2^31): the 64-bit one is a software routine.
      const uint32_t half = static_cast<uint32_t>(a.rope.head_dim) / 2, pr = static_cast<uint32_t>(pair);
      return int64_t(pr / half) * a.rope.head_dim + pr % half + (second ? half : 0);
    }
  } else {
    const int64_t j = u0 + r;
    return j < u_end ? j : -1;
  }
}
// Weight row of slot r of block blockIdx.x owning one tile of R slots.
template <int R, GemvEpilogue E>
__device__ __forceinline__ int64_t slot_row(const GemvArgs& a, int r) {
  return tile_row<R, E>(a, int64_t(blockIdx.x) * tile_columns<R, E>(), gemv_columns(a), r);
}

// The epilogue of slot r of tile (u0, u_end) for x row b, given the tile's
// summed slots. Returns the output column (−1: none) and sets *stored to
// what store_out() stored there (unpaired epilogues).
template <int R, GemvEpilogue E, class Total>
__device__ __forceinline__ int64_t finish_tile_slot(const GemvArgs& a, int64_t u0, int64_t u_end, int r, int b,
                                                    float scale, Total&& total, float* stored = nullptr) {
  const int64_t j = tile_row<R, E>(a, u0, u_end, r);
  if (j < 0) return -1;
  if constexpr (is_paired<E>()) {
    if (r >= R / 2) return -1;
    store_pair<E>(a, b, j, total(r) * scale, total(r + R / 2) * scale);
  } else {
    const float v = store_out<E>(a, b, j, total(r) * scale);
    if (stored) *stored = v;
  }
  return j;
}
// The same for block blockIdx.x's one tile.
template <int R, GemvEpilogue E, class Total>
__device__ __forceinline__ void finish_slot(const GemvArgs& a, int r, int b, float scale, Total&& total) {
  finish_tile_slot<R, E>(a, int64_t(blockIdx.x) * tile_columns<R, E>(), gemv_columns(a), r, b, scale, total);
}

// ---- L2 prefetch of the next GEMV's first units (GemvPrefetch) ----------------

// The ring's tile (kBulkRows = 8 weight rows) and stage (k per unit), as gemv_ring.cuh.
constexpr int kPrefetchTileRows = 8, kPrefetchStageK = 2048;

// Weight row of slot r (of 8) of p's tile of output columns [u0, u_end), or
// −1: tile_row<8, E>() for the run-time epilogue p.epilogue.
__host__ __device__ inline int64_t prefetch_row(const GemvPrefetch& p, int64_t u0, int64_t u_end, int r) {
  const bool swiglu = p.epilogue == GemvEpilogue::kSwigluBf16 || p.epilogue == GemvEpilogue::kSwigluF32;
  if (!swiglu && p.epilogue != GemvEpilogue::kRopeAppend) return u0 + r < u_end ? u0 + r : -1;
  constexpr int kHalf = kPrefetchTileRows / 2;
  const int64_t pair = u0 + r % kHalf;
  if (pair >= u_end) return -1;
  const bool second = r >= kHalf;
  if (swiglu) return second ? p.n + pair : pair;
  const int half = p.head_dim / 2;
  return (pair / half) * p.head_dim + pair % half + (second ? half : 0);
}

// Calls f(byte offset into p.w, bytes) for item i = first, first + step, ...
// of the rows and stages that block `block` of a grid of `grid` blocks
// prefetches: the first p.units units (in the ring's order: a tile's
// stages, then the next tile) of each of the next GEMV's blocks
// [p.grid·block / grid, p.grid·(block + 1) / grid).
template <class F>
__host__ __device__ void for_prefetch_rows(const GemvPrefetch& p, int64_t block, int64_t grid, int first, int step,
                                           F&& f) {
  if (!p.w || p.units <= 0 || p.grid <= 0 || grid <= 0) return;
  const bool paired = p.epilogue == GemvEpilogue::kSwigluBf16 || p.epilogue == GemvEpilogue::kSwigluF32 ||
                      p.epilogue == GemvEpilogue::kRopeAppend;
  const int64_t columns = p.epilogue == GemvEpilogue::kRopeAppend ? p.n / 2 : p.n;
  const int64_t tile_cols = paired ? kPrefetchTileRows / 2 : kPrefetchTileRows;
  const int64_t k_stages = (p.k + kPrefetchStageK - 1) / kPrefetchStageK;
  const int64_t j0 = p.grid * block / grid, j1 = p.grid * (block + 1) / grid;
  const int64_t per_block = int64_t(p.units) * kPrefetchTileRows;
  for (int64_t i = first; i < (j1 - j0) * per_block; i += step) {
    const int64_t j = j0 + i / per_block, unit = i % per_block / kPrefetchTileRows;
    const int r = static_cast<int>(i % kPrefetchTileRows);
    const int64_t c_begin = columns * j / p.grid, c_end = columns * (j + 1) / p.grid;
    const int64_t u0 = c_begin + unit / k_stages * tile_cols, k0 = unit % k_stages * kPrefetchStageK;
    if (u0 >= c_end) continue;
    const int64_t row = prefetch_row(p, u0, u0 + tile_cols < c_end ? u0 + tile_cols : c_end, r);
    if (row < 0) continue;
    const int64_t k_left = p.k - k0;
    f((row * p.k + k0) * 2, (k_left < kPrefetchStageK ? k_left : kPrefetchStageK) * 2);
  }
}

inline int sm_count(int device) {
  static int counts[64] = {};  // by device; a racing first fill writes the same value
  if (device < 0 || device >= 64) return 132;
  if (counts[device] == 0) {
    int n = 0;
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
    counts[device] = n > 0 ? n : 132;
  }
  return counts[device];
}

// Whether the device has the bulk copies of the shared-memory ring (sm_90+).
inline bool has_bulk_copies(int device) {
  static int major[64] = {};  // by device; a racing first fill writes the same value
  if (device < 0 || device >= 64) return false;
  if (major[device] == 0) {
    int m = 0;
    cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, device);
    major[device] = m > 0 ? m : -1;
  }
  return major[device] >= 9;
}

// Calls f(std::integral_constant<GemvEpilogue, E>{}) for the run-time
// epilogue e, so each launcher below names its kernel template once.
template <class F>
cudaError_t with_epilogue(GemvEpilogue e, F&& f) {
  using E = GemvEpilogue;
  switch (e) {
    case E::kStoreBf16: return f(std::integral_constant<E, E::kStoreBf16>{});
    case E::kStoreF32: return f(std::integral_constant<E, E::kStoreF32>{});
    case E::kAddF32: return f(std::integral_constant<E, E::kAddF32>{});
    case E::kSwigluBf16: return f(std::integral_constant<E, E::kSwigluBf16>{});
    case E::kSwigluF32: return f(std::integral_constant<E, E::kSwigluF32>{});
    case E::kRopeAppend: return f(std::integral_constant<E, E::kRopeAppend>{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace lathe::cuda::gemv_detail
