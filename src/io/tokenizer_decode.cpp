// Decoders (ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace,
// Sequence) and post-processors (TemplateProcessing, ByteLevel, Bert/Roberta,
// Sequence). Each decoder reproduces the reference library's rule, including
// its replacement of invalid byte runs: ByteLevel repairs the fused bytes
// with one U+FFFD per maximal invalid subsequence, ByteFallback emits one
// U+FFFD per byte of an invalid run.
#include "io/tokenizer_decode.h"

#include <nlohmann/json.hpp>

#include "io/tokenizer_pretok.h"
#include "io/tokenizer_utf8.h"

namespace lathe::tok {

using json = nlohmann::json;

namespace {

class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    const ByteLevelAlphabet& a = byte_level_alphabet();
    std::string bytes, raw;
    for (const std::string& t : tokens) {
      if (a.to_bytes(t, raw)) bytes += raw;
      else bytes += t;  // not byte-level text (an added token): its own bytes
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string rep, bool strip_first) : rep_(std::move(rep)), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      for (size_t k = 0; k < t.size();) {
        if (t.compare(k, rep_.size(), rep_) == 0) {
          if (!(i == 0 && strip_first_)) out.push_back(' ');
          k += rep_.size();
        } else {
          out.push_back(t[k++]);
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string rep_;
  bool strip_first_;
};

int byte_token_value(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (utf8_is_valid(pending)) out.push_back(pending);
      else for (size_t k = 0; k < pending.size(); ++k) out.emplace_back(kReplacementChar);
      pending.clear();
    };
    for (std::string& t : tokens) {
      int b = byte_token_value(t);
      if (b >= 0) {
        pending.push_back(char(b));
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    flush();
    tokens.swap(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop) : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    size_t c = content_.size();
    for (std::string& t : tokens) {
      size_t b = 0, e = t.size();
      for (size_t k = 0; k < start_ && e - b >= c && t.compare(b, c, content_) == 0; ++k) b += c;
      for (size_t k = 0; k < stop_ && e - b >= c && t.compare(e - c, c, content_) == 0; ++k) e -= c;
      t = t.substr(b, e - b);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::shared_ptr<Regex> re, std::string content) : re_(std::move(re)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::pair<size_t, size_t>> m;
    for (std::string& t : tokens) {
      m.clear();
      re_->find_all(t, m);
      if (m.empty()) continue;
      std::string out;
      size_t pos = 0;
      for (auto [b, e] : m) {
        out.append(t, pos, b - pos).append(content_);
        pos = e;
      }
      out.append(t, pos, std::string::npos);
      t = std::move(out);
    }
  }

 private:
  std::shared_ptr<Regex> re_;
  std::string content_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& d : steps_) d->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

std::string str_field(const json& j, const char* k, const std::string& dflt) {
  auto it = j.find(k);
  return it != j.end() && it->is_string() ? it->get<std::string>() : dflt;
}

size_t size_field(const json& j, const char* k) {
  auto it = j.find(k);
  return it != j.end() && it->is_number_unsigned() ? std::min<size_t>(it->get<size_t>(), 1 << 20) : 0;
}

}  // namespace

Result<std::unique_ptr<Decoder>> parse_decoder(const json& j, const std::string& where) {
  using Ptr = std::unique_ptr<Decoder>;
  if (j.is_null()) return Ptr();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return invalid_argument(where, ": expected an object with a string \"type\"");
  }
  std::string type = j["type"].get<std::string>();
  if (type == "ByteLevel") return Ptr(new ByteLevelDecoder());
  if (type == "ByteFallback") return Ptr(new ByteFallbackDecoder());
  if (type == "Fuse") return Ptr(new FuseDecoder());
  if (type == "Metaspace") {
    bool strip = true;
    if (auto it = j.find("add_prefix_space"); it != j.end() && it->is_boolean()) strip = it->get<bool>();
    if (auto it = j.find("prepend_scheme"); it != j.end() && it->is_string()) strip = it->get<std::string>() != "never";
    return Ptr(new MetaspaceDecoder(str_field(j, "replacement", "\xE2\x96\x81"), strip));
  }
  if (type == "Strip") {
    std::string content = str_field(j, "content", " ");
    if (content.empty()) return invalid_argument(where, ".content: must not be empty");
    return Ptr(new StripDecoder(content, size_field(j, "start"), size_field(j, "stop")));
  }
  if (type == "Replace") {
    if (!j.contains("pattern")) return invalid_argument(where, ".pattern: missing");
    LATHE_ASSIGN_OR_RETURN(auto re, parse_pattern(j["pattern"], where + ".pattern"));
    return Ptr(new ReplaceDecoder(std::move(re), str_field(j, "content", "")));
  }
  if (type == "Sequence") {
    auto it = j.find("decoders");
    if (it == j.end() || !it->is_array()) return invalid_argument(where, ".decoders: expected an array");
    std::vector<Ptr> steps;
    for (size_t i = 0; i < it->size(); ++i) {
      LATHE_ASSIGN_OR_RETURN(Ptr d, parse_decoder((*it)[i], where + ".decoders[" + std::to_string(i) + "]"));
      if (d) steps.push_back(std::move(d));
    }
    return Ptr(new SequenceDecoder(std::move(steps)));
  }
  return unsupported(where, ": decoder type \"", type, "\" is not supported");
}

// ---- post-processors -------------------------------------------------------

namespace {

// The "single" template, flattened: runs of special ids around the sequence.
class TemplatePostProcessor final : public PostProcessor {
 public:
  TemplatePostProcessor(std::vector<int32_t> before, std::vector<int32_t> after)
      : before_(std::move(before)), after_(std::move(after)) {}
  void apply(std::vector<int32_t>& ids) const override {
    ids.insert(ids.begin(), before_.begin(), before_.end());
    ids.insert(ids.end(), after_.begin(), after_.end());
  }

