// The LoRA side stream (train/cuda_model_overlap.cpp) changes when the
// backward's LoRA gradients run, never what they are: models with the
// overlap off and on (the side stream at either priority), from the same
// weights and adapter, take the same optimizer steps (two micro batches
// accumulated per step, clipping, AdamW) and must agree bit for bit in every
// loss, every accumulated gradient and the parameters after each step. Each
// recompute mode orders the side work differently (none: nothing waits for
// it but the next group's dx; selective and full: recomputations rewrite the
// shared inputs it reads; selective's silu(gate)·up is overlaid by down's
// dx), so each runs. The shape is small but not tiny (a thousand tokens,
// GEMMs of tens of microseconds) so that side work missing a wait would
// race for real. LATHE_CUDA_LORA_SUMS=separate (dB's sums launched apart
// from dA's) must give the same bits too. Without a GPU only the plan and
// the switches' parsing run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/scoped_env.h"
#include "cuda_train/fixture_util.h"
#include "train/cuda_model.h"

namespace lathe {
namespace {

using namespace lathe::testing;  // NOLINT: the shared fixture helpers

CudaModelShape small_shape(bool qwen3) {
  CudaModelShape s{.vocab = 2048, .hidden = 512, .inter = 1408, .n_layer = 3, .n_head = 8, .n_kv = 2,
                   .head_dim = 64, .eps = 1e-5f, .qkv_bias = qwen3, .qk_norm = qwen3};
  for (int i = 0; i < 32; ++i) s.inv_freq.push_back(std::pow(10000.0f, -float(i) / 32.0f));
  return s;
}

// r 16 puts the side stream's scratch over tmp_h; r 32 (f32 [tokens, 12r]
// is then larger than tmp_h) gives it its own buffer.
CudaTrainOptions options(CudaRecompute mode, int overlap, int64_t keep_layers = -1, int r = 16) {
  return {.max_tokens = 1024, .lora_r = r, .lora_scale = 2.0f, .recompute = mode, .keep_layers = keep_layers,
          .lora_overlap = overlap};
}

// Documents of random tokens filling `tokens` (the first 3 of each unsupervised).
MicroBatch batch(int64_t vocab, int tokens, uint32_t seed) { return random_docs(vocab, tokens, seed, 64, 400, 3); }

// A model from seed 7's random base and an adapter whose A and B are both
// non-zero (so dA and du carry signal from the first pass).
std::unique_ptr<CudaTrainableModel> make(const CudaModelShape& shape, const CudaTrainOptions& o) {
  auto m = CudaTrainableModel::create(shape, o);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  if (!m.is_ok()) return nullptr;
  EXPECT_TRUE((*m)->fill_random(7, 0.05f).is_ok());
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> params(size_t((*m)->n_params()), 0.0f);
  for (const ParamInfo& t : (*m)->param_table())
    for (int64_t i = 0; i < t.numel(); ++i) params[size_t(t.offset + i)] = dist(rng);
  EXPECT_TRUE((*m)->upload_params(params).is_ok());
  return std::move(m).value();
}

struct Trace {
  std::vector<double> losses;
  std::vector<std::vector<float>> grads, params;  // after each step's passes / its AdamW update
};

Trace train(CudaTrainableModel& m, const std::vector<MicroBatch>& mbs, int steps) {
  Trace t;
  for (int step = 0; step < steps; ++step) {
    EXPECT_TRUE(m.zero_grads().is_ok());
    for (const MicroBatch& mb : mbs) {
      auto loss = m.forward_backward(mb, 1.0f / 2048.0f);
      EXPECT_TRUE(loss.is_ok()) << loss.status().message();
      t.losses.push_back(loss.is_ok() ? loss->loss_sum : -1.0);
    }
    t.grads.push_back(grads_of(m));
    EXPECT_TRUE(m.clip_grad_norm(1.0).is_ok());
    EXPECT_TRUE(m.adamw_step(1e-3).is_ok());
    t.params.emplace_back(size_t(m.n_params()));
    EXPECT_TRUE(m.download_params(t.params.back()).is_ok());
  }
  return t;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_same_trace(const Trace& off, const Trace& on) {
  ASSERT_EQ(off.losses.size(), on.losses.size());
  for (size_t i = 0; i < off.losses.size(); ++i) EXPECT_EQ(off.losses[i], on.losses[i]) << "pass " << i;
  for (size_t s = 0; s < off.grads.size(); ++s) {
    EXPECT_TRUE(same_bits(off.grads[s], on.grads[s])) << "gradients of step " << s;
    EXPECT_TRUE(same_bits(off.params[s], on.params[s])) << "parameters after step " << s;
  }
}

using testing::ScopedEnv;

void run_modes(const CudaModelShape& shape, CudaRecompute mode, int64_t keep_layers, const char* what, int r = 16) {
  SCOPED_TRACE(what);
  const std::vector<MicroBatch> mbs = {batch(shape.vocab, 1024, 1), batch(shape.vocab, 777, 2)};
  auto off = make(shape, options(mode, 0, keep_layers, r));
  ASSERT_TRUE(off);
  const Trace serial = train(*off, mbs, 3);
  off.reset();
  // Something was learned worth comparing: the gradients are not all zero.
  bool any = false;
  for (float g : serial.grads[0]) any = any || g != 0.0f;
  EXPECT_TRUE(any);
  for (int overlap : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << "LATHE_CUDA_LORA_OVERLAP " << overlap);
    auto on = make(shape, options(mode, overlap, keep_layers, r));
    ASSERT_TRUE(on);
    expect_same_trace(serial, train(*on, mbs, 3));
  }
  {  // dB's sums launched apart from dA's (the A/B switch), on the side stream
    SCOPED_TRACE("LATHE_CUDA_LORA_SUMS=separate");
    ScopedEnv separate("LATHE_CUDA_LORA_SUMS", "separate");
    auto on = make(shape, options(mode, 2, keep_layers, r));
    ASSERT_TRUE(on);
    expect_same_trace(serial, train(*on, mbs, 3));
  }
}

TEST(CudaLoraOverlap, StepsAreBitwiseTheSerialOnes) {
  SKIP_WITHOUT_GPU();
  const CudaModelShape llama = small_shape(false);
  run_modes(llama, CudaRecompute::kNone, -1, "none");
  run_modes(llama, CudaRecompute::kSelective, 0, "selective");
  run_modes(llama, CudaRecompute::kSelective, 1, "selective, layer 0 keeping q/k/v and h_mid");
  run_modes(llama, CudaRecompute::kFull, -1, "full");
  run_modes(small_shape(true), CudaRecompute::kSelective, 1, "selective, q|k|v bias and q/k norms, r 32", 32);
}

// The switch: an option, else the environment (0, 1 or 2; anything else is
// refused naming the variable); the side stream's scratch is planned only
// when it is on, and never with LoRA dropout (which stays on one stream).
TEST(CudaLoraOverlap, PlansTheSideScratchAndRefusesBadSwitches) {
  const CudaModelShape shape = small_shape(false);
  auto bytes = [&](CudaTrainOptions o) {
    auto p = CudaTrainableModel::plan_arena(shape, o);
    EXPECT_TRUE(p.is_ok()) << p.status().message();
    return p.is_ok() ? p->bytes : 0;
  };
  const int64_t off = bytes(options(CudaRecompute::kNone, 0)), on = bytes(options(CudaRecompute::kNone, 1));
  EXPECT_EQ(on, off);  // over tmp_h
  CudaTrainOptions drop = options(CudaRecompute::kNone, 1);
  drop.lora_dropout = 0.1f;
  CudaTrainOptions drop_off = drop;
  drop_off.lora_overlap = 0;
  EXPECT_EQ(bytes(drop), bytes(drop_off));
  auto bad = CudaTrainableModel::plan_arena(shape, options(CudaRecompute::kNone, 3));
  EXPECT_FALSE(bad.is_ok());
  // At the benchmark's shapes the side scratch (f32 [tokens, 12r]) costs
  // nothing: it lies over tmp_h, dead while the side stream runs.
  CudaModelShape b8{.vocab = 128256, .hidden = 4096, .inter = 14336, .n_layer = 32, .n_head = 32, .n_kv = 8,
                    .head_dim = 128, .eps = 1e-5f};
  b8.inv_freq.assign(64, 1.0f);
  CudaModelShape b1{.vocab = 128256, .hidden = 2048, .inter = 8192, .n_layer = 16, .n_head = 32, .n_kv = 8,
                    .head_dim = 64, .eps = 1e-5f, .tied = true};
  b1.inv_freq.assign(32, 1.0f);
  struct Case {
    const char* name;
    const CudaModelShape* shape;
    int64_t tokens;
    CudaRecompute mode;
    int64_t budget;
  };
  for (const Case& c : {Case{"1B", &b1, 16384, CudaRecompute::kNone, 0},
                        Case{"8B", &b8, 8192, CudaRecompute::kSelective, int64_t(35.9 * double(1 << 30))}}) {
    CudaTrainOptions o{.max_tokens = c.tokens, .lora_r = 32, .recompute = c.mode, .max_arena_bytes = c.budget};
    o.lora_overlap = 0;
    auto p0 = CudaTrainableModel::plan_arena(*c.shape, o);
    o.lora_overlap = 1;
    auto p1 = CudaTrainableModel::plan_arena(*c.shape, o);
    ASSERT_TRUE(p0.is_ok() && p1.is_ok());
    const int64_t scratch = c.tokens * 12 * 32 * 4;
    EXPECT_EQ(p1->bytes, p0->bytes) << c.name;
    EXPECT_EQ(p1->layers_kept, p0->layers_kept) << c.name;
    std::printf("%s arena bytes: overlap off %lld, on %lld (side scratch %lld bytes, kept layers %lld)\n", c.name,
                (long long)p0->bytes, (long long)p1->bytes, (long long)scratch, (long long)p1->layers_kept);
  }

  const char* saved = std::getenv("LATHE_CUDA_LORA_OVERLAP");
  const std::optional<std::string> restore = saved ? std::optional<std::string>(saved) : std::nullopt;
  ::setenv("LATHE_CUDA_LORA_OVERLAP", "7", 1);
  auto from_env = CudaTrainableModel::plan_arena(shape, options(CudaRecompute::kNone, -1));
  ::setenv("LATHE_CUDA_LORA_OVERLAP", "1", 1);
  const int64_t env_on = bytes(options(CudaRecompute::kNone, -1));
  if (restore) {
    ::setenv("LATHE_CUDA_LORA_OVERLAP", restore->c_str(), 1);
  } else {
    ::unsetenv("LATHE_CUDA_LORA_OVERLAP");
  }
  ASSERT_FALSE(from_env.is_ok());
  EXPECT_NE(from_env.status().message().find("LATHE_CUDA_LORA_OVERLAP"), std::string::npos)
      << from_env.status().message();
  EXPECT_EQ(env_on, on);
  ScopedEnv sums("LATHE_CUDA_LORA_SUMS", "apart");
  auto bad_sums = CudaTrainableModel::plan_arena(shape, options(CudaRecompute::kNone, 1));
  ASSERT_FALSE(bad_sums.is_ok());
  EXPECT_NE(bad_sums.status().message().find("LATHE_CUDA_LORA_SUMS"), std::string::npos)
      << bad_sums.status().message();
}

}  // namespace
}  // namespace lathe
