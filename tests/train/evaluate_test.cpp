// Evaluation: answer normalization (Latin, Greek, Cyrillic, Korean, CJK and
// fullwidth punctuation), exact match and SQuAD-style token F1, greedy
// decoding against transformers' generate (tests/data/models/llama/greedy.json),
// and the loss of evaluate() against per-prefix forward passes.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "train/evaluate.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;
const std::string kModel = std::string(LATHE_TEST_DATA) + "/models/llama";

TEST(NormalizeAnswer, LowercasesStripsPunctuationCollapsesSpace) {
  EXPECT_EQ(normalize_answer("  Hello,   WORLD!! "), "hello world");
  EXPECT_EQ(normalize_answer("Héllo ÀÉÎ Œuvre"), "héllo àéî œuvre");
  EXPECT_EQ(normalize_answer("ПРИВЕТ, Мир."), "привет мир");
  EXPECT_EQ(normalize_answer("ΣΟΦΙΑ"), "σοφια");
  EXPECT_EQ(normalize_answer("\t안녕하세요,  세계!\n"), "안녕하세요 세계");
  EXPECT_EQ(normalize_answer("「서울」은 한국의 수도입니다。"), "서울 은 한국의 수도입니다");
  EXPECT_EQ(normalize_answer("你好，世界。"), "你好 世界");
  EXPECT_EQ(normalize_answer("ＡＢＣ！"), "ａｂｃ");
  EXPECT_EQ(normalize_answer("“quoted” — dash…"), "quoted dash");
  EXPECT_EQ(normalize_answer("a\u00A0b\u3000c"), "a b c");
  EXPECT_EQ(normalize_answer("?!."), "");
  EXPECT_EQ(normalize_answer("x\xff y"), "x\xEF\xBF\xBD y");  // invalid byte → U+FFFD, kept
}

TEST(Scores, ExactMatchAfterNormalization) {
  EXPECT_EQ(exact_match_score("The Cat.", "the cat"), 1.0);
  EXPECT_EQ(exact_match_score("서울입니다!", "서울입니다"), 1.0);
  EXPECT_EQ(exact_match_score("the cat", "a cat"), 0.0);
}

