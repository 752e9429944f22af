// TrainableModel against transformers + PEFT (fixtures by
// tools/make_grad_fixtures.py): the loss and every LoRA A/B gradient on tiny
// Llama, Qwen2 and Qwen3 models, full-SFT gradients of the embedding, norms,
// projections and LM head; then lathe's own invariants: packed = unpacked,
// activation recomputation changes nothing, a fresh adapter starts at the
// base model, adapters round-trip through PEFT's format, and bf16-mixed
// (frozen base in bf16) stays close to f32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "io/safetensors.h"
#include "train/trainable_model.h"
#include "grad_fixture.h"

namespace lathe {
namespace {

using namespace lathe::testing;  // NOLINT: the shared fixture helpers

const std::string kModels = LATHE_TEST_DATA "/models/";
const std::string kGrad = LATHE_TEST_DATA "/grad/";



// family: a directory under tests/data/models, or an absolute path.
std::unique_ptr<TrainableModel> load(const std::string& family, TrainableModelOptions opts) {
  auto m = TrainableModel::load(family.front() == '/' ? family : kModels + family, opts);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  return m.is_ok() ? std::move(m).value() : nullptr;
}

// Runs the fixture's batch and compares the loss and every gradient the fixture holds.
void expect_matches_fixture(TrainableModel& m, const std::string& fixture) {
  auto file = SafetensorsFile::open(fixture);
  ASSERT_TRUE(file.is_ok()) << file.status().message();
  MicroBatch mb = pack(read_docs(*file), {0, 1});
  auto loss = m.forward_backward(mb, 1.0f / float(mb.n_supervised));
  ASSERT_TRUE(loss.is_ok()) << loss.status().message();
  EXPECT_EQ(loss->n_supervised, mb.n_supervised);
  const double want = file->tensor("loss").value().data<double>()[0];
  EXPECT_LE(std::abs(loss->loss_sum / double(loss->n_supervised) - want) / want, 1e-4);
  int checked = 0;
  for (const SafetensorsEntry& e : file->entries()) {
    if (e.name == "input_ids" || e.name == "labels" || e.name == "lengths" || e.name == "loss") continue;
    const ParamInfo* p = m.find_param(e.name);
    ASSERT_NE(p, nullptr) << e.name;
    ASSERT_EQ(p->shape, e.shape) << e.name;
    Tensor g = file->tensor(e.name).value();
    EXPECT_LE(rel_error(m.grads().data() + p->offset, g.data<float>(), g.numel()), 1e-4) << e.name;
    ++checked;
  }
  EXPECT_GE(checked, 4);
}

class LoraFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(LoraFixture, LossAndEveryLoraGradientMatchPeft) {
  const std::string family = GetParam();
  auto m = load(family, {.adapter_dir = kGrad + family + "/adapter"});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->lora_config().r, 4);
  EXPECT_EQ(m->param_table().size(), 2u * 7u * 2u);  // 2 layers x 7 modules x (A, B)
  expect_matches_fixture(*m, kGrad + family + "/lora_grads.safetensors");
}

INSTANTIATE_TEST_SUITE_P(Families, LoraFixture, ::testing::Values("llama", "qwen2", "qwen3"));

class FullFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(FullFixture, FullSftGradientsMatchTransformers) {
  const std::string family = GetParam();
  auto m = load(family, {.full_sft = true});
  ASSERT_TRUE(m);
  expect_matches_fixture(*m, kGrad + family + "/full_grads.safetensors");
}

INSTANTIATE_TEST_SUITE_P(Families, FullFixture, ::testing::Values("llama", "qwen2", "qwen3"));

TEST(TrainableModel, PackedBatchEqualsDocumentsAlone) {
  auto file = SafetensorsFile::open(kGrad + "llama/lora_grads.safetensors");
  ASSERT_TRUE(file.is_ok());
  Docs d = read_docs(*file);
  auto packed = load("llama", {.adapter_dir = kGrad + "llama/adapter"});
  auto alone = load("llama", {.adapter_dir = kGrad + "llama/adapter"});
  ASSERT_TRUE(packed && alone);
  MicroBatch both = pack(d, {1, 0});
  const float scale = 1.0f / float(both.n_supervised);
  auto l = packed->forward_backward(both, scale);
  ASSERT_TRUE(l.is_ok()) << l.status().message();
  double sum = 0;
  for (size_t i : {0, 1}) {
    auto li = alone->forward_backward(pack(d, {i}), scale);
    ASSERT_TRUE(li.is_ok());
    sum += li->loss_sum;
  }
  EXPECT_NEAR(l->loss_sum, sum, 1e-5 * sum);
  EXPECT_LE(rel_error(packed->grads().data(), alone->grads().data(), int64_t(packed->grads().size())), 1e-5);
}

TEST(TrainableModel, RecomputationChangesNothing) {
  for (bool full : {false, true}) {
    SCOPED_TRACE(full ? "full" : "lora");
    TrainableModelOptions opts{.full_sft = full, .lora = {.r = 3, .alpha = 5, .dropout = 0.2f}};
    auto keep = load("qwen3", opts);
    opts.activations_checkpoint = true;
    auto recompute = load("qwen3", opts);
    ASSERT_TRUE(keep && recompute);
    auto file = SafetensorsFile::open(kGrad + "qwen3/lora_grads.safetensors");
    MicroBatch mb = pack(read_docs(*file), {0, 1});
    for (int step = 0; step < 2; ++step) {  // second pass: fresh dropout masks, same on both
      auto a = keep->forward_backward(mb, 0.1f);
      auto b = recompute->forward_backward(mb, 0.1f);
      ASSERT_TRUE(a.is_ok() && b.is_ok());
      EXPECT_EQ(a->loss_sum, b->loss_sum);
    }
    ASSERT_EQ(keep->grads().size(), recompute->grads().size());
    EXPECT_EQ(std::memcmp(keep->grads().data(), recompute->grads().data(), keep->grads().size_bytes()), 0);
  }
}

// LoRA dropout acts in training passes only: an evaluation pass runs the
// adapters whole (PEFT's eval mode), bit for bit the model without dropout,
// and still counts as a pass.
TEST(TrainableModel, EvaluationDoesNotDrop) {
  const std::string adapter = kGrad + "qwen3/adapter";  // trained B: dropout moves the loss
  auto drop = load("qwen3", {.lora = {.dropout = 0.2f}, .adapter_dir = adapter});
  auto none = load("qwen3", {.adapter_dir = adapter});
  ASSERT_TRUE(drop && none);
  auto file = SafetensorsFile::open(kGrad + "qwen3/lora_grads.safetensors");
  MicroBatch mb = pack(read_docs(*file), {0, 1});
  auto e1 = drop->forward_loss(mb), e0 = none->forward_loss(mb);
  ASSERT_TRUE(e1.is_ok() && e0.is_ok());
  EXPECT_EQ(e1->loss_sum, e0->loss_sum);
  EXPECT_EQ(drop->passes_run(), 1u);
  auto t1 = drop->forward_backward(mb, 0.1f), t0 = none->forward_backward(mb, 0.1f);
  ASSERT_TRUE(t1.is_ok() && t0.is_ok());
  EXPECT_NE(t1->loss_sum, t0->loss_sum);
}

TEST(TrainableModel, FreshAdapterStartsAtTheBaseModel) {
  auto lora = load("qwen2", {.lora = {.r = 8, .alpha = 16, .target_modules = {"linear_qkv", "linear_fc2"}}});
  auto full = load("qwen2", {.full_sft = true});
  ASSERT_TRUE(lora && full);
  // linear_qkv → q, k, v; linear_fc2 → down: 4 modules x 2 layers x (A, B).
  ASSERT_EQ(lora->param_table().size(), 16u);
  EXPECT_EQ(lora->param_table()[0].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(lora->param_table()[7].name, "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight");
  auto file = SafetensorsFile::open(kGrad + "qwen2/lora_grads.safetensors");
  MicroBatch mb = pack(read_docs(*file), {0, 1});
  auto a = lora->forward_backward(mb, 1.0f);
  auto b = full->forward_loss(mb);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_NEAR(a->loss_sum, b->loss_sum, 1e-6 * b->loss_sum);
  for (const ParamInfo& p : lora->param_table()) {
    const float* w = lora->params().data() + p.offset;
    const float* g = lora->grads().data() + p.offset;
    double max_w = 0, max_g = 0, mean = 0;
    for (int64_t i = 0; i < p.numel(); ++i) {
      max_w = std::max(max_w, std::abs(double(w[i])));
      max_g = std::max(max_g, std::abs(double(g[i])));
      mean += w[i];
    }
    if (p.name.find("lora_A") != std::string::npos) {
      const double bound = 1.0 / std::sqrt(double(p.shape[1]));  // kaiming_uniform_(a=√5)
      EXPECT_LE(max_w, bound) << p.name;
      EXPECT_GE(max_w, 0.9 * bound) << p.name;
      EXPECT_LE(std::abs(mean / double(p.numel())), 0.1 * bound) << p.name;
      EXPECT_EQ(max_g, 0.0) << p.name;  // B = 0: nothing flows back to A
    } else {
      EXPECT_EQ(max_w, 0.0) << p.name;
      EXPECT_GT(max_g, 0.0) << p.name;
    }
  }
}

TEST(TrainableModel, AdapterRoundTripsThroughPeftFormat) {
  auto m = load("qwen3", {.adapter_dir = kGrad + "qwen3/adapter"});
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->lora_config().rslora);
  const std::string dir = ::testing::TempDir() + "lathe_adapter_roundtrip";
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(m->save_adapter_peft(dir).is_ok());
  auto back = load("qwen3", {.lora = {.dropout = 0.1f}, .adapter_dir = dir});
  ASSERT_TRUE(back);
  EXPECT_EQ(back->lora_config().r, 4);
  EXPECT_EQ(back->lora_config().alpha, 8.0f);
  EXPECT_TRUE(back->lora_config().rslora);
  EXPECT_EQ(back->lora_config().dropout, 0.1f);
  ASSERT_EQ(back->params().size(), m->params().size());
  EXPECT_EQ(std::memcmp(back->params().data(), m->params().data(), m->params().size_bytes()), 0);
  // The written tensors are exactly PEFT's own file's.
  auto mine = SafetensorsFile::open(dir + "/adapter_model.safetensors");
  auto peft = SafetensorsFile::open(kGrad + "qwen3/adapter/adapter_model.safetensors");
  ASSERT_TRUE(mine.is_ok() && peft.is_ok());
  ASSERT_EQ(mine->entries().size(), peft->entries().size());
  for (const SafetensorsEntry& e : peft->entries()) {
    Tensor a = peft->tensor(e.name).value();
    auto b = mine->tensor(e.name);
    ASSERT_TRUE(b.is_ok()) << e.name;
    EXPECT_EQ(std::memcmp(a.raw(), b->raw(), size_t(a.nbytes())), 0) << e.name;
  }
  std::filesystem::remove_all(dir);
}

TEST(TrainableModel, FullWeightsRoundTripThroughTransformersLayout) {
  auto m = load("qwen2", {.full_sft = true});  // bf16 file: widened to f32
  ASSERT_TRUE(m);
  const std::string dir = ::testing::TempDir() + "lathe_full_roundtrip";
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(m->save_full(dir).is_ok());
  EXPECT_FALSE(m->save_adapter_peft(dir + "/x").is_ok());
  auto back = load(dir, {.full_sft = true});
  ASSERT_TRUE(back);
  ASSERT_EQ(back->param_table().size(), m->param_table().size());
  EXPECT_EQ(std::memcmp(back->params().data(), m->params().data(), m->params().size_bytes()), 0);
  std::filesystem::remove_all(dir);
}

// bf16-mixed against f32 on the fixture's batch and adapter (B not zero, so
// every path carries gradient). What differs is rounding only: the frozen
// weights and each GEMM's left operand (activations, output gradients) are
// rounded to bf16, 2⁻⁹ relative each. The loss moves by that order (measured
// 0.8e-4 to 3e-4 here). Gradients come out of sums that cancel (softmax −
// onehot through the head, the attention softmax), which magnifies those
// roundings: measured worst 1.6e-2 to 2.1e-2 of each tensor's largest
// entry over the three families, against 3e-2 allowed. The f32 gradients
// must also differ: the switch has to reach the kernels.
class Bf16Mixed : public ::testing::TestWithParam<const char*> {};

TEST_P(Bf16Mixed, LossAndGradientsStayCloseToF32) {
  const std::string family = GetParam();
  auto f32 = load(family, {.adapter_dir = kGrad + family + "/adapter"});
  auto bf16 = load(family, {.adapter_dir = kGrad + family + "/adapter", .bf16_base = true});
  ASSERT_TRUE(f32 && bf16);
  auto file = SafetensorsFile::open(kGrad + family + "/lora_grads.safetensors");
  ASSERT_TRUE(file.is_ok());
  MicroBatch mb = pack(read_docs(*file), {0, 1});
  auto a = f32->forward_backward(mb, 1.0f / float(mb.n_supervised));
  auto b = bf16->forward_backward(mb, 1.0f / float(mb.n_supervised));
  ASSERT_TRUE(a.is_ok() && b.is_ok()) << b.status().message();
  const double loss_err = std::abs(b->loss_sum - a->loss_sum) / a->loss_sum;
  EXPECT_LE(loss_err, kBf16LossTol);
  double worst = 0;
  for (const ParamInfo& p : f32->param_table()) {
    const double err = rel_error(bf16->grads().data() + p.offset, f32->grads().data() + p.offset, p.numel());
    EXPECT_LE(err, kBf16GradTol) << p.name;
    EXPECT_GT(err, 0.0) << p.name;
    worst = std::max(worst, err);
  }
  std::printf("  %s: loss rel error %.2e, worst gradient rel error %.2e\n", family.c_str(), loss_err, worst);
}

INSTANTIATE_TEST_SUITE_P(Families, Bf16Mixed, ::testing::Values("llama", "qwen2", "qwen3"));

TEST(TrainableModel, Bf16MixedNeedsLora) {
  auto m = TrainableModel::load(kModels + "llama", {.full_sft = true, .bf16_base = true});
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("bf16-mixed"), std::string::npos) << m.status().message();
}

TEST(TrainableModel, BadInputIsAnErrorNamingIt) {
  auto bad = TrainableModel::load(kModels + "llama", {.lora = {.target_modules = {"linear_qkv", "attn_out"}}});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("'attn_out' is unknown"), std::string::npos) << bad.status().message();
  auto missing = TrainableModel::load(kModels + "llama", {.adapter_dir = kGrad + "no_such_adapter"});
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("no_such_adapter"), std::string::npos);
  auto m = load("llama", {});
  ASSERT_TRUE(m);
  MicroBatch mb;
  mb.input_ids = {5, 6, 7};
  mb.position_ids = {0, 1, 2};
  mb.labels = {6, 7, 100000};
  mb.cu_seqlens = {0, 3};
  auto r = m->forward_backward(mb, 1.0f);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("target 100000 at row 2"), std::string::npos) << r.status().message();
  mb.cu_seqlens = {0, 2};
  EXPECT_FALSE(m->forward_backward(mb, 1.0f).is_ok());
}

}  // namespace
}  // namespace lathe
