// Hugging Face config.json and generation_config.json for the Llama family
// (Llama 2/3.x, Mistral, Qwen2, Qwen3), as written by transformers 4.x and
// 5.x. 5.x moved rope settings ("rope_theta", "rope_scaling") under
// "rope_parameters"; both spellings load into the same struct.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace lathe {

struct RopeScaling {
  std::string type;  // "" (none), "llama3", "linear", "dynamic"
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string model_type;    // "llama", "mistral", "qwen2", "qwen3"
  std::string architecture;  // "LlamaForCausalLM", ...
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;  // defaults to num_attention_heads
  int head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int max_position_embeddings = 2048;
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases (Qwen2 always has them)
  bool attention_out_bias = false;  // o_proj bias (Llama attention_bias covers o too)
  bool mlp_bias = false;
  bool qk_norm = false;  // Qwen3: RMSNorm over head_dim on q and k before RoPE
  std::string hidden_act = "silu";
  std::string torch_dtype = "float32";  // "dtype" in 5.x
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;
  int pad_token_id = -1;
  int sliding_window = 0;  // 0: none

  // Checks sizes are positive and consistent; messages name the field.
  Status validate() const;
};

// Parses config.json text. source names the file in error messages.
Result<ModelConfig> parse_model_config(std::string_view json_text, const std::string& source);
// path: a config.json or the model directory holding one.
Result<ModelConfig> load_model_config(const std::string& path);
// Serializes as transformers 4.x writes it (for init-model and export).
std::string model_config_to_json(const ModelConfig& cfg);

struct GenerationConfig {
  std::vector<int> eos_token_ids;
  int bos_token_id = -1;
  int pad_token_id = -1;
  bool do_sample = false;
  float temperature = 1.0f;
  int top_k = 50;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  int max_new_tokens = -1;  // -1: not set
};

// Parses generation_config.json text; source names the file in errors.
Result<GenerationConfig> parse_generation_config(std::string_view json_text, const std::string& source);
// path: the file or the model directory. A missing file gives defaults; a
// malformed one is an error naming the file.
Result<GenerationConfig> load_generation_config(const std::string& path);
std::string generation_config_to_json(const GenerationConfig& cfg);

}  // namespace lathe