TEST(Scores, TokenF1AsSquad) {
  EXPECT_DOUBLE_EQ(token_f1_score("the cat sat", "the cat"), 0.8);  // p 2/3, r 1
  EXPECT_DOUBLE_EQ(token_f1_score("a a a", "a"), 0.5);              // overlap counts multiplicity
  EXPECT_DOUBLE_EQ(token_f1_score("서울 은 수도", "서울 수도 다"), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(token_f1_score("x", "y"), 0.0);
  EXPECT_DOUBLE_EQ(token_f1_score("", "."), 1.0);  // both empty after normalization
  EXPECT_DOUBLE_EQ(token_f1_score("", "y"), 0.0);
}

std::unique_ptr<CausalLM> load_model() {
  auto m = CausalLM::load(kModel);
  LATHE_CHECK(m.is_ok(), m.status().message());
  return std::move(m).value();
}

TEST(GreedyGenerate, MatchesTransformers) {
  auto model = load_model();
  std::ifstream f(kModel + "/greedy.json");
  nlohmann::json g = nlohmann::json::parse(f);
  for (size_t b = 0; b < g["prompt"].size(); ++b) {
    std::vector<int32_t> prompt = g["prompt"][b].get<std::vector<int32_t>>();
    std::vector<int32_t> want = g["continuation"][b].get<std::vector<int32_t>>();
    auto got = greedy_generate(*model, prompt, int(want.size()), {});
    ASSERT_TRUE(got.is_ok()) << got.status().message();
    EXPECT_EQ(*got, want);
    // A stop id ends the continuation before it.
    auto stopped = greedy_generate(*model, prompt, int(want.size()), std::vector<int32_t>{want[3]});
    ASSERT_TRUE(stopped.is_ok());
    const size_t first = size_t(std::find(want.begin(), want.end(), want[3]) - want.begin());
    EXPECT_EQ(*stopped, std::vector<int32_t>(want.begin(), want.begin() + first));
  }
}

// A byte codec within the fixture's 384-token vocabulary: BOS 1, EOS 2, byte c → 3 + c.
TextCodec byte_codec() {
  TextCodec c;
  c.encode = [](std::string_view text, bool add_special) {
    std::vector<int32_t> ids;
    if (add_special) ids.push_back(1);
    for (unsigned char ch : text) ids.push_back(3 + ch);
    return ids;
  };
  c.is_special = [](int32_t id) { return id < 3; };
  c.eos_id = 2;
  c.vocab_size = 384;
  return c;
}

std::string byte_decode(std::span<const int32_t> ids) {
  std::string s;
  for (int32_t id : ids)
    if (id >= 3 && id < 259) s.push_back(char(id - 3));
  return s;
}

// −log p(ids[i] | ids[<i]) from a fresh forward over the prefix (last logits only).
double prefix_nll(const CausalLM& m, const std::vector<int32_t>& ids, size_t i) {
  const int64_t vocab = m.config().vocab_size;
  KvCache cache = m.new_cache(int(i));
  Tensor logits = Tensor::empty(DType::F32, {1, vocab});
  Status s = m.forward(std::span<const int32_t>(ids.data(), i), cache, logits, false);
  LATHE_CHECK(s.is_ok(), s.message());
  double z = 0;
  for (int64_t v = 0; v < vocab; ++v) z += std::exp(double(logits.data<float>()[v]));
  return std::log(z) - logits.data<float>()[ids[i]];
}

class EvalFile : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = fs::temp_directory_path() / ("lathe_eval_" + std::to_string(::getpid()) + ".jsonl");
    std::ofstream(path_) << R"({"input": "2+2=", "output": "4"})" << "\n\n"
                         << R"({"input": "서울은", "output": "한국의 수도"})" << "\n"
                         << R"({"input_ids": [1, 40, 41, 42], "loss_mask": [0, 0, 1, 1]})" << "\n";
  }
  void TearDown() override { fs::remove(path_); }
  fs::path path_;
};

TEST_F(EvalFile, LossIsTokenWeightedMeanOverTargets) {
  auto model = load_model();
  int64_t dropped = -1;
  auto recs = load_eval_records(path_.string(), DataOptions{}, byte_codec(), &dropped);
  ASSERT_TRUE(recs.is_ok()) << recs.status().message();
  ASSERT_EQ(recs->size(), 3u);
  EXPECT_EQ(dropped, 0);
  EXPECT_TRUE((*recs)[0].generation_context.has_value());
  EXPECT_EQ(*(*recs)[1].reference, "한국의 수도");
  EXPECT_FALSE((*recs)[2].generation_context.has_value());  // pre-tokenized: loss only

  double want_sum = 0;
  int64_t want_n = 0;
  for (const EvalRecord& r : *recs)
    for (size_t i = 1; i < r.example.input_ids.size(); ++i)
      if (r.example.loss_mask[i]) {
        want_sum += prefix_nll(*model, r.example.input_ids, i);
        ++want_n;
      }
  EvalOptions opts{.max_new_tokens = 6, .stop_ids = {2}, .decode = byte_decode};
  auto res = evaluate(*model, *recs, opts);
  ASSERT_TRUE(res.is_ok()) << res.status().message();
  EXPECT_EQ(res->n_records, 3);
  EXPECT_EQ(res->n_generated, 2);
  EXPECT_EQ(res->n_supervised_tokens, want_n);
  EXPECT_NEAR(res->loss, want_sum / double(want_n), 1e-4 * want_sum / double(want_n));
  EXPECT_NEAR(res->perplexity, std::exp(res->loss), 1e-9 * res->perplexity);
  ASSERT_TRUE(res->exact_match.has_value());
  auto j = nlohmann::json::parse(eval_result_json(*res));
  EXPECT_EQ(j["n_records"], 3);
  EXPECT_DOUBLE_EQ(j["loss"].get<double>(), res->loss);
}

