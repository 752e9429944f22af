// Loading tokenizer.json (+ tokenizer_config.json) into a TokenizerImpl, the
// public Tokenizer API over it, and IncrementalDecoder. All JSON access is
// checked and every parser exception is caught here, so any input, however
// malformed, comes back as a Status naming the file and the field.
#include "io/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "io/tokenizer_impl.h"
#include "io/tokenizer_utf8.h"

namespace lathe {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open ", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error("cannot read ", path);
  return ss.str();
}

Status parse_added_tokens(const json& root, TokenizerImpl& t) {
  auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return Status::ok();
  if (!it->is_array()) return invalid_argument("added_tokens: expected an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& a = (*it)[i];
    std::string where = "added_tokens[" + std::to_string(i) + "]";
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
        !a["content"].is_string()) {
      return invalid_argument(where, ": expected {\"id\": int, \"content\": string, ...}");
    }
    int64_t id = a["id"].get<int64_t>();
    if (id < 0 || id >= (1 << 30)) return invalid_argument(where, ".id: out of range");
    auto flag = [&](const char* k, bool d) { return a.contains(k) && a[k].is_boolean() ? a[k].get<bool>() : d; };
    tok::AddedToken tok{.content = a["content"].get<std::string>(),
                        .id = int32_t(id),
                        .single_word = flag("single_word", false),
                        .lstrip = flag("lstrip", false),
                        .rstrip = flag("rstrip", false),
                        .normalized = flag("normalized", !flag("special", false)),
                        .special = flag("special", false)};
    if (tok.content.empty()) return invalid_argument(where, ".content: must not be empty");
    t.added.push_back(std::move(tok));
  }
  return Status::ok();
}

// Gives added tokens their ids the way the reference does on load (the "id"
// written in the file is not trusted): a content already added or in the
// model's vocabulary keeps that id; a new one takes the next id after the
// vocabulary and earlier added tokens. A repeated content keeps its id and
// takes the later entry's flags.
void assign_added_ids(TokenizerImpl& t) {
  std::vector<tok::AddedToken> kept;
  std::unordered_map<int32_t, size_t> index_of_id;  // into kept
  int64_t max_added = -1;
  auto vocab_size = int64_t(t.model->vocab().size());
  for (tok::AddedToken& a : t.added) {
    int64_t id;
    if (auto it = t.added_ids.find(a.content); it != t.added_ids.end()) {
      id = it->second;
    } else if (const int32_t* model_id = t.model->vocab().find(a.content)) {
      id = *model_id;
    } else {
      id = max_added >= vocab_size || vocab_size == 0 ? max_added + 1 : vocab_size;
    }
    a.id = int32_t(id);
    max_added = std::max(max_added, id);
    t.added_ids[a.content] = a.id;
    auto [slot, fresh] = index_of_id.emplace(a.id, kept.size());
    if (fresh) kept.push_back(a);
    else kept[slot->second] = a;  // same content again: the later flags win
  }
  t.added = std::move(kept);
}

// Fills id_to_token / id_flags and the added-token matchers.
Status index_tokens(TokenizerImpl& t) {
  assign_added_ids(t);
  int64_t max_id = -1;
  t.model->vocab().for_each([&](std::string_view, int32_t id) { max_id = std::max<int64_t>(max_id, id); });
  for (const auto& a : t.added) max_id = std::max<int64_t>(max_id, a.id);
  size_t n_known = t.model->vocab().size() + t.added.size();
  if (max_id >= int64_t(4 * n_known + 1024)) {
    return invalid_argument("token ids are too sparse (largest ", max_id, " for ", n_known, " tokens)");
  }
  t.id_to_token.assign(size_t(max_id + 1), std::string());
  t.id_flags.assign(size_t(max_id + 1), 0);
  t.model->vocab().for_each([&](std::string_view s, int32_t id) {
    t.id_to_token[size_t(id)] = s;
    t.id_flags[size_t(id)] = TokenizerImpl::kKnown;
  });
  std::vector<std::string> raw_patterns, norm_patterns;
  std::vector<const tok::AddedToken*> raw_tokens, norm_tokens;
  for (const auto& a : t.added) {
    t.id_to_token[size_t(a.id)] = a.content;
    t.id_flags[size_t(a.id)] = TokenizerImpl::kKnown | TokenizerImpl::kAdded | (a.special ? TokenizerImpl::kSpecial : 0);
    if (a.normalized && t.normalizer) {
      std::string pattern = a.content;
      t.normalizer->apply(pattern);
      norm_patterns.push_back(std::move(pattern));
      norm_tokens.push_back(&a);
    } else {
      raw_patterns.push_back(a.content);
      raw_tokens.push_back(&a);
    }
  }
  t.raw_matcher.build(raw_patterns, raw_tokens);
  t.normalized_matcher.build(norm_patterns, norm_tokens);
  return Status::ok();
}

Status parse_root(const json& root, TokenizerImpl& t) {
  if (!root.is_object()) return invalid_argument("expected a JSON object at the top level");
  auto field = [&](const char* k) -> const json& {
    static const json kNull;
    auto it = root.find(k);
    return it == root.end() ? kNull : *it;
  };
  LATHE_ASSIGN_OR_RETURN(t.normalizer, tok::parse_normalizer(field("normalizer"), "normalizer"));
  LATHE_ASSIGN_OR_RETURN(t.pre_tokenizer, tok::parse_pre_tokenizer(field("pre_tokenizer"), "pre_tokenizer"));
  bool byte_level = t.pre_tokenizer && t.pre_tokenizer->is_byte_level();
  if (field("model").is_null()) return invalid_argument("model: missing");
  LATHE_ASSIGN_OR_RETURN(t.model, tok::BpeModel::parse(field("model"), byte_level));
  LATHE_ASSIGN_OR_RETURN(t.post_processor, tok::parse_post_processor(field("post_processor"), "post_processor"));
  LATHE_ASSIGN_OR_RETURN(t.decoder, tok::parse_decoder(field("decoder"), "decoder"));
  LATHE_TRY(parse_added_tokens(root, t));
  return index_tokens(t);
}

