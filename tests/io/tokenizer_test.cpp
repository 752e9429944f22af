// Tokenizer tests: ids byte-exact against fixtures written by the reference
// library (tools/make_tokenizer_fixtures.py) for the four real tokenizer
// files, decoding (plain and skipping specials), incremental decoding that
// never splits a UTF-8 character, tokenizer_config.json fields, and clear
// errors for malformed files.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "io/tokenizer.h"

namespace lathe {
namespace {

using json = nlohmann::json;

const std::string kShared = LATHE_SOURCE_DIR "/../shared/tokenizers/";
const std::string kData = LATHE_TEST_DATA "/tokenizers/";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> corpus() {
  std::vector<std::string> out;
  std::ifstream in(kData + "corpus.jsonl");
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(json::parse(line).get<std::string>());
  }
  return out;
}

// One tokenizer per name, loaded once for the whole test binary.
const Tokenizer& tokenizer(const std::string& name) {
  static std::map<std::string, Tokenizer> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    auto r = Tokenizer::load(kShared + name);
    EXPECT_TRUE(r.is_ok()) << r.status().message();
    it = cache.emplace(name, std::move(r).value()).first;
  }
  return it->second;
}

void check_ids(const Tokenizer& tok, const json& fx) {
  std::vector<std::string> texts = corpus();
  ASSERT_EQ(fx["cases"].size(), texts.size()) << "fixtures are stale: rerun tools/make_tokenizer_fixtures.py";
  for (size_t i = 0; i < texts.size(); ++i) {
    const json& c = fx["cases"][i];
    EXPECT_EQ(tok.encode(texts[i], false), c["ids"].get<std::vector<int32_t>>()) << "case " << i << ": " << texts[i];
    EXPECT_EQ(tok.encode(texts[i], true), c["ids_special"].get<std::vector<int32_t>>()) << "case " << i << ": " << texts[i];
  }
}

void check_decode(const Tokenizer& tok, const json& fx) {
  for (size_t i = 0; i < fx["cases"].size(); ++i) {
    const json& c = fx["cases"][i];
    auto ids = c["ids_special"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.decode(ids, false), c["decoded"].get<std::string>()) << "case " << i;
    EXPECT_EQ(tok.decode(ids, true), c["decoded_skip"].get<std::string>()) << "case " << i;
  }
  ASSERT_FALSE(fx["random_decodes"].empty());
  for (const json& c : fx["random_decodes"]) {
    auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.decode(ids, false), c["decoded"].get<std::string>()) << c["ids"].dump();
    EXPECT_EQ(tok.decode(ids, true), c["decoded_skip"].get<std::string>()) << c["ids"].dump();
  }
}

// Streaming the ids one at a time yields exactly the full decoding, and no
// piece ever ends inside a UTF-8 character.
void check_incremental(const Tokenizer& tok) {
  for (const std::string& text : corpus()) {
    std::vector<int32_t> ids = tok.encode(text, true);
    for (bool skip : {false, true}) {
      IncrementalDecoder dec(tok, skip);
      std::string streamed;
      for (int32_t id : ids) {
        std::string piece = dec.push(id);
        streamed += piece;
        // A piece is whole characters: appending it never leaves a dangling lead byte.
        if (!piece.empty()) {
          auto last = static_cast<unsigned char>(piece.back());
          EXPECT_TRUE(last < 0x80 || (last & 0xC0) == 0x80) << "piece ends in a lead byte";
        }
      }
      streamed += dec.flush();
      EXPECT_EQ(streamed, tok.decode(ids, skip)) << text;
    }
  }
}

// Invalid UTF-8 is encoded without crashing and decodes back around it.
void check_invalid_utf8(const Tokenizer& tok) {
  std::string bad = "ok \xC3 \xE2\x82 \xFF\xFE x\xF0\x9F\x98 end \xED\xA0\x80";
  std::vector<int32_t> ids = tok.encode(bad, true);
  EXPECT_FALSE(ids.empty());
  EXPECT_NE(tok.decode(ids, true).find("end"), std::string::npos);
}

class TokenizerFixture : public ::testing::TestWithParam<std::string> {};

// One test per file so each test process loads one tokenizer once.
TEST_P(TokenizerFixture, MatchesReference) {
  const Tokenizer& tok = tokenizer(GetParam());
  json fx = json::parse(slurp(kData + GetParam() + ".json"));
  {
    SCOPED_TRACE("ids");
    check_ids(tok, fx);
  }
  {
    SCOPED_TRACE("decode");
    check_decode(tok, fx);
  }
  {
    SCOPED_TRACE("incremental decode");
    check_incremental(tok);
  }
  {
    SCOPED_TRACE("invalid utf-8");
    check_invalid_utf8(tok);
  }
}

INSTANTIATE_TEST_SUITE_P(RealFiles, TokenizerFixture, ::testing::Values("llama3", "qwen3", "mistral", "gpt4o"));

