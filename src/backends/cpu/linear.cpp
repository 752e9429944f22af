// Linear on the CPU. Two paths:
//  - GEMV (n <= kLinearGemvMaxRows, decode): each weight row is streamed once
//    from memory in its own dtype, widened to f32 in registers and applied to
//    every token. Rows are split across threads; this path is bound by memory
//    bandwidth, so nothing else touches the weights.
//  - GEMM (prefill): OpenBLAS sgemm. Half-precision weights are widened
//    kLinearTileRows rows at a time into the caller's workspace.
// Bias and the accumulate flag (residual add) are applied in the epilogue:
// y = (accumulate ? y : 0) + (x·wᵀ + bias).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <span>

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/simd.h"
#include "core/parallel.h"

namespace lathe::cpu {
namespace {

constexpr int kPrefetchBytes = 768;

struct Gemv {
  const float* x;     // [n, in]
  const void* w;      // [out, in]
  DType wt;
  const void* bias;   // [out] or null
  DType bt;
  float* y;           // [n, out]
  int64_t n, in, out;
  bool accumulate;

  void store(int64_t t, int64_t r, float dot) const {
    float v = bias ? dot + simd::to_f32(bias, bt, r) : dot;
    float* dst = y + t * out + r;
    *dst = accumulate ? *dst + v : v;
  }
};

template <class W>
LATHE_AVX2 inline __m256 load_w(const W* p, DType dt) {
  if constexpr (std::is_same_v<W, float>) {
    return simd::load8(p);
  } else {
    return simd::load8(p, dt);
  }
}

// N tokens x R rows of w per step: N*R independent accumulators.
template <class W, int N, int R>
LATHE_AVX2 void gemv_block_avx2(const Gemv& g, int64_t r0) {
  const W* w = static_cast<const W*>(g.w) + r0 * g.in;
  __m256 acc[N][R];
  for (int t = 0; t < N; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= g.in; k += 8) {
    __m256 wv[R];
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(w + r * g.in + k) + kPrefetchBytes, _MM_HINT_T0);
      wv[r] = load_w(w + r * g.in + k, g.wt);
    }
    for (int t = 0; t < N; ++t) {
      __m256 xv = _mm256_loadu_ps(g.x + t * g.in + k);
      for (int r = 0; r < R; ++r) acc[t][r] = _mm256_fmadd_ps(wv[r], xv, acc[t][r]);
    }
  }
  for (int t = 0; t < N; ++t)
    for (int r = 0; r < R; ++r) {
      float s = simd::hsum(acc[t][r]);
      for (int64_t kk = k; kk < g.in; ++kk)
        s += simd::to_f32(g.w, g.wt, (r0 + r) * g.in + kk) * g.x[t * g.in + kk];
      g.store(t, r0 + r, s);
    }
}

template <class W, int N>
LATHE_AVX2 void gemv_rows_avx2(const Gemv& g, int64_t r_begin, int64_t r_end) {
  // Enough independent accumulators (N * R >= 4) to hide the FMA latency,
  // few enough (<= 8) to stay in registers beside the loads.
  constexpr int R = N <= 2 ? 4 : 2;
  int64_t r = r_begin;
  for (; r + R <= r_end; r += R) gemv_block_avx2<W, N, R>(g, r);
  for (; r < r_end; ++r) gemv_block_avx2<W, N, 1>(g, r);
}

// bf16 GEMV without a widening shuffle: 16 weights loaded as 8 u32 lanes
// give the even elements by a shift and the odd ones by a mask, so x is
// pre-split per 16-block into its 8 even then 8 odd elements (xs).
template <int N, int R>
LATHE_AVX2 void gemv_block_bf16_avx2(const Gemv& g, const float* xs, int64_t r0) {
  const uint16_t* w = static_cast<const uint16_t*>(g.w) + r0 * g.in;
  const __m256i odd_mask = _mm256_set1_epi32(int32_t(0xffff0000u));
  __m256 acc[N][R];
  for (int t = 0; t < N; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= g.in; k += 16) {
    __m256 we[R], wo[R];
    for (int r = 0; r < R; ++r) {
      // A few hundred bytes ahead in each of the R row streams.
      _mm_prefetch(reinterpret_cast<const char*>(w + r * g.in + k) + kPrefetchBytes, _MM_HINT_T0);
      __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * g.in + k));
      we[r] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
      wo[r] = _mm256_castsi256_ps(_mm256_and_si256(v, odd_mask));
    }
    for (int t = 0; t < N; ++t) {
      __m256 xe = _mm256_loadu_ps(xs + t * g.in + k), xo = _mm256_loadu_ps(xs + t * g.in + k + 8);
      for (int r = 0; r < R; ++r) acc[t][r] = _mm256_fmadd_ps(wo[r], xo, _mm256_fmadd_ps(we[r], xe, acc[t][r]));
    }
  }
  for (int t = 0; t < N; ++t)
    for (int r = 0; r < R; ++r) {
      float s = simd::hsum(acc[t][r]);
      for (int64_t kk = k; kk < g.in; ++kk) s += bf16_to_f32(w[r * g.in + kk]) * g.x[t * g.in + kk];
      g.store(t, r0 + r, s);
    }
}

