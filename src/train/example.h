// Training examples for supervised fine-tuning: token ids plus a loss mask,
// built from the three record kinds of a data set ({input, output} through a
// prompt template, {messages} through the chat template, and pre-tokenized
// {input_ids, loss_mask}).
//
// loss_mask[i] = 1 means token i is a target, predicted from the tokens
// before it; token 0 is never a target (nothing precedes it). The builders
// reach the tokenizer and chat template only through TextCodec, a set of plain
// functions, so the masking rules are testable with small fakes and the
// train layer depends on io in one file (text_codec.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace lathe {

struct Example {
  std::vector<int32_t> input_ids;  // [n_tokens]
  std::vector<uint8_t> loss_mask;  // [n_tokens], 1 = target
  int64_t n_targets() const;
};

// What building examples needs from a tokenizer and chat template. All
// functions must be safe to call from several threads at once (data sets are
// tokenized in parallel).
struct TextCodec {
  // Ids of text; add_special_tokens applies the tokenizer's post-processor (BOS).
  std::function<std::vector<int32_t>(std::string_view text, bool add_special_tokens)> encode;
  // True for special tokens (end-of-turn markers such as <|eot_id|>, <|im_end|>, </s>).
  std::function<bool(int32_t id)> is_special;
  // Renders messages with the chat template; empty when there is none.
  std::function<Result<std::string>(const nlohmann::ordered_json& messages, bool add_generation_prompt)> render_chat;
  std::optional<int32_t> eos_id;  // appended to {input, output} examples
  int32_t vocab_size = 0;         // ids of pre-tokenized records must lie in [0, vocab_size)
};

// A prompt template such as "{input} {output}" or "Q: {question}\nA: {answer}":
// literal text and {field} placeholders filled from a record's string fields;
// "{{" and "}}" are literal braces. The label field ({output} by default) must
// appear exactly once; the prompt is everything before it.
class PromptTemplate {
 public:
  static Result<PromptTemplate> parse(const std::string& text, const std::string& label_key = "output");

  struct Rendered {
    std::string prompt;  // the text before the label
    std::string full;    // prompt + label + whatever the template has after it
  };
  // Fills the placeholders from record; errors name the missing or non-string field.
  Result<Rendered> render(const nlohmann::ordered_json& record) const;

  const std::string& label_key() const { return label_key_; }
  const std::string& text() const { return text_; }

 private:
  struct Piece {
    bool is_field = false;
    std::string text;  // literal text, or the field name
  };
  std::vector<Piece> pieces_;
  size_t label_piece_ = 0;
  std::string label_key_;
  std::string text_;
};

// {input, output} records. The whole text is tokenized once (with special
// tokens, so BOS comes from the post-processor) and the prompt, with its
// trailing whitespace trimmed, once; the targets are the tokens after the
// longest common prefix of the two. So the template's separator (the " " of
// "{input} {output}", a "\n") is always a target, whether it merges into the
// output's first word or is a token of its own, and generation from the bare
// input (no trailing space) reproduces a trained answer. A token straddling
// the boundary is a target: it carries output characters. EOS is appended and
// is a target.
Result<Example> build_prompt_example(const PromptTemplate::Rendered& text, const TextCodec& codec);

// {messages: [...]} records, rendered with the chat template and tokenized
// without adding special tokens (the template writes BOS itself, as
// transformers' apply_chat_template does). The targets are each assistant
// turn: from the end of the conversation before it rendered with
// add_generation_prompt=true, through its content and the first special token
// after its start (the end-of-turn marker), or to where the conversation
// rendered through this turn stops agreeing with the whole conversation,
// whichever comes first. Templates that render a last turn differently from
// an earlier one (Qwen3's reasoning block) are handled by finding the turn's
// content in the whole conversation instead.
Result<Example> build_chat_example(const nlohmann::ordered_json& messages, const TextCodec& codec);

// {input_ids: [...], loss_mask: [...]} records: ids checked against the
// vocabulary, masks of 0/1 (or false/true) of the same length. A 1 at
// position 0 is ignored (nothing precedes the first token).
Result<Example> build_pretokenized_example(const nlohmann::ordered_json& record, const TextCodec& codec);

// Length of the longest common prefix of a and b.
size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b);

}  // namespace lathe
