// Model directory summary. Only headers are read: WeightStore maps the files
// but no tensor data is touched, so this is fast on any model size.
#include "io/model_info.h"
#include "io/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

// Where the chat template lives: transformers 5 writes chat_template.jinja,
// 4.x a "chat_template" key in tokenizer_config.json.
Result<std::string> find_chat_template(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir / "chat_template.jinja", ec)) return std::string("chat_template.jinja");
  fs::path cfg = dir / "tokenizer_config.json";
  if (!fs::exists(cfg, ec)) return std::string();
  std::ifstream in(cfg, std::ios::binary);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument(cfg.string(), ": not a JSON object");
  auto it = j.find("chat_template");
  bool present = it != j.end() && ((it->is_string() && !it->get_ref<const std::string&>().empty()) ||
                                   (it->is_array() && !it->empty()));
  return std::string(present ? "tokenizer_config.json" : "");
}

}  // namespace

Result<ModelInfo> inspect_model_dir(const std::string& dir) {
  std::error_code ec;
  fs::path d(dir);
  if (!fs::is_directory(d, ec)) return not_found(dir, ": no such model directory");
  ModelInfo info;
  info.dir = dir;
  fs::path cfg = d / "config.json";
  if (!fs::exists(cfg, ec)) return not_found(cfg.string(), ": not found (a model directory needs config.json)");
  LATHE_ASSIGN_OR_RETURN(info.config, load_model_config(cfg.string()));
  info.has_generation_config = fs::exists(d / "generation_config.json", ec);
  LATHE_ASSIGN_OR_RETURN(info.generation, load_generation_config(dir));

  info.has_weights =
      fs::exists(d / "model.safetensors", ec) || fs::exists(d / "model.safetensors.index.json", ec);
  if (info.has_weights) {
    LATHE_ASSIGN_OR_RETURN(WeightStore ws, WeightStore::open_dir(dir));
    info.n_files = static_cast<int>(ws.files().size());
    for (const std::string& name : ws.names()) {
      const SafetensorsEntry* e = ws.entry(name);
      std::string dt(dtype_name(e->dtype));
      info.n_tensors += 1;
      info.n_params += e->shape.numel();
      info.total_bytes += e->end - e->begin;
      info.tensors_by_dtype[dt] += 1;
      info.bytes_by_dtype[dt] += e->end - e->begin;
    }
  }
  info.has_tokenizer_json = fs::exists(d / "tokenizer.json", ec);
  if (info.has_tokenizer_json) {
    Result<Tokenizer> tok = Tokenizer::load(dir);
    if (tok.is_ok()) {
      info.tokenizer_vocab_size = tok->vocab_size();
      info.bos_token = tok->bos_token();
      info.eos_token = tok->eos_token();
    } else {
      info.tokenizer_error = tok.status().message();
    }
  }
  info.has_tokenizer_config = fs::exists(d / "tokenizer_config.json", ec);
  LATHE_ASSIGN_OR_RETURN(info.chat_template_source, find_chat_template(d));
  return info;
}

}  // namespace lathe
