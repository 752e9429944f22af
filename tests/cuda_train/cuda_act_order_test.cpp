// down's backward in the order that takes silu(gate)·up back from SwiGLU's
// backward (LATHE_CUDA_ACT_FROM_BWD, cuda_model_pass.cpp's down_backward)
// and in the earlier order (SwiGLU's forward rerun before down's LoRA
// gradients): with each, every recompute mode and the LoRA side stream on
// or off give the same pass bit for bit (the act the backward writes is the
// forward's), on Qwen2 (q|k|v bias) and Qwen3 (q/k norms); the forward, and
// so the loss, is the same with either order. LoRA on down only, or none
// on down, covers both of down_backward's branches.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "core/scoped_env.h"
#include "cuda_train/fixture_util.h"
#include "train/cuda_model.h"
#include "train/cuda_trainable.h"
#include "train/trainable_model.h"

namespace lathe {
namespace {

using namespace lathe::testing;  // NOLINT: the shared fixture helpers

std::unique_ptr<CudaTrainableModel> make(TrainableModel& host, CudaRecompute mode, int64_t keep_layers = -1) {
  auto g = upload_to_cuda(host, 0, 256, {}, mode, 0, keep_layers);
  EXPECT_TRUE(g.is_ok()) << g.status().message();
  return g.is_ok() ? std::move(g).value() : nullptr;
}

class CudaActOrder : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaActOrder, EveryModeGivesTheSamePass) {
  SKIP_WITHOUT_GPU();
  auto host = TrainableModel::load(data_dir() + "/grad_hd64/" + GetParam() + "/model",
                                   {.adapter_dir = data_dir() + "/grad_hd64/" + GetParam() + "/adapter"});
  ASSERT_TRUE(host.is_ok()) << host.status().message();
  const MicroBatch mb = random_batch((*host)->config().vocab_size, 13);
  double loss[2] = {0, 0};
  for (const char* order : {"1", "0"}) {
    ScopedEnv e("LATHE_CUDA_ACT_FROM_BWD", order);
    for (const char* overlap : {"2", "0"}) {
      ScopedEnv side("LATHE_CUDA_LORA_OVERLAP", overlap);
      SCOPED_TRACE(::testing::Message() << "act from backward " << order << ", overlap " << overlap);
      auto keep = make(**host, CudaRecompute::kNone);
      ASSERT_TRUE(keep);
      auto lk = keep->forward_backward(mb, 0.01f);
      ASSERT_TRUE(lk.is_ok()) << lk.status().message();
      loss[order[0] - '0'] = lk->loss_sum;
      const std::vector<float> want = grads_of(*keep);
      for (int64_t kept : {int64_t{-1}, int64_t{1}}) {
        for (CudaRecompute mode : {CudaRecompute::kSelective, CudaRecompute::kFull}) {
          if (mode == CudaRecompute::kFull && kept >= 0) continue;
          auto redo = make(**host, mode, kept);
          ASSERT_TRUE(redo);
          auto lr = redo->forward_backward(mb, 0.01f);
          ASSERT_TRUE(lr.is_ok()) << lr.status().message();
          EXPECT_EQ(lr->loss_sum, lk->loss_sum);
          EXPECT_EQ(grads_of(*redo), want) << (mode == CudaRecompute::kFull ? "full" : "selective") << " keeping "
                                           << kept;
        }
      }
    }
  }
  EXPECT_EQ(loss[0], loss[1]);
}

INSTANTIATE_TEST_SUITE_P(Families, CudaActOrder, ::testing::Values("qwen2", "qwen3"));

// Without LoRA on down (targets that leave it out), down_backward runs dx and
// SwiGLU's backward alone; the modes still agree.
TEST(CudaActOrder, DownWithoutLora) {
  SKIP_WITHOUT_GPU();
  CudaModelShape s{.vocab = 96, .hidden = 64, .inter = 136, .n_layer = 2, .n_head = 2, .n_kv = 1,
                   .head_dim = 32, .eps = 1e-5f};
  s.inv_freq.assign(16, 0.5f);
  MicroBatch mb = random_batch(s.vocab, 17);
  std::vector<float> first;
  for (CudaRecompute mode : {CudaRecompute::kNone, CudaRecompute::kSelective, CudaRecompute::kFull}) {
    CudaTrainOptions o{.max_tokens = 256, .lora_r = 4, .targets = {true, true, true, true, true, true, false},
                       .recompute = mode};
    auto m = CudaTrainableModel::create(s, o);
    ASSERT_TRUE(m.is_ok()) << m.status().message();
    ASSERT_TRUE((*m)->fill_random(7).is_ok());
    std::vector<float> p(size_t((*m)->n_params()));
    for (size_t i = 0; i < p.size(); ++i) p[i] = 0.01f * float(int(i % 13) - 6);  // B nonzero: every grad moves
    ASSERT_TRUE((*m)->upload_params(p).is_ok());
    auto l = (*m)->forward_backward(mb, 0.01f);
    ASSERT_TRUE(l.is_ok()) << l.status().message();
    const std::vector<float> g = grads_of(**m);
    if (first.empty()) {
      first = g;
    } else {
      EXPECT_EQ(g, first);
    }
  }
}

}  // namespace
}  // namespace lathe
