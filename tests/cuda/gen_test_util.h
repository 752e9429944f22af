// What the CudaCausalLM test files share: scratch directories, random-init
// models with bf16 weights (head_dim 64 and 128 take the flash kernels),
// loading and the greedy argmax. Inline, for tests only.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "io/hf_config.h"
#include "models/cuda_causal_lm.h"
#include "models/random_init.h"

namespace lathe::gen_test {

namespace fs = std::filesystem;

// A scratch directory removed at the end of the test.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    path_ = fs::temp_directory_path() / ("lathe_cudagen_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

// A random-init model with bf16 weights (so CPU and GPU hold the same values).
inline void write_random_model(const std::string& dir, const std::string& family, int head_dim, int window) {
  ModelConfig c;
  c.model_type = family;
  c.architecture = family == "mistral" ? "MistralForCausalLM" : "LlamaForCausalLM";
  c.vocab_size = 512;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = head_dim;
  c.hidden_size = 2 * head_dim;
  c.intermediate_size = 4 * head_dim;
  c.num_hidden_layers = 2;
  c.max_position_embeddings = 256;
  c.sliding_window = window;
  c.torch_dtype = "bfloat16";
  std::ofstream(dir + "/config.json") << model_config_to_json(c);
  Status st = write_random_weights(dir, c, {.seed = 7, .dtype = DType::BF16, .initializer_range = 0.1f});
  LATHE_CHECK(st.is_ok(), st.message());
}

inline std::unique_ptr<CudaCausalLM> load_gpu(const std::string& dir, CudaModelOptions opts) {
  auto m = CudaCausalLM::load(dir, opts);
  LATHE_CHECK(m.is_ok(), m.status().message());
  return std::move(m).value();
}

inline int32_t argmax(const std::vector<float>& x) {
  return static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
}

// The random-init cases: head_dim 64 (Llama) and 128 (Mistral, sliding
// window 8 < prompt + output).
struct FlashCase {
  std::string family;
  int head_dim, window;
};
// A random model of case c in a temp dir of its own (tag: the test's).
struct FlashModel : TempDir {
  FlashModel(const FlashCase& c, const std::string& tag) : TempDir(c.family + std::to_string(c.head_dim) + tag) {
    write_random_model(str(), c.family, c.head_dim, c.window);
  }
};
// n prompt ids (i·mul + add) mod 512.
inline std::vector<int32_t> flash_prompt(int n, int mul, int add) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < n; ++i) prompt.push_back((i * mul + add) % 512);
  return prompt;
}

}  // namespace lathe::gen_test
