// Builders for training examples: prompt-template records, chat records and
// pre-tokenized records. See example.h for the masking rules; the token
// boundaries are found by comparing tokenizations of a text and of its
// prefixes, so no per-token character offsets are needed from the tokenizer.
#include "train/example.h"

#include <algorithm>

namespace lathe {

int64_t Example::n_targets() const {
  int64_t n = 0;
  for (uint8_t m : loss_mask) n += m != 0;
  return n;
}

size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

std::string_view trim_right(std::string_view s) {
  size_t e = s.find_last_not_of(" \t\r\n\f\v");
  return e == std::string_view::npos ? std::string_view() : s.substr(0, e + 1);
}

size_t common_char_prefix(std::string_view a, std::string_view b) {
  size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

Result<PromptTemplate> PromptTemplate::parse(const std::string& text, const std::string& label_key) {
  PromptTemplate t;
  t.text_ = text;
  t.label_key_ = label_key;
  std::string literal;
  int n_label = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if ((c == '{' || c == '}') && i + 1 < text.size() && text[i + 1] == c) {
      literal += c;  // "{{" or "}}"
      ++i;
      continue;
    }
    if (c == '}')
      return invalid_argument("prompt template: unmatched '}' at offset ", i, " (write '}}' for a literal brace)");
    if (c != '{') {
      literal += c;
      continue;
    }
    size_t close = text.find('}', i + 1);
    std::string name = close == std::string::npos ? "" : text.substr(i + 1, close - i - 1);
    if (name.empty() || !std::all_of(name.begin(), name.end(), is_name_char))
      return invalid_argument("prompt template: expected {field_name} at offset ", i,
                              " (write '{{' for a literal brace): \"", text, "\"");
    if (!literal.empty()) t.pieces_.push_back({false, std::move(literal)});
    literal.clear();
    if (name == label_key) {
      ++n_label;
      t.label_piece_ = t.pieces_.size();
    }
    t.pieces_.push_back({true, name});
    i = close;
  }
  if (!literal.empty()) t.pieces_.push_back({false, std::move(literal)});
  if (n_label != 1)
    return invalid_argument("prompt template: the label field {", label_key, "} must appear exactly once, found ",
                            n_label, " in \"", text, "\"");
  return t;
}

Result<PromptTemplate::Rendered> PromptTemplate::render(const nlohmann::ordered_json& record) const {
  Rendered out;
  std::string* dst = &out.prompt;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const Piece& p = pieces_[i];
    if (i == label_piece_) {
      out.full = out.prompt;
      dst = &out.full;
    }
    if (!p.is_field) {
      *dst += p.text;
      continue;
    }
    auto it = record.find(p.text);
    if (it == record.end()) return invalid_argument("field \"", p.text, "\" is missing (the prompt template uses it)");
    if (!it->is_string()) return invalid_argument("field \"", p.text, "\" must be a string, got ", it->type_name());
    *dst += it->get_ref<const std::string&>();
  }
  return out;
}

Result<Example> build_prompt_example(const PromptTemplate::Rendered& text, const TextCodec& codec) {
  if (!codec.eos_id) return invalid_argument("the tokenizer has no EOS token to end {input, output} examples with");
  Example ex;
  ex.input_ids = codec.encode(text.full, true);
  // The template's separator (the space of "{input} {output}", a newline)
  // belongs to the answer: a user's prompt at generation time ends before it.
  std::vector<int32_t> prompt_ids = codec.encode(trim_right(text.prompt), true);
  size_t boundary = common_prefix(prompt_ids, ex.input_ids);
  ex.loss_mask.assign(ex.input_ids.size(), 0);
  for (size_t i = boundary; i < ex.input_ids.size(); ++i) ex.loss_mask[i] = 1;
  // A post-processor may already end the text with EOS; never write two.
  if (ex.input_ids.empty() || ex.input_ids.back() != *codec.eos_id) {
    ex.input_ids.push_back(*codec.eos_id);
    ex.loss_mask.push_back(1);
  } else {
    ex.loss_mask.back() = 1;
  }
  ex.loss_mask[0] = 0;
  return ex;
}

namespace {

Status check_messages(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) return invalid_argument("\"messages\" must be an array, got ", messages.type_name());
  if (messages.empty()) return invalid_argument("\"messages\" is empty");
  for (size_t i = 0; i < messages.size(); ++i) {
    const nlohmann::ordered_json& m = messages[i];
    if (!m.is_object()) return invalid_argument("messages[", i, "] must be an object, got ", m.type_name());
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return invalid_argument("messages[", i, "] needs a string \"role\"");
  }
  return Status::ok();
}

nlohmann::ordered_json head(const nlohmann::ordered_json& messages, size_t n) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (size_t i = 0; i < n; ++i) out.push_back(messages[i]);
  return out;
}

