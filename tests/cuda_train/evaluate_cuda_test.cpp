// The GPU's EvalModel (train/evaluate_cuda.cpp) against the CPU's evaluate()
// on the head_dim-64 Llama fixture with its PEFT adapter merged
// (tests/data/grad_hd64/llama): the loss per record and overall, the loss
// run in small chunks against one pass, and greedy generation starting a
// fresh sequence on every call. Skips itself without a visible GPU, except
// the check that a machine without one gets a clear error.
//
// Tolerance of a loss: a record's loss is a mean of lse(z) − z_target over
// its targets, and moving every logit by at most d moves each term by at most
// 2d. The logits' bf16 error bound is Hugging Face's own bf16-vs-f32 error
// on a head_dim-64 Llama (case random/llama64 of
// tests/data/models/bf16_error.json, max|Δz| / max|z|), so
// |Δloss| ≤ 2 · error · max|z|, with max|z| over the CPU's logits of the set.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda/device.h"
#include "cuda_train/fixture_util.h"
#include "train/evaluate.h"

namespace lathe {
namespace {

std::string test_data() {
  const char* env = std::getenv("LATHE_TEST_DATA");
  return env && *env ? env : LATHE_TEST_DATA;
}
std::string model_dir() { return test_data() + "/grad_hd64/llama/model"; }
std::string adapter_dir() { return test_data() + "/grad_hd64/llama/adapter"; }

// HF's bf16 logit error on random/llama64; 0 (failing every check) when missing.
double logit_error() {
  const std::string path = test_data() + "/models/bf16_error.json";
  try {
    std::ifstream f(path);
    if (!f) throw std::runtime_error("cannot open the file");
    return nlohmann::json::parse(f).at("cases").at("random/llama64").at("error").get<double>();
  } catch (const std::exception& e) {
    ADD_FAILURE() << path << ": " << e.what();
    return 0;
  }
}

// Three records of 19, 40 and 300 tokens (ids inside the fixture's 384),
// targets on the second half, the first two with a generation context.
std::vector<EvalRecord> records() {
  std::vector<EvalRecord> out;
  for (int n : {19, 40, 300}) {
    EvalRecord r;
    for (int i = 0; i < n; ++i) {
      r.example.input_ids.push_back((i * 37 + n * 11 + 5) % 384);
      r.example.loss_mask.push_back(i >= n / 2 ? 1 : 0);
    }
    if (n < 300) {
      r.generation_context = std::vector<int32_t>(r.example.input_ids.begin(), r.example.input_ids.begin() + n / 2);
      r.reference = "x";
    }
    out.push_back(std::move(r));
  }
  return out;
}

// max|z| over the CPU's logits of every record.
double max_abs_logit(const CausalLM& m, const std::vector<EvalRecord>& recs) {
  double most = 0;
  for (const EvalRecord& r : recs) {
    const auto n = int64_t(r.example.input_ids.size());
    KvCache cache = m.new_cache(int(n));
    Tensor logits = Tensor::empty(DType::F32, {n, m.config().vocab_size});
    Status s = m.forward(r.example.input_ids, cache, logits, true);
    EXPECT_TRUE(s.is_ok()) << s.message();
    for (int64_t i = 0; i < logits.numel(); ++i) most = std::max(most, std::abs(double(logits.data<float>()[i])));
  }
  return most;
}

const EvalOptions kLossOnly{.generate = false};

TEST(CudaEval, LossMatchesCpuWithinBf16Bound) {
  SKIP_WITHOUT_GPU();
  const std::vector<EvalRecord> recs = records();
  auto cpu = CausalLM::load(model_dir(), {.adapter_dir = adapter_dir()});
  ASSERT_TRUE(cpu.is_ok()) << cpu.status().message();
  auto want = evaluate(**cpu, recs, kLossOnly);
  ASSERT_TRUE(want.is_ok()) << want.status().message();
  const double tol = 2 * logit_error() * max_abs_logit(**cpu, recs);

  auto gpu = cuda_eval_model({.model_dir = model_dir(), .adapter_dir = adapter_dir(), .max_new_tokens = 0}, recs);
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().message();
  EXPECT_EQ((*gpu)->device(), Device::cuda(0));
  auto got = evaluate(**gpu, recs, kLossOnly);
  ASSERT_TRUE(got.is_ok()) << got.status().message();
  EXPECT_EQ(got->n_supervised_tokens, want->n_supervised_tokens);
  EXPECT_LE(std::abs(got->loss - want->loss), tol) << "cpu " << want->loss << " gpu " << got->loss;
  for (size_t i = 0; i < recs.size(); ++i)
    EXPECT_LE(std::abs(got->records[i].loss - want->records[i].loss), tol) << "record " << i;
}

TEST(CudaEval, ChunkedLossEqualsOnePass) {
  SKIP_WITHOUT_GPU();
  const std::vector<EvalRecord> recs = records();
  auto whole = cuda_eval_model({.model_dir = model_dir(), .max_new_tokens = 0, .chunk_tokens = 512}, recs);
  auto chunked = cuda_eval_model({.model_dir = model_dir(), .max_new_tokens = 0, .chunk_tokens = 7}, recs);
  ASSERT_TRUE(whole.is_ok()) << whole.status().message();
  ASSERT_TRUE(chunked.is_ok()) << chunked.status().message();
  auto a = evaluate(**whole, recs, kLossOnly);
  auto b = evaluate(**chunked, recs, kLossOnly);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  auto cpu = CausalLM::load(model_dir());
  ASSERT_TRUE(cpu.is_ok());
  const double tol = 2 * logit_error() * max_abs_logit(**cpu, recs);
  for (size_t i = 0; i < recs.size(); ++i)
    EXPECT_LE(std::abs(a->records[i].loss - b->records[i].loss), tol) << "record " << i;
}

TEST(CudaEval, GreedyStartsFreshAndStops) {
  SKIP_WITHOUT_GPU();
  const std::vector<EvalRecord> recs = records();
  auto gpu = cuda_eval_model({.model_dir = model_dir(), .max_new_tokens = 6}, recs);
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().message();
  const std::vector<int32_t>& ctx = *recs[1].generation_context;
  auto first = (*gpu)->greedy(ctx, 6, {});
  ASSERT_TRUE(first.is_ok()) << first.status().message();
  ASSERT_EQ(first->size(), 6u);
  // Another record in between: the next call still starts from position 0.
  ASSERT_TRUE((*gpu)->greedy(*recs[0].generation_context, 6, {}).is_ok());
  auto again = (*gpu)->greedy(ctx, 6, {});
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(*again, *first);
  // A stop id ends the continuation before it.
  auto stopped = (*gpu)->greedy(ctx, 6, std::vector<int32_t>{(*first)[2]});
  ASSERT_TRUE(stopped.is_ok());
  const size_t cut = size_t(std::find(first->begin(), first->end(), (*first)[2]) - first->begin());
  EXPECT_EQ(*stopped, std::vector<int32_t>(first->begin(), first->begin() + cut));
}

TEST(CudaEval, WithoutGpuSaysSo) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is visible";
  auto gpu = cuda_eval_model({.model_dir = model_dir()}, records());
  ASSERT_FALSE(gpu.is_ok());
  EXPECT_EQ(gpu.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(gpu.status().message().find("CUDA"), std::string::npos) << gpu.status().message();
}

}  // namespace
}  // namespace lathe
