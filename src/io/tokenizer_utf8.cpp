// UTF-8 validation, lossy repair and the byte-level alphabet (see the header).
// Validation follows the well-formed byte table of Unicode chapter 3 so that
// the replacement behaviour matches a strict decoder exactly.
#include "io/tokenizer_utf8.h"

namespace lathe::tok {

size_t utf8_valid_len(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + i;
  size_t left = s.size() - i;
  uint8_t b0 = p[0];
  if (b0 < 0x80) return 1;
  auto cont = [&](size_t k, uint8_t lo = 0x80, uint8_t hi = 0xBF) { return k < left && p[k] >= lo && p[k] <= hi; };
  if (b0 >= 0xC2 && b0 <= 0xDF) return cont(1) ? 2 : 0;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    uint8_t lo = b0 == 0xE0 ? 0xA0 : 0x80;
    uint8_t hi = b0 == 0xED ? 0x9F : 0xBF;
    return cont(1, lo, hi) && cont(2) ? 3 : 0;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    uint8_t lo = b0 == 0xF0 ? 0x90 : 0x80;
    uint8_t hi = b0 == 0xF4 ? 0x8F : 0xBF;
    return cont(1, lo, hi) && cont(2) && cont(3) ? 4 : 0;
  }
  return 0;
}

bool utf8_is_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8_valid_len(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

// Length of the longest prefix at s[i] that could still begin a valid
// sequence (the "maximal subpart"); at least 1.
static size_t maximal_subpart(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + i;
  size_t left = s.size() - i;
  uint8_t b0 = p[0];
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 1;
  }
  size_t k = 1;
  for (; k < need && k < left; ++k) {
    uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (p[k] < l || p[k] > h) break;
  }
  return k;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    size_t n = utf8_valid_len(bytes, i);
    if (n > 0) {
      out.append(bytes.data() + i, n);
      i += n;
    } else {
      out.append(kReplacementChar);
      i += maximal_subpart(bytes, i);
    }
  }
  return out;
}

size_t utf8_incomplete_tail(std::string_view s) {
  for (size_t k = 1; k <= 3 && k <= s.size(); ++k) {
    size_t i = s.size() - k;
    auto b = static_cast<uint8_t>(s[i]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: look further back
    if (b < 0xC2 || b > 0xF4) return 0;
    return maximal_subpart(s, i) == k && k < (b >= 0xF0 ? 4u : b >= 0xE0 ? 3u : 2u) ? k : 0;
  }
  return 0;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint32_t utf8_decode(std::string_view s, size_t i, size_t n) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + i;
  switch (n) {
    case 1: return p[0];
    case 2: return ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    case 3: return ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    default: return ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
  }
}

// Printable Latin-1 bytes stand for themselves; the remaining 68 bytes take
// the code points 256, 257, ... in byte order.
static ByteLevelAlphabet make_alphabet() {
  ByteLevelAlphabet a;
  a.cp_to_byte.fill(-1);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    uint32_t cp = printable ? b : next++;
    a.byte_to_cp[b] = cp;
    utf8_append(a.byte_to_utf8[b], cp);
    a.cp_to_byte[cp] = static_cast<int16_t>(b);
  }
  return a;
}

const ByteLevelAlphabet& byte_level_alphabet() {
  static const ByteLevelAlphabet a = make_alphabet();
  return a;
}

bool ByteLevelAlphabet::to_bytes(std::string_view chars, std::string& out) const {
  out.clear();
  for (size_t i = 0; i < chars.size();) {
    size_t n = utf8_valid_len(chars, i);
    if (n == 0) return false;
    uint32_t cp = utf8_decode(chars, i, n);
    if (cp >= cp_to_byte.size() || cp_to_byte[cp] < 0) return false;
    out.push_back(static_cast<char>(cp_to_byte[cp]));
    i += n;
  }
  return true;
}

}  // namespace lathe::tok
