// libFuzzer target for the tokenizer. The first input byte picks the mode:
//   even: the rest is a tokenizer.json; loading must fail cleanly or give a
//         tokenizer that encodes and decodes without crashing;
//   odd:  the rest is text encoded (with and without special tokens),
//         decoded and streamed through IncrementalDecoder by a real
//         tokenizer: the files under $LATHE_FUZZ_TOKENIZERS (default
//         ../shared/tokenizers) when present, else a small built-in one.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "io/tokenizer.h"

namespace {

// A byte-level BPE with a split regex, an added token and a template, so
// the fallback still runs every stage.
constexpr std::string_view kBuiltin = R"({
  "added_tokens": [{"id": 8, "content": "<s>", "special": true, "normalized": false,
                    "single_word": false, "lstrip": false, "rstrip": false}],
  "normalizer": {"type": "NFC"},
  "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"},
       "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]},
  "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
      {"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {"<s>": {"id": "<s>", "ids": [8], "tokens": ["<s>"]}}},
  "decoder": {"type": "ByteLevel"},
  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "Ġa": 4, "c": 5, "abc": 6, "Ċ": 7},
            "merges": ["a b", "Ġ a", "ab c"]}})";

std::vector<lathe::Tokenizer> load_real() {
  std::vector<lathe::Tokenizer> out;
  const char* env = std::getenv("LATHE_FUZZ_TOKENIZERS");
  std::string dir = env != nullptr ? env : "../shared/tokenizers";
  for (const char* name : {"llama3", "qwen3", "mistral", "gpt4o"}) {
    auto t = lathe::Tokenizer::load(dir + "/" + name);
    if (t.is_ok()) out.push_back(std::move(t).value());
  }
  if (out.empty()) {
    auto t = lathe::Tokenizer::from_json(kBuiltin, "builtin");
    if (!t.is_ok()) std::abort();
    out.push_back(std::move(t).value());
  }
  return out;
}

void exercise(const lathe::Tokenizer& tok, std::string_view text) {
  std::vector<int32_t> ids = tok.encode(text, true);
  std::vector<int32_t> plain = tok.encode(text, false);
  (void)plain;
  std::string back = tok.decode(ids, false);
  (void)tok.decode(ids, true);
  lathe::IncrementalDecoder dec(tok, false);
  std::string streamed;
  for (int32_t id : ids) streamed += dec.push(id);
  streamed += dec.flush();
  // Out-of-range and negative ids are skipped, never read.
  std::vector<int32_t> odd = {-1, tok.vocab_size(), tok.vocab_size() + 1000, 0};
  (void)tok.decode(odd, false);
  for (int32_t id : ids) (void)tok.id_to_token(id);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    auto t = lathe::Tokenizer::from_json(rest, "fuzz.json");
    if (t.is_ok()) exercise(*t, "Hello, world! 안녕 123 <s> \xF0\x9F\x98\x80");
    return 0;
  }
  static const std::vector<lathe::Tokenizer> real = load_real();
  exercise(real[(data[0] / 2) % real.size()], rest);
  return 0;
}
