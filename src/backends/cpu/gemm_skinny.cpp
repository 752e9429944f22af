// sgemm_skinny (see gemm_skinny.h): register tiles of MR x 16·NV floats
// chosen by n (the width of C); the row count of a tile is a template
// parameter too, so edge rows take a smaller instantiation and edge columns
// a mask. Tasks of up to kTaskTiles register tiles down one column strip go
// to the OpenMP threads.
#include "backends/cpu/gemm_skinny.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/gemm.h"
#include "core/parallel.h"

#define LATHE_AVX512F __attribute__((target("avx512f")))

namespace lathe::cpu {
namespace {

constexpr int64_t kTaskTiles = 8;  // register tiles per task, down one column strip

struct Operands {
  const float* a;
  int64_t rs, cs;  // op(A)[i][p] = a[i·rs + p·cs]
  const float* b;  // [k, n], row stride ldb
  int64_t ldb, k;
  float* c;
  int64_t ldc;
  float alpha, beta;
};

inline __mmask16 mask16(int64_t n) { return n >= 16 ? __mmask16(0xffff) : n > 0 ? __mmask16((1u << n) - 1) : 0; }

// C[i0 .. i0 + MR, j0 .. j0 + cols) from op(A) rows i0.. and B columns j0..
template <int MR, int NV>
LATHE_AVX512F void micro(const Operands& o, int64_t i0, int64_t j0, int cols) {
  __m512 acc[MR][NV];
  __mmask16 mk[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) mk[v] = mask16(cols - 16 * v);
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  const float* a = o.a + i0 * o.rs;
  const float* b = o.b + j0;
  for (int64_t p = 0; p < o.k; ++p) {
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_maskz_loadu_ps(mk[v], b + p * o.ldb + 16 * v);
    const float* ap = a + p * o.cs;
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 av = _mm512_set1_ps(ap[r * o.rs]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  const __m512 va = _mm512_set1_ps(o.alpha), vb = _mm512_set1_ps(o.beta);
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    float* cr = o.c + (i0 + r) * o.ldc + j0;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      __m512 y = _mm512_mul_ps(acc[r][v], va);
      if (o.beta != 0.0f) y = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mk[v], cr + 16 * v), y);
      _mm512_mask_storeu_ps(cr + 16 * v, mk[v], y);
    }
  }
}

using MicroFn = void (*)(const Operands&, int64_t, int64_t, int);

// micro<rows, NV> for rows 1..MR, indexed by rows − 1.
template <int NV, int... R>
constexpr std::array<MicroFn, sizeof...(R)> micro_table(std::integer_sequence<int, R...>) {
  return {&micro<R + 1, NV>...};
}

template <int MR, int NV>
void run(const Operands& o, int64_t m, int64_t n) {
  static constexpr auto table = micro_table<NV>(std::make_integer_sequence<int, MR>{});
  constexpr int64_t strip = 16 * NV, rows_per_task = MR * kTaskTiles;
  const int64_t row_tasks = (m + rows_per_task - 1) / rows_per_task, strips = (n + strip - 1) / strip;
  const int64_t tasks = row_tasks * strips;
  const int64_t threads = omp_in_parallel() ? 1 : num_threads();
  const bool par = threads > 1 && tasks > 1 && m * n * o.k >= (int64_t{1} << 17);
#pragma omp parallel for num_threads(int(std::min(threads, tasks))) schedule(dynamic, 1) if (par)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t j0 = (t % strips) * strip, i_begin = (t / strips) * rows_per_task;
    const int64_t i_end = std::min(m, i_begin + rows_per_task);
    const int cols = int(std::min(strip, n - j0));
    for (int64_t i = i_begin; i < i_end; i += MR) table[size_t(std::min<int64_t>(MR, i_end - i) - 1)](o, i, j0, cols);
  }
}

bool has_avx512f() {
  static const bool supported = __builtin_cpu_supports("avx512f");
  return supported && has_avx2();  // has_avx2() is false while the portable kernels are forced
}

}  // namespace

void sgemm_skinny(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0 || !has_avx512f()) return sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  thread_local std::vector<float> bt;
  if (trans_b) {  // B [n, k] → [k, n]
    bt.resize(size_t(k * n));
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p) bt[size_t(p * n + j)] = b[j * ldb + p];
    b = bt.data();
    ldb = n;
  }
  const Operands o{a, trans_a ? 1 : lda, trans_a ? lda : 1, b, ldb, k, c, ldc, alpha, beta};
  if (n <= 16) return run<12, 1>(o, m, n);
  if (n <= 32) return run<12, 2>(o, m, n);
  if (n <= 48) return run<8, 3>(o, m, n);
  run<6, 4>(o, m, n);
}

}  // namespace lathe::cpu
