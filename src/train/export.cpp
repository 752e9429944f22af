// Export (see export.h). The merge runs per module in f32 with nn/lora's
// lora_merge (the same accumulation order as a model merged at load time by
// --adapter), then rounds once to the output dtype. Tensors are ordered as
// transformers' state_dict lists them, so the 5 GB shard split falls where
// save_pretrained's does.
#include "train/export.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "io/hf_config.h"
#include "io/safetensors.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

constexpr std::string_view kPeftPrefix = "base_model.model.";

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("export: cannot open ", path);
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return io_error("export: cannot read ", path);
  return s.str();
}

// Position of a weight in transformers' state_dict: (group, layer, slot, name).
std::tuple<int, int64_t, int, std::string> state_dict_key(const std::string& name) {
  static const char* kLayerSlots[] = {
      "self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj.", "self_attn.o_proj.", "self_attn.q_norm.",
      "self_attn.k_norm.", "mlp.gate_proj.", "mlp.up_proj.", "mlp.down_proj.", "input_layernorm.",
      "post_attention_layernorm."};
  if (name.rfind("model.embed_tokens.", 0) == 0) return {0, 0, 0, name};
  const std::string layers = "model.layers.";
  if (name.rfind(layers, 0) == 0) {
    size_t dot = name.find('.', layers.size());
    std::string idx = name.substr(layers.size(), dot == std::string::npos ? std::string::npos : dot - layers.size());
    const bool numbered = dot != std::string::npos && !idx.empty() &&
                          std::all_of(idx.begin(), idx.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
    if (numbered) {
      std::string rest = name.substr(dot + 1);
      int slot = int(std::size(kLayerSlots));
      for (int s = 0; s < int(std::size(kLayerSlots)); ++s)
        if (rest.rfind(kLayerSlots[s], 0) == 0) slot = s;
      // Within a module, weight before bias.
      return {1, std::stoll(idx), slot * 2 + (rest.size() >= 5 && rest.substr(rest.size() - 5) == ".bias"), name};
    }
  }
  if (name.rfind("model.norm.", 0) == 0) return {2, 0, 0, name};
  if (name.rfind("lm_head.", 0) == 0) return {3, 0, 0, name};
  return {4, 0, 0, name};
}

// "base_model.model.<module>.lora_A.weight" → (module, 'A'); false otherwise.
bool split_lora_key(const std::string& key, std::string* module, char* which) {
  if (key.rfind(kPeftPrefix, 0) != 0) return false;
  for (char c : {'A', 'B'}) {
    const std::string suffix = std::string(".lora_") + c + ".weight";
    if (key.size() > kPeftPrefix.size() + suffix.size() &&
        key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0) {
      *module = key.substr(kPeftPrefix.size(), key.size() - kPeftPrefix.size() - suffix.size());
      *which = c;
      return true;
    }
  }
  return false;
}

struct Factors {
  Tensor a;  // [r, in]
  Tensor b;  // [out, r]
};

// The source's LoRA factors by module, each checked against the base weight
// it adapts and against the config; every targeted module must have both.
Result<std::map<std::string, Factors>> lora_factors(const ExportSource& src, const WeightStore& base) {
  LATHE_ASSIGN_OR_RETURN(std::vector<std::string> leaves, lora_target_leaves(src.lora.target_modules));
  std::map<std::string, Factors> out;
  for (const auto& [key, t] : src.tensors) {
    std::string module;
    char which = 0;
    if (!split_lora_key(key, &module, &which))
      return invalid_argument("export: tensor '", key,
                              "' is not a LoRA factor (base_model.model.<module>.lora_A.weight)");
    const SafetensorsEntry* w = base.entry(module + ".weight");
    if (w == nullptr)
      return not_found("export: tensor '", key, "' adapts '", module, "', which the base model ", base.dir(), " lacks");
    const Shape want = which == 'A' ? Shape{src.lora.r, w->shape[1]} : Shape{w->shape[0], src.lora.r};
    if (w->shape.rank() != 2 || !(t.shape() == want))
      return invalid_argument("export: tensor '", key, "' has shape ", t.shape().str(), ", expected ", want.str(),
                              " (r = ", src.lora.r, ", base weight ", w->shape.str(), ")");
    (which == 'A' ? out[module].a : out[module].b) = t;
  }
  for (const auto& [module, f] : out)
    if (!f.a.defined() || !f.b.defined())
      return invalid_argument("export: module '", module, "' has lora_", f.a.defined() ? "A" : "B", " but no lora_",
                              f.a.defined() ? "B" : "A");
  for (const std::string& name : base.names()) {
    for (const std::string& leaf : leaves) {
      const std::string suffix = "." + lora_module_path(leaf) + ".weight";
      if (name.rfind("model.layers.", 0) != 0 || name.size() <= suffix.size() ||
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
        continue;
      const std::string module = name.substr(0, name.size() - 7);  // drop ".weight"
      if (!out.count(module))
        return not_found("export: no LoRA factors for '", module, "', which target_modules (", leaf, ") adapts");
    }
  }
  if (out.empty()) return invalid_argument("export: the source holds no LoRA tensors");
  return out;
}

Tensor in_dtype(const Tensor& t, DType dtype) { return t.dtype() == dtype ? t : t.to(dtype); }

Status check_out_dir(const std::string& out_dir, const std::string& base_dir) {
  std::error_code ec;
  if (fs::exists(out_dir, ec) && fs::equivalent(out_dir, base_dir, ec))
    return invalid_argument("export: --out ", out_dir, " is the base model's directory; choose another");
  fs::create_directories(out_dir, ec);
  if (ec) return io_error("export: cannot create ", out_dir, ": ", ec.message());
  return Status::ok();
}

// The base config.json with its dtype fields naming dtype.
Status write_config(const std::string& base_dir, const std::string& out_dir, DType dtype) {
  const std::string src = base_dir + "/config.json";
  LATHE_ASSIGN_OR_RETURN(std::string text, read_file(src));
  const char* name = dtype == DType::BF16 ? "bfloat16" : dtype == DType::F16 ? "float16" : "float32";
  try {
    json j = json::parse(text);
    bool named = false;
    for (const char* key : {"dtype", "torch_dtype"}) {
      if (!j.contains(key)) continue;
      j[key] = name;
      named = true;
    }
    if (!named) j["torch_dtype"] = name;
    return write_text_atomic(out_dir + "/config.json", j.dump(2) + "\n");
  } catch (const json::exception& e) {
    return invalid_argument("export: ", src, ": ", e.what());
  }
}

// The base's generation_config.json, or the one transformers derives from
// config.json when the base has none.
Status write_generation_config(const std::string& base_dir, const std::string& out_dir) {
  const std::string src = base_dir + "/generation_config.json";
  std::error_code ec;
  if (fs::exists(src, ec)) {
    LATHE_ASSIGN_OR_RETURN(std::string text, read_file(src));
    LATHE_TRY(parse_generation_config(text, src).status());
    return write_text_atomic(out_dir + "/generation_config.json", text);
  }
  LATHE_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(base_dir));
  json j = json::object();
  j["_from_model_config"] = true;
  if (cfg.bos_token_id >= 0) j["bos_token_id"] = cfg.bos_token_id;
  if (cfg.eos_token_ids.size() == 1) j["eos_token_id"] = cfg.eos_token_ids[0];
  if (cfg.eos_token_ids.size() > 1) j["eos_token_id"] = cfg.eos_token_ids;
  if (cfg.pad_token_id >= 0) j["pad_token_id"] = cfg.pad_token_id;
  return write_text_atomic(out_dir + "/generation_config.json", j.dump(2) + "\n");
}

Status write_tokenizer_files(const ExportSource& src, const std::string& out_dir) {
  if (!src.tokenizer_files.empty()) {
    for (const auto& [name, bytes] : src.tokenizer_files) {
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
        return invalid_argument("export: tokenizer file name '", name, "' is not a plain file name");
      LATHE_TRY(write_text_atomic(out_dir + "/" + name, bytes));
    }
    return Status::ok();
  }
  // A base without tokenizer files (weights-only fixtures) exports without them.
  std::error_code ec;
  for (const std::string& name : tokenizer_file_names()) {
    const std::string path = src.base_model_dir + "/" + name;
    if (!fs::exists(path, ec)) continue;
    LATHE_ASSIGN_OR_RETURN(std::string bytes, read_file(path));
    LATHE_TRY(write_text_atomic(out_dir + "/" + name, bytes));
  }
  return Status::ok();
}

}  // namespace

