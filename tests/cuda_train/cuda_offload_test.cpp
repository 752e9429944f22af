// [gate | up] offloaded to pinned host memory between the forward and the
// backward (CudaTrainOptions::offload_layers, train/cuda_model_offload.cpp)
// moves bytes, never changes them: models with 0, 2, 3 and every layer
// offloaded (the staging buffers reused several times a pass), from the same
// weights and adapter, take the same optimizer steps (two micro batches of
// different lengths accumulated per step, an evaluation pass between steps
// that copies nothing out, clipping, AdamW) and agree bit for bit in every
// loss, gradient and parameter; with the LoRA side stream off and on, and
// with none and some layers keeping q/k/v. The plan: the budget's bytes go
// to kept layers once some layers are offloaded, explicit counts are taken
// as given, and only selective offloads. Without a GPU only the plan runs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "cuda_train/fixture_util.h"
#include "train/cuda_model.h"

namespace lathe {
namespace {

using namespace lathe::testing;  // NOLINT: the shared fixture helpers

CudaModelShape shape6() {
  CudaModelShape s{.vocab = 1024, .hidden = 256, .inter = 704, .n_layer = 6, .n_head = 4, .n_kv = 2,
                   .head_dim = 64, .eps = 1e-5f};
  for (int i = 0; i < 32; ++i) s.inv_freq.push_back(std::pow(10000.0f, -float(i) / 32.0f));
  return s;
}

CudaTrainOptions opts(int64_t offload, int64_t keep, int overlap) {
  return {.max_tokens = 1024, .lora_r = 8, .lora_scale = 2.0f, .recompute = CudaRecompute::kSelective,
          .keep_layers = keep, .offload_layers = offload, .lora_overlap = overlap};
}

MicroBatch docs(int64_t vocab, int tokens, uint32_t seed) { return random_docs(vocab, tokens, seed, 50, 300, 2); }

// Losses (training and evaluation passes), gradients and parameters of 3 steps.
std::vector<std::vector<float>> trace(const CudaTrainOptions& o) {
  auto made = CudaTrainableModel::create(shape6(), o);
  EXPECT_TRUE(made.is_ok()) << made.status().message();
  if (!made.is_ok()) return {};
  CudaTrainableModel& m = **made;
  EXPECT_EQ(m.layers_offloaded(), o.offload_layers);
  EXPECT_TRUE(m.fill_random(7, 0.05f).is_ok());
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> params(size_t(m.n_params()));
  for (float& p : params) p = dist(rng);
  EXPECT_TRUE(m.upload_params(params).is_ok());
  const std::vector<MicroBatch> mbs = {docs(1024, 1024, 1), docs(1024, 700, 2)};
  std::vector<std::vector<float>> t(1);
  for (int step = 0; step < 3; ++step) {
    EXPECT_TRUE(m.zero_grads().is_ok());
    for (const MicroBatch& mb : mbs) {
      auto loss = m.forward_backward(mb, 1.0f / 1024.0f);
      EXPECT_TRUE(loss.is_ok()) << loss.status().message();
      t[0].push_back(loss.is_ok() ? float(loss->loss_sum) : -1.0f);
    }
    t.push_back(grads_of(m));
    EXPECT_TRUE(m.clip_grad_norm(1.0).is_ok());
    EXPECT_TRUE(m.adamw_step(1e-3).is_ok());
    t.emplace_back(size_t(m.n_params()));
    EXPECT_TRUE(m.download_params(t.back()).is_ok());
    auto eval = m.forward_loss(mbs[1]);
    EXPECT_TRUE(eval.is_ok()) << eval.status().message();
    t[0].push_back(eval.is_ok() ? float(eval->loss_sum) : -1.0f);
  }
  return t;
}

bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
      return false;
  return true;
}

TEST(CudaOffload, StepsAreBitwiseTheDeviceOnes) {
  SKIP_WITHOUT_GPU();
  for (int64_t keep : {0, 2})
    for (int overlap : {0, 2}) {
      SCOPED_TRACE(::testing::Message() << "keep_layers " << keep << ", lora_overlap " << overlap);
      const std::vector<std::vector<float>> want = trace(opts(0, keep, overlap));
      ASSERT_FALSE(want.empty());
      bool any = false;  // something was learned worth comparing
      for (float g : want[1]) any = any || g != 0.0f;
      EXPECT_TRUE(any);
      for (int64_t offload : {2, 3, 6}) {
        SCOPED_TRACE(::testing::Message() << offload << " layers offloaded");
        EXPECT_TRUE(same_bits(trace(opts(offload, keep, overlap)), want));
      }
    }
}

TEST(CudaOffload, PlanSpendsTheBudgetOnKeptLayers) {
  CudaTrainOptions o = opts(0, 0, 0);
  auto none = CudaTrainableModel::plan_arena(shape6(), o);
  o.keep_layers = 6;
  auto all = CudaTrainableModel::plan_arena(shape6(), o);
  ASSERT_TRUE(none.is_ok() && all.is_ok());
  ASSERT_LT(none->bytes, all->bytes);
  // A budget between the two: without offloading only some layers keep q/k/v.
  o.keep_layers = -1;
  o.max_arena_bytes = (none->bytes + all->bytes) / 2;
  auto device_only = CudaTrainableModel::plan_arena(shape6(), o);
  o.offload_layers = -1;
  auto automatic = CudaTrainableModel::plan_arena(shape6(), o);
  ASSERT_TRUE(device_only.is_ok() && automatic.is_ok());
  EXPECT_EQ(device_only->layers_offloaded, 0);
  EXPECT_LT(device_only->layers_kept, 6);
  EXPECT_GT(automatic->layers_offloaded, 0);
  EXPECT_GT(automatic->layers_kept, device_only->layers_kept);
  EXPECT_LE(automatic->bytes, o.max_arena_bytes);
  // A budget every layer keeps within: nothing offloaded.
  o.max_arena_bytes = all->bytes;
  auto roomy = CudaTrainableModel::plan_arena(shape6(), o);
  ASSERT_TRUE(roomy.is_ok());
  EXPECT_EQ(roomy->layers_kept, 6);
  EXPECT_EQ(roomy->layers_offloaded, 0);
  // Counts as given; only selective offloads.
  o.offload_layers = 4;
  auto four = CudaTrainableModel::plan_arena(shape6(), o);
  ASSERT_TRUE(four.is_ok());
  EXPECT_EQ(four->layers_offloaded, 4);
  o.recompute = CudaRecompute::kNone;
  auto none_mode = CudaTrainableModel::plan_arena(shape6(), o);
  ASSERT_TRUE(none_mode.is_ok());
  EXPECT_EQ(none_mode->layers_offloaded, 0);
}

TEST(CudaOffload, PlanWithinNoBudgetTakesTheLeastMemory) {
  // Below every plan: the one that needs the least (no kept layer, gate|up
  // offloaded where that saves more than its staging costs), so that a
  // budget of exactly those bytes fits, and the trainer can say what is missing.
  CudaTrainOptions o = opts(0, 0, 0);
  auto device_only = CudaTrainableModel::plan_arena(shape6(), o);
  o.keep_layers = -1;
  o.offload_layers = -1;
  o.max_arena_bytes = 1;
  auto least = CudaTrainableModel::plan_arena(shape6(), o);
  ASSERT_TRUE(device_only.is_ok() && least.is_ok());
  EXPECT_EQ(least->layers_kept, 0);
  EXPECT_GT(least->layers_offloaded, 0);
  EXPECT_LT(least->bytes, device_only->bytes);
  o.max_arena_bytes = least->bytes;
  auto exact = CudaTrainableModel::plan_arena(shape6(), o);
  ASSERT_TRUE(exact.is_ok());
  EXPECT_LE(exact->bytes, least->bytes);
  EXPECT_EQ(exact->layers_kept, 0);
}

}  // namespace
}  // namespace lathe
