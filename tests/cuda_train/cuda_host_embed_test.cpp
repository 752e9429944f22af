// The frozen embedding table in pinned host memory (CudaTrainOptions::
// host_embedding, LATHE_CUDA_HOST_EMBED): the arena plan without a device
// (the table leaves the arena exactly, its bytes buy selective's kept
// layers, a tied head or full SFT keeps it on the device), and on a GPU the
// same pass bit for bit with the table on either side of the PCIe bus.
#include <gtest/gtest.h>

#include <algorithm>
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

CudaModelShape shape_8b(bool tied) {
  CudaModelShape s{.vocab = 128256, .hidden = 4096, .inter = 14336, .n_layer = 32, .n_head = 32, .n_kv = 8,
                   .head_dim = 128, .eps = 1e-5f, .tied = tied};
  s.inv_freq.assign(64, 1.0f);
  return s;
}

CudaArenaPlan plan(const CudaModelShape& s, int host, int64_t budget, bool full_sft = false) {
  CudaTrainOptions o{.max_tokens = 8192, .lora_r = 32, .recompute = CudaRecompute::kSelective,
                     .max_arena_bytes = budget, .offload_layers = 0, .full_sft = full_sft, .host_embedding = host};
  auto p = CudaTrainableModel::plan_arena(s, o);
  EXPECT_TRUE(p.is_ok()) << p.status().message();
  return p.is_ok() ? *p : CudaArenaPlan{};
}

bool has_item(const CudaArenaPlan& p, const std::string& what) {
  return std::any_of(p.items.begin(), p.items.end(), [&](const auto& it) { return it.first == what; });
}

TEST(CudaHostEmbedding, LeavesTheArenaAndBuysKeptLayers) {
  const CudaModelShape s = shape_8b(false);
  const int64_t table = s.vocab * s.hidden * 2;
  const CudaArenaPlan dev = plan(s, 0, 0), host = plan(s, 1, 0);
  EXPECT_EQ(dev.bytes - host.bytes, table);
  EXPECT_TRUE(has_item(dev, "embedding"));
  EXPECT_FALSE(has_item(host, "embedding"));
  int64_t items = 0;
  for (const auto& [what, bytes] : host.items) items += bytes;
  EXPECT_EQ(items, host.bytes);
  // The device plan's own bytes as the budget: the table's bytes go to
  // layers that keep q, k, v and h_mid (4096 + 2·1024 + 4096 bf16 a token).
  const int64_t per_layer = 8192 * (4096 + 2 * 1024 + 4096) * 2;
  EXPECT_EQ(plan(s, 0, dev.bytes).layers_kept, 0);
  const CudaArenaPlan bought = plan(s, 1, dev.bytes);
  EXPECT_EQ(bought.layers_kept, table / per_layer);
  EXPECT_LE(bought.bytes, dev.bytes);
}

TEST(CudaHostEmbedding, StaysOnTheDeviceForATiedHeadOrFullSft) {
  const CudaModelShape tied = shape_8b(true);
  EXPECT_EQ(plan(tied, 1, 0).bytes, plan(tied, 0, 0).bytes);
  EXPECT_TRUE(has_item(plan(tied, 1, 0), "embedding"));
  CudaModelShape small = shape_8b(false);
  small.n_layer = 2;  // full SFT's plan does not need the device either; keep it small
  EXPECT_EQ(plan(small, 1, 0, true).bytes, plan(small, 0, 0, true).bytes);
}

TEST(CudaHostEmbedding, TheSwitchIsReadFromTheEnvironment) {
  const CudaModelShape s = shape_8b(false);
  {
    ScopedEnv off("LATHE_CUDA_HOST_EMBED", "0");
    EXPECT_EQ(plan(s, -1, 0).bytes, plan(s, 0, 0).bytes);
  }
  {
    ScopedEnv on("LATHE_CUDA_HOST_EMBED", "1");
    EXPECT_EQ(plan(s, -1, 0).bytes, plan(s, 1, 0).bytes);
  }
  ScopedEnv bad("LATHE_CUDA_HOST_EMBED", "yes");
  CudaTrainOptions o{.max_tokens = 64, .recompute = CudaRecompute::kSelective};
  auto p = CudaTrainableModel::plan_arena(s, o);
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("LATHE_CUDA_HOST_EMBED"), std::string::npos) << p.status().message();
}

// Qwen2's fixture (untied): the pass with the table in host memory is the
// device one's, bit for bit, in every recompute mode.
TEST(CudaHostEmbedding, GivesTheSamePass) {
  SKIP_WITHOUT_GPU();
  auto host = TrainableModel::load(data_dir() + "/grad_hd64/qwen2/model",
                                   {.adapter_dir = data_dir() + "/grad_hd64/qwen2/adapter"});
  ASSERT_TRUE(host.is_ok()) << host.status().message();
  const MicroBatch mb = random_batch((*host)->config().vocab_size, 11);
  for (CudaRecompute mode : {CudaRecompute::kNone, CudaRecompute::kSelective, CudaRecompute::kFull}) {
    std::unique_ptr<CudaTrainableModel> on, off;
    {
      ScopedEnv e("LATHE_CUDA_HOST_EMBED", "1");
      auto g = upload_to_cuda(**host, 0, 256, {}, mode);
      ASSERT_TRUE(g.is_ok()) << g.status().message();
      on = std::move(g).value();
    }
    {
      ScopedEnv e("LATHE_CUDA_HOST_EMBED", "0");
      auto g = upload_to_cuda(**host, 0, 256, {}, mode);
      ASSERT_TRUE(g.is_ok()) << g.status().message();
      off = std::move(g).value();
    }
    EXPECT_LT(on->arena_bytes(), off->arena_bytes());
    auto a = on->forward_backward(mb, 0.01f), b = off->forward_backward(mb, 0.01f);
    ASSERT_TRUE(a.is_ok() && b.is_ok()) << a.status().message() << b.status().message();
    EXPECT_EQ(a->loss_sum, b->loss_sum);
    EXPECT_EQ(grads_of(*on), grads_of(*off));
    auto hs_on = on->read_buffer("hs.0", int64_t(mb.input_ids.size()));
    auto hs_off = off->read_buffer("hs.0", int64_t(mb.input_ids.size()));
    ASSERT_TRUE(hs_on.is_ok() && hs_off.is_ok());
    EXPECT_EQ(*hs_on, *hs_off);
  }
}

}  // namespace
}  // namespace lathe
