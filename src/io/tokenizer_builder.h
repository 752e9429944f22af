// A tokenizer lathe makes itself, for random-init models (init-model) and
// tests: byte-level BPE in the Llama-3 layout — 256 byte tokens in GPT-2's
// byte-to-unicode alphabet, merges learned by a small BPE trainer from a
// built-in English text, then the special tokens. tokenizer.json carries the
// Llama-3 split regex, a ByteLevel decoder and a post-processor that adds
// <|begin_of_text|>; tokenizer_config.json carries bos/eos and a Llama-3-style
// chat template. Both files load in Hugging Face `tokenizers`/transformers.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace lathe {

// The Llama-3 pre-tokenizer split pattern.
extern const char* const kLlama3SplitPattern;

struct BuiltTokenizer {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  int32_t vocab_size = 0;  // byte tokens + merged tokens + special tokens
  int32_t bos_id = -1;     // <|begin_of_text|>
  int32_t eos_id = -1;     // <|end_of_text|>
  int32_t eot_id = -1;     // <|eot_id|>
};

// Learns up to n_merges merges from text, pre-split with the Llama-3 pattern.
// Merges are pairs of byte-level strings, most frequent pair first (ties go
// to the smaller pair), so the result depends only on text and n_merges.
Result<std::vector<std::pair<std::string, std::string>>> learn_bpe_merges(std::string_view text, int n_merges);

// What init-model uses: 256 bytes + 256 merges + 5 special tokens = 517 tokens.
constexpr int kDefaultTokenizerMerges = 256;

// Builds the tokenizer files, learning n_merges merges (0: bytes only) from
// the built-in text.
Result<BuiltTokenizer> build_byte_level_tokenizer(int n_merges);

// GPT-2's printable stand-in for a byte, UTF-8 encoded ("Ġ" for ' ').
std::string byte_to_unicode(uint8_t b);

}  // namespace lathe
