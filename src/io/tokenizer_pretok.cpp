// Normalizers, pre-tokenizers and the PCRE2 wrapper (see tokenizer_pretok.h).
// Split behaviours (Removed, Isolated, MergedWithPrevious, MergedWithNext,
// Contiguous, with invert) follow the reference library's definitions over
// the sequence of (span, is_match) parts; empty parts are dropped.
#include "io/tokenizer_pretok.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <unicode/normalizer2.h>
#include <unicode/bytestream.h>
#include <unicode/locid.h>
#include <unicode/unistr.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "io/tokenizer_unicode_tables.h"
#include "io/tokenizer_utf8.h"

namespace lathe::tok {

using json = nlohmann::json;

// ---- Regex -----------------------------------------------------------------

// Extra members of \p{name} for code points newer than PCRE2's tables, or
// nullptr.
static const char* class_extra(std::string_view name) {
  for (size_t k = 0; k < kNumUnicodeClassExtras; ++k) {
    if (name == kUnicodeClassExtras[k].property) return kUnicodeClassExtras[k].ranges;
  }
  return nullptr;
}

// tokenizer.json patterns are written for Oniguruma, whose \s is the Unicode
// White_Space set; PCRE2's UCP \s also takes U+180E (and a few other
// horizontal spaces). Spell \s and \S out as explicit classes so both
// engines split identically, and widen \p{L}-style classes with the code
// points a newer Unicode version assigned to them.
std::string onig_to_pcre2(std::string_view p) {
  constexpr std::string_view kSpaceBody = R"(\t\n\x{0B}\f\r\x{20}\x{85}\p{Z})";
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 2 < p.size() && (p[i + 1] == 'p' || p[i + 1] == 'P') && p[i + 2] == '{') {
      size_t close = p.find('}', i + 3);
      std::string_view name = close == std::string_view::npos ? "" : p.substr(i + 3, close - i - 3);
      const char* extra = class_extra(name);
      if (extra != nullptr) {
        std::string body = "\\p{" + std::string(name) + "}" + extra;
        bool negated = p[i + 1] == 'P';
        if (in_class && !negated) out += body;
        else if (!in_class) out += (negated ? "[^" : "[") + body + "]";
        else out.append(p.substr(i, close + 1 - i));  // \P inside a class: left as is
        i = close;
        continue;
      }
    }
    if (c == '\\' && i + 1 < p.size()) {
      char n = p[++i];
      if (n == 's') {
        out += in_class ? std::string(kSpaceBody) : "[" + std::string(kSpaceBody) + "]";
      } else if (n == 'S' && !in_class) {
        out += "[^" + std::string(kSpaceBody) + "]";
      } else {
        out.push_back(c);
        out.push_back(n);
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
      if (i + 1 < p.size() && p[i + 1] == ']') out.push_back(p[++i]);  // a literal ] first
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
      size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

Result<std::shared_ptr<Regex>> Regex::compile(const std::string& onig_pattern) {
  std::string pattern = onig_to_pcre2(onig_pattern);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err,
                                   &err_off, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return invalid_argument("bad regex at offset ", err_off, ": ", reinterpret_cast<const char*>(msg));
  }
  std::shared_ptr<Regex> re(new Regex());
  re->code_ = code;
  re->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return re;
}

Regex::~Regex() {
  if (code_ != nullptr) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

namespace {
// Per-thread match state: match data, a match context with bounded work and
// a JIT stack large enough for long whitespace runs.
struct MatchState {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* mctx = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  MatchState() {
    pcre2_set_match_limit(mctx, 50'000'000);
    pcre2_jit_stack_assign(mctx, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(mctx);
    pcre2_match_data_free(md);
  }
};
MatchState& match_state() {
  thread_local MatchState st;
  return st;
}
}  // namespace

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  MatchState& st = match_state();
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), pos, 0, st.md, st.mctx)
                  : pcre2_match(code, subject, text.size(), pos, 0, st.md, st.mctx);
    if (rc < 0) break;  // no match, or a resource limit: the rest stays unsplit
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
    size_t s = ov[0], e = ov[1];
    if (e <= s) {  // empty match: step one character past it
      pos = s + (s < text.size() ? utf8_char_len(text, s) : 1);
      continue;
    }
    out.emplace_back(s, e);
    pos = e;
  }
}

