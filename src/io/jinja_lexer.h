// Jinja lexer: splits template source into text and the tokens inside
// {{ }} / {% %}, dropping {# #} comments, with the whitespace rules of the
// environment transformers uses (trim_blocks, lstrip_blocks, "-"/"+" markers,
// newlines normalized to "\n" and one trailing newline dropped). Every token
// keeps its line and column so errors can point at the template.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace lathe::jinja {

enum class TokType : uint8_t { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  TokType type;
  std::string value;  // text, name, decoded string literal, number text, operator
  int line = 1;
  int col = 1;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

Result<std::vector<Token>> tokenize(const std::string& source, const LexOptions& opt = {});

}  // namespace lathe::jinja
