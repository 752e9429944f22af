// libFuzzer target: arbitrary bytes as a chat template, parsed and rendered
// against a fixed conversation (system/user/assistant turns, a tool call, a
// tool result, tools and extra variables). Any input must end in text or a
// Status: no crash, no hang (renders are bounded by steps and output size).
#include <cstddef>
#include <cstdint>
#include <string>

#include "io/chat_template.h"

namespace {

const nlohmann::ordered_json& conversation() {
  static const nlohmann::ordered_json kMessages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "안녕! What's the weather?"},
    {"role": "assistant", "content": "<think>\nlook it up\n</think>\n\nChecking.",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Seoul"}}}]},
    {"role": "tool", "content": "{\"temperature\": 21}"},
    {"role": "assistant", "content": "21°C.", "reasoning_content": "from the tool"},
    {"role": "user", "content": [{"type": "text", "text": "thanks"}, {"type": "image"}]}
  ])");
  return kMessages;
}

const nlohmann::ordered_json& extra() {
  static const nlohmann::ordered_json kExtra = nlohmann::ordered_json::parse(R"({
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    "enable_thinking": false,
    "date_string": "26 Jul 2024",
    "bos_token": "<s>",
    "eos_token": "</s>"
  })");
  return kExtra;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;
  std::string source(reinterpret_cast<const char*>(data), size);
  lathe::Result<lathe::ChatTemplate> ct = lathe::ChatTemplate::parse(source);
  if (!ct.is_ok()) return 0;
  (void)ct->render(conversation(), true, extra());
  (void)ct->render(conversation(), false);
  return 0;
}
