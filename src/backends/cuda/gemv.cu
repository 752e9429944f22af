// The decode step's skinny GEMM (decode_ops.h): out = x·Wᵀ for 1..16 rows
// of x. Memory-bound: the weights are read once, so the kernel is shaped to
// keep every SM's loads in flight, not to reuse data.
//
// A block of 256 threads owns kRows weight rows (4 up to 4 input rows, 2
// above, to bound registers) and splits their k dimension over all its
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
#include <algorithm>

#include "backends/cuda/context_impl.h"
#include "backends/cuda/decode_launch.cuh"
#include "backends/cuda/decode_ops.h"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxRows = 16;  // x rows per launch

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

__device__ __forceinline__ float silu(float g) { return g / (1.0f + __expf(-g)); }

template <int B>
constexpr int rows_per_block() {
  return B <= 4 ? 4 : 2;
}

// Weight row of the block's slot r, or −1 past the end.
template <int R, GemvEpilogue E>
__device__ __forceinline__ int64_t weight_row(int64_t n, int r) {
  if constexpr (E == GemvEpilogue::kSwigluBf16) {
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
  for (int64_t c = threadIdx.x; c < n_chunks; c += kThreads) {
    float wf[R][8];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      unpack8(w_next[r], wf[r]);
      w_next[r] = load_weights(w_row[r], row[r] >= 0, c + kThreads, n_chunks);
    }
#pragma unroll
    for (int b = 0; b < B; ++b) {
      if (b >= rows) break;
      float xf[8];
      unpack8(__ldg(reinterpret_cast<const uint4*>(a.x + int64_t(b) * a.k + c * 8)), xf);
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[r][b] = fmaf(wf[r][i], xf[i], acc[r][b]);
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
  if constexpr (E == GemvEpilogue::kSwigluBf16) {
    constexpr int kHalf = R / 2;
    const int64_t j = weight_row<R, E>(a.n, r);  // a gate row: the output column
    if (r >= kHalf || j < 0) return;
    float g = total(r), u = total(r + kHalf);
    if (a.bias) {
      g += dev::ld(a.bias, j);
      u += dev::ld(a.bias, a.n + j);
    }
    dev::st(static_cast<bf16_bits*>(a.out), int64_t(b) * a.n + j, silu(g) * u);
  } else {
    const int64_t j = weight_row<R, E>(a.n, r);
    if (j < 0) return;
    float v = total(r);
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
}

template <int B>
cudaError_t launch_rows(const GemvArgs& a, cudaStream_t st) {
  constexpr int R = rows_per_block<B>();
  const int64_t slots = a.epilogue == GemvEpilogue::kSwigluBf16 ? R / 2 : R;
  const dim3 grid(static_cast<unsigned>((a.n + slots - 1) / slots));
  switch (a.epilogue) {
    case GemvEpilogue::kStoreBf16:
      return launch_overlapped(gemv_kernel<B, GemvEpilogue::kStoreBf16>, grid, kThreads, st, a.overlap, a);
    case GemvEpilogue::kStoreF32:
      return launch_overlapped(gemv_kernel<B, GemvEpilogue::kStoreF32>, grid, kThreads, st, a.overlap, a);
    case GemvEpilogue::kAddF32:
      return launch_overlapped(gemv_kernel<B, GemvEpilogue::kAddF32>, grid, kThreads, st, a.overlap, a);
    case GemvEpilogue::kSwigluBf16:
      return launch_overlapped(gemv_kernel<B, GemvEpilogue::kSwigluBf16>, grid, kThreads, st, a.overlap, a);
  }
  return cudaErrorInvalidValue;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

bool gemv_supports(const bf16_bits* x, const bf16_bits* w, int64_t k) {
  return k > 0 && k % 8 == 0 && aligned16(x) && aligned16(w);
}

Status gemv(CudaContext& ctx, const GemvArgs& a) {
  if (a.rows < 0 || a.n <= 0 || a.k <= 0) return invalid_argument("cuda gemv: bad shape ", a.rows, "x", a.n, "x", a.k);
  if (!a.x || !a.w || !a.out) return invalid_argument("cuda gemv: null argument");
  if (!gemv_supports(a.x, a.w, a.k))
    return invalid_argument("cuda gemv: k (", a.k, ") must be a multiple of 8 and x, w 16-byte aligned");
  if (a.n > int64_t(kThreads) * 0x7fffffff) return invalid_argument("cuda gemv: n ", a.n, " is too large");
  const size_t out_elem = a.epilogue == GemvEpilogue::kStoreBf16 || a.epilogue == GemvEpilogue::kSwigluBf16
                              ? sizeof(bf16_bits)
                              : sizeof(float);
  cudaStream_t st = stream_of(ctx);
  for (int64_t r0 = 0; r0 < a.rows; r0 += kMaxRows) {
    GemvArgs c = a;
    c.rows = std::min<int64_t>(kMaxRows, a.rows - r0);
    c.x = a.x + r0 * a.k;
    c.out = static_cast<char*>(a.out) + r0 * a.n * out_elem;
    cudaError_t err;
    if (c.rows == 1) err = launch_rows<1>(c, st);
    else if (c.rows == 2) err = launch_rows<2>(c, st);
    else if (c.rows <= 4) err = launch_rows<4>(c, st);
    else if (c.rows <= 8) err = launch_rows<8>(c, st);
    else err = launch_rows<16>(c, st);
    LATHE_TRY(cuda_check(err, "gemv launch"));
  }
  return ctx.check_launch("gemv");
}

}  // namespace lathe::cuda
