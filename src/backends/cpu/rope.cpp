// RoPE on the CPU. Tables: angle = position * inv_freq rounded to f32 (as
// torch multiplies), cos/sin of that angle correctly rounded through double.
// Apply: the rotate_half form, each product rounded before the sum as
// transformers' q * cos + rotate_half(q) * sin.
#include <cmath>

#include "backends/cpu/cpu_ops.h"
#include "core/parallel.h"

namespace lathe::cpu {

Status rope_tables(const RopeTablesArgs& a) {
  LATHE_TRY(validate(a));
  const int64_t n = a.positions.shape[0], half = a.inv_freq.shape[0];
  const float* inv = a.inv_freq.ptr<const float>();
  const int32_t* pos = a.positions.ptr<const int32_t>();
  float* c = a.cos.ptr<float>();
  float* s = a.sin.ptr<float>();
  parallel_for(n, 64, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t)
      for (int64_t i = 0; i < half; ++i) {
        float angle = static_cast<float>(pos[t]) * inv[i];
        c[t * half + i] = static_cast<float>(std::cos(double(angle)));
        s[t * half + i] = static_cast<float>(std::sin(double(angle)));
      }
  });
  return Status::ok();
}

Status rope_forward(const RopeArgs& a) {
  LATHE_TRY(validate(a));
  const int64_t n = a.x.shape[0], n_head = a.x.shape[1], half = a.x.shape[2] / 2;
  float* x = a.x.ptr<float>();
  const float* cs = a.cos.ptr<const float>();
  const float* sn = a.sin.ptr<const float>();
  const float sign = a.inverse ? -1.0f : 1.0f;
  parallel_for(n, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t)
      for (int64_t h = 0; h < n_head; ++h) {
        float* v = x + (t * n_head + h) * 2 * half;
        for (int64_t i = 0; i < half; ++i) {
          float c = cs[t * half + i], s = sign * sn[t * half + i];
          float x1 = v[i], x2 = v[i + half];
          float a1 = x1 * c, b1 = -x2 * s;
          float a2 = x2 * c, b2 = x1 * s;
          v[i] = a1 + b1;
          v[i + half] = a2 + b2;
        }
      }
  });
  return Status::ok();
}

}  // namespace lathe::cpu