// ---- helpers ---------------------------------------------------------------

namespace {

Status field_error(const std::string& where, const std::string& what) {
  return invalid_argument(where, ": ", what);
}

Result<std::string> get_string(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return field_error(where + "." + key, "expected a string");
  return it->get<std::string>();
}

bool get_bool(const json& j, const char* key, bool dflt) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : dflt;
}

std::string regex_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}/-#").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out.append(to);
    pos = hit + from.size();
  }
  if (pos == 0) return;
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

}  // namespace

Result<std::shared_ptr<Regex>> parse_pattern(const json& j, const std::string& where) {
  if (!j.is_object()) return field_error(where, "expected {\"String\": ...} or {\"Regex\": ...}");
  std::string pattern;
  if (auto it = j.find("String"); it != j.end() && it->is_string()) {
    pattern = regex_escape(it->get<std::string>());
  } else if (auto it2 = j.find("Regex"); it2 != j.end() && it2->is_string()) {
    pattern = it2->get<std::string>();
  } else {
    return field_error(where, "expected {\"String\": ...} or {\"Regex\": ...}");
  }
  auto re = Regex::compile(pattern);
  if (!re) return re.status().with_context(where);
  return re;
}

// ---- normalizers -----------------------------------------------------------

namespace {

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(const icu::Normalizer2* n) : n_(n) {}
  void apply(std::string& s) const override {
    UErrorCode err = U_ZERO_ERROR;
    if (n_->isNormalizedUTF8(s, err) && U_SUCCESS(err)) return;
    std::string out;
    icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(s.size()));
    err = U_ZERO_ERROR;
    n_->normalizeUTF8(0, s, sink, nullptr, err);
    if (U_SUCCESS(err)) s = std::move(out);
  }

 private:
  const icu::Normalizer2* n_;  // ICU singleton, never freed
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string p) : prefix_(std::move(p)) {}
  void apply(std::string& s) const override {
    if (!s.empty()) s.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::shared_ptr<Regex> re, std::string literal, bool is_literal, std::string content)
      : re_(std::move(re)), literal_(std::move(literal)), is_literal_(is_literal), content_(std::move(content)) {}
  void apply(std::string& s) const override {
    if (is_literal_) return replace_all(s, literal_, content_);
    std::vector<std::pair<size_t, size_t>> m;
    re_->find_all(s, m);
    if (m.empty()) return;
    std::string out;
    size_t pos = 0;
    for (auto [b, e] : m) {
      out.append(s, pos, b - pos);
      out.append(content_);
      pos = e;
    }
    out.append(s, pos, std::string::npos);
    s = std::move(out);
  }

 private:
  std::shared_ptr<Regex> re_;
  std::string literal_;
  bool is_literal_;
  std::string content_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  void apply(std::string& s) const override {
    std::string out;
    icu::UnicodeString u = icu::UnicodeString::fromUTF8(s);
    u.toLower(icu::Locale::getRoot());
    u.toUTF8String(out);
    s = std::move(out);
  }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void apply(std::string& s) const override {
    auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
    size_t b = 0, e = s.size();
    if (left_) while (b < e && ws(s[b])) ++b;
    if (right_) while (e > b && ws(s[e - 1])) --e;
    s = s.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void apply(std::string& s) const override {
    for (const auto& n : steps_) n->apply(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

Result<const icu::Normalizer2*> icu_instance(const std::string& type) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  if (type == "NFC") n = icu::Normalizer2::getNFCInstance(err);
  if (type == "NFD") n = icu::Normalizer2::getNFDInstance(err);
  if (type == "NFKC") n = icu::Normalizer2::getNFKCInstance(err);
  if (type == "NFKD") n = icu::Normalizer2::getNFKDInstance(err);
  if (n == nullptr || U_FAILURE(err)) return unsupported("unicode normalizer ", type, " unavailable");
  return n;
}

}  // namespace

Result<std::unique_ptr<Normalizer>> parse_normalizer(const json& j, const std::string& where) {
  if (j.is_null()) return std::unique_ptr<Normalizer>();
  if (!j.is_object()) return field_error(where, "expected an object");
  LATHE_ASSIGN_OR_RETURN(std::string type, get_string(j, "type", where));
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    LATHE_ASSIGN_OR_RETURN(const icu::Normalizer2* n, icu_instance(type));
    return std::unique_ptr<Normalizer>(new UnicodeNormalizer(n));
  }
  if (type == "Prepend") {
    LATHE_ASSIGN_OR_RETURN(std::string p, get_string(j, "prepend", where));
    return std::unique_ptr<Normalizer>(new PrependNormalizer(std::move(p)));
  }
  if (type == "Replace") {
    LATHE_ASSIGN_OR_RETURN(std::string content, get_string(j, "content", where));
    auto pat = j.find("pattern");
    if (pat == j.end()) return field_error(where + ".pattern", "missing");
    if (pat->is_object() && pat->contains("String") && (*pat)["String"].is_string()) {
      return std::unique_ptr<Normalizer>(
          new ReplaceNormalizer(nullptr, (*pat)["String"].get<std::string>(), true, std::move(content)));
    }
    LATHE_ASSIGN_OR_RETURN(auto re, parse_pattern(*pat, where + ".pattern"));
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(re), "", false, std::move(content)));
  }
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(new LowercaseNormalizer());
  if (type == "Strip") {
    return std::unique_ptr<Normalizer>(new StripNormalizer(get_bool(j, "strip_left", true), get_bool(j, "strip_right", true)));
  }
  if (type == "Sequence") {
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) return field_error(where + ".normalizers", "expected an array");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < it->size(); ++i) {
      LATHE_ASSIGN_OR_RETURN(auto n, parse_normalizer((*it)[i], where + ".normalizers[" + std::to_string(i) + "]"));
      if (n) steps.push_back(std::move(n));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(steps)));
  }
  return unsupported(where, ": normalizer type \"", type, "\" is not supported");
}

