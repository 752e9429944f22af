// A summary of a Hugging Face model directory for `lathe inspect`: the
// parsed config, what the weight files hold (read from safetensors headers
// only, so summarizing a 16 GB model touches a few KB), and which tokenizer
// and chat-template files are present.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "core/status.h"
#include "io/hf_config.h"

namespace lathe {

struct ModelInfo {
  std::string dir;
  ModelConfig config;
  GenerationConfig generation;       // defaults when generation_config.json is absent
  bool has_generation_config = false;
  bool has_weights = false;          // model.safetensors or an index is present
  int n_files = 0;                   // safetensors files
  int64_t n_tensors = 0;
  int64_t n_params = 0;              // sum of tensor element counts (tied weights once)
  uint64_t total_bytes = 0;          // tensor data bytes
  std::map<std::string, int64_t> tensors_by_dtype;  // "bf16" → count
  std::map<std::string, uint64_t> bytes_by_dtype;
  bool has_tokenizer_json = false;
  int32_t tokenizer_vocab_size = 0;  // tokens incl. added ones; 0 when absent
  std::string tokenizer_error;       // why tokenizer.json did not load ("" when it did)
  std::string bos_token, eos_token;  // from tokenizer_config.json
  bool has_tokenizer_config = false;
  std::string chat_template_source;  // "" none, "tokenizer_config.json" or "chat_template.jinja"
};

// Reads dir's config.json (required), generation_config.json and the
// safetensors headers. Errors name the directory or the file at fault.
Result<ModelInfo> inspect_model_dir(const std::string& dir);

}  // namespace lathe
