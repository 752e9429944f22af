// ChatTemplate: loads a template from tokenizer_config.json (or
// chat_template.jinja), and renders it the way transformers'
// apply_chat_template does: messages cleaned the same way, the same
// variables, one bounded jinja render.
#include "io/chat_template.h"

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "io/jinja_eval.h"

namespace lathe {

class ChatTemplateImpl {
 public:
  jinja::Template main;
  std::optional<jinja::Template> tool_use;  // the "tool_use" entry of the named-template form
};

namespace {

namespace fs = std::filesystem;
using jinja::Value;
using jinja::ValueDict;

const char* const kSpecialTokenKeys[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                         "pad_token", "cls_token", "mask_token"};
const char* const kReasoningFields[] = {"reasoning_content", "thinking", "reasoning"};

Result<std::string> read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return not_found("cannot open ", p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return io_error("read ", p.string(), " failed");
  return ss.str();
}

// A message as transformers hands it to the template: keys whose value is
// null dropped; reasoning under any of its names copied to "thinking" (moved
// first, keeping its own value if it has one) and "reasoning_content" (last
// unless present).
Result<Value> clean_message(const Value& m, size_t index) {
  if (!m.is_dict())
    return invalid_argument("messages[", index, "]: chat messages must be objects, got ", m.type_name());
  ValueDict d;
  for (const auto& [k, v] : m.as_dict().items)
    if (!v.is_none()) d.items.emplace_back(k, v);
  const Value* reasoning = nullptr;
  for (const char* f : kReasoningFields) {
    if ((reasoning = d.find(f))) break;
  }
  if (!reasoning) return Value::dict(std::move(d));
  Value r = *reasoning;
  const Value* thinking = d.find("thinking");
  ValueDict out;
  out.items.emplace_back("thinking", thinking ? *thinking : r);
  for (auto& kv : d.items)
    if (kv.first != "thinking") out.items.push_back(std::move(kv));
  out.set("reasoning_content", r);
  return Value::dict(std::move(out));
}

Result<std::string> render_values(const ChatTemplateImpl& impl,
                                  const std::vector<std::pair<std::string, std::string>>& special,
                                  const Value& messages, bool add_generation_prompt, const Value& extra,
                                  std::vector<std::pair<size_t, size_t>>* spans = nullptr) {
  if (!messages.is_list()) return invalid_argument("chat template: messages must be a list, got ", messages.type_name());
  if (messages.as_list().empty())
    return invalid_argument("chat template: cannot apply a chat template to an empty conversation");
  if (!extra.is_dict()) return invalid_argument("chat template: extra variables must be an object");
  jinja::ValueList cleaned;
  for (size_t i = 0; i < messages.as_list().size(); ++i) {
    LATHE_ASSIGN_OR_RETURN(Value m, clean_message(messages.as_list()[i], i));
    cleaned.push_back(std::move(m));
  }
  ValueDict vars;
  for (const auto& [k, v] : special) vars.set(k, Value::string(v));
  vars.set("tools", Value::none());
  vars.set("documents", Value::none());
  for (const auto& [k, v] : extra.as_dict().items) vars.set(k, v);
  vars.set("messages", Value::list(std::move(cleaned)));
  vars.set("add_generation_prompt", Value::boolean(add_generation_prompt));
  const Value* tools = vars.find("tools");
  const jinja::Template& t = impl.tool_use && tools && !tools->is_none() ? *impl.tool_use : impl.main;
  jinja::RenderOptions opt;
  opt.generation_spans = spans;
  Result<std::string> out = jinja::render(t, vars, opt);
  if (!out.is_ok()) return out.status().with_context("chat template");
  return out;
}

}  // namespace

Result<ChatTemplate> ChatTemplate::parse(const std::string& source) {
  auto impl = std::make_shared<ChatTemplateImpl>();
  LATHE_ASSIGN_OR_RETURN(impl->main, jinja::parse_template(source));
  ChatTemplate ct;
  ct.impl_ = std::move(impl);
  return ct;
}

void ChatTemplate::set_special_token(const std::string& name, const std::string& value) {
  for (auto& [k, v] : special_tokens_) {
    if (k == name) {
      v = value;
      return;
    }
  }
  special_tokens_.emplace_back(name, value);
  if (name == "bos_token") bos_token_ = value;
  if (name == "eos_token") eos_token_ = value;
}

static Result<nlohmann::ordered_json> read_config(const std::string& path, fs::path* file) {
  *file = path;
  std::error_code ec;
  if (fs::is_directory(*file, ec)) *file /= "tokenizer_config.json";
  LATHE_ASSIGN_OR_RETURN(std::string text, read_file(*file));
  nlohmann::ordered_json cfg = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (cfg.is_discarded() || !cfg.is_object()) return invalid_argument(file->string(), ": not a JSON object");
  return cfg;
}

Status ChatTemplate::set_special_tokens_from_config(const std::string& path) {
  fs::path file;
  LATHE_ASSIGN_OR_RETURN(nlohmann::ordered_json cfg, read_config(path, &file));
  for (const char* key : kSpecialTokenKeys) {
    auto tok = cfg.find(key);
    if (tok == cfg.end()) continue;
    if (tok->is_string()) set_special_token(key, tok->get<std::string>());
    else if (tok->is_object() && tok->contains("content") && (*tok)["content"].is_string())
      set_special_token(key, (*tok)["content"].get<std::string>());
  }
  return Status::ok();
}

Result<ChatTemplate> ChatTemplate::from_tokenizer_config(const std::string& path) {
  fs::path file;
  LATHE_ASSIGN_OR_RETURN(nlohmann::ordered_json cfg, read_config(path, &file));
  std::error_code ec;
  auto impl = std::make_shared<ChatTemplateImpl>();
  const std::string where = file.string() + ": chat_template";
  auto it = cfg.find("chat_template");
  if (it != cfg.end() && it->is_string()) {
    Result<jinja::Template> t = jinja::parse_template(it->get<std::string>());
    if (!t.is_ok()) return t.status().with_context(where);
    impl->main = std::move(t).value();
  } else if (it != cfg.end() && it->is_array()) {
    bool found = false;
    for (const auto& entry : *it) {
      if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
          !entry["name"].is_string() || !entry["template"].is_string())
        return invalid_argument(where, ": each entry needs string \"name\" and \"template\"");
      std::string name = entry["name"].get<std::string>();
      if (name != "default" && name != "tool_use") continue;
      Result<jinja::Template> t = jinja::parse_template(entry["template"].get<std::string>());
      if (!t.is_ok()) return t.status().with_context(where + "[" + name + "]");
      if (name == "default") {
        impl->main = std::move(t).value();
        found = true;
      } else {
        impl->tool_use = std::move(t).value();
      }
    }
    if (!found) return invalid_argument(where, ": no template named \"default\"");
  } else {
    fs::path jinja_file = file.parent_path() / "chat_template.jinja";
    if (!fs::exists(jinja_file, ec))
      return not_found(file.string(), ": no chat_template (and no chat_template.jinja beside it)");
    LATHE_ASSIGN_OR_RETURN(std::string src, read_file(jinja_file));
    Result<jinja::Template> t = jinja::parse_template(src);
    if (!t.is_ok()) return t.status().with_context(jinja_file.string());
    impl->main = std::move(t).value();
  }
  ChatTemplate ct;
  ct.impl_ = std::move(impl);
  LATHE_TRY(ct.set_special_tokens_from_config(file.string()));
  return ct;
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                         const nlohmann::ordered_json& extra) const {
  if (!impl_) return invalid_argument("chat template: not loaded");
  return render_values(*impl_, special_tokens_, Value::from_json(messages), add_generation_prompt,
                       Value::from_json(extra));
}

Result<std::string> ChatTemplate::render_with_generation_spans(const nlohmann::ordered_json& messages,
                                                               bool add_generation_prompt,
                                                               const nlohmann::ordered_json& extra,
                                                               std::vector<std::pair<size_t, size_t>>* spans) const {
  if (!impl_) return invalid_argument("chat template: not loaded");
  if (spans) spans->clear();
  return render_values(*impl_, special_tokens_, Value::from_json(messages), add_generation_prompt,
                       Value::from_json(extra), spans);
}

Result<std::string> ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt,
                                         const nlohmann::json& extra) const {
  if (!impl_) return invalid_argument("chat template: not loaded");
  return render_values(*impl_, special_tokens_, Value::from_json(messages), add_generation_prompt,
                       Value::from_json(extra));
}

}  // namespace lathe
