// `lathe inspect DIR [--json]`: what a Hugging Face model directory holds:
// architecture, sizes, rope settings, parameter count and dtypes (from the
// safetensors headers, no tensor data read), tokenizer and chat template.
// The text form is for people; --json prints the same facts as one object.
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "io/model_info.h"

namespace lathe::cli {
namespace {

using json = nlohmann::json;

// A float as its shortest decimal (1e-05, not 9.99999974737875e-06).
double num(float v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
}

json rope_json(const ModelConfig& c) {
  json r = {{"theta", num(c.rope_theta)}, {"type", c.rope_scaling.type.empty() ? "default" : c.rope_scaling.type}};
  if (!c.rope_scaling.type.empty()) r["factor"] = num(c.rope_scaling.factor);
  if (c.rope_scaling.type == "llama3") {
    r["low_freq_factor"] = num(c.rope_scaling.low_freq_factor);
    r["high_freq_factor"] = num(c.rope_scaling.high_freq_factor);
    r["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
  }
  return r;
}

json info_json(const ModelInfo& m) {
  const ModelConfig& c = m.config;
  json j = {
      {"dir", m.dir},
      {"architecture", c.architecture},
      {"model_type", c.model_type},
      {"num_hidden_layers", c.num_hidden_layers},
      {"hidden_size", c.hidden_size},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"intermediate_size", c.intermediate_size},
      {"vocab_size", c.vocab_size},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rms_norm_eps", num(c.rms_norm_eps)},
      {"rope", rope_json(c)},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"attention_bias", c.attention_bias},
      {"attention_out_bias", c.attention_out_bias},
      {"mlp_bias", c.mlp_bias},
      {"qk_norm", c.qk_norm},
      {"sliding_window", c.sliding_window},
      {"config_dtype", c.torch_dtype},
      {"eos_token_ids", c.eos_token_ids},
      {"weights",
       {{"present", m.has_weights},
        {"files", m.n_files},
        {"tensors", m.n_tensors},
        {"parameters", m.n_params},
        {"total_bytes", m.total_bytes},
        {"tensors_by_dtype", m.tensors_by_dtype},
        {"bytes_by_dtype", m.bytes_by_dtype}}},
      {"tokenizer",
       {{"tokenizer_json", m.has_tokenizer_json},
        {"tokenizer_config", m.has_tokenizer_config},
        {"vocab_size", m.tokenizer_vocab_size},
        {"bos_token", m.bos_token},
        {"eos_token", m.eos_token},
        {"error", m.tokenizer_error.empty() ? json(nullptr) : json(m.tokenizer_error)}}},
      {"chat_template", m.chat_template_source.empty() ? json(nullptr) : json(m.chat_template_source)},
      {"generation_config", m.has_generation_config},
  };
  return j;
}

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

std::string rope_text(const ModelConfig& c) {
  std::ostringstream os;
  os << "theta " << c.rope_theta;
  const RopeScaling& r = c.rope_scaling;
  if (r.type.empty()) return os.str() + ", no scaling";
  os << ", " << r.type << " scaling (factor " << r.factor;
  if (r.type == "llama3") {
    os << ", low_freq_factor " << r.low_freq_factor << ", high_freq_factor " << r.high_freq_factor
       << ", original_max_position_embeddings " << r.original_max_position_embeddings;
  }
  return os.str() + ")";
}

void print_text(const ModelInfo& m) {
  const ModelConfig& c = m.config;
  auto yes = [](bool b) { return b ? "yes" : "no"; };
  std::printf("model            %s\n", m.dir.c_str());
  std::printf("architecture     %s (%s)\n", c.architecture.c_str(), c.model_type.c_str());
  std::printf("layers           %d\n", c.num_hidden_layers);
  std::printf("hidden           %d\n", c.hidden_size);
  std::printf("heads            %d (kv heads %d, head_dim %d)\n", c.num_attention_heads, c.num_key_value_heads,
              c.head_dim);
  std::printf("ffn              %d\n", c.intermediate_size);
  std::printf("vocab            %d\n", c.vocab_size);
  std::printf("context          %d\n", c.max_position_embeddings);
  std::printf("rope             %s\n", rope_text(c).c_str());
  std::printf("rms_norm_eps     %g\n", c.rms_norm_eps);
  std::printf("tied embeddings  %s\n", yes(c.tie_word_embeddings));
  std::printf("biases           qkv %s, o %s, mlp %s; qk-norm %s\n", yes(c.attention_bias),
              yes(c.attention_out_bias), yes(c.mlp_bias), yes(c.qk_norm));
  if (c.sliding_window > 0) std::printf("sliding window   %d\n", c.sliding_window);
  std::printf("config dtype     %s\n", c.torch_dtype.c_str());
  std::string eos;
  for (int id : c.eos_token_ids) eos += (eos.empty() ? "" : ", ") + std::to_string(id);
  std::printf("eos token ids    %s\n", eos.empty() ? "none" : eos.c_str());
  if (!m.has_weights) {
    std::printf("weights          none (no model.safetensors or model.safetensors.index.json)\n");
  } else {
    std::printf("parameters       %lld (%.3f B)\n", static_cast<long long>(m.n_params),
                static_cast<double>(m.n_params) / 1e9);
    std::printf("tensors          %lld in %d file%s\n", static_cast<long long>(m.n_tensors), m.n_files,
                m.n_files == 1 ? "" : "s");
    std::string dt;
    for (const auto& [name, n] : m.tensors_by_dtype) {
      dt += (dt.empty() ? "" : ", ") + name + ": " + std::to_string(n) + " (" + human_bytes(m.bytes_by_dtype.at(name)) +
            ")";
    }
    std::printf("dtypes           %s\n", dt.c_str());
    std::printf("total bytes      %llu (%s)\n", static_cast<unsigned long long>(m.total_bytes),
                human_bytes(m.total_bytes).c_str());
  }
  if (!m.has_tokenizer_json) {
    std::printf("tokenizer        none\n");
  } else if (!m.tokenizer_error.empty()) {
    std::printf("tokenizer        tokenizer.json does not load: %s\n", m.tokenizer_error.c_str());
  } else {
    std::printf("tokenizer        %d tokens (bos %s, eos %s)\n", m.tokenizer_vocab_size,
                m.bos_token.empty() ? "none" : m.bos_token.c_str(), m.eos_token.empty() ? "none" : m.eos_token.c_str());
  }
  std::printf("chat template    %s\n", m.chat_template_source.empty() ? "none" : m.chat_template_source.c_str());
  std::printf("generation       %s\n", m.has_generation_config ? "generation_config.json present" : "defaults");
}

}  // namespace

void add_inspect(CLI::App& app, int* rc) {
  auto* cmd = app.add_subcommand("inspect", "Describe a Hugging Face model directory (config, weights, tokenizer)");
  // shared: the flag values must outlive this function; the callback owns them.
  auto dir = std::make_shared<std::string>();
  auto as_json = std::make_shared<bool>(false);
  cmd->add_option("dir", *dir, "Model directory (config.json, *.safetensors, tokenizer files)")->required();
  cmd->add_flag("--json", *as_json, "Print one JSON object instead of text");
  cmd->callback([rc, dir, as_json] {
    Result<ModelInfo> info = inspect_model_dir(*dir);
    if (!info.is_ok()) {
      *rc = report("inspect", info.status());
      return;
    }
    if (*as_json) {
      std::printf("%s\n", info_json(*info).dump(2, ' ', false, json::error_handler_t::replace).c_str());
    } else {
      print_text(*info);
    }
    *rc = 0;
  });
}

}  // namespace lathe::cli
