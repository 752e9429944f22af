// UTF-8 helpers for the tokenizer: character lengths that tolerate invalid
// bytes (each stray byte counts as one "character", so arbitrary input never
// stalls a loop), lossy conversion with the same replacement rule the
// reference library uses (one U+FFFD per maximal invalid subsequence), and
// the GPT-2 byte-level alphabet that maps each byte to a printable code point.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace lathe::tok {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Length of the valid UTF-8 sequence starting at s[i], or 0 when the bytes
// there do not form one (truncated, overlong, surrogate or out of range).
size_t utf8_valid_len(std::string_view s, size_t i);

// Length of the "character" at s[i]: a valid sequence, else one byte.
inline size_t utf8_char_len(std::string_view s, size_t i) {
  size_t n = utf8_valid_len(s, i);
  return n == 0 ? 1 : n;
}

bool utf8_is_valid(std::string_view s);

// Replaces every maximal invalid subsequence with U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// Number of bytes at the end of s that form the start of a valid but
// incomplete UTF-8 sequence (0..3).
size_t utf8_incomplete_tail(std::string_view s);

void utf8_append(std::string& out, uint32_t cp);

// Decodes the code point of a valid sequence of length n at s[i].
uint32_t utf8_decode(std::string_view s, size_t i, size_t n);

// The byte-level alphabet: byte b <-> code point byte_to_cp[b].
struct ByteLevelAlphabet {
  std::array<uint32_t, 256> byte_to_cp{};
  std::array<std::string, 256> byte_to_utf8;  // UTF-8 of byte_to_cp[b]
  // Maps a string of byte-level characters back to raw bytes. Returns false
  // (and leaves out unspecified) when a character is outside the alphabet.
  bool to_bytes(std::string_view chars, std::string& out) const;
  // Code point -> byte, or -1. Code points of the alphabet are all < 324.
  std::array<int16_t, 324> cp_to_byte{};
};
const ByteLevelAlphabet& byte_level_alphabet();

}  // namespace lathe::tok
