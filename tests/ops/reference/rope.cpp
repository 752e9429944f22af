// Reference RoPE: pair (x[i], x[i + half]) rotated by angle pos * inv_freq[i]
// (the angle itself rounded to f32 as the model's definition has it).
#include <cmath>

#include "ops/reference/reference.h"

namespace lathe::ref {

void rope_tables(const RopeTablesArgs& a) {
  const int64_t n = a.positions.shape[0], half = a.inv_freq.shape[0];
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < half; ++i) {
      float angle = float(a.positions.ptr<const int32_t>()[t]) * a.inv_freq.ptr<const float>()[i];
      a.cos.ptr<float>()[t * half + i] = float(std::cos(double(angle)));
      a.sin.ptr<float>()[t * half + i] = float(std::sin(double(angle)));
    }
}

void rope_forward(const RopeArgs& a) {
  const int64_t n = a.x.shape[0], n_head = a.x.shape[1], half = a.x.shape[2] / 2;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < n_head; ++h)
      for (int64_t i = 0; i < half; ++i) {
        double c = at(a.cos, t * half + i), s = at(a.sin, t * half + i);
        if (a.inverse) s = -s;
        const int64_t base = (t * n_head + h) * 2 * half;
        double x1 = at(a.x, base + i), x2 = at(a.x, base + i + half);
        put(a.x, base + i, x1 * c - x2 * s);
        put(a.x, base + i + half, x2 * c + x1 * s);
      }
}

}  // namespace lathe::ref
