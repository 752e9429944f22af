// Builds lathe's own byte-level BPE tokenizer. The trainer is the textbook
// one (count adjacent pairs over unique pre-split words, merge the most
// frequent, repeat): a few thousand words and a few hundred merges take
// milliseconds, so no incremental pair bookkeeping is needed. Output JSON is
// ordered (vocab by id) so the files are byte-identical run to run.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "io/tokenizer_builder.h"

#include <pcre2.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "io/tokenizer_builder_text.h"

namespace lathe {

const char* const kLlama3SplitPattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kSpecialTokens[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                          "<|end_header_id|>", "<|eot_id|>"};

constexpr const char* kChatTemplate =
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + "
    "'<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}";

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {  // the byte alphabet stays below U+0800
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// Splits text into the Llama-3 pre-tokenizer's pieces (matches and any gaps).
Result<std::vector<std::string>> split_words(std::string_view text) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  std::unique_ptr<pcre2_code, decltype(&pcre2_code_free)> re(
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kLlama3SplitPattern), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                    &err, &err_offset, nullptr),
      &pcre2_code_free);
  if (!re) return error(StatusCode::kInternal, "tokenizer builder: split pattern does not compile (error ", err, ")");
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(re.get(), nullptr), &pcre2_match_data_free);
  std::vector<std::string> words;
  size_t pos = 0;
  while (pos < text.size()) {
    int rc = pcre2_match(re.get(), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos, 0, md.get(), nullptr);
    if (rc < 0) break;
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    if (ov[0] > pos) words.emplace_back(text.substr(pos, ov[0] - pos));
    if (ov[1] == ov[0]) {  // empty match: step one byte to make progress
      pos = ov[0] + 1;
      continue;
    }
    words.emplace_back(text.substr(ov[0], ov[1] - ov[0]));
    pos = ov[1];
  }
  if (pos < text.size()) words.emplace_back(text.substr(pos));
  return words;
}

void merge_in_word(std::vector<std::string>& sym, const std::string& a, const std::string& b) {
  std::vector<std::string> out;
  out.reserve(sym.size());
  for (size_t i = 0; i < sym.size(); ++i) {
    if (i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b) {
      out.push_back(a + b);
      ++i;
    } else {
      out.push_back(sym[i]);
    }
  }
  sym.swap(out);
}

Json added_token(int32_t id, const char* content) {
  return Json{{"id", id},          {"content", content}, {"single_word", false}, {"lstrip", false},
              {"rstrip", false},   {"normalized", false}, {"special", true}};
}

Json post_processor(int32_t bos_id) {
  const std::string bos = kSpecialTokens[0];
  auto special = [&](int type_id) { return Json{{"SpecialToken", {{"id", bos}, {"type_id", type_id}}}}; };
  auto seq = [](const char* id, int type_id) { return Json{{"Sequence", {{"id", id}, {"type_id", type_id}}}}; };
  Json tp = {{"type", "TemplateProcessing"},
             {"single", Json::array({special(0), seq("A", 0)})},
             {"pair", Json::array({special(0), seq("A", 0), special(1), seq("B", 1)})},
             {"special_tokens", {{bos, {{"id", bos}, {"ids", {bos_id}}, {"tokens", {bos}}}}}}};
  Json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  return Json{{"type", "Sequence"}, {"processors", Json::array({byte_level, tp})}};
}

Json pre_tokenizer() {
  Json split = {{"type", "Split"},
                {"pattern", {{"Regex", kLlama3SplitPattern}}},
                {"behavior", "Isolated"},
                {"invert", false}};
  Json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  return Json{{"type", "Sequence"}, {"pretokenizers", Json::array({split, byte_level})}};
}

}  // namespace

std::string byte_to_unicode(uint8_t b) {
  // Printable Latin-1 bytes stand for themselves; the rest shift to U+0100 upward in byte order.
  auto printable = [](int c) { return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255); };
  if (printable(b)) return utf8(b);
  uint32_t n = 0;
  for (int c = 0; c < b; ++c)
    if (!printable(c)) ++n;
  return utf8(256 + n);
}

