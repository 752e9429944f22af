// The generation loop: driven by a scripted model (stop tokens, stop strings,
// budgets, streaming, errors), then on a real random-init tiny model whose
// greedy output is checked against a full-sequence forward pass.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "engine/generator.h"
#include "io/hf_config.h"
#include "io/tokenizer_builder.h"
#include "models/random_init.h"

namespace lathe {
namespace {

// lathe's own byte-level tokenizer: ids 0..255 are the bytes themselves.
const BuiltTokenizer& built() {
  static const BuiltTokenizer b = build_byte_level_tokenizer(0).value();
  return b;
}
const Tokenizer& tokenizer() {
  static const Tokenizer t = Tokenizer::from_json(built().tokenizer_json, "built").value();
  return t;
}

std::vector<int32_t> bytes_of(std::string_view s) {
  std::vector<int32_t> ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

// A model that emits script[i] at step i, with a record of what it was fed.
struct ScriptedModel {
  std::vector<int32_t> script;
  std::vector<std::vector<int32_t>> fed;
  StepFn step() {
    return [this](std::span<const int32_t> tokens, std::span<float> logits) {
      fed.emplace_back(tokens.begin(), tokens.end());
      std::fill(logits.begin(), logits.end(), 0.0f);
      size_t i = fed.size() - 1;
      logits[static_cast<size_t>(i < script.size() ? script[i] : 0)] = 10.0f;
      return Status::ok();
    };
  }
};

struct Outcome {
  GenerationResult result;
  std::vector<std::string> pieces;
};

Outcome run_script(ScriptedModel& m, SamplingOptions so, std::vector<int32_t> prompt = {1, 2, 3}) {
  so.temperature = 0.0f;
  Outcome r;
  GenerateArgs args{.prompt = prompt, .sampling = so};
  auto res = generate_with(m.step(), built().vocab_size, tokenizer(), args,
                           [&](std::string_view p) { r.pieces.emplace_back(p); });
  EXPECT_TRUE(res.is_ok()) << res.status().message();
  if (res.is_ok()) r.result = std::move(res).value();
  return r;
}

std::string joined(const std::vector<std::string>& pieces) {
  std::string s;
  for (const auto& p : pieces) s += p;
  return s;
}

TEST(Generator, PrefillsOnceThenFeedsOneTokenPerStep) {
  ScriptedModel m{.script = bytes_of("abcdef")};
  Outcome r = run_script(m, {.max_new_tokens = 4});
  EXPECT_EQ(r.result.token_ids, bytes_of("abcd"));
  EXPECT_EQ(r.result.text, "abcd");
  EXPECT_EQ(r.result.finish_reason, "length");
  EXPECT_EQ(r.result.prompt_tokens, 3);
  ASSERT_EQ(m.fed.size(), 4u);  // the last token is sampled, never fed
  EXPECT_EQ(m.fed[0], (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(m.fed[1], bytes_of("a"));
  EXPECT_EQ(m.fed[3], bytes_of("c"));
  EXPECT_EQ(r.result.decode_steps, 3);
  EXPECT_EQ(joined(r.pieces), r.result.text);
}

TEST(Generator, AStopTokenEndsWithItsIdButNotItsText) {
  ScriptedModel m{.script = bytes_of("hi!")};
  m.script.insert(m.script.begin() + 2, built().eos_id);
  Outcome r = run_script(m, {.max_new_tokens = 10, .stop_token_ids = {built().eos_id}});
  EXPECT_EQ(r.result.token_ids, (std::vector<int32_t>{'h', 'i', built().eos_id}));
  EXPECT_EQ(r.result.text, "hi");
  EXPECT_EQ(r.result.finish_reason, "stop");
}

TEST(Generator, AStopStringCutsTheTextAndNoPieceShowsPartOfIt) {
  ScriptedModel m{.script = bytes_of("one two ENthree ENDfour")};
  Outcome r = run_script(m, {.max_new_tokens = 50, .stop_strings = {"END"}});
  EXPECT_EQ(r.result.text, "one two ENthree ");
  EXPECT_EQ(r.result.finish_reason, "stop");
  EXPECT_EQ(r.result.token_ids, bytes_of("one two ENthree END"));  // the ids that made the stop string
  EXPECT_EQ(joined(r.pieces), r.result.text);
  for (const auto& p : r.pieces) EXPECT_EQ(p.find('D'), std::string::npos);
}

TEST(Generator, TextHeldForAStopStringIsReleasedAtTheEnd) {
  ScriptedModel m{.script = bytes_of("abcE")};
  Outcome r = run_script(m, {.max_new_tokens = 4, .stop_strings = {"END"}});
  EXPECT_EQ(r.result.text, "abcE");
  EXPECT_EQ(r.result.finish_reason, "length");
  EXPECT_EQ(joined(r.pieces), "abcE");
}

TEST(Generator, PiecesNeverSplitAUtf8Character) {
  ScriptedModel m{.script = bytes_of("h\xC3\xA9llo \xE6\x97\xA5!")};  // "héllo 日!"
  Outcome r = run_script(m, {.max_new_tokens = 11});
  EXPECT_EQ(r.result.text, "h\xC3\xA9llo \xE6\x97\xA5!");
  for (const auto& p : r.pieces) {
    ASSERT_FALSE(p.empty());
    EXPECT_NE(static_cast<unsigned char>(p[0]) & 0xC0, 0x80) << "piece starts inside a character";
  }
}

TEST(Generator, BadInputIsAnErrorNamingTheProblem) {
  ScriptedModel m{.script = bytes_of("x")};
  const Tokenizer& tok = tokenizer();
  std::vector<int32_t> empty, bad = {1, 99999}, long_prompt(8, 1);
  auto msg = [&](GenerateArgs a) { return generate_with(m.step(), built().vocab_size, tok, a, {}).status().message(); };
  EXPECT_NE(msg({.prompt = empty}).find("empty"), std::string::npos);
  EXPECT_NE(msg({.prompt = bad}).find("99999"), std::string::npos);
  EXPECT_NE(msg({.prompt = long_prompt, .max_context_tokens = 8}).find("8 tokens"), std::string::npos);
  EXPECT_NE(msg({.prompt = long_prompt, .sampling = {.top_p = 3.0f}}).find("top_p"), std::string::npos);
  EXPECT_TRUE(m.fed.empty());
}

TEST(Generator, TheContextLimitEndsGenerationWithLength) {
  ScriptedModel m{.script = bytes_of("abcdefgh")};
  std::vector<int32_t> prompt = {1, 2, 3};
  GenerateArgs args{.prompt = prompt, .sampling = {.temperature = 0.0f, .max_new_tokens = 100}, .max_context_tokens = 6};
  auto r = generate_with(m.step(), built().vocab_size, tokenizer(), args, {});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->token_ids, bytes_of("abc"));
  EXPECT_EQ(r->finish_reason, "length");
}

// --- a real tiny model ----------------------------------------------------------

class TinyModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = (std::filesystem::temp_directory_path() / ("lathe_gen_test_" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(dir_);
    BuiltTokenizer b = build_byte_level_tokenizer(64).value();
    std::ofstream(dir_ + "/tokenizer.json") << b.tokenizer_json;
    std::ofstream(dir_ + "/tokenizer_config.json") << b.tokenizer_config_json;
    ModelConfig c;
    c.model_type = "llama";
    c.architecture = "LlamaForCausalLM";
    c.vocab_size = 384;
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.max_position_embeddings = 256;
    c.tie_word_embeddings = true;
    c.bos_token_id = b.bos_id;
    c.eos_token_ids = {b.eos_id};
    std::ofstream(dir_ + "/config.json") << model_config_to_json(c);
    // A wider init than HF's 0.02 so the greedy path is not dominated by ties.
    ASSERT_TRUE(write_random_weights(dir_, c, {.seed = 3, .initializer_range = 0.5f}).is_ok());
    model_ = CausalLM::load(dir_).value().release();
    tok_ = new Tokenizer(Tokenizer::load(dir_).value());
  }
  static void TearDownTestSuite() {
    delete model_;
    delete tok_;
    std::filesystem::remove_all(dir_);
  }
  static std::string dir_;
  static CausalLM* model_;
  static Tokenizer* tok_;
};
std::string TinyModel::dir_;
CausalLM* TinyModel::model_ = nullptr;
Tokenizer* TinyModel::tok_ = nullptr;

TEST_F(TinyModel, GreedyEqualsArgmaxOfAFullSequenceForward) {
  std::vector<int32_t> prompt = tok_->encode("The lathe turns", true);
  auto r = generate(*model_, *tok_, prompt, {.temperature = 0.0f, .max_new_tokens = 12}, {});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  ASSERT_EQ(r->token_ids.size(), 12u);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), r->token_ids.begin(), r->token_ids.end() - 1);
  const int vocab = model_->config().vocab_size;
  KvCache cache = model_->new_cache(static_cast<int>(all.size()));
  Tensor logits = Tensor::empty(DType::F32, Shape{static_cast<int64_t>(all.size()), vocab});
  ASSERT_TRUE(model_->forward(all, cache, logits, /*all_logits=*/true).is_ok());
  for (size_t i = 0; i < r->token_ids.size(); ++i) {
    size_t row = prompt.size() - 1 + i;
    std::span<const float> l(logits.data<float>() + row * static_cast<size_t>(vocab), static_cast<size_t>(vocab));
    EXPECT_EQ(r->token_ids[i], argmax(l)) << "generated token " << i;
  }
}

TEST_F(TinyModel, SamplingIsDeterministicForASeed) {
  std::vector<int32_t> prompt = tok_->encode("Hello", true);
  auto gen = [&](uint64_t seed) {
    return generate(*model_, *tok_, prompt, {.temperature = 1.0f, .top_k = 40, .seed = seed, .max_new_tokens = 16}, {})
        .value()
        .token_ids;
  };
  EXPECT_EQ(gen(5), gen(5));
  EXPECT_NE(gen(5), gen(6));
}

TEST(Generator, DefaultStopIdsPreferGenerationConfigThenConfigThenTokenizer) {
  GenerationConfig gen;
  ModelConfig cfg;
  const Tokenizer& tok = tokenizer();
  EXPECT_EQ(default_stop_token_ids(gen, cfg, tok), std::vector<int32_t>{});  // no tokenizer_config: no eos
  cfg.eos_token_ids = {7};
  EXPECT_EQ(default_stop_token_ids(gen, cfg, tok), std::vector<int32_t>{7});
  gen.eos_token_ids = {8, 9};
  EXPECT_EQ(default_stop_token_ids(gen, cfg, tok), (std::vector<int32_t>{8, 9}));
}

}  // namespace
}  // namespace lathe
