// bf16-mixed training on the AMX code path, with the tile instructions
// emulated (backends/cpu/gemm_amx.h, set_amx_emulation) so it runs on any
// CPU with AVX512-BF16: each projection group and its LoRA adapters as one
// fused tile group (train/trainable_fused.cpp), the LM head on packed tiles.
// Loss and every LoRA gradient against the f32 model on the PEFT fixtures'
// batch and adapters, within the bf16-mixed bounds that trainable_model_test
// derives (Bf16Mixed), and the fused phase must have run.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/gemm_amx.h"
#include "backends/cpu/gemm_bf16.h"
#include "io/safetensors.h"
#include "train/trainable_model.h"
#include "grad_fixture.h"

namespace lathe {
namespace {

using namespace lathe::testing;  // NOLINT: the shared fixture helpers

const std::string kModels = LATHE_TEST_DATA "/models/";
const std::string kGrad = LATHE_TEST_DATA "/grad/";


class Bf16MixedAmx : public ::testing::TestWithParam<const char*> {
 protected:
  void TearDown() override {
    cpu::set_amx_emulation(false);
    cpu::force_bf16_gemm_path(std::nullopt);
  }
};

TEST_P(Bf16MixedAmx, FusedTilesStayCloseToF32) {
  if (!cpu::has_avx512_bf16()) GTEST_SKIP() << "no AVX512-BF16 on this machine (the AMX code packs with it)";
  const std::string family = GetParam();
  auto f32 = TrainableModel::load(kModels + family, {.adapter_dir = kGrad + family + "/adapter"});
  cpu::set_amx_emulation(true);
  cpu::force_bf16_gemm_path(cpu::Bf16GemmPath::kAmx);
  ASSERT_EQ(cpu::bf16_gemm_path(), cpu::Bf16GemmPath::kAmx);
  auto bf16 = TrainableModel::load(kModels + family, {.adapter_dir = kGrad + family + "/adapter", .bf16_base = true});
  ASSERT_TRUE(f32.is_ok() && bf16.is_ok());
  auto file = SafetensorsFile::open(kGrad + family + "/lora_grads.safetensors");
  ASSERT_TRUE(file.is_ok());
  const MicroBatch mb = pack(read_docs(*file), {0, 1});  // the fixture's two documents
  (*bf16)->set_phase_timing(true);
  auto a = (*f32)->forward_backward(mb, 1.0f / float(mb.n_supervised));
  auto b = (*bf16)->forward_backward(mb, 1.0f / float(mb.n_supervised));
  ASSERT_TRUE(a.is_ok() && b.is_ok()) << b.status().message();
  const double loss_err = std::abs(b->loss_sum - a->loss_sum) / a->loss_sum;
  EXPECT_LE(loss_err, kBf16LossTol);
  double worst = 0;
  for (const ParamInfo& p : (*f32)->param_table()) {
    const double err = rel_error((*bf16)->grads().data() + p.offset, (*f32)->grads().data() + p.offset, p.numel());
    EXPECT_LE(err, kBf16GradTol) << p.name;
    EXPECT_GT(err, 0.0) << p.name;
    worst = std::max(worst, err);
  }
  double fused = 0;
  for (const auto& [name, sec] : (*bf16)->phase_seconds())
    if (name == "base + LoRA fused") fused = sec;
  EXPECT_GT(fused, 0.0) << "the fused tile groups did not run";
  std::printf("  %s on emulated AMX: loss rel error %.2e, worst gradient rel error %.2e\n", family.c_str(), loss_err,
              worst);
}

INSTANTIATE_TEST_SUITE_P(Families, Bf16MixedAmx, ::testing::Values("llama", "qwen2", "qwen3"));

}  // namespace
}  // namespace lathe
