// config.json and generation_config.json parsing. A config is read in three
// steps: pick the family from "architectures" / "model_type" (anything else
// is refused with the list of supported ones), read the fields with their
// transformers defaults for that family, then fold in the family's fixed
// quirks (Qwen2's q/k/v bias, Qwen3's q/k norm). Rope settings come either
// from 4.x's top-level "rope_theta" + "rope_scaling" (with "rope_type" or the
// older "type") or from 5.x's "rope_parameters". Every error names the file
// and the field.
#include "io/hf_config.h"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

namespace lathe {
namespace {

using json = nlohmann::json;

struct Family {
  const char* model_type;
  const char* architecture;
  int max_position_embeddings;  // the transformers class default
};

constexpr Family kFamilies[] = {
    {"llama", "LlamaForCausalLM", 2048},
    {"mistral", "MistralForCausalLM", 4096 * 32},
    {"qwen2", "Qwen2ForCausalLM", 32768},
    {"qwen3", "Qwen3ForCausalLM", 32768},
};

std::string supported_list() {
  std::string s;
  for (const Family& f : kFamilies) {
    s += (s.empty() ? "" : ", ") + std::string(f.architecture) + " (" + f.model_type + ")";
  }
  return s;
}

const Family* family_by_type(std::string_view t) {
  for (const Family& f : kFamilies) {
    if (t == f.model_type) return &f;
  }
  return nullptr;
}

const Family* family_by_arch(std::string_view a) {
  for (const Family& f : kFamilies) {
    if (a == f.architecture) return &f;
  }
  return nullptr;
}

// Typed field access on one JSON object; errors name the source and the key
// (prefix holds the enclosing object, e.g. "rope_scaling.").
class Fields {
 public:
  Fields(const json& obj, const std::string& source, std::string prefix = "")
      : obj_(obj), source_(source), prefix_(std::move(prefix)) {}

  // A present, non-null value, or nullptr.
  const json* find(const char* key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  Status bad(const char* key, const char* want) const {
    const json* v = find(key);
    // Containers are named, not printed: dumping is recursive and a hostile
    // file can nest arbitrarily deep.
    std::string got = v->is_structured() ? std::string("an ") + v->type_name()
                                         : v->dump(-1, ' ', false, json::error_handler_t::replace);
    return invalid_argument(source_, ": field \"", prefix_, key, "\" must be ", want, ", got ", got);
  }
  Status missing(const char* key) const { return invalid_argument(source_, ": missing field \"", prefix_, key, "\""); }

  Status get_int(const char* key, int* out, bool required = false) const {
    const json* v = find(key);
    if (v == nullptr) return required ? missing(key) : Status::ok();
    if (!v->is_number_integer()) return bad(key, "an integer");
    if (v->is_number_unsigned() ? v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int>::max())
                                : (v->get<int64_t>() > std::numeric_limits<int>::max() ||
                                   v->get<int64_t>() < std::numeric_limits<int>::min())) {
      return bad(key, "an integer within 32 bits");
    }
    *out = static_cast<int>(v->get<int64_t>());
    return Status::ok();
  }
  Status get_float(const char* key, float* out, bool required = false) const {
    const json* v = find(key);
    if (v == nullptr) return required ? missing(key) : Status::ok();
    if (!v->is_number()) return bad(key, "a number");
    *out = static_cast<float>(v->get<double>());
    return Status::ok();
  }
  Status get_bool(const char* key, bool* out) const {
    const json* v = find(key);
    if (v == nullptr) return Status::ok();
    if (!v->is_boolean()) return bad(key, "true or false");
    *out = v->get<bool>();
    return Status::ok();
  }
  Status get_string(const char* key, std::string* out) const {
    const json* v = find(key);
    if (v == nullptr) return Status::ok();
    if (!v->is_string()) return bad(key, "a string");
    *out = v->get<std::string>();
    return Status::ok();
  }
  // An int or a list of ints (eos_token_id); null leaves out untouched.
  Status get_int_list(const char* key, std::vector<int>* out) const {
    const json* v = find(key);
    if (v == nullptr) return Status::ok();
    auto one = [](const json& x, int* o) {
      if (!x.is_number_integer()) return false;
      int64_t i = x.is_number_unsigned() ? static_cast<int64_t>(std::min<uint64_t>(x.get<uint64_t>(), INT64_MAX))
                                         : x.get<int64_t>();
      if (i < std::numeric_limits<int>::min() || i > std::numeric_limits<int>::max()) return false;
      *o = static_cast<int>(i);
      return true;
    };
    std::vector<int> ids;
    int id = 0;
    if (v->is_array()) {
      for (const json& x : *v) {
        if (!one(x, &id)) return bad(key, "an integer or a list of integers");
        ids.push_back(id);
      }
    } else if (one(*v, &id)) {
      ids.push_back(id);
    } else {
      return bad(key, "an integer or a list of integers");
    }
    *out = std::move(ids);
    return Status::ok();
  }

