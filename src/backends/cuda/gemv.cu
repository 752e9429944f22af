// The decode step's skinny GEMM (decode_ops.h): out = x·Wᵀ for 1..16 rows
// of x. Memory-bound: the weights are read once, so the kernel is shaped to
// keep every SM's loads in flight, not to reuse data.
//
// A block of 256 threads owns R weight rows (8 for 1-2 input rows, 4 for
// 3-4, 2 above, to bound registers: more rows, more bytes in flight per
// thread) and splits their k dimension over all its
// threads: thread t reads 16-byte chunks t, t + 256, ... of each of its
// rows (no L1 allocation: each weight byte is used once; the next chunk's
// loads are issued before this chunk's arithmetic, and the first ones
// before waiting for the previous kernel under `overlap`) and the matching
// chunks of every x row (cached: all blocks share x), accumulating
// kRows × B dot products in f32. The block then sums each product over its
// threads (warp shuffles, then shared memory) and the first kRows·B threads
// apply the epilogue, so every output element is written by one thread (the
// residual add needs no atomics). Grid: ⌈n / kRows⌉ blocks, ~770 for a
// 3072-row projection: all SMs busy with several blocks each.
//
// From 5 rows on (k a multiple of 32) f32 FMAs would cost as much time as
// the weight reads, so the products go to the tensor cores instead
// (mma.sync m16n8k16, bf16 in, f32 accumulate): a block owns 16 weight rows
// and its 8 warps split k, each taking 32 k per step. The sum over k does
// not care in which order k is taken, so lane (g, t) loads 16 contiguous
// bytes, k 8t..8t+7 of the step, of weight rows g and g + 8 and of x rows
// g (and g + 8), and the step's two k16 instructions read those bytes as
// their fragment slots {2t, 2t+1, 2t+8, 2t+9}: the same k for the weight
// (A) and x (B) operands, so every product pairs the right elements. The
// warps' 16 × rows partial sums meet in shared memory for the epilogue.
//
// With x_f32 the input is f32 and, on the CUDA cores, used unrounded; with
// norm_w too its rows are RMSNorm'd in the kernel (the norm before a
// projection costs no launch of its own): after its first weight loads each
// block sums the squares of its input rows (a few KB, in L1 for every block
// on the SM after the first), then makes every x chunk from the f32 row,
// the row's rstd and the norm weights. The tensor cores round such inputs
// to bf16 as they load them.
#include <algorithm>
#include <type_traits>

#include <cuda_bf16.h>

#include "backends/cuda/context_impl.h"
#include "backends/cuda/decode_launch.cuh"
#include "backends/cuda/decode_ops.h"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxRows = 16;  // x rows per launch

bool swiglu(GemvEpilogue e) { return e == GemvEpilogue::kSwigluBf16 || e == GemvEpilogue::kSwigluF32; }

