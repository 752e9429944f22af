// Examples built with the real tokenizers and chat templates match the
// reference ids and masks in tests/data/train (made by
// tools/make_sft_fixtures.py with Hugging Face tokenizers and transformers,
// masks from character offsets), and the bundled sample data set packs.
#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include "train/batcher.h"
#include "train/dataset.h"
#include "train/packing.h"
#include "train/text_codec.h"

namespace lathe {
namespace {

const std::string kTokenizers = LATHE_SOURCE_DIR "/../shared/tokenizers/";

// Loads each tokenizer once for the whole test binary.
const Result<TextCodec>& codec_for(const std::string& name) {
  static std::map<std::string, Result<TextCodec>> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, load_text_codec(kTokenizers + name)).first;
  return it->second;
}

class RealTokenizer : public ::testing::TestWithParam<std::string> {};

TEST_P(RealTokenizer, MatchesReferenceMasks) {
  std::ifstream in(LATHE_TEST_DATA "/train/sft_" + GetParam() + ".json");
  ASSERT_TRUE(in) << "missing fixture for " << GetParam();
  nlohmann::json fixture = nlohmann::json::parse(in);
  const auto& codec = codec_for(GetParam());
  ASSERT_TRUE(codec.is_ok()) << codec.status().message();
  auto prompt = PromptTemplate::parse(fixture["prompt_template"].get<std::string>());
  ASSERT_TRUE(prompt.is_ok());
  for (const auto& r : fixture["records"]) {
    std::string line = r["line"].get<std::string>();
    auto ex = example_from_line(line, *prompt, *codec);
    ASSERT_TRUE(ex.is_ok()) << line << ": " << ex.status().message();
    EXPECT_EQ(ex->input_ids, r["input_ids"].get<std::vector<int32_t>>()) << line;
    EXPECT_EQ(ex->loss_mask, r["loss_mask"].get<std::vector<uint8_t>>()) << line;
  }
}

INSTANTIATE_TEST_SUITE_P(Train, RealTokenizer, ::testing::Values("llama3", "qwen3", "mistral"));

TEST(SampleData, PacksWithTheLlama3Tokenizer) {
  const auto& codec = codec_for("llama3");
  ASSERT_TRUE(codec.is_ok()) << codec.status().message();
  auto file = find_split_file(LATHE_SOURCE_DIR "/data/sample", Split::kTrain);
  ASSERT_TRUE(file.is_ok() && file->has_value());
  DataOptions opt{.seq_length = 128};
  auto ds = load_sft_dataset(std::vector<std::string>{**file}, opt, *codec);
  ASSERT_TRUE(ds.is_ok()) << ds.status().message();
  EXPECT_EQ(ds->stats.n_examples, 30);
  auto rows = pack_first_fit_decreasing(example_lengths(ds->examples), opt.seq_length);
  EXPECT_LT(rows.size(), ds->examples.size());
  auto it = BatchIterator::create(ds->examples, rows, {.seq_length = 128, .micro_batch_size = 1, .global_batch_size = 2});
  ASSERT_TRUE(it.is_ok()) << it.status().message();
  int64_t supervised = 0;
  for (int64_t b = 0; b < it->batches_per_epoch(); ++b) supervised += it->next().n_supervised;
  if (static_cast<int64_t>(rows.size()) % 2 == 0) EXPECT_EQ(supervised, ds->stats.n_supervised_tokens);
  std::printf("sample/training.jsonl, llama3: %s; %zu packed rows of 128, fill %.3f\n", describe(ds->stats).c_str(),
              rows.size(), packing_fill(rows, 128));
}

}  // namespace
}  // namespace lathe