// ---- pre-tokenizers --------------------------------------------------------

namespace {

enum class SplitBehavior : uint8_t { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Part {
  size_t b, e;
  bool match;
};

// Applies a split behaviour to the ordered parts of one piece and appends
// the non-empty results to out.
void emit_parts(const Piece& p, std::vector<Part>& parts, SplitBehavior behavior, std::vector<Piece>& out) {
  std::vector<Part> merged;
  merged.reserve(parts.size());
  bool prev_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Part& x : parts) if (!x.match) merged.push_back(x);
      break;
    case SplitBehavior::kIsolated:
      merged = parts;
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Part& x : parts) {
        if (x.match && !prev_match && !merged.empty()) merged.back().e = x.e;
        else merged.push_back(x);
        prev_match = x.match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (size_t k = parts.size(); k-- > 0;) {
        const Part& x = parts[k];
        if (x.match && !prev_match && !merged.empty()) merged.back().b = x.b;
        else merged.push_back(x);
        prev_match = x.match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    case SplitBehavior::kContiguous:
      for (size_t k = 0; k < parts.size(); ++k) {
        const Part& x = parts[k];
        if (k > 0 && x.match == prev_match) merged.back().e = x.e;
        else merged.push_back(x);
        prev_match = x.match;
      }
      break;
  }
  for (const Part& x : merged) {
    if (x.e > x.b) out.push_back({p.text.substr(x.b, x.e - x.b), p.at_origin && x.b == 0});
  }
}

// Turns match spans into the alternating (span, is_match) parts of a piece.
void spans_to_parts(size_t len, const std::vector<std::pair<size_t, size_t>>& spans, bool invert,
                    std::vector<Part>& parts) {
  parts.clear();
  size_t prev = 0;
  for (auto [b, e] : spans) {
    if (prev != b) parts.push_back({prev, b, invert});
    parts.push_back({b, e, !invert});
    prev = e;
  }
  if (prev != len || len == 0) parts.push_back({prev, len, invert});
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::shared_ptr<Regex> re, SplitBehavior b, bool invert)
      : re_(std::move(re)), behavior_(b), invert_(invert) {}
  void apply(std::vector<Piece>& pieces, PieceArena&) const override {
    std::vector<Piece> out;
    out.reserve(pieces.size() * 4);
    std::vector<std::pair<size_t, size_t>> spans;
    std::vector<Part> parts;
    for (const Piece& p : pieces) {
      spans.clear();
      re_->find_all(p.text, spans);
      if (behavior_ == SplitBehavior::kIsolated || (behavior_ == SplitBehavior::kRemoved && invert_)) {
        emit_isolated(p, spans, out);  // the hot path of byte-level tokenizers
        continue;
      }
      spans_to_parts(p.text.size(), spans, invert_, parts);
      emit_parts(p, parts, behavior_, out);
    }
    pieces.swap(out);
  }