const std::vector<std::string>& tokenizer_file_names() {
  static const std::vector<std::string> k = {
      "tokenizer.json",  "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "chat_template.json",
      "tokenizer.model", "added_tokens.json",     "vocab.json",              "merges.txt"};
  return k;
}

Result<DType> base_model_dtype(const std::string& base_model_dir) {
  LATHE_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(base_model_dir));
  if (auto t = dtype_from_name(cfg.torch_dtype); t && (*t == DType::F32 || *t == DType::BF16 || *t == DType::F16))
    return *t;
  LATHE_ASSIGN_OR_RETURN(WeightStore store, WeightStore::open_dir(base_model_dir));
  if (store.files().empty() || store.files()[0].entries().empty())
    return invalid_argument("export: ", base_model_dir, " holds no weights");
  return store.files()[0].entries()[0].dtype;
}

Result<std::vector<std::pair<std::string, Tensor>>> merged_weights(const ExportSource& src, DType dtype) {
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16)
    return invalid_argument("export: dtype ", dtype_name(dtype), " is not one of f32, bf16, f16");
  LATHE_ASSIGN_OR_RETURN(WeightStore base, WeightStore::open_dir(src.base_model_dir));
  std::vector<std::string> names = base.names();
  std::sort(names.begin(), names.end(),
            [](const std::string& a, const std::string& b) { return state_dict_key(a) < state_dict_key(b); });
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(names.size());
  if (src.full_sft) {
    std::map<std::string, const Tensor*> trained;
    for (const auto& [name, t] : src.tensors) {
      const SafetensorsEntry* e = base.entry(name);
      if (e == nullptr) return not_found("export: trained tensor '", name, "' is not a weight of ", src.base_model_dir);
      if (!(e->shape == t.shape()))
        return invalid_argument("export: trained tensor '", name, "' has shape ", t.shape().str(), ", the base's is ",
                                e->shape.str());
      trained[name] = &t;
    }
    for (const std::string& name : names) {
      auto it = trained.find(name);
      if (it != trained.end()) {
        out.emplace_back(name, in_dtype(*it->second, dtype));
        continue;
      }
      LATHE_ASSIGN_OR_RETURN(Tensor t, base.get(name));
      out.emplace_back(name, in_dtype(t, dtype));
    }
    return out;
  }
  LATHE_TRY(src.lora.validate());
  LATHE_ASSIGN_OR_RETURN(auto factors, lora_factors(src, base));
  const float scale = src.lora.scale();
  for (const std::string& name : names) {
    LATHE_ASSIGN_OR_RETURN(Tensor t, base.get(name));
    auto it = name.size() > 7 ? factors.find(name.substr(0, name.size() - 7)) : factors.end();
    if (it == factors.end() || name.compare(name.size() - 7, 7, ".weight") != 0) {
      out.emplace_back(name, in_dtype(t, dtype));
      continue;
    }
    Tensor w = t.dtype() == DType::F32 ? t.clone() : t.to_f32();
    const Tensor a = it->second.a.to_f32(), b = it->second.b.to_f32();
    lora_merge(w.data<float>(), a.data<float>(), b.data<float>(), w.size(0), w.size(1), a.size(0), scale);
    out.emplace_back(name, in_dtype(w, dtype));
  }
  return out;
}

