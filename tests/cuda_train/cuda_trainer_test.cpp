// The GPU trainer through the Trainer (what `lathe finetune --device cuda`
// runs): a few optimizer steps on the head_dim-64 Llama fixture with
// pre-tokenized data, once on the CPU and once on the GPU. The GPU's loss
// must start where the CPU's does and fall about as far: a GPU run whose
// LoRA never moves (an update that misses the device parameters) keeps its
// first loss and fails. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/cuda/device.h"
#include "cuda_train/trainer_run.h"
#include "train/trainer.h"
#include "train/pretokenized_data.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

std::string fixture_model() {
  if (std::filesystem::exists(LATHE_TEST_DATA "/grad_hd64")) return LATHE_TEST_DATA "/grad_hd64/llama/model";
  return "tests/data/grad_hd64/llama/model";
}

// Training losses of a 6-step run on `device`.
std::vector<double> train_losses(const fs::path& dir, const std::string& device) {
  return testing::trainer_losses(fixture_model(), dir / "data", dir / ("run_" + device), device,
                                 {"peft.dim=8", "peft.alpha=16", "trainer.max_steps=6", "trainer.val_check_interval=0",
                                  "trainer.limit_val_batches=0", "data.seq_length=64", "data.micro_batch_size=2",
                                  "data.global_batch_size=4", "optim.lr=0.01", "optim.sched.warmup_steps=0",
                                  "optim.weight_decay=0"});
}

TEST(CudaTrainerRun, LossFallsAndTracksTheCpuRun) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device visible: runs on the GPU machine";
  const fs::path dir = fs::path(::testing::TempDir()) / "cuda_trainer_run";
  fs::remove_all(dir);
  fs::create_directories(dir / "data");
  std::ofstream(dir / "data" / "training.jsonl") << pretokenized_jsonl(8, 0);
  std::ofstream(dir / "data" / "validation.jsonl") << pretokenized_jsonl(3, 1);
  const std::vector<double> cpu = train_losses(dir, "cpu"), gpu = train_losses(dir, "cuda");
  ASSERT_EQ(cpu.size(), 6u);
  ASSERT_EQ(gpu.size(), 6u);
  EXPECT_LT(cpu.back(), 0.9 * cpu.front());
  // Step 1 is the same model on both (bf16 against f32: well under 1%); by
  // step 6 the GPU must have come down about as far as the CPU (a GPU run
  // that never updates has come down by nothing).
  EXPECT_LE(std::abs(gpu.front() - cpu.front()) / cpu.front(), 0.01) << "cpu " << cpu.front() << " gpu " << gpu.front();
  EXPECT_GE(gpu.front() - gpu.back(), 0.8 * (cpu.front() - cpu.back()))
      << "cpu " << cpu.front() << " -> " << cpu.back() << ", gpu " << gpu.front() << " -> " << gpu.back();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lathe