// Small tokenizers cut from the real mistral and llama3 files, with added
// tokens using every flag (single_word, lstrip, rstrip, normalized).
TEST(Tokenizer, AddedTokenFlagsMatchReference) {
  std::vector<std::string> texts;
  std::ifstream in(kData + "flags_corpus.jsonl");
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) texts.push_back(json::parse(line).get<std::string>());
  }
  ASSERT_FALSE(texts.empty());
  for (const char* base : {"mistral", "llama3"}) {
    auto tok = Tokenizer::load(kData + "flags_" + base);
    ASSERT_TRUE(tok.is_ok()) << tok.status().message();
    json fx = json::parse(slurp(kData + "flags_" + base + ".json"));
    ASSERT_EQ(fx["cases"].size(), texts.size());
    for (size_t i = 0; i < texts.size(); ++i) {
      const json& c = fx["cases"][i];
      EXPECT_EQ(tok->encode(texts[i], false), c["ids"].get<std::vector<int32_t>>()) << base << ": " << texts[i];
      EXPECT_EQ(tok->encode(texts[i], true), c["ids_special"].get<std::vector<int32_t>>()) << base << ": " << texts[i];
    }
  }
}

TEST(Tokenizer, IncrementalHoldsBackSplitCharacter) {
  const Tokenizer& tok = tokenizer("mistral");
  // "가" = EA B0 80 as three byte-fallback tokens <0xEA> <0xB0> <0x80>.
  auto id = [&](const char* t) { return *tok.token_to_id(t); };
  IncrementalDecoder dec(tok, false);
  EXPECT_EQ(dec.push(id("<0xEA>")), "");
  EXPECT_EQ(dec.push(id("<0xB0>")), "");
  EXPECT_EQ(dec.push(id("<0x80>")), "\xEA\xB0\x80");
  EXPECT_EQ(dec.push(id("▁a")), " a");
  EXPECT_EQ(dec.push(id("<0xEA>")), "");
  EXPECT_EQ(dec.flush(), "\xEF\xBF\xBD");  // an unfinished character flushes as U+FFFD
}

TEST(Tokenizer, ConfigTokensAndTemplate) {
  const Tokenizer& llama = tokenizer("llama3");
  EXPECT_EQ(llama.bos_token(), "<|begin_of_text|>");
  EXPECT_EQ(llama.bos_token_id(), 128000);
  EXPECT_EQ(llama.eos_token_id(), 128001);
  EXPECT_NE(llama.chat_template().find("start_header_id"), std::string::npos);
  EXPECT_TRUE(llama.is_special(128000));
  EXPECT_EQ(llama.vocab_size(), 128256);
  EXPECT_EQ(llama.id_to_token(9906), "Hello");

  const Tokenizer& qwen = tokenizer("qwen3");
  EXPECT_EQ(qwen.bos_token(), "");
  EXPECT_FALSE(qwen.bos_token_id().has_value());
  EXPECT_EQ(qwen.eos_token(), "<|im_end|>");
  EXPECT_FALSE(qwen.is_special(*qwen.token_to_id("<think>")));

  const Tokenizer& mistral = tokenizer("mistral");
  EXPECT_EQ(mistral.bos_token_id(), 1);
  EXPECT_EQ(mistral.chat_template(), "");
}

// One Tokenizer shared by several threads gives each the single-thread ids.
TEST(Tokenizer, ConcurrentEncodeMatchesSerial) {
  const Tokenizer& tok = tokenizer("llama3");
  std::vector<std::string> texts = corpus();
  std::vector<std::vector<int32_t>> want;
  for (const std::string& t : texts) want.push_back(tok.encode(t, true));
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int round = 0; round < 3; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) bad[size_t(k)] += tok.encode(texts[i], true) != want[i];
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int b : bad) EXPECT_EQ(b, 0);
}

TEST(Tokenizer, MalformedFileErrorNamesIt) {
  auto r = Tokenizer::from_json("{\"model\": ", "broken/tokenizer.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("broken/tokenizer.json"), std::string::npos) << r.status().message();

  auto r2 = Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})", "m.json");
  ASSERT_FALSE(r2.is_ok());
  EXPECT_NE(r2.status().message().find("m.json"), std::string::npos);
  EXPECT_NE(r2.status().message().find("merges[0]"), std::string::npos) << r2.status().message();

  auto r3 = Tokenizer::from_json(
      R"({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"},
          "model": {"type": "BPE", "vocab": {}, "merges": []}})", "re.json");
  ASSERT_FALSE(r3.is_ok());
  EXPECT_NE(r3.status().message().find("pre_tokenizer.pattern"), std::string::npos) << r3.status().message();

  auto r4 = Tokenizer::load("/nonexistent/dir");
  ASSERT_FALSE(r4.is_ok());
  EXPECT_NE(r4.status().message().find("/nonexistent/dir"), std::string::npos);
}

// A hand-made SentencePiece-style file exercising Metaspace, unk fusing and
// a Strip/Metaspace decoder, built inline so the expected ids are obvious.
TEST(Tokenizer, SmallMetaspaceModel) {
  const char* j = R"({
    "added_tokens": [{"id": 0, "content": "<unk>", "special": true, "normalized": false,
                      "single_word": false, "lstrip": false, "rstrip": false}],
    "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
    "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
    "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true,
              "vocab": {"<unk>": 0, "▁": 1, "a": 2, "b": 3, "▁a": 4, "ab": 5, "▁ab": 6},
              "merges": ["▁ a", "a b", "▁a b"]}})";
  auto r = Tokenizer::from_json(j, "inline.json");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  // "ab ab" -> "▁ab", "▁ab"; "xyz" is unknown and fuses into one <unk>.
  EXPECT_EQ(r->encode("ab ab", true), (std::vector<int32_t>{6, 6}));
  EXPECT_EQ(r->encode("axyzb", false), (std::vector<int32_t>{4, 0, 3}));
  EXPECT_EQ(r->decode(std::vector<int32_t>{6, 6}, false), "ab ab");
}

}  // namespace
}  // namespace lathe