Status export_hf(const ExportSource& src, const std::string& out_dir, const HfExportOptions& options) {
  DType dtype = DType::F32;
  if (options.dtype) {
    dtype = *options.dtype;
  } else {
    LATHE_ASSIGN_OR_RETURN(dtype, base_model_dtype(src.base_model_dir));
  }
  LATHE_ASSIGN_OR_RETURN(auto weights, merged_weights(src, dtype));
  LATHE_TRY(check_out_dir(out_dir, src.base_model_dir));
  LATHE_TRY(write_weights(out_dir, weights, options.max_shard_bytes));
  LATHE_TRY(write_config(src.base_model_dir, out_dir, dtype));
  LATHE_TRY(write_generation_config(src.base_model_dir, out_dir));
  return write_tokenizer_files(src, out_dir);
}

Result<PeftAdapterConfig> peft_config_of(const LoraConfig& lora, const std::string& base_model_dir) {
  LATHE_TRY(lora.validate());
  PeftAdapterConfig cfg;
  cfg.r = lora.r;
  cfg.lora_alpha = lora.alpha;
  cfg.use_rslora = lora.rslora;
  cfg.lora_dropout = lora.dropout;
  cfg.base_model_name_or_path = base_model_dir;
  LATHE_ASSIGN_OR_RETURN(cfg.target_names, lora_target_leaves(lora.target_modules));
  return cfg;
}

Status export_hf_peft(const ExportSource& src, const std::string& out_dir) {
  if (src.full_sft)
    return invalid_argument("export: --target hf-peft needs a LoRA run; this one trained every weight (full SFT), "
                            "use --target hf");
  LATHE_ASSIGN_OR_RETURN(PeftAdapterConfig cfg, peft_config_of(src.lora, src.base_model_dir));
  LATHE_ASSIGN_OR_RETURN(WeightStore base, WeightStore::open_dir(src.base_model_dir));
  LATHE_TRY(lora_factors(src, base).status());
  LATHE_TRY(check_out_dir(out_dir, src.base_model_dir));
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, t] : src.tensors) tensors.emplace_back(name, in_dtype(t, DType::F32));
  return write_peft_adapter(out_dir, cfg, tensors);
}

}  // namespace lathe
