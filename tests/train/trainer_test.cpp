// The training loop end to end on the tiny random Llama fixture
// (tests/data/models/llama) with pre-tokenized records, so no tokenizer is
// involved: the loss falls, metrics.jsonl holds the documented fields,
// validation lands on the configured steps, and the written PEFT adapter
// loads back into exactly the trained parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "fake_codec.h"
#include "train/metrics.h"
#include "train/trainable_model.h"
#include "train/trainer.h"
#include "pretokenized_data.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;
const std::string kModel = LATHE_TEST_DATA "/models/llama";

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("trainer_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data");
    write(dir_ / "data" / "training.jsonl", pretokenized_jsonl(8, 0));
    write(dir_ / "data" / "validation.jsonl", pretokenized_jsonl(3, 1));
    codec_ = testing::fake_codec();
    codec_.vocab_size = 384;
  }
  void TearDown() override { fs::remove_all(dir_); }

  static void write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

  TrainerConfig config(std::vector<std::string> overrides) {
    std::vector<std::string> base = {"peft.dim=8", "peft.alpha=16", "trainer.max_steps=6",
                                     "trainer.val_check_interval=2", "data.seq_length=64",
                                     "data.micro_batch_size=2", "data.global_batch_size=4", "optim.lr=0.01",
                                     "optim.sched.warmup_steps=0", "optim.weight_decay=0"};
    base.insert(base.end(), overrides.begin(), overrides.end());
    auto recipe = load_recipe("", base);
    EXPECT_TRUE(recipe.is_ok()) << recipe.status().message();
    std::FILE* devnull = std::fopen("/dev/null", "w");
    devnull_.reset(devnull);
    return {.recipe = *recipe,
            .model_dir = kModel,
            .data_path = (dir_ / "data").string(),
            .run_dir = (dir_ / "run").string(),
            .progress = ProgressStyle::kLines,
            .log = devnull};
  }

  struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  fs::path dir_;
  TextCodec codec_;
  std::unique_ptr<std::FILE, FileCloser> devnull_;
};

TEST_F(TrainerTest, LossFallsAndMetricsHoldTheDocumentedFields) {
  auto trainer = Trainer::create(config({}), &codec_);
  ASSERT_TRUE(trainer.is_ok()) << trainer.status().message();
  auto summary = (*trainer)->run();
  ASSERT_TRUE(summary.is_ok()) << summary.status().message();
  EXPECT_EQ(summary->steps, 6);

  std::ifstream f(dir_ / "run" / "metrics.jsonl");
  std::string line;
  std::vector<double> losses;
  std::vector<int64_t> val_steps;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("val_loss")) {
      ASSERT_TRUE(j.contains("perplexity") && j.contains("step"));
      EXPECT_NEAR(j["perplexity"].get<double>(), std::exp(j["val_loss"].get<double>()), 1e-6);
      val_steps.push_back(j["step"].get<int64_t>());
      continue;
    }
    for (const char* k : {"step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s"})
      ASSERT_TRUE(j.contains(k)) << k << " missing in " << line;
    EXPECT_GT(j["tokens"].get<int64_t>(), 0);
    EXPECT_GT(j["lr"].get<double>(), 0.0);
    losses.push_back(j["loss"].get<double>());
  }
  ASSERT_EQ(losses.size(), 6u);
  EXPECT_LT(losses.back(), losses.front() * 0.9) << "loss did not fall";
  EXPECT_EQ(val_steps, (std::vector<int64_t>{2, 4, 6}));
  EXPECT_DOUBLE_EQ(summary->final_train_loss, losses.back());
  ASSERT_TRUE(summary->best_val_loss.has_value());
  for (const char* name : {"recipe.yaml", "loss_curves.svg", "adapter/adapter_config.json",
                           "adapter/adapter_model.safetensors"})
    EXPECT_TRUE(fs::exists(dir_ / "run" / name)) << name;
}

TEST_F(TrainerTest, ValidationEveryIntervalAndAfterTheLastStep) {
  auto trainer = Trainer::create(config({"trainer.max_steps=5", "trainer.val_check_interval=3"}), &codec_);
  ASSERT_TRUE(trainer.is_ok()) << trainer.status().message();
  ASSERT_TRUE((*trainer)->run().is_ok());
  auto log = read_metrics((dir_ / "run" / "metrics.jsonl").string());
  ASSERT_TRUE(log.is_ok()) << log.status().message();
  ASSERT_EQ(log->val.size(), 2u);
  EXPECT_EQ(log->val[0].step, 3);
  EXPECT_EQ(log->val[1].step, 5);
  EXPECT_EQ(log->train.size(), 5u);
}

