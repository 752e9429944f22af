// Multi-tensor AdamW on the device against the CPU optimizer of src/train
// (torch's update) over several steps: tensors of 1, 1000 and 40000 elements
// (the last spans several chunks), one without weight decay, a changing
// learning rate, and maximize. Both sides apply the same fp32 formula; they
// may differ by fused multiply-adds, so masters and moments are compared to
// 1e-6 of their largest magnitude. The bf16 working copy must be exactly
// the rounding of the device's master. Gradient clipping: the device sums
// in f32 per chunk and in double across chunks, so the norm is within 1e-5.
//
// test_cuda links the backends only, so the CPU optimizer is compiled into
// this test from its source.
#include <gtest/gtest.h>

#include "cuda/cuda_test_util.h"
#include "train/adamw.cpp"  // NOLINT(bugprone-suspicious-include)

namespace lathe::cuda {
namespace {

using namespace lathe::cuda::testing;

void run_adamw(bool maximize) {
  SCOPED_TRACE(maximize ? "maximize" : "minimize");
  CudaContext ctx = make_context();
  const std::vector<int64_t> sizes = {1, 1000, 40000};
  AdamWConfig cpu_cfg;
  cpu_cfg.weight_decay = 0.1;
  cpu_cfg.maximize = maximize;
  CudaAdamWConfig gpu_cfg{.beta1 = cpu_cfg.beta1, .beta2 = cpu_cfg.beta2, .eps = cpu_cfg.eps,
                          .weight_decay = cpu_cfg.weight_decay, .maximize = maximize};
  std::vector<std::vector<float>> p_cpu, g_cpu;
  std::vector<DeviceBuffer> p_dev, g_dev, w_dev;
  std::vector<AdamWParam> cpu_params;
  std::vector<CudaAdamWParam> gpu_params;
  for (size_t t = 0; t < sizes.size(); ++t) {
    p_cpu.push_back(random_bf16(sizes[t], 70 + uint32_t(t)));
    g_cpu.push_back(std::vector<float>(size_t(sizes[t])));
  }
  for (size_t t = 0; t < sizes.size(); ++t) {
    p_dev.push_back(upload(ctx, p_cpu[t]));
    g_dev.push_back(upload(ctx, g_cpu[t]));
    w_dev.push_back(upload(ctx, std::vector<uint16_t>(size_t(sizes[t]))));
    const bool decay = t != 1;
    const std::string name = "layer" + std::to_string(t);
    cpu_params.push_back({name, p_cpu[t].data(), g_cpu[t].data(), sizes[t], decay});
    gpu_params.push_back({name, dptr<float>(p_dev[t]), dptr<float>(g_dev[t]), dptr<bf16_bits>(w_dev[t]), sizes[t], decay});
  }
  auto cpu = AdamW::create(cpu_cfg, cpu_params);
  ASSERT_TRUE(cpu.is_ok()) << cpu.status().message();
  auto gpu = CudaAdamW::create(ctx, gpu_cfg, gpu_params);
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().message();
  for (int step = 0; step < 5; ++step) {
    const double lr = 1e-2 * (1.0 + step) / 5.0;
    for (size_t t = 0; t < sizes.size(); ++t) {
      std::vector<float> g = random_bf16(sizes[t], 100 + uint32_t(step * 7 + t), 0.5f);
      std::copy(g.begin(), g.end(), g_cpu[t].begin());
      ASSERT_TRUE(copy_to_device(ctx, g_dev[t].data(), g.data(), g.size() * sizeof(float)).is_ok());
      ASSERT_TRUE(ctx.synchronize().is_ok());  // g goes out of scope
    }
    cpu->step(lr);
    Status st = gpu->step(ctx, lr);
    ASSERT_TRUE(st.is_ok()) << st.message();
  }
  EXPECT_EQ(gpu->steps_taken(), 5);
  for (size_t t = 0; t < sizes.size(); ++t) {
    SCOPED_TRACE(::testing::Message() << "tensor " << t);
    std::vector<float> p = download<float>(ctx, p_dev[t], sizes[t]);
    EXPECT_LE(rel_error(p, p_cpu[t]), 1e-6);
    std::vector<uint16_t> w = download<uint16_t>(ctx, w_dev[t], sizes[t]);
    for (int64_t i = 0; i < sizes[t]; ++i) ASSERT_EQ(w[i], lathe::f32_to_bf16(p[i])) << "element " << i;
    std::vector<float> m, v;
    ASSERT_TRUE(gpu->read_moments(ctx, t, &m, &v).is_ok());
    auto m_cpu = cpu->exp_avg(t), v_cpu = cpu->exp_avg_sq(t);
    EXPECT_LE(rel_error(m, {m_cpu.begin(), m_cpu.end()}), 1e-6);
    EXPECT_LE(rel_error(v, {v_cpu.begin(), v_cpu.end()}), 1e-6);
  }
}

TEST(CudaAdamW, MatchesCpuOptimizer) {
  LATHE_SKIP_WITHOUT_GPU();
  run_adamw(false);
}

TEST(CudaAdamW, MatchesCpuOptimizerWhenMaximizing) {
  LATHE_SKIP_WITHOUT_GPU();
  run_adamw(true);
}

TEST(CudaAdamW, ClipGradNormMatchesCpu) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  const std::vector<int64_t> sizes = {3, 50000, 777};
  std::vector<std::vector<float>> g_cpu;
  std::vector<DeviceBuffer> p_dev, g_dev;
  std::vector<CudaAdamWParam> params;
  for (size_t t = 0; t < sizes.size(); ++t) {
    g_cpu.push_back(random_bf16(sizes[t], 90 + uint32_t(t), 0.2f));
    p_dev.push_back(upload(ctx, std::vector<float>(size_t(sizes[t]))));
    g_dev.push_back(upload(ctx, g_cpu[t]));
    params.push_back({"t" + std::to_string(t), dptr<float>(p_dev[t]), dptr<float>(g_dev[t]), nullptr, sizes[t], true});
  }
  auto gpu = CudaAdamW::create(ctx, {}, params);
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().message();
  std::vector<std::span<float>> spans;
  for (auto& g : g_cpu) spans.emplace_back(g);
  // Measuring only (max_norm 0) leaves the gradients alone.
  auto measured = gpu->clip_grad_norm(ctx, 0.0);
  ASSERT_TRUE(measured.is_ok()) << measured.status().message();
  const double want_norm = lathe::clip_grad_norm(spans, 1.0);  // clips the host copy
  ASSERT_GT(want_norm, 1.0);
  EXPECT_NEAR(*measured, want_norm, 1e-5 * want_norm);
  auto clipped = gpu->clip_grad_norm(ctx, 1.0);
  ASSERT_TRUE(clipped.is_ok()) << clipped.status().message();
  EXPECT_NEAR(*clipped, want_norm, 1e-5 * want_norm);
  for (size_t t = 0; t < sizes.size(); ++t) {
    EXPECT_LE(rel_error(download<float>(ctx, g_dev[t], sizes[t]), g_cpu[t]), 1e-5) << "tensor " << t;
  }
}

TEST(CudaAdamW, RejectsBadConfigAndMissingBuffers) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  EXPECT_FALSE(CudaAdamW::create(ctx, {.beta1 = 1.0}, {}).is_ok());
  EXPECT_FALSE(CudaAdamW::create(ctx, {}, {{"a", nullptr, nullptr, nullptr, 4, true}}).is_ok());
}

}  // namespace
}  // namespace lathe::cuda