std::string_view trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// An upper bound on where assistant turn `msg`, starting at char `start` of
// full, ends; npos when unknown. upto is the conversation rendered through
// this turn. Normally upto is a prefix of full, or agrees with it past the
// turn's start. Some templates render the last turn differently (Qwen3 adds a
// reasoning block), so then the turn's content is looked up in full instead.
size_t turn_end_bound(const nlohmann::ordered_json& msg, size_t start, const std::string& upto,
                      const std::string& full) {
  size_t agree = common_char_prefix(upto, full);
  if (agree == upto.size() || agree > start) return agree;
  auto c = msg.find("content");
  if (c == msg.end() || !c->is_string()) return std::string::npos;
  const std::string& content = c->get_ref<const std::string&>();
  for (std::string_view needle : {std::string_view(content), trim(content)}) {
    if (needle.empty()) continue;
    size_t pos = full.find(needle, start);
    size_t in_upto = upto.rfind(needle);
    if (pos == std::string::npos || in_upto == std::string::npos) continue;
    size_t end = pos + needle.size();
    // Whatever the template writes after the content (the end-of-turn marker), as far as both agree.
    return end + common_char_prefix(std::string_view(upto).substr(in_upto + needle.size()),
                                    std::string_view(full).substr(end));
  }
  return std::string::npos;
}

// Marks the tokens of the assistant turn messages[i] in ex.
Status mark_assistant_turn(const nlohmann::ordered_json& messages, size_t i, const std::string& full,
                           const TextCodec& codec, Example& ex) {
  LATHE_ASSIGN_OR_RETURN(std::string before, codec.render_chat(head(messages, i), true));
  if (full.compare(0, before.size(), before) != 0)
    return invalid_argument("messages[", i, "]: the chat template renders the conversation before this assistant ",
                            "turn (with the generation prompt) differently from the same part of the whole ",
                            "conversation, so the turn's tokens cannot be located");
  LATHE_ASSIGN_OR_RETURN(std::string upto, codec.render_chat(head(messages, i + 1), false));
  size_t end_char = turn_end_bound(messages[i], before.size(), upto, full);

  size_t k_start = common_prefix(codec.encode(before, false), ex.input_ids);
  size_t k_end = end_char == std::string::npos
                     ? ex.input_ids.size()
                     : common_prefix(codec.encode(std::string_view(full).substr(0, end_char), false), ex.input_ids);
  for (size_t k = k_start; k < k_end; ++k) {
    if (codec.is_special(ex.input_ids[k])) {
      k_end = k + 1;  // the end-of-turn marker is a target; what follows it is not
      break;
    }
  }
  for (size_t k = k_start; k < k_end; ++k) ex.loss_mask[k] = 1;
  return Status::ok();
}

}  // namespace

Result<Example> build_chat_example(const nlohmann::ordered_json& messages, const TextCodec& codec) {
  if (!codec.render_chat) return invalid_argument("record has \"messages\" but the tokenizer has no chat template");
  LATHE_TRY(check_messages(messages));
  LATHE_ASSIGN_OR_RETURN(std::string full, codec.render_chat(messages, false));
  Example ex;
  ex.input_ids = codec.encode(full, false);
  ex.loss_mask.assign(ex.input_ids.size(), 0);
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i]["role"].get_ref<const std::string&>() != "assistant") continue;
    LATHE_TRY(mark_assistant_turn(messages, i, full, codec, ex));
  }
  if (!ex.loss_mask.empty()) ex.loss_mask[0] = 0;
  return ex;
}

Result<Example> build_pretokenized_example(const nlohmann::ordered_json& record, const TextCodec& codec) {
  auto ids = record.find("input_ids");
  auto mask = record.find("loss_mask");
  if (ids == record.end() || !ids->is_array()) return invalid_argument("\"input_ids\" must be an array of token ids");
  if (mask == record.end()) return invalid_argument("field \"loss_mask\" is missing (pre-tokenized records need it)");
  if (!mask->is_array()) return invalid_argument("\"loss_mask\" must be an array of 0/1, got ", mask->type_name());
  if (ids->size() != mask->size())
    return invalid_argument("\"loss_mask\" has ", mask->size(), " entries but \"input_ids\" has ", ids->size());
  Example ex;
  ex.input_ids.reserve(ids->size());
  ex.loss_mask.reserve(ids->size());
  for (size_t i = 0; i < ids->size(); ++i) {
    const nlohmann::ordered_json& v = (*ids)[i];
    if (!v.is_number_integer()) return invalid_argument("input_ids[", i, "] must be an integer, got ", v.dump());
    int64_t id = v.get<int64_t>();
    if (id < 0 || id >= codec.vocab_size)
      return invalid_argument("input_ids[", i, "] = ", id, " is outside the vocabulary [0, ", codec.vocab_size, ")");
    ex.input_ids.push_back(static_cast<int32_t>(id));
  }
  for (size_t i = 0; i < mask->size(); ++i) {
    const nlohmann::ordered_json& v = (*mask)[i];
    if (v.is_boolean()) {
      ex.loss_mask.push_back(v.get<bool>() ? 1 : 0);
    } else if (v.is_number_integer() && (v.get<int64_t>() == 0 || v.get<int64_t>() == 1)) {
      ex.loss_mask.push_back(static_cast<uint8_t>(v.get<int64_t>()));
    } else {
      return invalid_argument("loss_mask[", i, "] must be 0 or 1, got ", v.dump());
    }
  }
  if (!ex.loss_mask.empty()) ex.loss_mask[0] = 0;
  return ex;
}

}  // namespace lathe
