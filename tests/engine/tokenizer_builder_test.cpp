// lathe's own tokenizer: deterministic output, the byte alphabet, the BPE
// trainer on text whose merges are known, and ids equal to what Hugging Face
// `tokenizers` gives for the same tokenizer.json (fixture made by
// tools/make_built_tokenizer_fixtures.py).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "io/tokenizer.h"
#include "io/tokenizer_builder.h"

namespace lathe {
namespace {

TEST(TokenizerBuilder, ByteAlphabetIsGpt2s) {
  EXPECT_EQ(byte_to_unicode(' '), "\xC4\xA0");   // Ġ
  EXPECT_EQ(byte_to_unicode('\n'), "\xC4\x8A");  // Ċ
  EXPECT_EQ(byte_to_unicode('A'), "A");
  EXPECT_EQ(byte_to_unicode(0), "\xC4\x80");     // Ā
  EXPECT_EQ(byte_to_unicode(173), "\xC5\x83");   // Ń: the last of the shifted bytes
  std::set<std::string> all;
  for (int b = 0; b < 256; ++b) all.insert(byte_to_unicode(static_cast<uint8_t>(b)));
  EXPECT_EQ(all.size(), 256u);
}

TEST(TokenizerBuilder, TrainerMergesTheMostFrequentPairFirst) {
  auto merges = learn_bpe_merges("aaab aaab aaab ab", 3).value();
  ASSERT_EQ(merges.size(), 3u);
  // Pieces: "aaab" x1, " aaab" x2, " ab" x1. Pair counts: (a,a) 6, (a,b) 4, (Ġ,a) 3.
  // After a+a: (a,b) 4, (aa,a) 3, (Ġ,aa) 2. After a+b: (aa,ab) 3, (Ġ,aa) 2.
  using P = std::pair<std::string, std::string>;
  EXPECT_EQ(merges[0], (P{"a", "a"}));
  EXPECT_EQ(merges[1], (P{"a", "b"}));
  EXPECT_EQ(merges[2], (P{"aa", "ab"}));
}

TEST(TokenizerBuilder, OutputIsDeterministicAndSized) {
  auto a = build_byte_level_tokenizer(kDefaultTokenizerMerges).value();
  auto b = build_byte_level_tokenizer(kDefaultTokenizerMerges).value();
  EXPECT_EQ(a.tokenizer_json, b.tokenizer_json);
  EXPECT_EQ(a.tokenizer_config_json, b.tokenizer_config_json);
  EXPECT_EQ(a.vocab_size, 256 + kDefaultTokenizerMerges + 5);
  EXPECT_EQ(a.bos_id, a.vocab_size - 5);
  auto plain = build_byte_level_tokenizer(0).value();
  EXPECT_EQ(plain.vocab_size, 261);
}

TEST(TokenizerBuilder, LatheEncodesAsHuggingFaceTokenizersDoes) {
  std::ifstream f(LATHE_TEST_DATA "/engine/built_tokenizer_ids.json");
  ASSERT_TRUE(f.good());
  auto j = nlohmann::json::parse(f);
  auto built = build_byte_level_tokenizer(kDefaultTokenizerMerges).value();
  ASSERT_EQ(built.vocab_size, j["vocab_size"].get<int>()) << "fixture is stale: remake it (tests/data/engine/README.md)";
  auto tok = Tokenizer::from_json(built.tokenizer_json, "built");
  ASSERT_TRUE(tok.is_ok()) << tok.status().message();
  for (const auto& c : j["cases"]) {
    std::string text = c["text"];
    bool special = c["add_special_tokens"];
    auto want = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok->encode(text, special), want) << "text: " << text << " special: " << special;
    EXPECT_EQ(tok->decode(want, false), c["decoded"].get<std::string>());
  }
}

}  // namespace
}  // namespace lathe
