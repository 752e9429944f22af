// Internal to the CPU backend: the 16-lane sigmoid SwiGLU's forward and
// backward share (see swiglu.cpp for why it is shaped so).
#pragma once

#include <immintrin.h>

#include "backends/cpu/simd.h"

#define LATHE_AVX512_SWIGLU __attribute__((target("avx512f")))

namespace lathe::cpu::simd {

// (GCC 12 warns about the undefined pass-through operand inside the
// unmasked AVX-512 intrinsics, which a full mask never reads.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// sigmoid(x) = 1 / (1 + e) for x >= 0, e / (1 + e) below, e = exp(-|x|).
LATHE_AVX512_SWIGLU inline __m512 sigmoid(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x)));
  const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
  return _mm512_div_ps(_mm512_mask_blend_ps(negative, one, e), _mm512_add_ps(one, e));
}

#pragma GCC diagnostic pop

}  // namespace lathe::cpu::simd