TEST_F(TrainerTest, AdapterLoadsBackToTheTrainedParameters) {
  auto trainer = Trainer::create(config({"trainer.max_steps=3"}), &codec_);
  ASSERT_TRUE(trainer.is_ok()) << trainer.status().message();
  auto summary = (*trainer)->run();
  ASSERT_TRUE(summary.is_ok()) << summary.status().message();
  EXPECT_EQ(summary->output_dir, (dir_ / "run" / "adapter").string());

  auto loaded = TrainableModel::load(kModel, {.adapter_dir = summary->output_dir});
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  TrainableModel& trained = (*trainer)->model();
  ASSERT_EQ((*loaded)->param_table().size(), trained.param_table().size());
  EXPECT_EQ((*loaded)->lora_config().r, 8);
  for (const ParamInfo& p : trained.param_table()) {
    const ParamInfo* q = (*loaded)->find_param(p.name);
    ASSERT_NE(q, nullptr) << p.name;
    ASSERT_EQ(q->shape, p.shape);
    for (int64_t i = 0; i < p.numel(); ++i)
      ASSERT_EQ((*loaded)->params()[q->offset + i], trained.params()[p.offset + i]) << p.name << "[" << i << "]";
  }
}

TEST_F(TrainerTest, BadRecordNamesFileAndLine) {
  write(dir_ / "data" / "training.jsonl", pretokenized_jsonl(2, 0) + "{\"input_ids\": [1, 2]}\n");
  auto trainer = Trainer::create(config({}), &codec_);
  ASSERT_FALSE(trainer.is_ok());
  EXPECT_NE(trainer.status().message().find("training.jsonl:3"), std::string::npos) << trainer.status().message();
}

TEST_F(TrainerTest, MissingModelIsAnError) {
  TrainerConfig c = config({});
  c.model_dir = (dir_ / "nope").string();
  auto trainer = Trainer::create(c, &codec_);
  ASSERT_FALSE(trainer.is_ok());
  EXPECT_NE(trainer.status().message().find("nope"), std::string::npos);
}

// Train and validation losses in metrics.jsonl order, as written.
std::vector<std::string> loss_lines(const fs::path& metrics) {
  std::vector<std::string> out;
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    out.push_back(std::to_string(j["step"].get<int64_t>()) +
                  (j.contains("val_loss") ? " val " + j["val_loss"].dump() : " train " + j["loss"].dump()));
  }
  return out;
}

TEST_F(TrainerTest, StoppedAndResumedRunMatchesUninterruptedBitForBit) {
  const std::vector<std::string> common = {"peft.dropout=0.2", "trainer.max_steps=6", "optim.sched.max_steps=6",
                                           "optim.sched.warmup_steps=1", "checkpoint.every_n_train_steps=1"};
  TrainerConfig full = config(common);
  full.run_dir = (dir_ / "full").string();
  auto a = Trainer::create(full, &codec_);
  ASSERT_TRUE(a.is_ok()) << a.status().message();
  ASSERT_TRUE((*a)->run().is_ok());

  std::vector<std::string> first_half = common;
  first_half.push_back("trainer.max_steps=4");  // a validation step (interval 2), as in the full run
  TrainerConfig half = config(first_half);
  half.run_dir = (dir_ / "split").string();
  auto b1 = Trainer::create(half, &codec_);
  ASSERT_TRUE(b1.is_ok()) << b1.status().message();
  ASSERT_TRUE((*b1)->run().is_ok());
  TrainerConfig rest = config(common);
  rest.run_dir = (dir_ / "split").string();
  auto b2 = Trainer::create(rest, &codec_);
  ASSERT_TRUE(b2.is_ok()) << b2.status().message();
  auto summary = (*b2)->run();
  ASSERT_TRUE(summary.is_ok()) << summary.status().message();
  EXPECT_EQ(summary->steps, 6);

  const auto want = loss_lines(dir_ / "full" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 9u);  // 6 train + validation at 2, 4, 6
  EXPECT_EQ(loss_lines(dir_ / "split" / "metrics.jsonl"), want);
  TrainableModel& ma = (*a)->model();
  TrainableModel& mb = (*b2)->model();
  for (size_t i = 0; i < ma.params().size(); ++i) ASSERT_EQ(ma.params()[i], mb.params()[i]) << i;
}

TEST_F(TrainerTest, ResumeNoneRefusesADirectoryWithCheckpoints) {
  auto a = Trainer::create(config({"trainer.max_steps=2"}), &codec_);
  ASSERT_TRUE(a.is_ok());
  ASSERT_TRUE((*a)->run().is_ok());
  auto b = Trainer::create(config({"trainer.max_steps=2", "resume=none"}), &codec_);
  ASSERT_FALSE(b.is_ok());
  EXPECT_NE(b.status().message().find("already holds checkpoints"), std::string::npos) << b.status().message();
}

TEST(TrainerSteps, FirstBoundReachedEndsTheRun) {
  EXPECT_EQ(resolve_total_steps(100, -1, 7), 100);
  EXPECT_EQ(resolve_total_steps(-1, 3, 7), 21);
  EXPECT_EQ(resolve_total_steps(100, 3, 7), 21);
  EXPECT_EQ(resolve_total_steps(10, 3, 7), 10);
  EXPECT_EQ(resolve_total_steps(-1, -1, 7), -1);
}

}  // namespace
}  // namespace lathe