template <int N>
LATHE_AVX2 void gemv_rows_bf16_avx2(const Gemv& g, const float* xs, int64_t r_begin, int64_t r_end) {
  constexpr int R = N == 1 ? 4 : 2;
  int64_t r = r_begin;
  for (; r + R <= r_end; r += R) gemv_block_bf16_avx2<N, R>(g, xs, r);
  for (; r < r_end; ++r) gemv_block_bf16_avx2<N, 1>(g, xs, r);
}

void split_even_odd(const Gemv& g, float* xs) {
  for (int64_t t = 0; t < g.n; ++t) {
    const float* x = g.x + t * g.in;
    float* o = xs + t * g.in;
    int64_t k = 0;
    for (; k + 16 <= g.in; k += 16)
      for (int j = 0; j < 8; ++j) {
        o[k + j] = x[k + 2 * j];
        o[k + 8 + j] = x[k + 2 * j + 1];
      }
    for (; k < g.in; ++k) o[k] = x[k];
  }
}

void gemv_rows_bf16(const Gemv& g, const float* xs, int64_t r_begin, int64_t r_end) {
  switch (g.n) {
    case 1: gemv_rows_bf16_avx2<1>(g, xs, r_begin, r_end); break;
    case 2: gemv_rows_bf16_avx2<2>(g, xs, r_begin, r_end); break;
    case 3: gemv_rows_bf16_avx2<3>(g, xs, r_begin, r_end); break;
    default: gemv_rows_bf16_avx2<4>(g, xs, r_begin, r_end); break;
  }
}

template <class W>
void gemv_rows_dispatch(const Gemv& g, int64_t r_begin, int64_t r_end) {
  switch (g.n) {
    case 1: gemv_rows_avx2<W, 1>(g, r_begin, r_end); break;
    case 2: gemv_rows_avx2<W, 2>(g, r_begin, r_end); break;
    case 3: gemv_rows_avx2<W, 3>(g, r_begin, r_end); break;
    default: gemv_rows_avx2<W, 4>(g, r_begin, r_end); break;
  }
}

void gemv_rows_portable(const Gemv& g, int64_t r_begin, int64_t r_end) {
  for (int64_t r = r_begin; r < r_end; ++r)
    for (int64_t t = 0; t < g.n; ++t) {
      float s0 = 0, s1 = 0;
      const float* x = g.x + t * g.in;
      int64_t k = 0;
      for (; k + 2 <= g.in; k += 2) {
        s0 += simd::to_f32(g.w, g.wt, r * g.in + k) * x[k];
        s1 += simd::to_f32(g.w, g.wt, r * g.in + k + 1) * x[k + 1];
      }
      if (k < g.in) s0 += simd::to_f32(g.w, g.wt, r * g.in + k) * x[k];
      g.store(t, r, s0 + s1);
    }
}

void gemv_rows(const Gemv& g, const float* xs, bool vec, int64_t b, int64_t e) {
  if (!vec) return gemv_rows_portable(g, b, e);
  if (g.wt == DType::F32) return gemv_rows_dispatch<float>(g, b, e);
  if (g.wt == DType::BF16) return gemv_rows_bf16(g, xs, b, e);
  gemv_rows_dispatch<uint16_t>(g, b, e);
}