__device__ __forceinline__ uint4 ld_streaming(const bf16_bits* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
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
__device__ __forceinline__ uint4 load_weights(const bf16_bits* w_row, bool valid, int64_t c, int64_t n_chunks) {
  return valid && c < n_chunks ? ld_streaming(w_row + c * 8) : make_uint4(0, 0, 0, 0);
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// 8 inputs of row b from element off, as floats: the bf16 x, or x_f32
// (times the row's rstd and the norm weights when norm_w is set), unrounded.
__device__ __forceinline__ void x_chunk(const GemvArgs& a, int b, int64_t off, float rstd, float* xf) {
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
  for (int i = 0; i < 8; ++i) xf[i] = xf[i] * rstd * w[i];
}
// The same chunk as 8 bf16 for the tensor cores (an f32 input is rounded here).
__device__ __forceinline__ uint4 x_chunk_bf16(const GemvArgs& a, int b, int64_t off, float rstd) {
  if (!a.x_f32) return __ldg(reinterpret_cast<const uint4*>(a.x + int64_t(b) * a.k + off));
  float xf[8];
  x_chunk(a, b, off, rstd, xf);
  return make_uint4(pack_bf16x2(xf[0], xf[1]), pack_bf16x2(xf[2], xf[3]), pack_bf16x2(xf[4], xf[5]),
                    pack_bf16x2(xf[6], xf[7]));
}

// With norm_w: rstd of input rows 0..B−1 (those < rows) into s_rstd, the
// whole block summing each row's squares in the same order whatever B is.
template <int B>
__device__ void rows_rstd(const GemvArgs& a, int rows, float (*s_ss)[B], float* s_rstd) {
  float ss[B];
#pragma unroll
  for (int b = 0; b < B; ++b) {
    ss[b] = 0.0f;
    if (b >= rows) continue;
    const float* row = a.x_f32 + int64_t(b) * a.k;
    for (int64_t i = int64_t(threadIdx.x) * 4; i < a.k; i += kThreads * 4) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(row + i));
      ss[b] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int b = 0; b < B; ++b) {
    const float s = dev::warp_sum(ss[b]);
    if (lane == 0) s_ss[warp][b] = s;
  }
  __syncthreads();
  if (threadIdx.x < B) {
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += s_ss[w][threadIdx.x];
    s_rstd[threadIdx.x] = rsqrtf(total / static_cast<float>(a.k) + a.eps);
  }
  __syncthreads();
}

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

// The epilogues: output (row b, column j) from its dot product(s).
template <GemvEpilogue E>
__device__ __forceinline__ void store_out(const GemvArgs& a, int b, int64_t j, float v) {
  if (a.bias) v += dev::ld(a.bias, j);
  const int64_t o = int64_t(b) * a.n + j;
  if constexpr (E == GemvEpilogue::kStoreBf16) {
    dev::st(static_cast<bf16_bits*>(a.out), o, v);
  } else if constexpr (E == GemvEpilogue::kStoreF32) {
    static_cast<float*>(a.out)[o] = v;
  } else {
    static_cast<float*>(a.out)[o] += v;
  }
}
template <GemvEpilogue E>
__device__ __forceinline__ void store_swiglu(const GemvArgs& a, int b, int64_t j, float gate, float up) {
  if (a.bias) {
    gate += dev::ld(a.bias, j);
    up += dev::ld(a.bias, a.n + j);
  }
  const float v = silu(gate) * up;
  if constexpr (E == GemvEpilogue::kSwigluF32) {
    static_cast<float*>(a.out)[int64_t(b) * a.n + j] = v;
  } else {
    dev::st(static_cast<bf16_bits*>(a.out), int64_t(b) * a.n + j, v);
  }
}
template <GemvEpilogue E>
constexpr bool is_swiglu() {
  return E == GemvEpilogue::kSwigluBf16 || E == GemvEpilogue::kSwigluF32;
}

template <int B>
constexpr int rows_per_block() {
  return B <= 2 ? 8 : B <= 4 ? 4 : 2;
}

// Weight row of the block's slot r, or −1 past the end.
template <int R, GemvEpilogue E>
__device__ __forceinline__ int64_t weight_row(int64_t n, int r) {
  if constexpr (is_swiglu<E>()) {
    constexpr int kHalf = R / 2;  // slots [0, R/2) gate rows, [R/2, R) the matching up rows
    const int64_t j = int64_t(blockIdx.x) * kHalf + (r % kHalf);
    if (j >= n) return -1;
    return r < kHalf ? j : n + j;
  } else {
    const int64_t j = int64_t(blockIdx.x) * R + r;
    return j < n ? j : -1;
  }
}

template <int B, GemvEpilogue E>
__global__ void __launch_bounds__(kThreads) gemv_kernel(GemvArgs a) {
  constexpr int R = rows_per_block<B>();
  __shared__ float s_part[kWarps][R * B];
  __shared__ float s_ss[kWarps][B];
  __shared__ float s_rstd[B];
  int64_t row[R];  // indexed by constants only (unrolled), so they stay in registers
  const bf16_bits* w_row[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    row[r] = weight_row<R, E>(a.n, r);
    w_row[r] = a.w + (row[r] < 0 ? 0 : row[r]) * a.k;
  }
  const int rows = static_cast<int>(a.rows);
  float acc[R][B];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int b = 0; b < B; ++b) acc[r][b] = 0.0f;

  const int64_t n_chunks = a.k / 8;
  uint4 w_next[R];  // the weights of chunk c, loaded one iteration ahead
  allow_next_grid();
  // Weights never depend on the previous kernel: the first loads go out before waiting for it.
#pragma unroll
  for (int r = 0; r < R; ++r) w_next[r] = load_weights(w_row[r], row[r] >= 0, threadIdx.x, n_chunks);
  wait_prior_grid();
  float rstd[B];
  if (a.norm_w) rows_rstd<B>(a, rows, s_ss, s_rstd);
#pragma unroll
  for (int b = 0; b < B; ++b) rstd[b] = a.norm_w && b < rows ? s_rstd[b] : 0.0f;
  for (int64_t c = threadIdx.x; c < n_chunks; c += kThreads) {
    float xf[B][8];
#pragma unroll
    for (int b = 0; b < B; ++b)
      if (b < rows) x_chunk(a, b, c * 8, rstd[b], xf[b]);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float wf[8];
      unpack8(w_next[r], wf);
      w_next[r] = load_weights(w_row[r], row[r] >= 0, c + kThreads, n_chunks);
#pragma unroll
      for (int b = 0; b < B; ++b) {
        if (b >= rows) break;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[r][b] = fmaf(wf[i], xf[b][i], acc[r][b]);
      }
    }
  }

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int b = 0; b < B; ++b) {
      const float s = dev::warp_sum(acc[r][b]);
      if (lane == 0) s_part[warp][r * B + b] = s;
    }
  __syncthreads();

  const int t = threadIdx.x;
  if (t >= R * B) return;
  const int r = t / B, b = t % B;
  if (b >= rows) return;
  auto total = [&](int rr) {
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += s_part[w][rr * B + b];
    return s;
  };
  const int64_t j = weight_row<R, E>(a.n, r);  // kSwigluBf16: a gate row, the output column
  if (j < 0) return;
  if constexpr (is_swiglu<E>()) {
    if (r >= R / 2) return;
    store_swiglu<E>(a, b, j, total(r), total(r + R / 2));
  } else {
    store_out<E>(a, b, j, total(r));
  }
}