 private:
  const json& obj_;
  const std::string& source_;
  std::string prefix_;
};

Result<const Family*> resolve_family(const json& j, const std::string& source) {
  std::string arch, model_type;
  if (auto it = j.find("architectures"); it != j.end() && it->is_array() && !it->empty() && (*it)[0].is_string()) {
    arch = (*it)[0].get<std::string>();
  }
  LATHE_TRY(Fields(j, source).get_string("model_type", &model_type));
  const Family* by_type = family_by_type(model_type);
  const Family* by_arch = family_by_arch(arch);
  if ((model_type.empty() && arch.empty()) || (!model_type.empty() && by_type == nullptr) ||
      (!arch.empty() && by_arch == nullptr)) {
    return unsupported(source, ": unsupported architecture '", arch.empty() ? "(none)" : arch, "' (model_type '",
                       model_type.empty() ? "(none)" : model_type, "'); supported: ", supported_list());
  }
  if (by_type != nullptr && by_arch != nullptr && by_type != by_arch) {
    return invalid_argument(source, ": architecture '", arch, "' does not match model_type '", model_type, "'");
  }
  return by_type != nullptr ? by_type : by_arch;
}

// Reads the rope type and its parameters from a rope_scaling (4.x) or
// rope_parameters (5.x) object.
Status parse_rope_object(const json& r, const std::string& source, const char* name, ModelConfig* cfg) {
  if (!r.is_object()) return invalid_argument(source, ": field \"", name, "\" must be an object or null");
  Fields f(r, source, std::string(name) + ".");
  std::string type;
  LATHE_TRY(f.get_string("rope_type", &type));
  if (type.empty()) LATHE_TRY(f.get_string("type", &type));
  LATHE_TRY(f.get_float("rope_theta", &cfg->rope_theta));
  RopeScaling& rs = cfg->rope_scaling;
  if (type.empty() || type == "default") {
    rs = RopeScaling{};
    return Status::ok();
  }
  if (type != "linear" && type != "dynamic" && type != "llama3") {
    return unsupported(source, ": field \"", name, ".rope_type\" is '", type,
                       "', which lathe does not support (supported: default, linear, dynamic, llama3)");
  }
  rs.type = type;
  LATHE_TRY(f.get_float("factor", &rs.factor, /*required=*/true));
  if (type == "llama3") {
    LATHE_TRY(f.get_float("low_freq_factor", &rs.low_freq_factor, true));
    LATHE_TRY(f.get_float("high_freq_factor", &rs.high_freq_factor, true));
    LATHE_TRY(f.get_int("original_max_position_embeddings", &rs.original_max_position_embeddings, true));
  }
  return Status::ok();
}

Status parse_rope(const json& j, const std::string& source, ModelConfig* cfg) {
  Fields f(j, source);
  LATHE_TRY(f.get_float("rope_theta", &cfg->rope_theta));
  if (const json* rp = f.find("rope_parameters")) return parse_rope_object(*rp, source, "rope_parameters", cfg);
  if (const json* rs = f.find("rope_scaling")) return parse_rope_object(*rs, source, "rope_scaling", cfg);
  return Status::ok();
}

Status parse_fields(const json& j, const std::string& source, const Family& fam, ModelConfig* cfg) {
  Fields f(j, source);
  cfg->model_type = fam.model_type;
  cfg->architecture = fam.architecture;
  cfg->max_position_embeddings = fam.max_position_embeddings;
  LATHE_TRY(f.get_int("vocab_size", &cfg->vocab_size, true));
  LATHE_TRY(f.get_int("hidden_size", &cfg->hidden_size, true));
  LATHE_TRY(f.get_int("intermediate_size", &cfg->intermediate_size, true));
  LATHE_TRY(f.get_int("num_hidden_layers", &cfg->num_hidden_layers, true));
  LATHE_TRY(f.get_int("num_attention_heads", &cfg->num_attention_heads, true));
  cfg->num_key_value_heads = cfg->num_attention_heads;
  LATHE_TRY(f.get_int("num_key_value_heads", &cfg->num_key_value_heads));
  cfg->head_dim = 0;
  LATHE_TRY(f.get_int("head_dim", &cfg->head_dim));
  if (cfg->head_dim == 0 && cfg->num_attention_heads > 0) {
    if (cfg->hidden_size % cfg->num_attention_heads != 0) {
      return invalid_argument(source, ": hidden_size ", cfg->hidden_size, " is not divisible by num_attention_heads ",
                              cfg->num_attention_heads, "; set head_dim");
    }
    cfg->head_dim = cfg->hidden_size / cfg->num_attention_heads;
  }
  LATHE_TRY(f.get_int("max_position_embeddings", &cfg->max_position_embeddings));
  LATHE_TRY(f.get_float("rms_norm_eps", &cfg->rms_norm_eps));
  LATHE_TRY(parse_rope(j, source, cfg));
  LATHE_TRY(f.get_bool("tie_word_embeddings", &cfg->tie_word_embeddings));
  LATHE_TRY(f.get_string("hidden_act", &cfg->hidden_act));
  LATHE_TRY(f.get_string("torch_dtype", &cfg->torch_dtype));
  LATHE_TRY(f.get_string("dtype", &cfg->torch_dtype));  // 5.x spelling wins
  LATHE_TRY(f.get_int("bos_token_id", &cfg->bos_token_id));
  LATHE_TRY(f.get_int_list("eos_token_id", &cfg->eos_token_ids));
  LATHE_TRY(f.get_int("pad_token_id", &cfg->pad_token_id));
  return Status::ok();
}

// What each family's modeling code fixes regardless of (or from) the config.
Status apply_family(const json& j, const std::string& source, ModelConfig* cfg) {
  Fields f(j, source);
  std::string_view t = cfg->model_type;
  if (t == "llama" || t == "qwen3") {  // attention_bias covers q, k, v and o
    LATHE_TRY(f.get_bool("attention_bias", &cfg->attention_bias));
    cfg->attention_out_bias = cfg->attention_bias;
  }
  if (t == "llama") LATHE_TRY(f.get_bool("mlp_bias", &cfg->mlp_bias));
  if (t == "qwen2") cfg->attention_bias = true;  // q/k/v always biased, o never
  cfg->qk_norm = t == "qwen3";
  if (t == "mistral") {
    cfg->sliding_window = 4096;  // MistralConfig's default; null turns it off
    if (j.contains("sliding_window")) {
      cfg->sliding_window = 0;
      LATHE_TRY(f.get_int("sliding_window", &cfg->sliding_window));
    }
  }
  if (t == "qwen2" || t == "qwen3") {  // the window applies only with use_sliding_window
    bool use = false;
    LATHE_TRY(f.get_bool("use_sliding_window", &use));
    if (use) {
      return unsupported(source, ": use_sliding_window=true (per-layer sliding windows) is not supported for ",
                         cfg->model_type);
    }
  }
  return Status::ok();
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path, ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error(path, ": read failed");
  return ss.str();
}

// A float as JSON shows it in Python: the shortest decimal that reads back
// to the same float, so 1e-5f is written 1e-05, not 9.99999974737875e-06.
double clean_double(float v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
}

}  // namespace

Status ModelConfig::validate() const {
  auto positive = [](const char* name, long long v) -> Status {
    if (v <= 0) return invalid_argument("field \"", name, "\" must be positive, got ", v);
    return Status::ok();
  };
  if (family_by_type(model_type) == nullptr) {
    return unsupported("model_type '", model_type, "' is not supported; supported: ", supported_list());
  }
  LATHE_TRY(positive("vocab_size", vocab_size));
  LATHE_TRY(positive("hidden_size", hidden_size));
  LATHE_TRY(positive("intermediate_size", intermediate_size));
  LATHE_TRY(positive("num_hidden_layers", num_hidden_layers));
  LATHE_TRY(positive("num_attention_heads", num_attention_heads));
  LATHE_TRY(positive("num_key_value_heads", num_key_value_heads));
  LATHE_TRY(positive("head_dim", head_dim));
  LATHE_TRY(positive("max_position_embeddings", max_position_embeddings));
  if (num_attention_heads % num_key_value_heads != 0) {
    return invalid_argument("num_attention_heads ", num_attention_heads, " is not a multiple of num_key_value_heads ",
                            num_key_value_heads);
  }
  if (head_dim % 2 != 0) return invalid_argument("head_dim ", head_dim, " must be even for rotary embeddings");
  if (!(rms_norm_eps > 0.0f) || !std::isfinite(rms_norm_eps)) {
    return invalid_argument("field \"rms_norm_eps\" must be a positive number, got ", rms_norm_eps);
  }
  if (!(rope_theta > 0.0f) || !std::isfinite(rope_theta)) {
    return invalid_argument("field \"rope_theta\" must be a positive number, got ", rope_theta);
  }
  const RopeScaling& rs = rope_scaling;
  if (!rs.type.empty()) {
    if (!(rs.factor > 0.0f) || !std::isfinite(rs.factor)) {
      return invalid_argument("rope scaling factor must be a positive number, got ", rs.factor);
    }
    if (rs.type == "llama3" &&
        (!(rs.low_freq_factor > 0.0f) || !(rs.high_freq_factor > rs.low_freq_factor) ||
         !std::isfinite(rs.high_freq_factor) || rs.original_max_position_embeddings <= 0)) {
      return invalid_argument("llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor and "
                              "original_max_position_embeddings > 0");
    }
  }
  if (hidden_act != "silu" && hidden_act != "swish") {
    return unsupported("field \"hidden_act\" is '", hidden_act, "'; the Llama family uses silu");
  }
  if (sliding_window < 0) return invalid_argument("field \"sliding_window\" must not be negative");
  return Status::ok();
}

Result<ModelConfig> parse_model_config(std::string_view json_text, const std::string& source) {
  json j = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument(source, ": not valid JSON");
  if (!j.is_object()) return invalid_argument(source, ": must be a JSON object");
  try {  // the accessors above check types first; this only guards the boundary
    LATHE_ASSIGN_OR_RETURN(const Family* fam, resolve_family(j, source));
    ModelConfig cfg;
    LATHE_TRY(parse_fields(j, source, *fam, &cfg));
    LATHE_TRY(apply_family(j, source, &cfg));
    Status s = cfg.validate();
    if (!s.is_ok()) return s.with_context(source);
    return cfg;
  } catch (const std::exception& e) {
    return invalid_argument(source, ": ", e.what());
  }
}

Result<ModelConfig> load_model_config(const std::string& path) {
  std::string file = std::filesystem::is_directory(path) ? (std::filesystem::path(path) / "config.json").string() : path;
  LATHE_ASSIGN_OR_RETURN(std::string text, read_file(file));
  return parse_model_config(text, file);
}

std::string model_config_to_json(const ModelConfig& c) {
  json j;
  j["architectures"] = {c.architecture};
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = clean_double(c.rms_norm_eps);
  j["rope_theta"] = clean_double(c.rope_theta);
  j["rope_scaling"] = nullptr;
  if (!c.rope_scaling.type.empty()) {
    json rs = {{"rope_type", c.rope_scaling.type}, {"factor", clean_double(c.rope_scaling.factor)}};
    if (c.rope_scaling.type == "llama3") {
      rs["low_freq_factor"] = clean_double(c.rope_scaling.low_freq_factor);
      rs["high_freq_factor"] = clean_double(c.rope_scaling.high_freq_factor);
      rs["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
    }
    j["rope_scaling"] = rs;
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["hidden_act"] = c.hidden_act;
  j["torch_dtype"] = c.torch_dtype;
  j["bos_token_id"] = c.bos_token_id >= 0 ? json(c.bos_token_id) : json(nullptr);
  j["pad_token_id"] = c.pad_token_id >= 0 ? json(c.pad_token_id) : json(nullptr);
  if (c.eos_token_ids.empty()) j["eos_token_id"] = nullptr;
  else if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  else j["eos_token_id"] = c.eos_token_ids;
  if (c.model_type == "llama") {
    j["attention_bias"] = c.attention_bias;
    j["mlp_bias"] = c.mlp_bias;
  } else if (c.model_type == "qwen3") {
    j["attention_bias"] = c.attention_bias;
  }
  if (c.model_type == "mistral") {
    j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  }
  if (c.model_type == "qwen2" || c.model_type == "qwen3") {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_hidden_layers;
  }
  j["use_cache"] = true;
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

// --- generation_config.json ----------------------------------------------------

Result<GenerationConfig> parse_generation_config(std::string_view json_text, const std::string& source) {
  json j = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument(source, ": not valid JSON");
  if (!j.is_object()) return invalid_argument(source, ": must be a JSON object");
  GenerationConfig g;
  try {
    Fields f(j, source);
    LATHE_TRY(f.get_int_list("eos_token_id", &g.eos_token_ids));
    LATHE_TRY(f.get_int("bos_token_id", &g.bos_token_id));
    LATHE_TRY(f.get_int("pad_token_id", &g.pad_token_id));
    LATHE_TRY(f.get_bool("do_sample", &g.do_sample));
    LATHE_TRY(f.get_float("temperature", &g.temperature));
    LATHE_TRY(f.get_int("top_k", &g.top_k));
    LATHE_TRY(f.get_float("top_p", &g.top_p));
    LATHE_TRY(f.get_float("min_p", &g.min_p));
    LATHE_TRY(f.get_float("repetition_penalty", &g.repetition_penalty));
    LATHE_TRY(f.get_int("max_new_tokens", &g.max_new_tokens));
  } catch (const std::exception& e) {
    return invalid_argument(source, ": ", e.what());
  }
  if (!(g.temperature >= 0.0f) || !std::isfinite(g.temperature)) {
    return invalid_argument(source, ": temperature must be >= 0, got ", g.temperature);
  }
  if (!(g.top_p > 0.0f && g.top_p <= 1.0f)) return invalid_argument(source, ": top_p must be in (0, 1], got ", g.top_p);
  if (g.top_k < 0) return invalid_argument(source, ": top_k must be >= 0, got ", g.top_k);
  if (!(g.min_p >= 0.0f && g.min_p <= 1.0f)) return invalid_argument(source, ": min_p must be in [0, 1], got ", g.min_p);
  if (!(g.repetition_penalty > 0.0f) || !std::isfinite(g.repetition_penalty)) {
    return invalid_argument(source, ": repetition_penalty must be > 0, got ", g.repetition_penalty);
  }
  return g;
}

Result<GenerationConfig> load_generation_config(const std::string& path) {
  std::error_code ec;
  std::string file = std::filesystem::is_directory(path, ec)
                         ? (std::filesystem::path(path) / "generation_config.json").string()
                         : path;
  if (!std::filesystem::exists(file, ec)) return GenerationConfig{};
  LATHE_ASSIGN_OR_RETURN(std::string text, read_file(file));
  return parse_generation_config(text, file);
}

std::string generation_config_to_json(const GenerationConfig& g) {
  json j;
  if (g.bos_token_id >= 0) j["bos_token_id"] = g.bos_token_id;
  if (g.pad_token_id >= 0) j["pad_token_id"] = g.pad_token_id;
  if (g.eos_token_ids.size() == 1) j["eos_token_id"] = g.eos_token_ids[0];
  else if (!g.eos_token_ids.empty()) j["eos_token_id"] = g.eos_token_ids;
  j["do_sample"] = g.do_sample;
  j["temperature"] = clean_double(g.temperature);
  j["top_k"] = g.top_k;
  j["top_p"] = clean_double(g.top_p);
  if (g.min_p > 0.0f) j["min_p"] = clean_double(g.min_p);
  if (g.repetition_penalty != 1.0f) j["repetition_penalty"] = clean_double(g.repetition_penalty);
  if (g.max_new_tokens >= 0) j["max_new_tokens"] = g.max_new_tokens;
  return j.dump(2) + "\n";
}

}  // namespace lathe
