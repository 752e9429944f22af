// PEFT adapter reading: the config's fields with peft's defaults, refusals
// for what lathe does not implement, then the safetensors keys parsed into
// module → (A, B) with every pair checked for rank agreement.
#include "io/peft_adapter.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "io/safetensors.h"

namespace lathe {
namespace {

using json = nlohmann::json;

constexpr std::string_view kKeyPrefix = "base_model.model.";

// A value that is absent, null, false, or an empty container/string.
bool is_unset(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return true;
  if (it->is_boolean()) return !it->get<bool>();
  if (it->is_structured() || it->is_string()) return it->empty();
  return false;
}

// Fields peft has and lathe refuses, each with what to do instead.
Status refuse_unsupported(const json& j, const std::string& source) {
  struct Refusal {
    const char* field;
    const char* why;
  };
  static constexpr Refusal kRefusals[] = {
      {"use_dora", "DoRA adapters are not supported; merge it with peft (merge_and_unload) first"},
      {"fan_in_fan_out", "fan_in_fan_out (Conv1D-style weights) is not supported"},
      {"modules_to_save", "modules_to_save (fully trained extra modules) is not supported"},
      {"rank_pattern", "per-module ranks (rank_pattern) are not supported"},
      {"alpha_pattern", "per-module alphas (alpha_pattern) are not supported"},
      {"layers_to_transform", "layers_to_transform is not supported"},
      {"exclude_modules", "exclude_modules is not supported"},
      {"lora_bias", "LoRA biases (lora_bias) are not supported"},
      {"target_parameters", "target_parameters is not supported"},
      {"layer_replication", "layer_replication is not supported"},
      {"trainable_token_indices", "trainable_token_indices is not supported"},
      {"alora_invocation_tokens", "activated LoRA (alora_invocation_tokens) is not supported"},
      {"use_qalora", "QA-LoRA (use_qalora) is not supported"},
  };
  for (const Refusal& r : kRefusals)
    if (!is_unset(j, r.field)) return unsupported(source, ": field \"", r.field, "\": ", r.why);
  auto bias = j.find("bias");
  if (bias != j.end() && !bias->is_null() && !(bias->is_string() && bias->get<std::string>() == "none"))
    return unsupported(source, ": field \"bias\" must be \"none\" (trained biases are not supported)");
  auto type = j.find("peft_type");
  if (type != j.end() && !type->is_null() && !(type->is_string() && type->get<std::string>() == "LORA"))
    return unsupported(source, ": field \"peft_type\" must be \"LORA\" (other adapter types are not supported)");
  return Status::ok();
}

Status read_targets(const json& j, const std::string& source, PeftAdapterConfig* cfg) {
  auto t = j.find("target_modules");
  if (t == j.end() || t->is_null()) return invalid_argument(source, ": missing field \"target_modules\"");
  if (t->is_string()) {
    cfg->target_regex = t->get<std::string>();
    if (cfg->target_regex.empty()) return invalid_argument(source, ": field \"target_modules\" is empty");
    if (cfg->target_regex == "all-linear") return Status::ok();
    try {
      std::regex check(cfg->target_regex);
    } catch (const std::regex_error& e) {
      return invalid_argument(source, ": field \"target_modules\" is not a valid regular expression: ", e.what());
    }
    return Status::ok();
  }
  if (!t->is_array() || t->empty())
    return invalid_argument(source, ": field \"target_modules\" must be a non-empty list of names or a string");
  for (const json& name : *t) {
    if (!name.is_string() || name.get<std::string>().empty())
      return invalid_argument(source, ": field \"target_modules\" must hold non-empty strings");
    cfg->target_names.push_back(name.get<std::string>());
  }
  return Status::ok();
}

Result<PeftAdapterConfig> parse_fields(const json& j, const std::string& source) {
  if (!j.is_object()) return invalid_argument(source, ": expected a JSON object");
  LATHE_TRY(refuse_unsupported(j, source));
  PeftAdapterConfig cfg;
  auto r = j.find("r");
  if (r == j.end() || !r->is_number_integer() || r->get<int64_t>() <= 0 || r->get<int64_t>() > 65536)
    return invalid_argument(source, ": field \"r\" must be a positive integer");
  cfg.r = r->get<int>();
  auto alpha = j.find("lora_alpha");
  if (alpha == j.end() || !alpha->is_number())
    return invalid_argument(source, ": field \"lora_alpha\" must be a number");
  cfg.lora_alpha = alpha->get<float>();
  if (!std::isfinite(cfg.lora_alpha)) return invalid_argument(source, ": field \"lora_alpha\" must be finite");
  auto rs = j.find("use_rslora");
  if (rs != j.end() && !rs->is_null()) {
    if (!rs->is_boolean()) return invalid_argument(source, ": field \"use_rslora\" must be true or false");
    cfg.use_rslora = rs->get<bool>();
  }
  auto dropout = j.find("lora_dropout");
  if (dropout != j.end() && dropout->is_number()) cfg.lora_dropout = dropout->get<float>();
  auto base = j.find("base_model_name_or_path");
  if (base != j.end() && base->is_string()) cfg.base_model_name_or_path = base->get<std::string>();
  LATHE_TRY(read_targets(j, source, &cfg));
  return cfg;
}

Result<std::string> read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found("peft adapter: cannot open ", path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// "base_model.model.<module>.lora_A.weight" → module and 'A'; false otherwise.
bool split_key(std::string_view key, std::string* module, char* which) {
  if (key.substr(0, kKeyPrefix.size()) != kKeyPrefix) return false;
  key.remove_prefix(kKeyPrefix.size());
  for (char c : {'A', 'B'}) {
    const std::string suffix = std::string(".lora_") + c + ".weight";
    if (key.size() > suffix.size() && key.substr(key.size() - suffix.size()) == suffix) {
      *module = std::string(key.substr(0, key.size() - suffix.size()));
      *which = c;
      return true;
    }
  }
  return false;
}

}  // namespace

float PeftAdapterConfig::scale() const {
  return use_rslora ? lora_alpha / std::sqrt(float(r)) : lora_alpha / float(r);
}

bool PeftAdapterConfig::targets(std::string_view module) const {
  if (!target_regex.empty()) {
    if (target_regex == "all-linear") return module != "lm_head";
    // Validated at parse time; a regex_error here cannot happen.
    return std::regex_match(module.begin(), module.end(), std::regex(target_regex));
  }
  for (const std::string& t : target_names) {
    if (module == t) return true;
    if (module.size() > t.size() && module.substr(module.size() - t.size()) == t &&
        module[module.size() - t.size() - 1] == '.')
      return true;
  }
  return false;
}

Result<PeftAdapterConfig> parse_peft_adapter_config(std::string_view json_text, const std::string& source) {
  try {
    json j = json::parse(json_text);
    return parse_fields(j, source);
  } catch (const json::exception& e) {
    return invalid_argument(source, ": ", e.what());
  } catch (const std::regex_error& e) {
    return invalid_argument(source, ": field \"target_modules\": ", e.what());
  }
}

Status write_peft_adapter(const std::string& dir, const PeftAdapterConfig& config,
                          const std::vector<std::pair<std::string, Tensor>>& tensors) {
  const std::string weights_path = dir + "/adapter_model.safetensors";
  if (config.r <= 0) return invalid_argument("write_peft_adapter: ", dir, ": r must be positive, got ", config.r);
  if (config.target_names.empty()) return invalid_argument("write_peft_adapter: ", dir, ": no target modules");
  if (tensors.empty()) return invalid_argument("write_peft_adapter: ", weights_path, ": no LoRA tensors");
  for (const auto& [key, t] : tensors) {
    std::string module;
    char which = 0;
    if (!split_key(key, &module, &which))
      return invalid_argument("write_peft_adapter: ", weights_path, ": tensor '", key, "' is not a LoRA factor");
    if (t.rank() != 2 || (which == 'A' ? t.size(0) : t.size(1)) != config.r)
      return invalid_argument("write_peft_adapter: ", weights_path, ": tensor '", key, "' has shape ", t.shape().str(),
                              ", not a LoRA ", which, " of rank ", config.r);
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return io_error("write_peft_adapter: cannot create ", dir, ": ", ec.message());
  // The keys peft writes for a LoRA config, with lathe's values.
  json j = {{"peft_type", "LORA"}, {"task_type", "CAUSAL_LM"},
            {"base_model_name_or_path", config.base_model_name_or_path},
            {"r", config.r}, {"lora_alpha", config.lora_alpha}, {"lora_dropout", config.lora_dropout},
            {"use_rslora", config.use_rslora}, {"target_modules", config.target_names}, {"bias", "none"},
            {"fan_in_fan_out", false}, {"inference_mode", true}, {"init_lora_weights", true},
            {"modules_to_save", nullptr}, {"layers_to_transform", nullptr}, {"layers_pattern", nullptr},
            {"rank_pattern", json::object()}, {"alpha_pattern", json::object()},
            {"use_dora", false}, {"revision", nullptr}};
  std::string text;
  try {
    text = j.dump(2) + "\n";
  } catch (const json::exception& e) {  // a path or name that is not UTF-8
    return invalid_argument("write_peft_adapter: ", dir, "/adapter_config.json: ", e.what());
  }
  LATHE_TRY(write_text_atomic(dir + "/adapter_config.json", text));
  return write_safetensors(weights_path, tensors, {{"format", "pt"}});
}

Result<PeftAdapter> load_peft_adapter(const std::string& dir) {
  PeftAdapter ad;
  ad.dir = dir;
  ad.config_path = dir + "/adapter_config.json";
  ad.weights_path = dir + "/adapter_model.safetensors";
  LATHE_ASSIGN_OR_RETURN(std::string text, read_text(ad.config_path));
  LATHE_ASSIGN_OR_RETURN(ad.config, parse_peft_adapter_config(text, ad.config_path));
  LATHE_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(ad.weights_path));
  const std::string& path = ad.weights_path;
  for (const SafetensorsEntry& e : file.entries()) {
    std::string module;
    char which = 0;
    if (!split_key(e.name, &module, &which))
      return unsupported(path, ": tensor '", e.name,
                         "' is not a LoRA factor (expected base_model.model.<module>.lora_A.weight or .lora_B.weight)");
    if (e.dtype != DType::F32 && e.dtype != DType::BF16 && e.dtype != DType::F16)
      return invalid_argument(path, ": tensor '", e.name, "' has dtype ", dtype_name(e.dtype),
                              ", expected F32, BF16 or F16");
    if (e.shape.rank() != 2) return invalid_argument(path, ": tensor '", e.name, "' has shape ", e.shape.str(), ", expected 2-D");
    const int64_t rank_dim = which == 'A' ? e.shape[0] : e.shape[1];
    if (rank_dim != ad.config.r)
      return invalid_argument(path, ": tensor '", e.name, "' has shape ", e.shape.str(), ", its rank dimension is not r = ",
                              ad.config.r, " of ", ad.config_path);
    if (!ad.config.targets(module))
      return invalid_argument(path, ": tensor '", e.name, "' adapts '", module, "', which target_modules of ",
                              ad.config_path, " does not name");
    LATHE_ASSIGN_OR_RETURN(Tensor t, file.tensor(e.name));
    LoraPair& pair = ad.modules[module];
    (which == 'A' ? pair.a : pair.b) = std::move(t);
  }
  for (const auto& [module, pair] : ad.modules)
    if (!pair.a.defined() || !pair.b.defined())
      return invalid_argument(path, ": module '", module, "' has lora_", pair.a.defined() ? "A" : "B",
                              " but no lora_", pair.a.defined() ? "B" : "A");
  if (ad.modules.empty()) return invalid_argument(path, ": no LoRA tensors");
  return ad;
}

}  // namespace lathe
