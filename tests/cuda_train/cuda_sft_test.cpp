// Full-parameter SFT on the GPU (train/cuda_model_sft.cpp) against
// transformers and the CPU trainer: the loss and the gradients of the
// embedding, norms (Qwen3: a k_norm), projections (Qwen2: a q_proj bias) and
// the LM head (tied on Llama) on the head_dim-64 fixtures of
// tools/make_cuda_grad_fixtures.py (full_grads.safetensors); every weight's
// gradient against the CPU trainer on one packed batch of three documents;
// a pass repeated, and rerun under each recompute mode, giving the same
// bits; AdamW steps tracking the CPU run; and the memory refusal. Every GPU
// test skips itself without a visible GPU.
//
// Bounds: tests/data/grad_hd64/bf16_error_full.json, made by
// `tools/bf16_grad_error.py --full`, holds per gradient tensor (and the loss)
// how far transformers' own bf16 step (the model loaded in bf16, every weight
// trainable) is from its f32 step on the same model and batch, for three
// equally valid bf16 runs: sdpa attention ("error"), eager ("eager") and sdpa
// forced to its MATH backend ("math"): "full/<family>" on the fixture batch,
// "full_packed/<family>" on random_batch(vocab, 17). They are held as the
// LoRA tests hold theirs (cuda_train_test.cpp argues it; hf_bf16_check.h):
// each tensor within 2 × the largest of HF's errors, and per case the median
// of error / that error at most 1. The third run is there for the loss: a
// scalar whose bf16 error is a sum of per-token errors that mostly cancel,
// so one run can land anywhere near zero. HF's sdpa and eager runs of
// full_packed/llama are 3.5e-6 and 3.7e-5 from f32, its math run 2.5e-4 (this
// pass: 2.46e-4 on the H200, and 3e-6 to 2.7e-4 over tools/emulate_cuda_sft.py's
// noise draws): two runs bounded it at 8e-5, HF's own spread is wider. Per
// gradient HF's three runs are at most 2.2× apart (90% within 1.54×), and the
// bug below is ≥ 25.8× HF's largest error on every gradient. A missing entry
// fails. Without a GPU the same bounds are shown to pass the f32 CPU trainer
// and to fail a real bug (the documents attending to each other) by far.
// tools/emulate_cuda_sft.py replays the GPU pass on the CPU against these
// bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "backends/cuda/device.h"
#include "io/safetensors.h"
#include "cuda_train/fixture_util.h"
#include "cuda_train/hf_bf16_check.h"
#include "train/adamw.h"
#include "train/cuda_trainable.h"
#include "train/trainable_model.h"

