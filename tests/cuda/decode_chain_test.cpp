// CudaCausalLM's decoding fed on the device (start_decode / next_tokens /
// stop_decode, forward_pick): the tokens picked there (greedy, drawn, with
// a repetition penalty) against the host-fed calls and host-side rules on
// the same logits, on random-init models with head_dim 64 and 128. Without
// a GPU the tests skip themselves.
#include <gtest/gtest.h>

#include <set>
#include <span>
#include <string>
#include <vector>

#include "backends/cuda/device.h"
#include "cuda/gen_test_util.h"
#include "engine/sampler.h"
#include "models/cuda_causal_lm.h"

namespace lathe {
namespace {

using namespace gen_test;

class CudaDecodeChain : public ::testing::TestWithParam<FlashCase> {};

// Greedy decoding fed on the device (start_decode / next_tokens) picks what
// decode_batch_greedy() picks step by step, for one sequence and for two of
// different lengths, eager and replayed, over more steps than it queues;
// stopping early leaves each sequence holding the steps taken, so decoding
// on from there gives the same ids. Drawn, the chain gives forward_pick()'s
// tokens step by step and the same tokens for the same seed; with a
// repetition penalty, greedy gives the host's rule on the same logits. Bad
// calls are clear errors.
TEST_P(CudaDecodeChain, DeviceFedEqualsHostFed) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device visible: runs on the GPU machine";
  const FlashCase& c = GetParam();
  FlashModel dir(c, "_fed");
  std::vector<int32_t> prompt = flash_prompt(20, 37, 11);
  constexpr int kSteps = 3 * CudaCausalLM::kDecodeDepth + 1;
  auto gpu = load_gpu(dir.str(), {.max_seq = int(prompt.size()) + kSteps, .max_batch = 2});
  std::vector<float> logits(static_cast<size_t>(gpu->config().vocab_size));
  // Sequence s gets the prompt less 2·s tokens; returns each one's first pick.
  auto prefill = [&](int b) {
    gpu->clear();
    std::vector<int32_t> first;
    for (int s = 0; s < b; ++s) {
      EXPECT_TRUE(gpu->forward_seq(s, std::vector<int32_t>(prompt.begin(), prompt.end() - 2 * s), logits).is_ok());
      first.push_back(argmax(logits));
    }
    return first;
  };
  auto host_fed = [&](std::vector<int32_t> cur, int steps) {
    std::vector<int32_t> ids, next(cur.size());
    for (int i = 0; i < steps; ++i) {
      Status st = gpu->decode_batch_greedy(cur, next);
      EXPECT_TRUE(st.is_ok()) << st.message();
      ids.insert(ids.end(), next.begin(), next.end());
      cur = next;
    }
    return ids;
  };
  auto greedy_checks = [&] {
    for (bool graphs : {false, true})
      for (int b : {1, 2}) {
        SCOPED_TRACE(::testing::Message() << (graphs ? "graphs" : "eager") << ", " << b << " sequences");
        gpu->set_use_graphs(graphs);
        const std::vector<int32_t> want = host_fed(prefill(b), kSteps);
        const std::vector<int32_t> first = prefill(b);
        Status st = gpu->start_decode(first, kSteps);
        ASSERT_TRUE(st.is_ok()) << st.message();
        std::vector<int32_t> got, picks(static_cast<size_t>(b));
        for (int i = 0; i < kSteps; ++i) {
          st = gpu->next_tokens(picks);
          ASSERT_TRUE(st.is_ok()) << "step " << i << ": " << st.message();
          got.insert(got.end(), picks.begin(), picks.end());
        }
        EXPECT_EQ(got, want);
        for (int s = 0; s < b; ++s) EXPECT_EQ(gpu->n_tokens(s), int(prompt.size()) - 2 * s + kSteps) << s;
        st = gpu->next_tokens(picks);
        EXPECT_NE(st.message().find("were taken"), std::string::npos) << st.message();
        gpu->stop_decode();

        // Three steps, then the rest host-fed from the last pick.
        ASSERT_TRUE(gpu->start_decode(prefill(b), kSteps).is_ok());
        std::vector<int32_t> part;
        for (int i = 0; i < 3; ++i) {
          ASSERT_TRUE(gpu->next_tokens(picks).is_ok());
          part.insert(part.end(), picks.begin(), picks.end());
        }
        gpu->stop_decode();
        for (int s = 0; s < b; ++s) EXPECT_EQ(gpu->n_tokens(s), int(prompt.size()) - 2 * s + 3) << s;
        const std::vector<int32_t> rest = host_fed(picks, kSteps - 3);
        part.insert(part.end(), rest.begin(), rest.end());
        EXPECT_EQ(part, want) << "stopped after 3 steps, then host-fed";
      }
  };
  greedy_checks();
  {
    // Two sequences through cuBLASLt (CudaModelOptions::cublas_decode_rows): no
    // pick fuses into its LM head, so the chain's picks are kernels of their own.
    SCOPED_TRACE("projections through cuBLASLt from 2 sequences on");
    auto ring = std::move(gpu);
    gpu = load_gpu(dir.str(), {.max_seq = int(prompt.size()) + kSteps, .max_batch = 2, .cublas_decode_rows = 2});
    greedy_checks();
    gpu = std::move(ring);
  }
  // Drawn on the device: the chain gives forward_pick()'s tokens step by step
  // (the same salts: each token's position), the same seed the same tokens.
  if (gpu->samples_on_device()) {
    auto drawn = [&](const CudaSampling& cs, bool chained) {
      gpu->clear();
      std::vector<int32_t> ids;
      auto id = gpu->forward_pick(prompt, cs);
      EXPECT_TRUE(id.is_ok()) << id.status().message();
      ids.push_back(id.is_ok() ? id.value() : -1);
      if (chained) {
        EXPECT_TRUE(gpu->start_decode(std::vector<int32_t>{ids.back()}, kSteps, cs).is_ok());
        std::vector<int32_t> one(1);
        for (int i = 0; i < kSteps; ++i) {
          EXPECT_TRUE(gpu->next_tokens(one).is_ok());
          ids.push_back(one[0]);
        }
        gpu->stop_decode();
      } else {
        for (int i = 0; i < kSteps; ++i) {
          id = gpu->forward_pick(std::vector<int32_t>{ids.back()}, cs);
          EXPECT_TRUE(id.is_ok()) << id.status().message();
          ids.push_back(id.is_ok() ? id.value() : -1);
        }
      }
      return ids;
    };
    const CudaSampling cs{.temperature = 1.5f, .top_k = 200, .top_p = 0.95f, .seed = 42};
    const std::vector<int32_t> chain = drawn(cs, true);
    EXPECT_EQ(chain, drawn(cs, false)) << "chained against step by step";
    EXPECT_EQ(chain, drawn(cs, true)) << "the same seed again";
    CudaSampling other = cs;
    other.seed = 43;
    EXPECT_NE(chain, drawn(other, true)) << "another seed";
    EXPECT_EQ(std::set<int32_t>(chain.begin(), chain.end()).size() > 1, true) << "drew one token throughout";

    // A repetition penalty over everything the sequence holds: the CPU
    // sampler's rule on the same logits, step by step on the host.
    const CudaSampling pen{.repetition_penalty = 1.8f};
    gpu->clear();
    std::vector<int32_t> context = prompt, want;
    ASSERT_TRUE(gpu->forward(prompt, logits).is_ok());
    for (int i = 0; i <= kSteps; ++i) {
      if (i > 0) ASSERT_TRUE(gpu->forward(std::vector<int32_t>{want.back()}, logits).is_ok());
      apply_repetition_penalty(logits, context, pen.repetition_penalty);
      want.push_back(argmax(logits));
      context.push_back(want.back());
    }
    EXPECT_EQ(drawn(pen, true), want) << "greedy with a repetition penalty";
    EXPECT_NE(drawn({}, true), want) << "the penalty changed nothing";
  }
  std::vector<int32_t> picks(1), first = prefill(1);
  Status st = gpu->next_tokens(picks);
  EXPECT_NE(st.message().find("start_decode"), std::string::npos) << st.message();
  st = gpu->start_decode(first, kSteps + 1);
  EXPECT_NE(st.message().find("overflow"), std::string::npos) << st.message();
  st = gpu->start_decode(first, 0);
  EXPECT_NE(st.message().find("max_steps"), std::string::npos) << st.message();
  st = gpu->start_decode(std::vector<int32_t>{1 << 20}, 2);
  EXPECT_NE(st.message().find("outside the vocabulary"), std::string::npos) << st.message();
  ASSERT_TRUE(gpu->start_decode(first, 2).is_ok());
  std::vector<int32_t> two(2);
  st = gpu->next_tokens(two);
  EXPECT_NE(st.message().find("expected 1"), std::string::npos) << st.message();
  EXPECT_EQ(gpu->n_tokens(0), int(prompt.size())) << "a refused call appended nothing";
}

INSTANTIATE_TEST_SUITE_P(HeadDims, CudaDecodeChain,
                         ::testing::Values(FlashCase{"llama", 64, 0}, FlashCase{"mistral", 128, 8}),
                         [](const auto& info) { return info.param.family + std::to_string(info.param.head_dim); });

}  // namespace
}  // namespace lathe