 private:
  // Isolated keeps every part; Removed with invert keeps only the matches.
  void emit_isolated(const Piece& p, const std::vector<std::pair<size_t, size_t>>& spans,
                     std::vector<Piece>& out) const {
    bool keep_gaps = behavior_ == SplitBehavior::kIsolated;
    size_t prev = 0;
    for (auto [b, e] : spans) {
      if (keep_gaps && prev != b) out.push_back({p.text.substr(prev, b - prev), p.at_origin && prev == 0});
      out.push_back({p.text.substr(b, e - b), p.at_origin && b == 0});
      prev = e;
    }
    if (keep_gaps && prev < p.text.size()) out.push_back({p.text.substr(prev), p.at_origin && prev == 0});
  }

  std::shared_ptr<Regex> re_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::shared_ptr<Regex> re)
      : add_prefix_space_(add_prefix_space), split_(re ? new SplitPreTokenizer(re, SplitBehavior::kIsolated, false) : nullptr) {}
  void apply(std::vector<Piece>& pieces, PieceArena& arena) const override {
    if (add_prefix_space_) {
      for (Piece& p : pieces) {
        if (!p.text.empty() && p.text[0] == ' ') continue;
        std::string s(1, ' ');
        s.append(p.text);
        p.text = arena.keep(std::move(s));
      }
    }
    if (split_) split_->apply(pieces, arena);
  }
  bool is_byte_level() const override { return true; }

 private:
  bool add_prefix_space_;
  std::unique_ptr<SplitPreTokenizer> split_;
};

constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class PrependScheme : uint8_t { kAlways, kFirst, kNever };

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string rep, PrependScheme scheme, bool split)
      : rep_(std::move(rep)), scheme_(scheme), split_(split) {}
  void apply(std::vector<Piece>& pieces, PieceArena& arena) const override {
    std::vector<Piece> out;
    for (const Piece& p : pieces) {
      std::string s(p.text);
      replace_all(s, " ", rep_);
      bool starts = s.compare(0, rep_.size(), rep_) == 0;
      if (!starts && (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && p.at_origin))) {
        s.insert(0, rep_);
      }
      if (s.empty()) continue;
      std::string_view v = arena.keep(std::move(s));
      if (!split_) {
        out.push_back({v, p.at_origin});
        continue;
      }
      // MergedWithNext on each replacement character.
      size_t start = 0;
      for (size_t pos = v.find(rep_, rep_.size()); pos != std::string_view::npos; pos = v.find(rep_, pos + rep_.size())) {
        if (pos > start) out.push_back({v.substr(start, pos - start), p.at_origin && start == 0});
        start = pos;
      }
      out.push_back({v.substr(start), p.at_origin && start == 0});
    }
    pieces.swap(out);
  }

 private:
  std::string rep_;
  PrependScheme scheme_;
  bool split_;
};

// Splits on a byte predicate (ASCII classes only) with a behaviour.
class CharClassPreTokenizer final : public PreTokenizer {
 public:
  CharClassPreTokenizer(std::function<bool(unsigned char)> pred, SplitBehavior b) : pred_(std::move(pred)), behavior_(b) {}
  void apply(std::vector<Piece>& pieces, PieceArena&) const override {
    std::vector<Piece> out;
    std::vector<Part> parts;
    for (const Piece& p : pieces) {
      parts.clear();
      size_t prev = 0;
      for (size_t i = 0; i < p.text.size(); ++i) {
        if (!pred_(static_cast<unsigned char>(p.text[i]))) continue;
        if (prev != i) parts.push_back({prev, i, false});
        parts.push_back({i, i + 1, true});
        prev = i + 1;
      }
      if (prev != p.text.size() || p.text.empty()) parts.push_back({prev, p.text.size(), false});
      emit_parts(p, parts, behavior_, out);
    }
    pieces.swap(out);
  }

