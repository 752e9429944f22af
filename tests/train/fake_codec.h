// A tiny deterministic TextCodec for testing the masking rules without a real
// tokenizer: one token per byte (id 10 + byte), except a space before a
// non-space byte merges into that byte (id 300 + byte), the way byte-level
// BPE attaches leading spaces to words; the special tokens below match first.
// The chat template is ChatML-shaped; ChatQuirk::kAlwaysGenPrompt appends the
// generation prompt even when not asked (like some Llama 3 templates),
// ChatQuirk::kThinkLast writes a reasoning block into the last assistant turn
// only (like Qwen3's).
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

enum class ChatQuirk { kNone, kAlwaysGenPrompt, kThinkLast };

inline Result<std::string> fake_render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                       ChatQuirk quirk) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    std::string role = m.at("role").get<std::string>();
    if (role != "user" && role != "assistant" && role != "system") return invalid_argument("unknown role ", role);
    bool think = quirk == ChatQuirk::kThinkLast && role == "assistant" && i + 1 == messages.size();
    out += "<|" + role + "|>" + (think ? "<t></t>" : "") + m.value("content", std::string()) + "<|end|>\n";
  }
  if (add_generation_prompt || quirk == ChatQuirk::kAlwaysGenPrompt) out += "<|assistant|>";
  return out;
}

inline TextCodec fake_codec(ChatQuirk quirk = ChatQuirk::kNone) {
  TextCodec c;
  c.encode = fake_encode;
  c.is_special = [](int32_t id) { return id >= 1 && id <= 6; };
  c.render_chat = [quirk](const nlohmann::ordered_json& m, bool gen) { return fake_render(m, gen, quirk); };
  c.eos_id = 2;
  c.vocab_size = 600;
  return c;
}

}  // namespace lathe::testing
