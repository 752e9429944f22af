// Helpers for the op tests: seeded random tensors and the error measure
// every comparison uses, max|a − b| / max|b| over the whole output.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/tensor.h"

namespace lathe::testing {

inline Tensor random_tensor(DType dt, Shape shape, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  Tensor f = Tensor::empty(DType::F32, shape);
  for (int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] = dist(rng);
  return dt == DType::F32 ? f : f.to(dt);
}

inline double rel_error(const TensorView& got, const TensorView& want) {
  double max_diff = 0, max_ref = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    double a = got.ptr<const float>()[i], b = want.ptr<const float>()[i];
    if (std::isnan(a) != std::isnan(b)) return INFINITY;
    max_diff = std::max(max_diff, std::abs(a - b));
    max_ref = std::max(max_ref, std::abs(b));
  }
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

}  // namespace lathe::testing