 private:
  std::vector<int32_t> before_, after_;
};

class NoopPostProcessor final : public PostProcessor {
 public:
  void apply(std::vector<int32_t>&) const override {}
};

class SequencePostProcessor final : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> steps) : steps_(std::move(steps)) {}
  void apply(std::vector<int32_t>& ids) const override {
    for (const auto& p : steps_) p->apply(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

Result<std::vector<int32_t>> special_ids(const json& specials, const std::string& name, const std::string& where) {
  auto it = specials.is_object() ? specials.find(name) : specials.end();
  if (it == specials.end() || !it->is_object() || !it->contains("ids") || !(*it)["ids"].is_array()) {
    return invalid_argument(where, ".special_tokens: no entry with ids for \"", name, "\"");
  }
  std::vector<int32_t> ids;
  for (const json& id : (*it)["ids"]) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1 << 30)) {
      return invalid_argument(where, ".special_tokens[\"", name, "\"].ids: expected non-negative integers");
    }
    ids.push_back(int32_t(id.get<int64_t>()));
  }
  return ids;
}

Result<std::unique_ptr<PostProcessor>> parse_template(const json& j, const std::string& where) {
  auto single = j.find("single");
  if (single == j.end() || !single->is_array()) return invalid_argument(where, ".single: expected an array");
  json specials = j.contains("special_tokens") ? j["special_tokens"] : json::object();
  std::vector<int32_t> before, after;
  bool seen_seq = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const json& item = (*single)[i];
    std::string w = where + ".single[" + std::to_string(i) + "]";
    if (item.is_object() && item.contains("Sequence")) {
      seen_seq = true;
      continue;
    }
    if (!item.is_object() || !item.contains("SpecialToken") || !item["SpecialToken"].is_object() ||
        !item["SpecialToken"].contains("id") || !item["SpecialToken"]["id"].is_string()) {
      return invalid_argument(w, ": expected {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": ...}");
    }
    LATHE_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                           special_ids(specials, item["SpecialToken"]["id"].get<std::string>(), where));
    auto& dst = seen_seq ? after : before;
    dst.insert(dst.end(), ids.begin(), ids.end());
  }
  return std::unique_ptr<PostProcessor>(new TemplatePostProcessor(std::move(before), std::move(after)));
}

// BertProcessing / RobertaProcessing: {"cls": [token, id], "sep": [token, id]}.
Result<std::unique_ptr<PostProcessor>> parse_cls_sep(const json& j, const std::string& where) {
  auto id_of = [&](const char* k) -> Result<int32_t> {
    auto it = j.find(k);
    if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer() ||
        (*it)[1].get<int64_t>() < 0 || (*it)[1].get<int64_t>() >= (1 << 30)) {
      return invalid_argument(where, ".", k, ": expected [token, id]");
    }
    return int32_t((*it)[1].get<int64_t>());
  };
  LATHE_ASSIGN_OR_RETURN(int32_t cls, id_of("cls"));
  LATHE_ASSIGN_OR_RETURN(int32_t sep, id_of("sep"));
  return std::unique_ptr<PostProcessor>(new TemplatePostProcessor({cls}, {sep}));
}

}  // namespace

Result<std::unique_ptr<PostProcessor>> parse_post_processor(const json& j, const std::string& where) {
  using Ptr = std::unique_ptr<PostProcessor>;
  if (j.is_null()) return Ptr();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return invalid_argument(where, ": expected an object with a string \"type\"");
  }
  std::string type = j["type"].get<std::string>();
  if (type == "TemplateProcessing") return parse_template(j, where);
  if (type == "ByteLevel") return Ptr(new NoopPostProcessor());  // only moves offsets
  if (type == "BertProcessing" || type == "RobertaProcessing") return parse_cls_sep(j, where);
  if (type == "Sequence") {
    auto it = j.find("processors");
    if (it == j.end() || !it->is_array()) return invalid_argument(where, ".processors: expected an array");
    std::vector<Ptr> steps;
    for (size_t i = 0; i < it->size(); ++i) {
      LATHE_ASSIGN_OR_RETURN(Ptr p, parse_post_processor((*it)[i], where + ".processors[" + std::to_string(i) + "]"));
      if (p) steps.push_back(std::move(p));
    }
    return Ptr(new SequencePostProcessor(std::move(steps)));
  }
  return unsupported(where, ": post-processor type \"", type, "\" is not supported");
}

}  // namespace lathe::tok
