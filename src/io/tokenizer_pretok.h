// Normalizers and pre-tokenizers of tokenizer.json, and the PCRE2 regex they
// split with. The reference library works on strings with offset alignments;
// lathe needs only ids, so a normalizer is a plain string -> string function
// and a pre-tokenizer turns a list of pieces into a finer list of pieces.
// Pieces are views: into the caller's text when unchanged, into a PieceArena
// when a step rewrote them, so the common path (split + byte-level) copies
// nothing.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace lathe::tok {

// A compiled PCRE2 pattern in UTF + UCP mode (\p{L}, \s, ... are full
// Unicode), JIT-compiled where the platform allows. Immutable; match() may be
// called from many threads at once.
class Regex {
 public:
  // pattern: Oniguruma syntax as tokenizer.json writes it (see onig_to_pcre2).
  static Result<std::shared_ptr<Regex>> compile(const std::string& pattern);
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex();
  // Appends [start, end) of every non-overlapping match in text, scanning
  // left to right as the reference library does. Empty matches are skipped.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  Regex() = default;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

struct Piece {
  std::string_view text;
  bool at_origin = false;  // starts at offset 0 of the whole input
};

// Owns rewritten piece text; deque so views stay valid as it grows.
struct PieceArena {
  std::deque<std::string> strings;
  std::string_view keep(std::string s) { return strings.emplace_back(std::move(s)); }
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void apply(std::string& s) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces pieces by their split (and possibly rewritten) parts.
  virtual void apply(std::vector<Piece>& pieces, PieceArena& arena) const = 0;
  // True when this step maps bytes to the byte-level alphabet; lathe then
  // feeds raw bytes to the model instead (see BpeModel).
  virtual bool is_byte_level() const { return false; }
};

// Parse the "normalizer" / "pre_tokenizer" objects (null gives nullptr).
// Errors name the JSON path, e.g. "pre_tokenizer.pretokenizers[0].behavior".
Result<std::unique_ptr<Normalizer>> parse_normalizer(const nlohmann::json& j, const std::string& where);
Result<std::unique_ptr<PreTokenizer>> parse_pre_tokenizer(const nlohmann::json& j, const std::string& where);

// Reads a {"String": s} or {"Regex": r} pattern object into a regex.
Result<std::shared_ptr<Regex>> parse_pattern(const nlohmann::json& j, const std::string& where);

// Rewrites an Oniguruma pattern so PCRE2 (UTF + UCP) matches the same text.
std::string onig_to_pcre2(std::string_view pattern);

}  // namespace lathe::tok
