// Internal to the CPU backend: runtime ISA dispatch and small vector helpers.
// Vector code lives in functions marked LATHE_AVX2 and is only called when
// cpu::has_avx2() said so; every such function has a portable twin. The
// AVX-512 helpers at the end run only where cpu::has_avx512_bf16() said so.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "core/dtype.h"

#define LATHE_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace lathe::cpu::simd {

// Loads 8 weights of dtype T as f32.
LATHE_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
LATHE_AVX2 inline __m256 load8(const uint16_t* p, DType dt) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (dt == DType::F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

LATHE_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

LATHE_AVX2 inline float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  float s = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y += alpha * x
LATHE_AVX2 inline void axpy_avx2(float alpha, const float* x, float* y, int64_t n) {
  __m256 va = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += alpha * x[i];
}

inline float dot_portable(const float* a, const float* b, int64_t n) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

inline void axpy_portable(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// Converts one weight element to f32.
inline float to_f32(const void* p, DType dt, int64_t i) {
  switch (dt) {
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// (GCC 12 warns about the undefined pass-through operand inside the
// unmasked AVX-512 intrinsics, which a full mask never reads.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// exp(x) for x <= 0 in 16 lanes: x = n·ln2 + r with |r| <= ln2/2, e^r by
// its Taylor series to r⁶ (truncation below 2⁻²³ there), times 2ⁿ by scalef
// (which flushes very negative x to 0).
__attribute__((target("avx512f"))) inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);  // ln2 in two parts: hi exact in f32
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  for (const float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, n);
}

// exp(x) for x <= 0 in 8 f64 lanes, to well under 1e-12 relative: x =
// n·ln2 + r (ln2 in two parts, the high one exact for any n here), e^r by
// its Taylor series to r¹¹ (truncation ~1e-13 at |r| = ln2/2), times 2ⁿ by
// scalef. Rounded to f32 it is the correctly rounded expf (but in cases
// within 1e-12 of a rounding tie), as good as libm's.
__attribute__((target("avx512f"))) inline __m512d exp_nonpositive_f64(__m512d x) {
  x = _mm512_max_pd(x, _mm512_set1_pd(-800.0));  // below, e^x is 0 in f64 too
  const __m512d n = _mm512_roundscale_pd(_mm512_mul_pd(x, _mm512_set1_pd(1.4426950408889634)),
                                         _MM_FROUND_TO_NEAREST_INT);
  __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(0x1.62e42fee00000p-1), x);
  r = _mm512_fnmadd_pd(n, _mm512_set1_pd(0x1.a39ef35793c76p-33), r);
  __m512d p = _mm512_set1_pd(1.0 / 39916800);
  for (const double c : {1.0 / 3628800, 1.0 / 362880, 1.0 / 40320, 1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24,
                         1.0 / 6, 0.5, 1.0, 1.0})
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(c));
  return _mm512_scalef_pd(p, n);
}

// expf of 16 lanes with x <= 0, through exp_nonpositive_f64.
__attribute__((target("avx512f,avx512dq"))) inline __m512 expf_nonpositive_accurate(__m512 x) {
  const __m512d lo = exp_nonpositive_f64(_mm512_cvtps_pd(_mm512_castps512_ps256(x)));
  const __m512d hi = exp_nonpositive_f64(_mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1)));
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(lo)), _mm512_cvtpd_ps(hi), 1);
}

// Σ double(a[i]) · double(b[i]) over n floats in 16 double lanes (the
// products are exact in double; the order of the sum is the lanes').
__attribute__((target("avx512f,avx512dq"))) inline double dot_f64_avx512(const float* a, const float* b, int64_t n) {
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(a + i), y = _mm512_loadu_ps(b + i);
    s0 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x)), _mm512_cvtps_pd(_mm512_castps512_ps256(y)), s0);
    s1 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1)), _mm512_cvtps_pd(_mm512_extractf32x8_ps(y, 1)),
                         s1);
  }
  double s = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
  for (; i < n; ++i) s += double(a[i]) * double(b[i]);
  return s;
}

// The lane indices of transpose16's four stages (built at compile time).
struct Transpose16Index {
  alignas(64) int32_t lo[4][16];
  alignas(64) int32_t hi[4][16];
};
constexpr Transpose16Index make_transpose16_index() {
  Transpose16Index t{};
  for (int s = 0; s < 4; ++s)
    for (int c = 0; c < 16; ++c) {
      const int b = 1 << s;
      t.lo[s][c] = (c & b) ? 16 + (c ^ b) : c;
      t.hi[s][c] = (c & b) ? 16 + c : (c ^ b);
    }
  return t;
}
inline constexpr Transpose16Index kTranspose16Index = make_transpose16_index();

// 16 x 16 transpose of the 32-bit lanes of r[16]: four butterfly stages; at
// stage b the lanes whose row and column differ in bit b swap across rows i
// and i ^ b.
__attribute__((target("avx512f"))) inline void transpose16(__m512i r[16]) {
  for (int s = 0; s < 4; ++s) {
    const int b = 1 << s;
    const __m512i lo = _mm512_load_si512(kTranspose16Index.lo[s]), hi = _mm512_load_si512(kTranspose16Index.hi[s]);
    for (int i = 0; i < 16; ++i) {
      if (i & b) continue;
      const __m512i x = r[i], y = r[i | b];
      r[i] = _mm512_permutex2var_epi32(x, lo, y);
      r[i | b] = _mm512_permutex2var_epi32(x, hi, y);
    }
  }
}

#pragma GCC diagnostic pop

}  // namespace lathe::cpu::simd