// Several GEMVs in one parallel region: their rows are laid end to end and
// split across threads together, so q/k/v (or gate/up) cost one fork/join.
// xs[i]: workspace of gs[i] (the even/odd-split x for bf16).
void gemv_group(std::span<const Gemv> gs, std::span<float* const> xs) {
  int64_t rows = 0, work = 0;
  for (const Gemv& g : gs) rows += g.out, work += g.out * g.in;
  // Chunks of whole row blocks, a few per thread so uneven cores even out.
  int64_t threads = num_threads();
  int64_t grain = std::max<int64_t>(16, (rows / (threads * 4) + 3) / 4 * 4);
  if (work < (int64_t{1} << 15)) grain = rows;  // tiny: one thread
  const bool vec = has_avx2();
  for (size_t i = 0; i < gs.size(); ++i)
    if (vec && gs[i].wt == DType::BF16) split_even_odd(gs[i], xs[i]);
  parallel_for(rows, grain, [&](int64_t b, int64_t e) {
    int64_t offset = 0;
    for (size_t i = 0; i < gs.size(); offset += gs[i].out, ++i) {
      int64_t lo = std::max(b, offset) - offset, hi = std::min(e, offset + gs[i].out) - offset;
      if (lo < hi) gemv_rows(gs[i], xs[i], vec, lo, hi);
    }
  });
}

// OpenBLAS runs single-threaded inside OpenMP tasks: one owner of the cores,
// no two thread pools spinning against each other.
void blas_single_threaded() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}

// Each task multiplies x by one tile of kLinearTileRows weight rows, writing
// y[:, r0 : r0 + rows]; half-precision tiles are widened into the task's
// thread's slice of the workspace first.
void gemm(const LinearArgs& a) {
  blas_single_threaded();
  const int64_t n = a.x.shape[0], in = a.x.shape[1], out = a.w.shape[0];
  const float* x = a.x.ptr<const float>();
  float* y = a.y.ptr<float>();
  const bool half = a.w.dtype != DType::F32;
  const float beta = a.accumulate ? 1.0f : 0.0f;
  const int64_t tiles = (out + kLinearTileRows - 1) / kLinearTileRows;
  int64_t threads = std::min<int64_t>(num_threads(), tiles);
  if (half) threads = std::min(threads, a.workspace.numel() / (kLinearTileRows * in));
  threads = std::max<int64_t>(threads, 1);
#pragma omp parallel for num_threads(int(threads)) schedule(dynamic, 1) if (threads > 1)
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int64_t r0 = tile * kLinearTileRows, rows = std::min(kLinearTileRows, out - r0);
    const float* w = nullptr;
    if (half) {
      float* buf = a.workspace.ptr<float>() + int64_t(omp_get_thread_num()) * kLinearTileRows * in;
      convert_to_f32(a.w.ptr<const uint16_t>() + r0 * in, a.w.dtype, buf, rows * in);
      w = buf;
    } else {
      w = a.w.ptr<const float>() + r0 * in;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(rows), int(in), 1.0f, x, int(in), w, int(in),
                beta, y + r0, int(out));
    if (!a.bias.empty())
      for (int64_t t = 0; t < n; ++t)
        for (int64_t r = r0; r < r0 + rows; ++r) y[t * out + r] += simd::to_f32(a.bias.data, a.bias.dtype, r);
  }
}

}  // namespace

Status linear_forward(const LinearArgs& a) { return linear_forward_group({&a, 1}); }

Status linear_forward_group(std::span<const LinearArgs> group) {
  LATHE_CHECK(group.size() <= kMaxLinearGroup, "linear: group of ", group.size(), " > ", kMaxLinearGroup);
  Gemv gs[kMaxLinearGroup];
  float* xs[kMaxLinearGroup];
  size_t n_gemv = 0;
  for (const LinearArgs& a : group) {
    LATHE_TRY(validate(a));
    const int64_t n = a.x.shape[0];
    if (n == 0 || a.w.shape[0] == 0) continue;
    if (n > kLinearGemvMaxRows && a.x.shape[1] > 0) {
      gemm(a);
      continue;
    }
    xs[n_gemv] = a.workspace.ptr<float>();
    gs[n_gemv++] = Gemv{a.x.ptr<const float>(), a.w.data, a.w.dtype, a.bias.empty() ? nullptr : a.bias.data,
                        a.bias.dtype, a.y.ptr<float>(), n, a.x.shape[1], a.w.shape[0], a.accumulate};
  }
  if (n_gemv > 0) gemv_group({gs, n_gemv}, {xs, n_gemv});
  return Status::ok();
}

}  // namespace lathe::cpu
