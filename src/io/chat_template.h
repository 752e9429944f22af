// Chat templates: the Jinja templates in tokenizer_config.json, rendered by
// lathe's own interpreter for the subset of Jinja these templates use
// (statements: if/elif/else, for with loop.*, set, macro; expressions with
// filters, tests, slicing, method calls like .strip() and .items()).
// Output matches transformers' apply_chat_template(tokenize=False): the same
// variables (messages, tools, documents, add_generation_prompt, the special
// tokens, extra keyword variables), the same message clean-up (keys whose
// value is null dropped; reasoning_content / thinking / reasoning aliased)
// and the same jinja2 environment (trim_blocks, lstrip_blocks, tojson with
// ensure_ascii=False, raise_exception, strftime_now, loop controls).
//
// A ChatTemplate is immutable after parse and safe to render from many threads.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace lathe {

class ChatTemplateImpl;

class ChatTemplate {
 public:
  // Parses template source; errors name the line and column.
  static Result<ChatTemplate> parse(const std::string& source);
  // Reads chat_template (string, or the list-of-{name, template} form: the
  // "default" one, and "tool_use" when tools are given) plus the special
  // tokens (bos_token, eos_token, ...) from tokenizer_config.json; falls back
  // to chat_template.jinja beside it. path: that file or its directory.
  static Result<ChatTemplate> from_tokenizer_config(const std::string& path);

  // messages: [{"role": ..., "content": ...}, ...]. extra: more variables
  // (tools, documents, enable_thinking, date_string, ...). Errors
  // (raise_exception, bad input) name the cause; raise_exception's message is
  // carried verbatim after "chat template: ".
  // The ordered_json overload keeps the key order of objects, which `tojson`
  // and `.items()` expose; prefer it when messages come from JSON text.
  Result<std::string> render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                             const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  Result<std::string> render(const nlohmann::json& messages, bool add_generation_prompt,
                             const nlohmann::json& extra = nlohmann::json::object()) const;

  // As render(), and also the [begin, end) byte offsets in the prompt of each
  // {% generation %} block (the assistant text a template marks for
  // training loss masks; empty when the template has none).
  Result<std::string> render_with_generation_spans(const nlohmann::ordered_json& messages,
                                                   bool add_generation_prompt, const nlohmann::ordered_json& extra,
                                                   std::vector<std::pair<size_t, size_t>>* spans) const;

  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  // Sets a variable every render sees (a special token such as "pad_token").
  void set_special_token(const std::string& name, const std::string& value);
  // Sets bos_token, eos_token, unk_token, ... from a tokenizer_config.json
  // (file or directory) that may have no template of its own.
  Status set_special_tokens_from_config(const std::string& path);

 private:
  std::shared_ptr<const ChatTemplateImpl> impl_;  // shared: immutable after parse
  std::string bos_token_;
  std::string eos_token_;
  std::vector<std::pair<std::string, std::string>> special_tokens_;
};

}  // namespace lathe
