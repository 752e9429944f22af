// JSONL data sets: NeMo's directory layout, errors located at file:line,
// on_error=skip counting, the truncation policy and its counts, and the
// bundled sample data.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "train/dataset.h"
#include "train/fake_codec.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;
using testing::fake_codec;

class DatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("lathe_dataset_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }

  fs::path dir_;
};

TEST_F(DatasetTest, FindsNemoLayoutAndSingleFiles) {
  std::string train = write("training.jsonl", "");
  std::string val = write("validation.jsonl", "");
  auto t = find_split_file(dir_.string(), Split::kTrain);
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ(t->value(), train);
  EXPECT_EQ(find_split_file(dir_.string(), Split::kValidation)->value(), val);
  EXPECT_FALSE(find_split_file(dir_.string(), Split::kTest)->has_value());
  auto single = find_split_file(val, Split::kTrain);
  ASSERT_TRUE(single.is_ok());
  EXPECT_EQ(single->value(), val);
  EXPECT_FALSE(find_split_file(val, Split::kValidation)->has_value());
  EXPECT_FALSE(find_split_file((dir_ / "nope").string(), Split::kTrain).is_ok());
  fs::remove(train);
  auto missing = find_split_file(dir_.string(), Split::kTrain);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("training.jsonl"), std::string::npos);
}

TEST_F(DatasetTest, LoadsAllRecordKindsAndSkipsBlankLines) {
  std::string f = write("d.jsonl",
                        "{\"input\": \"a\", \"output\": \"b\"}\n"
                        "\n"
                        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, "
                        "{\"role\": \"assistant\", \"content\": \"r\"}]}\r\n"
                        "{\"input_ids\": [1, 20, 21], \"loss_mask\": [0, 1, 1]}\n");
  auto ds = load_sft_dataset(std::vector<std::string>{f}, DataOptions{}, fake_codec());
  ASSERT_TRUE(ds.is_ok()) << ds.status().message();
  ASSERT_EQ(ds->examples.size(), 3u);
  EXPECT_EQ(ds->stats.n_records, 3);
  EXPECT_EQ(ds->stats.n_examples, 3);
  int64_t tokens = 0, targets = 0;
  for (const Example& e : ds->examples) {
    tokens += static_cast<int64_t>(e.input_ids.size());
    targets += e.n_targets();
  }
  EXPECT_EQ(ds->stats.n_tokens, tokens);
  EXPECT_EQ(ds->stats.n_supervised_tokens, targets);
  EXPECT_EQ(ds->examples[2].input_ids, (std::vector<int32_t>{1, 20, 21}));
}

struct BadLine {
  std::string line;
  std::string reason;
};

std::vector<BadLine> bad_lines() {
  return {
      {"{\"input\": \"a\", ", "invalid JSON"},
      {"[1, 2]", "must be a JSON object"},
      {"{\"input\": \"a\"}", "\"output\" is missing"},
      {"{\"input\": \"a\", \"output\": 7}", "\"output\" must be a string"},
      {"{\"input_ids\": [1, 2, 3], \"loss_mask\": [0, 1]}", "has 2 entries but \"input_ids\" has 3"},
      {"{\"input_ids\": [1, 99999], \"loss_mask\": [0, 1]}", "outside the vocabulary"},
      {"{\"messages\": \"hello\"}", "\"messages\" must be an array"},
      {"{\"input\": \"\xff\", \"output\": \"b\"}", "invalid JSON"},
  };
}

TEST_F(DatasetTest, MalformedLineStopsWithFileAndLine) {
  const std::string good = "{\"input\": \"a\", \"output\": \"b\"}\n";
  for (const BadLine& bad : bad_lines()) {
    std::string f = write("bad.jsonl", good + "\n" + good + bad.line + "\n" + good);
    auto ds = load_sft_dataset(std::vector<std::string>{f}, DataOptions{}, fake_codec());
    ASSERT_FALSE(ds.is_ok()) << bad.line;
    const std::string& msg = ds.status().message();
    EXPECT_EQ(msg.rfind(f + ":4", 0), 0u) << msg;
    EXPECT_NE(msg.find(bad.reason), std::string::npos) << msg;
  }
}

