// SwiGLU on the CPU: out = silu(gate) * up with silu(x) = x / (1 + exp(-x)),
// as torch's silu kernel computes it. With AVX-512, 16 lanes at a time:
// sigmoid through e = exp(-|x|) (simd::exp_nonpositive, within 2 ulp; it
// never overflows), 1 / (1 + e) for x >= 0 and e / (1 + e) below; the tail
// and machines without AVX-512 take the scalar loop. The backward
// (swiglu_backward.cpp) uses the same sigmoid.
#include "backends/cpu/swiglu_simd.h"

#include <cmath>

#include "backends/cpu/cpu_ops.h"
#include "core/parallel.h"

namespace lathe::cpu {
namespace {

LATHE_AVX512_SWIGLU int64_t swiglu_forward_avx512(const float* g, const float* u, float* o, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(g + i);
    _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_mul_ps(x, simd::sigmoid(x)), _mm512_loadu_ps(u + i)));
  }
  return i;
}

}  // namespace

Status swiglu_forward(const SwigluArgs& a) {
  LATHE_TRY(validate(a));
  const float* g = a.gate.ptr<const float>();
  const float* u = a.up.ptr<const float>();
  float* o = a.out.ptr<float>();
  const bool vec = has_avx512_bf16();
  parallel_for(a.gate.numel(), 4096, [&](int64_t b, int64_t e) {
    const int64_t done = vec ? b + swiglu_forward_avx512(g + b, u + b, o + b, e - b) : b;
    for (int64_t i = done; i < e; ++i) {
      float silu = g[i] / (1.0f + std::exp(-g[i]));
      o[i] = silu * u[i];
    }
  });
  return Status::ok();
}

}  // namespace lathe::cpu
