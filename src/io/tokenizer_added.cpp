// Added-token matching (see the header). Word and space tests use Unicode
// properties (alphanumeric or '_' for a word character, White_Space for
// spaces) as the reference library's char predicates do.
#include "io/tokenizer_added.h"

#include <algorithm>

#include <unicode/uchar.h>

#include "io/tokenizer_utf8.h"

namespace lathe::tok {

void AddedMatcher::build(const std::vector<std::string>& patterns, const std::vector<const AddedToken*>& tokens) {
  nodes_.assign(1, Node{});
  tokens_ = tokens;
  std::fill(std::begin(first_byte_), std::end(first_byte_), false);
  for (size_t p = 0; p < patterns.size(); ++p) {
    const std::string& s = patterns[p];
    if (s.empty()) continue;
    first_byte_[uint8_t(s[0])] = true;
    int32_t node = 0;
    for (char ch : s) {
      auto c = uint8_t(ch);
      auto& next = nodes_[size_t(node)].next;
      auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(c, int32_t(-1)));
      if (it != next.end() && it->first == c) {
        node = it->second;
      } else {
        int32_t fresh = int32_t(nodes_.size());
        next.insert(it, {c, fresh});
        nodes_.emplace_back();
        node = fresh;
      }
    }
    if (nodes_[size_t(node)].pattern < 0) nodes_[size_t(node)].pattern = int32_t(p);
  }
}

std::pair<int32_t, size_t> AddedMatcher::longest_at(std::string_view text, size_t i) const {
  int32_t node = 0, best = -1;
  size_t best_len = 0;
  for (size_t k = i; k < text.size(); ++k) {
    const auto& next = nodes_[size_t(node)].next;
    auto c = uint8_t(text[k]);
    auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(c, int32_t(-1)));
    if (it == next.end() || it->first != c) break;
    node = it->second;
    if (nodes_[size_t(node)].pattern >= 0) {
      best = nodes_[size_t(node)].pattern;
      best_len = k + 1 - i;
    }
  }
  return {best, best_len};
}

namespace {

// The code point ending just before text[end], or -1.
int32_t last_cp(std::string_view text, size_t end) {
  if (end == 0) return -1;
  size_t b = end - 1;
  while (b > 0 && end - b < 4 && (uint8_t(text[b]) & 0xC0) == 0x80) --b;
  size_t n = utf8_valid_len(text, b);
  return n == end - b ? int32_t(utf8_decode(text, b, n)) : -1;
}

int32_t first_cp(std::string_view text, size_t begin) {
  if (begin >= text.size()) return -1;
  size_t n = utf8_valid_len(text, begin);
  return n == 0 ? -1 : int32_t(utf8_decode(text, begin, n));
}

bool is_word(int32_t cp) { return cp >= 0 && (cp == '_' || u_isalnum(UChar32(cp))); }
bool is_space(int32_t cp) { return cp >= 0 && u_isUWhiteSpace(UChar32(cp)); }

}  // namespace

void AddedMatcher::split(std::string_view text, std::vector<Segment>& out) const {
  size_t emitted = 0;  // end of the last segment pushed
  for (size_t i = 0; i < text.size();) {
    if (!first_byte_[uint8_t(text[i])]) {
      ++i;
      continue;
    }
    auto [pattern, len] = longest_at(text, i);
    if (pattern < 0) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + len;
    i = stop;  // matches never overlap, kept or not
    const AddedToken& tok = *tokens_[size_t(pattern)];
    if (tok.single_word) {
      bool space_before = start == 0 || !is_word(last_cp(text, start));
      bool space_after = stop == text.size() || !is_word(first_cp(text, stop));
      if (!space_before || !space_after) continue;
    }
    if (tok.lstrip) {
      size_t s = start;
      for (int32_t cp; (cp = last_cp(text, s)) >= 0 && is_space(cp);) {
        s -= size_t(cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4);
      }
      start = std::max(s, emitted);
    }
    if (tok.rstrip) {
      for (int32_t cp; (cp = first_cp(text, stop)) >= 0 && is_space(cp);) {
        stop += size_t(cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4);
      }
      i = stop;
    }
    if (emitted < start) out.push_back({emitted, start, -1});
    out.push_back({start, stop, tok.id});
    emitted = stop;
  }
  if (emitted != text.size() || text.empty()) out.push_back({emitted, text.size(), -1});
}

}  // namespace lathe::tok
