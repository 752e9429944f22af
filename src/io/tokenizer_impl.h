// The loaded pipeline behind Tokenizer: added tokens, normalizer,
// pre-tokenizer, BPE model, post-processor and decoder, plus what
// tokenizer_config.json says about bos/eos and the chat template.
// Immutable after load; every method may be called from many threads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/tokenizer.h"
#include "io/tokenizer_added.h"
#include "io/tokenizer_bpe.h"
#include "io/tokenizer_decode.h"
#include "io/tokenizer_pretok.h"

namespace lathe {

class TokenizerImpl {
 public:
  void encode(std::string_view text, bool add_special_tokens, std::vector<int32_t>& out) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;
  // The token string of id ("" when unknown): added tokens first.
  const std::string& token(int32_t id) const;

  std::string source;  // file name, for messages
  std::unique_ptr<tok::Normalizer> normalizer;
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer;
  std::unique_ptr<tok::BpeModel> model;
  std::unique_ptr<tok::PostProcessor> post_processor;
  std::unique_ptr<tok::Decoder> decoder;

  std::vector<tok::AddedToken> added;  // as listed in the file
  tok::AddedMatcher raw_matcher;         // normalized=false tokens, on raw text
  tok::AddedMatcher normalized_matcher;  // normalized=true tokens, on normalized text
  tok::StringIdMap added_ids;            // content -> id

  std::vector<std::string> id_to_token;  // model and added tokens, by id
  std::vector<uint8_t> id_flags;         // kKnown | kAdded | kSpecial
  static constexpr uint8_t kKnown = 1, kAdded = 2, kSpecial = 4;

  std::string bos_token, eos_token, chat_template;

 private:
  void encode_plain(std::string_view text, bool at_origin, std::vector<int32_t>& out) const;
  void encode_normalized(std::string_view text, bool at_origin, std::vector<int32_t>& out) const;
};

}  // namespace lathe