TEST_F(DatasetTest, SkipModeSkipsAndCounts) {
  const std::string good = "{\"input\": \"a\", \"output\": \"b\"}\n";
  std::string text = good;
  for (const BadLine& bad : bad_lines()) text += bad.line + "\n" + good;
  std::string f = write("bad.jsonl", text);
  DataOptions opt;
  opt.on_error = OnError::kSkip;
  auto ds = load_sft_dataset(std::vector<std::string>{f}, opt, fake_codec());
  ASSERT_TRUE(ds.is_ok()) << ds.status().message();
  size_t n_bad = bad_lines().size();
  EXPECT_EQ(ds->stats.n_skipped, static_cast<int64_t>(n_bad));
  EXPECT_EQ(ds->stats.n_examples, static_cast<int64_t>(n_bad + 1));
  EXPECT_EQ(ds->stats.n_records, static_cast<int64_t>(2 * n_bad + 1));
  ASSERT_EQ(ds->stats.first_errors.size(), DatasetStats::kMaxErrors);
  EXPECT_EQ(ds->stats.first_errors[0].rfind(f + ":2: invalid JSON", 0), 0u) << ds->stats.first_errors[0];
  EXPECT_EQ(ds->stats.first_errors[1].rfind(f + ":4: ", 0), 0u) << ds->stats.first_errors[1];
  EXPECT_NE(describe(ds->stats).find(std::to_string(n_bad) + " malformed skipped"), std::string::npos);
}

TEST_F(DatasetTest, TruncationRightKeepsPrefixAndDropsTargetless) {
  // Prompt "xxxxxxxx" (BOS + 8 tokens) then output: with seq_length 6 the
  // output falls beyond the cut, so the first record is dropped; the second
  // (short prompt) is cut but keeps targets; the third fits.
  std::string f = write("t.jsonl",
                        "{\"input\": \"xxxxxxxx\", \"output\": \"yy\"}\n"
                        "{\"input\": \"x\", \"output\": \"yyyyyyyy\"}\n"
                        "{\"input\": \"x\", \"output\": \"y\"}\n");
  DataOptions opt;
  opt.seq_length = 6;
  auto ds = load_sft_dataset(std::vector<std::string>{f}, opt, fake_codec());
  ASSERT_TRUE(ds.is_ok()) << ds.status().message();
  EXPECT_EQ(ds->stats.n_records, 3);
  EXPECT_EQ(ds->stats.n_dropped_too_long, 1);
  EXPECT_EQ(ds->stats.n_truncated, 1);
  ASSERT_EQ(ds->examples.size(), 2u);
  EXPECT_EQ(ds->examples[0].input_ids.size(), 6u);
  EXPECT_EQ(ds->examples[0].n_targets(), 4);  // " y" y y y
  EXPECT_EQ(ds->stats.max_tokens, 6);
}

TEST_F(DatasetTest, TruncationDropDropsLongOnes) {
  std::string f = write("t.jsonl",
                        "{\"input\": \"x\", \"output\": \"yyyyyyyy\"}\n"
                        "{\"input\": \"x\", \"output\": \"y\"}\n"
                        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}\n");
  DataOptions opt;
  opt.seq_length = 6;
  opt.truncation = Truncation::kDrop;
  auto ds = load_sft_dataset(std::vector<std::string>{f}, opt, fake_codec());
  ASSERT_TRUE(ds.is_ok()) << ds.status().message();
  EXPECT_EQ(ds->stats.n_dropped_too_long, 1);
  EXPECT_EQ(ds->stats.n_dropped_no_target, 1);
  EXPECT_EQ(ds->stats.n_truncated, 0);
  ASSERT_EQ(ds->examples.size(), 1u);
}

TEST(DataOptions, ParsesPolicies) {
  EXPECT_EQ(*parse_truncation("right"), Truncation::kRight);
  EXPECT_EQ(*parse_truncation("drop"), Truncation::kDrop);
  EXPECT_FALSE(parse_truncation("left").is_ok());
  EXPECT_EQ(*parse_on_error("skip"), OnError::kSkip);
  EXPECT_EQ(*parse_on_error("stop"), OnError::kStop);
  EXPECT_FALSE(parse_on_error("ignore").is_ok());
  DataOptions bad;
  bad.prompt_template = "{input}";
  EXPECT_FALSE(bad.validate().is_ok());
  bad = DataOptions{};
  bad.seq_length = 1;
  EXPECT_FALSE(bad.validate().is_ok());
}

TEST(SampleData, LoadsEveryBundledSplit) {
  const std::string dir = LATHE_SOURCE_DIR "/data/sample";
  for (Split split : {Split::kTrain, Split::kValidation, Split::kTest}) {
    auto file = find_split_file(dir, split);
    ASSERT_TRUE(file.is_ok() && file->has_value()) << split_file_name(split);
    auto stats = dataset_stats(std::vector<std::string>{**file}, DataOptions{}, fake_codec());
    ASSERT_TRUE(stats.is_ok()) << stats.status().message();
    EXPECT_GT(stats->n_examples, 0);
    EXPECT_EQ(stats->n_examples, stats->n_records);
    EXPECT_EQ(stats->n_skipped, 0);
  }
}

}  // namespace
}  // namespace lathe
