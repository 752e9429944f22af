// SwiGLU backward on the CPU, elementwise: every input element is read
// before its outputs are written, so d_gate may alias gate and d_up up.
// With AVX-512, 16 lanes at a time through the forward's sigmoid
// (swiglu_simd.h); the tail and other machines take the scalar loop.
#include <cmath>

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/swiglu_simd.h"
#include "core/parallel.h"

namespace lathe::cpu {
namespace {

LATHE_AVX512_SWIGLU int64_t swiglu_backward_avx512(const float* g, const float* u, const float* d, float* dg,
                                                   float* du, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 gi = _mm512_loadu_ps(g + i), ui = _mm512_loadu_ps(u + i), di = _mm512_loadu_ps(d + i);
    const __m512 s = simd::sigmoid(gi);
    const __m512 inner = _mm512_add_ps(one, _mm512_mul_ps(gi, _mm512_sub_ps(one, s)));  // 1 + g·(1 − s)
    _mm512_storeu_ps(du + i, _mm512_mul_ps(di, _mm512_mul_ps(gi, s)));
    _mm512_storeu_ps(dg + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(di, ui), s), inner));
  }
  return i;
}

}  // namespace

Status swiglu_backward(const SwigluBackwardArgs& a) {
  LATHE_TRY(validate(a));
  const float* g = a.gate.ptr<const float>();
  const float* u = a.up.ptr<const float>();
  const float* d = a.d_out.ptr<const float>();
  float* dg = a.d_gate.ptr<float>();
  float* du = a.d_up.ptr<float>();
  const bool vec = has_avx512_bf16();
  parallel_for(a.gate.numel(), 4096, [&](int64_t b, int64_t e) {
    const int64_t done = vec ? b + swiglu_backward_avx512(g + b, u + b, d + b, dg + b, du + b, e - b) : b;
    for (int64_t i = done; i < e; ++i) {
      const float gi = g[i], ui = u[i], di = d[i];
      const float s = 1.0f / (1.0f + std::exp(-gi));
      du[i] = di * (gi * s);
      dg[i] = di * ui * s * (1.0f + gi * (1.0f - s));
    }
  });
  return Status::ok();
}

}  // namespace lathe::cpu