// The chunked form (what the GPU's EvalModel sums, a chunk of logit rows at a
// time) adds up to the whole pass; a wrong offset does not.
TEST_F(EvalFile, ChunkedNllSumsToTheWholeExample) {
  auto model = load_model();
  int64_t dropped = 0;
  auto recs = load_eval_records(path_.string(), DataOptions{}, byte_codec(), &dropped);
  ASSERT_TRUE(recs.is_ok());
  const Example& ex = (*recs)[1].example;
  const auto n = int64_t(ex.input_ids.size());
  KvCache cache = model->new_cache(int(n));
  Tensor logits = Tensor::empty(DType::F32, {n, model->config().vocab_size});
  ASSERT_TRUE(model->forward(ex.input_ids, cache, logits, true).is_ok());
  const double whole = example_nll_sum(ex, logits.view());
  for (int64_t chunk : {int64_t(1), int64_t(3), int64_t(5), n}) {
    double sum = 0, shifted = 0;
    for (int64_t first = 0; first < n; first += chunk) {
      TensorView rows = logits.view().slice_rows(first, std::min(n, first + chunk));
      sum += example_nll_sum_rows(ex, rows, first);
      shifted += example_nll_sum_rows(ex, rows, first + 1);
    }
    EXPECT_NEAR(sum, whole, 1e-9 * whole) << "chunk " << chunk;
    EXPECT_GT(std::abs(shifted - whole), 1e-3 * whole) << "chunk " << chunk;
  }
  auto cpu = cpu_eval_model(*model);
  EXPECT_EQ(cpu->device(), Device::cpu());
  auto via = cpu->nll_sum(ex);
  ASSERT_TRUE(via.is_ok());
  EXPECT_DOUBLE_EQ(*via, whole);
}

TEST_F(EvalFile, ExactMatchWhenTheReferenceIsTheGreedyOutput) {
  auto model = load_model();
  int64_t dropped = 0;
  auto recs = load_eval_records(path_.string(), DataOptions{}, byte_codec(), &dropped);
  ASSERT_TRUE(recs.is_ok());
  std::vector<EvalRecord> one = {(*recs)[0]};
  auto ids = greedy_generate(*model, *one[0].generation_context, 5, std::vector<int32_t>{2});
  ASSERT_TRUE(ids.is_ok());
  one[0].reference = "  " + byte_decode(*ids) + "  ";
  auto res = evaluate(*model, one, {.max_new_tokens = 5, .stop_ids = {2}, .decode = byte_decode});
  ASSERT_TRUE(res.is_ok()) << res.status().message();
  EXPECT_EQ(*res->records[0].prediction, byte_decode(*ids));
  // Equal up to normalization unless the text normalizes to nothing at all.
  EXPECT_DOUBLE_EQ(*res->exact_match, 1.0);
  EXPECT_DOUBLE_EQ(*res->f1, 1.0);
}

TEST(EvalRecords, ErrorsNameFileAndLine) {
  fs::path p = fs::temp_directory_path() / ("lathe_eval_bad_" + std::to_string(::getpid()) + ".jsonl");
  std::ofstream(p) << R"({"input": "a", "output": "b"})" << "\n" << R"({"input": "a"})" << "\n";
  int64_t dropped = 0;
  auto recs = load_eval_records(p.string(), DataOptions{}, byte_codec(), &dropped);
  fs::remove(p);
  ASSERT_FALSE(recs.is_ok());
  EXPECT_NE(recs.status().message().find(p.string() + ":2:"), std::string::npos) << recs.status().message();
  auto missing = load_eval_records("/nonexistent/x.jsonl", DataOptions{}, byte_codec(), &dropped);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/x.jsonl"), std::string::npos);
}

}  // namespace
}  // namespace lathe
