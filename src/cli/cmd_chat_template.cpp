// `lathe chat-template`: renders a conversation with a model's chat template
// and prints the prompt exactly as the model would see it (no newline added),
// the same text transformers' apply_chat_template(tokenize=False) returns.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "io/chat_template.h"

namespace lathe::cli {
namespace {

struct ChatTemplateOpts {
  std::string tokenizer;
  std::string template_file;
  std::string messages;
  bool no_generation_prompt = false;
  std::vector<std::string> vars;
};

Result<nlohmann::ordered_json> read_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found("cannot open ", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  auto j = nlohmann::ordered_json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument(path, ": not valid JSON");
  return j;
}

Status run_chat_template(const ChatTemplateOpts& o) {
  ChatTemplate ct;
  if (!o.template_file.empty()) {
    std::ifstream f(o.template_file, std::ios::binary);
    if (!f) return not_found("cannot open ", o.template_file);
    std::ostringstream ss;
    ss << f.rdbuf();
    LATHE_ASSIGN_OR_RETURN(ct, ChatTemplate::parse(ss.str()));
    if (!o.tokenizer.empty()) LATHE_TRY(ct.set_special_tokens_from_config(o.tokenizer));
  } else {
    if (o.tokenizer.empty()) return invalid_argument("give --tokenizer DIR (or --template FILE)");
    LATHE_ASSIGN_OR_RETURN(ct, ChatTemplate::from_tokenizer_config(o.tokenizer));
  }
  LATHE_ASSIGN_OR_RETURN(nlohmann::ordered_json doc, read_json(o.messages));
  nlohmann::ordered_json messages;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  if (doc.is_array()) {
    messages = doc;
  } else if (doc.is_object() && doc.contains("messages")) {
    for (auto it = doc.begin(); it != doc.end(); ++it) {
      if (it.key() == "messages") messages = it.value();
      else extra[it.key()] = it.value();
    }
  } else {
    return invalid_argument(o.messages, ": expected a list of messages or {\"messages\": [...], ...}");
  }
  for (const std::string& kv : o.vars) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) return invalid_argument("--var ", kv, ": expected key=value");
    auto v = nlohmann::ordered_json::parse(kv.substr(eq + 1), nullptr, /*allow_exceptions=*/false);
    extra[kv.substr(0, eq)] = v.is_discarded() ? nlohmann::ordered_json(kv.substr(eq + 1)) : v;
  }
  LATHE_ASSIGN_OR_RETURN(std::string prompt, ct.render(messages, !o.no_generation_prompt, extra));
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
  return Status::ok();
}

}  // namespace

void add_chat_template(CLI::App& app, int* rc) {
  auto opts = std::make_shared<ChatTemplateOpts>();  // shared: outlives this function inside the callback
  auto* cmd = app.add_subcommand("chat-template", "Render a conversation with a model's chat template");
  cmd->add_option("--tokenizer", opts->tokenizer, "Model or tokenizer directory (tokenizer_config.json)");
  cmd->add_option("--template", opts->template_file, "A Jinja template file to use instead of the model's");
  cmd->add_option("--messages", opts->messages,
                  "JSON file: a list of messages, or {\"messages\": [...], \"tools\": [...], ...}")
      ->required();
  cmd->add_flag("--no-generation-prompt", opts->no_generation_prompt, "Do not open an assistant turn at the end");
  cmd->add_option("--var", opts->vars, "Template variable key=value (value parsed as JSON, else a string)");
  cmd->callback([opts, rc] { *rc = report("chat-template", run_chat_template(*opts)); });
}

}  // namespace lathe::cli
