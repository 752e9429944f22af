// `lathe tokenize`: text to token ids with a Hugging Face tokenizer.json.
// One text (--text, --text-file) prints its ids; --jsonl is the batch mode
// for preprocessing: each input line is a JSON string, each output line the
// JSON array of its ids, and a bad line stops with file:line.
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "io/tokenizer.h"

namespace lathe::cli {
namespace {

struct TokenizeArgs {
  std::string tokenizer;
  std::string text;
  std::string text_file;
  std::string jsonl;
  bool add_special = false;
  bool json_out = false;
};

std::string format_ids(const Tokenizer& tok, const std::vector<int32_t>& ids, bool json_out) {
  if (json_out) {
    nlohmann::json tokens = nlohmann::json::array();
    for (int32_t id : ids) tokens.push_back(tok.id_to_token(id));
    nlohmann::json out = {{"ids", ids}, {"tokens", tokens}};
    return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s.append(i ? " " : "").append(std::to_string(ids[i]));
  return s;
}

Status run_jsonl(const Tokenizer& tok, const TokenizeArgs& a) {
  std::ifstream in(a.jsonl, std::ios::binary);
  if (!in) return not_found("cannot open ", a.jsonl);
  std::string line, text;
  for (size_t line_no = 1; std::getline(in, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    try {
      nlohmann::json j = nlohmann::json::parse(line);
      if (!j.is_string()) return invalid_argument(a.jsonl, ":", line_no, ": expected a JSON string");
      text = j.get<std::string>();
    } catch (const nlohmann::json::exception& e) {
      return invalid_argument(a.jsonl, ":", line_no, ": ", e.what());
    }
    std::vector<int32_t> ids = tok.encode(text, a.add_special);
    std::string out = a.json_out ? format_ids(tok, ids, true) : nlohmann::json(ids).dump();
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fputc('\n', stdout);
  }
  if (in.bad()) return io_error("cannot read ", a.jsonl);
  return Status::ok();
}

Status run_tokenize(const TokenizeArgs& a) {
  LATHE_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(a.tokenizer));
  if (!a.jsonl.empty()) return run_jsonl(tok, a);
  std::string text = a.text;
  if (!a.text_file.empty()) {
    std::ifstream in(a.text_file, std::ios::binary);
    if (!in) return not_found("cannot open ", a.text_file);
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  std::string out = format_ids(tok, tok.encode(text, a.add_special), a.json_out);
  std::printf("%s\n", out.c_str());
  return Status::ok();
}

}  // namespace

void add_tokenize(CLI::App& app, int* rc) {
  auto args = std::make_shared<TokenizeArgs>();
  auto* cmd = app.add_subcommand("tokenize", "Turn text into token ids with a Hugging Face tokenizer.json");
  cmd->add_option("--tokenizer", args->tokenizer, "Model directory holding tokenizer.json, or the file itself")
      ->required();
  auto* text = cmd->add_option("--text", args->text, "Text to tokenize");
  auto* file = cmd->add_option("--text-file", args->text_file, "File whose whole content is one text");
  auto* jsonl = cmd->add_option("--jsonl", args->jsonl,
                                "Batch mode: each line a JSON string; prints one JSON array of ids per line");
  text->excludes(file)->excludes(jsonl);
  file->excludes(jsonl);
  cmd->add_flag("--add-special-tokens", args->add_special, "Add the template's special tokens (e.g. BOS)");
  cmd->add_flag("--json", args->json_out, "Print {\"ids\": [...], \"tokens\": [...]} instead of bare ids");
  cmd->callback([args, rc, text, file, jsonl] {
    if (text->count() + file->count() + jsonl->count() == 0) {
      *rc = report("tokenize", invalid_argument("give one of --text, --text-file or --jsonl"));
      return;
    }
    *rc = report("tokenize", run_tokenize(*args));
  });
}

}  // namespace lathe::cli