// bos_token / eos_token: a string or {"content": ...}; null leaves it empty.
std::string token_string(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"].get<std::string>();
  return "";
}

Status parse_config(const std::string& text, TokenizerImpl& t) {
  json cfg = json::parse(text);
  if (!cfg.is_object()) return invalid_argument("expected a JSON object at the top level");
  t.bos_token = token_string(cfg, "bos_token");
  t.eos_token = token_string(cfg, "eos_token");
  auto it = cfg.find("chat_template");
  if (it == cfg.end() || it->is_null()) return Status::ok();
  if (it->is_string()) {
    t.chat_template = it->get<std::string>();
    return Status::ok();
  }
  if (!it->is_array()) return invalid_argument("chat_template: expected a string or a list of {name, template}");
  for (const json& e : *it) {
    if (e.is_object() && e.value("name", json()).is_string() && e["name"] == "default" && e.contains("template") &&
        e["template"].is_string()) {
      t.chat_template = e["template"].get<std::string>();
    }
  }
  return Status::ok();
}

}  // namespace

Result<Tokenizer> Tokenizer::from_json(std::string_view json_text, const std::string& source_name) {
  auto impl = std::make_shared<TokenizerImpl>();
  impl->source = source_name;
  try {
    json root = json::parse(json_text);
    Status s = parse_root(root, *impl);
    if (!s) return s.with_context("tokenizer " + source_name);
  } catch (const std::exception& e) {
    return invalid_argument("tokenizer ", source_name, ": ", e.what());
  }
  Tokenizer tok;
  tok.impl_ = std::move(impl);
  return tok;
}

Result<Tokenizer> Tokenizer::load(const std::string& path) {
  std::error_code ec;
  fs::path file = fs::is_directory(path, ec) ? fs::path(path) / "tokenizer.json" : fs::path(path);
  LATHE_ASSIGN_OR_RETURN(std::string text, read_file(file.string()));
  LATHE_ASSIGN_OR_RETURN(Tokenizer tok, from_json(text, file.string()));
  fs::path cfg_path = file.parent_path() / "tokenizer_config.json";
  if (fs::exists(cfg_path, ec)) {
    LATHE_ASSIGN_OR_RETURN(std::string cfg, read_file(cfg_path.string()));
    // Loading is the only writer; the impl is not shared with anyone yet.
    auto* impl = const_cast<TokenizerImpl*>(tok.impl_.get());
    try {
      Status s = parse_config(cfg, *impl);
      if (!s) return s.with_context("tokenizer config " + cfg_path.string());
    } catch (const std::exception& e) {
      return invalid_argument("tokenizer config ", cfg_path.string(), ": ", e.what());
    }
  }
  return tok;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  impl_->encode(text, add_special_tokens, ids);
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return impl_->decode(ids, skip_special_tokens);
}

int32_t Tokenizer::vocab_size() const { return int32_t(impl_->id_to_token.size()); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_ids.find(token); it != impl_->added_ids.end()) return it->second;
  if (const int32_t* id = impl_->model->vocab().find(token)) return *id;
  return std::nullopt;
}

std::string Tokenizer::id_to_token(int32_t id) const { return impl_->token(id); }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->id_flags.size() && (impl_->id_flags[size_t(id)] & TokenizerImpl::kSpecial);
}

std::optional<int32_t> Tokenizer::bos_token_id() const {
  return impl_->bos_token.empty() ? std::nullopt : token_to_id(impl_->bos_token);
}
std::optional<int32_t> Tokenizer::eos_token_id() const {
  return impl_->eos_token.empty() ? std::nullopt : token_to_id(impl_->eos_token);
}
const std::string& Tokenizer::bos_token() const { return impl_->bos_token; }
const std::string& Tokenizer::eos_token() const { return impl_->eos_token; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }

// ---- IncrementalDecoder ----------------------------------------------------

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(&tok), skip_special_(skip_special_tokens) {}

static bool ends_with_replacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, tok::kReplacementChar) == 0;
}

std::string IncrementalDecoder::push(int32_t id) {
  ids_.push_back(id);
  std::string text = tok_->decode(ids_, skip_special_);
  if (text.size() <= emitted_bytes_ || ends_with_replacement(text)) return "";
  std::string fresh = text.substr(emitted_bytes_);
  // Keep the ids after the previous prefix as context for the next step.
  ids_.erase(ids_.begin(), ids_.begin() + std::ptrdiff_t(prefix_index_));
  prefix_index_ = ids_.size();
  emitted_bytes_ = tok_->decode(ids_, skip_special_).size();
  return fresh;
}

std::string IncrementalDecoder::flush() {
  std::string text = tok_->decode(ids_, skip_special_);
  std::string rest = text.size() > emitted_bytes_ ? text.substr(emitted_bytes_) : "";
  ids_.clear();
  prefix_index_ = 0;
  emitted_bytes_ = 0;
  return rest;
}

}  // namespace lathe