namespace lathe {
namespace {

using namespace lathe::testing;  // NOLINT: the shared fixture helpers

const std::string kFix = data_dir() + "/grad_hd64/";
// A bug must be this many times outside every per-tensor bound (as for LoRA).
constexpr double kBugFactor = 5.0;

testing::HfBf16Bounds bounds(const std::string& name) { return {kFix + "bf16_error_full.json", name}; }

std::unique_ptr<TrainableModel> load_full(const std::string& family, bool checkpoint = false) {
  auto m = TrainableModel::load(kFix + family + "/model", {.full_sft = true, .activations_checkpoint = checkpoint});
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  return m.is_ok() ? std::move(m).value() : nullptr;
}

std::unique_ptr<CudaTrainableModel> to_gpu(TrainableModel& host, std::optional<CudaRecompute> mode = std::nullopt) {
  auto g = upload_to_cuda(host, 0, 256, {}, mode);
  EXPECT_TRUE(g.is_ok()) << g.status().message();
  return g.is_ok() ? std::move(g).value() : nullptr;
}

// The fixture model of `family` for full SFT on the host and its GPU copy
// (null, with a test failure, where either fails).
struct FullPair {
  std::unique_ptr<TrainableModel> host;
  std::unique_ptr<CudaTrainableModel> gpu;
};
FullPair full_pair(const std::string& family) {
  FullPair p{.host = load_full(family), .gpu = nullptr};
  if (p.host) p.gpu = to_gpu(*p.host);
  return p;
}

SafetensorsFile open_fixture(const std::string& family) {
  auto f = SafetensorsFile::open(kFix + family + "/full_grads.safetensors");
  EXPECT_TRUE(f.is_ok()) << f.status().message();
  return std::move(f).value();
}

bool is_grad(const std::string& name) {
  return name != "input_ids" && name != "labels" && name != "lengths" && name != "loss";
}

class CudaSftFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaSftFixture, LossAndGradientsMatchTransformers) {
  SKIP_WITHOUT_GPU();
  const std::string family = GetParam();
  auto [host, gpu] = full_pair(family);
  ASSERT_TRUE(host && gpu);
  ASSERT_EQ(gpu->n_params(), int64_t(host->params().size()));
  SafetensorsFile file = open_fixture(family);
  MicroBatch mb = fixture_batch(file);
  auto loss = gpu->forward_backward(mb, 1.0f / float(mb.n_supervised));
  ASSERT_TRUE(loss.is_ok()) << loss.status().message();
  const double want = file.tensor("loss").value().data<double>()[0];
  testing::HfBf16Bounds check = bounds("full/" + family);
  check.expect("loss", std::abs(loss->loss_sum / double(loss->n_supervised) - want) / want);
  std::vector<float> g = grads_of(*gpu);
  int checked = 0;
  for (const SafetensorsEntry& e : file.entries()) {
    if (!is_grad(e.name)) continue;
    const ParamInfo* p = host->find_param(e.name);
    ASSERT_NE(p, nullptr) << e.name;
    Tensor w = file.tensor(e.name).value();
    const double err = rel_error(g.data() + p->offset, w.data<float>(), w.numel());
    check.expect(e.name, err);
    std::printf("%s %-50s %.4f (HF %.4f)\n", family.c_str(), e.name.c_str(), err, check.hf(e.name));
    ++checked;
  }
  EXPECT_GE(checked, 4);
  check.expect_median();
}

// Without a GPU: the f32 CPU trainer is inside every bound, and the documents
// merged into one (a packing bug) put every gradient ≥ 5× outside its bound
// and the median error ≥ 10× HF's.
TEST_P(CudaSftFixture, TolerancesPassTheCpuTrainerAndFailABug) {
  const std::string family = GetParam();
  SafetensorsFile file = open_fixture(family);
  MicroBatch good = fixture_batch(file);
  MicroBatch bad = good;
  bad.cu_seqlens = {0, int32_t(bad.input_ids.size())};
  bad.max_seqlen = int32_t(bad.input_ids.size());
  for (size_t j = 0; j < bad.position_ids.size(); ++j) bad.position_ids[j] = int32_t(j);
  for (const MicroBatch* mb : {&good, &bad}) {
    auto host = load_full(family);
    ASSERT_TRUE(host);
    ASSERT_TRUE(host->forward_backward(*mb, 1.0f / float(mb->n_supervised)).is_ok());
    testing::HfBf16Bounds check = bounds("full/" + family);
    int checked = 0;
    for (const SafetensorsEntry& e : file.entries()) {
      if (!is_grad(e.name)) continue;
      const ParamInfo* p = host->find_param(e.name);
      ASSERT_NE(p, nullptr) << e.name;
      Tensor w = file.tensor(e.name).value();
      const double err = rel_error(host->grads().data() + p->offset, w.data<float>(), w.numel());
      if (mb == &good) {
        check.expect(e.name, err);
      } else {
        EXPECT_GE(err, kBugFactor * check.bound(e.name)) << family << " " << e.name << " (documents merged)";
        check.record(e.name, err);
      }
      ++checked;
    }
    EXPECT_GE(checked, 4);
    if (mb == &good) {
      check.expect_median();
    } else {
      EXPECT_GE(check.median(), 10.0) << family << " (documents merged)";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CudaSftFixture, ::testing::Values("llama", "qwen2", "qwen3"));

class CudaSftVsCpu : public ::testing::TestWithParam<const char*> {};

// Every weight's gradient, the GPU against the f32 CPU trainer.
TEST_P(CudaSftVsCpu, PackedBatchMatchesTheCpuTrainer) {
  SKIP_WITHOUT_GPU();
  const std::string family = GetParam();
  auto [host, gpu] = full_pair(family);
  ASSERT_TRUE(host && gpu);
  MicroBatch mb = random_batch(host->config().vocab_size, 17);
  HfBf16Bounds check = bounds("full_packed/" + family);
  expect_pass_matches_cpu(*host, *gpu, mb, check);
}

INSTANTIATE_TEST_SUITE_P(Families, CudaSftVsCpu, ::testing::Values("llama", "qwen2", "qwen3"));

// The gradient sums run in a fixed order: the same pass twice, on one model
// (accumulated: exactly twice the first) and on models under each
// recompute mode, gives the same bits.
class CudaSftDeterminism : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaSftDeterminism, RepeatedAndRecomputedPassesAreBitwiseEqual) {
  SKIP_WITHOUT_GPU();
  auto host = load_full(GetParam());
  ASSERT_TRUE(host);
  MicroBatch mb = random_batch(host->config().vocab_size, 5);
  auto first = to_gpu(*host, CudaRecompute::kNone);
  ASSERT_TRUE(first);
  ASSERT_TRUE(first->forward_backward(mb, 0.01f).is_ok());
  const std::vector<float> want = grads_of(*first);
  for (CudaRecompute mode : {CudaRecompute::kNone, CudaRecompute::kSelective, CudaRecompute::kFull}) {
    auto other = to_gpu(*host, mode);
    ASSERT_TRUE(other);
    ASSERT_TRUE(other->forward_backward(mb, 0.01f).is_ok());
    EXPECT_EQ(grads_of(*other), want) << "recompute mode " << int(mode);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CudaSftDeterminism, ::testing::Values("qwen2", "qwen3"));

// A few AdamW steps: losses and gradient norms track the CPU's, and the
// loss falls (the bf16 copies the passes read follow the masters); the
// parameters and moments come back through the host table.
TEST(CudaSft, AdamWStepsTrackTheCpuRun) {
  SKIP_WITHOUT_GPU();
  auto [host, gpu] = full_pair("qwen2");
  ASSERT_TRUE(host && gpu);
  std::vector<AdamWParam> ps;
  for (const ParamInfo& p : host->param_table())
    ps.push_back({.name = p.name, .param = host->params().data() + p.offset, .grad = host->grads().data() + p.offset,
                  .n = p.numel()});
  auto cpu_opt = AdamW::create({}, std::move(ps));
  ASSERT_TRUE(cpu_opt.is_ok()) << cpu_opt.status().message();
  const std::vector<float> start(host->params().begin(), host->params().end());
  MicroBatch mb = random_batch(host->config().vocab_size, 99);
  const double lr = 1e-3;
  double first = 0, last_cpu = 0, last_gpu = 0;
  track_adamw_steps(*host, *gpu, *cpu_opt, mb, lr, 6, 5 * kTrackLossTol, kTrackGradTol, &first, &last_cpu, &last_gpu);
  EXPECT_LT(last_cpu, 0.9 * first);
  EXPECT_LT(last_gpu, 0.9 * first);
  // The masters come back in the host's layout: every tensor moved (the
  // update reached it) and stays within a few steps' worth of the CPU's.
  std::vector<float> params(size_t(gpu->n_params()));
  ASSERT_TRUE(gpu->download_params(params).is_ok());
  std::vector<float> m, v;
  for (size_t i = 0; i < host->param_table().size(); ++i) {
    const ParamInfo& p = host->param_table()[i];
    ASSERT_TRUE(gpu->optimizer().read_moments(gpu->context(), i, &m, &v).is_ok());
    ASSERT_EQ(int64_t(m.size()), p.numel()) << p.name;
    double moved = 0, off_cpu = 0;
    for (int64_t k = p.offset; k < p.offset + p.numel(); ++k) {
      moved = std::max(moved, double(std::abs(params[size_t(k)] - start[size_t(k)])));
      off_cpu = std::max(off_cpu, double(std::abs(params[size_t(k)] - host->params()[size_t(k)])));
    }
    EXPECT_GE(moved, 0.5 * lr) << p.name;
    EXPECT_LE(off_cpu, 2 * 6 * lr) << p.name;  // Adam moves a weight by ≲ lr a step, on either device
  }
  EXPECT_EQ(gpu->optimizer().steps_taken(), 6);
}

// Llama-3.1-8B and Llama-3.2-1B: bf16 copies, f32 masters and gradients in
// the arena, AdamW's moments beside it (18 bytes a parameter). 8B full SFT
// does not fit one H200 (~140 GiB); 1B takes ~21 GiB plus activations.
CudaModelShape llama_shape(bool big) {
  CudaModelShape s{.vocab = 128256, .hidden = big ? 4096 : 2048, .inter = big ? 14336 : 8192,
                   .n_layer = big ? 32 : 16, .n_head = 32, .n_kv = 8, .head_dim = big ? 128 : 64, .eps = 1e-5f,
                   .tied = !big};
  s.inv_freq.assign(size_t(s.head_dim / 2), 1.0f);
  return s;
}

TEST(CudaSft, PlansMastersGradientsAndMoments) {
  const CudaTrainOptions o{.max_tokens = 4096, .full_sft = true};
  for (bool big : {false, true}) {
    const CudaModelShape s = llama_shape(big);
    auto full = CudaTrainableModel::plan_arena(s, o);
    ASSERT_TRUE(full.is_ok()) << full.status().message();
    const int64_t H = s.hidden, kv = s.n_kv * s.head_dim, q = s.n_head * s.head_dim;
    const int64_t per_layer = 2 * H + H * q + 2 * H * kv + q * H + 3 * H * s.inter;
    const int64_t n = s.vocab * H * (s.tied ? 1 : 2) + H + s.n_layer * per_layer;  // every size a multiple of 16
    EXPECT_EQ(full->optimizer_bytes, 8 * n);
    EXPECT_GE(full->bytes, 10 * n);  // bf16 copies, f32 masters and gradients
    const double gib = double(full->bytes + full->optimizer_bytes) / double(int64_t{1} << 30);
    std::printf("llama %s full SFT: %.1f B parameters, %.1f GiB\n", big ? "8B" : "1B", double(n) / 1e9, gib);
    if (big) {
      EXPECT_GT(gib, 141.0);
    } else {
      EXPECT_LT(gib, 40.0);
    }
  }
}

// Full SFT ignores the LoRA options (targets default to all seven, as
// bench_train_cuda leaves them): no LoRA member, so the same plan as none.
TEST(CudaSft, IgnoresTheLoraOptions) {
  CudaTrainOptions none{.max_tokens = 512, .lora_r = 8, .targets = {}, .full_sft = true};
  CudaTrainOptions all{.max_tokens = 512, .lora_r = 8, .full_sft = true};
  auto a = CudaTrainableModel::plan_arena(llama_shape(false), none);
  auto b = CudaTrainableModel::plan_arena(llama_shape(false), all);
  ASSERT_TRUE(a.is_ok() && b.is_ok()) << a.status().message() << b.status().message();
  EXPECT_EQ(a->bytes, b->bytes);
  EXPECT_EQ(a->optimizer_bytes, b->optimizer_bytes);
}

// From a shape alone, as bench_train_cuda builds it: random weights, the
// masters taken from them, one pass with every weight's gradient set.
TEST(CudaSft, TrainsFromAShapeAlone) {
  SKIP_WITHOUT_GPU();
  CudaModelShape s{.vocab = 384, .hidden = 128, .inter = 128, .n_layer = 2, .n_head = 2, .n_kv = 1, .head_dim = 64};
  s.inv_freq.assign(32, 1.0f);
  auto g = CudaTrainableModel::create(s, {.max_tokens = 256, .full_sft = true});
  ASSERT_TRUE(g.is_ok()) << g.status().message();
  ASSERT_TRUE((*g)->fill_random(7).is_ok());
  MicroBatch mb = random_batch(s.vocab, 11);
  auto loss = (*g)->forward_backward(mb, 1.0f / float(mb.n_supervised));
  ASSERT_TRUE(loss.is_ok()) << loss.status().message();
  EXPECT_TRUE(std::isfinite(loss->loss_sum));
  const std::vector<float> grads = grads_of(**g);
  for (const ParamInfo& p : (*g)->param_table()) {
    double most = 0;
    for (int64_t i = p.offset; i < p.offset + p.numel(); ++i) most = std::max(most, double(std::abs(grads[size_t(i)])));
    EXPECT_GT(most, 0.0) << p.name;
  }
  std::vector<float> params(size_t((*g)->n_params()));
  ASSERT_TRUE((*g)->download_params(params).is_ok());
  EXPECT_NE(params[0], 0.0f);  // the masters hold the random weights
}

TEST(CudaSft, RefusesWhatTheDeviceCannotHold) {
  SKIP_WITHOUT_GPU();
  auto g = CudaTrainableModel::create(llama_shape(true), {.max_tokens = 4096, .full_sft = true});
  ASSERT_FALSE(g.is_ok());
  EXPECT_EQ(g.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(g.status().message().find("GiB of device memory"), std::string::npos) << g.status().message();
  std::printf("%s\n", g.status().message().c_str());
}

}  // namespace
}  // namespace lathe