 private:
  std::function<bool(unsigned char)> pred_;
  SplitBehavior behavior_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void apply(std::vector<Piece>& pieces, PieceArena& arena) const override {
    for (const auto& s : steps_) s->apply(pieces, arena);
  }
  bool is_byte_level() const override {
    for (const auto& s : steps_) if (s->is_byte_level()) return true;
    return false;
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

Result<SplitBehavior> parse_behavior(const json& j, const std::string& where) {
  LATHE_ASSIGN_OR_RETURN(std::string b, get_string(j, "behavior", where));
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return field_error(where + ".behavior", "unknown split behavior \"" + b + "\"");
}

Result<std::unique_ptr<PreTokenizer>> parse_metaspace(const json& j, const std::string& where) {
  std::string rep = "\xE2\x96\x81";  // U+2581
  if (auto it = j.find("replacement"); it != j.end() && it->is_string()) rep = it->get<std::string>();
  if (rep.empty()) return field_error(where + ".replacement", "must not be empty");
  PrependScheme scheme = get_bool(j, "add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
  if (auto it = j.find("prepend_scheme"); it != j.end() && it->is_string()) {
    std::string s = it->get<std::string>();
    if (s == "always") scheme = PrependScheme::kAlways;
    else if (s == "first") scheme = PrependScheme::kFirst;
    else if (s == "never") scheme = PrependScheme::kNever;
    else return field_error(where + ".prepend_scheme", "unknown scheme \"" + s + "\"");
  }
  return std::unique_ptr<PreTokenizer>(new MetaspacePreTokenizer(rep, scheme, get_bool(j, "split", true)));
}

}  // namespace

Result<std::unique_ptr<PreTokenizer>> parse_pre_tokenizer(const json& j, const std::string& where) {
  using Ptr = std::unique_ptr<PreTokenizer>;
  if (j.is_null()) return Ptr();
  if (!j.is_object()) return field_error(where, "expected an object");
  LATHE_ASSIGN_OR_RETURN(std::string type, get_string(j, "type", where));
  if (type == "Split") {
    auto pat = j.find("pattern");
    if (pat == j.end()) return field_error(where + ".pattern", "missing");
    LATHE_ASSIGN_OR_RETURN(auto re, parse_pattern(*pat, where + ".pattern"));
    LATHE_ASSIGN_OR_RETURN(SplitBehavior b, parse_behavior(j, where));
    return Ptr(new SplitPreTokenizer(std::move(re), b, get_bool(j, "invert", false)));
  }
  if (type == "ByteLevel") {
    std::shared_ptr<Regex> re;
    if (get_bool(j, "use_regex", true)) {
      LATHE_ASSIGN_OR_RETURN(re, Regex::compile(std::string(kGpt2Pattern)));
    }
    return Ptr(new ByteLevelPreTokenizer(get_bool(j, "add_prefix_space", true), std::move(re)));
  }
  if (type == "Metaspace") return parse_metaspace(j, where);
  if (type == "Digits") {
    auto b = get_bool(j, "individual_digits", false) ? SplitBehavior::kIsolated : SplitBehavior::kContiguous;
    return Ptr(new CharClassPreTokenizer([](unsigned char c) { return c >= '0' && c <= '9'; }, b));
  }
  if (type == "WhitespaceSplit") {
    return Ptr(new CharClassPreTokenizer([](unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); },
                                         SplitBehavior::kRemoved));
  }
  if (type == "Whitespace") {
    LATHE_ASSIGN_OR_RETURN(auto re, Regex::compile(R"(\w+|[^\w\s]+)"));
    return Ptr(new SplitPreTokenizer(std::move(re), SplitBehavior::kRemoved, true));
  }
  if (type == "Sequence") {
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) return field_error(where + ".pretokenizers", "expected an array");
    std::vector<Ptr> steps;
    for (size_t i = 0; i < it->size(); ++i) {
      std::string w = where + ".pretokenizers[" + std::to_string(i) + "]";
      if (!steps.empty() && steps.back()->is_byte_level()) {
        return unsupported(w, ": a pre-tokenizer after ByteLevel is not supported");
      }
      LATHE_ASSIGN_OR_RETURN(Ptr p, parse_pre_tokenizer((*it)[i], w));
      if (p) steps.push_back(std::move(p));
    }
    return Ptr(new SequencePreTokenizer(std::move(steps)));
  }
  return unsupported(where, ": pre-tokenizer type \"", type, "\" is not supported");
}

}  // namespace lathe::tok
