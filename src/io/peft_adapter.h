// PEFT LoRA adapter directories, as peft's save_pretrained writes them:
// adapter_config.json (r, lora_alpha, use_rslora, target_modules, ...) and
// adapter_model.safetensors with one lora_A [r, in] and lora_B [out, r] per
// adapted module, keyed "base_model.model.<module>.lora_A.weight".
//
// Reading checks the file against itself (config fields, key names, A/B
// pairs, ranks) but not against a model: the model that applies the adapter
// checks that each module exists and that the shapes fit its weights. Options
// lathe does not implement (DoRA, fan_in_fan_out, biases, modules_to_save,
// per-module rank or alpha patterns, layers_to_transform) are refused with the
// file and field named rather than silently ignored.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace lathe {

struct PeftAdapterConfig {
  int r = 0;
  float lora_alpha = 0.0f;
  bool use_rslora = false;
  // target_modules: either names matched against a module's full name or its
  // dotted suffix (["q_proj", "v_proj"]), or one regular expression matched
  // against the whole module name (e.g. ".*\\.(q_proj|v_proj)"); "all-linear"
  // is every linear layer but the output head.
  std::vector<std::string> target_names;
  std::string target_regex;  // non-empty when target_modules was a string
  std::string base_model_name_or_path;
  float lora_dropout = 0.0f;  // recorded; it plays no part in applying the adapter

  float scale() const;  // lora_alpha / r, or lora_alpha / sqrt(r) with rsLoRA
  // True when the module (e.g. "model.layers.0.self_attn.q_proj") is targeted.
  bool targets(std::string_view module) const;
};

// One adapted module's factors, in the file's dtype.
struct LoraPair {
  Tensor a;  // [r, in]
  Tensor b;  // [out, r]
};

struct PeftAdapter {
  std::string dir;
  std::string config_path;   // dir/adapter_config.json
  std::string weights_path;  // dir/adapter_model.safetensors
  PeftAdapterConfig config;
  // Module name without PEFT's "base_model.model." prefix
  // ("model.layers.0.self_attn.q_proj") → its factors.
  std::map<std::string, LoraPair> modules;
};

// Parses adapter_config.json text; errors name source and field.
Result<PeftAdapterConfig> parse_peft_adapter_config(std::string_view json_text, const std::string& source);

// Writes dir/adapter_config.json and dir/adapter_model.safetensors as peft's
// save_pretrained does, loadable by peft.PeftModel.from_pretrained. config
// needs r, lora_alpha, use_rslora, lora_dropout, base_model_name_or_path and
// target_names (leaf names such as "q_proj"). tensors are keyed
// "base_model.model.<module>.lora_A.weight" / ".lora_B.weight" and written in
// the given order and dtype; every key is checked to be a LoRA factor of rank
// r. Creates dir; each file is written to a temporary name and renamed.
Status write_peft_adapter(const std::string& dir, const PeftAdapterConfig& config,
                          const std::vector<std::pair<std::string, Tensor>>& tensors);

// Reads dir/adapter_config.json and dir/adapter_model.safetensors. The tensors
// are zero-copy views of the mapped file (kept alive by the Tensors).
Result<PeftAdapter> load_peft_adapter(const std::string& dir);

}  // namespace lathe
