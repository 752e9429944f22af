// One Trainer run for the GPU trainer tests (what `lathe finetune` runs):
// pre-tokenized data in data_dir (the fake codec, vocabulary 384), the
// recipe's defaults with `overrides`, the log to /dev/null; returns the
// training losses from the run's metrics.jsonl (empty, with a test failure,
// when the run fails).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/fake_codec.h"
#include "train/trainer.h"

namespace lathe::testing {

inline std::vector<double> trainer_losses(const std::string& model_dir, const std::filesystem::path& data_dir,
                                          const std::filesystem::path& run_dir, const std::string& device,
                                          const std::vector<std::string>& overrides) {
  auto recipe = load_recipe("", overrides);
  EXPECT_TRUE(recipe.is_ok()) << recipe.status().message();
  if (!recipe.is_ok()) return {};
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Closer> devnull(std::fopen("/dev/null", "w"));
  TextCodec codec = fake_codec();
  codec.vocab_size = 384;
  TrainerConfig c{.recipe = *recipe, .model_dir = model_dir, .data_path = data_dir.string(),
                  .run_dir = run_dir.string(), .progress = ProgressStyle::kLines, .log = devnull.get()};
  c.device = device;
  auto trainer = Trainer::create(c, &codec);
  EXPECT_TRUE(trainer.is_ok()) << trainer.status().message();
  if (!trainer.is_ok()) return {};
  auto summary = (*trainer)->run();
  EXPECT_TRUE(summary.is_ok()) << summary.status().message();
  std::vector<double> losses;
  std::ifstream f(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("loss") && !j.contains("val_loss")) losses.push_back(j["loss"].get<double>());
  }
  return losses;
}

}  // namespace lathe::testing
