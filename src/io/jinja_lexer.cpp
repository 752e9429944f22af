// Jinja lexer. The root state scans for the earliest "{{", "{%" or "{#";
// the text before it is stripped as jinja2's lexer does (a "-" marker strips
// all whitespace, lstrip_blocks strips a line's indentation before a block or
// comment tag). Inside a tag, tokens are read until the matching close, which
// is only recognized while no bracket is open (so "{{ {'a': {}} }}" works).
#include "io/jinja_lexer.h"

#include <cctype>
#include <cstring>

namespace lathe::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xc0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xe0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    *out += static_cast<char>(0xf0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

class Lexer {
 public:
  Lexer(std::string src, const LexOptions& opt) : src_(std::move(src)), opt_(opt) {}

  Result<std::vector<Token>> run() {
    while (pos_ < src_.size()) LATHE_TRY(root_step());
    tokens_.push_back({TokType::Eof, "", line_, col_});
    return std::move(tokens_);
  }

 private:
  Status fail(const std::string& msg, int line, int col) const {
    return invalid_argument("template syntax error at line ", line, ", column ", col, ": ", msg);
  }

  // Moves pos_ to `to`, keeping line_/col_ in step.
  void advance_to(size_t to) {
    for (; pos_ < to; ++pos_) {
      if (src_[pos_] == '\n') {
        ++line_;
        col_ = 1;
      } else {
        ++col_;
      }
    }
  }

  // Text before a tag, stripped per the tag's marker and lstrip_blocks.
  void emit_text(size_t start, size_t end, char sign, bool is_var) {
    std::string text = src_.substr(start, end - start);
    if (sign == '-') {
      size_t n = text.size();
      while (n > 0 && is_space(text[n - 1])) --n;
      text.resize(n);
    } else if (sign != '+' && opt_.lstrip_blocks && !is_var) {
      size_t nl = text.rfind('\n');
      size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && l_pos < text.size()) {
        bool all_space = true;
        for (size_t i = l_pos; i < text.size(); ++i) all_space = all_space && is_space(text[i]);
        if (all_space) text.resize(l_pos);
      }
    }
    if (!text.empty()) tokens_.push_back({TokType::Data, std::move(text), line_, col_});
  }

  // After a block/comment close at `after`: "-" eats all whitespace, plain
  // closes eat one newline when trim_blocks is on. Returns the new position.
  size_t close_suffix(size_t after, char marker) {
    if (marker == '-') {
      while (after < src_.size() && is_space(src_[after])) ++after;
    } else if (marker != '+' && opt_.trim_blocks && after < src_.size() && src_[after] == '\n') {
      ++after;
    }
    return after;
  }

  void finish_match(size_t end) {
    line_starting_ = end > 0 && src_[end - 1] == '\n';
    advance_to(end);
  }

  Status root_step() {
    size_t tag = src_.find('{', pos_);
    while (tag != std::string::npos && tag + 1 < src_.size() &&
           (src_[tag + 1] == 0 || !std::strchr("{%#", src_[tag + 1])))
      tag = src_.find('{', tag + 1);
    if (tag == std::string::npos || tag + 1 >= src_.size()) {
      tokens_.push_back({TokType::Data, src_.substr(pos_), line_, col_});
      finish_match(src_.size());
      return Status::ok();
    }
    char kind = src_[tag + 1];
    char sign = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+') ? src_[tag + 2] : 0;
    size_t body = tag + 2 + (sign ? 1 : 0);
    if (kind == '%') {
      size_t raw_end = match_raw_begin(body);
      if (raw_end != 0) {
        emit_text(pos_, tag, sign, false);
        advance_to(tag);
        finish_match(raw_end);
        return raw_body();
      }
    }
    emit_text(pos_, tag, sign, kind == '{');
    advance_to(tag);
    int line = line_, col = col_;
    if (kind == '#') {
      size_t close = src_.find("#}", body);
      if (close == std::string::npos) return fail("missing end of comment tag", line, col);
      char marker = close > body && (src_[close - 1] == '-' || src_[close - 1] == '+') ? src_[close - 1] : 0;
      finish_match(close_suffix(close + 2, marker));
      return Status::ok();
    }
    tokens_.push_back({kind == '{' ? TokType::VarBegin : TokType::BlockBegin, "", line, col});
    advance_to(body);
    return tag_body(kind == '{');
  }

  // "{% raw %}" (with optional markers) starting at the tag body; returns the
  // end of the opening tag, or 0 when this is not a raw tag.
  size_t match_raw_begin(size_t p) {
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return 0;
    p += 3;
    if (p < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[p])) || src_[p] == '_')) return 0;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "-%}") == 0) return close_suffix(p + 3, '-');
    if (src_.compare(p, 2, "%}") == 0) return p + 2;
    return 0;
  }

  Status raw_body() {
    int line = line_, col = col_;
    for (size_t p = src_.find("{%", pos_); p != std::string::npos; p = src_.find("{%", p + 2)) {
      size_t q = p + 2;
      char sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      if (sign) ++q;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_space(src_[q])) ++q;
      char marker = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      if (src_.compare(q + (marker ? 1 : 0), 2, "%}") != 0) continue;
      emit_text(pos_, p, sign, false);
      finish_match(close_suffix(q + (marker ? 1 : 0) + 2, marker));
      return Status::ok();
    }
    return fail("missing end of raw directive", line, col);
  }

  Status tag_body(bool is_var) {
    int depth = 0;
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) advance_to(pos_ + 1);
      if (pos_ >= src_.size()) return fail(is_var ? "unexpected end of template, expected '}}'"
                                                  : "unexpected end of template, expected '%}'",
                                           line_, col_);
      if (depth == 0 && try_close(is_var)) return Status::ok();
      LATHE_TRY(read_token(&depth));
    }
  }

  bool try_close(bool is_var) {
    int line = line_, col = col_;
    const char* close = is_var ? "}}" : "%}";
    char c = src_[pos_];
    size_t end;
    if ((c == '-' || (c == '+' && !is_var)) && src_.compare(pos_ + 1, 2, close) == 0) {
      end = is_var ? (c == '-' ? close_suffix(pos_ + 3, '-') : pos_ + 3) : close_suffix(pos_ + 3, c);
    } else if (src_.compare(pos_, 2, close) == 0) {
      end = is_var ? pos_ + 2 : close_suffix(pos_ + 2, 0);
    } else {
      return false;
    }
    tokens_.push_back({is_var ? TokType::VarEnd : TokType::BlockEnd, "", line, col});
    finish_match(end);
    return true;
  }

  Status read_token(int* depth) {
    int line = line_, col = col_;
    size_t start = pos_;
    char c = src_[pos_];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t p = pos_;
      while (p < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[p])) || src_[p] == '_')) ++p;
      tokens_.push_back({TokType::Name, src_.substr(start, p - start), line, col});
      advance_to(p);
      return Status::ok();
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return read_number(line, col);
    if (c == '\'' || c == '"') return read_string(line, col);
    static const char* kOps2[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kOps2) {
      if (src_.compare(pos_, 2, op) == 0) {
        tokens_.push_back({TokType::Op, op, line, col});
        advance_to(pos_ + 2);
        return Status::ok();
      }
    }
    if (!std::strchr("+-/*%~[](){}><=.:|,;", c) || c == 0)
      return fail(std::string("unexpected character '") + c + "'", line, col);
    if (c == '(' || c == '[' || c == '{') ++*depth;
    if (c == ')' || c == ']' || c == '}') {
      if (*depth == 0) return fail(std::string("unexpected '") + c + "'", line, col);
      --*depth;
    }
    tokens_.push_back({TokType::Op, std::string(1, c), line, col});
    advance_to(pos_ + 1);
    return Status::ok();
  }

  Status read_number(int line, int col) {
    size_t p = pos_;
    auto digits = [&] {
      while (p < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[p])) || src_[p] == '_')) ++p;
    };
    digits();
    bool is_float = false;
    bool after_dot = !tokens_.empty() && tokens_.back().type == TokType::Op && tokens_.back().value == ".";
    if (!after_dot && p + 1 < src_.size() && src_[p] == '.' && std::isdigit(static_cast<unsigned char>(src_[p + 1]))) {
      ++p;
      digits();
      is_float = true;
    }
    if (!after_dot && p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
        p = q;
        digits();
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = pos_; i < p; ++i)
      if (src_[i] != '_') text += src_[i];
    tokens_.push_back({is_float ? TokType::Float : TokType::Int, text, line, col});
    advance_to(p);
    return Status::ok();
  }

  Status read_string(int line, int col) {
    char quote = src_[pos_];
    std::string out;
    size_t p = pos_ + 1;
    while (true) {
      if (p >= src_.size()) return fail("unterminated string literal", line, col);
      char c = src_[p];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) return fail("unterminated string literal", line, col);
      LATHE_TRY(read_escape(&p, &out, line, col));
    }
    tokens_.push_back({TokType::String, std::move(out), line, col});
    advance_to(p + 1);
    return Status::ok();
  }

  // Python's unicode-escape rules for the escape at src_[*p] == '\\'.
  Status read_escape(size_t* p, std::string* out, int line, int col) {
    char e = src_[*p + 1];
    *p += 2;
    switch (e) {
      case 'n': *out += '\n'; return Status::ok();
      case 't': *out += '\t'; return Status::ok();
      case 'r': *out += '\r'; return Status::ok();
      case '\\': *out += '\\'; return Status::ok();
      case '\'': *out += '\''; return Status::ok();
      case '"': *out += '"'; return Status::ok();
      case 'a': *out += '\a'; return Status::ok();
      case 'b': *out += '\b'; return Status::ok();
      case 'f': *out += '\f'; return Status::ok();
      case 'v': *out += '\v'; return Status::ok();
      case '\n': return Status::ok();
      default: break;
    }
    if (e >= '0' && e <= '7') {
      uint32_t v = static_cast<uint32_t>(e - '0');
      for (int k = 0; k < 2 && *p < src_.size() && src_[*p] >= '0' && src_[*p] <= '7'; ++k, ++*p)
        v = v * 8 + static_cast<uint32_t>(src_[*p] - '0');
      append_utf8(v, out);
      return Status::ok();
    }
    int n = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (n == 0) {
      *out += '\\';
      *out += e;
      return Status::ok();
    }
    uint32_t v = 0;
    for (int k = 0; k < n; ++k, ++*p) {
      if (*p >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[*p])))
        return fail("truncated \\" + std::string(1, e) + " escape in string literal", line, col);
      char h = static_cast<char>(std::tolower(static_cast<unsigned char>(src_[*p])));
      v = v * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : h - 'a' + 10);
    }
    if (v > 0x10ffff) return fail("illegal Unicode character in string literal", line, col);
    append_utf8(v, out);
    return Status::ok();
  }

  std::string src_;
  LexOptions opt_;
  size_t pos_ = 0;
  int line_ = 1;
  int col_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

// "\r\n" and "\r" become "\n"; one trailing newline is dropped (jinja2's
// keep_trailing_newline=False).
std::string normalize_newlines(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      out += '\n';
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      out += s[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

Result<std::vector<Token>> tokenize(const std::string& source, const LexOptions& opt) {
  return Lexer(normalize_newlines(source), opt).run();
}

}  // namespace lathe::jinja
