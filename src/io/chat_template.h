// Chat templates: the Jinja templates in tokenizer_config.json, rendered by
// lathe's own interpreter for the subset of Jinja these templates use
// (statements: if/elif/else, for with loop.*, set, macro; expressions with
// filters, tests, slicing, method calls like .strip() and .items()).
// Output matches transformers' apply_chat_template.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace lathe {

class ChatTemplateImpl;

class ChatTemplate {
 public:
  // Parses template source; errors name the line and column.
  static Result<ChatTemplate> parse(const std::string& source);
  // Reads chat_template (string, or the list-of-{name, template} form: the
  // "default" one) plus bos_token / eos_token from tokenizer_config.json.
  // path: that file or its directory.
  static Result<ChatTemplate> from_tokenizer_config(const std::string& path);

  // messages: [{"role": ..., "content": ...}, ...]. extra: more variables
  // (tools, enable_thinking, ...). Errors (raise_exception, bad input) name the cause.
  Result<std::string> render(const nlohmann::json& messages, bool add_generation_prompt,
                             const nlohmann::json& extra = nlohmann::json::object()) const;

  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }

 private:
  std::shared_ptr<const ChatTemplateImpl> impl_;  // shared: immutable after parse
  std::string bos_token_;
  std::string eos_token_;
};

}  // namespace lathe