// ---- Tensor-core path ---------------------------------------------------------

constexpr int kTile = 16;   // weight rows per block
constexpr int kStepK = 32;  // k per warp step
constexpr int kUnroll = 4;  // steps per warp whose loads are in flight together

__device__ __forceinline__ void mma_bf16(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Weight row of tile row r (0..15), or −1 past the end. kSwigluBf16: rows
// 0..7 are gate rows, 8..15 the matching up rows.
template <GemvEpilogue E>
__device__ __forceinline__ int64_t tile_row(int64_t n, int r) {
  if constexpr (is_swiglu<E>()) {
    const int64_t j = int64_t(blockIdx.x) * (kTile / 2) + (r % (kTile / 2));
    if (j >= n) return -1;
    return r < kTile / 2 ? j : n + j;
  } else {
    const int64_t j = int64_t(blockIdx.x) * kTile + r;
    return j < n ? j : -1;
  }
}

// NT: n-tiles of 8 x rows (1: up to 8 rows, 2: up to 16).
template <int NT, GemvEpilogue E>
__global__ void __launch_bounds__(kThreads) gemv_mma_kernel(GemvArgs a) {
  constexpr int kB = 8 * NT;
  __shared__ float s_c[kWarps][kTile][kB];
  __shared__ float s_ss[kWarps][kB];
  __shared__ float s_rstd[kB];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int rows = static_cast<int>(a.rows);
  const int64_t row_lo = tile_row<E>(a.n, g), row_hi = tile_row<E>(a.n, g + 8);
  const bf16_bits* w_lo = a.w + (row_lo < 0 ? 0 : row_lo) * a.k + 8 * t;
  const bf16_bits* w_hi = a.w + (row_hi < 0 ? 0 : row_hi) * a.k + 8 * t;
  const bool x_lo_ok = g < rows, x_hi_ok = NT == 2 && g + 8 < rows;
  const int n_steps = static_cast<int>(a.k / kStepK);
  float c[NT][4] = {};
  uint4 wl[kUnroll], wh[kUnroll];
  auto load_w = [&](int s0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int step = s0 + u * kWarps;
      wl[u] = load_weights(w_lo, row_lo >= 0, int64_t(step) * (kStepK / 8), int64_t(n_steps) * (kStepK / 8));
      wh[u] = load_weights(w_hi, row_hi >= 0, int64_t(step) * (kStepK / 8), int64_t(n_steps) * (kStepK / 8));
    }
  };
  allow_next_grid();
  load_w(warp);  // weights never depend on the previous kernel
  wait_prior_grid();
  if (a.norm_w) rows_rstd<kB>(a, rows, s_ss, s_rstd);
  const float r_lo = a.norm_w && x_lo_ok ? s_rstd[g] : 0.0f, r_hi = a.norm_w && x_hi_ok ? s_rstd[g + 8] : 0.0f;
  for (int s0 = warp; s0 < n_steps; s0 += kWarps * kUnroll) {
    if (s0 != warp) load_w(s0);
    uint4 xl[kUnroll], xh[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int step = s0 + u * kWarps;
      const int64_t off = int64_t(step) * kStepK + 8 * t;
      xl[u] = x_lo_ok && step < n_steps ? x_chunk_bf16(a, g, off, r_lo) : make_uint4(0, 0, 0, 0);
      xh[u] = x_hi_ok && step < n_steps ? x_chunk_bf16(a, g + 8, off, r_hi) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (s0 + u * kWarps >= n_steps) break;  // the same for the whole warp
      mma_bf16(c[0], wl[u].x, wh[u].x, wl[u].y, wh[u].y, xl[u].x, xl[u].y);
      mma_bf16(c[0], wl[u].z, wh[u].z, wl[u].w, wh[u].w, xl[u].z, xl[u].w);
      if constexpr (NT == 2) {
        mma_bf16(c[1], wl[u].x, wh[u].x, wl[u].y, wh[u].y, xh[u].x, xh[u].y);
        mma_bf16(c[1], wl[u].z, wh[u].z, wl[u].w, wh[u].w, xh[u].z, xh[u].w);
      }
    }
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int b = nt * 8 + 2 * t;
    s_c[warp][g][b] = c[nt][0];
    s_c[warp][g][b + 1] = c[nt][1];
    s_c[warp][g + 8][b] = c[nt][2];
    s_c[warp][g + 8][b + 1] = c[nt][3];
  }
  __syncthreads();
  const int i = threadIdx.x;
  if (i >= kTile * kB) return;
  const int r = i / kB, b = i % kB;
  if (b >= rows) return;
  auto total = [&](int rr) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += s_c[w][rr][b];
    return sum;
  };
  const int64_t j = tile_row<E>(a.n, r);
  if (j < 0) return;
  if constexpr (is_swiglu<E>()) {
    if (r >= kTile / 2) return;
    store_swiglu<E>(a, b, j, total(r), total(r + kTile / 2));
  } else {
    store_out<E>(a, b, j, total(r));
  }
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
  }
  return cudaErrorInvalidValue;
}