Result<std::vector<std::pair<std::string, std::string>>> learn_bpe_merges(std::string_view text, int n_merges) {
  LATHE_ASSIGN_OR_RETURN(std::vector<std::string> pieces, split_words(text));
  std::map<std::string, int64_t> word_counts;
  for (const std::string& p : pieces) word_counts[p]++;
  std::vector<std::vector<std::string>> words;
  std::vector<int64_t> counts;
  for (const auto& [w, c] : word_counts) {
    std::vector<std::string> sym;
    for (unsigned char ch : w) sym.push_back(byte_to_unicode(ch));
    words.push_back(std::move(sym));
    counts.push_back(c);
  }
  std::vector<std::pair<std::string, std::string>> merges;
  while (static_cast<int>(merges.size()) < n_merges) {
    std::map<std::pair<std::string, std::string>, int64_t> pairs;
    for (size_t w = 0; w < words.size(); ++w)
      for (size_t i = 0; i + 1 < words[w].size(); ++i) pairs[{words[w][i], words[w][i + 1]}] += counts[w];
    const std::pair<std::string, std::string>* best = nullptr;
    int64_t best_count = 1;  // a pair seen once teaches nothing
    for (const auto& [pair, c] : pairs)
      if (c > best_count) best = &pair, best_count = c;
    if (best == nullptr) break;
    auto chosen = *best;
    for (auto& w : words) merge_in_word(w, chosen.first, chosen.second);
    merges.push_back(std::move(chosen));
  }
  return merges;
}

Result<BuiltTokenizer> build_byte_level_tokenizer(int n_merges) {
  if (n_merges < 0) return invalid_argument("tokenizer builder: n_merges must be >= 0, got ", n_merges);
  LATHE_ASSIGN_OR_RETURN(auto merges, learn_bpe_merges(kTokenizerTrainingText, n_merges));
  try {
    Json vocab = Json::object();
    int32_t next_id = 0;
    for (int b = 0; b < 256; ++b) vocab[byte_to_unicode(static_cast<uint8_t>(b))] = next_id++;
    Json merge_list = Json::array();
    for (const auto& [a, b] : merges) {
      merge_list.push_back(a + " " + b);
      if (!vocab.contains(a + b)) vocab[a + b] = next_id++;
    }
    BuiltTokenizer out;
    Json added = Json::array();
    Json added_decoder = Json::object();
    for (const char* s : kSpecialTokens) {
      added.push_back(added_token(next_id, s));
      added_decoder[std::to_string(next_id)] = {{"content", s},      {"lstrip", false}, {"normalized", false},
                                                {"rstrip", false},   {"single_word", false}, {"special", true}};
      ++next_id;
    }
    out.vocab_size = next_id;
    out.bos_id = added[0]["id"];
    out.eos_id = added[1]["id"];
    out.eot_id = added[4]["id"];
    Json model = {{"type", "BPE"},          {"dropout", nullptr},     {"unk_token", nullptr},
                  {"continuing_subword_prefix", nullptr},           {"end_of_word_suffix", nullptr},
                  {"fuse_unk", false},      {"byte_fallback", false}, {"ignore_merges", true},
                  {"vocab", vocab},         {"merges", merge_list}};
    Json tok = {{"version", "1.0"},         {"truncation", nullptr},
                {"padding", nullptr},       {"added_tokens", added},
                {"normalizer", nullptr},    {"pre_tokenizer", pre_tokenizer()},
                {"post_processor", post_processor(out.bos_id)},
                {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
                {"model", model}};
    Json cfg = {{"added_tokens_decoder", added_decoder},
                {"bos_token", kSpecialTokens[0]},
                {"chat_template", kChatTemplate},
                {"clean_up_tokenization_spaces", false},
                {"eos_token", kSpecialTokens[1]},
                {"model_input_names", {"input_ids", "attention_mask"}},
                {"model_max_length", 131072},
                {"tokenizer_class", "PreTrainedTokenizerFast"}};
    out.tokenizer_json = tok.dump(2, ' ', false) + "\n";
    out.tokenizer_config_json = cfg.dump(2, ' ', false) + "\n";
    return out;
  } catch (const nlohmann::json::exception& e) {
    return error(StatusCode::kInternal, "tokenizer builder: ", e.what());
  }
}

}  // namespace lathe
