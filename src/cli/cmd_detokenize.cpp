// `lathe detokenize`: token ids back to text. Ids come from --ids or, when it
// is absent, from stdin; commas, whitespace and JSON brackets all separate
// them, so the output of `lathe tokenize` in any form can be piped in.
#include <cstdio>
#include <iostream>
#include <iterator>

#include "cli/commands.h"
#include "io/tokenizer.h"

namespace lathe::cli {
namespace {

struct DetokenizeArgs {
  std::string tokenizer;
  std::string ids;
  bool skip_special = false;
};

Result<std::vector<int32_t>> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    char c = s[i];
    if (c == ',' || c == '[' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++i;
      continue;
    }
    size_t j = i;
    if (s[j] == '-') ++j;
    while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
    if (j == i || (j == i + 1 && s[i] == '-') || j - i > 11) {
      return invalid_argument("bad token id at \"", s.substr(i, 16), "\": expected integers separated by commas");
    }
    long long v = std::stoll(s.substr(i, j - i));
    if (v < 0 || v > INT32_MAX) return invalid_argument("token id ", v, " is out of range");
    ids.push_back(int32_t(v));
    i = j;
  }
  return ids;
}

Status run_detokenize(const DetokenizeArgs& a, bool from_stdin) {
  LATHE_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(a.tokenizer));
  std::string src = a.ids;
  if (from_stdin) src.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  LATHE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, parse_ids(src));
  std::string text = tok.decode(ids, a.skip_special);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  return Status::ok();
}

}  // namespace

void add_detokenize(CLI::App& app, int* rc) {
  auto args = std::make_shared<DetokenizeArgs>();
  auto* cmd = app.add_subcommand("detokenize", "Turn token ids back into text (prints it and a newline)");
  cmd->add_option("--tokenizer", args->tokenizer, "Model directory holding tokenizer.json, or the file itself")
      ->required();
  auto* ids = cmd->add_option("--ids", args->ids, "Ids separated by commas, e.g. 1,2,3 (read from stdin if absent)");
  cmd->add_flag("--skip-special-tokens", args->skip_special, "Leave out special tokens such as BOS/EOS");
  cmd->callback([args, rc, ids] { *rc = report("detokenize", run_detokenize(*args, ids->count() == 0)); });
}

}  // namespace lathe::cli
