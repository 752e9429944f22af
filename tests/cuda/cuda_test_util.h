// Helpers for the CUDA op tests: a skip when no GPU is visible, bf16-rounded
// random inputs (the references then see exactly what the device sees),
// stream-ordered upload/download, f32 TensorViews over host vectors for the
// naive references in tests/ops/reference, and the error measure every
// comparison uses: max|got − want| / max|want|.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backends/cuda/cuda_ops.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace lathe::cuda::testing {

#define LATHE_SKIP_WITHOUT_GPU()                                                      \
  do {                                                                                \
    if (::lathe::cuda::device_count() == 0)                                           \
      GTEST_SKIP() << "no CUDA device visible (built_with_cuda="                      \
                   << ::lathe::cuda::built_with_cuda() << "): runs on the GPU machine"; \
  } while (0)

inline float round_bf16(float x) { return lathe::bf16_to_f32(lathe::f32_to_bf16(x)); }

// n normal(0, scale) values, each rounded to bf16.
inline std::vector<float> random_bf16(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = round_bf16(dist(rng));
  return v;
}

inline std::vector<uint16_t> to_bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = lathe::f32_to_bf16(v[i]);
  return out;
}
inline std::vector<float> from_bf16_bits(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = lathe::bf16_to_f32(v[i]);
  return out;
}

// A device buffer holding a copy of v (ordered on ctx's stream).
template <class T>
DeviceBuffer upload(CudaContext& ctx, const std::vector<T>& v) {
  auto buf = DeviceBuffer::alloc(ctx.device(), std::max<size_t>(1, v.size() * sizeof(T)));
  EXPECT_TRUE(buf.is_ok()) << buf.status().message();
  DeviceBuffer b = std::move(buf).value();
  Status st = copy_to_device(ctx, b.data(), v.data(), v.size() * sizeof(T));
  EXPECT_TRUE(st.is_ok()) << st.message();
  return b;
}
inline DeviceBuffer upload_bf16(CudaContext& ctx, const std::vector<float>& v) { return upload(ctx, to_bf16_bits(v)); }

template <class T>
std::vector<T> download(CudaContext& ctx, const DeviceBuffer& b, int64_t n) {
  std::vector<T> v(static_cast<size_t>(n));
  Status st = copy_to_host(ctx, v.data(), b.data(), v.size() * sizeof(T));
  EXPECT_TRUE(st.is_ok()) << st.message();
  return v;
}
inline std::vector<float> download_bf16(CudaContext& ctx, const DeviceBuffer& b, int64_t n) {
  return from_bf16_bits(download<uint16_t>(ctx, b, n));
}

template <class T>
T* dptr(const DeviceBuffer& b) {
  return static_cast<T*>(b.data());
}

// An f32 view of a host vector (for the references).
inline TensorView view(std::vector<float>& v, Shape s) { return TensorView{v.data(), DType::F32, s, Device::cpu()}; }
inline TensorView view_i32(std::vector<int32_t>& v, Shape s) {
  return TensorView{v.data(), DType::I32, s, Device::cpu()};
}

inline double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(got[i]) != std::isnan(want[i])) return INFINITY;
    max_diff = std::max(max_diff, std::abs(double(got[i]) - double(want[i])));
    max_ref = std::max(max_ref, std::abs(double(want[i])));
  }
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

inline CudaContext make_context() {
  auto ctx = CudaContext::create(0);
  EXPECT_TRUE(ctx.is_ok()) << ctx.status().message();
  return std::move(ctx).value();
}

}  // namespace lathe::cuda::testing
