// Hugging Face tokenizer.json: normalizer → pre-tokenizer → model (BPE,
// byte-level or SentencePiece-style with byte fallback) → post-processor,
// with added/special tokens matched in the raw text first; and decoding.
// Ids match the Hugging Face `tokenizers` library byte for byte.
//
// A Tokenizer is immutable after load and safe to use from many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace lathe {

class TokenizerImpl;

class Tokenizer {
 public:
  // path: a tokenizer.json, or a directory holding one (and, optionally,
  // tokenizer_config.json, read for bos/eos tokens and the chat template).
  static Result<Tokenizer> load(const std::string& path);
  // From tokenizer.json text (fuzzing, tests).
  static Result<Tokenizer> from_json(std::string_view json_text, const std::string& source_name);

  // add_special_tokens: run the post-processor (e.g. prepend BOS). Special
  // token strings in text are always recognised, as the reference does.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  // Unknown ids are skipped; invalid UTF-8 becomes U+FFFD.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  int32_t vocab_size() const;  // 1 + the largest id, added tokens included
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;

  // From tokenizer_config.json when present (empty / -1 otherwise).
  std::optional<int32_t> bos_token_id() const;
  std::optional<int32_t> eos_token_id() const;
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  const std::string& chat_template() const;  // "" when none

  std::shared_ptr<const TokenizerImpl> impl() const { return impl_; }

 private:
  std::shared_ptr<const TokenizerImpl> impl_;  // shared: copies of a Tokenizer are cheap and immutable
};

// Turns a stream of ids into text pieces, never emitting half a UTF-8
// character: bytes are held back until they complete one. Each push decodes
// a short window (the previous emission's ids plus the new ones) and emits
// what the new ids added, so decoders that treat the first token specially
// stay consistent. Borrows tok; one stream per object, one thread at a time.
class IncrementalDecoder {
 public:
  IncrementalDecoder(const Tokenizer& tok, bool skip_special_tokens);
  std::string push(int32_t id);  // text newly completed by this id (may be "")
  std::string flush();           // whatever is held back (invalid bytes as U+FFFD)

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;   // context window: ids since the last emission but one
  size_t prefix_index_ = 0;     // ids_[0, prefix_index_) were already emitted
  size_t emitted_bytes_ = 0;    // size of decode(ids_[0, prefix_index_))
};

}  // namespace lathe
