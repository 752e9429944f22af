// Full-parameter SFT through the Trainer on the GPU (what `lathe finetune
// --device cuda peft.peft_scheme=none` runs): a few optimizer steps on the
// head_dim-64 Qwen2 fixture (q/k/v biases) with pre-tokenized data, once on
// the CPU and once on the GPU. The GPU's loss must start where the CPU's
// does and fall about as far, and the exported model must be the trained
// one: every tensor moved from the base, and stayed within what Adam can
// move a weight in those steps of the CPU's export (a run whose masters
// never reach the host exports the base and fails). Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda/device.h"
#include "io/safetensors.h"
#include "cuda_train/trainer_run.h"
#include "train/pretokenized_data.h"
#include "train/trainer.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 6;
constexpr double kLr = 1e-3;

std::string fixture_model() {
  if (fs::exists(LATHE_TEST_DATA "/grad_hd64")) return LATHE_TEST_DATA "/grad_hd64/qwen2/model";
  return "tests/data/grad_hd64/qwen2/model";
}

// Training losses of a full-SFT run on `device`; its model lands in
// dir/run_<device>/model.
std::vector<double> train_full(const fs::path& dir, const std::string& device) {
  return testing::trainer_losses(fixture_model(), dir / "data", dir / ("run_" + device), device,
                                 {"peft.peft_scheme=none", "trainer.max_steps=" + std::to_string(kSteps),
                                  "trainer.val_check_interval=0", "trainer.limit_val_batches=0", "data.seq_length=64",
                                  "data.micro_batch_size=2", "data.global_batch_size=4",
                                  "optim.lr=" + std::to_string(kLr), "optim.sched.warmup_steps=0",
                                  "optim.weight_decay=0"});
}

TEST(CudaSftTrainerRun, LossFallsTracksTheCpuAndExportsTheTrainedModel) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device visible: runs on the GPU machine";
  const fs::path dir = fs::path(::testing::TempDir()) / "cuda_sft_trainer_run";
  fs::remove_all(dir);
  fs::create_directories(dir / "data");
  std::ofstream(dir / "data" / "training.jsonl") << pretokenized_jsonl(8, 0);
  std::ofstream(dir / "data" / "validation.jsonl") << pretokenized_jsonl(3, 1);
  const std::vector<double> cpu = train_full(dir, "cpu"), gpu = train_full(dir, "cuda");
  ASSERT_EQ(cpu.size(), size_t(kSteps));
  ASSERT_EQ(gpu.size(), size_t(kSteps));
  EXPECT_LT(cpu.back(), 0.9 * cpu.front());
  EXPECT_LE(std::abs(gpu.front() - cpu.front()) / cpu.front(), 0.01) << "cpu " << cpu.front() << " gpu " << gpu.front();
  EXPECT_GE(gpu.front() - gpu.back(), 0.8 * (cpu.front() - cpu.back()))
      << "cpu " << cpu.front() << " -> " << cpu.back() << ", gpu " << gpu.front() << " -> " << gpu.back();
  auto base = SafetensorsFile::open(fixture_model() + "/model.safetensors");
  auto on_cpu = SafetensorsFile::open((dir / "run_cpu" / "model" / "model.safetensors").string());
  auto on_gpu = SafetensorsFile::open((dir / "run_cuda" / "model" / "model.safetensors").string());
  ASSERT_TRUE(base.is_ok() && on_cpu.is_ok() && on_gpu.is_ok())
      << base.status().message() << on_cpu.status().message() << on_gpu.status().message();
  int checked = 0;
  for (const SafetensorsEntry& e : base->entries()) {
    auto b = base->tensor(e.name), c = on_cpu->tensor(e.name), g = on_gpu->tensor(e.name);
    ASSERT_TRUE(b.is_ok() && c.is_ok() && g.is_ok()) << e.name;
    Tensor bf = b->to_f32(), cf = c->to_f32(), gf = g->to_f32();
    ASSERT_EQ(gf.numel(), bf.numel()) << e.name;
    double moved = 0, off_cpu = 0;
    for (int64_t i = 0; i < gf.numel(); ++i) {
      moved = std::max(moved, double(std::abs(gf.data<float>()[i] - bf.data<float>()[i])));
      off_cpu = std::max(off_cpu, double(std::abs(gf.data<float>()[i] - cf.data<float>()[i])));
    }
    EXPECT_GE(moved, 0.5 * kLr) << e.name;
    EXPECT_LE(off_cpu, 2 * kSteps * kLr) << e.name;  // the export is f32: Adam's ≲ lr a step on either device
    ++checked;
  }
  EXPECT_GT(checked, 10);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lathe
