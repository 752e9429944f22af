// A tiny deterministic TextCodec for testing the masking rules without a real
// tokenizer: one token per byte (id 10 + byte), except a space before a
// non-space byte merges into that byte (id 300 + byte), the way byte-level
// BPE attaches leading spaces to words; the special tokens below match first.
// The chat template is ChatML-shaped; `always_gen_prompt` makes it append the
// generation prompt even when not asked, as some real templates do.
#pragma once

#include <string>
#include <vector>

#include "train/example.h"

namespace lathe::testing {

inline const std::vector<std::pair<std::string, int32_t>>& fake_specials() {
  static const std::vector<std::pair<std::string, int32_t>> k = {
      {"<s>", 1}, {"</s>", 2}, {"<|end|>", 3}, {"<|user|>", 4}, {"<|assistant|>", 5}, {"<|system|>", 6}};
  return k;
}

inline std::vector<int32_t> fake_encode(std::string_view text, bool add_special) {
  std::vector<int32_t> ids;
  if (add_special) ids.push_back(1);
  size_t i = 0;
  while (i < text.size()) {
    bool matched = false;
    for (const auto& [s, id] : fake_specials()) {
      if (text.substr(i, s.size()) == s) {
        ids.push_back(id);
        i += s.size();
        matched = true;
        break;
      }
    }
    if (matched) continue;
    auto c = static_cast<unsigned char>(text[i]);
    bool next_is_word = i + 1 < text.size() && text[i + 1] != ' ' && text[i + 1] != '<';
    if (c == ' ' && next_is_word) {
      ids.push_back(300 + static_cast<unsigned char>(text[i + 1]));
      i += 2;
    } else {
      ids.push_back(10 + c);
      i += 1;
    }
  }
  return ids;
}

inline Result<std::string> fake_render(const nlohmann::json& messages, bool add_generation_prompt,
                                       bool always_gen_prompt) {
  std::string out;
  for (const auto& m : messages) {
    std::string role = m.at("role").get<std::string>();
    if (role != "user" && role != "assistant" && role != "system") return invalid_argument("unknown role ", role);
    out += "<|" + role + "|>" + m.value("content", std::string()) + "<|end|>\n";
  }
  if (add_generation_prompt || always_gen_prompt) out += "<|assistant|>";
  return out;
}

inline TextCodec fake_codec(bool always_gen_prompt = false) {
  TextCodec c;
  c.encode = fake_encode;
  c.is_special = [](int32_t id) { return id >= 1 && id <= 6; };
  c.render_chat = [always_gen_prompt](const nlohmann::json& m, bool gen) { return fake_render(m, gen, always_gen_prompt); };
  c.eos_id = 2;
  c.vocab_size = 600;
  return c;
}

}  // namespace lathe::testing