template <int NT>
cudaError_t launch_mma(const GemvArgs& a, cudaStream_t st) {
  const int64_t per_block = swiglu(a.epilogue) ? kTile / 2 : kTile;
  const dim3 grid(static_cast<unsigned>((a.n + per_block - 1) / per_block));
  return with_epilogue(a.epilogue, [&](auto e) {
    return launch_overlapped(gemv_mma_kernel<NT, decltype(e)::value>, grid, kThreads, st, a.overlap, a);
  });
}

template <int B>
cudaError_t launch_rows(const GemvArgs& a, cudaStream_t st) {
  constexpr int R = rows_per_block<B>();
  const int64_t slots = swiglu(a.epilogue) ? R / 2 : R;
  const dim3 grid(static_cast<unsigned>((a.n + slots - 1) / slots));
  return with_epilogue(a.epilogue, [&](auto e) {
    return launch_overlapped(gemv_kernel<B, decltype(e)::value>, grid, kThreads, st, a.overlap, a);
  });
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

bool gemv_supports(const bf16_bits* x, const bf16_bits* w, int64_t k) {
  return k > 0 && k % 8 == 0 && aligned16(x) && aligned16(w);
}

Status gemv(CudaContext& ctx, const GemvArgs& a) {
  if (a.rows < 0 || a.n <= 0 || a.k <= 0) return invalid_argument("cuda gemv: bad shape ", a.rows, "x", a.n, "x", a.k);
  if ((!a.x && !a.x_f32) || !a.w || !a.out) return invalid_argument("cuda gemv: null argument");
  if (a.norm_w && !a.x_f32) return invalid_argument("cuda gemv: norm_w goes with x_f32");
  if (!gemv_supports(a.x_f32 ? a.w : a.x, a.w, a.k) || (a.x_f32 && !aligned16(a.x_f32)) ||
      (a.norm_w && !aligned16(a.norm_w)))
    return invalid_argument("cuda gemv: k (", a.k, ") must be a multiple of 8 and x, w 16-byte aligned");
  if (a.n > int64_t(kThreads) * 0x7fffffff) return invalid_argument("cuda gemv: n ", a.n, " is too large");
  const size_t out_elem = a.epilogue == GemvEpilogue::kStoreBf16 || a.epilogue == GemvEpilogue::kSwigluBf16
                              ? sizeof(bf16_bits)
                              : sizeof(float);
  cudaStream_t st = stream_of(ctx);
  for (int64_t r0 = 0; r0 < a.rows; r0 += kMaxRows) {
    GemvArgs c = a;
    c.rows = std::min<int64_t>(kMaxRows, a.rows - r0);
    if (a.x_f32) c.x_f32 = a.x_f32 + r0 * a.k;
    else c.x = a.x + r0 * a.k;
    c.out = static_cast<char*>(a.out) + r0 * a.n * out_elem;
    cudaError_t err;
    if (c.rows > 4 && a.k % kStepK == 0) err = c.rows <= 8 ? launch_mma<1>(c, st) : launch_mma<2>(c, st);
    else if (c.rows == 1) err = launch_rows<1>(c, st);
    else if (c.rows == 2) err = launch_rows<2>(c, st);
    else if (c.rows <= 4) err = launch_rows<4>(c, st);
    else if (c.rows <= 8) err = launch_rows<8>(c, st);
    else err = launch_rows<16>(c, st);
    LATHE_TRY(cuda_check(err, "gemv launch"));
  }
  return ctx.check_launch("gemv");
}

}  // namespace lathe::cuda
